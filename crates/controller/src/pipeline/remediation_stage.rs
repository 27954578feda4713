//! The remediation stage: on the data the roll-up fetched and screened,
//! detect new GPU OOMs and evaluate the policies (both pure, in
//! `remediation/`), and hand what must be recorded or resumed to a
//! remediation task. Never awaits an API call: the task does.

use super::reconcile::Fetched;
use super::rollups;
use super::state::Context;
use crate::key::JobKey;
use crate::operator::reconcile::profiling_enabled;
use crate::operator::trust;
use crate::remediation::triggers::PHASE_PENDING;
use crate::remediation::{decide, oom, JobCheckpoints};
use jiff::Timestamp;
use kube::ResourceExt;
use memprof_api::{MemoryReportSpec, MAX_HISTORY};
use std::sync::Arc;
use std::time::Duration;

/// Evaluation of every Job's policies without changes: cooldowns end and
/// `forSeconds` elapse without any watch event.
const RESYNC: Duration = Duration::from_secs(60);

/// Runs the remediation stage for the fetched Job; returns when to look again.
pub(super) fn run(ctx: &Arc<Context>, f: &Fetched) -> Option<Duration> {
    let exec = ctx.executor.clone()?;
    // The roll-up writes the first status; remediation builds on it.
    let view = ctx.writer.view(&f.key)?;
    if ctx.with_state(&f.key, |s| s.busy) {
        // The running task queues the Job again when it ends.
        return None;
    }
    if let Some(pending) = view.remediations.iter().find(|r| r.phase == PHASE_PENDING) {
        let (key, record) = (f.key.clone(), pending.clone());
        let ranks = counted_checkpoints(ctx, &key);
        ctx.spawn_task(key.clone(), exec.resume(key, record, ranks));
        return None;
    }
    let now = Timestamp::now();
    // Only the pods (and their counted reports) that changed since the last
    // scan: what is already recorded is not recorded again anyway.
    let scan = rollups::take_oom_scan(ctx, &f.key);
    // OOM evidence only from the Job's own pods, screened like reports
    // (issue 15 item 2: `trust::admitted`).
    let job_uid = f.job.as_deref().and_then(|j| j.uid()).unwrap_or_default();
    let keys = ctx.setup.options.admission.ring();
    let pods = scan.pods.iter().map(|p| p.as_ref());
    let admitted = trust::admitted(pods, &job_uid, &keys, now);
    let specs: Vec<&MemoryReportSpec> = scan.reports.iter().map(|r| &r.spec).collect();
    let ooms = oom::detect(&admitted, &specs, &view.ooms, now);
    let mut with_ooms = view.clone();
    with_ooms.ooms = oom::merge(&view.ooms, &ooms, MAX_HISTORY);
    let live = f
        .job
        .as_deref()
        .filter(|j| j.metadata.deletion_timestamp.is_none() && profiling_enabled(j));
    let (decision, again) = match live {
        Some(job) => {
            let clock = ctx.with_state(&f.key, |s| {
                s.clock.observe(view.risk, now);
                s.clock.clone()
            });
            let ns = Some(f.key.namespace.as_str());
            let policies = exec
                .policies()
                .state_filter(|p| p.metadata.namespace.as_deref() == ns);
            decide(&policies, job, &with_ooms, &clock, now, RESYNC)
        }
        None => (None, RESYNC),
    };
    if decision.is_some() || !ooms.is_empty() {
        let job_uid = f.job.as_deref().and_then(|j| j.uid());
        let key = f.key.clone();
        ctx.spawn_task(key.clone(), exec.record(key, job_uid, ooms, decision));
    }
    Some(again)
}

/// The counted ranks' newest checkpoints (`lastCheckpoint` of the reports
/// that count, as screened by the roll-up): what a restart may wait for.
/// O(ranks), only while a remediation is pending.
fn counted_checkpoints(ctx: &Context, key: &JobKey) -> JobCheckpoints {
    let counted: Vec<String> = ctx.with_state(key, |s| {
        s.rollup.as_ref().map_or_else(Vec::new, |t| {
            let counts = |n: &&String| !t.refused.contains_key(*n);
            t.known.iter().filter(counts).cloned().collect()
        })
    });
    let reports = counted
        .iter()
        .filter_map(|n| rollups::report_of(&ctx.caches, key, n));
    JobCheckpoints::new(reports.map(|r| r.spec.last_checkpoint.clone()))
}
