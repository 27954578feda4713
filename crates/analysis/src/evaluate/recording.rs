//! Recordings with their truth, as `bench/gpu/record.sh` writes a set (one
//! folder per set; per scenario NAME.trace.csv, NAME.pushes.jsonl,
//! NAME.summary.json, NAME.steps.csv, NAME.sidecar.log; plan.txt and
//! schedule.csv for the set) and as the repository's fixtures carry one (a
//! trace CSV whose `#` lines say `leak_from_s=…`, `oom_at_s=…`).
//!
//! Pure: files come through a reader the caller supplies (the CLI reads
//! the folder), so parsing is unit-tested on strings.

use memprof_api::agent::Push;
use memprof_api::trace::{parse_trace, TraceRow};
use serde_json::Value;

/// What really happened in a scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TruthKind {
    /// A leak that ended in a CUDA OOM.
    Oom,
    /// A leak that did not reach an OOM before the run ended.
    Leak,
    /// No leak.
    None,
}

impl TruthKind {
    /// `oom`, `leak` or `none`.
    pub fn as_str(self) -> &'static str {
        match self {
            TruthKind::Oom => "oom",
            TruthKind::Leak => "leak",
            TruthKind::None => "none",
        }
    }

    /// Whether memory leaked.
    pub fn leaks(self) -> bool {
        self != TruthKind::None
    }
}

/// The truth of one scenario; times in the trace's clock (seconds).
#[derive(Clone, Debug, PartialEq)]
pub struct Truth {
    /// What happened.
    pub kind: TruthKind,
    /// The trainer's start.
    pub start: f64,
    /// When the leak began.
    pub leak_from: Option<f64>,
    /// When the leak's kept bytes reached 1 % of the GPU (from the step log).
    pub visible: Option<f64>,
    /// When CUDA raised the OOM.
    pub oom_at: Option<f64>,
    /// When the trainer ended (OOM, its duration, or the end of the trace).
    pub end: f64,
    /// The leak's measured rate, bytes per second.
    pub leak_rate: Option<f64>,
}

/// One scenario: its truth, its NVML trace and the agent's pushes.
#[derive(Clone, Debug)]
pub struct Recording {
    /// Scenario or file name.
    pub name: String,
    /// What happened.
    pub truth: Truth,
    /// NVML samples, `t` in the same clock as the truth and the pushes.
    pub rows: Vec<TraceRow>,
    /// The agent's pushes with the time the sidecar received them.
    pub pushes: Vec<(f64, Push)>,
    /// Pushes the sidecar's validation refuses (left out of the replay).
    pub refused_pushes: usize,
    /// The UUID of GPU 0 as the agent named it (NVML's trace has none).
    pub uuid: Option<String>,
}

/// Why a recording could not be read; the message names the file.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum RecordingError {
    /// A file the scenario needs is missing.
    #[error("{0}: missing (a record.sh folder has NAME.trace.csv and NAME.summary.json per scenario, and plan.txt)")]
    Missing(String),
    /// A file that is not what record.sh writes.
    #[error("{file}: {why}")]
    Invalid {
        /// The file.
        file: String,
        /// What is wrong.
        why: String,
    },
}

fn invalid(file: &str, why: impl Into<String>) -> RecordingError {
    RecordingError::Invalid {
        file: file.into(),
        why: why.into(),
    }
}

/// The scenarios of a record.sh set, in the order they ran, with their
/// truth kind: schedule.csv's rows that ran, else plan.txt's.
pub fn set_scenarios(read: &dyn Fn(&str) -> Option<String>) -> Vec<(String, TruthKind)> {
    let plan: Vec<(String, TruthKind)> = read("plan.txt")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let kind = match *f.get(2)? {
                "oom" => TruthKind::Oom,
                "leak" => TruthKind::Leak,
                "none" => TruthKind::None,
                _ => return None,
            };
            Some((f.get(1)?.to_string(), kind))
        })
        .collect();
    let ran: Vec<String> = read("schedule.csv")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            let ok = f.get(1).is_some_and(|go| !go.is_empty());
            ok.then(|| f[0].to_string())
        })
        .collect();
    if ran.is_empty() {
        return plan;
    }
    ran.into_iter()
        .filter_map(|n| plan.iter().find(|(p, _)| *p == n).cloned())
        .collect()
}

/// One scenario of a record.sh set.
pub fn read_scenario(
    read: &dyn Fn(&str) -> Option<String>,
    name: &str,
    kind: TruthKind,
) -> Result<Recording, RecordingError> {
    let file = |ext: &str| format!("{name}.{ext}");
    let need = |ext: &str| read(&file(ext)).ok_or_else(|| RecordingError::Missing(file(ext)));
    let summary: Value = serde_json::from_str(&need("summary.json")?)
        .map_err(|e| invalid(&file("summary.json"), e.to_string()))?;
    let num = |k: &str| summary.get(k).and_then(Value::as_f64);
    let start = num("start").ok_or_else(|| invalid(&file("summary.json"), "no start"))?;
    let origin = read(&file("sidecar.log"))
        .and_then(|log| sidecar_origin(&log))
        .unwrap_or(start);
    let mut rows = parse_trace(&need("trace.csv")?)
        .map_err(|(line, why)| invalid(&file("trace.csv"), format!("line {line}: {why}")))?;
    for r in &mut rows {
        r.t += origin;
    }
    let (pushes, refused_pushes) = read(&file("pushes.jsonl"))
        .map(|text| parse_pushes(&text))
        .unwrap_or_default();
    let visible = match (read(&file("steps.csv")), num("totalBytes")) {
        (Some(steps), Some(total)) => visible_at(&steps, total),
        _ => None,
    };
    let oom_at = num("oomAt");
    let end = num("end")
        .or(oom_at)
        .or(rows.last().map(|r| r.t))
        .unwrap_or(start);
    let uuid = pushes
        .iter()
        .find_map(|(_, p)| p.devices.iter().find(|d| d.index == 0)?.uuid.clone());
    Ok(Recording {
        name: name.into(),
        truth: Truth {
            kind,
            start,
            leak_from: num("leakFrom").filter(|_| kind.leaks()),
            visible: visible.filter(|_| kind.leaks()),
            oom_at: oom_at.filter(|_| kind == TruthKind::Oom),
            end,
            leak_rate: num("leakMeasuredMBps").map(|m| m * 1e6),
        },
        rows,
        pushes,
        refused_pushes,
        uuid,
    })
}

/// The sidecar's clock origin (`--trace-out` writes seconds since it): the
/// time of its first risk transition, logged right after its first sample
/// (`t_s` ≈ 0.001), else of its first line.
fn sidecar_origin(log: &str) -> Option<f64> {
    let stamp = |l: &str| -> Option<f64> {
        let ts: jiff::Timestamp = l.split_whitespace().next()?.parse().ok()?;
        Some(ts.as_millisecond() as f64 / 1000.0)
    };
    log.lines()
        .find(|l| l.contains("risk changed"))
        .and_then(stamp)
        .or_else(|| log.lines().find_map(stamp))
}

/// Pushes as the proxy logged them (`{"t": received, "push": {...}}` per
/// line), each validated as the sidecar validates it; refused ones counted.
pub fn parse_pushes(text: &str) -> (Vec<(f64, Push)>, usize) {
    let mut out = Vec::new();
    let mut refused = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let parsed = serde_json::from_str::<Value>(line).ok().and_then(|v| {
            let t = v.get("t")?.as_f64()?;
            let body = serde_json::to_vec(v.get("push")?).ok()?;
            memprof_api::agent::parse(&body).ok().map(|p| (t, p))
        });
        match parsed {
            Some(p) => out.push(p),
            None => refused += 1,
        }
    }
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    (out, refused)
}

/// First step-log time at which the leak's kept bytes reached 1 % of the GPU.
fn visible_at(steps: &str, total: f64) -> Option<f64> {
    let mut lines = steps.lines();
    let head: Vec<&str> = lines.next()?.split(',').collect();
    let ti = head.iter().position(|h| *h == "t")?;
    let ki = head.iter().position(|h| *h == "kept")?;
    lines.find_map(|l| {
        let f: Vec<&str> = l.split(',').collect();
        let kept: f64 = f.get(ki)?.parse().ok()?;
        (kept >= 0.01 * total).then(|| f.get(ti)?.parse().ok())?
    })
}

/// A fixture trace: the truth from its `#` lines (`trainer_start_s`,
/// `leak_from_s`, `oom_at_s`; no `oom_at_s`: no leak).
pub fn read_fixture(name: &str, text: &str) -> Result<Recording, RecordingError> {
    let meta = |key: &str| -> Option<f64> {
        text.lines()
            .filter_map(|l| l.strip_prefix('#'))
            .filter_map(|l| l.trim().split_once('='))
            .find(|(k, _)| k.trim() == key)
            .and_then(|(_, v)| v.trim().parse().ok())
    };
    let rows =
        parse_trace(text).map_err(|(line, why)| invalid(name, format!("line {line}: {why}")))?;
    let first = rows.first().map_or(0.0, |r| r.t);
    let last = rows.last().map_or(0.0, |r| r.t);
    let oom_at = meta("oom_at_s");
    let leak_from = meta("leak_from_s");
    let kind = match (oom_at, leak_from) {
        (Some(_), _) => TruthKind::Oom,
        (None, Some(_)) => TruthKind::Leak,
        _ => TruthKind::None,
    };
    Ok(Recording {
        name: name.into(),
        truth: Truth {
            kind,
            start: meta("trainer_start_s").unwrap_or(first),
            leak_from,
            visible: None,
            oom_at,
            end: oom_at.unwrap_or(last),
            leak_rate: meta("leak_mb_per_s").map(|m| m * 1e6),
        },
        rows,
        pushes: Vec::new(),
        refused_pushes: 0,
        uuid: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_sh_scenario_is_read_in_the_sidecars_clock() {
        let files = |name: &str| -> Option<String> {
            Some(match name {
                "plan.txt" => "dev leak1 oom 39 62 --x\ndev flat none 10 20 --y\n".into(),
                "schedule.csv" => "name,go,end\nleak1,100.0,140.0\nflat,,,,skipped\n".into(),
                "leak1.summary.json" => r#"{"start": 100.5, "leakFrom": 106.0, "oomAt": 139.0, "end": 139.0, "totalBytes": 1000, "leakMeasuredMBps": 2.0}"#.into(),
                "leak1.sidecar.log" => "1970-01-01T00:01:40.000Z  INFO x: all GPUs\n1970-01-01T00:01:40.250Z  INFO memprof_sidecar::run: risk changed from=none to=low\n".into(),
                "leak1.trace.csv" => "t_s,gpu,used_bytes,total_bytes\n0.001,0,10,1000\n1.001,0,20,1000\n".into(),
                "leak1.steps.csv" => "t,step,kept\n106.5,1,5\n107.5,2,10\n".into(),
                "leak1.pushes.jsonl" => concat!(
                    r#"{"t": 101.0, "push": {"version": 1, "time": 101.0, "devices": [{"index": 0, "uuid": "GPU-x", "allocatedBytes": 1, "reservedBytes": 2}]}}"#, "\n",
                    r#"{"t": 102.0, "push": {"version": 1, "time": 102.0, "devices": [{"index": 0, "allocatedBytes": 3, "reservedBytes": 2}]}}"#, "\n"
                ).into(),
                _ => return None,
            })
        };
        assert_eq!(
            set_scenarios(&files),
            vec![("leak1".to_string(), TruthKind::Oom)]
        );
        let r = read_scenario(&files, "leak1", TruthKind::Oom).unwrap();
        assert!((r.rows[0].t - 100.251).abs() < 1e-6, "{}", r.rows[0].t);
        assert_eq!(r.truth.visible, Some(107.5));
        assert_eq!(r.truth.oom_at, Some(139.0));
        assert_eq!(r.truth.leak_rate, Some(2e6));
        assert_eq!((r.pushes.len(), r.refused_pushes), (1, 1));
        assert_eq!(r.uuid.as_deref(), Some("GPU-x"));
        assert!(matches!(
            read_scenario(&files, "flat", TruthKind::None),
            Err(RecordingError::Missing(f)) if f == "flat.summary.json"
        ));
    }

    #[test]
    fn a_fixture_trace_carries_its_truth_in_comments() {
        let text = "# leak_from_s=5\n# oom_at_s=20.5\nt_s,gpu,used_bytes,total_bytes\n0,0,1,10\n1,0,2,10\n";
        let r = read_fixture("f.csv", text).unwrap();
        assert_eq!(r.truth.kind, TruthKind::Oom);
        assert_eq!((r.truth.leak_from, r.truth.end), (Some(5.0), 20.5));
        let r = read_fixture("g.csv", "t_s,gpu,used_bytes,total_bytes\n0,0,1,10\n").unwrap();
        assert_eq!(r.truth.kind, TruthKind::None);
    }
}
