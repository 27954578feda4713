//! The ranks a remediation of a top-level workload (JobSet, TrainJob,
//! PyTorchJob) counts: its checkpoint wait waits for them and
//! `notifyTrainer` tells them. Exactly the reports the workload's roll-up
//! counts, proven by the roll-up's own rule (`workload::rollup::screen`
//! with the workload's layout: the pod is the workload's by its marks, its
//! rank lies inside the layout, the report is its pod's own write). One
//! rule for every kind, so a rank the profile shows is a rank remediation
//! waits for and tells, and a report the profile refuses is neither.
//!
//! Why not a Job's rule (`trust::check` against one controller's uid, the
//! pod admission mark): a PyTorchJob's pods are created by the training
//! operator with no Job between and carry the workload mark instead, so
//! under a Job's rule none of its ranks counted: the wait never waited
//! and no trainer was told.

use crate::workload::rollup::{screen, Layout};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use memprof_api::admission::KeyRing;
use memprof_api::{MemoryReport, LABEL_JOB};
use std::collections::BTreeSet;
use std::sync::Arc;

/// A workload's ranks as its pipeline last proved them.
#[derive(Clone, Debug)]
pub struct Ranks {
    /// The names its ranks' reports claim (`memprof.dev/job`): a JobSet's
    /// proven child Jobs, a PyTorchJob's own name.
    pub claims: BTreeSet<String>,
    /// How a claiming report is proven the workload's: the roll-up's layout.
    pub layout: Layout,
}

/// A counted report and its pod as cached (`None`: not in the cache).
pub type Counted = (Arc<MemoryReport>, Option<Arc<Pod>>);

impl Ranks {
    /// Those of `reports` that claim one of the workload's names and count
    /// under its layout, each with its pod (`pod_of`: the cached pod of
    /// that name) and numbered by its rank in the workload, as the profile
    /// numbers it (a tally names that rank, not the one its sidecar
    /// wrote). O(reports), two HMACs per report at most.
    pub fn counted(
        &self,
        reports: impl IntoIterator<Item = Arc<MemoryReport>>,
        pod_of: impl Fn(&str) -> Option<Arc<Pod>>,
        keys: &KeyRing,
        now: Timestamp,
    ) -> Vec<Counted> {
        reports
            .into_iter()
            .filter(|r| {
                r.labels()
                    .get(LABEL_JOB)
                    .is_some_and(|j| self.claims.contains(j))
            })
            .filter_map(|r| {
                let pod = pod_of(&r.spec.pod_name);
                let meta = pod.as_deref().map(|p| &p.metadata);
                let (spec, _) = screen(&r, meta, &self.layout, keys, now).ok()?;
                Some((numbered(r, spec.rank), pod))
            })
            .collect()
    }
}

/// `report` with `rank` as its rank (a copy only where they differ).
fn numbered(report: Arc<MemoryReport>, rank: Option<u32>) -> Arc<MemoryReport> {
    if report.spec.rank == rank {
        return report;
    }
    let mut copy = MemoryReport::clone(&report);
    copy.spec.rank = rank;
    Arc::new(copy)
}

#[cfg(test)]
mod tests;
