//! What the status keeps of individual ranks: where a GPU is, the worst and
//! the stale ranks, one rank's allocation sites and the roll-up of the ranks'
//! agents. Its own file because these are the bounded per-rank entries of a
//! status whose size must not grow with the rank count.

use crate::common::RiskLevel;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

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
    /// What that GPU's verdict says would cause its OOM, when it names a cause.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<crate::Cause>,
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
    pub sites: crate::AllocationSites,
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
    pub growth: crate::MemoryGrowth,
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
    pub snapshot: crate::OomSnapshotSummary,
}
