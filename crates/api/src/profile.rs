//! `MemoryProfile`: one per profiled workload, status written by the operator only.
//!
//! Its size is bounded whatever the rank count: the status keeps aggregates,
//! the bottleneck and the top-K ranks, never one entry per rank (etcd caps an
//! object at 1.5 MiB and rewrites all of it on every write).

use super::common::{Condition, RiskLevel};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

mod acks;
pub use acks::{Acknowledgements, MAX_ACK_RANKS};

/// A profiled workload and what memprof concluded about its GPU memory.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[kube(
    group = "memprof.dev",
    version = "v1alpha1",
    kind = "MemoryProfile",
    namespaced,
    shortname = "mprof",
    category = "memprof",
    status = "MemoryProfileStatus",
    printcolumn = r#"{"name":"JOB","type":"string","jsonPath":".spec.jobName"}"#,
    printcolumn = r#"{"name":"RANKS","type":"string","jsonPath":".status.ranks"}"#,
    printcolumn = r#"{"name":"GPUS","type":"integer","jsonPath":".status.gpuCount"}"#,
    printcolumn = r#"{"name":"PEAK","type":"string","jsonPath":".status.peak"}"#,
    printcolumn = r#"{"name":"RISK","type":"string","jsonPath":".status.risk"}"#,
    printcolumn = r#"{"name":"TTO","type":"string","jsonPath":".status.timeToOom"}"#,
    printcolumn = r#"{"name":"IMBALANCE","type":"string","jsonPath":".status.imbalanceDisplay"}"#,
    printcolumn = r#"{"name":"OOMS","type":"integer","jsonPath":".status.oomCount"}"#,
    printcolumn = r#"{"name":"ACTION","type":"string","jsonPath":".status.lastAction"}"#,
    printcolumn = r#"{"name":"AGE","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct MemoryProfileSpec {
    /// Name of the Job this profile describes (in the profile's namespace).
    #[schemars(length(min = 1, max = 253))]
    pub job_name: String,
    /// Number of ranks (pods) expected to report: the Job's parallelism.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 1_000_000))]
    pub expected_ranks: Option<u32>,
}

/// What the operator concluded from the job's MemoryReports.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MemoryProfileStatus {
    /// Ranks whose report counts and is fresh (not stale: see `ranksStale`).
    pub ranks_reporting: u32,
    /// Ranks whose report counts but is stale: older than two of its
    /// sidecar's heartbeats plus 30 s (150 s by default). Their last report
    /// stays in every figure of this status (risk included), marked stale.
    #[serde(default)]
    pub ranks_stale: u32,
    /// Stale ranks, worst risk first, then longest silent (at most 8).
    #[schemars(length(max = 8))]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stale_ranks: Vec<StaleRank>,
    /// Ranks expected (the Job's parallelism), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ranks_expected: Option<u32>,
    /// `reporting/expected`, for humans, with ` (N stale)` when ranks are stale.
    #[schemars(length(max = 32))]
    pub ranks: String,
    /// GPUs reported across all ranks.
    pub gpu_count: u32,
    /// Highest peak of any GPU, in bytes.
    pub peak_used_bytes: u64,
    /// Peak of the fullest GPU as a percentage of its total memory.
    #[schemars(range(min = 0.0, max = 100.0))]
    pub peak_percent: f64,
    /// Highest current usage of any GPU, in bytes.
    pub current_used_bytes: u64,
    /// Current usage of the fullest GPU as a percentage of its total memory.
    #[schemars(range(min = 0.0, max = 100.0))]
    pub current_percent: f64,
    /// Peak for humans, e.g. `61.2GiB (76%)`.
    #[schemars(length(max = 64))]
    pub peak: String,
    /// Worst risk level of any GPU of the job, held for a dwell time (60 s)
    /// after the evidence for it ended: it rises at once and falls only when
    /// the lower level has lasted (see `riskHeldUntil`).
    pub risk: RiskLevel,
    /// While `risk` is held above what the ranks report now: when it may
    /// fall, unless a report renews it (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub risk_held_until: Option<String>,
    /// Confidence of that risk level, 0 to 1.
    #[schemars(range(min = 0.0, max = 1.0))]
    pub confidence: f64,
    /// Smallest predicted time to OOM of any rank's worst GPU, in seconds,
    /// as of when this status was computed: each report's prediction less
    /// the report's age (never below 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub time_to_oom_seconds: Option<f64>,
    /// Smallest time to OOM, for humans.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub time_to_oom: Option<String>,
    /// Some GPU's memory keeps growing between steps.
    pub leak_suspected: bool,
    /// Ranks with a suspected leak (at most 8).
    #[schemars(length(max = 8))]
    #[serde(default)]
    pub leak_ranks: Vec<u32>,
    /// Highest fragmentation reported by an in-process agent (0 to 1), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub fragmentation: Option<f64>,
    /// What the in-process agents' allocator numbers add, when an agent runs in some rank.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocator: Option<AllocatorRollup>,
    /// What holds the memory of the rank with the largest static + activation
    /// bytes (its agent's `memprof_agent.breakdown`), with `pod` and `rank` set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breakdown: Option<super::MemoryBreakdown>,
    /// Max over mean of per-GPU peak memory across the job (1 = perfectly balanced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1.0))]
    pub imbalance: Option<f64>,
    /// Imbalance for humans, e.g. `1.42`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub imbalance_display: Option<String>,
    /// The GPU that will run out of memory first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bottleneck: Option<GpuLocation>,
    /// The ranks closest to OOM, worst first (at most 8).
    #[schemars(length(max = 8))]
    #[serde(default)]
    pub top_ranks: Vec<RankSummary>,
    /// GPU OOMs observed (at most 16, newest last).
    #[schemars(length(max = 16))]
    #[serde(default)]
    pub ooms: Vec<OomRecord>,
    /// GPU OOMs recorded in all, including those no longer in `ooms` (the
    /// `OOMS` column). Absent until the first one; counted by the
    /// remediation stage in the edit that adds the record to `ooms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom_count: Option<u32>,
    /// Where the worst rank's live GPU memory was allocated (file and line),
    /// from its agent's snapshot at critical, before any OOM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation_sites: Option<RankAllocationSites>,
    /// Every counted rank whose agent's snapshot was taken at critical, each
    /// with its top 4 sites: the ranks with the largest GPU peak first (then
    /// by rank), at most 16 (`criticalRanksWithSitesOmitted` counts the rest).
    #[schemars(length(max = 16))]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub critical_allocation_sites: Vec<RankAllocationSites>,
    /// Ranks with sites taken at critical left out of
    /// `criticalAllocationSites` by its bound (absent when none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub critical_ranks_with_sites_omitted: u32,
    /// Remediations performed (at most 16, newest last).
    #[schemars(length(max = 16))]
    #[serde(default)]
    pub remediations: Vec<RemediationRecord>,
    /// Per policy, every remediation that changed this workload, however old: what
    /// `maxRemediations` and the cooldown count, since `remediations` keeps only the
    /// newest 16 (at most 32 policies, least recent dropped first).
    #[schemars(length(max = 32))]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remediation_totals: Vec<RemediationTotal>,
    /// Last action taken on the job, for humans.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub last_action: Option<String>,
    /// Newest `sampledAt` among the job's reports (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub last_report_time: Option<String>,
    /// Oldest `sampledAt` among the counted ranks' reports (RFC 3339): now
    /// minus this is how long the quietest rank has been silent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub oldest_report_time: Option<String>,
    /// Conditions: `Ready`, `ReportsValid`, `ReportsCounted`, `RanksStale`.
    #[schemars(length(max = 8))]
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The analysis thresholds the Job's sidecars use, and where they come
    /// from (see docs/observability.md, "Thresholds").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thresholds: Option<ThresholdsInEffect>,
    /// The largest batch size that fits under the headroom target, computed
    /// from measurement (see `analysis::batchfit` and docs/remediation.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_recommendation: Option<BatchRecommendation>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The analysis thresholds in effect for a Job.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ThresholdsInEffect {
    /// `default` (built in), `chart` (the cluster-wide `--default-thresholds`)
    /// or `annotation` (the Job's `memprof.dev/thresholds`).
    #[schemars(length(max = 16))]
    pub source: String,
    /// Every threshold by its camelCase name (`highTtoSeconds`, ...).
    #[schemars(length(max = 32))]
    pub values: std::collections::BTreeMap<String, f64>,
    /// Why the Job's annotation was ignored, when it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub message: Option<String>,
}

/// The largest safe batch size of the job and the evidence it rests on.
/// Written by the roll-up; `scaleBatch` with `mode: fit` applies it.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BatchRecommendation {
    /// Env var holding the batch size (annotation `memprof.dev/batch-env`, default `BATCH_SIZE`).
    #[schemars(length(min = 1, max = 128))]
    pub env_var: String,
    /// The Job's batch size now (its env var's literal value), when it sets one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<u64>,
    /// Largest batch whose predicted peak stays under the headroom target; null when none fits or the evidence is too thin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recommended: Option<u64>,
    /// The next value up (recommended + 1), predicted to cross the target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_up: Option<u64>,
    /// Predicted peak at `recommended`, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_peak_bytes: Option<u64>,
    /// Predicted peak at `nextUp`, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_next_up_bytes: Option<u64>,
    /// Memory of the fullest GPU, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_bytes: Option<u64>,
    /// Fraction of `limitBytes` kept free (0.1: predicted peaks stay under 90 %).
    #[schemars(range(min = 0.0, max = 0.9))]
    pub headroom_fraction: f64,
    /// Memory that does not grow with the batch (weights, gradients, optimizer state, CUDA context), bytes; may be negative for a fit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub static_bytes: Option<i64>,
    /// Memory each sample of the batch adds, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_sample_bytes: Option<u64>,
    /// Root mean square of the fit's residuals, bytes (two batch sizes: 0, an exact line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub residual_bytes: Option<u64>,
    /// The memory model the values come from (the one `memprof sweep` uses):
    /// its curve, error margin and the batches the evidence backs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<BatchFitModel>,
    /// Where `recommended` stands relative to the evidence: `measured`,
    /// `interpolated between measured values`, or `extrapolated N below the
    /// smallest measured value M (-P%)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 160))]
    pub support: Option<String>,
    /// The batch the curve alone would allow when the evidence does not back
    /// it (further from the measured batches than a held-out check covered);
    /// shown, never acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unbacked: Option<u64>,
    /// `agentBreakdown`, `twoBatchSizes` or `insufficient`.
    #[schemars(length(min = 1, max = 32))]
    pub method: String,
    /// Why this value, or what evidence is missing.
    #[schemars(length(min = 1, max = 512))]
    pub reason: String,
    /// Peaks observed at each batch size, across the Job's recreations by memprof
    /// (at most 8, least recently seen dropped first).
    #[schemars(length(max = 8))]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub observations: Vec<BatchObservation>,
}

/// `peak = static + perSample × batch + perSampleSquared × batch²`, with
/// what backs it. Chosen by how well each candidate predicts a measured
/// batch it was not fitted on (leave-one-out); a curve with a negative
/// static part, or that under-predicts its largest batch when fitted on the
/// others, is refused.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BatchFitModel {
    /// `linear` or `quadratic`.
    #[schemars(length(max = 16))]
    pub family: String,
    /// Bytes at batch 0 (weights, gradients, optimizer state, context).
    pub static_bytes: i64,
    /// Bytes per sample.
    pub per_sample_bytes: f64,
    /// Bytes per sample squared (0 for a line).
    #[serde(default)]
    pub per_sample_squared_bytes: f64,
    /// Error allowed for in every prediction: the worst held-out error, at
    /// least the allocator's noise floor (doubled at a full step beyond the
    /// measured batches), bytes.
    pub margin_bytes: u64,
    /// Root mean square of the held-out errors, bytes; absent with two points.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_out_error_bytes: Option<u64>,
    /// Points fitted.
    pub points: u32,
    /// Smallest batch fitted (0: the agent breakdown's static part).
    pub measured_min: u64,
    /// Largest batch fitted.
    pub measured_max: u64,
    /// Smallest batch the evidence backs.
    pub backed_min: u64,
    /// Largest batch the evidence backs.
    pub backed_max: u64,
}

/// The highest GPU peak seen while the Job ran with one batch size.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BatchObservation {
    /// Batch size.
    pub batch: u64,
    /// Highest peak of the fullest GPU, bytes.
    pub peak_bytes: u64,
    /// That GPU's memory, bytes.
    pub total_bytes: u64,
}

/// Where a GPU is: rank, pod, node and GPU.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GpuLocation {
    /// Rank of the pod, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    /// Pod name.
    #[schemars(length(max = 253))]
    pub pod: String,
    /// Node name, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub node: Option<String>,
    /// NVML index of the GPU on its node.
    pub gpu_index: u32,
    /// GPU UUID.
    #[schemars(length(max = 96))]
    pub gpu_uuid: String,
}

/// One rank among the worst of the job.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RankSummary {
    /// Where the rank's worst GPU is.
    #[serde(flatten)]
    pub location: GpuLocation,
    /// Risk level of the rank's worst GPU.
    pub risk: RiskLevel,
    /// Peak memory of that GPU, in bytes.
    pub peak_bytes: u64,
    /// Total memory of that GPU, in bytes.
    pub total_bytes: u64,
    /// Predicted seconds to OOM of that GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_to_oom_seconds: Option<f64>,
    /// Growth rate of that GPU's memory, bytes per second.
    pub growth_bytes_per_second: f64,
    /// `sampledAt` of the rank's report (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub last_report_time: Option<String>,
    /// The rank's report is stale (see `ranksStale`): these are its last numbers.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stale: bool,
}

/// A rank whose report counts but has not been renewed for too long.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StaleRank {
    /// Rank of the pod, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    /// Pod name.
    #[schemars(length(max = 253))]
    pub pod: String,
    /// Node name, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub node: Option<String>,
    /// `sampledAt` of its last report (RFC 3339).
    #[schemars(length(max = 64))]
    pub last_report_time: String,
    /// The risk its last report gave (still counted in the profile's `risk`).
    pub risk: RiskLevel,
}

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

/// One rank's allocation sites, as its report carried them.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RankAllocationSites {
    /// The rank, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    /// Its pod.
    #[schemars(length(max = 253))]
    pub pod: String,
    /// The sites.
    pub sites: super::AllocationSites,
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
        super::truncate_utf8(&mut v, 256);
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
    pub checkpoint: Option<super::CheckpointOutcome>,
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

/// The job's allocator numbers, from the ranks whose in-process agent pushes.
/// Bounded: 8 ranks per list, one OOM snapshot of 4 blocks with 2 frames each.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AllocatorRollup {
    /// Ranks whose report carries allocator numbers.
    pub ranks_with_agent: u32,
    /// What grows, worst first: `leak` in any rank, else `cache`, else `none`.
    #[serde(default)]
    pub growth: super::MemoryGrowth,
    /// Ranks whose reserved memory grows as cache while allocated memory
    /// between steps is flat: not a leak (at most 8).
    #[schemars(length(max = 8))]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cache_ranks: Vec<u32>,
    /// Advice about fragmentation or allocator pressure of one rank, prefixed with the rank.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 600))]
    pub advice: Option<String>,
    /// The slowest rank's training steps per second (the one the others wait for).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub slowest_steps_per_second: Option<f64>,
    /// That rank.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slowest_rank: Option<u32>,
    /// What held the memory at the newest CUDA OOM an agent saw.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_oom: Option<AgentOomRecord>,
}

/// The newest OOM snapshot of the job, with where it happened.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AgentOomRecord {
    /// Pod that ran out of memory.
    #[schemars(length(max = 253))]
    pub pod: String,
    /// Its rank, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    /// The largest live blocks at the OOM (at most 4, 2 frames each).
    pub snapshot: super::OomSnapshotSummary,
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

    #[test]
    fn the_profile_lists_ooms_in_a_printer_column() {
        use kube::CustomResourceExt;
        let crd = serde_json::to_value(MemoryProfile::crd()).unwrap();
        let cols = &crd["spec"]["versions"][0]["additionalPrinterColumns"];
        let ooms = cols
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "OOMS")
            .expect("an OOMS column");
        assert_eq!(ooms["jsonPath"], ".status.oomCount");
        // Absent until the first OOM, so the roll-up's status applies never own it.
        let status = serde_json::to_value(MemoryProfileStatus::default()).unwrap();
        assert!(status.get("oomCount").is_none(), "{status}");
    }
}
