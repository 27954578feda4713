//! Calibration points from profiled runs. `memprof estimate --points FILE
//! -- COMMAND` records its estimate of COMMAND in FILE; a later `memprof
//! profile --points FILE -- COMMAND` on a GPU adds what that run's trainer
//! measured (its caching allocator's peaks, from the agent) beside it: one
//! point, estimate against measurement. Every estimate given the same FILE
//! reports its error on those points with the recorded ones, and judges its
//! margin with them (`estimate::calibration`, which reads them as points).
//! Apart from `estimate/` because `profile` writes here too.
//!
//! A configuration is its command line without the interpreter
//! (`python3 train.py --lr 3e-4` and `train.py --lr 3e-4` are one) and its
//! ranks (torchrun's `--nproc_per_node`): a setting passed in the
//! environment instead is not part of it, so two runs that differ only
//! there share a key. Both commands print the key they used.

use crate::local::command_line;
use memprof_api::MemoryReportSpec;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The split of a point made by a profiled run: held out (it set no constant).
pub const SPLIT_PROFILED: &str = "profiled";
/// Entries kept in one file, at most: the oldest go first.
const MAX_ENTRIES: usize = 1_000;
/// Longest command kept as a key.
const MAX_KEY: usize = 1_024;

/// The file `--points` names.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Points {
    /// Always `memprofPoints`.
    pub kind: String,
    /// Of this shape.
    pub version: u32,
    /// Estimates, each with the measurement a profiled run added, if any.
    pub entries: Vec<Entry>,
}

/// One estimate of one configuration, and what a profiled run measured.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    /// The command line without the interpreter.
    pub command: String,
    /// Ranks.
    pub world_size: u32,
    /// The card the estimate judged against.
    pub gpu: String,
    /// The modelled allocator peaks (no context): what the run will measure.
    pub estimate: Peaks,
    /// What a profiled run's trainer measured, once one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured: Option<Measured>,
}

/// Peak allocated and reserved bytes of the caching allocator.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Peaks {
    /// Peak allocated bytes.
    pub allocated_bytes: u64,
    /// Peak reserved bytes.
    pub reserved_bytes: u64,
}

/// A profiled run's measurement.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Measured {
    /// The trainer's allocator: peak allocated (torch's own peak) and the
    /// highest reserved the agent's pushes showed (sampled).
    #[serde(flatten)]
    pub peaks: Peaks,
    /// The GPU model it ran on.
    pub on: String,
}

/// The points file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum PointsError {
    /// Unreadable or not a points file.
    #[error("cannot read --points {path}: {reason}; it is what `memprof estimate --points` writes: fix it or name a new file")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// Could not be written.
    #[error("cannot write --points {path}: {reason}; check the folder exists and is writable")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// `--vary` estimates several configurations at once.
    #[error("--points records one configuration, and --vary estimates several: drop --vary, or estimate each value with it set in the command")]
    Vary,
}

/// Signed error of an estimate, percent of the real value (0 with no real
/// value): the one rule for every error memprof prints of an estimate.
pub fn error_pct(estimate: u64, real: u64) -> f64 {
    if real == 0 {
        return 0.0;
    }
    (estimate as f64 - real as f64) * 100.0 / real as f64
}

/// A configuration's key: the command line without the interpreter, and
/// its ranks.
pub fn key(command: &[String], world_size: Option<u32>) -> (String, u32) {
    let launch = command_line::launch(command, "python3");
    let mut line = launch.script.join(" ");
    memprof_api::truncate_utf8(&mut line, MAX_KEY);
    (line, world_size.or(launch.world_size).unwrap_or(1).max(1))
}

/// The file at `path`; an empty one when there is none yet.
pub fn load(path: &Path) -> Result<Points, PointsError> {
    let read = |reason: String| PointsError::Read {
        path: path.into(),
        reason,
    };
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| read(e.to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Points::default()),
        Err(e) => Err(read(e.to_string())),
    }
}

/// Writes `points` to `path` whole: beside it, then renamed over it, so an
/// interrupted write never leaves half a file.
pub fn save(path: &Path, points: &Points) -> Result<(), PointsError> {
    let write = |e: std::io::Error| PointsError::Write {
        path: path.into(),
        reason: e.to_string(),
    };
    let mut doc = points.clone();
    doc.kind = "memprofPoints".into();
    doc.version = 1;
    let text = serde_json::to_string_pretty(&doc).expect("plain data serializes") + "\n";
    let mut beside = path.as_os_str().to_owned();
    beside.push(".writing");
    std::fs::write(&beside, text).map_err(write)?;
    std::fs::rename(&beside, path).map_err(write)
}

impl Points {
    /// Records an estimate of `entry.command`: it replaces an estimate of
    /// the same configuration that no run measured yet, else it is added
    /// (a measured point stays a point).
    pub fn estimated(&mut self, entry: Entry) {
        let pending = self
            .entries
            .iter()
            .rposition(|e| same(e, &entry) && e.measured.is_none());
        match pending {
            Some(i) => self.entries[i] = entry,
            None => self.entries.push(entry),
        }
        if self.entries.len() > MAX_ENTRIES {
            let over = self.entries.len() - MAX_ENTRIES;
            self.entries.drain(..over);
        }
    }

    /// Adds `measured` to the newest estimate of (`command`, `world_size`);
    /// that entry, or `None` when no estimate of it was recorded.
    pub fn profiled(&mut self, (command, world_size): (&str, u32), m: Measured) -> Option<&Entry> {
        let at = self
            .entries
            .iter()
            .rposition(|e| e.command == command && e.world_size == world_size)?;
        self.entries[at].measured = Some(m);
        Some(&self.entries[at])
    }
}

fn same(a: &Entry, b: &Entry) -> bool {
    a.command == b.command && a.world_size == b.world_size
}

/// What a profiled run's trainer measured, from its final report: `None`
/// when no agent reported its allocator (NVML's device figures count every
/// process on the GPU, and the context besides: not what an estimate of
/// the allocator's peaks is compared with).
pub fn measured(report: &MemoryReportSpec) -> Option<Measured> {
    let a = report.allocator.as_ref()?;
    let trend = a.fragmentation_trend.iter().map(|p| p.reserved_bytes);
    let reserved = trend.max().unwrap_or(0).max(a.reserved_bytes);
    let allocated = a.peak_allocated_bytes.unwrap_or(a.allocated_bytes);
    (reserved > 0).then(|| Measured {
        peaks: Peaks {
            allocated_bytes: allocated,
            reserved_bytes: reserved.max(allocated),
        },
        on: report
            .gpus
            .first()
            .map_or_else(|| "an unnamed GPU".into(), |g| g.model.clone()),
    })
}

/// `memprof profile --points FILE`: adds the run's measurement to FILE's
/// estimate of `command`, and says what it did in one line (nothing is
/// added, and the line says why, when there is no estimate or no agent).
pub fn add_profiled(
    path: &Path,
    command: &[String],
    report: &MemoryReportSpec,
) -> Result<String, PointsError> {
    let (line, world) = key(command, None);
    let Some(m) = measured(report) else {
        return Ok(format!(
            "memprof: no point added to {}: the trainer's agent reported no allocator numbers",
            path.display()
        ));
    };
    let mut points = load(path)?;
    let Some(e) = points.profiled((&line, world), m) else {
        return Ok(format!(
            "memprof: no point added to {}: no estimate of `{line}` ({world} rank(s)) in it; run `memprof estimate --points {} -- {line}` first",
            path.display(),
            path.display()
        ));
    };
    let said = said(e, path);
    save(path, &points)?;
    Ok(said)
}

fn said(e: &Entry, path: &Path) -> String {
    let m = e.measured.as_ref().expect("just measured");
    let pct = error_pct;
    format!(
        "memprof: point added to {}: `{}` estimated {} reserved, measured {} on {} ({:+.1}%; allocated {:+.1}%)",
        path.display(),
        e.command,
        memprof_api::format_bytes(e.estimate.reserved_bytes),
        memprof_api::format_bytes(m.peaks.reserved_bytes),
        m.on,
        pct(e.estimate.reserved_bytes, m.peaks.reserved_bytes),
        pct(e.estimate.allocated_bytes, m.peaks.allocated_bytes),
    )
}

#[cfg(test)]
mod tests;
