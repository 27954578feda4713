//! Recordings with their truth, as `bench/gpu/record.sh` writes a set (one
//! folder per set; per scenario NAME.trace.csv, NAME.pushes.jsonl,
//! NAME.summary.json, NAME.steps.csv, NAME.sidecar.log; plan.txt and
//! schedule.csv for the set; NAME.processes.csv, NVML's per-process usage,
//! where recorded) and as the repository's fixtures carry one (a trace CSV
//! whose `#` lines say `leak_from_s=…`, `oom_at_s=…`).
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
    /// An OOM of another cause than a leak (the summary's `cause`: growing
    /// demand, a neighbour, fragmentation, a spike).
    Other,
}

impl TruthKind {
    /// `oom`, `leak` or `none`.
    pub fn as_str(self) -> &'static str {
        match self {
            TruthKind::Oom => "oom",
            TruthKind::Leak => "leak",
            TruthKind::None => "none",
            TruthKind::Other => "other",
        }
    }

    /// `oom`, `leak`, `none` or `other`.
    pub fn parse(s: &str) -> Option<TruthKind> {
        Some(match s {
            "oom" => TruthKind::Oom,
            "leak" => TruthKind::Leak,
            "none" => TruthKind::None,
            "other" => TruthKind::Other,
            _ => return None,
        })
    }

    /// Whether memory leaked.
    pub fn leaks(self) -> bool {
        matches!(self, TruthKind::Oom | TruthKind::Leak)
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
    /// What drove memory: `leak`, `growingDemand`, `neighbour`,
    /// `fragmentation`, `spike`; `churn`, `varlen`, `steady` (or `legit` in
    /// a set recorded before causes were named) for runs that must raise
    /// nothing; `remediation` for a run the agent's helper kept alive.
    pub cause: String,
    /// When the cause began (the leak's start for a leak).
    pub cause_from: Option<f64>,
}

/// Causes of runs on which nothing may be raised (`load`: weights arriving
/// at disk speed, then steady training).
pub const LEGITIMATE: [&str; 5] = ["churn", "varlen", "steady", "legit", "load"];

impl Truth {
    /// Whether nothing may be raised on this run.
    pub fn legitimate(&self) -> bool {
        LEGITIMATE.contains(&self.cause.as_str())
    }
}

/// NVML's per-process usage of one GPU at one poll.
#[derive(Clone, Debug, PartialEq)]
pub struct ProcessPoll {
    /// Poll time, in the recording's clock.
    pub t: f64,
    /// The GPU's NVML index (as the trace numbers it).
    pub index: u32,
    /// (pid, bytes) of each compute process.
    pub list: Vec<(u32, u64)>,
}

/// NVML's utilization of one GPU at one time (bench/gpu/proc_poll.py's
/// NAME.utilization.csv).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct UtilizationPoll {
    /// Poll time, in the recording's clock.
    pub t: f64,
    /// The GPU's NVML index (as the trace numbers it).
    pub index: u32,
    /// Percent of the sample period in which a kernel ran.
    pub percent: u32,
}

/// NVML's PCIe receive throughput of one GPU at one time
/// (bench/gpu/proc_poll.py's NAME.received.csv).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReceivedPoll {
    /// Poll time, in the recording's clock.
    pub t: f64,
    /// The GPU's NVML index (as the trace numbers it).
    pub index: u32,
    /// Bytes per second received over PCIe (NVML samples 20 ms).
    pub bytes_per_second: u64,
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
    /// NVML's per-process usage, oldest first (empty where not recorded).
    pub processes: Vec<ProcessPoll>,
    /// NVML's utilization, oldest first (empty where not recorded).
    pub utilization: Vec<UtilizationPoll>,
    /// NVML's PCIe receive throughput, oldest first (empty where not
    /// recorded: every set before 2026-11-29).
    pub received: Vec<ReceivedPoll>,
    /// The UUID of the trainer's GPU as the agent named it (NVML's trace
    /// has none): the agent's device 0.
    pub uuid: Option<String>,
    /// The trace's index of that GPU: the trace's only GPU (a sidecar
    /// pinned to one GPU by UUID numbers it by its NVML index), else 0.
    pub uuid_gpu: u32,
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
            let kind = TruthKind::parse(f.get(2)?)?;
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
    let processes = match read(&file("processes.csv")) {
        Some(text) => parse_processes(&text).map_err(|(line, why)| {
            invalid(&file("processes.csv"), format!("line {line}: {why}"))
        })?,
        None => Vec::new(),
    };
    let utilization = match read(&file("utilization.csv")) {
        Some(text) => parse_utilization(&text).map_err(|(line, why)| {
            invalid(&file("utilization.csv"), format!("line {line}: {why}"))
        })?,
        None => Vec::new(),
    };
    let received = match read(&file("received.csv")) {
        Some(text) => parse_received(&text)
            .map_err(|(line, why)| invalid(&file("received.csv"), format!("line {line}: {why}")))?,
        None => Vec::new(),
    };
    let mut truth = truth_of(&summary, kind, start, visible);
    if num("end").is_none() && num("oomAt").is_none() {
        truth.end = rows.last().map_or(start, |r| r.t);
    }
    Ok(Recording {
        name: name.into(),
        uuid: agent_uuid(&pushes),
        uuid_gpu: only_gpu(&rows),
        truth,
        rows,
        pushes,
        refused_pushes,
        processes,
        utilization,
        received,
    })
}

/// The truth a record.sh summary states (its end: the summary's `end`, else
/// its OOM, else its start; the caller falls back on the trace).
fn truth_of(summary: &Value, kind: TruthKind, start: f64, visible: Option<f64>) -> Truth {
    let num = |k: &str| summary.get(k).and_then(Value::as_f64);
    let leak_from = num("leakFrom").filter(|_| kind.leaks());
    Truth {
        kind,
        start,
        leak_from,
        visible: visible.filter(|_| kind.leaks()),
        oom_at: num("oomAt").filter(|_| kind != TruthKind::Leak),
        end: num("end").or(num("oomAt")).unwrap_or(start),
        leak_rate: num("leakMeasuredMBps").map(|m| m * 1e6),
        cause_from: num("causeFrom").or(leak_from),
        cause: summary
            .get("cause")
            .and_then(Value::as_str)
            .map_or_else(|| default_cause(kind).to_string(), str::to_string),
    }
}

/// The cause of a scenario recorded before causes were named.
fn default_cause(kind: TruthKind) -> &'static str {
    match kind {
        TruthKind::Oom | TruthKind::Leak => "leak",
        TruthKind::None => "legit",
        TruthKind::Other => "other",
    }
}

fn agent_uuid(pushes: &[(f64, Push)]) -> Option<String> {
    pushes
        .iter()
        .find_map(|(_, p)| p.devices.iter().find(|d| d.index == 0)?.uuid.clone())
}

fn only_gpu(rows: &[TraceRow]) -> u32 {
    match rows.first() {
        Some(first) if rows.iter().all(|r| r.gpu == first.gpu) => first.gpu,
        _ => 0,
    }
}

/// `t,index,percent` rows (bench/gpu/proc_poll.py --utilization), in time order.
pub fn parse_utilization(text: &str) -> Result<Vec<UtilizationPoll>, (usize, String)> {
    let rows = parse_timed(text, "percent", |v| {
        v.parse::<u32>().ok().filter(|&p| p <= 100)
    })?;
    Ok(rows
        .into_iter()
        .map(|(t, index, percent)| UtilizationPoll { t, index, percent })
        .collect())
}

/// `t,index,bytes_per_second` rows (bench/gpu/proc_poll.py --received), in
/// time order.
pub fn parse_received(text: &str) -> Result<Vec<ReceivedPoll>, (usize, String)> {
    let rows = parse_timed(text, "bytes_per_second", |v| v.parse::<u64>().ok())?;
    Ok(rows
        .into_iter()
        .map(|(t, index, bytes_per_second)| ReceivedPoll {
            t,
            index,
            bytes_per_second,
        })
        .collect())
}

/// One poller row: time, GPU index, value.
type Timed<V> = (f64, u32, V);

/// `t,index,VALUE` rows in time order (the pollers' CSVs, a header line
/// first): `value` reads the third field, `None` where it is not valid.
/// An error names the line (1-based) and what is wrong there.
fn parse_timed<V>(
    text: &str,
    name: &str,
    value: impl Fn(&str) -> Option<V>,
) -> Result<Vec<Timed<V>>, (usize, String)> {
    let mut out: Vec<Timed<V>> = Vec::new();
    for (i, line) in text.lines().enumerate().skip(1) {
        if line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let bad = |what: &str| (i + 1, format!("{what}: want t,index,{name}"));
        let [t, index, v] = f[..] else {
            return Err(bad("not 3 fields"));
        };
        let t: f64 = t.parse().map_err(|_| bad("t"))?;
        let index = index.parse().map_err(|_| bad("index"))?;
        let v = value(v).ok_or_else(|| bad(name))?;
        if out.last().is_some_and(|q| q.0 > t) {
            return Err(bad("a time before the previous row's"));
        }
        out.push((t, index, v));
    }
    Ok(out)
}

/// `t,index,pid,bytes` rows (bench/gpu/proc_poll.py) grouped into polls:
/// rows with the same time and GPU are one poll.
pub fn parse_processes(text: &str) -> Result<Vec<ProcessPoll>, (usize, String)> {
    let mut out: Vec<ProcessPoll> = Vec::new();
    for (i, line) in text.lines().enumerate().skip(1) {
        if line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split(',').collect();
        let bad = |what: &str| (i + 1, format!("{what}: want t,index,pid,bytes"));
        if f.len() != 4 {
            return Err(bad("not 4 fields"));
        }
        let t: f64 = f[0].trim().parse().map_err(|_| bad("t"))?;
        let index: u32 = f[1].trim().parse().map_err(|_| bad("index"))?;
        let pid: u32 = f[2].trim().parse().map_err(|_| bad("pid"))?;
        let bytes: u64 = f[3].trim().parse().map_err(|_| bad("bytes"))?;
        match out.last_mut() {
            Some(p) if p.t == t && p.index == index => p.list.push((pid, bytes)),
            _ => out.push(ProcessPoll {
                t,
                index,
                list: vec![(pid, bytes)],
            }),
        }
    }
    Ok(out)
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
            cause: default_cause(kind).into(),
            cause_from: leak_from,
        },
        uuid_gpu: only_gpu(&rows),
        rows,
        pushes: Vec::new(),
        refused_pushes: 0,
        processes: Vec::new(),
        utilization: Vec::new(),
        received: Vec::new(),
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
    fn a_causes_scenario_reads_its_cause_and_the_process_usage() {
        let files = |name: &str| -> Option<String> {
            Some(match name {
                "plan.txt" => "causes-dev n other 60 70 --x\ncauses-dev c none 18 22 --y\n".into(),
                "n.summary.json" => r#"{"start": 100.0, "cause": "neighbour", "causeFrom": 110.0, "oomAt": 150.0, "end": 160.0}"#.into(),
                "n.trace.csv" => "t_s,gpu,used_bytes,total_bytes\n0,1,10,1000\n1,1,20,1000\n".into(),
                "n.processes.csv" => "t,index,pid,bytes\n101.0,1,7,5\n101.0,1,8,6\n102.0,1,7,5\n".into(),
                "c.summary.json" => r#"{"start": 100.0, "cause": "churn", "end": 118.0}"#.into(),
                "c.trace.csv" => "t_s,gpu,used_bytes,total_bytes\n0,0,10,1000\n".into(),
                _ => return None,
            })
        };
        let kinds: Vec<TruthKind> = set_scenarios(&files).into_iter().map(|(_, k)| k).collect();
        assert_eq!(kinds, vec![TruthKind::Other, TruthKind::None]);
        let n = read_scenario(&files, "n", TruthKind::Other).unwrap();
        assert_eq!(
            (n.truth.cause.as_str(), n.truth.cause_from, n.truth.oom_at),
            ("neighbour", Some(110.0), Some(150.0))
        );
        assert!(!n.truth.kind.leaks() && !n.truth.legitimate() && n.truth.leak_from.is_none());
        assert_eq!(n.uuid_gpu, 1);
        assert_eq!(
            n.processes,
            vec![
                ProcessPoll {
                    t: 101.0,
                    index: 1,
                    list: vec![(7, 5), (8, 6)]
                },
                ProcessPoll {
                    t: 102.0,
                    index: 1,
                    list: vec![(7, 5)]
                },
            ]
        );
        let c = read_scenario(&files, "c", TruthKind::None).unwrap();
        assert!(c.truth.legitimate() && c.processes.is_empty());
        assert_eq!(
            parse_processes("t,index,pid,bytes\n1,0,x,5\n")
                .unwrap_err()
                .0,
            2
        );
    }

    #[test]
    fn utilization_rows_are_read_in_order_and_bad_ones_name_their_line() {
        let u = parse_utilization("t,index,percent\n1.0,0,3\n\n2.0,0,90\n").unwrap();
        assert_eq!(u.len(), 2);
        assert_eq!((u[1].t, u[1].index, u[1].percent), (2.0, 0, 90));
        for (bad, line) in [
            ("t,index,percent\n1,0\n", 2),
            ("t,index,percent\n1,0,101\n", 2),
            ("t,index,percent\n2,0,1\n1,0,1\n", 3),
            ("t,index,percent\n1,x,1\n", 2),
        ] {
            assert_eq!(parse_utilization(bad).unwrap_err().0, line, "{bad}");
        }
    }

    #[test]
    fn pcie_rows_are_read_in_order_and_bad_ones_name_their_line() {
        let r = parse_received("t,index,bytes_per_second\n1.0,0,5\n2.0,1,6300000000\n").unwrap();
        assert_eq!(
            (r[1].t, r[1].index, r[1].bytes_per_second),
            (2.0, 1, 6_300_000_000)
        );
        for (bad, line) in [
            ("h\n1,0\n", 2),
            ("h\n1,0,-5\n", 2),
            ("h\n2,0,1\n1,0,1\n", 3),
        ] {
            assert_eq!(parse_received(bad).unwrap_err().0, line, "{bad}");
        }
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
