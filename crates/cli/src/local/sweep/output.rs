//! The sweep's result file (JSON), its table and progress lines. Pure.

use crate::local::sweep::grid::Config;
use crate::local::sweep::model::{Metric, Model};
use crate::local::sweep::record::{RunRecord, Status};
use memprof_api::format_bytes;
use serde::{Deserialize, Serialize};

/// `kind` of a sweep result file (how `memprof compare` recognises one).
pub const KIND: &str = "memprofSweep";

/// Format version: 2 since the models are the one memory model (curve,
/// held-out predictions, support) with a verification search.
pub const VERSION: u32 = 2;

/// What `--json` writes.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SweepResult {
    /// Always `memprofSweep`.
    pub kind: String,
    /// Format version ([`VERSION`]).
    pub version: u32,
    /// When the sweep started (RFC 3339).
    pub started_at: String,
    /// The training command.
    pub command: Vec<String>,
    /// Swept variables, in `--vary` order.
    pub variables: Vec<String>,
    /// `--steps`: each run's step budget.
    pub step_budget: Option<u64>,
    /// `--timeout`, seconds.
    pub timeout_seconds: f64,
    /// The peak the models fit.
    pub metric: Metric,
    /// `--headroom`.
    pub headroom: f64,
    /// `--limit-bytes`, when given.
    pub limit_bytes: Option<u64>,
    /// Whether NVML peaks were measured (`--nvml`).
    pub nvml: bool,
    /// Most verification runs per model (0: `--no-verify`).
    #[serde(default)]
    pub verify_runs: usize,
    /// `--agent-interval`: how often the agent pushed (one timeline point each).
    #[serde(default)]
    pub agent_interval: String,
    /// Whether the sweep was interrupted before the last configuration.
    pub interrupted: bool,
    /// `--note`: a line for the reader (what machine, what model).
    #[serde(default)]
    pub note: Option<String>,
    /// One record per configuration run, in grid order.
    pub runs: Vec<RunRecord>,
    /// One model per swept variable and combination of the others.
    pub models: Vec<Model>,
}

fn bytes(v: Option<u64>) -> String {
    v.map_or("-".into(), format_bytes)
}

/// The results table, one line per run (verification runs marked `*`).
pub fn table(variables: &[String], runs: &[RunRecord]) -> String {
    let mut header: Vec<String> = vec!["#".into()];
    header.extend(variables.iter().cloned());
    header.extend(
        [
            "STATUS",
            "RESERVED",
            "ALLOCATED",
            "NVML",
            "S/STEP",
            "TOKENS/S",
            "TIME",
        ]
        .map(String::from),
    );
    let mut t = crate::output::Table::new(header);
    for r in runs {
        let mark = if r.trial.is_some() { "*" } else { "" };
        let mut row = vec![format!("{}{mark}", r.index)];
        row.extend(
            variables
                .iter()
                .map(|v| r.values.get(v).cloned().unwrap_or_default()),
        );
        row.extend([
            r.status.map_or("-", Status::word).to_string(),
            bytes(r.peak_reserved_bytes),
            bytes(r.peak_allocated_bytes),
            bytes(r.nvml_peak_bytes),
            r.step_seconds_median
                .map_or("-".into(), |s| format!("{s:.3}")),
            r.tokens_per_second
                .map_or("-".into(), |t| format!("{t:.0}")),
            format!("{:.1}s", r.duration_seconds),
        ]);
        t.row(row);
    }
    let mut out = t.render();
    if runs.iter().any(|r| r.trial.is_some()) {
        out.push_str("* run after the grid to verify the model (see the search lines below)\n");
    }
    out
}

/// One finished run in a line: `[3/6] BATCH_SIZE=32: oom after 4.1s`.
pub fn run_line(done: usize, total: usize, config: &Config, r: &RunRecord) -> String {
    let what = match r.status {
        Some(Status::Ok) => format!(
            "ok, peak reserved {}, allocated {}{}",
            bytes(r.peak_reserved_bytes),
            bytes(r.peak_allocated_bytes),
            r.step_seconds_median
                .map_or(String::new(), |s| format!(", {s:.3} s/step"))
        ),
        Some(Status::Oom) => "OOM".into(),
        Some(Status::Timeout) => "timed out, killed".into(),
        Some(Status::Failed) | None => format!(
            "failed (exit {})",
            r.exit_code.map_or("-".into(), |c| c.to_string())
        ),
    };
    format!(
        "[{done}/{total}] {}: {what} in {:.1}s",
        config.label(),
        r.duration_seconds
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::sweep::grid::{parse_vary, product};

    fn rec(b: &str, status: Status, peak: Option<u64>) -> RunRecord {
        RunRecord {
            values: [("B".to_string(), b.to_string())].into(),
            status: Some(status),
            peak_reserved_bytes: peak,
            duration_seconds: 2.0,
            ..Default::default()
        }
    }

    #[test]
    fn the_table_aligns_and_shows_unknowns_as_dashes() {
        let mut verify = rec("12", Status::Ok, Some(2 << 30));
        verify.trial = Some("the model predicts …".into());
        let t = table(
            &["B".into()],
            &[
                rec("8", Status::Ok, Some(1 << 30)),
                rec("16", Status::Oom, None),
                verify,
            ],
        );
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 5, "{t}");
        assert!(lines[0].starts_with("#    B    STATUS   RESERVED"), "{t}");
        assert!(lines[1].contains("ok       1.0GiB"), "{t}");
        assert!(lines[2].contains("oom      -"), "{t}");
        assert!(lines[3].starts_with("0*   12"), "{t}");
        assert!(lines[4].starts_with("* run after the grid"), "{t}");
    }

    #[test]
    fn progress_lines_say_how_each_run_ended() {
        let grid = product(&[parse_vary("B=8").unwrap()]).unwrap();
        let line = run_line(1, 4, &grid[0], &rec("8", Status::Oom, None));
        assert_eq!(line, "[1/4] B=8: OOM in 2.0s");
    }

    #[test]
    fn a_result_round_trips_through_json() {
        let r = SweepResult {
            kind: KIND.into(),
            version: 1,
            started_at: "2026-01-01T00:00:00Z".into(),
            command: vec!["python".into()],
            variables: vec!["B".into()],
            step_budget: Some(5),
            timeout_seconds: 60.0,
            metric: Metric::Reserved,
            headroom: 0.1,
            limit_bytes: None,
            nvml: false,
            verify_runs: 4,
            agent_interval: "250ms".into(),
            interrupted: false,
            note: None,
            runs: vec![rec("8", Status::Ok, Some(5))],
            models: vec![],
        };
        let json = serde_json::to_string(&r).unwrap();
        assert!(json.contains("\"kind\":\"memprofSweep\""));
        assert!(json.contains("\"peakReservedBytes\":5"));
        assert!(json.contains("\"status\":\"ok\""));
        assert_eq!(serde_json::from_str::<SweepResult>(&json).unwrap(), r);
    }
}
