//! The Job remediation tests' PyTorchJob twins, through the real executor,
//! the webhook (on its secret path) and the operator, against the local
//! control plane. The test plays the training operator: it creates the
//! pods as its identity (impersonated), with the stand-in CRD of
//! tests/fixtures/workloads; nothing recreates pods after a change, so what
//! is checked is what memprof does to the PyTorchJob, its pods and the
//! record.
//!
//! - a Kueue-managed PyTorchJob is suspended (`runPolicy.suspend`), its
//!   Master and Worker templates patched, resumed, never deleted;
//! - one Kueue does not manage is recreated at the top level, its old pods
//!   deleted, the profile and its history adopted by the new PyTorchJob
//!   (twins of `remediation::critical_rank_recreates_the_job_…`);
//! - `notifyTrainer` reaches its master and every worker, the tally naming
//!   them by their rank in the PyTorchJob (twin of
//!   `remediation_notify::notify_trainer_reaches_every_…`);
//! - the checkpoint wait waits for every one of its ranks (twin of
//!   `remediation_checkpoint::a_restart_waits_for_every_ranks_next_…`);
//! - an operator killed mid suspend-patch-resume finishes it on restart
//!   (twin of `remediation::operator_killed_between_delete_and_create_…`);
//! - its risk Events and `memprof.dev/` annotations go on the PyTorchJob,
//!   none on its pods (twin of the operator's for a Job).

use crate::common;
use crate::remediation_support;
use crate::workload_support;

use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject};
use kube::{Client, ResourceExt};
use memprof::api::workload::WorkloadKind;
use memprof::api::{MemoryProfile, RiskLevel};
use remediation_support::{
    apply_policy, operator_shrinking, records, shrink_policy, shrinking_workload_cluster,
    spawn_operator, stays,
};
use serde_json::{json, Value};
use std::time::Duration;
use workload_support::*;

/// The env value of each replica type's first container.
pub(crate) fn batches(pt: &DynamicObject) -> Vec<Option<Value>> {
    ["Master", "Worker"]
        .iter()
        .map(|t| {
            let at = format!("/spec/pytorchReplicaSpecs/{t}/template/spec/containers/0/env");
            let env = pt.data.pointer(&at).and_then(Value::as_array).cloned();
            env.unwrap_or_default()
                .into_iter()
                .find(|e| e["name"] == "BATCH_SIZE")
                .map(|e| e["value"].clone())
        })
        .collect()
}

/// A profiled PyTorchJob `train` (a master, two workers; `labels` and
/// `team: ml`) whose pods the training operator's identity created (marked
/// by the webhook), each rank reporting low
/// ([`pytorchjob_reporting_low`]), its profile written with all three
/// ranks. Returns it and its pods.
pub(crate) async fn profiled_pytorchjob(
    admin: &Client,
    ns: &str,
    labels: Value,
) -> (DynamicObject, Vec<Pod>) {
    let (pt, pods) = pytorchjob_reporting_low(admin, ns, labels).await;
    let profiles: Api<MemoryProfile> = Api::namespaced(admin.clone(), ns);
    eventually("the PyTorchJob's profile with 3 ranks", || async {
        let p = profiles.get_opt("train").await.map_err(|e| e.to_string())?;
        let ranks = p
            .and_then(|p| p.status)
            .map(|s| s.ranks)
            .unwrap_or_default();
        (ranks == "3/3").then_some(()).ok_or(ranks)
    })
    .await;
    (pt, pods)
}

async fn report(admin: &Client, ns: &str, pod: &Pod, offset: u64, risk: RiskLevel) {
    let peak = if risk == RiskLevel::Critical { 79 } else { 30 };
    let tto = (risk == RiskLevel::Critical).then_some(5.0);
    let gpus = vec![gpu(0, peak, peak, risk, tto)];
    apply_report(admin, ns, &pod_report(pod, "train", 0, &at(offset), gpus)).await;
}

async fn done(admin: &Client, ns: &str) -> memprof::api::RemediationRecord {
    let profiles: Api<MemoryProfile> = Api::namespaced(admin.clone(), ns);
    eventually("the profile critical", || async {
        let p = profiles.get("train").await.map_err(|e| e.to_string())?;
        let st = p.status.unwrap_or_default();
        (st.risk == RiskLevel::Critical)
            .then_some(())
            .ok_or(format!("{:?} {:?}", st.risk, st.ranks))
    })
    .await;
    eventually("the record Done", || async {
        let recs = records(admin, ns, "train").await;
        match recs.as_slice() {
            [r] if r.phase == "Done" => Ok(r.clone()),
            _ => Err(format!("{recs:?}")),
        }
    })
    .await
}

#[tokio::test]
async fn a_kueue_managed_pytorchjob_is_suspended_patched_and_resumed_by_the_executor() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let ns = ns.name.as_str();
    let op = operator_shrinking(&admin, ns, false).await;
    let queued = json!({"kueue.x-k8s.io/queue-name": "team-a"});
    let (pt, pods) = profiled_pytorchjob(&admin, ns, queued).await;
    report(&admin, ns, &pods[2], 100, RiskLevel::Critical).await;
    let rec = done(&admin, ns).await;
    assert_eq!(
        rec.env_change.as_deref(),
        Some("suspend-patch-resume"),
        "{rec:?}"
    );
    assert_eq!(rec.action, "scaleBatch BATCH_SIZE 32->24");
    let after = api(&admin, ns, WorkloadKind::PyTorchJob)
        .get("train")
        .await
        .unwrap();
    assert_eq!(after.uid(), pt.uid(), "never deleted");
    assert_eq!(batches(&after), vec![Some(json!("24")), Some(json!("24"))]);
    assert_eq!(
        after.data.pointer("/spec/runPolicy/suspend"),
        Some(&json!(false)),
        "resumed"
    );
    assert_eq!(after.annotations()["memprof.dev/remediation"], rec.id);
    // Its pods are the training operator's to replace: never memprof's.
    for pod in &pods {
        let p = Api::<Pod>::namespaced(admin.clone(), ns)
            .get(&pod.name_any())
            .await
            .unwrap();
        assert_eq!(p.uid(), pod.uid());
    }
    op.stop().await;
}

#[tokio::test]
async fn a_pytorchjob_kueue_does_not_manage_is_recreated_at_the_top_level() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let ns = ns.name.as_str();
    let op = operator_shrinking(&admin, ns, false).await;
    let (pt, pods) = profiled_pytorchjob(&admin, ns, json!({})).await;
    report(&admin, ns, &pods[1], 100, RiskLevel::Critical).await;
    let rec = done(&admin, ns).await;
    assert_eq!(rec.env_change.as_deref(), Some("recreate"), "{rec:?}");
    let new = api(&admin, ns, WorkloadKind::PyTorchJob)
        .get("train")
        .await
        .unwrap();
    assert_ne!(new.uid(), pt.uid(), "a new PyTorchJob");
    let msg = rec.message.clone().unwrap_or_default();
    let recreated = format!(
        "PyTorchJob recreated (uid {} -> {})",
        pt.uid().unwrap(),
        new.uid().unwrap()
    );
    assert!(msg.contains(&recreated), "named by its kind: {msg}");
    assert_eq!(batches(&new), vec![Some(json!("24")), Some(json!("24"))]);
    // The new PyTorchJob adopts the profile, its history kept: never the
    // old one, which the garbage collector would take it with.
    let profiles: Api<MemoryProfile> = Api::namespaced(admin.clone(), ns);
    eventually("the profile owned by the new PyTorchJob", || async {
        let p = profiles.get("train").await.map_err(|e| e.to_string())?;
        let owners: Vec<String> = p.owner_references().iter().map(|o| o.uid.clone()).collect();
        let kept = p.status.map(|s| s.remediations.len()).unwrap_or_default();
        (owners == [new.uid().unwrap()] && kept == 1)
            .then_some(())
            .ok_or(format!("owners {owners:?}, {kept} records"))
    })
    .await;
    let podsapi = Api::<Pod>::namespaced(admin.clone(), ns);
    eventually("the old pods deleted", || async {
        let mut left = Vec::new();
        for p in &pods {
            if let Some(p) = podsapi
                .get_opt(&p.name_any())
                .await
                .map_err(|e| e.to_string())?
            {
                left.push(p.name_any());
            }
        }
        left.is_empty().then_some(()).ok_or(format!("{left:?}"))
    })
    .await;
    op.stop().await;
}

/// Rank `pod` critical (600 s to OOM, sampled a second ago so that it
/// counts from now), its trainer's last checkpoint `checkpoint`.
async fn critical_with_checkpoint(
    admin: &Client,
    ns: &str,
    pod: &Pod,
    checkpoint: (jiff::Timestamp, u64),
) {
    let sampled = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(1);
    let sampled = sampled.round(jiff::Unit::Second).unwrap().to_string();
    let gpus = vec![gpu(0, 79, 79, RiskLevel::Critical, Some(600.0))];
    let mut r = pod_report(pod, "train", 0, &sampled, gpus);
    r.spec.last_checkpoint = Some(memprof::api::Checkpoint {
        time: checkpoint.0.to_string(),
        note: format!("step={}", checkpoint.1),
        step: Some(checkpoint.1),
    });
    apply_report(admin, ns, &r).await;
}

/// The PyTorchJob `train` as stored now.
pub(crate) async fn stored(admin: &Client, ns: &str) -> DynamicObject {
    api(admin, ns, WorkloadKind::PyTorchJob)
        .get("train")
        .await
        .unwrap()
}

#[tokio::test]
async fn notify_trainer_reaches_the_master_and_every_worker_of_the_pytorchjob() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let ns = ns.name.as_str();
    let op = start_operator(&admin, ns);
    let policy = json!({
        "selector": {"matchLabels": {"team": "ml"}},
        "triggers": [{"riskAtLeast": {"level": "critical"}}],
        "actions": [{"notifyTrainer": {"level": "critical"}}],
        "cooldownSeconds": 600,
        "maxRemediations": 1,
    });
    apply_policy(&admin, ns, "tell", policy).await.unwrap();
    let (pt, pods) = profiled_pytorchjob(&admin, ns, json!({})).await;
    report(&admin, ns, &pods[2], 100, RiskLevel::Critical).await;
    let rec = done(&admin, ns).await;
    assert_eq!(rec.env_change, None, "no environment changed");
    let tally = rec.acknowledged.clone().expect("a tally from the start");
    // Every sidecar here wrote rank 0: the tally names the PyTorchJob's ranks.
    assert_eq!(
        (tally.delivered, tally.summary.as_str()),
        (3, "0/3 acknowledged (3 pending: ranks 0, 1, 2)")
    );
    let reports = Api::<memprof::api::MemoryReport>::namespaced(admin.clone(), ns);
    for pod in &pods {
        let r = reports.get(&pod.name_any()).await.unwrap();
        let ids: Vec<String> = r
            .status
            .map(|s| s.directives)
            .unwrap_or_default()
            .into_iter()
            .map(|d| d.id)
            .collect();
        assert_eq!(ids, vec![rec.id.clone()], "{}'s report", pod.name_any());
    }
    let after = stored(&admin, ns).await;
    assert_eq!(
        after.data["spec"], pt.data["spec"],
        "a notice changes nothing"
    );
    op.stop().await;
}

#[tokio::test]
async fn a_pytorchjob_s_change_waits_for_every_rank_s_next_checkpoint() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let ns = ns.name.as_str();
    let op = start_operator(&admin, ns);
    let mut policy = shrink_policy(false);
    policy["waitForCheckpoint"] = json!({"maxSeconds": 60, "marginSeconds": 5});
    apply_policy(&admin, ns, "shrink", policy).await.unwrap();
    let queued = json!({"kueue.x-k8s.io/queue-name": "team-a"});
    let (_, pods) = profiled_pytorchjob(&admin, ns, queued).await;
    let earlier = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(600);
    for pod in &pods {
        critical_with_checkpoint(&admin, ns, pod, (earlier, 1200)).await;
    }
    record_in(&admin, ns, "Pending").await;
    let untouched = || async {
        let batch = batches(&stored(&admin, ns).await);
        let pending = records(&admin, ns, "train")
            .await
            .iter()
            .any(|r| r.phase == "Pending");
        (batch == [Some(json!("32")), Some(json!("32"))] && pending)
            .then_some(())
            .ok_or(format!("{batch:?}"))
    };
    stays(
        "unchanged while no rank checkpointed",
        Duration::from_secs(3),
        untouched,
    )
    .await;
    // The master and one worker checkpoint: the other worker's work would be lost.
    let newer = jiff::Timestamp::now();
    for pod in &pods[..2] {
        critical_with_checkpoint(&admin, ns, pod, (newer, 1300)).await;
    }
    stays(
        "unchanged until every rank checkpointed",
        Duration::from_secs(3),
        untouched,
    )
    .await;
    critical_with_checkpoint(&admin, ns, &pods[2], (newer, 1300)).await;
    let rec = record_in(&admin, ns, "Done").await;
    assert_eq!(rec.env_change.as_deref(), Some("suspend-patch-resume"));
    let kept = rec.checkpoint.expect("what the change kept");
    assert_eq!(
        (kept.result.as_str(), kept.ranks),
        ("checkpointed", 3),
        "{kept:?}"
    );
    assert_eq!(
        batches(&stored(&admin, ns).await),
        vec![Some(json!("24")), Some(json!("24"))]
    );
    op.stop().await;
}

#[tokio::test]
async fn an_operator_killed_mid_suspend_patch_resume_of_a_pytorchjob_finishes_it_on_restart() {
    let Some((admin, ns)) = shrinking_workload_cluster().await else {
        return;
    };
    let ns = ns.name.as_str();
    let mut crashing = spawn_operator(ns, Some(memprof::remediation::FAILPOINT_AFTER_SUSPEND));
    let queued = json!({"kueue.x-k8s.io/queue-name": "team-a"});
    let (pt, pods) = profiled_pytorchjob(&admin, ns, queued).await;
    report(&admin, ns, &pods[2], 100, RiskLevel::Critical).await;
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
    // Suspended, not patched yet, the decision recorded and its plan saved.
    let rec = record_in(&admin, ns, "Pending").await;
    assert_eq!(rec.env_change.as_deref(), Some("suspend-patch-resume"));
    let mid = stored(&admin, ns).await;
    assert_eq!(
        mid.data.pointer("/spec/runPolicy/suspend"),
        Some(&json!(true))
    );
    assert_eq!(batches(&mid), vec![Some(json!("32")), Some(json!("32"))]);
    drop(crashing);
    let _restarted = spawn_operator(ns, None);
    let done = record_in(&admin, ns, "Done").await;
    assert_eq!(done.id, rec.id);
    let after = stored(&admin, ns).await;
    assert_eq!(after.uid(), pt.uid(), "never deleted");
    assert_eq!(
        after.data.pointer("/spec/runPolicy/suspend"),
        Some(&json!(false)),
        "never left suspended"
    );
    assert_eq!(batches(&after), vec![Some(json!("24")), Some(json!("24"))]);
}

#[tokio::test]
async fn a_pytorchjob_s_risk_events_and_annotations_go_on_the_pytorchjob() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let ns = ns.name.as_str();
    let op = start_operator(&admin, ns);
    let (_, pods) = profiled_pytorchjob(&admin, ns, json!({})).await;
    report(&admin, ns, &pods[1], 100, RiskLevel::Critical).await;
    eventually("the PyTorchJob annotated with its risk", || async {
        let pt = api(&admin, ns, WorkloadKind::PyTorchJob)
            .get("train")
            .await
            .map_err(|e| e.to_string())?;
        let a = pt.annotations();
        let got = (
            a.get("memprof.dev/oom-risk"),
            a.get("memprof.dev/bottleneck"),
        );
        match got {
            (Some(risk), Some(b)) if risk == "critical" && b.contains(&pods[1].name_any()) => {
                Ok(())
            }
            _ => Err(format!("{got:?}")),
        }
    })
    .await;
    let kinds = eventually("the risk Event about the PyTorchJob", || async {
        let kinds = event_kinds(&admin, ns, "RiskCritical", "train").await;
        (!kinds.is_empty())
            .then_some(kinds)
            .ok_or("none".to_string())
    })
    .await;
    assert!(kinds.iter().all(|k| k == "PyTorchJob"), "{kinds:?}");
    // Its pods carry none: their reports are the PyTorchJob's.
    for pod in &pods {
        let p = Api::<Pod>::namespaced(admin.clone(), ns)
            .get(&pod.name_any())
            .await
            .unwrap();
        assert!(
            !p.annotations().contains_key("memprof.dev/oom-risk"),
            "{}",
            p.name_any()
        );
    }
    op.stop().await;
}
