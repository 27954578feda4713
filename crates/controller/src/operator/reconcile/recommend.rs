//! The recommendation's part of the roll-up: each counted rank's role and
//! evidence, handed to `memprof_analysis::recommend` (pure, like the rest
//! of the roll-up); the hysteresis against what the server holds is the
//! status composition's (`status/compose.rs`).

use super::expected_ranks;
use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;
use memprof_analysis::recommend::{
    evidence, recommend, required_phases, JobFacts, PhasesError, ANNOTATION_RECOMMEND_PHASES,
};
use memprof_api::{MemoryProfileStatus, MemoryReportSpec, ROLE_WORKER};

/// The role of a rank of `job`. Every rank of a plain Job is a `worker`;
/// workloads whose ranks differ (a JobSet's replicated jobs, a PyTorchJob's
/// master and workers) name theirs here, from the workload's own rank
/// labels, never from a report (a tenant writes those).
pub fn rank_role(_job: &Job, _report: &MemoryReportSpec) -> String {
    ROLE_WORKER.to_string()
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
}
