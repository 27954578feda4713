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
use super::watch::LABEL_JOB_NAME;
use crate::key::JobKey;
use crate::operator::reconcile::{desired_status_from, expected_ranks, DesiredStatus, Rejected};
use crate::operator::trust::{screen, PodFacts};
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use memprof_analysis::{JobRollup, ReportMeta, RollupLimits};
use memprof_api::{MemoryProfileStatus, MemoryReport, LABEL_JOB};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a Job's reports are all screened again from the cache.
pub(super) const FULL_PASS: Duration = Duration::from_secs(300);

/// What changed for a Job since its last reconcile (noted by the dispatcher).
#[derive(Debug, Default)]
pub(super) struct Pending {
    /// Reports (by name) to screen again.
    pub reports: BTreeSet<String>,
    /// Pods (by name) whose containers or report may show a new OOM.
    pub oom: BTreeSet<String>,
    /// Every pod of the Job is to be looked at for OOMs.
    pub oom_all: bool,
}

/// A Job's roll-up and the screening verdict of every report claiming it.
#[derive(Debug)]
pub(super) struct Tracked {
    job_uid: String,
    expected: u32,
    rollup: JobRollup,
    /// Reports claiming the Job that screening refused, with why.
    refused: BTreeMap<String, String>,
    /// Every report claiming the Job, counted or refused (what a full pass checks).
    known: BTreeSet<String>,
    full_pass: Instant,
}

/// What the remediation stage looks at for new OOMs.
#[derive(Default)]
pub(super) struct OomScan {
    /// Pods whose container statuses or report changed (all, after a full pass).
    pub pods: Vec<Arc<Pod>>,
    /// The counted reports of those pods (their allocator's OOM count, rank, fullest GPU).
    pub reports: Vec<Arc<MemoryReport>>,
}

pub(super) fn report_of(ctx: &Context, key: &JobKey, name: &str) -> Option<Arc<MemoryReport>> {
    let at = ObjectRef::new(name).within(&key.namespace);
    let r = ctx.caches.reports.get(&at)?;
    // A report relabelled to another Job is no longer this one's.
    (r.labels().get(LABEL_JOB) == Some(&key.name)).then_some(r)
}

fn pod_of(ctx: &Context, key: &JobKey, name: &str) -> Option<Arc<Pod>> {
    ctx.caches
        .pods
        .get(&ObjectRef::new(name).within(&key.namespace))
}

/// Every report claiming Job `key` in the cache: O(cached reports).
fn all_reports(ctx: &Context, key: &JobKey) -> BTreeSet<String> {
    let ns = Some(key.namespace.as_str());
    ctx.caches
        .reports
        .state_filter(|r| {
            r.metadata.namespace.as_deref() == ns && r.labels().get(LABEL_JOB) == Some(&key.name)
        })
        .iter()
        .filter_map(|r| r.metadata.name.clone())
        .collect()
}

/// Every pod labelled with Job `key`'s name in the cache: O(cached pods).
pub(super) fn all_pods(ctx: &Context, key: &JobKey) -> Vec<Arc<Pod>> {
    let ns = Some(key.namespace.as_str());
    ctx.caches.pods.state_filter(|p| {
        p.metadata.namespace.as_deref() == ns && p.labels().get(LABEL_JOB_NAME) == Some(&key.name)
    })
}

/// Screens one report for Job `job_uid` (trust rules 1–4): `Ok` with what
/// the roll-up keeps besides the spec, or why it does not count. O(1).
fn screen_one(
    ctx: &Context,
    key: &JobKey,
    report: &MemoryReport,
    job_uid: &str,
    now: Timestamp,
) -> Result<ReportMeta, String> {
    let pod = pod_of(ctx, key, &report.spec.pod_name);
    let facts: HashMap<&str, PodFacts<'_>> = pod
        .as_deref()
        .and_then(|p| PodFacts::of(&p.metadata))
        .into_iter()
        .collect();
    // One report: `screen`'s rules 5–6 (one per rank, the Job's limit) are
    // the roll-up's, which sees every report of the Job.
    let out = screen(&[report], &facts, job_uid, u32::MAX / 4, now);
    if let Some(refused) = out.refused.into_iter().next() {
        return Err(refused.why);
    }
    let pod_created = facts.values().next().and_then(|f| f.created);
    Ok(ReportMeta {
        pod_created,
        received: Some(now),
    })
}

impl Tracked {
    fn new(job_uid: &str, expected: u32) -> Self {
        Tracked {
            job_uid: job_uid.to_string(),
            expected,
            rollup: JobRollup::new(Some(expected), RollupLimits::default()),
            refused: BTreeMap::new(),
            known: BTreeSet::new(),
            full_pass: Instant::now(),
        }
    }

    /// Screens report `name` again and updates the roll-up.
    fn apply(&mut self, ctx: &Context, key: &JobKey, name: &str, now: Timestamp) {
        let Some(report) = report_of(ctx, key, name) else {
            self.rollup.remove(name);
            self.refused.remove(name);
            self.known.remove(name);
            return;
        };
        self.known.insert(name.to_string());
        match screen_one(ctx, key, &report, &self.job_uid, now) {
            Ok(meta) => {
                self.refused.remove(name);
                self.rollup.upsert_with(name, &report.spec, meta);
            }
            Err(why) => {
                self.rollup.remove(name);
                self.refused.insert(name.to_string(), why);
            }
        }
    }

    /// The status the roll-up calls for at `now`, with `previous`'s
    /// remediation fields and conditions carried over, and when it next
    /// changes with no event (a rank going stale, a held risk ending).
    pub fn desired(
        &self,
        previous: Option<&MemoryProfileStatus>,
        now: Timestamp,
    ) -> (DesiredStatus, Option<Timestamp>) {
        let refused: Vec<Rejected> = self
            .refused
            .iter()
            .map(|(name, why)| Rejected {
                name: name.clone(),
                why: why.clone(),
            })
            .collect();
        let desired = desired_status_from(&self.rollup, &refused, previous, now);
        (desired, self.rollup.next_change(now))
    }

    /// Memory held for this Job (bytes, approx.).
    pub fn approx_bytes(&self) -> usize {
        let names: usize = self.known.iter().map(|n| n.len() + 48).sum();
        let why: usize = self.refused.values().map(|w| w.len() + 48).sum();
        self.rollup.approx_bytes() + names + why
    }
}

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
    let (kept, mut names) = ctx.with_state(key, |s| {
        let names = std::mem::take(&mut s.pending.reports);
        (s.rollup.take().filter(|t| t.job_uid == uid), names)
    });
    let fresh = kept.is_none();
    let held_before = kept.as_ref().map_or(0, Tracked::approx_bytes);
    let mut tracked = kept.unwrap_or_else(|| Tracked::new(&uid, expected));
    let full = fresh || tracked.full_pass.elapsed() >= FULL_PASS;
    if fresh {
        if let Some(prev) = previous {
            tracked.rollup.resume_from(prev, now);
        }
    }
    if full {
        names.extend(tracked.known.iter().cloned());
        names.extend(all_reports(ctx, key));
        tracked.full_pass = Instant::now();
    }
    if tracked.expected != expected {
        tracked.expected = expected;
        tracked.rollup.set_expected_ranks(Some(expected));
    }
    for name in &names {
        tracked.apply(ctx, key, name, now);
    }
    let held = tracked.approx_bytes() as i64 - held_before as i64;
    ctx.setup.metrics.rollup_bytes.inc_by(held);
    ctx.with_state(key, |s| {
        s.rollup = Some(tracked);
        s.pending.oom_all |= full;
        s.pending.oom.extend(names);
    });
}

/// Drops Job `key`'s roll-up (profiling off, or the Job forgotten).
pub(super) fn drop_rollup(ctx: &Context, state: &mut super::state::JobState) {
    if let Some(t) = state.rollup.take() {
        ctx.setup
            .metrics
            .rollup_bytes
            .dec_by(t.approx_bytes() as i64);
    }
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
        all_pods(ctx, key)
    } else {
        names.iter().filter_map(|n| pod_of(ctx, key, n)).collect()
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
        .filter_map(|n| report_of(ctx, key, n))
        .collect();
    OomScan { pods, reports }
}
