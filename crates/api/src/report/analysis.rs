//! The analysis results a report carries beside the allocator's numbers:
//! fragmentation over the run, the allocation-size pattern, host memory, the
//! gradient check and the reference tracker's growth (`AllocatorStats`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The allocator's cache over one interval of the run.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FragmentationPoint {
    /// Start of the interval, seconds since the Unix epoch.
    #[schemars(range(min = 0))]
    pub t: i64,
    /// Reserved bytes when the cache (reserved − allocated) was largest in the interval.
    pub reserved_bytes: u64,
    /// Allocated bytes at that moment.
    pub allocated_bytes: u64,
    /// The most bytes in inactive split blocks within the interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inactive_split_bytes: Option<u64>,
    /// Allocation retries (cumulative) at the end of the interval.
    #[serde(default)]
    pub alloc_retries: u64,
}

/// Live allocations by size: how many fall in each power-of-two bucket.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SizeBucket {
    /// Upper bound of the bucket (inclusive), bytes.
    pub upper_bytes: u64,
    /// Allocations (or free blocks) in it.
    pub count: u64,
}

/// The allocation-size pattern (seed 000's `fragment`): what sizes the
/// trainer allocates, what the cache holds free, and what that means.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AllocationSizes {
    /// `snapshot` (live blocks by requested size) or `stats` (pool counts:
    /// up to 1 MiB and above).
    #[schemars(length(max = 16))]
    pub source: String,
    /// When the agent read it (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub time: Option<String>,
    /// Live allocations by size, ascending (at most 32).
    #[schemars(length(max = 32))]
    #[serde(default)]
    pub buckets: Vec<SizeBucket>,
    /// `snapshot` only: free cached blocks by size, ascending (at most 32).
    #[schemars(length(max = 32))]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub free_buckets: Vec<SizeBucket>,
    /// The pattern in words (e.g. `mixed sizes: live allocations spread over
    /// 9 size classes from 4 KiB to 2 GiB`).
    #[schemars(length(max = 256))]
    pub pattern: String,
    /// The size class holding the most live bytes (its upper bound), bytes:
    /// what `max_split_size_mb` should stay above.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dominant_bytes: Option<u64>,
}

/// The trainer's host memory as the agent reads it, and what it means.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HostMemory {
    /// Resident set size of the trainer process, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
    /// The container's memory limit (cgroup), bytes; absent when unlimited or unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_bytes: Option<u64>,
    /// The container's working set (cgroup usage minus inactive file pages), bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_set_bytes: Option<u64>,
    /// The container's usage (page cache included), bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_bytes: Option<u64>,
    /// Sustained growth of the memory that must fit under the limit
    /// (working set, else usage, else RSS), bytes per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub growth_bytes_per_second: Option<f64>,
    /// It keeps growing faster than the host leak threshold.
    #[serde(default)]
    pub leak_suspected: bool,
    /// At that pace, seconds until the container reaches its limit (and is
    /// OOMKilled), when there is a limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub time_to_limit_seconds: Option<f64>,
    /// What to do, when something is to be done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub advice: Option<String>,
}

/// The latest gradient check: NaN/Inf, unusually large and vanishing
/// gradients. The lists name at most 4 parameters each; the counts say how
/// many there were.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GradientCheck {
    /// Step of the check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    /// Gradients checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checked: Option<u64>,
    /// Parameters whose gradient holds NaN or Inf (at most 4).
    #[schemars(length(max = 4), inner(length(max = 128)))]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub non_finite: Vec<String>,
    /// How many there were.
    #[serde(default)]
    pub non_finite_count: u64,
    /// Parameters whose gradient norm jumped above its history, largest first (at most 4).
    #[schemars(length(max = 4), inner(length(max = 128)))]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub large: Vec<String>,
    /// How many there were.
    #[serde(default)]
    pub large_count: u64,
    /// Parameters whose gradient is all but zero (at most 4).
    #[schemars(length(max = 4), inner(length(max = 128)))]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vanishing: Vec<String>,
    /// How many there were.
    #[serde(default)]
    pub vanishing_count: u64,
    /// Global L2 norm of the checked gradients; absent when one is not finite.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_norm: Option<f64>,
    /// Median of the previous checks' global norms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_norm_median: Option<f64>,
    /// The first step with a non-finite gradient.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_non_finite_step: Option<u64>,
}

/// What grew between two samples of the reference tracker: the largest
/// tensor groups and Python object types (at most 8 each).
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TrackedGrowth {
    /// Step of the older sample.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_step: Option<u64>,
    /// Step of the newer sample.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to_step: Option<u64>,
    /// Seconds between them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds: Option<f64>,
    /// Live tensors at the newer sample.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live_tensors: Option<u64>,
    /// Their bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live_tensor_bytes: Option<u64>,
    /// Tensor groups that grew, largest byte growth first (at most 8).
    #[schemars(length(max = 8))]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tensors: Vec<TensorGrowth>,
    /// Python object types that grew (at most 8).
    #[schemars(length(max = 8))]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub objects: Vec<ObjectGrowth>,
}

/// One group of live tensors that grew.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TensorGrowth {
    /// `device dtype shape`, e.g. `cuda:0 torch.float32 [1024, 1024]`.
    #[schemars(length(max = 160))]
    pub group: String,
    /// Where they were allocated, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub site: Option<String>,
    /// Growth of their count.
    pub count: i64,
    /// Growth of their bytes.
    pub bytes: i64,
}

// Two types with the push's agent::TrackedType: why is said there.
/// One Python object type that grew.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ObjectGrowth {
    /// `module.QualName`.
    #[serde(rename = "type")]
    #[schemars(length(max = 64))]
    pub type_: String,
    /// Growth of the count.
    pub count: i64,
    /// Count at the newer sample.
    pub live: u64,
}
