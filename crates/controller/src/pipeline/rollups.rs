//! One [`JobRollup`] per Job, kept up to date from the report watch's
//! events, so that a report event costs O(changed reports) (times log
//! ranks), not a pass over every rank of the Job.
//!
//! The dispatcher notes which reports (by name) and pods changed in the
//! Job's state (`Pending`); the reconcile screens only those, one report at
//! a time (`operator/trust.rs`), and upserts or removes each in the
//! roll-up. A report is found again by name in the watch cache (O(1)); a
//! pod's change re-screens the report named after it (rule 1 of trust.rs:
//! a report counts only as its pod's own). What is kept per Job is bounded
//! by what the Job's reports are: the roll-up's entries and one name and
//! verdict per report claiming the Job.
//!
//! Every [`FULL_PASS`] (and when the Job is first seen, recreated or its
//! roll-up was dropped) the Job's reports are screened all again from the
//! cache: a watch that re-lists does not replay deletions it missed.

use super::state::Context;
use super::tracked::{all_pods, all_reports, pod_of};
pub(super) use super::tracked::{report_of, OomScan, Tracked};
use crate::key::JobKey;
use crate::operator::reconcile::expected_ranks;
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;
use memprof_api::MemoryProfileStatus;
use std::time::{Duration, Instant};

/// How often a Job's reports are all screened again from the cache.
pub(super) const FULL_PASS: Duration = Duration::from_secs(300);

/// Brings Job `key`'s roll-up up to date with what changed since the last
/// reconcile (all its reports, on a full pass), and notes the pods to scan
/// for OOMs. `previous`: the status before, whose held risk level a new
/// roll-up carries on (after a restart, or a recreated Job's first look).
pub(super) fn refresh(
    ctx: &Context,
    key: &JobKey,
    job: &Job,
    previous: Option<&MemoryProfileStatus>,
    now: Timestamp,
) {
    let uid = job.uid().unwrap_or_default();
    let expected = expected_ranks(job);
    let (kept, mut names, all, replaced) = ctx.with_state(key, |s| {
        let names = std::mem::take(&mut s.pending.reports);
        let all = std::mem::take(&mut s.pending.reports_all);
        let held = s.rollup.take();
        let replaced = held.as_ref().is_some_and(|t| t.job_uid != uid);
        (held.filter(|t| t.job_uid == uid), names, all, replaced)
    });
    let fresh = kept.is_none();
    let held_before = kept.as_ref().map_or(0, Tracked::approx_bytes);
    let mut tracked = kept.unwrap_or_else(|| Tracked::new(&uid, expected));
    let full = fresh || all || tracked.full_pass.elapsed() >= FULL_PASS;
    // A risk level held in the status carries over a restart of this
    // process, never over to another Job of the same name: a recreated
    // Job (another batch size) starts from its own reports.
    let previous = previous.filter(|p| !replaced && !recreated_by_memprof(p, &uid));
    if let (true, Some(prev)) = (fresh, previous) {
        tracked.rollup.resume_from(prev, now);
    }
    if full {
        names.extend(tracked.known.iter().cloned());
        names.extend(all_reports(&ctx.caches, key));
        tracked.full_pass = Instant::now();
    }
    if tracked.expected != expected {
        tracked.expected = expected;
        tracked.rollup.set_expected_ranks(Some(expected));
    }
    let keys = ctx.setup.options.admission.ring();
    for name in &names {
        tracked.apply(&ctx.caches, key, name, &keys, now);
    }
    let held = tracked.approx_bytes() as i64 - held_before as i64;
    ctx.setup.metrics.rollup_bytes.inc_by(held);
    ctx.with_state(key, |s| {
        s.rollup = Some(tracked);
        s.pending.oom_scan(names, full);
    });
}

/// Whether `status` records that memprof replaced an earlier Job of this
/// name by the Job with uid `uid`.
fn recreated_by_memprof(status: &MemoryProfileStatus, uid: &str) -> bool {
    status
        .remediations
        .iter()
        .any(|r| r.job_deleted && r.job_uid.as_deref().is_some_and(|old| old != uid))
}

/// Takes what the remediation stage is to scan for OOMs: the pods noted
/// (every pod of the Job after a full pass) and the counted reports named
/// after them. Taken only when the stage scans: until then it stays pending.
pub(super) fn take_oom_scan(ctx: &Context, key: &JobKey) -> OomScan {
    let (all, names) = ctx.with_state(key, |s| {
        let all = std::mem::take(&mut s.pending.oom_all);
        (all, std::mem::take(&mut s.pending.oom))
    });
    let pods = if all {
        all_pods(&ctx.caches, key)
    } else {
        names
            .iter()
            .filter_map(|n| pod_of(&ctx.caches, key, n))
            .collect()
    };
    let counts = |name: &str| {
        ctx.with_state(key, |s| {
            s.rollup
                .as_ref()
                .is_some_and(|t| t.known.contains(name) && !t.refused.contains_key(name))
        })
    };
    let reports = pods
        .iter()
        .filter_map(|p| p.metadata.name.as_deref())
        .filter(|n| counts(n))
        .filter_map(|n| report_of(&ctx.caches, key, n))
        .collect();
    OomScan { pods, reports }
}
