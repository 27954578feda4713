//! A workload's roll-up kept between reconciles, so that a report event
//! costs what it costs for a Job: O(changed reports) (times log ranks),
//! not a pass over every rank of the workload. One home for every kind
//! above Jobs: a JobSet's (a TrainJob's, through its JobSet), rolled up
//! across its child Jobs, and a PyTorchJob's, over the pods it controls.
//!
//! Before, each reconcile rolled the whole workload up again from the
//! caches. A JobSet's child found the JobSet's members by a scan of every
//! cached Job (one workload-mark HMAC per child), then every member's
//! reports and pods by a scan of the report and pod caches per member
//! (O(children × cached reports)), and rolled all of them up again (two
//! HMACs per report): at 2,048 ranks in 256 child Jobs of 8 pods, 853 ms
//! per reconcile against a Job's 1.7 ms (docs/benchmarks.md, "One JobSet
//! against one Job"). A PyTorchJob scanned every cached report and
//! PyTorchJob pod and verified every pod's mark again on each report event.
//!
//! Now one [`WorkloadTracked`] per workload, held in the state of the
//! workload's key (its profile's), behind a lock of its own so that
//! concurrent children of one JobSet take turns on it and never block the
//! other workers. Per reconcile (`workload_refresh.rs`):
//! - **membership** (a JobSet's): the reconciling child's own entry is
//!   checked again only when the Job changed in the cache (its
//!   resourceVersion): one HMAC, rarely. A PyTorchJob's one member is
//!   itself: its pods are proven one by one, by their own marks;
//! - **reports**: the reports and pods the dispatcher noted under the key
//!   the reports claim (`Pending`, as for a Job: a JobSet's child Job, a
//!   PyTorchJob's own name) are screened again (`workload::rollup::screen`,
//!   the same rules as the from-scratch `roll_up`) and upserted or removed;
//! - every [`FULL_PASS`], when the workload's layout changes or the noted
//!   names overflowed: a full pass, which finds a JobSet's members by one
//!   scan of the Job cache and the reports by one scan of the report cache
//!   (O(cached Jobs + cached reports), not their product). It also drops
//!   the reports of a child Job that is gone (whose reconciles stop before
//!   the workload), at most [`FULL_PASS`] late.
//!
//! The roll-up persists like a Job's (`rollups.rs`): a risk level's dwell
//! is measured across events, and carried over a restart from the status.

use super::tracked::{desired_of, report_of};
use super::watch::{Caches, LABEL_JOB_NAME};
use crate::key::JobKey;
use crate::operator::reconcile::{DesiredStatus, WorkloadEvidence};
use crate::remediation::Ranks;
use crate::workload::resolve::{link_identity, step, Step, Workload};
use crate::workload::rollup::{count, screen, Layout};
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::ResourceExt;
use memprof_analysis::{JobRollup, RollupLimits};
use memprof_api::admission::KeyRing;
use memprof_api::workload::{
    split_identity, WorkloadKind, LABEL_JOBSET_NAME, LABEL_TRAINING_JOB_NAME,
};
use memprof_api::{MemoryProfileStatus, LABEL_JOB};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often a workload's members and reports are all looked at again.
pub(super) const FULL_PASS: Duration = Duration::from_secs(60);

/// Where a workload's roll-up is kept: the workload key's state (`state.rs`).
pub(super) type Cell = Arc<Mutex<Option<WorkloadTracked>>>;

/// The caches a workload's roll-up reads: the reports (and a JobSet's
/// child Jobs and their pods) from the operator's watches, a PyTorchJob's
/// pods from its own (`pytorch_watch.rs`).
pub(super) struct Sources<'a> {
    pub caches: &'a Caches,
    pub pytorch_pods: &'a Store<Pod>,
}

/// A proven child Job, as last checked.
#[derive(Debug)]
pub(super) struct Member {
    pub(super) name: String,
    /// The resourceVersion it was checked at.
    rv: String,
}

/// A workload's roll-up and the screening verdict of every report
/// claiming it (one of a JobSet's child Jobs, a PyTorchJob's own name).
#[derive(Debug)]
pub(super) struct WorkloadTracked {
    /// The workload's uid (another workload of the name starts afresh) and name.
    pub(super) uid: String,
    name: String,
    /// Its layout (a JobSet's with the proven children's rank identities).
    layout: Layout,
    /// A JobSet's proven children by uid (a PyTorchJob has none).
    members: HashMap<String, Member>,
    /// The names the counted reports claim, each with the uid of their
    /// pods' controller: a JobSet's proven children, a PyTorchJob's own.
    by_name: HashMap<String, String>,
    pub(super) rollup: JobRollup,
    /// Reports claiming a member that screening refused, with why.
    refused: BTreeMap<String, String>,
    /// Every report screened, with the name (member) it claims.
    known: HashMap<String, String>,
    /// The counted reports' recommendation evidence, by role.
    evidence: WorkloadEvidence,
    /// Its ranks for remediation, built once per change of the members
    /// or the layout (`None`: changed since): a reconcile hands the same
    /// `Arc` on, so a JobSet's child costs no copy of every child Job.
    ranks: Option<Arc<Ranks>>,
    pub(super) full_pass: Instant,
}

impl WorkloadTracked {
    /// An empty roll-up of `workload` (a JobSet, a PyTorchJob) laid out by
    /// `layout` (a JobSet's members are found by the first full pass).
    pub(super) fn new(workload: &Workload, layout: Layout) -> Self {
        let mut by_name = HashMap::new();
        if let Layout::PyTorchJob { .. } = layout {
            // Its reports claim its own name; its pods prove themselves.
            by_name.insert(workload.name.clone(), workload.uid.clone());
        }
        WorkloadTracked {
            uid: workload.uid.clone(),
            name: workload.name.clone(),
            rollup: JobRollup::new(Some(layout.ranks()), RollupLimits::default()),
            layout,
            members: HashMap::new(),
            by_name,
            refused: BTreeMap::new(),
            known: HashMap::new(),
            evidence: WorkloadEvidence::default(),
            ranks: None,
            // A full pass first.
            full_pass: Instant::now() - FULL_PASS,
        }
    }

    /// Takes `layout`'s shape (its members are kept); whether it changed.
    pub(super) fn set_layout(&mut self, layout: &Layout) -> bool {
        let changed = match (&mut self.layout, layout) {
            (Layout::JobSet { shape: held, .. }, Layout::JobSet { shape, .. }) if held != shape => {
                *held = shape.clone();
                true
            }
            (Layout::PyTorchJob { shape: held, .. }, Layout::PyTorchJob { shape, .. })
                if held != shape =>
            {
                *held = *shape;
                true
            }
            _ => false,
        };
        if changed {
            self.rollup.set_expected_ranks(Some(self.layout.ranks()));
            self.ranks = None;
        }
        changed
    }

    /// The phases the workload's own annotations ask its recommendation
    /// to wait for (a PyTorchJob's: every role); an unreadable value is logged.
    pub(super) fn require_phases(&mut self, annotations: &BTreeMap<String, String>) {
        if let Err(e) = self.evidence.require(None, annotations) {
            tracing::warn!(workload = %self.name, error = %e, "memprof.dev/recommend-phases ignored");
        }
    }

    /// Every member and every report claiming one, looked at again.
    pub(super) fn full(&mut self, src: &Sources<'_>, ns: &str, keys: &KeyRing, now: Timestamp) {
        if let Layout::JobSet { .. } = self.layout {
            self.find_members(src.caches, ns, keys, now);
        }
        let names: &HashMap<String, String> = &self.by_name;
        let claiming = src.caches.reports.state_filter(|r| {
            r.metadata.namespace.as_deref() == Some(ns)
                && r.labels()
                    .get(LABEL_JOB)
                    .is_some_and(|j| names.contains_key(j))
        });
        let mut todo: BTreeSet<(String, String)> = std::mem::take(&mut self.known)
            .into_iter()
            .map(|(report, child)| (child, report))
            .collect();
        for r in &claiming {
            if let (Some(child), Some(name)) = (r.labels().get(LABEL_JOB), r.metadata.name.clone())
            {
                todo.insert((child.clone(), name));
            }
        }
        for (child, name) in &todo {
            self.apply(src, ns, child, name, keys, now);
        }
        self.full_pass = Instant::now();
    }

    /// A JobSet's members: every cached Job labelled with its name, checked.
    fn find_members(&mut self, caches: &Caches, ns: &str, keys: &KeyRing, now: Timestamp) {
        let jobset = self.name.clone();
        let children = caches.jobs.state_filter(|j| {
            j.metadata.namespace.as_deref() == Some(ns)
                && j.labels().get(LABEL_JOBSET_NAME) == Some(&jobset)
        });
        self.members.clear();
        self.by_name.clear();
        self.layout_members().clear();
        self.ranks = None;
        for job in &children {
            self.check(ns, job, keys, now);
        }
    }

    fn layout_members(&mut self) -> &mut BTreeMap<String, String> {
        match &mut self.layout {
            Layout::JobSet { members, .. } => members,
            Layout::PyTorchJob { .. } => unreachable!("a JobSet's layout"),
        }
    }

    /// Checks `job`'s link to the JobSet (its workload mark, on the cached
    /// object) and records it as a member or not; whether that changed
    /// anything (membership or rank identity).
    fn check(&mut self, ns: &str, job: &Job, keys: &KeyRing, now: Timestamp) -> bool {
        let Some(uid) = job.uid() else {
            return false;
        };
        let here = Workload {
            kind: WorkloadKind::Job,
            name: job.name_any(),
            uid: uid.clone(),
        };
        let claims = job.labels().get(LABEL_JOBSET_NAME) == Some(&self.name);
        let proven = claims
            && matches!(step(ns, &here, &job.metadata, 1, keys, now),
                        Step::Up(parent) if parent.uid == self.uid);
        let identity = proven.then(|| link_identity(WorkloadKind::Job, &job.metadata));
        let rv = job.resource_version().unwrap_or_default();
        let before = self.layout_members().get(&uid).cloned();
        match &identity {
            Some(id) => {
                // Its replicated job's phases: the JobSet controller copies
                // the template's annotations onto each of its Jobs.
                let role = split_identity(id).map(|(r, _)| r);
                if let Err(e) = self.evidence.require(role, job.annotations()) {
                    tracing::warn!(job = %here.name, error = %e, "memprof.dev/recommend-phases ignored");
                }
                self.layout_members().insert(uid.clone(), id.clone());
                self.by_name.insert(here.name.clone(), uid.clone());
                let name = here.name;
                self.members.insert(uid, Member { name, rv });
            }
            None => {
                self.layout_members().remove(&uid);
                if let Some(gone) = self.members.remove(&uid) {
                    self.by_name.remove(&gone.name);
                }
            }
        }
        let changed = before != identity;
        if changed {
            self.ranks = None;
        }
        changed
    }

    /// The reconciling child's link, checked again when the Job changed in
    /// the cache since; its reports screened again when that changed anything.
    pub(super) fn check_child(
        &mut self,
        src: &Sources<'_>,
        (key, job): (&JobKey, &Job),
        keys: &KeyRing,
        now: Timestamp,
    ) {
        let uid = job.uid().unwrap_or_default();
        let rv = job.resource_version().unwrap_or_default();
        if self.members.get(&uid).is_some_and(|m| m.rv == rv) {
            return;
        }
        if !self.check(&key.namespace, job, keys, now) {
            return;
        }
        let mut names: BTreeSet<String> = super::tracked::all_reports(src.caches, key);
        let under = self.known.iter().filter(|(_, c)| **c == key.name);
        names.extend(under.map(|(r, _)| r.clone()));
        for name in &names {
            self.apply(src, &key.namespace, &key.name, name, keys, now);
        }
    }

    /// The cached pod `name`, when it is labelled with a member's name (as
    /// the from-scratch roll-up's pods are chosen): a JobSet's child Job's
    /// pod in the Job pods' cache, a PyTorchJob's in its own.
    fn pod(&self, src: &Sources<'_>, ns: &str, name: &str) -> Option<Arc<Pod>> {
        let at = ObjectRef::new(name).within(ns);
        let (pod, label) = match self.layout {
            Layout::JobSet { .. } => (src.caches.pods.get(&at), LABEL_JOB_NAME),
            Layout::PyTorchJob { .. } => (src.pytorch_pods.get(&at), LABEL_TRAINING_JOB_NAME),
        };
        pod.filter(|p| {
            p.labels()
                .get(label)
                .is_some_and(|m| self.by_name.contains_key(m))
        })
    }

    /// Screens report `name`, claiming member `child`, again and updates the roll-up.
    pub(super) fn apply(
        &mut self,
        src: &Sources<'_>,
        ns: &str,
        child: &str,
        name: &str,
        keys: &KeyRing,
        now: Timestamp,
    ) {
        let report = report_of(src.caches, &JobKey::new(ns, child), name)
            .filter(|_| self.by_name.contains_key(child));
        let Some(report) = report else {
            // Gone, relabelled, or its Job is no member (any more): not
            // this workload's, unless it now claims another child.
            if self.known.get(name).is_none_or(|c| c == child) {
                self.forget(name);
            }
            return;
        };
        self.known.insert(name.to_string(), child.to_string());
        let pod = self.pod(src, ns, &report.spec.pod_name);
        let meta = pod.as_deref().map(|p| &p.metadata);
        match screen(&report, meta, &self.layout, keys, now) {
            Ok(screened) => {
                self.refused.remove(name);
                count(
                    &mut self.rollup,
                    &mut self.evidence,
                    &self.layout,
                    name,
                    screened,
                );
            }
            Err(why) => {
                self.evidence.remove(name);
                self.rollup.remove(name);
                self.refused.insert(name.to_string(), why.to_string());
            }
        }
    }

    /// Its ranks as proven now: what its remediation counts
    /// (`remediation::ranks`). The same `Arc` until the members or the
    /// layout change: O(members) once per change, not per reconcile.
    pub(super) fn ranks(&mut self) -> Arc<Ranks> {
        let (by_name, layout) = (&self.by_name, &self.layout);
        self.ranks
            .get_or_insert_with(|| {
                Arc::new(Ranks {
                    claims: by_name.keys().cloned().collect(),
                    layout: layout.clone(),
                })
            })
            .clone()
    }

    fn forget(&mut self, name: &str) {
        self.evidence.remove(name);
        self.rollup.remove(name);
        self.refused.remove(name);
        self.known.remove(name);
    }

    /// The status the roll-up calls for at `now`, and when it next changes with no event.
    pub(super) fn desired(
        &self,
        previous: Option<&MemoryProfileStatus>,
        now: Timestamp,
    ) -> (DesiredStatus, Option<Timestamp>) {
        let (mut desired, next) = desired_of(&self.rollup, &self.refused, previous, now);
        self.evidence
            .apply(&mut desired.status, self.layout.ranks());
        (desired, next)
    }
}

#[cfg(test)]
mod tests;
