//! A workload's roll-up brought up to date by one reconcile: of one of a
//! JobSet's child Jobs (`workloads.rs`), or of a PyTorchJob
//! (`pytorchjobs.rs`); both call [`refresh`]. The roll-up itself, and why
//! it is kept between reconciles, are `workload_index.rs`'s.

use super::state::Context;
use super::workload_index::{Cell, Sources, WorkloadTracked, FULL_PASS};
use crate::key::JobKey;
use crate::operator::reconcile::DesiredStatus;
use crate::operator::thresholds::in_effect;
use crate::remediation::Ranks;
use crate::status::{object_reference, submit_workload, workload_notices};
use crate::workload::resolve::Workload;
use crate::workload::rollup::Layout;
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use kube::runtime::reflector::ObjectRef;
use memprof_api::{MemoryProfile, MemoryProfileStatus};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// The workload being rolled up and what this reconcile is about.
pub(super) struct Turn<'a> {
    /// The key the reports noted since claim (a JobSet's child Job, a
    /// PyTorchJob's own name): those are screened again.
    pub claimed: &'a JobKey,
    /// A JobSet's child Job whose reconcile this is: its link is checked
    /// again when it changed in the cache.
    pub child: Option<&'a Job>,
    /// The workload whose layout it is (its uid: another of the name
    /// starts afresh): a JobSet (also under a TrainJob), a PyTorchJob.
    pub workload: &'a Workload,
    /// Its layout as last read (a JobSet's members are the roll-up's own).
    pub layout: Layout,
    /// The workload's own annotations, where its recommendation's phases
    /// are read from them (a PyTorchJob's; a JobSet's are its Jobs').
    pub annotations: Option<&'a BTreeMap<String, String>>,
    /// The annotations its sidecars were injected from, where its
    /// `memprof.dev/thresholds` is read (`operator::thresholds::in_effect`):
    /// a PyTorchJob's own; a JobSet's child Job's (copied from its
    /// replicated job's template, a TrainJob's `spec.annotations`), not
    /// the JobSet's metadata, which no sidecar is given.
    pub injected_from: &'a BTreeMap<String, String>,
    /// The workload's key (its profile's name).
    pub wkey: &'a JobKey,
}

/// What a refreshed roll-up calls for.
pub(super) struct Refreshed {
    /// The status, and when it next changes with no event.
    pub desired: DesiredStatus,
    pub next: Option<Timestamp>,
    /// Its ranks as proven now (remediation's): the same `Arc` as the
    /// last reconcile's while the members and layout are unchanged.
    pub ranks: Arc<Ranks>,
}

/// Brings the workload's roll-up up to date with what changed under
/// `turn.claimed` (everything, on a full pass).
pub(super) fn refresh(
    ctx: &Context,
    turn: &Turn<'_>,
    previous: Option<&MemoryProfileStatus>,
    now: Timestamp,
) -> Refreshed {
    let cell: Cell = ctx.with_state(turn.wkey, |s| {
        s.workload_rollup.get_or_insert_with(Cell::default).clone()
    });
    let key = turn.claimed;
    let (names, all, oom_all) = take_noted(ctx, turn);
    let mut held = cell.lock().unwrap_or_else(|e| e.into_inner());
    let keys = ctx.setup.options.admission.ring();
    let replaced = held.as_ref().is_some_and(|t| t.uid != turn.workload.uid);
    if replaced || held.is_none() {
        let mut fresh = WorkloadTracked::new(turn.workload, turn.layout.clone());
        // A risk level held in the status carries over a restart of this
        // process, never over to another workload of the same name.
        if let Some(p) = previous.filter(|_| !replaced) {
            fresh.rollup.resume_from(p, now);
        }
        *held = Some(fresh);
    }
    let t = held.as_mut().expect("set above");
    if let Some(annotations) = turn.annotations {
        t.require_phases(annotations);
    }
    let src = Sources {
        caches: &ctx.caches,
        pytorch_pods: &ctx.pytorch.pods,
    };
    let full = t.set_layout(&turn.layout) || all || t.full_pass.elapsed() >= FULL_PASS;
    // What the workload's remediation stage scans for GPU OOMs (its pods
    // and reports noted here; every rank after a full pass), kept until it scans.
    let scan = names.iter().cloned();
    ctx.with_state(turn.wkey, |s| s.pending.oom_scan(scan, full || oom_all));
    if full {
        t.full(&src, &key.namespace, &keys, now);
    } else {
        if let Some(job) = turn.child {
            t.check_child(&src, (key, job), &keys, now);
        }
        for name in &names {
            t.apply(&src, &key.namespace, &key.name, name, &keys, now);
        }
    }
    let (mut desired, next) = t.desired(previous, now);
    let defaults = &ctx.setup.options.default_thresholds;
    desired.status.thresholds = Some(in_effect(defaults, turn.injected_from));
    Refreshed {
        desired,
        next,
        ranks: t.ranks(),
    }
}

/// Hands workload `top`'s refreshed status `desired` to the writer under
/// its profile's key `wkey` (`seen`: the profile as cached and the status
/// before), with the Events it calls for (`status::workload_notices`):
/// each refused report announced once, under `wkey` as a Job's under its
/// own key; in one turn of the state's lock, so two child Jobs of a JobSet
/// reconciled at once never announce one report twice.
pub(super) fn submit(
    ctx: &Context,
    (wkey, top): (&JobKey, &Workload),
    seen: (Option<&MemoryProfile>, Option<&MemoryProfileStatus>),
    desired: DesiredStatus,
) {
    // The report by name: a JobSet's reports claim its child Jobs, not `wkey`.
    let report = |name: &str| {
        let at = ObjectRef::new(name).within(&wkey.namespace);
        ctx.caches.reports.get(&at).map(|r| object_reference(&*r))
    };
    let notices = ctx.with_state(wkey, |s| {
        workload_notices((wkey, top), seen, &desired, &mut s.announced, report)
    });
    submit_workload(&ctx.writer, (wkey, top), desired.status, notices);
}

/// What was noted under `turn.claimed` since its last reconcile: the
/// reports to screen again, whether all are, and whether its pods' OOM
/// scan overflowed. A child Job's pods noted for OOMs are among its
/// reports' names (a pod's change notes both): scanned under the
/// workload's key, not left to pile up under the child's.
fn take_noted(ctx: &Context, turn: &Turn<'_>) -> (BTreeSet<String>, bool, bool) {
    let child = turn.claimed != turn.wkey;
    ctx.with_state(turn.claimed, |s| {
        let names = std::mem::take(&mut s.pending.reports);
        if child {
            s.pending.oom.clear();
        }
        let oom_all = child && std::mem::take(&mut s.pending.oom_all);
        (names, std::mem::take(&mut s.pending.reports_all), oom_all)
    })
}

/// Drops the roll-up kept under `wkey` when it is workload `uid`'s
/// (profiling switched off: what it held is not needed again).
pub(super) fn drop_rollup(ctx: &Context, wkey: &JobKey, uid: &str) {
    let cell = ctx.with_state(wkey, |s| s.workload_rollup.clone());
    let Some(cell) = cell else {
        return;
    };
    let mut held = cell.lock().unwrap_or_else(|e| e.into_inner());
    if held.as_ref().is_some_and(|t| t.uid == uid) {
        *held = None;
        // A profile made again starts with nothing announced, as a Job's.
        ctx.with_state(wkey, |s| s.announced.clear());
    }
}
