//! What one configuration's run left behind (the agent's summary file, exit
//! status, stderr tail), what the sweep records for it, and the JSON and CSV
//! it writes. Pure: no I/O here.

use crate::local::sweep::grid::Config;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The agent's summary file (contract C-1), written at exit and before a
/// CUDA OOM propagates when `MEMPROF_AGENT_SUMMARY` is set.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AgentSummary {
    /// Format version (1).
    pub version: u32,
    /// Trainer process id.
    #[serde(default)]
    pub pid: Option<u32>,
    /// Last step the trainer reported.
    #[serde(default)]
    pub steps: Option<u64>,
    /// Whether a CUDA OOM propagated.
    #[serde(default)]
    pub oom: bool,
    /// The OOM's message.
    #[serde(default)]
    pub oom_message: Option<String>,
    /// `torch.cuda.max_memory_allocated`, summed over devices.
    #[serde(default)]
    pub peak_allocated_bytes: Option<u64>,
    /// `torch.cuda.max_memory_reserved`, summed over devices.
    #[serde(default)]
    pub peak_reserved_bytes: Option<u64>,
    /// Device memory as the driver reports it.
    #[serde(default)]
    pub device_total_bytes: Option<u64>,
    /// Left null by the agent; the sweep fills it from the sidecar.
    #[serde(default)]
    pub nvml_peak_used_bytes: Option<u64>,
    /// Step time from `step()` intervals, warm-up excluded.
    #[serde(default)]
    pub step_seconds: Option<StepSeconds>,
    /// From `step(n, tokens=)`.
    #[serde(default)]
    pub tokens_per_second: Option<f64>,
    /// From `step(n, samples=)`.
    #[serde(default)]
    pub samples_per_second: Option<f64>,
    /// The breakdown (contract C-2), carried as the agent wrote it.
    #[serde(default)]
    pub breakdown: Option<serde_json::Value>,
    /// Memory over the run, one point per push.
    #[serde(default)]
    pub timeline: Vec<TimelinePoint>,
}

/// One point of a run's memory over time (the summary's `timeline`).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TimelinePoint {
    /// Seconds since the run's first push.
    pub t: f64,
    /// The trainer's step then, if it calls `step()`.
    #[serde(default)]
    pub step: Option<u64>,
    /// The trainer's phase then, if it marks phases.
    #[serde(default)]
    pub phase: Option<String>,
    /// Allocated bytes, summed over the process's devices.
    pub allocated_bytes: u64,
    /// Reserved bytes, summed over the process's devices.
    pub reserved_bytes: u64,
}

/// Most timeline points kept per run (the agent writes at most 512; a
/// summary is the trainer's file, so it is bounded here too).
pub const MAX_TIMELINE: usize = 512;

/// Step-time statistics of a run.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct StepSeconds {
    /// Median seconds per step.
    pub median: f64,
    /// 90th percentile.
    #[serde(default)]
    pub p90: Option<f64>,
    /// Steps measured.
    #[serde(default)]
    pub n: Option<u64>,
}

/// How a configuration's run ended.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum Status {
    /// Exited 0 with no OOM.
    Ok,
    /// Hit a CUDA out-of-memory error.
    Oom,
    /// Killed after `--timeout`.
    Timeout,
    /// Exited non-zero for another reason (or could not start).
    Failed,
}

impl Status {
    /// The word in tables and CSV.
    pub fn word(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Oom => "oom",
            Status::Timeout => "timeout",
            Status::Failed => "failed",
        }
    }
}

/// The exit of a run's process, as the runner saw it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Exit {
    /// Exit code (128 + signal when killed by one); None when it never started.
    pub code: Option<i32>,
    /// Killed after the timeout.
    pub timed_out: bool,
}

/// What PyTorch prints for a CUDA OOM (`torch.OutOfMemoryError`).
pub const OOM_TEXT: &str = "CUDA out of memory";

/// The run's status: the summary's OOM flag first (a trainer that hangs
/// after its OOM is still an OOM), then the timeout, then the exit code with
/// the OOM message in the stderr tail.
pub fn classify(exit: &Exit, summary: Option<&AgentSummary>, stderr_tail: &str) -> Status {
    if summary.is_some_and(|s| s.oom) {
        return Status::Oom;
    }
    if exit.timed_out {
        return Status::Timeout;
    }
    match exit.code {
        Some(0) => Status::Ok,
        Some(_) if stderr_tail.contains(OOM_TEXT) => Status::Oom,
        _ => Status::Failed,
    }
}

/// One configuration's record (a row of the table, an element of `runs`).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RunRecord {
    /// Position in the grid (0-based).
    pub index: usize,
    /// The swept variables' values.
    pub values: BTreeMap<String, String>,
    /// `ok`, `oom`, `timeout` or `failed`.
    pub status: Option<Status>,
    /// Exit code; null when the process never started.
    pub exit_code: Option<i32>,
    /// Whether it hit a CUDA OOM.
    pub oom: bool,
    /// The OOM message, from the summary or the stderr tail.
    pub oom_message: Option<String>,
    /// Whether it was killed after `--timeout`.
    pub timed_out: bool,
    /// Wall-clock seconds the process ran.
    pub duration_seconds: f64,
    /// Steps the trainer reported.
    pub steps: Option<u64>,
    /// Peak allocated bytes (agent).
    pub peak_allocated_bytes: Option<u64>,
    /// Peak reserved bytes (agent).
    pub peak_reserved_bytes: Option<u64>,
    /// Peak used bytes of the busiest GPU as NVML saw it (sidecar); null
    /// when not measured or NVML is not available (`nvmlNote` says which).
    pub nvml_peak_bytes: Option<u64>,
    /// Why `nvmlPeakBytes` is null.
    pub nvml_note: Option<String>,
    /// Device memory, from the summary.
    pub device_total_bytes: Option<u64>,
    /// Median seconds per step (warm-up excluded).
    pub step_seconds_median: Option<f64>,
    /// Tokens per second, when the trainer passed `tokens=`.
    pub tokens_per_second: Option<f64>,
    /// Samples per second, when the trainer passed `samples=`.
    pub samples_per_second: Option<f64>,
    /// The agent's breakdown (contract C-2), as written.
    pub breakdown: Option<serde_json::Value>,
    /// What went wrong or is missing (no summary, unreadable summary...).
    pub note: Option<String>,
    /// The end of stderr for runs that did not end `ok`.
    pub stderr_tail: Option<String>,
    /// Why this run was added after the grid (the verification's search);
    /// null for the grid's own runs.
    #[serde(default)]
    pub trial: Option<String>,
    /// Memory over the run (the agent's summary), at most [`MAX_TIMELINE`] points.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timeline: Vec<TimelinePoint>,
}

/// An agent summary file that is there but cannot be used: the run's
/// record says so (`unreadable summary`) instead of its numbers.
#[derive(Debug, thiserror::Error)]
pub enum SummaryError {
    /// It could not be read.
    #[error("{}: {source}", path.display())]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// It is not the agent's summary (contract C-1).
    #[error("{}: {source}", path.display())]
    Parse {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: serde_json::Error,
    },
}

/// Longest stderr tail kept in a record.
pub const STDERR_TAIL_BYTES: usize = 2000;

/// Builds the record of one run from what the runner collected.
pub fn record(
    index: usize,
    config: &Config,
    exit: &Exit,
    duration_seconds: f64,
    summary: Result<Option<AgentSummary>, SummaryError>,
    stderr_tail: &str,
) -> RunRecord {
    let (summary, note) = match summary {
        Ok(Some(s)) => (Some(s), None),
        Ok(None) => (None, Some("no agent summary: the agent did not run in this command (does it import torch? is --agent-path right?) or the process was killed".to_string())),
        Err(e) => (None, Some(format!("unreadable agent summary: {e}"))),
    };
    let status = classify(exit, summary.as_ref(), stderr_tail);
    let s = summary.clone().unwrap_or_default();
    let oom_message = s.oom_message.clone().or_else(|| {
        (status == Status::Oom)
            .then(|| stderr_tail.lines().rev().find(|l| l.contains(OOM_TEXT)))
            .flatten()
            .map(|l| tail(l.trim(), 400).to_string())
    });
    RunRecord {
        index,
        values: config.values.iter().cloned().collect(),
        status: Some(status),
        exit_code: exit.code,
        oom: status == Status::Oom,
        oom_message,
        timed_out: exit.timed_out,
        duration_seconds,
        steps: s.steps,
        peak_allocated_bytes: s.peak_allocated_bytes,
        peak_reserved_bytes: s.peak_reserved_bytes,
        nvml_peak_bytes: s.nvml_peak_used_bytes,
        nvml_note: None,
        device_total_bytes: s.device_total_bytes,
        step_seconds_median: s.step_seconds.map(|x| x.median).filter(|m| m.is_finite()),
        tokens_per_second: s.tokens_per_second.filter(|x| x.is_finite()),
        samples_per_second: s.samples_per_second.filter(|x| x.is_finite()),
        breakdown: s.breakdown,
        note,
        stderr_tail: (status != Status::Ok && !stderr_tail.is_empty())
            .then(|| tail(stderr_tail, STDERR_TAIL_BYTES).to_string()),
        trial: None,
        timeline: s
            .timeline
            .into_iter()
            .filter(|p| p.t.is_finite())
            .take(MAX_TIMELINE)
            .collect(),
    }
}

/// The last `max` bytes of `s`, cut at a character boundary.
pub fn tail(s: &str, max: usize) -> &str {
    let mut start = s.len().saturating_sub(max);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

/// The four parts of a breakdown the report stacks, in bytes (absent parts 0).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Parts {
    /// Parameters.
    pub parameters: f64,
    /// Gradients (plus per-sample gradients when present).
    pub gradients: f64,
    /// Optimizer state.
    pub optimizer: f64,
    /// Activations at the measured step's peak.
    pub activations: f64,
}

/// The stacked parts of a C-2 breakdown; None when it has none of them.
pub fn parts(breakdown: &serde_json::Value) -> Option<Parts> {
    let get = |k: &str| breakdown.get(k).and_then(serde_json::Value::as_f64);
    let p = Parts {
        parameters: get("parametersBytes")?,
        gradients: get("gradientsBytes").unwrap_or(0.0)
            + get("perSampleGradientsBytes").unwrap_or(0.0),
        optimizer: get("optimizerBytes").unwrap_or(0.0),
        activations: get("activationsPeakBytes").unwrap_or(0.0),
    };
    Some(p)
}

/// CSV columns after the index and the swept variables (docs/sweep.md
/// explains each).
pub const CSV_COLUMNS: [&str; 19] = [
    "status",
    "exit_code",
    "oom",
    "timed_out",
    "duration_s",
    "steps",
    "peak_allocated_bytes",
    "peak_reserved_bytes",
    "nvml_peak_bytes",
    "device_total_bytes",
    "step_seconds_median",
    "tokens_per_second",
    "samples_per_second",
    "parameters_bytes",
    "gradients_bytes",
    "optimizer_bytes",
    "activations_peak_bytes",
    "static_bytes",
    "note",
];

/// The CSV of a sweep: a header, then one row per run; unknown values are
/// empty cells (never 0).
pub fn to_csv(variables: &[String], runs: &[RunRecord]) -> String {
    let mut out = String::new();
    let mut header = vec!["index".to_string()];
    header.extend(variables.iter().cloned());
    header.extend(CSV_COLUMNS.iter().map(|c| c.to_string()));
    push_row(&mut out, &header);
    for r in runs {
        push_row(&mut out, &csv_row(variables, r));
    }
    out
}

fn csv_row(variables: &[String], r: &RunRecord) -> Vec<String> {
    let opt = |v: Option<u64>| v.map(|x| x.to_string()).unwrap_or_default();
    let optf = |v: Option<f64>| v.map(|x| format!("{x}")).unwrap_or_default();
    let b = |k: &str| {
        r.breakdown
            .as_ref()
            .and_then(|b| b.get(k))
            .and_then(serde_json::Value::as_u64)
    };
    let mut row = vec![r.index.to_string()];
    row.extend(
        variables
            .iter()
            .map(|v| r.values.get(v).cloned().unwrap_or_default()),
    );
    row.extend([
        r.status.map(|s| s.word().to_string()).unwrap_or_default(),
        r.exit_code.map(|c| c.to_string()).unwrap_or_default(),
        r.oom.to_string(),
        r.timed_out.to_string(),
        format!("{:.3}", r.duration_seconds),
        opt(r.steps),
        opt(r.peak_allocated_bytes),
        opt(r.peak_reserved_bytes),
        opt(r.nvml_peak_bytes),
        opt(r.device_total_bytes),
        optf(r.step_seconds_median),
        optf(r.tokens_per_second),
        optf(r.samples_per_second),
        opt(b("parametersBytes")),
        opt(b("gradientsBytes")),
        opt(b("optimizerBytes")),
        opt(b("activationsPeakBytes")),
        opt(b("staticBytes")),
        r.note.clone().unwrap_or_default(),
    ]);
    row
}

fn push_row(out: &mut String, cells: &[String]) {
    let quoted: Vec<String> = cells.iter().map(|c| csv_cell(c)).collect();
    out.push_str(&quoted.join(","));
    out.push('\n');
}

/// RFC 4180 quoting: cells with a comma, quote or line break are quoted.
fn csv_cell(c: &str) -> String {
    if c.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", c.replace('"', "\"\""))
    } else {
        c.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::sweep::grid::{parse_vary, product};

    fn summary(json: &str) -> AgentSummary {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn the_c1_summary_parses_with_nulls_and_unknown_fields() {
        let s = summary(
            r#"{"version":1,"pid":7,"steps":20,"oom":false,"oomMessage":null,
            "peakAllocatedBytes":1000,"peakReservedBytes":2000,"deviceTotalBytes":8000,
            "nvmlPeakUsedBytes":null,"stepSeconds":{"median":0.5,"p90":0.6,"n":18},
            "tokensPerSecond":4096.0,"samplesPerSecond":null,"breakdown":null,"future":1}"#,
        );
        assert_eq!(s.peak_reserved_bytes, Some(2000));
        assert_eq!(s.step_seconds.unwrap().median, 0.5);
        assert_eq!(s.samples_per_second, None);
        let minimal = summary(r#"{"version":1}"#);
        assert!(!minimal.oom);
        assert_eq!(minimal.peak_allocated_bytes, None);
    }

    #[test]
    fn an_oom_is_the_summary_flag_or_a_failed_exit_with_the_message() {
        let ok = Exit {
            code: Some(0),
            timed_out: false,
        };
        let failed = Exit {
            code: Some(1),
            timed_out: false,
        };
        let killed = Exit {
            code: Some(137),
            timed_out: true,
        };
        let oom = AgentSummary {
            oom: true,
            ..Default::default()
        };
        let fine = AgentSummary::default();
        let msg = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB";
        assert_eq!(classify(&ok, Some(&fine), ""), Status::Ok);
        assert_eq!(classify(&failed, Some(&oom), ""), Status::Oom);
        assert_eq!(classify(&killed, Some(&oom), ""), Status::Oom);
        assert_eq!(classify(&failed, None, msg), Status::Oom);
        assert_eq!(classify(&failed, None, "KeyError: x"), Status::Failed);
        assert_eq!(classify(&killed, None, msg), Status::Timeout);
        // Exit 0 with the text (a trainer that caught its OOM) ran to the end.
        assert_eq!(classify(&ok, None, msg), Status::Ok);
        assert_eq!(classify(&Exit::default(), None, ""), Status::Failed);
    }

    #[test]
    fn a_record_takes_the_summary_and_keeps_the_oom_line_of_stderr() {
        let grid = product(&[parse_vary("BATCH_SIZE=64").unwrap()]).unwrap();
        let exit = Exit {
            code: Some(1),
            timed_out: false,
        };
        let stderr = "Traceback...\ntorch.OutOfMemoryError: CUDA out of memory. Tried 2 GiB\n";
        let r = record(3, &grid[0], &exit, 2.5, Ok(None), stderr);
        assert_eq!(r.status, Some(Status::Oom));
        assert!(r.oom);
        assert_eq!(
            r.oom_message.as_deref(),
            Some("torch.OutOfMemoryError: CUDA out of memory. Tried 2 GiB")
        );
        assert!(r.note.as_deref().unwrap().starts_with("no agent summary"));
        assert_eq!(r.values.get("BATCH_SIZE").map(String::as_str), Some("64"));
        assert_eq!(r.stderr_tail.as_deref(), Some(stderr));
        let ok = record(
            0,
            &grid[0],
            &Exit {
                code: Some(0),
                timed_out: false,
            },
            1.0,
            Ok(Some(summary(
                r#"{"version":1,"peakReservedBytes":5,"stepSeconds":{"median":0.25}}"#,
            ))),
            "noise",
        );
        assert_eq!(ok.status, Some(Status::Ok));
        assert_eq!(ok.peak_reserved_bytes, Some(5));
        assert_eq!(ok.step_seconds_median, Some(0.25));
        assert_eq!(ok.stderr_tail, None, "an ok run keeps no stderr");
        assert_eq!(ok.nvml_peak_bytes, None);
    }

    #[test]
    fn csv_has_a_header_empty_cells_for_unknowns_and_quotes() {
        let vars = vec!["BATCH_SIZE".to_string()];
        let mut r = RunRecord {
            index: 0,
            values: [("BATCH_SIZE".to_string(), "8".to_string())].into(),
            status: Some(Status::Ok),
            exit_code: Some(0),
            peak_reserved_bytes: Some(123),
            note: Some("a, \"b\"".into()),
            breakdown: Some(serde_json::json!({"parametersBytes": 10, "staticBytes": 30})),
            ..Default::default()
        };
        r.duration_seconds = 1.5;
        let csv = to_csv(&vars, &[r]);
        let mut lines = csv.lines();
        let header = lines.next().unwrap();
        assert!(header.starts_with("index,BATCH_SIZE,status,exit_code,oom,timed_out,"));
        assert_eq!(header.split(',').count(), 2 + CSV_COLUMNS.len());
        let row = lines.next().unwrap();
        assert_eq!(
            row,
            "0,8,ok,0,false,false,1.500,,,123,,,,,,10,,,,30,\"a, \"\"b\"\"\""
        );
    }

    #[test]
    fn breakdown_parts_stack_per_sample_gradients_with_gradients() {
        let b = serde_json::json!({"parametersBytes": 100, "gradientsBytes": 10,
            "perSampleGradientsBytes": 5, "optimizerBytes": 20, "activationsPeakBytes": null});
        assert_eq!(
            parts(&b),
            Some(Parts {
                parameters: 100.0,
                gradients: 15.0,
                optimizer: 20.0,
                activations: 0.0
            })
        );
        assert_eq!(parts(&serde_json::json!({})), None);
    }
}
