//! GPU OOMs of a top-level workload's ranks (JobSet, TrainJob, PyTorchJob),
//! for its remediation stage (`remediation_stage::run_workload`): the
//! workload twin of the Job path's OOM scan (`rollups::take_oom_scan`).
//!
//! What is scanned: the reports and pods the workload's roll-up noted
//! under its key since the last scan (`workload_refresh.rs`: a JobSet's
//! child Jobs' and a PyTorchJob's own, by name; every rank after a full
//! pass), kept noted until scanned. Evidence is read only from the pods
//! the workload's roll-up proves its own (`Ranks::counted`: its marks, its
//! rank inside the layout, the report its pod's own write), as a Job's
//! only from its admitted pods: anyone may create a pod labelled with a
//! workload's name that prints a CUDA OOM and exits 1. Proving costs two
//! HMACs per report, so only a rank that may show an OOM is proven: its
//! pod has a container that failed, or its agent counted an OOM.

use super::state::Context;
use super::workload_ranks::{claiming, count_ranks, layout_pods};
use crate::key::JobKey;
use crate::operator::trust::Admitted;
use crate::remediation::{oom, Target};
use jiff::Timestamp;
use kube::runtime::reflector::ObjectRef;
use memprof_api::{MemoryReport, MemoryReportSpec, OomRecord};
use std::sync::Arc;

/// New GPU OOMs of workload `target` (profile `wkey`) that `known` does
/// not hold, oldest first. Takes what was noted: until then it stays noted.
pub(super) fn scan(
    ctx: &Context,
    wkey: &JobKey,
    target: &Target,
    known: &[OomRecord],
    now: Timestamp,
) -> Vec<OomRecord> {
    let (all, names) = ctx.with_state(wkey, |s| {
        let all = std::mem::take(&mut s.pending.oom_all);
        (all, std::mem::take(&mut s.pending.oom))
    });
    let ns = wkey.namespace.as_str();
    let noted: Vec<Arc<MemoryReport>> = if all {
        claiming(ctx, ns, &target.ranks)
    } else {
        let report = |n: &String| ctx.caches.reports.get(&ObjectRef::new(n).within(ns));
        names.iter().filter_map(report).collect()
    };
    let pods = layout_pods(ctx, &target.ranks);
    let may_show = |r: &Arc<MemoryReport>| {
        let agent = r.spec.allocator.as_ref().is_some_and(|a| a.num_ooms > 0);
        let pod = pods.get(&ObjectRef::new(&r.spec.pod_name).within(ns));
        agent || pod.is_some_and(|p| oom::failed_container(&p))
    };
    let candidates: Vec<Arc<MemoryReport>> = noted.into_iter().filter(may_show).collect();
    if candidates.is_empty() {
        return Vec::new();
    }
    let counted = count_ranks(ctx, ns, &target.ranks, candidates);
    let proven: Vec<Admitted<'_>> = counted
        .iter()
        .filter_map(|(_, p)| p.as_deref())
        .map(|p| Admitted::proven_rank(p, &target.uid))
        .collect();
    let specs: Vec<&MemoryReportSpec> = counted.iter().map(|(r, _)| &r.spec).collect();
    oom::detect(&proven, &specs, known, now)
}
