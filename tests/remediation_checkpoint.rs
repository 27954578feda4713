//! `waitForCheckpoint` against a real control plane: a `scaleBatch` restart
//! waits, bounded by the predicted time to OOM, for a checkpoint newer than
//! the decision on every counted rank, and the record says what the
//! restart kept or lost (docs/remediation.md, "Waiting for a checkpoint").
//!
//!     eval "$(bash hack/local-cluster.sh env)"
//!     MEMPROF_REQUIRE_CLUSTER=1 cargo test --test integration remediation_checkpoint::
//!
//! Without `KUBECONFIG` every test is skipped with a message.

use crate::common;
use crate::remediation_support;

use common::*;
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use memprof::api::{Checkpoint, RemediationRecord, RiskLevel, ANNOTATION_ENABLED};
use remediation_support::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// Ranks of the test Jobs: every one must checkpoint.
const RANKS: u32 = 2;

/// `shrink_policy` (critical → BATCH_SIZE × 0.75) waiting for a checkpoint.
fn waiting_policy(max_seconds: u32, margin_seconds: u32) -> Value {
    let mut p = shrink_policy(false);
    p["waitForCheckpoint"] = json!({"maxSeconds": max_seconds, "marginSeconds": margin_seconds});
    p
}

/// A profiled training Job of [`RANKS`] ranks labelled `team=ml`
/// (`BATCH_SIZE` 32), then its pods' first (healthy) reports and the
/// profile's first status. Returns the Job's uid.
async fn two_rank_job(client: &Client, ns: &str) -> String {
    let job: Job = serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {
            "name": "train",
            "labels": {"team": "ml", "memprof.dev/managed": "true"},
            "annotations": {ANNOTATION_ENABLED: "true"},
        },
        "spec": {
            "parallelism": RANKS, "completions": RANKS, "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {"app": "train", "memprof.dev/managed": "true"}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "trainer", "image": "busybox",
                        "env": [{"name": "BATCH_SIZE", "value": "32"}]}],
                },
            },
        },
    }))
    .unwrap();
    let job = Api::<Job>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &job)
        .await
        .unwrap();
    for rank in 0..RANKS {
        report(client, ns, rank, RiskLevel::Low, None, None).await;
    }
    profile_with_status(client, ns, "train").await;
    job.uid().unwrap()
}

/// Rank `rank`'s report sampled a second ago (so that its time to OOM
/// counts from now), with `checkpoint` as its sidecar carries it.
async fn report(
    client: &Client,
    ns: &str,
    rank: u32,
    risk: RiskLevel,
    tto: Option<f64>,
    checkpoint: Option<(Timestamp, u64)>,
) {
    let sampled = Timestamp::now() - jiff::SignedDuration::from_secs(1);
    let sampled = sampled.round(jiff::Unit::Second).unwrap().to_string();
    let used = if risk >= RiskLevel::Critical { 79 } else { 30 };
    let gpus = vec![gpu(rank, used, used, risk, tto)];
    let mut r = rank_report(client, ns, "train", rank, &sampled, gpus).await;
    r.spec.last_checkpoint = checkpoint.map(|(t, step)| Checkpoint {
        time: t.to_string(),
        note: format!("step={step}"),
        step: Some(step),
    });
    apply_report(client, ns, &r).await;
}

/// Every rank critical (time to OOM `tto`), each with `checkpoint`.
async fn critical(client: &Client, ns: &str, tto: f64, checkpoint: Option<(Timestamp, u64)>) {
    for rank in 0..RANKS {
        report(client, ns, rank, RiskLevel::Critical, Some(tto), checkpoint).await;
    }
}

/// Waits for the policy's `Pending` record.
async fn pending(client: &Client, ns: &str) -> RemediationRecord {
    eventually("the Pending record", || async {
        let recs = records(client, ns, "train").await;
        match recs.as_slice() {
            [r] if r.phase == "Pending" => Ok(r.clone()),
            _ => Err(format!("{recs:?}")),
        }
    })
    .await
}

/// Waits (up to `within`) for the Job to be recreated (another uid) and its record `Done`.
async fn recreated(client: &Client, ns: &str, old: &str, within: Duration) -> RemediationRecord {
    eventually_within(within, "the Job recreated", || async {
        match job(client, ns, "train").await {
            Some(j) if j.uid().as_deref() != Some(old) => Ok(()),
            other => Err(format!("{:?}", other.map(|j| j.uid()))),
        }
    })
    .await;
    eventually("the record Done", || async {
        let recs = records(client, ns, "train").await;
        match recs.as_slice() {
            [r] if r.phase == "Done" => Ok(r.clone()),
            _ => Err(format!("{recs:?}")),
        }
    })
    .await
}

/// What every test here starts from: an operator on a fresh namespace, the
/// policy `waiting_policy(max_seconds, margin_seconds)`, and a two-rank Job
/// (`old` is its uid). `None` without a cluster.
struct Scene {
    client: Client,
    ns: TestNamespace,
    operator: RunningOperator,
    old: String,
}

async fn scene(max_seconds: u32, margin_seconds: u32) -> Option<Scene> {
    let client = cluster().await?;
    init_logs();
    let ns = TestNamespace::create(&client).await;
    let operator = start_operator(&client, &ns.name);
    let policy = waiting_policy(max_seconds, margin_seconds);
    apply_policy(&client, &ns.name, "shrink", policy)
        .await
        .unwrap();
    let old = two_rank_job(&client, &ns.name).await;
    Some(Scene {
        client,
        ns,
        operator,
        old,
    })
}

/// The Job is still the one decided on (not deleted, not recreated).
async fn still_there(client: &Client, ns: &str, old: &str) -> Result<(), String> {
    match job(client, ns, "train").await {
        Some(j) if j.uid().as_deref() == Some(old) && j.metadata.deletion_timestamp.is_none() => {
            Ok(())
        }
        other => Err(format!("the Job changed: {:?}", other.map(|j| j.uid()))),
    }
}

#[tokio::test]
async fn a_restart_waits_for_every_ranks_next_checkpoint_and_records_what_it_kept() {
    let Some(Scene {
        client,
        ns,
        operator,
        old,
    }) = scene(60, 5).await
    else {
        return;
    };
    let ns = ns.name.as_str();
    // The trainer checkpointed ten minutes ago on both ranks.
    let earlier = Timestamp::now() - jiff::SignedDuration::from_secs(600);
    critical(&client, ns, 600.0, Some((earlier, 1200))).await;
    let rec = pending(&client, ns).await;
    assert_eq!(rec.checkpoint, None, "nothing decided about the wait yet");
    // It waits: the checkpoint it has is older than the decision.
    stays("the Job kept while waiting", Duration::from_secs(3), || {
        still_there(&client, ns, &old)
    })
    .await;
    // One rank checkpoints: not enough, the restart would lose the other's work.
    let newer = Timestamp::now();
    report(
        &client,
        ns,
        0,
        RiskLevel::Critical,
        Some(600.0),
        Some((newer, 1300)),
    )
    .await;
    stays(
        "the Job kept until every rank checkpointed",
        Duration::from_secs(2),
        || still_there(&client, ns, &old),
    )
    .await;
    let both = Instant::now();
    report(
        &client,
        ns,
        1,
        RiskLevel::Critical,
        Some(600.0),
        Some((newer, 1300)),
    )
    .await;
    // Margins a loaded 2-core machine honours: waiting out the 60 s bound
    // would take over 50 s from here, an answer to the checkpoint seconds.
    let done = recreated(&client, ns, &old, Duration::from_secs(40)).await;
    let took = both.elapsed();
    assert!(
        took < Duration::from_secs(40),
        "recreated {took:?} after the last rank's checkpoint, long before the 60 s bound"
    );
    let c = done
        .checkpoint
        .clone()
        .expect("the record says what the restart kept");
    assert_eq!(c.result, "checkpointed");
    assert_eq!((c.ranks_with_checkpoint, c.ranks), (RANKS, RANKS));
    assert_eq!((c.bound_seconds, c.bound.as_str()), (60.0, "maxSeconds 60"));
    assert_eq!(c.kept.as_ref().and_then(|k| k.step), Some(1300));
    let lost = c.lost_seconds.unwrap();
    assert!(lost < 40.0, "lost {lost} s since the checkpoint");
    assert!(c.waited_seconds >= 5.0 && c.waited_seconds < 50.0, "{c:?}");
    let msg = done.message.clone().unwrap();
    assert!(
        msg.contains("for a checkpoint; checkpoint step 1300 at"),
        "{msg}"
    );
    assert!(msg.contains("Job recreated"), "{msg}");
    assert_eq!(
        count_events(&client, ns, "RemediationWaitingForCheckpoint", "train").await,
        1
    );
    operator.stop().await;
}

#[tokio::test]
async fn without_a_newer_checkpoint_the_restart_goes_at_the_bound_even_across_an_operator_restart()
{
    let Some(Scene {
        client,
        ns,
        operator,
        old,
    }) = scene(600, 4).await
    else {
        return;
    };
    let ns = ns.name.as_str();
    let hour_ago = Timestamp::now() - jiff::SignedDuration::from_secs(3600);
    // 16 s to the OOM, 4 s of margin: a wait of about 12 s.
    critical(&client, ns, 16.0, Some((hour_ago, 900))).await;
    let rec = pending(&client, ns).await;
    let decided: Timestamp = rec.time.parse().unwrap();
    // The operator goes away in the middle of the wait and comes back: the
    // wait goes on to its first deadline, not to a new one from the restart.
    tokio::time::sleep(Duration::from_secs(4)).await;
    operator.stop().await;
    still_there(&client, ns, &old).await.unwrap();
    let restarted = Timestamp::now();
    let operator = start_operator(&client, ns);
    let done = recreated(&client, ns, &old, Duration::from_secs(40)).await;
    let c = done
        .checkpoint
        .clone()
        .expect("the record says what was lost");
    assert_eq!(c.result, "boundReached", "{done:?}");
    assert!(c.bound.starts_with("time to OOM 1"), "{}", c.bound);
    assert!(c.bound.ends_with("- margin 4 s"), "{}", c.bound);
    assert!((9.0..=12.5).contains(&c.bound_seconds), "{c:?}");
    // Not before the bound, and not a bound counted from the restart.
    assert!(c.waited_seconds >= c.bound_seconds, "{c:?}");
    let deleted_at = decided + jiff::SignedDuration::from_secs_f64(c.waited_seconds);
    let from_restart = restarted + jiff::SignedDuration::from_secs_f64(c.bound_seconds);
    assert!(
        deleted_at < from_restart,
        "waited from the restart again: {c:?}"
    );
    assert!(c.waited_seconds < c.bound_seconds + 8.0, "{c:?}");
    // What the restart keeps: the hour-old checkpoint, and the hour since it is lost.
    assert_eq!(c.kept.as_ref().and_then(|k| k.step), Some(900));
    let lost = c.lost_seconds.unwrap();
    assert!((3600.0..3700.0).contains(&lost), "lost {lost}");
    let msg = done.message.clone().unwrap();
    assert!(msg.contains("no checkpoint within"), "{msg}");
    assert!(msg.contains("checkpoint step 900 at"), "{msg}");
    assert!(msg.contains("lost 60 min since it"), "{msg}");
    operator.stop().await;
}

#[tokio::test]
async fn a_trainer_that_never_checkpoints_is_not_waited_for() {
    let Some(Scene {
        client,
        ns,
        operator,
        old,
    }) = scene(600, 5).await
    else {
        return;
    };
    let ns = ns.name.as_str();
    let started = Instant::now();
    critical(&client, ns, 600.0, None).await;
    // Waiting would take the policy's 600 s; a loaded machine takes seconds.
    let done = recreated(&client, ns, &old, Duration::from_secs(120)).await;
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(120),
        "{took:?}: as without the policy field"
    );
    let new = job(&client, ns, "train").await.unwrap();
    assert_eq!(env_of(&new, "BATCH_SIZE").as_deref(), Some("24"));
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
    let msg = done.message.unwrap();
    assert!(
        msg.contains("did not wait for a checkpoint: no rank"),
        "{msg}"
    );
    assert_eq!(
        count_events(&client, ns, "RemediationWaitingForCheckpoint", "train").await,
        0
    );
    operator.stop().await;
}

#[tokio::test]
async fn a_trainer_that_exits_during_the_wait_ends_it_at_once() {
    let Some(Scene {
        client,
        ns,
        operator,
        old,
    }) = scene(120, 5).await
    else {
        return;
    };
    let ns = ns.name.as_str();
    let earlier = Timestamp::now() - jiff::SignedDuration::from_secs(300);
    critical(&client, ns, 600.0, Some((earlier, 40))).await;
    pending(&client, ns).await;
    stays("the Job kept while waiting", Duration::from_secs(2), || {
        still_there(&client, ns, &old)
    })
    .await;
    // Rank 1's trainer dies (exit 1): it will never checkpoint again.
    let pods = job_pods(&client, ns, "train", RANKS as usize).await;
    let exited = Instant::now();
    let pod = pods[1].name_any();
    terminate_container(&client, ns, &pod, "trainer", 1, "Segmentation fault").await;
    // Waiting would take the policy's 120 s; a loaded machine takes seconds.
    let done = recreated(&client, ns, &old, Duration::from_secs(60)).await;
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
    operator.stop().await;
}
