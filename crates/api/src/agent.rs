//! The push format of the in-process agent (`agent/python/`, `memprof_agent`):
//! what it `POST`s to the sidecar's `/v1/agent`, version 1. docs/agent.md
//! documents every field; this module is the contract's other half: serde
//! types and a pure [`validate`] that names what is wrong.
//!
//! Why validation beyond JSON: the numbers feed the analysis, and a push is
//! input from a process the sidecar does not control. Every list and string
//! is bounded (so one push is bounded, see [`MAX_BODY_BYTES`]), and the
//! allocator's own invariants (allocated <= reserved, free <= total, …) are
//! checked, so a buggy or foreign sender gets a 400 with the reason instead of
//! steering a report.
//!
//! Unknown fields are ignored (a newer agent may add optional fields within
//! version 1); a different `version` is refused.

use serde::{Deserialize, Serialize};

mod breakdown;
mod extras;
pub use breakdown::{Breakdown, Flag, ModulePhase, ModuleTypeBytes};
pub use extras::{
    Grads, Host, PreOom, PreOomSource, Sizes, SizesSource, TrackedTensors, TrackedType, Tracking,
    MAX_GRAD_NAME, MAX_GRAD_NAMES, MAX_SHAPE_DIMS, MAX_SITE, MAX_SIZE_BOUND, MAX_SIZE_BUCKETS,
    MAX_TAG, MAX_TRACKED,
};
mod reply;
pub use reply::{
    Ack, Directive, DirectiveKind, PushReply, Verdict, MAX_ACKS, MAX_ACK_ACTION, MAX_DIRECTIVES,
    MAX_DIRECTIVE_ID, MAX_DIRECTIVE_REASON,
};

/// The push format version this sidecar speaks.
pub const VERSION: u32 = 1;
/// Largest body accepted, bytes. A periodic push stays well under 64 KiB;
/// the bounds below put the largest possible push (an OOM push with every
/// list and string at its bound, text without JSON escapes) under this cap.
pub const MAX_BODY_BYTES: u64 = 256 * 1024;
/// At most this many devices per push (a node has at most 16 GPUs).
pub const MAX_DEVICES: usize = 16;
/// At most this many events per push.
pub const MAX_EVENTS: usize = 32;
/// At most this many blocks in an OOM snapshot.
pub const MAX_BLOCKS: usize = 16;
/// At most this many stack frames per block.
pub const MAX_FRAMES: usize = 8;
/// Longest name (phase, event name, device name, block state, torch version), bytes.
pub const MAX_NAME: usize = 64;
/// Longest event note, bytes.
pub const MAX_NOTE: usize = 256;
/// Longest frame file name or function name, bytes.
pub const MAX_FRAME_TEXT: usize = 256;
/// Longest OOM message, bytes.
pub const MAX_MESSAGE: usize = 1024;
/// Longest device UUID, bytes.
pub const MAX_UUID: usize = 96;
/// At most this many `breakdown.byModuleType` entries (one per module type).
pub const MAX_MODULE_TYPES: usize = 6;
/// At most this many `breakdown.flags`.
pub const MAX_FLAGS: usize = 16;
/// At most this many `breakdown.phases` (top-level modules traced).
pub const MAX_MODULE_PHASES: usize = 32;
/// Longest parameter name of a flag, or module name of a phase, bytes.
pub const MAX_PARAMETER_NAME: usize = 128;
/// Longest flag note, bytes.
pub const MAX_FLAG_NOTE: usize = 256;

/// Why a push was pushed.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
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
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Push {
    /// Format version; must be [`VERSION`].
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
    /// The step last passed to `memprof_agent.step(n)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    /// The phase the trainer was in when the numbers were read (`with phase("forward")`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Resident set size of the trainer process, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
    /// `torch.__version__`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub torch_version: Option<String>,
    /// One entry per CUDA device the process sees.
    #[serde(default)]
    pub devices: Vec<DeviceStats>,
    /// Events recorded with `memprof_agent.record()` since the previous push, oldest first.
    #[serde(default)]
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
    pub acks: Vec<Ack>,
}

/// One device's allocator statistics (`torch.cuda.memory_stats(i)`, read
/// once per push) and its free/total memory (`torch.cuda.mem_get_info(i)`).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DeviceStats {
    /// CUDA ordinal as the process sees it (after `CUDA_VISIBLE_DEVICES`).
    pub index: u32,
    /// GPU UUID with NVML's `GPU-` prefix, when torch tells it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// Product name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
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

/// One `memprof_agent.record(name, note)` event.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// When it was recorded: seconds since the Unix epoch.
    pub t: f64,
    /// Event name.
    pub name: String,
    /// Free text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Step at the time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    /// Phase at the time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
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
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
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

/// Where an OOM snapshot's blocks came from.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
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

/// What held the memory at a CUDA out-of-memory error.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
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
    pub message: String,
    /// Where the blocks came from.
    #[serde(default)]
    pub source: SnapshotSource,
    /// The largest live blocks, largest first.
    #[serde(default)]
    pub blocks: Vec<Block>,
}

/// One live allocator block, or the live blocks of one allocation site.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Block {
    /// Block size, bytes.
    pub size_bytes: u64,
    /// Bytes the code asked for, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_bytes: Option<u64>,
    /// Allocator state, e.g. `active_allocated`.
    #[serde(default)]
    pub state: String,
    /// With stack frames, live blocks allocated at the same place are summed
    /// into one entry (`sizeBytes` is their total): how many they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// Where it was allocated, innermost first (empty without history recording).
    #[serde(default)]
    pub frames: Vec<Frame>,
}

/// One stack frame of an allocation.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Frame {
    /// Source file.
    pub filename: String,
    /// Line number.
    #[serde(default)]
    pub line: u32,
    /// Function name.
    #[serde(default)]
    pub name: String,
}

/// Why a push was refused. Messages say what the sender must change.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum Error {
    /// Not JSON of the push format.
    #[error("not a memprof agent push (see docs/agent.md): {0}")]
    Parse(String),
    /// A version this sidecar does not speak.
    #[error("push version {got} is not supported: this sidecar speaks version {VERSION}; upgrade the sidecar or pin the agent")]
    Version {
        /// The version sent.
        got: u32,
    },
    /// A list over its bound.
    #[error("{what} has {count} entries, at most {max} are accepted")]
    TooMany {
        /// Which list.
        what: String,
        /// Entries sent.
        count: usize,
        /// The bound.
        max: usize,
    },
    /// A string over its bound.
    #[error("{what} is {len} bytes long, at most {max} are accepted")]
    TooLong {
        /// Which string.
        what: String,
        /// Its length.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// A number that is not finite or not positive where it must be.
    #[error("{what} must be a finite positive number, got {value}")]
    NotFinite {
        /// Which number.
        what: &'static str,
        /// The value sent.
        value: f64,
    },
    /// Two entries for one device.
    #[error("device {index} appears twice")]
    DuplicateDevice {
        /// The repeated index.
        index: u32,
    },
    /// Numbers the allocator cannot produce together.
    #[error("device {index}: {why}")]
    Inconsistent {
        /// Device index.
        index: u32,
        /// Which invariant is broken.
        why: String,
    },
    /// An `oom` push without its snapshot, or a snapshot on another kind.
    #[error("an oom snapshot belongs in a push of kind oom, and every oom push carries one")]
    OomMismatch,
    /// A string that must not be empty.
    #[error("{what} is empty")]
    Empty {
        /// Which string.
        what: String,
    },
    /// A breakdown whose numbers cannot all be true.
    #[error("breakdown: {why}; send the numbers memprof_agent.breakdown measured (docs/agent.md)")]
    Breakdown {
        /// Which field and which invariant.
        why: String,
    },
    /// A `host`, `grads`, `sizes`, `tracking` or `preOom` field out of its
    /// bounds or inconsistent.
    #[error("{why}; send the fields as docs/agent.md describes them")]
    Extra {
        /// Which field and which invariant.
        why: String,
    },
    /// `preOom` in a push that is not an OOM push.
    #[error("preOom belongs only in a push of kind oom")]
    PreOomMismatch,
}

/// Parses and validates a push body.
pub fn parse(body: &[u8]) -> Result<Push, Error> {
    let push: Push = serde_json::from_slice(body).map_err(|e| Error::Parse(e.to_string()))?;
    validate(&push)?;
    Ok(push)
}

fn bound_str(what: impl Fn() -> String, s: &str, max: usize) -> Result<(), Error> {
    if s.len() > max {
        return Err(Error::TooLong {
            what: what(),
            len: s.len(),
            max,
        });
    }
    Ok(())
}

fn bound_opt(what: impl Fn() -> String, s: &Option<String>, max: usize) -> Result<(), Error> {
    s.as_deref().map_or(Ok(()), |s| bound_str(what, s, max))
}

fn bound_len(what: &str, count: usize, max: usize) -> Result<(), Error> {
    if count > max {
        return Err(Error::TooMany {
            what: what.to_string(),
            count,
            max,
        });
    }
    Ok(())
}

fn positive_time(what: &'static str, t: f64) -> Result<(), Error> {
    if !(t.is_finite() && t > 0.0) {
        return Err(Error::NotFinite { what, value: t });
    }
    Ok(())
}

/// Checks a push against the format's bounds and the allocator's invariants.
pub fn validate(p: &Push) -> Result<(), Error> {
    if p.version != VERSION {
        return Err(Error::Version { got: p.version });
    }
    positive_time("time", p.time)?;
    bound_opt(|| "phase".into(), &p.phase, MAX_NAME)?;
    bound_opt(|| "torchVersion".into(), &p.torch_version, MAX_NAME)?;
    bound_len("devices", p.devices.len(), MAX_DEVICES)?;
    let mut seen = Vec::with_capacity(p.devices.len());
    for d in &p.devices {
        if seen.contains(&d.index) {
            return Err(Error::DuplicateDevice { index: d.index });
        }
        seen.push(d.index);
        validate_device(d)?;
    }
    validate_events(&p.events)?;
    if (p.kind == PushKind::Oom) != p.oom.is_some() {
        return Err(Error::OomMismatch);
    }
    if let Some(oom) = &p.oom {
        validate_oom(oom)?;
    }
    if let Some(b) = &p.breakdown {
        breakdown::validate(b)?;
    }
    validate_extras(p)
}

fn validate_events(events: &[Event]) -> Result<(), Error> {
    bound_len("events", events.len(), MAX_EVENTS)?;
    for (i, e) in events.iter().enumerate() {
        positive_time("events[].t", e.t)?;
        bound_str(|| format!("events[{i}].name"), &e.name, MAX_NAME)?;
        bound_opt(|| format!("events[{i}].note"), &e.note, MAX_NOTE)?;
        bound_opt(|| format!("events[{i}].phase"), &e.phase, MAX_NAME)?;
        if e.elapsed.is_some_and(|x| !(x.is_finite() && x >= 0.0)) {
            return Err(Error::NotFinite {
                what: "events[].elapsed",
                value: e.elapsed.unwrap_or_default(),
            });
        }
    }
    Ok(())
}

/// The fields of contract C: each optional, each bounded.
fn validate_extras(p: &Push) -> Result<(), Error> {
    if let Some(h) = &p.host {
        extras::validate_host(h)?;
    }
    if let Some(g) = &p.grads {
        extras::validate_grads(g)?;
    }
    if let Some(s) = &p.sizes {
        extras::validate_sizes(s)?;
    }
    if let Some(t) = &p.tracking {
        extras::validate_tracking(t)?;
    }
    if let Some(pre) = &p.pre_oom {
        if p.kind != PushKind::Oom {
            return Err(Error::PreOomMismatch);
        }
        extras::validate_pre_oom(pre)?;
    }
    reply::validate_acks(&p.acks)?;
    Ok(())
}

fn validate_device(d: &DeviceStats) -> Result<(), Error> {
    let i = d.index;
    bound_opt(|| format!("devices[{i}].uuid"), &d.uuid, MAX_UUID)?;
    bound_opt(|| format!("devices[{i}].name"), &d.name, MAX_NAME)?;
    let broken = |why: String| Err(Error::Inconsistent { index: i, why });
    // Each pair: (smaller, larger, what the invariant says).
    let mut pairs: Vec<(u64, u64, &str)> = vec![(
        d.allocated_bytes,
        d.reserved_bytes,
        "allocatedBytes exceeds reservedBytes",
    )];
    if let Some(a) = d.active_bytes {
        pairs.push((a, d.reserved_bytes, "activeBytes exceeds reservedBytes"));
    }
    if let Some(s) = d.inactive_split_bytes {
        pairs.push((
            s,
            d.reserved_bytes,
            "inactiveSplitBytes exceeds reservedBytes",
        ));
    }
    if let Some(p) = d.peak_allocated_bytes {
        pairs.push((
            d.allocated_bytes,
            p,
            "allocatedBytes exceeds peakAllocatedBytes",
        ));
    }
    if let Some(p) = d.peak_reserved_bytes {
        pairs.push((
            d.reserved_bytes,
            p,
            "reservedBytes exceeds peakReservedBytes",
        ));
    }
    if let Some(t) = d.total_bytes {
        if t == 0 {
            return broken("totalBytes is 0".into());
        }
        pairs.push((d.reserved_bytes, t, "reservedBytes exceeds totalBytes"));
        if let Some(f) = d.free_bytes {
            pairs.push((f, t, "freeBytes exceeds totalBytes"));
        }
    } else if d.free_bytes.is_some() {
        return broken("freeBytes without totalBytes".into());
    }
    for (small, large, why) in pairs {
        if small > large {
            return broken(format!("{why} ({small} > {large})"));
        }
    }
    Ok(())
}

fn validate_oom(o: &OomSnapshot) -> Result<(), Error> {
    bound_str(|| "oom.message".into(), &o.message, MAX_MESSAGE)?;
    bound_len("oom.blocks", o.blocks.len(), MAX_BLOCKS)?;
    for (b, block) in o.blocks.iter().enumerate() {
        bound_str(|| format!("oom.blocks[{b}].state"), &block.state, MAX_NAME)?;
        bound_len(
            &format!("oom.blocks[{b}].frames"),
            block.frames.len(),
            MAX_FRAMES,
        )?;
        for (f, frame) in block.frames.iter().enumerate() {
            let what = |field: &str| format!("oom.blocks[{b}].frames[{f}].{field}");
            bound_str(|| what("filename"), &frame.filename, MAX_FRAME_TEXT)?;
            bound_str(|| what("name"), &frame.name, MAX_FRAME_TEXT)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
