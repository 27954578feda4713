//! The push itself, as serde types: the envelope (`Push`), each device's
//! allocator statistics, the trainer's events and the OOM snapshot. Its own
//! file because these are the wire shapes a reader of docs/agent-wire.md looks
//! for; what is allowed in them (the bounds and invariants) is the parent's
//! `validate`, the optional fields of contracts B and C are in `reply.rs`
//! and `extras.rs`, the breakdown in `breakdown.rs`.

use super::{Ack, Breakdown, Grads, Host, PreOom, SitesSnapshot, Sizes, Tracking};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Why a push was pushed.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum PushKind {
    /// The periodic push of the agent's daemon thread.
    #[default]
    Sample,
    /// The last push before a CUDA out-of-memory error propagates; carries `oom`.
    Oom,
    /// The last push at interpreter exit: the trainer is done.
    Final,
}

/// One push of the agent.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Push {
    /// Format version; must be [`VERSION`](super::VERSION).
    pub version: u32,
    /// Why this push was sent.
    #[serde(default)]
    pub kind: PushKind,
    /// When the agent read the numbers: seconds since the Unix epoch.
    pub time: f64,
    /// Process id of the trainer.
    #[serde(default)]
    pub pid: u32,
    /// Global rank (torch.distributed when initialized, else `RANK`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    /// Local rank (`LOCAL_RANK`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_rank: Option<u32>,
    /// World size, when torch.distributed is initialized or `WORLD_SIZE` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world_size: Option<u32>,
    /// The step last passed to `memprof_agent.step(n)`, else the optimizer steps the agent counted (0 before the first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    /// The phase the trainer was in when the numbers were read (`with phase("forward")`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = super::MAX_NAME))]
    pub phase: Option<String>,
    /// Resident set size of the trainer process, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
    /// `torch.__version__`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = super::MAX_NAME))]
    pub torch_version: Option<String>,
    /// One entry per CUDA device the process sees.
    #[serde(default)]
    #[schemars(length(max = super::MAX_DEVICES))]
    pub devices: Vec<DeviceStats>,
    /// Events recorded with `memprof_agent.record()` since the previous push, oldest first.
    #[serde(default)]
    #[schemars(length(max = super::MAX_EVENTS))]
    pub events: Vec<Event>,
    /// Events recorded since the previous push that did not fit into `events`.
    #[serde(default)]
    pub dropped_events: u64,
    /// What held the memory at a CUDA OOM (only in `kind: oom` pushes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom: Option<OomSnapshot>,
    /// What holds the memory (`memprof_agent.breakdown`), when measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breakdown: Option<Breakdown>,
    /// The container's memory: RSS, cgroup limit and usage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<Host>,
    /// The latest gradient check (`watch_gradients`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grads: Option<Grads>,
    /// The allocation-size pattern, read at most every 10 s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sizes: Option<Sizes>,
    /// What grew between the reference tracker's last two samples (opt-in).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracking: Option<Tracking>,
    /// The allocator's state before an OOM exception unwound (only in `kind: oom` pushes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pre_oom: Option<PreOom>,
    /// Acknowledgements of directives the sidecar relayed (contract B).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = super::MAX_ACKS))]
    pub acks: Vec<Ack>,
    /// Where the live memory was allocated, taken once when the risk reached
    /// critical (allocation history on since high), before any OOM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sites: Option<SitesSnapshot>,
}

// Not the report's AllocatorStats, which is one device's numbers with the
// sidecar's verdict on them (growth, limit, advice) and what it carries.
/// One device's allocator statistics (`torch.cuda.memory_stats(i)`, read
/// once per push) and its free/total memory (`torch.cuda.mem_get_info(i)`).
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DeviceStats {
    /// CUDA ordinal as the process sees it (after `CUDA_VISIBLE_DEVICES`).
    pub index: u32,
    /// GPU UUID with NVML's `GPU-` prefix, when torch tells it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = super::MAX_UUID))]
    pub uuid: Option<String>,
    /// Product name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = super::MAX_NAME))]
    pub name: Option<String>,
    /// Bytes allocated to tensors (`allocated_bytes.all.current`).
    pub allocated_bytes: u64,
    /// Bytes the caching allocator holds from the driver (`reserved_bytes.all.current`).
    pub reserved_bytes: u64,
    /// Bytes in active blocks (`active_bytes.all.current`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_bytes: Option<u64>,
    /// Bytes in inactive split blocks (`inactive_split_bytes.all.current`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inactive_split_bytes: Option<u64>,
    /// Bytes the code asked for, before rounding (`requested_bytes.all.current`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_bytes: Option<u64>,
    /// Highest allocated bytes since the previous push (`allocated_bytes.all.peak`, then reset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_allocated_bytes: Option<u64>,
    /// Highest reserved bytes since the previous push.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_reserved_bytes: Option<u64>,
    /// Highest bytes in inactive split blocks since the previous push
    /// (`inactive_split_bytes.all.peak`, then reset): with the allocated
    /// peak, an upper bound of what a capped allocator cannot give back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_inactive_split_bytes: Option<u64>,
    /// Segments the allocator holds (`segment.all.current`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segments: Option<u64>,
    /// Allocations that failed, freed the cache and retried (`num_alloc_retries`, cumulative).
    #[serde(default)]
    pub alloc_retries: u64,
    /// CUDA OOMs the allocator raised (`num_ooms`, cumulative).
    #[serde(default)]
    pub num_ooms: u64,
    /// Free device memory as the driver sees it (`mem_get_info`), bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub free_bytes: Option<u64>,
    /// Total device memory (`mem_get_info`), bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_bytes: Option<u64>,
}

// Not the report's AgentEvent, which keeps the newest 8 with an RFC 3339 time
// and without the memory peaks: this is what the agent sends (up to 32).
/// One `memprof_agent.record(name, note)` event.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// When it was recorded: seconds since the Unix epoch.
    pub t: f64,
    /// Event name.
    #[schemars(length(max = super::MAX_NAME))]
    pub name: String,
    /// Free text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = super::MAX_NOTE))]
    pub note: Option<String>,
    /// Step at the time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    /// Phase at the time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = super::MAX_NAME))]
    pub phase: Option<String>,
    /// Allocated bytes of the current device, only when recorded with `memory=True`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated_bytes: Option<u64>,
    /// Reserved bytes of the current device, only when recorded with `memory=True`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved_bytes: Option<u64>,
    /// Highest allocated bytes of the run so far, as far as the agent saw.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_allocated_bytes: Option<u64>,
    /// Highest reserved bytes of the run so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_reserved_bytes: Option<u64>,
    /// Seconds since `memprof_agent` was imported (a monotonic clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elapsed: Option<f64>,
    /// `record_detailed()`'s counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<EventDetail>,
}

/// What `memprof_agent.record_detailed()` counted.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EventDetail {
    /// Tensors described.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensors: Option<u64>,
    /// Their bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensor_bytes: Option<u64>,
    /// Parameters of the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<u64>,
    /// Of which trainable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trainable_parameters: Option<u64>,
}

// A string in a report (OomSnapshotSummary and AllocationSites `source`): the
// CRD takes any short string there and the operator must read every report,
// also one the sidecar did not write. `as_str` is the one spelling.
/// Where an OOM snapshot's blocks came from.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SnapshotSource {
    /// `torch.cuda.memory._snapshot()` with history recording on: blocks carry stack frames.
    History,
    /// The segment table of `_snapshot()` without history: blocks, no frames.
    Segments,
    /// No snapshot could be taken.
    #[default]
    None,
}

impl SnapshotSource {
    /// The name on the wire (`history`, `segments`, `none`), which a
    /// report's `source` fields carry as a string.
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotSource::History => "history",
            SnapshotSource::Segments => "segments",
            SnapshotSource::None => "none",
        }
    }
}

// Not the report's OomSnapshotSummary, which is bounded for etcd (8 blocks of 4
// frames as text, a 512-byte message) and dated: this is the agent's whole snapshot.
/// What held the memory at a CUDA out-of-memory error.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct OomSnapshot {
    /// Device that ran out, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<u32>,
    /// Bytes the failing allocation asked for, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_bytes: Option<u64>,
    /// The exception's message, truncated.
    #[serde(default)]
    #[schemars(length(max = super::MAX_MESSAGE))]
    pub message: String,
    /// Where the blocks came from.
    #[serde(default)]
    pub source: SnapshotSource,
    /// The largest live blocks, largest first.
    #[serde(default)]
    #[schemars(length(max = super::MAX_BLOCKS))]
    pub blocks: Vec<Block>,
}

// Not the report's OomBlock, whose frames are `file:line function` text (at most 4).
/// One live allocator block, or the live blocks of one allocation site.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Block {
    /// Block size, bytes.
    pub size_bytes: u64,
    /// Bytes the code asked for, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_bytes: Option<u64>,
    /// Allocator state, e.g. `active_allocated`.
    #[serde(default)]
    #[schemars(length(max = super::MAX_NAME))]
    pub state: String,
    /// With stack frames, live blocks allocated at the same place are summed
    /// into one entry (`sizeBytes` is their total): how many they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// Where it was allocated, innermost first (empty without history recording).
    #[serde(default)]
    #[schemars(length(max = super::MAX_FRAMES))]
    pub frames: Vec<Frame>,
}

/// One stack frame of an allocation.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Frame {
    /// Source file.
    #[schemars(length(max = super::MAX_FRAME_TEXT))]
    pub filename: String,
    /// Line number.
    #[serde(default)]
    pub line: u32,
    /// Function name.
    #[serde(default)]
    #[schemars(length(max = super::MAX_FRAME_TEXT))]
    pub name: String,
}
