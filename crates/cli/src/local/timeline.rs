//! `memprof timeline EXPORT.json [--plot F.svg|F.png]`: seed 002's event
//! timeline from the agent's JSON export (`memprof_agent.export_timeline(PATH)`:
//! events keyed by name, each occurrence with its allocator numbers), as a table of stages with the
//! change of allocated memory from one recorded event to the next, the
//! stage that added the most, and a picture: allocated, reserved and their
//! maxima over the run with each event marked.
//!
//! The agent prints the same table on its console at exit; this command is
//! for the file kept afterwards (another machine, a CI artefact) and for
//! the picture. Nothing here is measured: the numbers are the agent's.

use crate::output::{self, Table};
use crate::plot::{LineChart, Mark, Series, Style, Unit};
use memprof_api::format_bytes;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::PathBuf;

/// Flags of `memprof timeline`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The agent's timeline export (JSON keyed by event name).
    #[arg(value_name = "EXPORT.json")]
    pub file: PathBuf,
    /// Also draw the timeline: `.svg`, or `.png` (rasterised).
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
}

/// Why the timeline cannot be shown.
#[derive(Debug, thiserror::Error)]
pub enum TimelineError {
    /// The file could not be read.
    #[error("cannot read {file}: {error}")]
    Read {
        /// The file.
        file: PathBuf,
        /// The error.
        error: std::io::Error,
    },
    /// Not an export of the agent.
    #[error("{file} is not the agent's timeline export ({why}); write one with memprof_agent.export_timeline(PATH) in the trainer")]
    Format {
        /// The file.
        file: PathBuf,
        /// What was wrong (serde's words: the field and the line).
        why: serde_json::Error,
    },
    /// The picture could not be written.
    #[error(transparent)]
    Plot(#[from] crate::plot::ImageError),
    /// `--plot` cannot be written (checked before the file is read).
    #[error(transparent)]
    OutFile(#[from] crate::outfile::OutFileError),
}

/// The export, as far as this command reads it.
#[derive(Debug, Deserialize)]
struct Export {
    events: BTreeMap<String, Vec<Occurrence>>,
}

/// One occurrence of an event.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Occurrence {
    /// Seconds since the agent was imported.
    pub elapsed: f64,
    /// Wall-clock time, seconds since the Unix epoch (orders equal `elapsed`).
    #[serde(default)]
    pub t: f64,
    /// Training step, when the trainer marked one.
    pub step: Option<u64>,
    /// The note given to `record`.
    pub note: Option<String>,
    /// Allocated bytes at the event (absent without CUDA).
    pub allocated_bytes: Option<u64>,
    /// Reserved bytes.
    pub reserved_bytes: Option<u64>,
    /// Highest allocated bytes so far.
    pub max_allocated_bytes: Option<u64>,
    /// Highest reserved bytes so far.
    pub max_reserved_bytes: Option<u64>,
}

/// One event of the run, in time order.
#[derive(Clone, Debug)]
pub struct Event {
    /// Its name.
    pub name: String,
    /// Its numbers.
    pub at: Occurrence,
}

/// Reads an export into events ordered by time.
pub fn parse(text: &str) -> Result<Vec<Event>, serde_json::Error> {
    let doc: Export = serde_json::from_str(text)?;
    let mut events: Vec<Event> = doc
        .events
        .into_iter()
        .flat_map(|(name, list)| {
            list.into_iter().map(move |at| Event {
                name: name.clone(),
                at,
            })
        })
        .collect();
    // The file is keyed by name: time orders it back (elapsed has µs
    // resolution; the wall clock breaks what ties remain).
    events.sort_by(|a, b| (a.at.elapsed.total_cmp(&b.at.elapsed)).then(a.at.t.total_cmp(&b.at.t)));
    Ok(events)
}

/// Runs the subcommand; returns the exit code.
pub async fn run(args: Args) -> Result<i32, TimelineError> {
    if let Some(p) = &args.plot {
        crate::outfile::prepare_image("--plot", p)?;
    }
    let text = std::fs::read_to_string(&args.file).map_err(|error| TimelineError::Read {
        file: args.file.clone(),
        error,
    })?;
    let events = parse(&text).map_err(|why| TimelineError::Format {
        file: args.file.clone(),
        why,
    })?;
    output::print(&render(&events));
    if let Some(p) = &args.plot {
        crate::plot::write_image(p, &chart(&events).to_svg())?;
        println!("plot written to {}", p.display());
    }
    Ok(0)
}

fn signed(v: i64) -> String {
    let sign = if v < 0 { "-" } else { "+" };
    format!("{sign}{}", format_bytes(v.unsigned_abs()))
}

/// The table, and the stage that added the most allocated memory.
pub fn render(events: &[Event]) -> String {
    let mut t = Table::new([
        "ELAPSED",
        "EVENT",
        "STEP",
        "ALLOCATED",
        "RESERVED",
        "MAX ALLOC",
        "MAX RESV",
        "Δ ALLOC",
        "NOTE",
    ]);
    let bytes = |b: Option<u64>| b.map_or("-".into(), format_bytes);
    let mut previous: Option<&Event> = None;
    let mut largest: Option<(i64, &Event, &Event)> = None;
    for e in events {
        let delta = match (previous, e.at.allocated_bytes) {
            (Some(p), Some(now)) => p.at.allocated_bytes.map(|b| now as i64 - b as i64),
            _ => None,
        };
        if let (Some(d), Some(p)) = (delta, previous) {
            if largest.is_none_or(|(l, _, _)| d > l) {
                largest = Some((d, e, p));
            }
        }
        t.row([
            format!("{:.3}s", e.at.elapsed),
            e.name.clone(),
            e.at.step.map_or("-".into(), |s| s.to_string()),
            bytes(e.at.allocated_bytes),
            bytes(e.at.reserved_bytes),
            bytes(e.at.max_allocated_bytes),
            bytes(e.at.max_reserved_bytes),
            delta.map_or("-".into(), signed),
            e.at.note.clone().unwrap_or_default(),
        ]);
        if e.at.allocated_bytes.is_some() {
            previous = Some(e);
        }
    }
    let mut out = t.render();
    let _ = write!(out, "{} events", events.len());
    if let Some((d, e, p)) = largest.filter(|(d, _, _)| *d > 0) {
        let _ = write!(
            out,
            "; largest increase {} at {} ({:.3}s, after {})",
            signed(d),
            e.name,
            e.at.elapsed,
            p.name
        );
    }
    out.push('\n');
    out
}

/// Allocated, reserved and their maxima over the run, each event marked.
pub fn chart(events: &[Event]) -> LineChart {
    let line = |f: fn(&Occurrence) -> Option<u64>| -> Vec<(f64, f64)> {
        events
            .iter()
            .filter_map(|e| f(&e.at).map(|b| (e.at.elapsed, b as f64)))
            .collect()
    };
    LineChart {
        title: "memory at the trainer's recorded events".into(),
        x_label: "time since the agent started".into(),
        x_unit: Unit::Seconds,
        y_label: "memory".into(),
        y_unit: Unit::Bytes,
        series: vec![
            Series::new("allocated", line(|o| o.allocated_bytes), Style::Line),
            Series::new("reserved", line(|o| o.reserved_bytes), Style::Line),
            Series::new(
                "max allocated",
                line(|o| o.max_allocated_bytes),
                Style::Dashed,
            ),
            Series::new(
                "max reserved",
                line(|o| o.max_reserved_bytes),
                Style::Dashed,
            ),
        ],
        hlines: vec![],
        marks: events
            .iter()
            .map(|e| Mark {
                x: e.at.elapsed,
                label: e.name.clone(),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests;
