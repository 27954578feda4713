//! The trainer's allocator as the in-process agent pushed it
//! (`AllocatorStats`), with what it carries: the growth verdict, phase peaks,
//! the trainer's events and the snapshot of a CUDA OOM. Its own file because
//! it is the agent's half of a report, beside the NVML half (`GpuReport`) in
//! the parent and the analysis results in `analysis.rs`.

use super::analysis::{
    AllocationSizes, FragmentationPoint, GradientCheck, HostMemory, TrackedGrowth,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

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
    /// Highest bytes in inactive split blocks since the sidecar started
    /// (from the agent's per-interval peaks); with `peakAllocatedBytes`, an
    /// upper bound of what a capped allocator could not give back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_inactive_split_bytes: Option<u64>,
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

// Two types with the push's agent::Event: why is said there.
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

// Two types with the push's agent::OomSnapshot: why is said there.
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

// Two types with the push's agent::Block: why is said there.
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
