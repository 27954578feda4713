//! What happened to the job: the GPU OOMs observed (`status.ooms`, with the
//! Job annotation and Event reason that announce them) and the remediations
//! performed (`status.remediations`, `status.remediationTotals`). Its own
//! file because these are the profile's history, kept across the Job's
//! recreation, not figures recomputed from the reports at each roll-up.

use super::Acknowledgements;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A GPU out-of-memory observed in the job.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct OomRecord {
    /// When it was observed (RFC 3339).
    #[schemars(length(max = 64))]
    pub time: String,
    /// Pod that ran out of memory.
    #[schemars(length(max = 253))]
    pub pod: String,
    /// Rank of that pod, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    /// GPU index, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_index: Option<u32>,
    /// What proves it: `terminationMessage`, `agentOomCount` or `reportAtCeiling`, with detail.
    #[schemars(length(max = 512))]
    pub evidence: String,
    /// uid of the Job whose pod ran out of memory: an OOM of an earlier Job of this
    /// name (before a recreation) never fires a policy on the new one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub job_uid: Option<String>,
}

/// Annotation on a Job one of whose ranks ran out of GPU memory:
/// `"<time> rank N"` (or `"<time> pod P"` when the rank is unknown), the
/// newest OOM, so that a person or a controller can tell a CUDA OOM from any
/// other exit code 1 without reading logs (host memory has `OOMKilled`).
pub const ANNOTATION_GPU_OOM: &str = "memprof.dev/gpu-oom";
/// Reason of the Warning Event on a Job one of whose ranks ran out of GPU memory.
pub const REASON_GPU_OUT_OF_MEMORY: &str = "GPUOutOfMemory";

impl OomRecord {
    /// The value of [`ANNOTATION_GPU_OOM`] for this OOM (at most 256 bytes).
    pub fn annotation_value(&self) -> String {
        let mut v = match self.rank {
            Some(rank) => format!("{} rank {rank}", self.time),
            None => format!("{} pod {}", self.time, self.pod),
        };
        crate::truncate_utf8(&mut v, 256);
        v
    }
}

/// One remediation the operator performed (or, in dry-run, would have).
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RemediationRecord {
    /// Unique id, recorded before the action so it happens at most once.
    #[schemars(length(max = 128))]
    pub id: String,
    /// Policy that triggered it.
    #[schemars(length(max = 253))]
    pub policy: String,
    /// Action, e.g. `scaleBatch BATCH_SIZE 32->24`.
    #[schemars(length(max = 256))]
    pub action: String,
    /// `Pending`, `Done`, `Skipped`, `Failed` or `DryRun`.
    #[schemars(length(max = 32))]
    pub phase: String,
    /// When it was decided (RFC 3339).
    #[schemars(length(max = 64))]
    pub time: String,
    /// Why, or what went wrong.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub message: Option<String>,
    /// uid of the Job the remediation was decided on; a saved plan must name the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub job_uid: Option<String>,
    /// uid of the workload this remediation created in place of the one it
    /// deleted (`envChange: recreate`, once `Done`): the one workload that
    /// inherits the profile, which the deletion left with no owner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub replacement_uid: Option<String>,
    /// SHA-256 (hex) of the saved plan: the plan is carried out only if it still hashes to this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub plan_digest: Option<String>,
    /// The Job was deleted by this remediation (so it counts, whatever happened next).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub job_deleted: bool,
    /// With `notifyTrainer`: which ranks' trainers acknowledged the directive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acknowledged: Option<Acknowledgements>,
    /// What the restart kept or lost, when the policy waits for a checkpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<crate::CheckpointOutcome>,
    /// How the workload's environment is changed, decided with the plan:
    /// `suspend-patch-resume` (a Kueue-managed JobSet, TrainJob or
    /// PyTorchJob: never deleted) or `recreate` (deleted and created again
    /// under its name). Absent when the plan changes no environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub env_change: Option<String>,
}

/// How often one policy changed a workload, over its whole life.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RemediationTotal {
    /// Policy name.
    #[schemars(length(max = 253))]
    pub policy: String,
    /// Finished remediations that changed the workload (done, or deleted the Job).
    pub count: u32,
    /// When the newest of them was decided (RFC 3339).
    #[schemars(length(max = 64))]
    pub last: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gpu_oom_annotation_names_the_time_and_the_rank_or_pod() {
        let mut r = OomRecord {
            time: "2026-11-24T09:00:00Z".into(),
            pod: "train-0-abcde".into(),
            rank: Some(3),
            ..Default::default()
        };
        assert_eq!(r.annotation_value(), "2026-11-24T09:00:00Z rank 3");
        r.rank = None;
        assert_eq!(
            r.annotation_value(),
            "2026-11-24T09:00:00Z pod train-0-abcde"
        );
        r.pod = "p".repeat(300);
        assert!(r.annotation_value().len() <= 256);
    }
}
