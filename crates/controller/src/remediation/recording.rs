//! Recording what was decided, durably, before acting: new GPU OOMs and a
//! policy's decision go into the profile's status in one edit through the
//! status writer, which answers once it is written; only the edit that
//! added a record announces and carries it out.

use super::decide::Decision;
use super::executor::{profile_ref, Executor};
use super::records::{last_action, new_record};
use super::store::Saved;
use super::workload::env_change_of;
use super::{checkpoint, execute, oom, status, PhaseLabels, Result};
use crate::key::JobKey;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::EventType;
use kube::ResourceExt;
use memprof_api::{
    MemoryProfileStatus, OomRecord, RemediationRecord, MAX_HISTORY, REASON_GPU_OUT_OF_MEMORY,
};
use memprof_policy::triggers::{self, push_record, PHASE_DRY_RUN, PHASE_PENDING, PHASE_SKIPPED};
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};

/// Decide again soon: the Job or the history moved under the decision.
const AGAIN: Duration = Duration::from_millis(200);

/// Records `ooms` and `decision` for Job `key` (uid `job_uid` when it
/// exists), announces what this write added, and carries a pending
/// decision out.
pub(super) async fn record(
    exec: &Arc<Executor>,
    key: &JobKey,
    job_uid: Option<String>,
    ooms: Vec<OomRecord>,
    decision: Option<Decision>,
) -> Result<Option<Duration>> {
    let now = Timestamp::now();
    // Plan before writing: the record says what will be done.
    let (record, planned) = match &decision {
        Some(d) => match plan(exec, key, d, now).await? {
            Some((rec, saved)) => (Some((rec, d.count)), saved),
            None => return Ok(Some(AGAIN)),
        },
        None => (None, None),
    };
    let policy = decision.as_ref().map(|d| d.policy.name_any());
    let rec = record.clone();
    let write = exec
        .edit(key, move |fresh| {
            Some(add(fresh, &ooms, rec.as_ref(), policy.as_deref()))
        })
        .await?;
    let Some((_, (added, record_added))) = write else {
        return Ok(Some(AGAIN));
    };
    let regarding = match &job_uid {
        Some(uid) => exec.regarding(key, Some(uid.clone())),
        None => profile_ref(key),
    };
    announce_ooms(exec, &added, &regarding).await;
    let Some((rec, _)) = record else {
        return Ok(None);
    };
    // Only the write that added the record announces it: a decision made
    // again on stale data finds the record there already and must neither
    // publish its Event twice nor act twice.
    if !record_added {
        return Ok(Some(AGAIN));
    }
    exec.metrics
        .records
        .get_or_create(&PhaseLabels {
            phase: rec.phase.clone(),
        })
        .inc();
    exec.policy_status.notify_one();
    match planned {
        Some(saved) if rec.phase == PHASE_PENDING => {
            info!(id = %rec.id, action = %rec.action, "remediation recorded as pending; acting");
            // The ranks' checkpoints come with the resume, if the plan waits.
            execute::carry_out(exec, key, saved, &rec, None).await
        }
        _ => {
            announce_record(exec, &rec, &regarding).await;
            Ok(None)
        }
    }
}

/// The edit: OOMs not recorded yet, and the record unless the history
/// moved since the decision (then it is decided again). Returns the OOMs
/// added and whether the record was.
fn add(
    fresh: &mut MemoryProfileStatus,
    ooms: &[OomRecord],
    record: Option<&(RemediationRecord, u32)>,
    policy: Option<&str>,
) -> (Vec<OomRecord>, bool) {
    let added: Vec<OomRecord> = ooms
        .iter()
        .filter(|o| {
            !fresh
                .ooms
                .iter()
                .any(|k| oom::record_key(k) == oom::record_key(o))
        })
        .cloned()
        .collect();
    count_ooms(fresh, added.len());
    fresh.ooms = oom::merge(&fresh.ooms, &added, MAX_HISTORY);
    let (Some((rec, count)), Some(policy)) = (record, policy) else {
        return (added, false);
    };
    if fresh.remediations.iter().any(|r| r.id == rec.id)
        || triggers::history(fresh, policy).count != *count
        || fresh.remediations.iter().any(|r| r.phase == PHASE_PENDING)
    {
        return (added, false);
    }
    push_record(&mut fresh.remediations, rec.clone(), MAX_HISTORY);
    fresh.last_action = Some(last_action(rec));
    (added, true)
}

/// Counts `added` new OOMs into `oomCount` (before they join `ooms`): every
/// OOM ever recorded, so it goes on counting once `ooms` drops its oldest. A
/// profile recorded before the count existed starts from its records.
fn count_ooms(fresh: &mut MemoryProfileStatus, added: usize) {
    if added == 0 {
        return;
    }
    let before = fresh.oom_count.unwrap_or(0).max(fresh.ooms.len() as u32);
    let added = u32::try_from(added).unwrap_or(u32::MAX);
    fresh.oom_count = Some(before.saturating_add(added));
}

/// Plans the decision on the Job as it is now: the record (with the plan's
/// digest when it will act) and the plan to save. `None` when the Job
/// changed under the decision (deleted or recreated).
async fn plan(
    exec: &Executor,
    key: &JobKey,
    d: &Decision,
    now: Timestamp,
) -> Result<Option<(RemediationRecord, Option<Saved>)>> {
    let why = format!("{}: {}", d.fired.name, d.fired.why);
    let policy = d.policy.as_ref();
    let Some(outcome) = execute::plan_for(exec, policy, key, &d.job_uid, &d.id, &why).await? else {
        return Ok(None);
    };
    Ok(Some(match outcome {
        Ok(plan) if policy.spec.dry_run => {
            let why = format!("dry run: would act because {why}");
            let mut rec = new_record(&d.id, policy, &plan.summary(), PHASE_DRY_RUN, now, why);
            rec.env_change = env_change_of(&plan).map(|c| c.as_str().to_string());
            (rec, None)
        }
        Ok(mut plan) => {
            let status = exec.view(key);
            let oom_fired = d.fired.name == "oom";
            checkpoint::attach(&mut plan, policy, status.as_ref(), now, oom_fired);
            // The record names the plan's hash before the plan is saved:
            // only the plan recorded here will ever be carried out.
            let saved = Saved::new(plan)?;
            let summary = saved.plan.summary();
            let mut rec = new_record(&d.id, policy, &summary, PHASE_PENDING, now, why);
            rec.job_uid = Some(d.job_uid.clone());
            rec.plan_digest = Some(saved.digest());
            // The record says how the environment will change before it is.
            rec.env_change = env_change_of(&saved.plan).map(|c| c.as_str().to_string());
            (rec, Some(saved))
        }
        Err(e) => {
            let actions = status::describe_actions(policy);
            let msg = format!("{}: {e}", e.reason());
            (
                new_record(&d.id, policy, &actions, PHASE_SKIPPED, now, msg),
                None,
            )
        }
    }))
}

async fn announce_ooms(exec: &Executor, added: &[OomRecord], regarding: &ObjectReference) {
    for o in added {
        exec.metrics.ooms.inc();
        let rank = o.rank.map_or("-".into(), |r| r.to_string());
        let gpu = o.gpu_index.map_or("-".into(), |g| g.to_string());
        warn!(pod = %o.pod, evidence = %o.evidence, "GPU OOM observed");
        // Only the edit that added the record gets here, so each OOM is
        // announced once, whatever reconciles or restarts follow.
        let note = format!(
            "GPU out of memory in pod {} (rank {rank}, GPU {gpu}) at {}: {}",
            o.pod, o.time, o.evidence
        );
        let reason = REASON_GPU_OUT_OF_MEMORY;
        exec.publish(EventType::Warning, reason, note, regarding)
            .await;
    }
}

/// The Event of a record that does not act: a dry run or a skip.
async fn announce_record(exec: &Executor, rec: &RemediationRecord, regarding: &ObjectReference) {
    let message = rec.message.clone().unwrap_or_default();
    if rec.phase == PHASE_DRY_RUN {
        info!(id = %rec.id, action = %rec.action, "dry run recorded");
        let note = format!(
            "RemediationPolicy {}: {}: {message}",
            rec.policy, rec.action
        );
        exec.publish(EventType::Normal, "RemediationDryRun", note, regarding)
            .await;
    } else {
        warn!(id = %rec.id, %message, "remediation cannot apply to this Job");
        let note = format!("RemediationPolicy {} not applied: {message}", rec.policy);
        exec.publish(EventType::Warning, "RemediationSkipped", note, regarding)
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn oom(pod: &str) -> OomRecord {
        OomRecord {
            pod: pod.into(),
            evidence: "terminationMessage trainer#0: exit 1".into(),
            ..Default::default()
        }
    }

    #[test]
    fn oom_count_counts_each_new_oom_once_beyond_the_kept_records() {
        let mut st = MemoryProfileStatus::default();
        let (added, _) = add(&mut st, &[oom("a")], None, None);
        assert_eq!((added.len(), st.oom_count), (1, Some(1)));
        // Seen again (a reconcile, a restarted operator): not counted again.
        let (added, _) = add(&mut st, &[oom("a")], None, None);
        assert_eq!((added.len(), st.oom_count), (0, Some(1)));
        // It goes on counting once `ooms` keeps only the newest 16.
        for i in 0..20 {
            add(&mut st, &[oom(&format!("p{i}"))], None, None);
        }
        assert_eq!((st.ooms.len(), st.oom_count), (MAX_HISTORY, Some(21)));
        // A profile recorded before the count existed starts from its records.
        st.oom_count = None;
        add(&mut st, &[oom("b")], None, None);
        assert_eq!(st.oom_count, Some(MAX_HISTORY as u32 + 1));
    }
}
