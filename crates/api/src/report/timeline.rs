//! A GPU's recent history in a MemoryReport: up to 60 downsampled points,
//! written on the wire as one packed string (`packedTimeline`).
//!
//! Why packed: the API server validates, prunes and server-side-applies a
//! custom resource value by value, so a timeline of 60 `{t, max, min}`
//! objects per GPU was most of what a report write cost it (measured with
//! `examples/api_write_loop.rs` on the local control plane: 226–235 writes/s
//! of a 1-GPU report with the object timeline against 464–522/s packed, and
//! 45–51/s against 241–245/s at 8 GPUs: docs/benchmarks.md, "Report
//! writes"). One string per GPU is one value to check, whatever its length.
//!
//! The format, readable in `kubectl get memoryreport -o yaml`: points
//! separated by one space, oldest first; each point `T:MAX:MIN`, where `T`
//! is the point's start in seconds since the Unix epoch for the first point
//! and the seconds since the previous point's start for the others, and
//! `MAX`/`MIN` the highest and lowest used memory in the point's interval in
//! MiB (MAX rounded up, MIN down: the envelope is never narrower than what
//! was measured). Example: `1790000000:30721:15360 10:30722:15360`. The CRD
//! checks the shape (pattern) and the length (2 KiB per GPU), so every
//! stored report decodes.
//!
//! Reports written before the packed form carried the points as objects in
//! `timeline`; that field stays in the schema (a sidecar injected before an
//! upgrade keeps reporting) and [`crate::GpuReport::points`] reads either.

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt::Write as _;

/// Longest packed timeline the CRD accepts, in characters: 60 points of the
/// widest values the sidecar writes (a 10-digit first time, 9-digit MiB).
pub const MAX_PACKED_TIMELINE: usize = 2048;
/// The packed timeline's shape, as the CRD checks it (no counted repetition
/// of a group, which would make the API server's regex program large).
pub const PACKED_TIMELINE_PATTERN: &str =
    r"^-?[0-9]{1,12}:[0-9]{1,9}:[0-9]{1,9}( -?[0-9]{1,12}:[0-9]{1,9}:[0-9]{1,9})*$";

const MIB: u64 = 1 << 20;

/// One downsampled point of a GPU's timeline.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
pub struct TimelinePoint {
    /// Seconds since the Unix epoch.
    #[schemars(range(min = 0))]
    pub t: i64,
    /// Highest used memory within the point's interval, in bytes.
    pub max: u64,
    /// Lowest used memory within the point's interval, in bytes.
    pub min: u64,
}

/// Why a packed timeline does not decode.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("packed timeline point {index} ({point:?}) is not T:MAX_MIB:MIN_MIB with whole numbers; the sidecar writes e.g. `1790000000:30721:15360 10:30722:15360`")]
pub struct PackedTimelineError {
    /// Which point, counted from 0.
    pub index: usize,
    /// The point's text.
    pub point: String,
}

/// `points` in the packed form (see the module's docs).
pub fn pack(points: &[TimelinePoint]) -> String {
    let mut out = String::with_capacity(points.len() * 16);
    let mut previous = None;
    for p in points {
        if previous.is_some() {
            out.push(' ');
        }
        let t = previous.map_or(p.t, |prev: i64| p.t.saturating_sub(prev));
        // Writing into a String cannot fail.
        let _ = write!(out, "{t}:{}:{}", p.max.div_ceil(MIB), p.min / MIB);
        previous = Some(p.t);
    }
    out
}

/// The points of a packed timeline, in bytes (MiB granular).
pub fn unpack(packed: &str) -> Result<Vec<TimelinePoint>, PackedTimelineError> {
    let mut points = Vec::new();
    let mut previous: Option<i64> = None;
    for (index, text) in packed.split(' ').filter(|s| !s.is_empty()).enumerate() {
        let bad = || PackedTimelineError {
            index,
            point: text.chars().take(40).collect(),
        };
        let mut fields = text.split(':');
        let (Some(t), Some(max), Some(min), None) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            return Err(bad());
        };
        let t: i64 = t.parse().map_err(|_| bad())?;
        let mib = |s: &str| s.parse::<u64>().ok().and_then(|v| v.checked_mul(MIB));
        let (Some(max), Some(min)) = (mib(max), mib(min)) else {
            return Err(bad());
        };
        let t = previous
            .map_or(Some(t), |prev| prev.checked_add(t))
            .ok_or_else(bad)?;
        points.push(TimelinePoint { t, max, min });
        previous = Some(t);
    }
    Ok(points)
}

/// `#[serde(with = "timeline::packed")]`: a `Vec<TimelinePoint>` as its
/// packed string.
pub mod packed {
    use super::*;

    /// Writes the packed string.
    pub fn serialize<S: Serializer>(points: &[TimelinePoint], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&pack(points))
    }

    /// Reads the packed string; a malformed one is an error naming the point.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<TimelinePoint>, D::Error> {
        let text = String::deserialize(d)?;
        unpack(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests;
