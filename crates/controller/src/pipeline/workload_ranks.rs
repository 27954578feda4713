//! The counted ranks of a workload, read from the watch caches: the
//! reports claiming its names whose pods its layout proves its own. Shared
//! by the remediation stage (checkpoints, decisions) and the OOM scan,
//! which must agree on who the workload's ranks are.

use super::state::Context;
use crate::remediation::ranks::Counted;
use crate::remediation::Ranks;
use crate::workload::rollup::Layout;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::ResourceExt;
use memprof_api::MemoryReport;
use std::sync::Arc;

/// The cached reports in namespace `ns` that claim one of `ranks`' names:
/// one scan of the report cache (O(cached reports)).
pub(super) fn claiming(ctx: &Context, ns: &str, ranks: &Ranks) -> Vec<Arc<MemoryReport>> {
    ctx.caches.reports.state_filter(|r| {
        r.metadata.namespace.as_deref() == Some(ns)
            && r.labels()
                .get(memprof_api::LABEL_JOB)
                .is_some_and(|j| ranks.claims.contains(j))
    })
}

/// Where the cache of `ranks`' pods is: the training operator's pods are
/// watched apart from the Job controller's.
pub(super) fn layout_pods<'c>(ctx: &'c Context, ranks: &Ranks) -> &'c Store<Pod> {
    match ranks.layout {
        Layout::PyTorchJob { .. } => &ctx.pytorch.pods,
        Layout::JobSet { .. } => &ctx.caches.pods,
    }
}

/// Those of `reports` (in namespace `ns`) that count as workload ranks
/// `ranks`, with their pods (`Ranks::counted`).
pub(super) fn count_ranks(
    ctx: &Context,
    ns: &str,
    ranks: &Ranks,
    reports: impl IntoIterator<Item = Arc<MemoryReport>>,
) -> Vec<Counted> {
    let pods = layout_pods(ctx, ranks);
    let pod_of = |name: &str| pods.get(&ObjectRef::new(name).within(ns));
    let keys = ctx.setup.options.admission.ring();
    ranks.counted(reports, pod_of, &keys, Timestamp::now())
}
