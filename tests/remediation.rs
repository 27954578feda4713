//! Automated OOM remediation against a real control plane (kube-apiserver and
//! kube-controller-manager 1.20 from `hack/local-cluster.sh up`: the Job
//! controller creates pods, the garbage collector orphans and collects; no
//! scheduler or kubelet, so tests write pod statuses themselves).
//!
//!     eval "$(bash hack/local-cluster.sh env)"
//!     MEMPROF_REQUIRE_CLUSTER=1 cargo test --test integration remediation::
//!
//! Without `KUBECONFIG` every test is skipped with a message.

use crate::common;
use crate::remediation_support;

use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, ListParams};
use kube::ResourceExt;
use memprof::api::{MemoryProfile, RemediationPolicy};
use remediation_support::*;
use serde_json::json;
use std::time::Duration;

#[tokio::test]
async fn critical_rank_recreates_the_job_with_a_smaller_batch_exactly_once() {
    let Some(client) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&client).await;
    let ns = ns.name.as_str();
    let operator = operator_shrinking(&client, ns, false).await;
    let old = training_job(&client, ns, "train", Some("32")).await;
    let old_uid = old.uid().unwrap();
    let old_pod = first_pod(&client, ns, "train").await;
    low_report(&client, ns, "train").await;
    let profile = profile_with_status(&client, ns, "train").await;

    critical_report(&client, ns, "train", 100).await;
    let new = eventually("the Job recreated with BATCH_SIZE 24", || async {
        match job(&client, ns, "train").await {
            Some(j) if j.uid().as_deref() != Some(old_uid.as_str()) => {
                let env = env_of(&j, "BATCH_SIZE");
                (env.as_deref() == Some("24"))
                    .then_some(j)
                    .ok_or(format!("{env:?}"))
            }
            other => Err(format!("{:?}", other.map(|j| j.uid()))),
        }
    })
    .await;
    let ann = new.annotations();
    assert_eq!(ann["memprof.dev/original-batch_size"], "32");
    assert_eq!(
        env_of(&new, "LR").as_deref(),
        Some("0.001"),
        "the rest of the spec is kept"
    );
    let recs = eventually("the record Done", || async {
        let recs = records(&client, ns, "train").await;
        match recs.as_slice() {
            [r] if r.phase == "Done" => Ok(recs),
            _ => Err(format!("{recs:?}")),
        }
    })
    .await;
    assert_eq!(ann["memprof.dev/remediation"], recs[0].id);
    assert_eq!(recs[0].action, "scaleBatch BATCH_SIZE 32->24");

    // The profile survived the recreation and is adopted by the new Job.
    let profiles = Api::<MemoryProfile>::namespaced(client.clone(), ns);
    let new_uid = new.uid().unwrap();
    let p = eventually("the profile owned by the new Job", || async {
        let p = profiles.get("train").await.map_err(|e| e.to_string())?;
        let owners: Vec<_> = p.owner_references().iter().map(|o| o.uid.clone()).collect();
        (owners == vec![new_uid.clone()])
            .then_some(p)
            .ok_or(format!("{owners:?}"))
    })
    .await;
    assert_eq!(
        p.uid(),
        profile.uid(),
        "same MemoryProfile object, history kept"
    );
    assert_eq!(
        p.status.unwrap().last_action.as_deref(),
        Some("scaleBatch BATCH_SIZE 32->24")
    );
    // The old Job's (orphaned) pod is gone; the new Job has its own.
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    eventually("the old pod deleted", || async {
        match pods
            .get_opt(&old_pod.name_any())
            .await
            .map_err(|e| e.to_string())?
        {
            None => Ok(()),
            Some(p) => Err(format!("still there: {:?}", p.metadata.deletion_timestamp)),
        }
    })
    .await;
    // No leftover plan.
    let cms = Api::<ConfigMap>::namespaced(client.clone(), ns);
    let plans = cms
        .list(&ListParams::default().labels("memprof.dev/remediation"))
        .await
        .unwrap();
    assert!(plans.items.is_empty());

    // The rank stays critical: within the cooldown nothing more happens.
    let mut t = 1_000;
    stays(
        "one remediation within the cooldown",
        Duration::from_secs(6),
        || {
            t += 500;
            let (client, t) = (client.clone(), t);
            let new_uid = new_uid.clone();
            async move {
                critical_report(&client, ns, "train", t).await;
                let j = job(&client, ns, "train").await.ok_or("Job gone")?;
                if j.uid() != Some(new_uid) || env_of(&j, "BATCH_SIZE").as_deref() != Some("24") {
                    return Err(format!("Job changed again: {:?}", env_of(&j, "BATCH_SIZE")));
                }
                let recs = records(&client, ns, "train").await;
                (recs.len() == 1).then_some(()).ok_or(format!("{recs:?}"))
            }
        },
    )
    .await;

    let policies = Api::<RemediationPolicy>::namespaced(client.clone(), ns);
    eventually("the policy status", || async {
        let st = policies
            .get("shrink")
            .await
            .unwrap()
            .status
            .unwrap_or_default();
        let ok = st.action_count == 1 && st.matched_jobs == vec!["train".to_string()];
        ok.then_some(()).ok_or(format!("{st:?}"))
    })
    .await;
    assert!(count_events(&client, ns, "Remediated", "train").await >= 1);
    operator.stop().await;
}

#[tokio::test]
async fn cuda_oom_exit_is_recorded_once_and_fires_the_oom_policy() {
    let Some(client) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&client).await;
    let ns = ns.name.as_str();
    let operator = start_operator(&client, ns);
    let spec = json!({
        "triggers": [{"oomObserved": true}],
        "actions": [
            {"annotate": {"key": "example.com/gpu-oom", "value": "seen"}},
            {"event": {"reason": "TrainerOom"}},
        ],
    });
    apply_policy(&client, ns, "on-oom", spec).await.unwrap();
    let created = training_job(&client, ns, "train", Some("32")).await;
    let pod = first_pod(&client, ns, "train").await;
    low_report(&client, ns, "train").await;
    profile_with_status(&client, ns, "train").await;

    let msg = "Traceback (most recent call last):\n  ...\ntorch.cuda.OutOfMemoryError: CUDA out of memory. \
               Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity)";
    terminate_container(&client, ns, &pod.name_any(), "trainer", 1, msg).await;

    let profiles = Api::<MemoryProfile>::namespaced(client.clone(), ns);
    let st = eventually("the OOM recorded and the policy done", || async {
        let st = profiles.get("train").await.unwrap().status.unwrap();
        let done = st.remediations.iter().any(|r| r.phase == "Done");
        (st.ooms.len() == 1 && done)
            .then_some(st.clone())
            .ok_or(format!("{st:?}"))
    })
    .await;
    let oom = &st.ooms[0];
    assert_eq!(oom.pod, pod.name_any());
    assert!(
        oom.evidence
            .starts_with("terminationMessage trainer#0: exit 1, \"CUDA out of memory\""),
        "{}",
        oom.evidence
    );
    let j = job(&client, ns, "train").await.unwrap();
    assert_eq!(j.uid(), created.uid(), "annotate does not recreate");
    assert_eq!(j.annotations()["example.com/gpu-oom"], "seen");

    // Touching the pod again (a kubelet would) records nothing new.
    terminate_container(&client, ns, &pod.name_any(), "trainer", 1, msg).await;
    stays(
        "one OOM, one remediation",
        Duration::from_secs(3),
        || async {
            let st = profiles.get("train").await.unwrap().status.unwrap();
            (st.ooms.len() == 1 && st.remediations.len() == 1)
                .then_some(())
                .ok_or(format!("{st:?}"))
        },
    )
    .await;
    assert_eq!(
        count_events(&client, ns, "GPUOutOfMemory", "train").await,
        1
    );
    assert_eq!(count_events(&client, ns, "TrainerOom", "train").await, 1);
    operator.stop().await;
}

#[tokio::test]
async fn dry_run_changes_nothing_but_records_what_it_would_do() {
    let Some(client) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&client).await;
    let ns = ns.name.as_str();
    let operator = operator_shrinking(&client, ns, true).await;
    let created = training_job(&client, ns, "train", Some("32")).await;
    low_report(&client, ns, "train").await;
    profile_with_status(&client, ns, "train").await;
    critical_report(&client, ns, "train", 100).await;

    let recs = eventually("a DryRun record", || async {
        let recs = records(&client, ns, "train").await;
        (recs.len() == 1)
            .then_some(recs.clone())
            .ok_or(format!("{recs:?}"))
    })
    .await;
    assert_eq!(recs[0].phase, "DryRun");
    assert_eq!(recs[0].action, "scaleBatch BATCH_SIZE 32->24");
    let mut t = 0;
    stays(
        "the Job untouched, one record",
        Duration::from_secs(3),
        || {
            t += 500;
            let (client, t, uid) = (client.clone(), t, created.uid());
            async move {
                critical_report(&client, ns, "train", t).await;
                let j = job(&client, ns, "train").await.ok_or("Job gone")?;
                let same = j.uid() == uid && env_of(&j, "BATCH_SIZE").as_deref() == Some("32");
                let n = records(&client, ns, "train").await.len();
                (same && n == 1)
                    .then_some(())
                    .ok_or(format!("same job: {same}, records: {n}"))
            }
        },
    )
    .await;
    assert_eq!(
        count_events(&client, ns, "RemediationDryRun", "train").await,
        1
    );
    operator.stop().await;
}

#[tokio::test]
async fn job_without_the_env_var_is_skipped_once_with_the_reason() {
    let Some(client) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&client).await;
    let ns = ns.name.as_str();
    let operator = operator_shrinking(&client, ns, false).await;
    let created = training_job(&client, ns, "train", None).await;
    low_report(&client, ns, "train").await;
    profile_with_status(&client, ns, "train").await;
    critical_report(&client, ns, "train", 100).await;

    let recs = eventually("a Skipped record", || async {
        let recs = records(&client, ns, "train").await;
        (recs.len() == 1)
            .then_some(recs.clone())
            .ok_or(format!("{recs:?}"))
    })
    .await;
    assert_eq!(recs[0].phase, "Skipped");
    let msg = recs[0].message.clone().unwrap();
    assert_eq!(
        msg,
        "NoSuchEnv: no container of the Job sets env BATCH_SIZE: nothing to scale"
    );
    let policies = Api::<RemediationPolicy>::namespaced(client.clone(), ns);
    eventually("the policy's ActionsApplicable condition", || async {
        let st = policies
            .get("shrink")
            .await
            .unwrap()
            .status
            .unwrap_or_default();
        let c = st
            .conditions
            .iter()
            .find(|c| c.type_ == "ActionsApplicable");
        match c {
            Some(c) if c.status == "False" && c.reason == "NoSuchEnv" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(records(&client, ns, "train").await.len(), 1);
    assert_eq!(
        count_events(&client, ns, "RemediationSkipped", "train").await,
        1
    );
    assert_eq!(
        job(&client, ns, "train").await.unwrap().uid(),
        created.uid()
    );
    operator.stop().await;
}

#[tokio::test]
async fn suspend_is_reported_unsupported_where_the_server_lacks_it() {
    let Some(client) = cluster().await else {
        return;
    };
    let version = client.apiserver_version().await.unwrap();
    let minor: u32 = version.minor.trim_end_matches('+').parse().unwrap_or(0);
    let ns = TestNamespace::create(&client).await;
    let ns = ns.name.as_str();
    let operator = start_operator(&client, ns);
    let spec =
        json!({"triggers": [{"riskAtLeast": {"level": "high"}}], "actions": [{"suspend": true}]});
    apply_policy(&client, ns, "pause", spec).await.unwrap();
    training_job(&client, ns, "train", Some("32")).await;
    low_report(&client, ns, "train").await;
    profile_with_status(&client, ns, "train").await;
    critical_report(&client, ns, "train", 100).await;

    let recs = eventually("a final record", || async {
        let recs = records(&client, ns, "train").await;
        match recs.as_slice() {
            [r] if r.phase != "Pending" => Ok(recs),
            _ => Err(format!("{recs:?}")),
        }
    })
    .await;
    if minor >= 22 {
        assert_eq!(recs[0].phase, "Done", "{recs:?}");
        return;
    }
    assert_eq!(recs[0].phase, "Failed");
    assert!(recs[0]
        .message
        .as_deref()
        .unwrap()
        .starts_with("Unsupported: the API server ignored Job spec.suspend"));
    let policies = Api::<RemediationPolicy>::namespaced(client.clone(), ns);
    eventually("the policy's Unsupported condition", || async {
        let st = policies
            .get("pause")
            .await
            .unwrap()
            .status
            .unwrap_or_default();
        let c = st.conditions.iter().find(|c| c.type_ == "Unsupported");
        (c.is_some_and(|c| c.status == "True"))
            .then_some(())
            .ok_or(format!("{c:?}"))
    })
    .await;
    operator.stop().await;
}

#[tokio::test]
async fn invalid_policies_are_rejected_by_the_api_server_naming_the_field() {
    let Some(client) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&client).await;
    let ns = ns.name.as_str();
    let risk = json!([{"riskAtLeast": {"level": "critical"}}]);
    let cases = [
        (
            json!({"triggers": risk, "actions": [{"scaleBatch": {"env": "BATCH_SIZE", "factor": 1.5}}]}),
            "spec.actions.scaleBatch.factor",
        ),
        (
            json!({"triggers": risk, "actions": [{"scaleBatch": {"env": "BATCH_SIZE", "factor": 0}}]}),
            "spec.actions.scaleBatch.factor",
        ),
        (
            json!({"triggers": [{"riskAtLeast": {"level": "severe"}}], "actions": [{"suspend": true}]}),
            "spec.triggers.riskAtLeast.level",
        ),
        (
            json!({"triggers": risk, "actions": [{"scaleBatch": {"factor": 0.5}}]}),
            "spec.actions.scaleBatch.env",
        ),
        (
            json!({"triggers": [{"oomObserved": true, "imbalanceAbove": 1.5}], "actions": [{"suspend": true}]}),
            "spec.triggers",
        ),
        (
            json!({"triggers": [], "actions": [{"suspend": true}]}),
            "spec.triggers",
        ),
        (
            json!({"triggers": risk, "actions": [{"setConfigMapKey": {"configMap": "c", "key": "k"}}]}),
            "spec.actions.setConfigMapKey",
        ),
        (
            json!({"triggers": risk, "actions": [{"suspend": true}], "cooldownSeconds": -1}),
            "spec.cooldownSeconds",
        ),
    ];
    for (i, (spec, field)) in cases.into_iter().enumerate() {
        match apply_policy(&client, ns, &format!("bad-{i}"), spec.clone()).await {
            Ok(_) => panic!("accepted an invalid policy: {spec}"),
            Err(kube::Error::Api(s)) => {
                assert_eq!(s.code, 422, "{s:?}");
                eprintln!("case {i}: {}", s.message);
                assert!(
                    s.message.contains(field),
                    "case {i}: {field} not in: {}",
                    s.message
                );
            }
            Err(e) => panic!("{e}"),
        }
    }
    let ok = apply_policy(&client, ns, "good", shrink_policy(false))
        .await
        .unwrap();
    assert_eq!(ok.spec.cooldown_seconds, 600);
    let defaults = json!({"triggers": risk, "actions": [{"scaleBatch": {"env": "BATCH_SIZE", "factor": 0.5}}]});
    let d = apply_policy(&client, ns, "defaults", defaults)
        .await
        .unwrap();
    assert_eq!(
        (
            d.spec.cooldown_seconds,
            d.spec.max_remediations,
            d.spec.dry_run
        ),
        (600, 3, false)
    );
    assert_eq!(d.spec.actions[0].scale_batch.as_ref().unwrap().minimum, 1);
}

#[tokio::test]
async fn operator_killed_between_delete_and_create_finishes_on_restart() {
    let Some(client) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&client).await;
    let ns = ns.name.as_str();
    apply_shrink(&client, ns, false).await;
    let old = training_job(&client, ns, "train", Some("32")).await;
    let old_uid = old.uid().unwrap();

    let mut crashing = spawn_operator(ns, Some("remediation-after-delete"));
    low_report(&client, ns, "train").await;
    profile_with_status(&client, ns, "train").await;
    critical_report(&client, ns, "train", 100).await;
    let status = eventually("the operator to abort at the failpoint", || {
        let r = crashing.child.try_wait();
        async move {
            match r.map_err(|e| e.to_string())? {
                Some(s) => Ok(s),
                None => Err("still running".into()),
            }
        }
    })
    .await;
    assert!(!status.success(), "{status:?}");

    // Between delete and create: the old Job is going or gone, the decision
    // and the plan are saved, the profile is still there.
    let recs = records(&client, ns, "train").await;
    assert!(
        matches!(recs.as_slice(), [r] if r.phase == "Pending"),
        "{recs:?}"
    );
    let id = recs[0].id.clone();
    let cms = Api::<ConfigMap>::namespaced(client.clone(), ns);
    assert!(cms
        .get_opt(&format!("memprof-remediation-{id}"))
        .await
        .unwrap()
        .is_some());
    if let Some(j) = job(&client, ns, "train").await {
        assert_eq!(j.uid().as_deref(), Some(old_uid.as_str()));
        assert!(
            j.metadata.deletion_timestamp.is_some(),
            "the old Job is being deleted"
        );
    }

    drop(crashing);
    let _restarted = spawn_operator(ns, None);
    let new = eventually("the Job created again", || async {
        match job(&client, ns, "train").await {
            Some(j) if j.uid().as_deref() != Some(old_uid.as_str()) => Ok(j),
            other => Err(format!("{:?}", other.map(|j| j.uid()))),
        }
    })
    .await;
    assert_eq!(env_of(&new, "BATCH_SIZE").as_deref(), Some("24"));
    assert_eq!(new.annotations()["memprof.dev/remediation"], id);
    eventually("the record Done", || async {
        let recs = records(&client, ns, "train").await;
        match recs.as_slice() {
            [r] if r.phase == "Done" && r.id == id => Ok(()),
            _ => Err(format!("{recs:?}")),
        }
    })
    .await;
    let mut t = 1_000;
    stays(
        "exactly one Job, remediated once",
        Duration::from_secs(4),
        || {
            t += 500;
            let (client, t) = (client.clone(), t);
            let new_uid = new.uid().unwrap();
            async move {
                critical_report(&client, ns, "train", t).await;
                let uids = job_uids(&client, ns, "train").await;
                let recs = records(&client, ns, "train").await;
                (uids == vec![new_uid] && recs.len() == 1)
                    .then_some(())
                    .ok_or(format!("jobs {uids:?}, records {recs:?}"))
            }
        },
    )
    .await;
    assert!(cms
        .get_opt(&format!("memprof-remediation-{id}"))
        .await
        .unwrap()
        .is_none());
}

/// Not a test: the operator process of the crash test, when the
/// `memprof-operator` binary does not run the remediation controller yet.
#[test]
#[ignore = "entry point of a child process (MEMPROF_CHILD_NAMESPACE)"]
fn child_operator() {
    if let Ok(ns) = std::env::var("MEMPROF_CHILD_NAMESPACE") {
        run_child_operator(&ns);
    }
}
