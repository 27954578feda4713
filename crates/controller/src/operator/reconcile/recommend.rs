//! The recommendation's part of the roll-up: each counted rank's role and
//! evidence, handed to `memprof_analysis::recommend` (pure, like the rest
//! of the roll-up); the hysteresis against what the server holds is the
//! status composition's (`status/compose.rs`).
//!
//! A plain Job's ranks are one role, `worker`, read from its reports at
//! each roll-up ([`with_recommendation`]). A workload's roles are its
//! kind's own (a JobSet's replicated jobs, a TrainJob's through its
//! JobSet, a PyTorchJob's replica types `Master` and `Worker`), given by
//! the rank its layout proved for the report's pod, never by the report;
//! their evidence is kept per report ([`WorkloadEvidence`]) so that a
//! JobSet's incremental roll-up updates it per changed report.

use super::expected_ranks;
use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;
use memprof_analysis::recommend::{
    evidence, recommend, recommend_roles, required_phases, JobFacts, Phases, PhasesError,
    RankEvidence, ANNOTATION_RECOMMEND_PHASES,
};
use memprof_api::{MemoryProfileStatus, MemoryReportSpec, ROLE_WORKER};
use std::collections::BTreeMap;

/// The CRD's bound on a role's name.
const MAX_ROLE_LEN: usize = 63;

/// The role of a rank of `job`. Every rank of a plain Job is a `worker`;
/// a workload's ranks take their role from its layout
/// ([`WorkloadEvidence::upsert`]), never from a report (a tenant writes those).
pub fn rank_role(_job: &Job, _report: &MemoryReportSpec) -> String {
    ROLE_WORKER.to_string()
}

/// A workload's recommendation evidence: per counted report, its role and
/// what it shows; per role, the phases its annotation requires.
#[derive(Clone, Debug, Default)]
pub struct WorkloadEvidence {
    /// Report name → (role, evidence).
    reports: BTreeMap<String, (String, RankEvidence)>,
    /// Role → the phases its own annotation requires (a JobSet's
    /// replicated job, from its child Jobs' annotations).
    phases: BTreeMap<String, Phases>,
    /// The phases of a role without its own: the workload's annotation
    /// (a PyTorchJob's), both when absent.
    default: Phases,
}

impl WorkloadEvidence {
    /// Counts report `name` (`spec`) under `role`, the role its rank in
    /// the workload's layout has; a rank outside the layout (`None`) adds
    /// nothing, as it counts in no roll-up.
    pub fn upsert(&mut self, name: &str, role: Option<&str>, spec: &MemoryReportSpec) {
        let Some(role) = role else {
            self.reports.remove(name);
            return;
        };
        let mut role = role.to_string();
        memprof_api::truncate_utf8(&mut role, MAX_ROLE_LEN);
        self.reports
            .insert(name.to_string(), (role, evidence(spec)));
    }

    /// Report `name` no longer counts.
    pub fn remove(&mut self, name: &str) {
        self.reports.remove(name);
    }

    /// The phases `role` waits for (every role without its own, when
    /// `None`), from the recommend-phases annotation among `annotations`.
    /// An unreadable value requires both phases meanwhile and is returned
    /// for the caller to log.
    pub fn require(
        &mut self,
        role: Option<&str>,
        annotations: &BTreeMap<String, String>,
    ) -> Result<(), PhasesError> {
        let annotated = annotations.get(ANNOTATION_RECOMMEND_PHASES);
        let phases = required_phases(annotated.map(String::as_str));
        let value = phases.clone().unwrap_or_default();
        match role {
            Some(r) => {
                let mut r = r.to_string();
                memprof_api::truncate_utf8(&mut r, MAX_ROLE_LEN);
                self.phases.insert(r, value);
            }
            None => self.default = value,
        }
        phases.map(|_| ())
    }

    /// Sets `status.recommendation` from the counted reports, one per role;
    /// `total_ranks` is the workload's (NCCL's buffers when more than one).
    /// O(counted reports), as a Job's.
    pub fn apply(&self, status: &mut MemoryProfileStatus, total_ranks: u32) {
        let phases_of = |role: &str| self.phases.get(role).copied().unwrap_or(self.default);
        status.recommendation = recommend_roles(self.reports.values(), total_ranks, phases_of);
    }
}

/// Sets `status.recommendation` from the counted ranks' `reports`. The
/// Job's recommend-phases annotation, when unreadable, is returned with
/// both phases required meanwhile (the caller logs it).
pub fn with_recommendation<'a>(
    status: &mut MemoryProfileStatus,
    job: &Job,
    reports: impl IntoIterator<Item = &'a MemoryReportSpec>,
) -> Result<(), PhasesError> {
    let annotated = job.annotations().get(ANNOTATION_RECOMMEND_PHASES);
    let phases = required_phases(annotated.map(String::as_str));
    let ranks: Vec<_> = reports
        .into_iter()
        .map(|r| (rank_role(job, r), evidence(r)))
        .collect();
    let facts = JobFacts {
        ranks: expected_ranks(job),
        phases: phases.clone().unwrap_or_default(),
    };
    status.recommendation = recommend(&ranks, facts);
    phases.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_api::{AllocatorStats, PhasePeak};

    fn job(annotations: serde_json::Value) -> Job {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "j", "namespace": "ns", "annotations": annotations},
            "spec": {"parallelism": 2, "template": {}},
        }))
        .unwrap()
    }

    fn rank(reserved: u64) -> MemoryReportSpec {
        MemoryReportSpec {
            allocator: Some(AllocatorStats {
                reserved_bytes: reserved,
                step: Some(10),
                phase_peaks: vec![PhasePeak {
                    phase: "train".into(),
                    allocated_bytes: 1,
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn every_rank_of_a_job_is_one_worker_role_and_the_annotation_names_the_phases() {
        let (a, b) = (rank(10 << 30), rank(12 << 30));
        let mut st = MemoryProfileStatus::default();
        let j = job(serde_json::json!({ANNOTATION_RECOMMEND_PHASES: "none"}));
        with_recommendation(&mut st, &j, [&a, &b]).unwrap();
        assert_eq!(st.recommendation.len(), 1);
        let r = &st.recommendation[0];
        assert_eq!((r.role.as_str(), r.basis.ranks), (ROLE_WORKER, 2));
        assert_eq!(r.peak_bytes, Some(12 << 30));
        assert!(r.request_bytes.is_some(), "{}", r.reason);
        // Two ranks: NCCL's buffers are counted.
        assert_eq!(
            r.context_bytes,
            memprof_analysis::recommend::CONTEXT_BYTES + memprof_analysis::recommend::NCCL_BYTES
        );
        // By default the phases are required: no request from training steps alone.
        let j = job(serde_json::json!({}));
        with_recommendation(&mut st, &j, [&a, &b]).unwrap();
        assert_eq!(st.recommendation[0].request_bytes, None);
        let j = job(serde_json::json!({ANNOTATION_RECOMMEND_PHASES: "nap"}));
        let err = with_recommendation(&mut st, &j, [&a, &b]).unwrap_err();
        assert!(err.to_string().contains("nap"));
        assert_eq!(st.recommendation[0].basis.phases_required.len(), 2);
    }

    fn annotated(value: &str) -> BTreeMap<String, String> {
        BTreeMap::from([(ANNOTATION_RECOMMEND_PHASES.to_string(), value.to_string())])
    }

    /// A workload's reports are grouped by the role its layout gave each;
    /// a role's own annotation decides its phases, the workload's the
    /// rest; a report that stops counting leaves its role's evidence.
    #[test]
    fn a_workloads_roles_each_get_a_recommendation_with_their_own_phases() {
        let mut w = WorkloadEvidence::default();
        w.upsert("m0", Some("Master"), &rank(4 << 30));
        w.upsert("w0", Some("Worker"), &rank(20 << 30));
        w.upsert("w1", Some("Worker"), &rank(22 << 30));
        w.upsert("lost", None, &rank(70 << 30));
        w.require(Some("Master"), &annotated("none")).unwrap();
        let mut st = MemoryProfileStatus::default();
        w.apply(&mut st, 3);
        let roles: Vec<_> = st.recommendation.iter().map(|r| r.role.as_str()).collect();
        assert_eq!(roles, ["Master", "Worker"]);
        let (master, worker) = (&st.recommendation[0], &st.recommendation[1]);
        assert_eq!((master.basis.ranks, worker.basis.ranks), (1, 2));
        assert_eq!(master.peak_bytes, Some(4 << 30));
        assert!(master.request_bytes.is_some(), "{master:?}");
        assert_eq!(
            worker.peak_bytes,
            Some(22 << 30),
            "a rank outside the layout adds nothing"
        );
        assert_eq!(
            worker.request_bytes, None,
            "no evaluation, no checkpoint yet"
        );
        // The workload's annotation covers every role without its own.
        w.require(None, &annotated("none")).unwrap();
        w.remove("w1");
        w.apply(&mut st, 3);
        let worker = &st.recommendation[1];
        assert_eq!((worker.basis.ranks, worker.peak_bytes), (1, Some(20 << 30)));
        assert!(worker.request_bytes.is_some(), "{worker:?}");
        let err = w.require(None, &annotated("nap")).unwrap_err();
        assert!(err.to_string().contains("nap"));
        w.apply(&mut st, 3);
        assert_eq!(
            st.recommendation[1].request_bytes, None,
            "both required meanwhile"
        );
    }
}
