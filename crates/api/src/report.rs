//! `MemoryReport`: one per pod, written by that pod's sidecar.
//!
//! Why the data sits in `spec`: the sidecar is the only writer of the
//! observations, so a single server-side apply per update (not create +
//! status patch) keeps the write budget at one write per report, and the
//! sidecar's RBAC needs only `memoryreports`, not `memoryreports/status`.
//! The status subresource is the other direction: the operator's
//! `directives` for the pod's trainer, which the pod itself cannot write.

use super::common::{Condition, DataSource, RiskLevel};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

mod analysis;
mod checkpoint;
mod sites;
pub mod timeline;
pub use analysis::{
    AllocationSizes, FragmentationPoint, GradientCheck, HostMemory, ObjectGrowth, SizeBucket,
    TensorGrowth, TrackedGrowth,
};
pub use checkpoint::{
    step_in, Checkpoint, CheckpointOutcome, CHECKPOINT_EVENT, MAX_CHECKPOINT_NOTE,
};
pub use sites::{
    AllocationSite, AllocationSites, MemoryReportStatus, MAX_CRITICAL_RANK_SITES,
    MAX_CRITICAL_SITE_RANKS, MAX_REPORT_DIRECTIVES, MAX_REPORT_SITES, MAX_SITE_FILE,
    MAX_SITE_FUNCTION,
};
pub use timeline::{TimelinePoint, MAX_PACKED_TIMELINE, PACKED_TIMELINE_PATTERN};

/// What one pod's sidecar saw of the pod's GPUs.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[kube(
    group = "memprof.dev",
    version = "v1alpha1",
    kind = "MemoryReport",
    namespaced,
    shortname = "mrep",
    category = "memprof",
    status = "MemoryReportStatus",
    printcolumn = r#"{"name":"POD","type":"string","jsonPath":".spec.podName"}"#,
    printcolumn = r#"{"name":"RANK","type":"integer","jsonPath":".spec.rank"}"#,
    printcolumn = r#"{"name":"GPUS","type":"integer","jsonPath":".spec.summary.gpuCount"}"#,
    printcolumn = r#"{"name":"USED","type":"string","jsonPath":".spec.summary.used"}"#,
    printcolumn = r#"{"name":"PEAK","type":"string","jsonPath":".spec.summary.peak"}"#,
    printcolumn = r#"{"name":"RISK","type":"string","jsonPath":".spec.summary.risk"}"#,
    printcolumn = r#"{"name":"TTO","type":"string","jsonPath":".spec.summary.timeToOom"}"#,
    printcolumn = r#"{"name":"SOURCE","type":"string","jsonPath":".spec.summary.source"}"#,
    printcolumn = r#"{"name":"AGE","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct MemoryReportSpec {
    /// Name of the pod whose GPUs this report describes.
    #[schemars(length(min = 1, max = 253))]
    pub pod_name: String,
    /// Node the pod runs on, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub node_name: Option<String>,
    /// Job the pod belongs to, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub job_name: Option<String>,
    /// Rank of the pod in its job (completion index, `RANK`, or the pod name's ordinal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 1_000_000))]
    pub rank: Option<u32>,
    /// When the newest sample in this report was taken (RFC 3339). The operator
    /// ignores a report dated more than a minute in the future.
    #[schemars(length(min = 1, max = 64))]
    pub sampled_at: String,
    /// Sampling interval, in milliseconds.
    #[schemars(range(min = 1, max = 3_600_000))]
    pub interval_ms: u64,
    /// The sidecar's heartbeat: while it runs, it writes this report at
    /// least this often (seconds, rounded up) even when nothing changes. The
    /// operator calls a rank stale when its report is older than two
    /// heartbeats plus 30 s (60 s assumed when absent; at most 600 s believed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 86_400))]
    pub heartbeat_seconds: Option<u64>,
    /// Roll-up of all GPUs of the pod (what `kubectl get memoryreports` shows).
    pub summary: ReportSummary,
    /// One entry per GPU visible to the pod. Empty when no GPU is visible;
    /// the `GpuVisible` condition then says why.
    #[schemars(length(max = 16))]
    #[serde(default)]
    pub gpus: Vec<GpuReport>,
    /// Allocator statistics pushed by the in-process agent, when it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocator: Option<AllocatorStats>,
    /// What holds the memory (`memprof_agent.breakdown`), as the in-process
    /// agent last pushed it: of the pod's trainer process with the largest
    /// static + activation bytes when the pod runs several.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breakdown: Option<MemoryBreakdown>,
    /// Conditions: `GpuVisible` (with the discovery method as reason).
    #[schemars(length(max = 8))]
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The newest acknowledgements of directives by the pod's trainer
    /// processes (contract B), at most 16, oldest first, one per directive
    /// id and process.
    #[schemars(length(max = 16))]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub agent_acks: Vec<AgentAck>,
    /// Where the trainer's live GPU memory was allocated (file and line), from
    /// the agent's snapshot at critical; the newest one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation_sites: Option<AllocationSites>,
    /// The newest checkpoint the pod's trainer announced (agent event
    /// `checkpoint`), its time never later than the push that carried it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_checkpoint: Option<Checkpoint>,
}

/// A trainer process's acknowledgement of a directive, as its agent pushed it.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AgentAck {
    /// The directive's id.
    #[schemars(length(min = 1, max = 64))]
    pub id: String,
    /// What the trainer did, in its own words.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 128))]
    pub action: String,
    /// Whether it did what was asked.
    pub ok: bool,
    /// When the sidecar received it (RFC 3339).
    #[schemars(length(max = 64))]
    pub time: String,
    /// The trainer process's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// The trainer process's rank, as its agent told it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 1_000_000))]
    pub rank: Option<u32>,
}

/// Pod-level roll-up of a report.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ReportSummary {
    /// Number of GPUs reported.
    #[schemars(range(max = 16))]
    pub gpu_count: u32,
    /// Worst risk level among the pod's GPUs.
    pub risk: RiskLevel,
    /// Smallest predicted time to OOM among the pod's GPUs, for humans (e.g. `4m20s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub time_to_oom: Option<String>,
    /// Used memory of the fullest GPU, for humans (e.g. `61.2GiB (76%)`).
    #[schemars(length(max = 64))]
    pub used: String,
    /// Peak memory of the fullest GPU, for humans.
    #[schemars(length(max = 64))]
    pub peak: String,
    /// Where the numbers came from.
    pub source: DataSource,
}

/// What one GPU looked like.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GpuReport {
    /// NVML index of the GPU on its node.
    #[schemars(range(max = 64))]
    pub index: u32,
    /// GPU UUID (`GPU-…`), stable across reboots.
    #[schemars(length(max = 96))]
    pub uuid: String,
    /// Product name, e.g. `NVIDIA H100 80GB HBM3`.
    #[schemars(length(max = 96))]
    pub model: String,
    /// Total memory, in bytes.
    pub total_bytes: u64,
    /// Memory in use at the last sample, in bytes.
    pub used_bytes: u64,
    /// Highest used memory seen since the sidecar started, in bytes (tracked at every sample).
    pub peak_bytes: u64,
    /// GPU utilization in percent, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 100))]
    pub utilization_percent: Option<u32>,
    /// Growth rate of the upper memory envelope, in bytes per second (negative when shrinking).
    pub growth_bytes_per_second: f64,
    /// Predicted seconds until used memory reaches the total, when memory is growing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub time_to_oom_seconds: Option<f64>,
    /// OOM risk of this GPU.
    pub risk: RiskLevel,
    /// Confidence in the risk level, 0 to 1.
    #[schemars(range(min = 0.0, max = 1.0))]
    pub confidence: f64,
    /// The lower envelope (memory between steps) keeps growing: memory is being retained.
    pub leak_suspected: bool,
    /// A sudden jump of used memory was seen in the analysis window.
    pub spike_detected: bool,
    /// Fraction of reserved memory not allocated to tensors (0 to 1), when the agent reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub fragmentation: Option<f64>,
    /// Where the numbers came from.
    pub source: DataSource,
    /// Where the risk, growth, time to OOM and leak flag came from when not
    /// from `source`: `agent` when the in-process agent's allocator numbers
    /// (allocated memory against the allocator's real limit) replaced NVML's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assessed_from: Option<DataSource>,
    /// Downsampled recent history, oldest first, packed: points `T:MAX:MIN`
    /// separated by spaces, `T` the first point's start in Unix seconds then
    /// seconds since the previous point, `MAX`/`MIN` the highest and lowest
    /// use in MiB (e.g. `1790000000:30721:15360 10:30722:15360`). The sidecar
    /// writes at most 60 points. One string, not 60 objects, because the API
    /// server checks a report value by value (docs/benchmarks.md, "Report writes").
    #[serde(
        default,
        rename = "packedTimeline",
        with = "timeline::packed",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(with = "String", length(max = timeline::MAX_PACKED_TIMELINE))]
    #[schemars(regex(pattern = timeline::PACKED_TIMELINE_PATTERN))]
    pub timeline: Vec<TimelinePoint>,
    /// Deprecated: the timeline as objects, as sidecars before
    /// `packedTimeline` wrote it; still accepted so that a sidecar injected
    /// before an upgrade goes on reporting. Readers take `packedTimeline`
    /// when a report has both.
    #[schemars(length(max = 60))]
    #[serde(default, rename = "timeline", skip_serializing_if = "Vec::is_empty")]
    pub legacy_timeline: Vec<TimelinePoint>,
}

impl GpuReport {
    /// The GPU's timeline points, from whichever form the report carries.
    pub fn points(&self) -> &[TimelinePoint] {
        if self.timeline.is_empty() {
            &self.legacy_timeline
        } else {
            &self.timeline
        }
    }
}

/// The trainer's allocator, as the in-process agent sees it (PyTorch's caching
/// allocator), and what the sidecar concluded from it. The numbers are those
/// of the device the trainer uses most (the highest allocated); per-GPU risk
/// and time to OOM are in `gpus`. Bounded: at most 8 phases, 8 events and an
/// OOM snapshot of 8 blocks with 4 frames each.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AllocatorStats {
    /// Bytes allocated to tensors.
    pub allocated_bytes: u64,
    /// Bytes reserved by the caching allocator.
    pub reserved_bytes: u64,
    /// Bytes in active blocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_bytes: Option<u64>,
    /// Bytes in inactive, split blocks (the fragmentation the allocator cannot return).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inactive_split_bytes: Option<u64>,
    /// Allocation retries after freeing cached blocks (a sign of pressure), cumulative.
    #[serde(default)]
    pub alloc_retries: u64,
    /// CUDA OOMs the allocator raised, cumulative.
    #[serde(default)]
    pub num_ooms: u64,
    /// Training step number last reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    /// Training phase last reported (e.g. `forward`, `backward`, `optimizer`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub phase: Option<String>,
    /// CUDA ordinal of the device these numbers are about, as the trainer sees it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 64))]
    pub device: Option<u32>,
    /// Highest allocated bytes since the sidecar started (from the agent's per-interval peaks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_allocated_bytes: Option<u64>,
    /// What allocated memory can grow to before a CUDA OOM: free device memory
    /// plus the allocator's reserved bytes (its cache is reclaimable), bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_bytes: Option<u64>,
    /// What grows: `leak` (allocated memory between steps, at the same phase),
    /// `cache` (reserved memory, with allocated memory between steps flat) or `none`.
    #[serde(default)]
    pub growth: MemoryGrowth,
    /// Growth of allocated memory between steps (the lower envelope), bytes per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated_growth_bytes_per_second: Option<f64>,
    /// Growth of reserved memory, bytes per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved_growth_bytes_per_second: Option<f64>,
    /// Share of reserved memory not allocated to tensors, 0 to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub fragmentation: Option<f64>,
    /// Share of reserved memory in inactive split blocks, 0 to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub inactive_split_fraction: Option<f64>,
    /// Allocation retries within the last minute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recent_alloc_retries: Option<u64>,
    /// What to do about fragmentation or allocator pressure, when there is something to do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub advice: Option<String>,
    /// Training steps per second over the last minute, from the agent's step markers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub steps_per_second: Option<f64>,
    /// Highest allocated bytes seen per phase (sampled at the agent's pushes), at most 8.
    #[schemars(length(max = 8))]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phase_peaks: Vec<PhasePeak>,
    /// Resident set size of the trainer process, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
    /// The newest events the trainer recorded (`memprof_agent.record`), at most 8, oldest first.
    #[schemars(length(max = 8))]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<AgentEvent>,
    /// What held the memory at the newest CUDA OOM the agent saw.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom: Option<OomSnapshotSummary>,
    /// Set after a CUDA OOM (RFC 3339 time of the OOM): growth, fragmentation,
    /// advice and the GPU's risk are the verdict from just before it, read
    /// before the exception unwound; what the allocator showed after the
    /// unwinding (the failing step's tensors freed) is not evidence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub verdict_before_oom: Option<String>,
    /// Fragmentation over the run, oldest first: at most 30 points, each the
    /// largest cache of an interval (points are merged pairwise as the run
    /// grows, so the whole run fits).
    #[schemars(length(max = 30))]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fragmentation_trend: Vec<FragmentationPoint>,
    /// The allocation-size pattern the agent last read (`sizes`), when it pushes one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation_sizes: Option<AllocationSizes>,
    /// The trainer's host memory (process RSS, its container's cgroup):
    /// growth, leak, time to the container's limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<HostMemory>,
    /// The trainer's latest gradient check (`memprof_agent.watch_gradients`), when on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gradients: Option<GradientCheck>,
    /// What grew between the reference tracker's last two samples
    /// (`memprof_agent.track`), when on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracking: Option<TrackedGrowth>,
}

/// What grows in the allocator.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum MemoryGrowth {
    /// Nothing grows, or not for long enough to tell.
    #[default]
    None,
    /// Allocated memory between steps keeps growing: tensors are being kept.
    Leak,
    /// Reserved memory grows while allocated memory between steps stays flat:
    /// the caching allocator keeps more (e.g. longer sequences), not a leak.
    Cache,
}

/// The highest allocated memory seen in one training phase.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PhasePeak {
    /// Phase name (`memprof_agent.phase`).
    #[schemars(length(max = 64))]
    pub phase: String,
    /// Highest allocated bytes sampled in that phase.
    pub allocated_bytes: u64,
}

/// One event the trainer recorded.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AgentEvent {
    /// When (RFC 3339).
    #[schemars(length(max = 64))]
    pub time: String,
    /// Event name.
    #[schemars(length(max = 64))]
    pub name: String,
    /// Note.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub note: Option<String>,
    /// Step at the time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    /// Allocated bytes at the time, when recorded with memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated_bytes: Option<u64>,
}

/// What held the memory at a CUDA OOM: the largest live blocks.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct OomSnapshotSummary {
    /// When the agent saw it (RFC 3339).
    #[schemars(length(max = 64))]
    pub time: String,
    /// CUDA ordinal of the device that ran out, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<u32>,
    /// Bytes the failing allocation asked for, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_bytes: Option<u64>,
    /// The error message, truncated.
    #[schemars(length(max = 512))]
    #[serde(default)]
    pub message: String,
    /// `history` (blocks carry the allocating stack), `segments` (no stacks:
    /// turn on MEMPROF_AGENT_RECORD_HISTORY) or `none`.
    #[schemars(length(max = 16))]
    pub source: String,
    /// The largest live blocks, largest first (at most 8).
    #[schemars(length(max = 8))]
    #[serde(default)]
    pub blocks: Vec<OomBlock>,
}

/// One live block at an OOM, or the live blocks of one allocation site.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct OomBlock {
    /// Block size, bytes; with `count`, the total of the blocks allocated at these frames.
    pub size_bytes: u64,
    /// How many live blocks were allocated at these frames, when more than one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// Where it was allocated, innermost trainer frame first, as `file:line function` (at most 4).
    #[schemars(length(max = 4), inner(length(max = 256)))]
    #[serde(default)]
    pub frames: Vec<String>,
}

/// What holds a trainer's GPU memory, measured by the in-process agent
/// (`memprof_agent.breakdown`): parameters, gradients, optimizer state,
/// per-sample gradients and the activations' peak above them, by module type.
/// Bounded: 6 module types, 16 flags, 32 module phases.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MemoryBreakdown {
    /// Pod the breakdown is of (in a MemoryProfile; a MemoryReport is the pod's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub pod: Option<String>,
    /// Rank: in a MemoryReport the trainer process's rank as the agent told it;
    /// in a MemoryProfile the pod's rank in its Job (as `bottleneck.rank`),
    /// else the process's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 1_000_000))]
    pub rank: Option<u32>,
    /// Process id of the trainer process measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// When the agent pushed it (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub time: Option<String>,
    /// Training step at which it was measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    /// Parameters of the model.
    pub total_parameters: u64,
    /// Parameters that require gradients.
    pub trainable_parameters: u64,
    /// Bytes held by parameters.
    pub parameters_bytes: u64,
    /// Bytes held by gradients (`.grad`).
    pub gradients_bytes: u64,
    /// Bytes held by optimizer state (e.g. Adam's two moments).
    pub optimizer_bytes: u64,
    /// Bytes held by per-sample gradients (Opacus `grad_sample`), when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_sample_gradients_bytes: Option<u64>,
    /// Bytes that do not depend on the batch: parameters + gradients +
    /// optimizer state (+ per-sample gradients).
    pub static_bytes: u64,
    /// Peak allocated bytes of the measured step above `staticBytes`: what
    /// activations (and temporaries) add, which grows with the batch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activations_peak_bytes: Option<u64>,
    /// Batch size (samples per step) of the measured step, when the trainer told it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_size: Option<u64>,
    /// Bytes per module type, recognised structurally (at most 6).
    #[schemars(length(max = 6))]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub by_module_type: Vec<ModuleTypeBytes>,
    /// Parameters holding NaN or Inf, or unusually large for their layer (at most 16).
    #[schemars(length(max = 16))]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flags: Vec<ParameterFlag>,
    /// Memory each top-level module adds in forward and backward
    /// (`memprof_agent.trace_modules`, opt-in; at most 32).
    #[schemars(length(max = 32))]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phases: Vec<ModulePhase>,
    /// Peak allocated bytes of the optimizer step above what it started with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimizer_step_peak_bytes: Option<u64>,
}

/// A kind of module, recognised by its structure, not by one model's names.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ModuleType {
    /// Attention projections.
    Attention,
    /// Feed-forward (MLP) layers.
    Mlp,
    /// Embeddings.
    Embedding,
    /// Normalisation layers.
    Norm,
    /// LoRA adapters.
    Lora,
    /// Everything else.
    #[default]
    Other,
}

impl ModuleType {
    /// Every module type, in display order.
    pub const ALL: [ModuleType; 6] = [
        ModuleType::Attention,
        ModuleType::Mlp,
        ModuleType::Embedding,
        ModuleType::Norm,
        ModuleType::Lora,
        ModuleType::Other,
    ];

    /// The name on the wire (`attention`, `mlp`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            ModuleType::Attention => "attention",
            ModuleType::Mlp => "mlp",
            ModuleType::Embedding => "embedding",
            ModuleType::Norm => "norm",
            ModuleType::Lora => "lora",
            ModuleType::Other => "other",
        }
    }

    /// The module type named `s` on the wire.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }
}

/// Memory held by the parameters of one module type.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ModuleTypeBytes {
    /// The module type.
    #[serde(rename = "type")]
    pub type_: ModuleType,
    /// Parameters of modules of this type.
    pub parameters: u64,
    /// Bytes of those parameters.
    pub parameters_bytes: u64,
    /// Bytes of their gradients.
    pub gradients_bytes: u64,
    /// Bytes of their optimizer state.
    pub optimizer_bytes: u64,
}

/// What is wrong with a parameter.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum FlagKind {
    /// It holds NaN.
    #[default]
    Nan,
    /// It holds an infinity.
    Inf,
    /// It is unusually large for its layer.
    Large,
}

impl FlagKind {
    /// Every kind.
    pub const ALL: [FlagKind; 3] = [FlagKind::Nan, FlagKind::Inf, FlagKind::Large];

    /// The name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            FlagKind::Nan => "nan",
            FlagKind::Inf => "inf",
            FlagKind::Large => "large",
        }
    }

    /// The kind named `s` on the wire.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

/// A parameter the agent flagged.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ParameterFlag {
    /// What is wrong.
    pub kind: FlagKind,
    /// The parameter's name (`named_parameters()`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 128))]
    pub parameter: String,
    /// Detail, e.g. its size against its layer's median.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 256))]
    pub note: String,
}

/// What one top-level module adds to allocated memory.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ModulePhase {
    /// The module's name (`named_children()`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 128))]
    pub module: String,
    /// Bytes its forward leaves allocated (after minus before, at least 0).
    pub forward_bytes: u64,
    /// Peak bytes its backward adds above the allocated bytes at its start.
    pub backward_bytes: u64,
}
