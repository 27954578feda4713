//! A Job's incremental roll-up and the screening verdict of each report
//! claiming it (see `rollups.rs` for how it is fed). Reads only the watch
//! caches.

use super::watch::{Caches, LABEL_JOB_NAME};
use crate::key::JobKey;
use crate::operator::reconcile::{desired_status_from, DesiredStatus, Rejected};
use crate::operator::trust::{check, PodFacts, Rejection};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use memprof_analysis::{JobRollup, ReportMeta, RollupLimits};
use memprof_api::admission::KeyRing;
use memprof_api::{MemoryProfileStatus, MemoryReport, LABEL_JOB};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

/// What changed for a Job since its last reconcile (noted by the dispatcher).
///
/// Bounded by [`MAX_PENDING`] names, whatever a tenant creates: past it, the
/// names give way to "look at everything" (a full pass, O(the Job's
/// reports), which the cache bounds), so a Job that no stage drains (not
/// profiled, being deleted, remediation off) holds at most that many.
#[derive(Debug, Default)]
pub(super) struct Pending {
    /// Reports (by name) to screen again.
    pub reports: BTreeSet<String>,
    /// Every report of the Job is to be screened again (a full pass).
    pub reports_all: bool,
    /// Pods (by name) whose containers or report may show a new OOM.
    pub oom: BTreeSet<String>,
    /// Every pod of the Job is to be looked at for OOMs.
    pub oom_all: bool,
}

/// Names a Job's [`Pending`] holds per set before it gives way to a full pass.
pub(super) const MAX_PENDING: usize = 1024;

impl Pending {
    /// Notes a report (or a pod, whose report's screening depends on it) to screen again.
    pub fn report(&mut self, name: &str) {
        if !self.reports_all && !note(&mut self.reports, name) {
            self.reports_all = true;
        }
    }

    /// Notes a pod whose containers may show an OOM.
    pub fn pod(&mut self, name: &str) {
        self.report(name);
        if !self.oom_all && !note(&mut self.oom, name) {
            self.oom_all = true;
        }
    }

    /// Notes pods for the OOM scan (`all`: every pod of the Job).
    pub fn oom_scan(&mut self, names: impl IntoIterator<Item = String>, all: bool) {
        self.oom_all |= all;
        if self.oom_all {
            self.oom.clear();
            return;
        }
        self.oom.extend(names);
        if self.oom.len() > MAX_PENDING {
            self.oom.clear();
            self.oom_all = true;
        }
    }
}

/// Adds `name` to `set` unless that would pass [`MAX_PENDING`] (then clears
/// it and answers false: the caller falls back to a full pass).
fn note(set: &mut BTreeSet<String>, name: &str) -> bool {
    if set.contains(name) {
        return true;
    }
    if set.len() >= MAX_PENDING {
        set.clear();
        return false;
    }
    set.insert(name.to_string());
    true
}

/// A Job's roll-up and the screening verdict of every report claiming it.
#[derive(Debug)]
pub(super) struct Tracked {
    pub job_uid: String,
    pub expected: u32,
    pub rollup: JobRollup,
    /// Reports claiming the Job that screening refused, with why.
    pub refused: BTreeMap<String, String>,
    /// Every report claiming the Job, counted or refused (what a full pass checks).
    pub known: BTreeSet<String>,
    pub full_pass: Instant,
}

/// The status a roll-up and its refused reports call for at `now`, with
/// `previous`'s remediation fields and conditions carried over, and when it
/// next changes with no event: one home for a Job's and a workload's.
pub(super) fn desired_of(
    rollup: &JobRollup,
    refused: &BTreeMap<String, String>,
    previous: Option<&MemoryProfileStatus>,
    now: Timestamp,
) -> (DesiredStatus, Option<Timestamp>) {
    let refused: Vec<Rejected> = refused
        .iter()
        .map(|(name, why)| Rejected {
            name: name.clone(),
            why: why.clone(),
        })
        .collect();
    let desired = desired_status_from(rollup, &refused, previous, now);
    (desired, rollup.next_change(now))
}

/// What the remediation stage looks at for new OOMs.
#[derive(Default)]
pub(super) struct OomScan {
    /// Pods whose container statuses or report changed (all, after a full pass).
    pub pods: Vec<Arc<Pod>>,
    /// The counted reports of those pods (their allocator's OOM count, rank, fullest GPU).
    pub reports: Vec<Arc<MemoryReport>>,
}

pub(super) fn report_of(caches: &Caches, key: &JobKey, name: &str) -> Option<Arc<MemoryReport>> {
    let at = ObjectRef::new(name).within(&key.namespace);
    let r = caches.reports.get(&at)?;
    // A report relabelled to another Job is no longer this one's.
    (r.labels().get(LABEL_JOB) == Some(&key.name)).then_some(r)
}

pub(super) fn pod_of(caches: &Caches, key: &JobKey, name: &str) -> Option<Arc<Pod>> {
    caches
        .pods
        .get(&ObjectRef::new(name).within(&key.namespace))
}

/// Every report claiming Job `key` in the cache: O(cached reports).
pub(super) fn all_reports(caches: &Caches, key: &JobKey) -> BTreeSet<String> {
    let ns = Some(key.namespace.as_str());
    caches
        .reports
        .state_filter(|r| {
            r.metadata.namespace.as_deref() == ns && r.labels().get(LABEL_JOB) == Some(&key.name)
        })
        .iter()
        .filter_map(|r| r.metadata.name.clone())
        .collect()
}

/// Every pod labelled with Job `key`'s name in the cache: O(cached pods).
pub(super) fn all_pods(caches: &Caches, key: &JobKey) -> Vec<Arc<Pod>> {
    let ns = Some(key.namespace.as_str());
    caches.pods.state_filter(|p| {
        p.metadata.namespace.as_deref() == ns && p.labels().get(LABEL_JOB_NAME) == Some(&key.name)
    })
}

/// Screens one report for Job `job_uid` (trust rules 1–4, `trust::check`:
/// its pod is the Job's, marked by the webhook under `keys`): `Ok` with
/// what the roll-up keeps besides the spec, or why it does not count.
/// O(1). (Rules 5–6, one report per rank and the Job's limit, are the
/// roll-up's, which sees every report of the Job.)
pub(super) fn screen_one(
    caches: &Caches,
    key: &JobKey,
    report: &MemoryReport,
    job_uid: &str,
    keys: &KeyRing,
    now: Timestamp,
) -> Result<ReportMeta, Rejection> {
    let pod = pod_of(caches, key, &report.spec.pod_name);
    let facts = pod
        .as_deref()
        .and_then(|p| PodFacts::of(&p.metadata))
        .map(|(_, f)| f);
    check(report, facts.as_ref(), job_uid, keys, now)?;
    Ok(ReportMeta {
        pod_created: facts.and_then(|f| f.created),
        received: Some(now),
    })
}

impl Tracked {
    pub fn new(job_uid: &str, expected: u32) -> Self {
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
    pub fn apply(
        &mut self,
        caches: &Caches,
        key: &JobKey,
        name: &str,
        keys: &KeyRing,
        now: Timestamp,
    ) {
        let Some(report) = report_of(caches, key, name) else {
            self.rollup.remove(name);
            self.refused.remove(name);
            self.known.remove(name);
            return;
        };
        self.known.insert(name.to_string());
        match screen_one(caches, key, &report, &self.job_uid, keys, now) {
            Ok(meta) => {
                self.refused.remove(name);
                self.rollup.upsert_with(name, &report.spec, meta);
            }
            Err(why) => {
                self.rollup.remove(name);
                self.refused.insert(name.to_string(), why.to_string());
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
        desired_of(&self.rollup, &self.refused, previous, now)
    }

    /// Memory held for this Job (bytes, approx.).
    pub fn approx_bytes(&self) -> usize {
        let names: usize = self.known.iter().map(|n| n.len() + 48).sum();
        let why: usize = self.refused.values().map(|w| w.len() + 48).sum();
        self.rollup.approx_bytes() + names + why
    }
}

#[cfg(test)]
mod pending_tests {
    use super::*;

    /// A tenant creating and deleting pods with fresh names under a Job no
    /// stage drains: what is held stays within the bound, and nothing is
    /// lost (the next pass looks at everything).
    #[test]
    fn pending_names_are_bounded_and_overflow_into_a_full_pass() {
        let mut p = Pending::default();
        for i in 0..3 * MAX_PENDING {
            p.pod(&format!("pod-{i:0>240}"));
            assert!(p.reports.len() <= MAX_PENDING && p.oom.len() <= MAX_PENDING);
        }
        assert!(p.reports_all && p.oom_all);
        let mut few = Pending::default();
        few.report("a");
        few.report("a");
        few.pod("b");
        assert_eq!(few.reports.len(), 2);
        assert_eq!(few.oom.len(), 1);
        assert!(!few.reports_all && !few.oom_all);
        few.oom_scan((0..2 * MAX_PENDING).map(|i| i.to_string()), false);
        assert!(few.oom_all && few.oom.is_empty());
    }
}
