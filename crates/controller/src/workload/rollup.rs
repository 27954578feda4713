//! One roll-up over a whole workload: every counted report of every rank
//! of a JobSet (across its child Jobs) or a PyTorchJob, numbered by its
//! rank in the workload (`rank.rs`), so imbalance, the bottleneck and the
//! top ranks span the workload, not one Job.
//!
//! A report counts when its pod counts for the workload and the report is
//! that pod's own (`operator/trust.rs` rules 1 and 3–5):
//! - JobSet (and TrainJob, through its JobSet): the pod is its Job's own
//!   (the pod admission mark, trust rule 1–3) and that Job is a proven
//!   child of the workload (`members`: Job uid → rank identity, from
//!   `resolve.rs`); the rank is that identity's and the pod's completion
//!   index in the JobSet's layout.
//! - PyTorchJob: the pod is the PyTorchJob's own (`pods.rs`); the rank is
//!   its replica identity's.
//!
//! The rank a sidecar wrote in its report is ignored: it is the pod's word.
//! So is any role: a counted report's recommendation evidence goes under
//! the role of its workload rank ([`Layout::role`]).

use super::pods::{pytorch_pod, PodRefused};
use super::rank::{JobSetShape, PyTorchShape};
use crate::operator::reconcile::WorkloadEvidence;
use crate::operator::trust::{admit, check_written, PodFacts, Rejection};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use memprof_analysis::{JobRollup, ReportMeta, RollupLimits};
use memprof_api::admission::KeyRing;
use memprof_api::workload::{index, COMPLETION_INDEX};
use memprof_api::MemoryReport;
use std::collections::{BTreeMap, HashMap};

/// How a workload's pods are numbered.
#[derive(Clone, Debug)]
pub enum Layout {
    /// A JobSet's (a TrainJob's, through its JobSet): proven child Jobs by
    /// uid, each with its rank identity (`<replicated job>/<job index>`).
    JobSet {
        /// The JobSet's layout.
        shape: JobSetShape,
        /// Proven child Jobs: uid → rank identity.
        members: BTreeMap<String, String>,
    },
    /// A PyTorchJob's.
    PyTorchJob {
        /// The PyTorchJob's uid.
        uid: String,
        /// Its layout.
        shape: PyTorchShape,
    },
}

impl Layout {
    /// Ranks of the whole workload.
    pub fn ranks(&self) -> u32 {
        match self {
            Layout::JobSet { shape, .. } => shape.ranks(),
            Layout::PyTorchJob { shape, .. } => shape.ranks(),
        }
    }

    /// The role of workload rank `rank` in the recommendation: a JobSet's
    /// replicated job (a TrainJob's, through its JobSet), a PyTorchJob's
    /// replica type; `None` outside the layout.
    pub fn role(&self, rank: u32) -> Option<&str> {
        match self {
            Layout::JobSet { shape, .. } => shape.role(rank),
            Layout::PyTorchJob { shape, .. } => shape.role(rank),
        }
    }

    /// The rank of `pod` in the workload if it counts (its creation mark
    /// and its rank identity), else why not.
    fn rank_of(&self, pod: &ObjectMeta, keys: &KeyRing, now: Timestamp) -> Result<u32, Uncounted> {
        let name = || pod.name.clone().unwrap_or_default();
        match self {
            Layout::JobSet { shape, members } => {
                let (_, facts) = PodFacts::of(pod).ok_or(Uncounted::NoName)?;
                let job = facts.job_uid.ok_or_else(|| Uncounted::NoJob(name()))?;
                let identity = members
                    .get(job)
                    .ok_or_else(|| Uncounted::NotAChild(name()))?;
                admit(&facts, job, keys, now)?;
                let completion = completion_index(pod).unwrap_or(0);
                shape
                    .rank(identity, completion)
                    .ok_or_else(|| Uncounted::OutsideJobSet {
                        pod: name(),
                        identity: identity.to_string(),
                        completion,
                    })
            }
            Layout::PyTorchJob { uid, shape } => {
                let identity = pytorch_pod(pod, uid, keys, now)?;
                shape
                    .rank(&identity)
                    .ok_or_else(|| Uncounted::OutsidePyTorchJob {
                        pod: name(),
                        identity: identity.to_string(),
                    })
            }
        }
    }
}

/// Why a report claiming the workload does not count (the profile lists
/// it as refused with this reason; the pod's owner fixes what it names).
#[derive(Debug, thiserror::Error)]
pub enum Uncounted {
    #[error("pod has no name")]
    NoName,
    #[error("pod {0} is not controlled by a Job")]
    NoJob(String),
    #[error("pod {0}'s Job is not a proven child of this workload")]
    NotAChild(String),
    #[error(
        "pod {pod} ({identity}, completion index {completion}) is outside the JobSet's layout"
    )]
    OutsideJobSet {
        pod: String,
        identity: String,
        completion: u32,
    },
    #[error("pod {pod} ({identity}) is outside the PyTorchJob's replicas")]
    OutsidePyTorchJob { pod: String, identity: String },
    #[error("not its pod's own report: describes pod {0:?}")]
    NotOwnReport(String),
    #[error("pod {0} does not exist")]
    NoPod(String),
    /// The pod's or the report's marks (trust rules 1–5).
    #[error(transparent)]
    Trust(#[from] Rejection),
    /// Not the PyTorchJob's own pod.
    #[error(transparent)]
    PyTorch(#[from] PodRefused),
}

/// An Indexed Job's completion index on its pod: the label (1.28+), else
/// the annotation the Job controller writes.
fn completion_index(pod: &ObjectMeta) -> Option<u32> {
    let label = pod.labels.as_ref().and_then(|l| l.get(COMPLETION_INDEX));
    let annotation = pod
        .annotations
        .as_ref()
        .and_then(|a| a.get(COMPLETION_INDEX));
    index(label.or(annotation)?)
}

/// A workload's roll-up and the reports it refused, with why.
#[derive(Debug)]
pub struct WorkloadRollup {
    /// Every counted report, numbered by its rank in the workload.
    pub rollup: JobRollup,
    /// Reports claiming the workload that do not count: name → why.
    pub refused: BTreeMap<String, String>,
    /// The counted reports' recommendation evidence, by role.
    pub evidence: WorkloadEvidence,
}

/// Rolls up `reports` (those claiming the workload's Jobs or pods), `pods`
/// being the cached pods by name. O(reports), two HMACs per report at most.
pub fn roll_up(
    reports: &[&MemoryReport],
    pods: &HashMap<&str, &ObjectMeta>,
    layout: &Layout,
    keys: &KeyRing,
    now: Timestamp,
) -> WorkloadRollup {
    let mut out = WorkloadRollup {
        rollup: JobRollup::new(Some(layout.ranks()), RollupLimits::default()),
        refused: BTreeMap::new(),
        evidence: WorkloadEvidence::default(),
    };
    for report in reports {
        let name = report.metadata.name.clone().unwrap_or_default();
        let pod = pods.get(report.spec.pod_name.as_str()).copied();
        match screen(report, pod, layout, keys, now) {
            Ok(screened) => {
                count(&mut out.rollup, &mut out.evidence, layout, &name, screened);
            }
            Err(why) => {
                out.refused.insert(name, why.to_string());
            }
        }
    }
    out
}

/// Counts screened report `name`: into the roll-up, and into the
/// recommendation's evidence only while the roll-up finds it valid, so
/// that both count the same reports (an impossible report sizes no request).
pub fn count(
    rollup: &mut JobRollup,
    evidence: &mut WorkloadEvidence,
    layout: &Layout,
    name: &str,
    (spec, meta): (memprof_api::MemoryReportSpec, ReportMeta),
) {
    rollup.upsert_with(name, &spec, meta);
    if rollup.is_valid(name) {
        evidence.upsert(name, spec.rank.and_then(|r| layout.role(r)), &spec);
    } else {
        evidence.remove(name);
    }
}

/// Screens one report claiming the workload, as [`roll_up`] screens each
/// (`pod`: the cached pod it names, if any): its spec numbered by its rank
/// in the workload and what the roll-up keeps besides, or why it does not
/// count. O(1), two HMACs at most: what an incremental roll-up
/// (`pipeline/workload_index.rs`) runs per changed report.
pub fn screen(
    report: &MemoryReport,
    pod: Option<&ObjectMeta>,
    layout: &Layout,
    keys: &KeyRing,
    now: Timestamp,
) -> Result<(memprof_api::MemoryReportSpec, ReportMeta), Uncounted> {
    let pod_name = report.spec.pod_name.as_str();
    if report.metadata.name.as_deref() != Some(pod_name) {
        return Err(Uncounted::NotOwnReport(pod_name.to_string()));
    }
    let pod = pod.ok_or_else(|| Uncounted::NoPod(pod_name.to_string()))?;
    let rank = layout.rank_of(pod, keys, now)?;
    let (_, facts) = PodFacts::of(pod).ok_or(Uncounted::NoName)?;
    check_written(report, &facts, keys, now)?;
    let mut spec = report.spec.clone();
    spec.rank = Some(rank);
    let meta = ReportMeta {
        pod_created: facts.created,
        received: Some(now),
    };
    Ok((spec, meta))
}

#[cfg(test)]
mod tests;
