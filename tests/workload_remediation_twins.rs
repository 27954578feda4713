//! The Job remediation tests' JobSet twins, through the real executor and
//! the operator, against the local control plane. The test plays the
//! JobSet controller: it creates the child Jobs with controller owner
//! references and workload marks as JobSet and the webhook do (the real Job
//! controller creates their pods); no JobSet controller or Kueue runs here,
//! so nothing recreates children after a change: what is checked is what
//! memprof does to the top-level object, its children and the record.
//!
//! - a Kueue-managed JobSet is suspended, patched and resumed, never
//!   deleted (twin of `remediation::critical_rank_recreates_the_job_…`);
//! - one Kueue does not manage is recreated at the top level, its old
//!   child Jobs deleted, the record and its Event saying "JobSet
//!   recreated" (the same twin);
//! - a dry run changes nothing and says what it would do (twin of
//!   `remediation::dry_run_changes_nothing_…`);
//! - an operator killed mid suspend-patch-resume finishes it on restart
//!   (twin of `remediation::operator_killed_between_delete_and_create_…`);
//! - the JobSet's risk Events and `memprof.dev/` annotations go on the
//!   JobSet, as a Job's go on the Job (twin of the operator's);
//! - `notifyTrainer` reaches every rank of the JobSet, across its child
//!   Jobs (twin of `remediation_notify::notify_trainer_reaches_every_…`);
//! - the checkpoint wait waits for every rank of the JobSet (twin of
//!   `remediation_checkpoint::a_restart_waits_for_every_ranks_next_…`);
//! - `accumulation` keeps the global batch in every pod template (twin of
//!   `remediation_accumulation::accumulation_keeps_the_global_batch_…`);
//! - a JobSet without the env var is skipped once, saying why (twin of
//!   `remediation::job_without_the_env_var_is_skipped_once_…`).

use crate::common;
use crate::remediation_support;
use crate::workload_support;

use common::*;
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, DynamicObject, WatchEvent, WatchParams};
use kube::{Client, ResourceExt};
use memprof::api::workload::WorkloadKind;
use memprof::api::RiskLevel;
use remediation_support::{apply_policy, records, shrink_policy, spawn_operator};
use serde_json::{json, Value};
use std::time::Duration;
use workload_support::*;

pub(crate) const BATCH: &str =
    "/spec/replicatedJobs/0/template/spec/template/spec/containers/0/env/0/value";

/// JobSet `train` (labels `labels` and `team: ml`) of two marked child
/// Jobs, each rank reporting low, its profile written with both ranks.
pub(crate) async fn profiled_jobset(admin: &Client, ns: &str, labels: Value) -> DynamicObject {
    profiled(admin, ns, labels, |_| {}).await
}

/// [`profiled_jobset`], its manifest changed by `edit` first.
async fn profiled(
    admin: &Client,
    ns: &str,
    labels: Value,
    edit: impl FnOnce(&mut Value),
) -> DynamicObject {
    let mut labels = labels;
    labels["team"] = json!("ml");
    let mut manifest = jobset("train", 2, labels);
    edit(&mut manifest);
    let js = create(admin, ns, WorkloadKind::JobSet, manifest).await;
    for i in 0..2 {
        marked_child(admin, ns, &js, i).await;
        child_report(admin, ns, &format!("train-workers-{i}"), 0, RiskLevel::Low).await;
    }
    let profiles: Api<memprof::api::MemoryProfile> = Api::namespaced(admin.clone(), ns);
    eventually("the JobSet's profile with both ranks", || async {
        let p = profiles.get_opt("train").await.map_err(|e| e.to_string())?;
        let ranks = p
            .and_then(|p| p.status)
            .map(|s| s.ranks)
            .unwrap_or_default();
        (ranks == "2/2").then_some(()).ok_or(ranks)
    })
    .await;
    js
}

/// The kinds the `Remediated` Events about `train` regard, once there is
/// one (published right after the record is written).
async fn remediated_kinds(admin: &Client, ns: &str) -> Vec<String> {
    eventually("the Remediated Event", || async {
        let kinds = event_kinds(admin, ns, "Remediated", "train").await;
        (!kinds.is_empty())
            .then_some(kinds)
            .ok_or("none".to_string())
    })
    .await
}

/// Every watch event of JobSet `train` stored from `rv` on, for 3 s.
async fn jobset_events(
    admin: &Client,
    ns: &str,
    rv: &str,
) -> Vec<(String, Option<String>, Option<bool>)> {
    let wp = WatchParams::default()
        .fields("metadata.name=train")
        .timeout(3);
    let api = api(admin, ns, WorkloadKind::JobSet);
    let mut events = api.watch(&wp, rv).await.unwrap().boxed();
    let mut seen = Vec::new();
    while let Ok(Some(Ok(e))) = tokio::time::timeout(Duration::from_secs(5), events.next()).await {
        let (what, o) = match e {
            WatchEvent::Added(o) => ("ADDED", o),
            WatchEvent::Modified(o) => ("MODIFIED", o),
            WatchEvent::Deleted(o) => ("DELETED", o),
            _ => continue,
        };
        let suspend = o.data.pointer("/spec/suspend").and_then(Value::as_bool);
        seen.push((what.to_string(), o.metadata.uid.clone(), suspend));
    }
    seen
}

#[tokio::test]
async fn a_kueue_managed_jobset_is_suspended_patched_and_resumed_by_the_executor_never_deleted() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let ns = ns.name.as_str();
    let op = start_operator(&admin, ns);
    apply_policy(&admin, ns, "shrink", shrink_policy(false))
        .await
        .unwrap();
    let js = profiled_jobset(&admin, ns, json!({"kueue.x-k8s.io/queue-name": "team-a"})).await;
    let (uid, rv) = (js.uid().unwrap(), js.resource_version().unwrap());
    child_report(&admin, ns, "train-workers-1", 100, RiskLevel::Critical).await;
    let rec = record_in(&admin, ns, "Done").await;
    assert_eq!(
        rec.env_change.as_deref(),
        Some("suspend-patch-resume"),
        "{rec:?}"
    );
    assert_eq!(rec.action, "scaleBatch BATCH_SIZE 32->24");
    let after = api(&admin, ns, WorkloadKind::JobSet)
        .get("train")
        .await
        .unwrap();
    assert_eq!(after.uid().as_deref(), Some(uid.as_str()), "never deleted");
    assert_eq!(after.data.pointer(BATCH), Some(&json!("24")));
    assert_eq!(
        after.data.pointer("/spec/suspend"),
        Some(&json!(false)),
        "resumed"
    );
    assert_eq!(
        after.labels()["kueue.x-k8s.io/queue-name"],
        "team-a",
        "its queue kept"
    );
    assert_eq!(after.annotations()["memprof.dev/remediation"], rec.id);
    let events = jobset_events(&admin, ns, &rv).await;
    assert!(
        events
            .iter()
            .all(|(what, u, _)| what == "MODIFIED" && u.as_deref() == Some(uid.as_str())),
        "{events:?}"
    );
    let suspends: Vec<Option<bool>> = events.iter().map(|(_, _, s)| *s).collect();
    let on = suspends
        .iter()
        .position(|s| *s == Some(true))
        .expect("suspended");
    assert!(
        suspends[on..].contains(&Some(false)),
        "resumed after: {suspends:?}"
    );
    // Its child Jobs are the JobSet controller's to replace: never memprof's.
    for i in 0..2 {
        let j = Api::<Job>::namespaced(admin.clone(), ns)
            .get(&format!("train-workers-{i}"))
            .await;
        assert!(j.is_ok(), "child {i} left alone");
    }
    let kinds = remediated_kinds(&admin, ns).await;
    assert!(kinds.iter().all(|k| k == "JobSet"), "{kinds:?}");
    op.stop().await;
}

#[tokio::test]
async fn a_jobsets_risk_events_and_annotations_go_on_the_jobset() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let ns = ns.name.as_str();
    let op = start_operator(&admin, ns);
    profiled_jobset(&admin, ns, json!({})).await;
    child_report(&admin, ns, "train-workers-1", 100, RiskLevel::Critical).await;
    let jobsets = api(&admin, ns, WorkloadKind::JobSet);
    eventually("the JobSet annotated with its risk", || async {
        let js = jobsets.get("train").await.map_err(|e| e.to_string())?;
        let risk = js.annotations().get("memprof.dev/oom-risk").cloned();
        (risk.as_deref() == Some("critical"))
            .then_some(())
            .ok_or(format!("{risk:?}"))
    })
    .await;
    let kinds = eventually("the risk Event about the JobSet", || async {
        let kinds = event_kinds(&admin, ns, "RiskCritical", "train").await;
        (!kinds.is_empty())
            .then_some(kinds)
            .ok_or("none".to_string())
    })
    .await;
    assert!(kinds.iter().all(|k| k == "JobSet"), "{kinds:?}");
    // The child Jobs carry none: their reports are the JobSet's.
    for i in 0..2 {
        let j = Api::<Job>::namespaced(admin.clone(), ns)
            .get(&format!("train-workers-{i}"))
            .await
            .unwrap();
        assert!(
            !j.annotations().contains_key("memprof.dev/oom-risk"),
            "child {i}"
        );
    }
    op.stop().await;
}

#[tokio::test]
async fn a_jobset_kueue_does_not_manage_is_recreated_at_the_top_level() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let ns = ns.name.as_str();
    let op = start_operator(&admin, ns);
    apply_policy(&admin, ns, "shrink", shrink_policy(false))
        .await
        .unwrap();
    let js = profiled_jobset(&admin, ns, json!({})).await;
    let old = js.uid().unwrap();
    let profiles: Api<memprof::api::MemoryProfile> = Api::namespaced(admin.clone(), ns);
    let profile = profiles.get("train").await.unwrap();
    child_report(&admin, ns, "train-workers-1", 100, RiskLevel::Critical).await;
    let rec = record_in(&admin, ns, "Done").await;
    assert_eq!(rec.env_change.as_deref(), Some("recreate"), "{rec:?}");
    assert!(rec.job_deleted);
    let new = api(&admin, ns, WorkloadKind::JobSet)
        .get("train")
        .await
        .unwrap();
    assert_ne!(new.uid().as_deref(), Some(old.as_str()), "a new JobSet");
    // The record names what was recreated by its kind, never as a Job.
    let recreated = format!("JobSet recreated (uid {old} -> {})", new.uid().unwrap());
    let msg = rec.message.clone().unwrap_or_default();
    assert!(msg.contains(&recreated), "{msg}");
    assert_eq!(new.data.pointer(BATCH), Some(&json!("24")));
    assert_eq!(new.annotations()["memprof.dev/remediation"], rec.id);
    assert_eq!(new.labels()["team"], "ml", "the rest is the user's");
    // The old JobSet's children (orphaned by its deletion) are gone: they
    // must not train next to the new one's.
    let jobs = Api::<Job>::namespaced(admin.clone(), ns);
    eventually("the old child Jobs deleted", || async {
        let left: Vec<String> = jobs
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?
            .items
            .iter()
            .filter(|j| j.metadata.deletion_timestamp.is_none())
            .map(|j| j.name_any())
            .collect();
        left.is_empty().then_some(()).ok_or(format!("{left:?}"))
    })
    .await;
    // The profile, and its history, outlive the old JobSet: never given
    // back to it as owner (the garbage collector would take it).
    remediation_support::stays("the profile kept", Duration::from_secs(4), || async {
        let p = profiles.get_opt("train").await.map_err(|e| e.to_string())?;
        let p = p.ok_or("the profile is gone")?;
        let owners: Vec<String> = p.owner_references().iter().map(|o| o.uid.clone()).collect();
        let ok = p.uid() == profile.uid() && !owners.contains(&old);
        ok.then_some(())
            .ok_or(format!("uid {:?}, owners {owners:?}", p.uid()))
    })
    .await;
    let kinds = remediated_kinds(&admin, ns).await;
    assert!(kinds.iter().all(|k| k == "JobSet"), "{kinds:?}");
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(admin.clone(), ns);
    let notes: Vec<String> = events
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("Remediated"))
        .filter_map(|e| e.note)
        .collect();
    assert!(notes.iter().all(|n| n.contains(&recreated)), "{notes:?}");
    op.stop().await;
}

#[tokio::test]
async fn a_dry_run_on_a_jobset_changes_nothing_and_names_the_action_it_would_take() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let ns = ns.name.as_str();
    let op = start_operator(&admin, ns);
    apply_policy(&admin, ns, "shrink", shrink_policy(true))
        .await
        .unwrap();
    let js = profiled_jobset(&admin, ns, json!({"kueue.x-k8s.io/queue-name": "team-a"})).await;
    child_report(&admin, ns, "train-workers-0", 100, RiskLevel::Critical).await;
    let rec = record_in(&admin, ns, "DryRun").await;
    assert_eq!(
        rec.env_change.as_deref(),
        Some("suspend-patch-resume"),
        "{rec:?}"
    );
    let after = api(&admin, ns, WorkloadKind::JobSet)
        .get("train")
        .await
        .unwrap();
    assert_eq!(after.uid(), js.uid());
    assert_eq!(after.data["spec"], js.data["spec"], "untouched");
    assert!(!after.annotations().contains_key("memprof.dev/remediation"));
    eventually("the RemediationDryRun Event", || async {
        let n = count_events(&admin, ns, "RemediationDryRun", "train").await;
        (n >= 1).then_some(()).ok_or(n.to_string())
    })
    .await;
    op.stop().await;
}

#[tokio::test]
async fn an_operator_killed_mid_suspend_patch_resume_finishes_it_on_restart() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let ns = ns.name.as_str();
    apply_policy(&admin, ns, "shrink", shrink_policy(false))
        .await
        .unwrap();
    let mut crashing = spawn_operator(ns, Some(memprof::remediation::FAILPOINT_AFTER_SUSPEND));
    let js = profiled_jobset(&admin, ns, json!({"kueue.x-k8s.io/queue-name": "team-a"})).await;
    let uid = js.uid().unwrap();
    child_report(&admin, ns, "train-workers-1", 100, RiskLevel::Critical).await;
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
    let mid = api(&admin, ns, WorkloadKind::JobSet)
        .get("train")
        .await
        .unwrap();
    assert_eq!(mid.data.pointer("/spec/suspend"), Some(&json!(true)));
    assert_eq!(mid.data.pointer(BATCH), Some(&json!("32")));
    drop(crashing);
    let _restarted = spawn_operator(ns, None);
    let done = record_in(&admin, ns, "Done").await;
    assert_eq!(done.id, rec.id);
    let after = api(&admin, ns, WorkloadKind::JobSet)
        .get("train")
        .await
        .unwrap();
    assert_eq!(after.uid().as_deref(), Some(uid.as_str()), "never deleted");
    assert_eq!(
        after.data.pointer("/spec/suspend"),
        Some(&json!(false)),
        "never left suspended"
    );
    assert_eq!(after.data.pointer(BATCH), Some(&json!("24")));
}

#[tokio::test]
async fn notify_trainer_reaches_every_rank_of_the_jobset_across_its_child_jobs() {
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
    let js = profiled_jobset(&admin, ns, json!({})).await;
    child_report(&admin, ns, "train-workers-1", 100, RiskLevel::Critical).await;
    let rec = record_in(&admin, ns, "Done").await;
    assert_eq!(rec.env_change, None, "no environment changed");
    let reports = Api::<memprof::api::MemoryReport>::namespaced(admin.clone(), ns);
    for i in 0..2 {
        let pod = job_pods(&admin, ns, &format!("train-workers-{i}"), 1)
            .await
            .remove(0);
        let r = reports.get(&pod.name_any()).await.unwrap();
        let ids: Vec<String> = r
            .status
            .map(|s| s.directives)
            .unwrap_or_default()
            .into_iter()
            .map(|d| d.id)
            .collect();
        assert_eq!(ids, vec![rec.id.clone()], "rank {i}'s report");
    }
    let after = api(&admin, ns, WorkloadKind::JobSet)
        .get("train")
        .await
        .unwrap();
    assert_eq!(
        after.data["spec"], js.data["spec"],
        "a notice changes nothing"
    );
    op.stop().await;
}

/// Child Job `job`'s rank critical (600 s to OOM, sampled a second ago so
/// that it counts from now), its trainer's last checkpoint `checkpoint`.
async fn critical_with_checkpoint(
    admin: &Client,
    ns: &str,
    job: &str,
    checkpoint: (jiff::Timestamp, u64),
) {
    let pod = job_pods(admin, ns, job, 1).await.remove(0);
    let sampled = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(1);
    let sampled = sampled.round(jiff::Unit::Second).unwrap().to_string();
    let gpus = vec![gpu(0, 79, 79, RiskLevel::Critical, Some(600.0))];
    let mut r = pod_report(&pod, job, 0, &sampled, gpus);
    r.spec.last_checkpoint = Some(memprof::api::Checkpoint {
        time: checkpoint.0.to_string(),
        note: format!("step={}", checkpoint.1),
        step: Some(checkpoint.1),
    });
    apply_report(admin, ns, &r).await;
}

#[tokio::test]
async fn a_jobsets_change_waits_for_every_ranks_next_checkpoint_across_its_child_jobs() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let ns = ns.name.as_str();
    let op = start_operator(&admin, ns);
    let mut policy = shrink_policy(false);
    policy["waitForCheckpoint"] = json!({"maxSeconds": 60, "marginSeconds": 5});
    apply_policy(&admin, ns, "shrink", policy).await.unwrap();
    profiled_jobset(&admin, ns, json!({"kueue.x-k8s.io/queue-name": "team-a"})).await;
    let earlier = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(600);
    for i in 0..2 {
        critical_with_checkpoint(&admin, ns, &format!("train-workers-{i}"), (earlier, 1200)).await;
    }
    record_in(&admin, ns, "Pending").await;
    let jobsets = api(&admin, ns, WorkloadKind::JobSet);
    let untouched = || async {
        let js = jobsets.get("train").await.map_err(|e| e.to_string())?;
        let batch = js.data.pointer(BATCH).cloned();
        let pending = records(&admin, ns, "train")
            .await
            .iter()
            .any(|r| r.phase == "Pending");
        (batch == Some(json!("32")) && pending)
            .then_some(())
            .ok_or(format!("{batch:?}"))
    };
    remediation_support::stays(
        "unchanged while no rank checkpointed",
        Duration::from_secs(3),
        untouched,
    )
    .await;
    // One child Job's rank checkpoints: the other's work would be lost.
    let newer = jiff::Timestamp::now();
    critical_with_checkpoint(&admin, ns, "train-workers-0", (newer, 1300)).await;
    remediation_support::stays(
        "unchanged until every rank checkpointed",
        Duration::from_secs(3),
        untouched,
    )
    .await;
    critical_with_checkpoint(&admin, ns, "train-workers-1", (newer, 1300)).await;
    let rec = record_in(&admin, ns, "Done").await;
    assert_eq!(rec.env_change.as_deref(), Some("suspend-patch-resume"));
    let kept = rec.checkpoint.expect("what the change kept");
    assert_eq!(kept.result, "checkpointed", "{kept:?}");
    let js = jobsets.get("train").await.unwrap();
    assert_eq!(js.data.pointer(BATCH), Some(&json!("24")));
    op.stop().await;
}

#[tokio::test]
async fn accumulation_keeps_the_global_batch_of_a_suspended_patched_jobset() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let ns = ns.name.as_str();
    let op = start_operator(&admin, ns);
    let mut policy = shrink_policy(false);
    policy["actions"][0]["scaleBatch"]["accumulation"] = json!({"env": "GRAD_ACCUM_STEPS"});
    apply_policy(&admin, ns, "shrink", policy).await.unwrap();
    profiled_jobset(&admin, ns, json!({"kueue.x-k8s.io/queue-name": "team-a"})).await;
    child_report(&admin, ns, "train-workers-0", 100, RiskLevel::Critical).await;
    let rec = record_in(&admin, ns, "Done").await;
    assert_eq!(
        rec.action,
        "scaleBatch BATCH_SIZE×GRAD_ACCUM_STEPS 32×1 → 16×2"
    );
    assert_eq!(rec.env_change.as_deref(), Some("suspend-patch-resume"));
    let js = api(&admin, ns, WorkloadKind::JobSet)
        .get("train")
        .await
        .unwrap();
    let env = js
        .data
        .pointer("/spec/replicatedJobs/0/template/spec/template/spec/containers/0/env")
        .cloned();
    assert_eq!(
        env,
        Some(
            json!([{"name": "BATCH_SIZE", "value": "16"}, {"name": "GRAD_ACCUM_STEPS", "value": "2"}])
        )
    );
    op.stop().await;
}

#[tokio::test]
async fn a_jobset_without_the_env_var_is_skipped_once_with_the_reason() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let ns = ns.name.as_str();
    let op = start_operator(&admin, ns);
    apply_policy(&admin, ns, "shrink", shrink_policy(false))
        .await
        .unwrap();
    let no_env = |m: &mut Value| {
        m["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
            ["env"] = json!([]);
    };
    let js = profiled(&admin, ns, json!({}), no_env).await;
    child_report(&admin, ns, "train-workers-1", 100, RiskLevel::Critical).await;
    let rec = record_in(&admin, ns, "Skipped").await;
    let msg = rec.message.clone().unwrap_or_default();
    assert!(msg.starts_with("NoSuchEnv:"), "{msg}");
    // Once, however often the rank stays critical.
    let mut t = 1_000;
    remediation_support::stays("one Skipped record", Duration::from_secs(4), || {
        t += 500;
        let (admin, t) = (admin.clone(), t);
        async move {
            child_report(&admin, ns, "train-workers-1", t, RiskLevel::Critical).await;
            let recs = records(&admin, ns, "train").await;
            (recs.len() == 1).then_some(()).ok_or(format!("{recs:?}"))
        }
    })
    .await;
    let after = api(&admin, ns, WorkloadKind::JobSet)
        .get("train")
        .await
        .unwrap();
    assert_eq!(
        (after.uid(), &after.data["spec"]),
        (js.uid(), &js.data["spec"]),
        "untouched"
    );
    eventually("one RemediationSkipped Event about the JobSet", || async {
        let kinds = event_kinds(&admin, ns, "RemediationSkipped", "train").await;
        (kinds == ["JobSet"])
            .then_some(())
            .ok_or(format!("{kinds:?}"))
    })
    .await;
    op.stop().await;
}

/// While memprof recreates a JobSet, its profile is never given back to the
/// old JobSet as owner by a child Job whose membership is still cached or
/// read before the deletion shows (the garbage collector would delete the
/// profile, and its history, with the old JobSet): twin of the Job path's
/// `replaced_by_memprof`. Set up as the recreation leaves it: the record
/// says memprof deleted this JobSet, and the garbage collector took the
/// profile's owner reference off; the JobSet is still there, as the
/// operator's view of it can be.
#[tokio::test]
async fn a_jobset_memprof_recreated_is_never_made_the_profile_s_owner_again() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let ns = ns.name.as_str();
    let op = start_operator(&admin, ns);
    let js = profiled_jobset(&admin, ns, json!({})).await;
    op.stop().await;
    let old = js.uid().unwrap();
    let profiles: Api<memprof::api::MemoryProfile> = Api::namespaced(admin.clone(), ns);
    let record = json!({"id": "r1", "policy": "shrink", "action": "scaleBatch BATCH_SIZE 32->24",
        "phase": "Done", "time": jiff::Timestamp::now().round(jiff::Unit::Second).unwrap().to_string(),
        "jobUid": old, "jobDeleted": true, "envChange": "recreate"});
    let pp = kube::api::PatchParams::default();
    let status = json!({"status": {"remediations": [record]}});
    profiles
        .patch_status("train", &pp, &kube::api::Patch::Merge(&status))
        .await
        .unwrap();
    let orphaned = json!({"metadata": {"ownerReferences": null}});
    profiles
        .patch("train", &pp, &kube::api::Patch::Merge(&orphaned))
        .await
        .unwrap();
    let op = start_operator(&admin, ns);
    let mut t = 1_000;
    remediation_support::stays(
        "the profile not owned by the old JobSet",
        Duration::from_secs(6),
        || {
            t += 500;
            let (admin, profiles, old, t) = (admin.clone(), profiles.clone(), old.clone(), t);
            async move {
                // Each report event reconciles a child of the old JobSet.
                child_report(&admin, ns, "train-workers-1", t, RiskLevel::Low).await;
                let p = profiles.get("train").await.map_err(|e| e.to_string())?;
                let owners: Vec<String> =
                    p.owner_references().iter().map(|o| o.uid.clone()).collect();
                (!owners.contains(&old))
                    .then_some(())
                    .ok_or(format!("owned again by the old JobSet: {owners:?}"))
            }
        },
    )
    .await;
    // The roll-up goes on: the status is still written.
    eventually("the status written after the restart", || async {
        let p = profiles.get("train").await.map_err(|e| e.to_string())?;
        let recs = p.status.map(|s| s.remediations.len()).unwrap_or_default();
        (recs == 1).then_some(()).ok_or(format!("{recs} records"))
    })
    .await;
    op.stop().await;
}
