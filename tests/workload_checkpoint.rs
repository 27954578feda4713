//! The checkpoint wait's workload twins (`remediation_checkpoint::` holds
//! the Job's): what a wait counts is per kind (a JobSet's ranks across its
//! child Jobs, a PyTorchJob's pods in the training operator's watch), and
//! so is how a pending change of a workload is taken up again after an
//! operator restart. Against the local control plane, the test playing
//! the upper controllers as `workload_support` does.
//!
//! - a PyTorchJob's (recreated) or a JobSet's (suspended) trainer that
//!   exits during the wait ends it at once (twins of
//!   `a_trainer_that_exits_during_the_wait_ends_it_at_once`: a PyTorchJob's
//!   pods' container statuses must reach the wait);
//! - without a newer checkpoint the change goes at the bound, even across
//!   an operator restart, for a PyTorchJob and a JobSet (twins of
//!   `without_a_newer_checkpoint_the_restart_goes_at_the_bound_…`);
//! - a workload that never checkpoints is not waited for (twins of
//!   `a_trainer_that_never_checkpoints_is_not_waited_for`).
//!
//! Run them:
//!
//!     eval "$(bash hack/local-cluster.sh env)"
//!     MEMPROF_REQUIRE_CLUSTER=1 cargo test --test integration workload_checkpoint::
//!
//! Without `KUBECONFIG` every test is skipped with a message.

use crate::common;
use crate::remediation_support;
use crate::workload_remediation_pytorch::{batches, profiled_pytorchjob, stored};
use crate::workload_remediation_twins::{profiled_jobset, BATCH};
use crate::workload_support;

use common::*;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Pod;
use kube::{Client, ResourceExt};
use memprof::api::workload::WorkloadKind;
use memprof::api::{Checkpoint, RemediationRecord, RiskLevel};
use remediation_support::{apply_policy, shrink_policy, stays, terminate_container};
use serde_json::json;
use std::time::{Duration, Instant};
use workload_support::*;

/// `shrink_policy` (critical → BATCH_SIZE × 0.75) waiting for a checkpoint.
async fn waiting_policy(admin: &Client, ns: &str, max_seconds: u32, margin_seconds: u32) {
    let mut p = shrink_policy(false);
    p["waitForCheckpoint"] = json!({"maxSeconds": max_seconds, "marginSeconds": margin_seconds});
    apply_policy(admin, ns, "shrink", p).await.unwrap();
}

/// The rank of `pod` (its report claiming `claim`) critical with `tto`
/// seconds to OOM, sampled a second ago so that it counts from now, its
/// trainer's last checkpoint `checkpoint`.
async fn critical(
    admin: &Client,
    ns: &str,
    (pod, claim): (&Pod, &str),
    tto: f64,
    checkpoint: Option<(Timestamp, u64)>,
) {
    let sampled = Timestamp::now() - SignedDuration::from_secs(1);
    let sampled = sampled.round(jiff::Unit::Second).unwrap().to_string();
    let gpus = vec![gpu(0, 79, 79, RiskLevel::Critical, Some(tto))];
    let mut r = pod_report(pod, claim, 0, &sampled, gpus);
    r.spec.last_checkpoint = checkpoint.map(|(t, step)| Checkpoint {
        time: t.to_string(),
        note: format!("step={step}"),
        step: Some(step),
    });
    apply_report(admin, ns, &r).await;
}

/// Every rank of the PyTorchJob critical.
async fn pytorch_critical(
    admin: &Client,
    ns: &str,
    pods: &[Pod],
    tto: f64,
    checkpoint: Option<(Timestamp, u64)>,
) {
    for pod in pods {
        critical(admin, ns, (pod, "train"), tto, checkpoint).await;
    }
}

/// Every rank of the JobSet (one pod per child Job) critical.
async fn jobset_critical(admin: &Client, ns: &str, tto: f64, checkpoint: Option<(Timestamp, u64)>) {
    for i in 0..2 {
        let job = format!("train-workers-{i}");
        let pod = job_pods(admin, ns, &job, 1).await.remove(0);
        critical(admin, ns, (&pod, &job), tto, checkpoint).await;
    }
}

/// Waits (up to `within`) for the record `Done`.
async fn done_within(admin: &Client, ns: &str, within: Duration) -> RemediationRecord {
    eventually_within(within, "the record Done", || async {
        let recs = remediation_support::records(admin, ns, "train").await;
        match recs.as_slice() {
            [r] if r.phase == "Done" => Ok(r.clone()),
            _ => Err(format!("{recs:?}")),
        }
    })
    .await
}

/// The PyTorchJob is still the one decided on, unchanged.
async fn pytorchjob_kept(admin: &Client, ns: &str, uid: &str) -> Result<(), String> {
    let pt = stored(admin, ns).await;
    let batch = batches(&pt);
    (pt.uid().as_deref() == Some(uid) && batch == [Some(json!("32")), Some(json!("32"))])
        .then_some(())
        .ok_or(format!("changed: {:?} {batch:?}", pt.uid()))
}

#[tokio::test]
async fn a_pytorchjob_trainer_that_exits_during_the_wait_ends_it_at_once() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let ns = ns.name.as_str();
    let op = start_operator(&admin, ns);
    waiting_policy(&admin, ns, 120, 5).await;
    let (pt, pods) = profiled_pytorchjob(&admin, ns, json!({})).await;
    let old = pt.uid().unwrap();
    let earlier = Timestamp::now() - SignedDuration::from_secs(300);
    pytorch_critical(&admin, ns, &pods, 600.0, Some((earlier, 40))).await;
    record_in(&admin, ns, "Pending").await;
    stays(
        "the PyTorchJob kept while waiting",
        Duration::from_secs(2),
        || pytorchjob_kept(&admin, ns, &old),
    )
    .await;
    // A worker's trainer dies (exit 1): it will never checkpoint again.
    let exited = Instant::now();
    terminate_container(
        &admin,
        ns,
        &pods[2].name_any(),
        "pytorch",
        1,
        "Segmentation fault",
    )
    .await;
    // Waiting would take the policy's 120 s; a loaded machine takes seconds.
    let done = done_within(&admin, ns, Duration::from_secs(60)).await;
    let took = exited.elapsed();
    assert!(
        took < Duration::from_secs(60),
        "{took:?}: long before the 120 s bound"
    );
    let c = done
        .checkpoint
        .clone()
        .expect("the record says why the wait ended");
    assert_eq!(c.result, "trainerExited", "{c:?}");
    assert_eq!(c.kept.as_ref().and_then(|k| k.step), Some(40));
    let msg = done.message.unwrap();
    assert!(msg.contains("a rank's trainer exited"), "{msg}");
    assert_ne!(stored(&admin, ns).await.uid(), pt.uid(), "recreated");
    op.stop().await;
}

#[tokio::test]
async fn a_jobset_trainer_that_exits_during_the_wait_ends_it_at_once() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let ns = ns.name.as_str();
    let op = start_operator(&admin, ns);
    waiting_policy(&admin, ns, 120, 5).await;
    let queued = json!({"kueue.x-k8s.io/queue-name": "team-a"});
    let js = profiled_jobset(&admin, ns, queued).await;
    let earlier = Timestamp::now() - SignedDuration::from_secs(300);
    jobset_critical(&admin, ns, 600.0, Some((earlier, 40))).await;
    record_in(&admin, ns, "Pending").await;
    // The second child Job's trainer dies (exit 1).
    let pod = job_pods(&admin, ns, "train-workers-1", 1).await.remove(0);
    let exited = Instant::now();
    terminate_container(
        &admin,
        ns,
        &pod.name_any(),
        "trainer",
        1,
        "Segmentation fault",
    )
    .await;
    let done = done_within(&admin, ns, Duration::from_secs(60)).await;
    let took = exited.elapsed();
    assert!(
        took < Duration::from_secs(60),
        "{took:?}: long before the 120 s bound"
    );
    let c = done.checkpoint.clone().expect("why the wait ended");
    assert_eq!(c.result, "trainerExited", "{c:?}");
    assert_eq!(c.kept.as_ref().and_then(|k| k.step), Some(40));
    assert_eq!(done.env_change.as_deref(), Some("suspend-patch-resume"));
    let after = api(&admin, ns, WorkloadKind::JobSet)
        .get("train")
        .await
        .unwrap();
    assert_eq!(after.uid(), js.uid(), "never deleted");
    assert_eq!(after.data.pointer(BATCH), Some(&json!("24")));
    op.stop().await;
}

/// What the record of a change made at the bound says (twin of the Job
/// test's checks): not before the bound, not a bound counted from the
/// operator's restart, and what the hour-old checkpoint kept and lost.
fn assert_bound_reached(done: &RemediationRecord, decided: Timestamp, restarted: Timestamp) {
    let c = done
        .checkpoint
        .clone()
        .expect("the record says what was lost");
    assert_eq!(c.result, "boundReached", "{done:?}");
    assert!(c.bound.starts_with("time to OOM 1"), "{}", c.bound);
    assert!(c.bound.ends_with("- margin 4 s"), "{}", c.bound);
    assert!((9.0..=12.5).contains(&c.bound_seconds), "{c:?}");
    assert!(c.waited_seconds >= c.bound_seconds, "{c:?}");
    let changed_at = decided + SignedDuration::from_secs_f64(c.waited_seconds);
    let from_restart = restarted + SignedDuration::from_secs_f64(c.bound_seconds);
    assert!(
        changed_at < from_restart,
        "waited from the restart again: {c:?}"
    );
    assert!(c.waited_seconds < c.bound_seconds + 8.0, "{c:?}");
    assert_eq!(c.kept.as_ref().and_then(|k| k.step), Some(900));
    let lost = c.lost_seconds.unwrap();
    assert!((3600.0..3700.0).contains(&lost), "lost {lost}");
    let msg = done.message.clone().unwrap();
    assert!(msg.contains("no checkpoint within"), "{msg}");
    assert!(msg.contains("lost 60 min since it"), "{msg}");
}

#[tokio::test]
async fn without_a_newer_checkpoint_a_pytorchjob_changes_at_the_bound_across_an_operator_restart() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let ns = ns.name.as_str();
    let op = start_operator(&admin, ns);
    waiting_policy(&admin, ns, 600, 4).await;
    let (pt, pods) = profiled_pytorchjob(&admin, ns, json!({})).await;
    let old = pt.uid().unwrap();
    let hour_ago = Timestamp::now() - SignedDuration::from_secs(3600);
    // 16 s to the OOM, 4 s of margin: a wait of about 12 s.
    pytorch_critical(&admin, ns, &pods, 16.0, Some((hour_ago, 900))).await;
    let decided: Timestamp = record_in(&admin, ns, "Pending").await.time.parse().unwrap();
    // The operator goes away in the middle of the wait and comes back: the
    // wait goes on to its first deadline, not to a new one from the restart.
    stays(
        "the PyTorchJob kept while waiting",
        Duration::from_secs(4),
        || pytorchjob_kept(&admin, ns, &old),
    )
    .await;
    op.stop().await;
    let restarted = Timestamp::now();
    let op = start_operator(&admin, ns);
    let done = done_within(&admin, ns, Duration::from_secs(40)).await;
    assert_bound_reached(&done, decided, restarted);
    assert_eq!(done.env_change.as_deref(), Some("recreate"));
    let new = stored(&admin, ns).await;
    assert_ne!(new.uid(), pt.uid(), "recreated");
    assert_eq!(batches(&new), vec![Some(json!("24")), Some(json!("24"))]);
    op.stop().await;
}

#[tokio::test]
async fn without_a_newer_checkpoint_a_jobset_changes_at_the_bound_across_an_operator_restart() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let ns = ns.name.as_str();
    let op = start_operator(&admin, ns);
    waiting_policy(&admin, ns, 600, 4).await;
    let queued = json!({"kueue.x-k8s.io/queue-name": "team-a"});
    let js = profiled_jobset(&admin, ns, queued).await;
    let hour_ago = Timestamp::now() - SignedDuration::from_secs(3600);
    jobset_critical(&admin, ns, 16.0, Some((hour_ago, 900))).await;
    let decided: Timestamp = record_in(&admin, ns, "Pending").await.time.parse().unwrap();
    let jobsets = api(&admin, ns, WorkloadKind::JobSet);
    stays(
        "the JobSet kept while waiting",
        Duration::from_secs(4),
        || async {
            let now = jobsets.get("train").await.map_err(|e| e.to_string())?;
            let batch = now.data.pointer(BATCH).cloned();
            (batch == Some(json!("32")))
                .then_some(())
                .ok_or(format!("changed: {batch:?}"))
        },
    )
    .await;
    op.stop().await;
    let restarted = Timestamp::now();
    let op = start_operator(&admin, ns);
    let done = done_within(&admin, ns, Duration::from_secs(40)).await;
    assert_bound_reached(&done, decided, restarted);
    assert_eq!(done.env_change.as_deref(), Some("suspend-patch-resume"));
    let after = jobsets.get("train").await.unwrap();
    assert_eq!(after.uid(), js.uid(), "never deleted");
    assert_eq!(after.data.pointer(BATCH), Some(&json!("24")));
    op.stop().await;
}

/// What the record of a change that did not wait says.
fn assert_not_waited(done: &RemediationRecord) {
    let c = done
        .checkpoint
        .clone()
        .expect("the record says it did not wait");
    assert_eq!(
        (c.result.as_str(), c.ranks_with_checkpoint),
        ("notWaited", 0)
    );
    assert_eq!((c.kept.as_ref(), c.lost_seconds), (None, None));
    assert!(c.waited_seconds < 15.0, "{c:?}");
    let msg = done.message.clone().unwrap();
    assert!(
        msg.contains("did not wait for a checkpoint: no rank"),
        "{msg}"
    );
}

#[tokio::test]
async fn a_pytorchjob_that_never_checkpoints_is_not_waited_for() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let ns = ns.name.as_str();
    let op = start_operator(&admin, ns);
    waiting_policy(&admin, ns, 600, 5).await;
    let (pt, pods) = profiled_pytorchjob(&admin, ns, json!({})).await;
    let started = Instant::now();
    pytorch_critical(&admin, ns, &pods, 600.0, None).await;
    // Waiting would take the policy's 600 s; a loaded machine takes seconds.
    let done = done_within(&admin, ns, Duration::from_secs(120)).await;
    let took = started.elapsed();
    assert!(took < Duration::from_secs(120), "{took:?}");
    assert_not_waited(&done);
    let new = stored(&admin, ns).await;
    assert_ne!(new.uid(), pt.uid(), "recreated");
    assert_eq!(batches(&new), vec![Some(json!("24")), Some(json!("24"))]);
    assert_eq!(
        count_events(&admin, ns, "RemediationWaitingForCheckpoint", "train").await,
        0
    );
    op.stop().await;
}

#[tokio::test]
async fn a_jobset_that_never_checkpoints_is_not_waited_for() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let ns = ns.name.as_str();
    let op = start_operator(&admin, ns);
    waiting_policy(&admin, ns, 600, 5).await;
    let js = profiled_jobset(&admin, ns, json!({})).await;
    let started = Instant::now();
    jobset_critical(&admin, ns, 600.0, None).await;
    let done = done_within(&admin, ns, Duration::from_secs(120)).await;
    let took = started.elapsed();
    assert!(took < Duration::from_secs(120), "{took:?}");
    assert_not_waited(&done);
    assert_eq!(done.env_change.as_deref(), Some("recreate"));
    let new = api(&admin, ns, WorkloadKind::JobSet)
        .get("train")
        .await
        .unwrap();
    assert_ne!(new.uid(), js.uid(), "recreated");
    assert_eq!(new.data.pointer(BATCH), Some(&json!("24")));
    assert_eq!(
        count_events(&admin, ns, "RemediationWaitingForCheckpoint", "train").await,
        0
    );
    op.stop().await;
}
