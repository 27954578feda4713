//! The push format of the in-process agent (`agent/python/`, `memprof_agent`):
//! what it `POST`s to the sidecar's `/v1/agent`, version 1. docs/agent-wire.md
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
//! version 1); a different `version` is refused. The types are also the
//! contract's JSON Schema ([`push_schema`], [`reply_schema`]; `agent/schema/`),
//! which the Python agent's tests check its pushes against.

mod breakdown;
mod extras;
mod push;
mod rows;
pub use breakdown::{Breakdown, Flag, ModuleTypeBytes};
// The report's type: a push's phases are copied into the report unchanged.
pub use crate::ModulePhase;
pub use extras::{
    Grads, Host, PreOom, PreOomSource, SitesHistory, SitesSnapshot, Sizes, SizesSource,
    TrackedTensors, TrackedType, Tracking, MAX_GRAD_NAME, MAX_GRAD_NAMES, MAX_SHAPE_DIMS, MAX_SITE,
    MAX_SIZE_BOUND, MAX_SIZE_BUCKETS, MAX_TAG, MAX_TRACKED,
};
pub use rows::{DpSgd, LayerRow, ParameterRow, RowsLeftOut, Source, MAX_DTYPE, MAX_ROWS};
mod reply;
mod schema;
pub use push::{
    Block, DeviceStats, Event, EventDetail, Frame, OomSnapshot, Push, PushKind, SnapshotSource,
};
pub use reply::{
    Ack, Directive, DirectiveKind, PushReply, Verdict, MAX_ACKS, MAX_ACK_ACTION, MAX_DIRECTIVES,
    MAX_DIRECTIVE_ID, MAX_DIRECTIVE_REASON,
};
pub use schema::{push_schema, reply_schema, schema_json};

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

/// Why a push was refused. Messages say what the sender must change.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum Error {
    /// Not JSON of the push format.
    #[error("not a memprof agent push (see docs/agent-wire.md): {0}")]
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
    #[error("{why}; send the fields as docs/agent-wire.md describes them")]
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
    if let Some(sites) = &p.sites {
        positive_time("sites.time", sites.time)?;
        validate_blocks("sites", &sites.blocks)?;
        extras::validate_sites(sites)?;
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
    match (d.total_bytes, d.free_bytes) {
        (Some(0), _) => return broken("totalBytes is 0".into()),
        (None, Some(_)) => return broken("freeBytes without totalBytes".into()),
        _ => {}
    }
    for (small, large, why) in ordered_pairs(d) {
        if let (Some(small), Some(large)) = (small, large) {
            if small > large {
                return broken(format!("{why} ({small} > {large})"));
            }
        }
    }
    Ok(())
}

/// The device's numbers that must be in order: (smaller, larger, what the
/// invariant says); a pair with a number the agent did not send is skipped.
fn ordered_pairs(d: &DeviceStats) -> [(Option<u64>, Option<u64>, &'static str); 9] {
    let (allocated, reserved) = (Some(d.allocated_bytes), Some(d.reserved_bytes));
    let split_now = d
        .peak_inactive_split_bytes
        .map(|_| d.inactive_split_bytes.unwrap_or(0));
    [
        (allocated, reserved, "allocatedBytes exceeds reservedBytes"),
        (
            d.active_bytes,
            reserved,
            "activeBytes exceeds reservedBytes",
        ),
        (
            d.inactive_split_bytes,
            reserved,
            "inactiveSplitBytes exceeds reservedBytes",
        ),
        (
            allocated,
            d.peak_allocated_bytes,
            "allocatedBytes exceeds peakAllocatedBytes",
        ),
        (
            reserved,
            d.peak_reserved_bytes,
            "reservedBytes exceeds peakReservedBytes",
        ),
        (
            split_now,
            d.peak_inactive_split_bytes,
            "inactiveSplitBytes exceeds peakInactiveSplitBytes",
        ),
        (
            d.peak_inactive_split_bytes,
            d.peak_reserved_bytes,
            "peakInactiveSplitBytes exceeds peakReservedBytes",
        ),
        (reserved, d.total_bytes, "reservedBytes exceeds totalBytes"),
        (d.free_bytes, d.total_bytes, "freeBytes exceeds totalBytes"),
    ]
}

fn validate_oom(o: &OomSnapshot) -> Result<(), Error> {
    bound_str(|| "oom.message".into(), &o.message, MAX_MESSAGE)?;
    validate_blocks("oom", &o.blocks)
}

/// The blocks of an OOM or sites snapshot (`within` names it in errors).
fn validate_blocks(within: &str, blocks: &[Block]) -> Result<(), Error> {
    bound_len(&format!("{within}.blocks"), blocks.len(), MAX_BLOCKS)?;
    for (b, block) in blocks.iter().enumerate() {
        bound_str(
            || format!("{within}.blocks[{b}].state"),
            &block.state,
            MAX_NAME,
        )?;
        bound_len(
            &format!("{within}.blocks[{b}].frames"),
            block.frames.len(),
            MAX_FRAMES,
        )?;
        for (f, frame) in block.frames.iter().enumerate() {
            let what = |field: &str| format!("{within}.blocks[{b}].frames[{f}].{field}");
            bound_str(|| what("filename"), &frame.filename, MAX_FRAME_TEXT)?;
            bound_str(|| what("name"), &frame.name, MAX_FRAME_TEXT)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
