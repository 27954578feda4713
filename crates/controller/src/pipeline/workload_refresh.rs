//! A JobSet's roll-up brought up to date by a reconcile of one of its
//! child Jobs (`workloads.rs` calls [`refresh`]): the roll-up itself, and
//! why it is kept between reconciles, are `workload_index.rs`'s.

use super::state::Context;
use super::workload_index::{Cell, WorkloadTracked, FULL_PASS};
use crate::key::JobKey;
use crate::operator::reconcile::DesiredStatus;
use crate::remediation::Ranks;
use crate::workload::rank::JobSetShape;
use crate::workload::resolve::Workload;
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use memprof_api::MemoryProfileStatus;

/// The JobSet being rolled up and the child Job whose reconcile does it.
pub(super) struct Turn<'a> {
    /// The child Job's key and object.
    pub child: (&'a JobKey, &'a Job),
    /// The JobSet (its uid) and its layout as last read.
    pub jobset: &'a Workload,
    pub shape: &'a JobSetShape,
    /// The JobSet's key (its profile's name).
    pub wkey: &'a JobKey,
}

/// Brings the JobSet's roll-up up to date with what changed under
/// `turn.child` (everything, on a full pass) and returns the status it
/// calls for, when that next changes with no event, and its ranks as
/// proven now (remediation's).
pub(super) fn refresh(
    ctx: &Context,
    turn: &Turn<'_>,
    previous: Option<&MemoryProfileStatus>,
    now: Timestamp,
) -> (DesiredStatus, Option<Timestamp>, Ranks) {
    let cell: Cell = ctx.with_state(turn.wkey, |s| {
        s.workload_rollup.get_or_insert_with(Cell::default).clone()
    });
    let (key, _) = turn.child;
    let (names, all) = ctx.with_state(key, |s| {
        let names = std::mem::take(&mut s.pending.reports);
        (names, std::mem::take(&mut s.pending.reports_all))
    });
    let mut held = cell.lock().unwrap_or_else(|e| e.into_inner());
    let keys = ctx.setup.options.admission.ring();
    let replaced = held.as_ref().is_some_and(|t| t.uid != turn.jobset.uid);
    if replaced || held.is_none() {
        let mut fresh = WorkloadTracked::new(turn.jobset, turn.shape);
        // A risk level held in the status carries over a restart of this
        // process, never over to another JobSet of the same name.
        if let Some(p) = previous.filter(|_| !replaced) {
            fresh.rollup.resume_from(p, now);
        }
        *held = Some(fresh);
    }
    let t = held.as_mut().expect("set above");
    if t.set_shape(turn.shape) || all || t.full_pass.elapsed() >= FULL_PASS {
        t.full(&ctx.caches, &key.namespace, &keys, now);
    } else {
        t.check_child(&ctx.caches, turn.child, &keys, now);
        for name in &names {
            t.apply(&ctx.caches, &key.namespace, &key.name, name, &keys, now);
        }
    }
    let (desired, next) = t.desired(previous, now);
    (desired, next, t.ranks())
}
