//! A profile is named after its workload, and a namespace may hold a Job
//! and a PyTorchJob or JobSet of one name, made by different people
//! (docs/security.md, "A name shared by two workloads"). Whose the
//! profile is must not depend on the order the operator sees them in, on
//! whether it ran when they were made, or on memprof recreating one of
//! them; a workload's roll-up, status and remediation come from its own
//! reports only. Against the local control plane, through the operator:
//!
//! - both made while the operator is down, the PyTorchJob first and then
//!   a tenant's Job of its name whose rank reports critical: the profile
//!   is the PyTorchJob's, rolls up its three ranks only, and a policy
//!   that would shrink the PyTorchJob does nothing on the Job's evidence;
//! - the same for JobSets, both ways round: each name's profile is the
//!   one made first's, the JobSet's ranks only when it is the JobSet's,
//!   and the JobSet is never remediated on the Job's evidence;
//! - memprof recreating a PyTorchJob or a JobSet while a profiled Job of
//!   its name exists: the profile is never the Job's, the recreated
//!   workload adopts it with its history, and deleting the Job leaves it.
//!
//! The upper controllers are played as `workload_support` does. Run them:
//!
//!     eval "$(bash hack/local-cluster.sh env)"
//!     MEMPROF_REQUIRE_CLUSTER=1 cargo test --test integration workload_namesakes::
//!
//! Without `KUBECONFIG` every test is skipped with a message.

use crate::common;
use crate::remediation_support;
use crate::workload_remediation_pytorch::{batches, profiled_pytorchjob};
use crate::workload_remediation_twins::{profiled_jobset, BATCH};
use crate::workload_support;

use common::*;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use kube::{Client, ResourceExt};
use memprof::api::workload::WorkloadKind;
use memprof::api::{MemoryProfile, RiskLevel};
use memprof::remediation::FAILPOINT_AFTER_DELETE;
use remediation_support::{records, shrinking_workload_cluster, spawn_operator, stays};
use serde_json::json;
use std::time::Duration;
use workload_support::*;

/// A tenant's profiled Job `name` (no `team` label: no policy selects
/// it), its one pod admitted, reporting critical.
async fn tenant_job(admin: &Client, ns: &str, name: &str) -> Job {
    let job: Job = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"memprof.dev/managed": "true"},
                     "annotations": {"memprof.dev/enabled": "true"}},
        "spec": {"backoffLimit": 0, "template": {
            "metadata": {"labels": {"memprof.dev/managed": "true"}},
            "spec": {"restartPolicy": "Never",
                     "containers": [{"name": "trainer", "image": "busybox"}]}}}
    }))
    .unwrap();
    let job = Api::<Job>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &job)
        .await
        .expect("create the tenant's Job");
    let pod = job_pods(admin, ns, name, 1).await.remove(0);
    let gpus = vec![gpu(0, 79, 79, RiskLevel::Critical, Some(5.0))];
    apply_report(admin, ns, &pod_report(&pod, name, 0, &at(100), gpus)).await;
    job
}

/// JobSet `name` (`team: ml`) of two marked child Jobs, each reporting low.
async fn jobset_reporting_low(admin: &Client, ns: &str, name: &str) -> DynamicObject {
    let js = create(
        admin,
        ns,
        WorkloadKind::JobSet,
        jobset(name, 2, json!({"team": "ml"})),
    )
    .await;
    for i in 0..2 {
        marked_child(admin, ns, &js, i).await;
        child_report(admin, ns, &format!("{name}-workers-{i}"), 0, RiskLevel::Low).await;
    }
    js
}

/// Profile `name` once its roll-up wrote a status.
async fn with_status(admin: &Client, ns: &str, name: &str) -> MemoryProfile {
    let profiles: Api<MemoryProfile> = Api::namespaced(admin.clone(), ns);
    eventually(&format!("profile {name} with a status"), || async {
        match profiles.get_opt(name).await.map_err(|e| e.to_string())? {
            Some(p) if p.status.as_ref().is_some_and(|s| !s.ranks.is_empty()) => Ok(p),
            other => Err(format!("{:?}", other.map(|p| p.status))),
        }
    })
    .await
}

fn owners(p: &MemoryProfile) -> Vec<String> {
    p.owner_references().iter().map(|o| o.uid.clone()).collect()
}

/// Whether a `ProfileNameTaken` Warning regards the object of uid `uid`.
async fn told_taken(admin: &Client, ns: &str, uid: &str) -> Result<(), String> {
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(admin.clone(), ns)
        .list(&Default::default())
        .await
        .map_err(|e| e.to_string())?;
    let told = events.items.iter().any(|e| {
        e.reason.as_deref() == Some("ProfileNameTaken")
            && e.regarding.as_ref().and_then(|r| r.uid.as_deref()) == Some(uid)
    });
    told.then_some(())
        .ok_or("no ProfileNameTaken Event yet".into())
}

/// Window one: a PyTorchJob and a tenant's Job of its name both made while
/// the operator is down (the PyTorchJob first), the Job's rank critical.
/// The profile is the PyTorchJob's alone, its roll-up counts its three
/// ranks and nothing of the Job's, and the shrink policy never acts on
/// the PyTorchJob: its uid and batch stay, no record is written.
#[tokio::test]
async fn a_job_made_while_the_operator_is_down_does_not_take_or_steer_a_pytorchjob_s_profile() {
    let Some((admin, ns)) = shrinking_workload_cluster().await else {
        return;
    };
    let ns = ns.name.as_str();
    let (pt, _pods) = pytorchjob_reporting_low(&admin, ns, json!({})).await;
    let job = tenant_job(&admin, ns, "train").await;
    let op = start_operator(&admin, ns);
    let profile = with_status(&admin, ns, "train").await;
    let st = profile.status.clone().unwrap_or_default();
    assert_eq!(
        (owners(&profile), st.ranks.as_str()),
        (vec![pt.uid().unwrap()], "3/3"),
        "the PyTorchJob's, over its own ranks (the Job is {:?})",
        job.uid()
    );
    assert_eq!(st.risk, RiskLevel::Low, "the Job's critical report counted");
    eventually("the Job told the name is taken", || {
        told_taken(&admin, ns, job.metadata.uid.as_deref().unwrap())
    })
    .await;
    let pt_uid = pt.uid();
    stays(
        "the PyTorchJob untouched, its profile its own",
        Duration::from_secs(8),
        || async {
            let now = api(&admin, ns, WorkloadKind::PyTorchJob)
                .get("train")
                .await
                .map_err(|e| e.to_string())?;
            let p = Api::<MemoryProfile>::namespaced(admin.clone(), ns)
                .get("train")
                .await
                .map_err(|e| e.to_string())?;
            let recs = p.status.clone().unwrap_or_default().remediations;
            let batch = batches(&now);
            let same = now.uid() == pt_uid && batch == vec![Some(json!("32")); 2];
            (same && recs.is_empty() && owners(&p) == [pt_uid.clone().unwrap()])
                .then_some(())
                .ok_or(format!(
                    "{:?} {batch:?} {recs:?} {:?}",
                    now.uid(),
                    owners(&p)
                ))
        },
    )
    .await;
    op.stop().await;
}

/// Window one for JobSets, both ways round, all made while the operator
/// is down: JobSet `early` before a tenant's Job `early`, and a tenant's
/// Job `late` before JobSet `late`. Each name's profile is the one made
/// first's: `early` the JobSet's over its two ranks, low; `late` the
/// Job's, and JobSet `late` is told so. The shrink policy never acts on
/// either JobSet on the Jobs' critical reports.
#[tokio::test]
async fn jobsets_and_jobs_of_one_name_made_while_the_operator_is_down_each_keep_their_own() {
    let Some((admin, ns)) = shrinking_workload_cluster().await else {
        return;
    };
    let ns = ns.name.as_str();
    let early = jobset_reporting_low(&admin, ns, "early").await;
    let early_job = tenant_job(&admin, ns, "early").await;
    let late_job = tenant_job(&admin, ns, "late").await;
    // Made in a later second than the Job: its creation stamp says so.
    let made = late_job.metadata.creation_timestamp.clone().unwrap().0;
    while jiff::Timestamp::now().as_second() <= made.as_second() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let late = jobset_reporting_low(&admin, ns, "late").await;
    let op = start_operator(&admin, ns);

    let profile = with_status(&admin, ns, "early").await;
    let st = profile.status.clone().unwrap_or_default();
    assert_eq!(
        (owners(&profile), st.ranks.as_str(), st.risk),
        (vec![early.uid().unwrap()], "2/2", RiskLevel::Low),
        "the JobSet's, over its own ranks (the Job is {:?})",
        early_job.uid()
    );
    let profile = with_status(&admin, ns, "late").await;
    assert_eq!(
        owners(&profile),
        vec![late_job.uid().unwrap()],
        "the Job's, made first (the JobSet is {:?})",
        late.uid()
    );
    eventually("JobSet late told the name is taken", || {
        told_taken(&admin, ns, late.metadata.uid.as_deref().unwrap())
    })
    .await;
    stays(
        "both JobSets untouched, each profile its first's",
        Duration::from_secs(8),
        || async {
            for (js, owner) in [(&early, &early), (&late, &late)] {
                let name = js.name_any();
                let now = api(&admin, ns, WorkloadKind::JobSet)
                    .get(&name)
                    .await
                    .map_err(|e| e.to_string())?;
                let batch = now.data.pointer(BATCH).cloned();
                let recs = records(&admin, ns, &name).await;
                let same = now.uid() == owner.uid() && batch == Some(json!("32"));
                if !same || !recs.is_empty() {
                    return Err(format!("{name}: {:?} {batch:?} {recs:?}", now.uid()));
                }
            }
            let p = Api::<MemoryProfile>::namespaced(admin.clone(), ns)
                .get("late")
                .await
                .map_err(|e| e.to_string())?;
            (owners(&p) == [late_job.uid().unwrap()])
                .then_some(())
                .ok_or(format!("late owned by {:?}", owners(&p)))
        },
    )
    .await;
    op.stop().await;
}

/// Window two for `kind`: memprof recreates `train` (the operator dies
/// between deleting the old one and creating the new, the profile
/// orphaned meanwhile) while a tenant's profiled Job `train` is made. The
/// restarted operator finishes the recreation; the profile is never the
/// Job's, the new workload adopts it with its record, and deleting the
/// Job leaves it.
async fn recreated_next_to_a_namesake_job(kind: WorkloadKind) {
    let Some((admin, ns)) = shrinking_workload_cluster().await else {
        return;
    };
    let ns = ns.name.as_str();
    let mut crashing = spawn_operator(ns, Some(FAILPOINT_AFTER_DELETE));
    let old = match kind {
        WorkloadKind::JobSet => {
            let js = profiled_jobset(&admin, ns, json!({})).await;
            child_report(&admin, ns, "train-workers-1", 100, RiskLevel::Critical).await;
            js
        }
        _ => {
            let (pt, pods) = profiled_pytorchjob(&admin, ns, json!({})).await;
            let gpus = vec![gpu(0, 79, 79, RiskLevel::Critical, Some(5.0))];
            apply_report(
                &admin,
                ns,
                &pod_report(&pods[2], "train", 0, &at(100), gpus),
            )
            .await;
            pt
        }
    };
    eventually("the operator to abort at the failpoint", || {
        let r = crashing.child.try_wait();
        async move { r.map_err(|e| e.to_string())?.ok_or("running".to_string()) }
    })
    .await;
    let rec = record_in(&admin, ns, "Pending").await;
    let profiles: Api<MemoryProfile> = Api::namespaced(admin.clone(), ns);
    eventually_within(
        GC_TIMEOUT,
        "the old workload gone, the profile orphaned",
        || async {
            let gone = api(&admin, ns, kind).get_opt("train").await;
            let p = profiles.get("train").await.map_err(|e| e.to_string())?;
            match gone.map_err(|e| e.to_string())? {
                None if owners(&p).is_empty() => Ok(()),
                other => Err(format!("{:?} {:?}", other.map(|o| o.uid()), owners(&p))),
            }
        },
    )
    .await;
    let job = tenant_job(&admin, ns, "train").await;
    let job_uid = job.uid().unwrap();
    drop(crashing);
    let op = start_operator(&admin, ns);

    let done = record_in(&admin, ns, "Done").await;
    assert_eq!(done.id, rec.id);
    let new = eventually(&format!("the new {}", kind.kind()), || async {
        match api(&admin, ns, kind).get_opt("train").await {
            Ok(Some(o)) if o.uid() != old.uid() => Ok(o),
            other => Err(format!("{:?}", other.map(|o| o.map(|o| o.uid())))),
        }
    })
    .await;
    let p = profiles.get("train").await.unwrap();
    assert!(
        !owners(&p).contains(&job_uid),
        "the Job took the profile of the {} memprof recreates",
        kind.kind()
    );
    if kind == WorkloadKind::JobSet {
        // The JobSet controller's part: the new JobSet's children, once
        // memprof deleted the old ones.
        controller_part_gone(&admin, ns, kind, "train").await;
        controller_part(&admin, ns, kind, &new).await;
    }
    let owned = eventually("the profile adopted", || async {
        let p = profiles.get("train").await.map_err(|e| e.to_string())?;
        (!owners(&p).is_empty())
            .then_some(p)
            .ok_or("no owner".to_string())
    })
    .await;
    let kept = owned.status.clone().unwrap_or_default().remediations.len();
    assert_eq!(
        (owners(&owned), kept),
        (vec![new.uid().unwrap()], 1),
        "the new {}'s, its history kept (the Job is {job_uid})",
        kind.kind()
    );
    eventually("the Job told the name is taken", || {
        told_taken(&admin, ns, &job_uid)
    })
    .await;

    let jobs = Api::<Job>::namespaced(admin.clone(), ns);
    jobs.delete("train", &DeleteParams::background())
        .await
        .unwrap();
    eventually_within(GC_TIMEOUT, "the tenant's Job gone", || async {
        match jobs.get_opt("train").await.map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(j) => Err(format!("{:?}", j.uid())),
        }
    })
    .await;
    let profile_uid = owned.uid();
    stays(
        "the profile kept, the new workload's",
        Duration::from_secs(6),
        || async {
            let p = profiles.get_opt("train").await.map_err(|e| e.to_string())?;
            let p = p.ok_or("the profile was deleted with the Job")?;
            (p.uid() == profile_uid && owners(&p) == [new.uid().unwrap()])
                .then_some(())
                .ok_or(format!("{:?} {:?}", p.uid(), owners(&p)))
        },
    )
    .await;
    op.stop().await;
}

#[tokio::test]
async fn a_pytorchjob_memprof_recreates_keeps_its_profile_from_a_job_of_its_name() {
    recreated_next_to_a_namesake_job(WorkloadKind::PyTorchJob).await;
}

#[tokio::test]
async fn a_jobset_memprof_recreates_keeps_its_profile_from_a_job_of_its_name() {
    recreated_next_to_a_namesake_job(WorkloadKind::JobSet).await;
}
