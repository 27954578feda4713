//! What `memprof profile` shows: a status line per GPU while it runs, the
//! summary table at the end, and the timeline chart. Pure functions over the
//! sidecar's reports, transitions and trace.

use super::sidecar::Transition;
use crate::output::Table;
use crate::plot::{self, HLine, LineChart, Mark, Series, Style, Unit};
use memprof_api::trace::TraceRow;
use memprof_api::{
    format_bytes, format_duration, DataSource, GpuReport, MemoryReportSpec, RiskLevel,
};
use std::collections::{BTreeMap, VecDeque};

/// How a GPU is named on screen: its index for the sampler's GPUs; a GPU
/// only the trainer's agent sees (another source than the report's) by its
/// CUDA ordinal, which is not an NVML index and may equal a sampled GPU's.
pub fn gpu_label(r: &MemoryReportSpec, g: &GpuReport) -> String {
    if is_sampled(r, g) {
        g.index.to_string()
    } else {
        format!("cuda:{} (agent)", g.index)
    }
}

/// Whether `g` is one of the sampler's GPUs (its index is the sampler's,
/// as in the trace and the risk transitions).
pub fn is_sampled(r: &MemoryReportSpec, g: &GpuReport) -> bool {
    g.source == r.summary.source
}

/// Utilization and recent memory of one GPU, from the reports polled.
#[derive(Clone, Debug, Default)]
struct Seen {
    util_sum: f64,
    util_n: u32,
    util_max: Option<u32>,
    recent: VecDeque<f64>,
}

/// What the CLI saw of the reports it polled (about once a second), per GPU
/// UUID: an index alone is ambiguous when the agent's CUDA ordinal 0 and the
/// sampler's GPU 0 are different GPUs.
#[derive(Clone, Debug, Default)]
pub struct Tracker {
    gpus: BTreeMap<String, Seen>,
}

/// Used memory values kept per GPU for the status line's sparkline.
const RECENT: usize = 24;

impl Tracker {
    /// Takes a polled report into account.
    pub fn observe(&mut self, r: &MemoryReportSpec) {
        for g in &r.gpus {
            let s = self.gpus.entry(g.uuid.clone()).or_default();
            if let Some(u) = g.utilization_percent {
                s.util_sum += f64::from(u);
                s.util_n += 1;
                s.util_max = Some(s.util_max.map_or(u, |m| m.max(u)));
            }
            s.recent.push_back(g.used_bytes as f64);
            if s.recent.len() > RECENT {
                s.recent.pop_front();
            }
        }
    }

    /// Mean and max utilization of a GPU over the polled reports, percent.
    pub fn utilization(&self, uuid: &str) -> (Option<f64>, Option<u32>) {
        match self.gpus.get(uuid) {
            Some(s) if s.util_n > 0 => (Some(s.util_sum / f64::from(s.util_n)), s.util_max),
            _ => (None, None),
        }
    }

    /// The GPU's recent used memory as a sparkline.
    pub fn sparkline(&self, uuid: &str) -> String {
        self.gpus.get(uuid).map_or(String::new(), |s| {
            plot::sparkline(&s.recent.iter().copied().collect::<Vec<_>>())
        })
    }
}

fn percent(used: u64, total: u64) -> String {
    if total == 0 {
        "-".into()
    } else {
        format!("{:.0}%", used as f64 * 100.0 / total as f64)
    }
}

fn growth(g: &GpuReport) -> String {
    g.growth_text()
}

fn tto(g: &GpuReport) -> String {
    g.tto_text()
}

/// `sim` is said in words wherever numbers are shown: they are not hardware.
pub fn source_words(source: DataSource) -> &'static str {
    match source {
        DataSource::Sim => "sim (simulated, not hardware)",
        DataSource::Agent => "agent (the trainer's allocator)",
        DataSource::Nvml => "nvml",
        DataSource::Trace => "trace (a recorded trace, replayed)",
    }
}

/// One status line per GPU, for the live display.
pub fn status_lines(r: &MemoryReportSpec, tr: &Tracker) -> Vec<String> {
    r.gpus
        .iter()
        .map(|g| {
            let util = g
                .utilization_percent
                .map_or("-".into(), |u| format!("{u}%"));
            format!(
                "GPU {}  used {} / {} ({})  peak {}  util {}  risk {}  tto {}  {}",
                gpu_label(r, g),
                format_bytes(g.used_bytes),
                format_bytes(g.total_bytes),
                percent(g.used_bytes, g.total_bytes),
                format_bytes(g.peak_bytes),
                util,
                g.risk,
                tto(g),
                tr.sparkline(&g.uuid)
            )
        })
        .collect()
}

/// A transition as a line for a person.
pub fn transition_line(t: &Transition) -> String {
    let gpu = t.gpu.map_or(String::new(), |g| format!(" (GPU {g})"));
    let tto = t.time_to_oom_seconds.map_or(String::new(), |s| {
        format!(", OOM in {}", format_duration(s))
    });
    format!(
        "{:>7.1}s  risk {} -> {}{gpu}{tto}",
        t.elapsed_seconds, t.from, t.to
    )
}

/// The worst risk each GPU reached during the run, from the transitions.
pub fn worst_risks(transitions: &[Transition]) -> BTreeMap<u32, RiskLevel> {
    let mut m: BTreeMap<u32, RiskLevel> = BTreeMap::new();
    for t in transitions {
        if let Some(g) = t.gpu {
            let e = m.entry(g).or_default();
            *e = (*e).max(t.to);
        }
    }
    m
}

/// What to do about a GPU, in one sentence, from its final state, its peak
/// and the worst risk it reached.
pub fn advice(g: &GpuReport, worst: RiskLevel) -> String {
    let fill = g.peak_bytes as f64 / g.total_bytes.max(1) as f64;
    match g.risk {
        RiskLevel::Critical => "OOM imminent: stop or shrink the batch now".into(),
        RiskLevel::High | RiskLevel::Medium if g.time_to_oom_seconds.is_some() => format!(
            "growing {} fills the GPU in {}: smaller batch, or find what grows",
            growth(g),
            tto(g)
        ),
        _ if fill >= 0.99 => format!(
            "memory reached the ceiling ({} of {}): likely an OOM; smaller batch, or find what grew",
            format_bytes(g.peak_bytes),
            format_bytes(g.total_bytes)
        ),
        _ if g.leak_suspected => {
            "memory between steps keeps growing: look for tensors kept across steps".into()
        }
        _ if worst >= RiskLevel::High => format!(
            "the risk reached {worst} during the run: look at the plot (--plot) for when"
        ),
        RiskLevel::High | RiskLevel::Medium => {
            "little headroom: a longer sequence or larger batch may not fit".into()
        }
        _ if g.spike_detected => {
            "a sudden jump was seen: check one-off allocations (eval, checkpoints)".into()
        }
        _ if g.peak_bytes == 0 => "no memory in use: is the job on this GPU?".into(),
        _ if fill < 0.5 => {
            "room to spare: a larger batch may fit (`memprof sweep` finds how large)".into()
        }
        _ => "ok".into(),
    }
}

/// What the summary is made of: the sidecar's final report, what the CLI
/// saw while polling, the trace's sample counts and the risk transitions.
pub struct Run<'a> {
    /// The final report.
    pub report: &'a MemoryReportSpec,
    /// Utilization and recent memory per GPU, as polled.
    pub tracker: &'a Tracker,
    /// Samples per sampled GPU (by index), from the trace.
    pub samples: &'a BTreeMap<u32, u64>,
    /// The risk transitions, in order.
    pub transitions: &'a [Transition],
    /// Seconds the profile ran.
    pub seconds: f64,
    /// The command's process id, when there was a command.
    pub pid: Option<u32>,
}

/// The summary printed at the end: a header, the table, advice per GPU,
/// then the agent's verdicts as `memprof report` shows them (one renderer,
/// over the same roll-up the operator runs) and the trainer's details.
pub fn summary(run: &Run<'_>) -> String {
    let r = run.report;
    let mut out = format!(
        "memprof profile: {}, {} GPU(s), source {}, {:.0} s, {} risk transition(s)\n",
        who(r, run.pid),
        r.gpus.len(),
        source_words(r.summary.source),
        run.seconds,
        run.transitions.len()
    );
    if r.gpus.is_empty() {
        out.push_str(&format!("no GPU to show: {}\n", blind_reason(r)));
        return out;
    }
    out.push_str(&table(run).render());
    let worst = worst_risks(run.transitions);
    for g in &r.gpus {
        let w = worst_of(r, g, &worst);
        out.push_str(&format!("GPU {}: {}\n", gpu_label(r, g), advice(g, w)));
    }
    crate::local::rollup::agent_words(&mut out, r);
    out
}

/// Whose run it was: the report's name (host, and `-rankN` under a
/// launcher), its rank and node, the command's pid.
fn who(r: &MemoryReportSpec, pid: Option<u32>) -> String {
    let mut s = if r.pod_name.is_empty() {
        "this machine".to_string()
    } else {
        r.pod_name.clone()
    };
    if let Some(rank) = r.rank {
        s.push_str(&format!(" (rank {rank}"));
        s.push_str(&pid.map_or(")".into(), |p| format!(", pid {p})")));
    } else if let Some(p) = pid {
        s.push_str(&format!(" (pid {p})"));
    }
    s
}

/// Why a report shows no GPU: its first condition's message.
pub fn blind_reason(r: &MemoryReportSpec) -> String {
    r.conditions
        .first()
        .map_or("no report condition".into(), |c| {
            super::sample::in_users_words(&c.message)
        })
}

/// The worst risk `g` reached: its transitions' (sampled GPUs only: they
/// name a sampler index) and its risk now.
fn worst_of(r: &MemoryReportSpec, g: &GpuReport, worst: &BTreeMap<u32, RiskLevel>) -> RiskLevel {
    let seen = match is_sampled(r, g) {
        true => worst.get(&g.index).copied().unwrap_or_default(),
        false => RiskLevel::None,
    };
    seen.max(g.risk)
}

/// The numbers of one GPU the summary table shows beyond the report's own
/// (free memory, utilization over the run, samples), computed here once for
/// the table and for the JSON `--output` ([`with_run_numbers`]).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunNumbers {
    /// Total minus used memory at the end.
    pub free_bytes: u64,
    /// Mean utilization over the reports polled, percent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub utilization_avg_percent: Option<f64>,
    /// Highest utilization over the reports polled, percent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub utilization_max_percent: Option<u32>,
    /// Samples of this GPU in the trace (the sampler's GPUs only: one the
    /// agent alone sees has none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub samples: Option<u64>,
}

/// [`RunNumbers`] of `g` over `run`.
pub fn run_numbers(run: &Run<'_>, g: &GpuReport) -> RunNumbers {
    let (avg, max) = run.tracker.utilization(&g.uuid);
    RunNumbers {
        free_bytes: g.total_bytes.saturating_sub(g.used_bytes),
        utilization_avg_percent: avg,
        utilization_max_percent: max,
        samples: is_sampled(run.report, g).then(|| run.samples.get(&g.index).copied().unwrap_or(0)),
    }
}

/// The report file as written, each GPU given its [`RunNumbers`] (what the
/// table shows): matched by UUID and index, every other field kept as the
/// sidecar wrote it, so `rollup`, `compare` and `fragment` read it as before.
pub fn with_run_numbers(report_json: &serde_json::Value, run: &Run<'_>) -> serde_json::Value {
    let mut out = report_json.clone();
    let Some(gpus) = out.get_mut("gpus").and_then(|g| g.as_array_mut()) else {
        return out;
    };
    for entry in gpus {
        let found = run.report.gpus.iter().find(|g| {
            entry["uuid"].as_str() == Some(g.uuid.as_str())
                && entry["index"].as_u64() == Some(u64::from(g.index))
        });
        let (Some(g), Some(fields)) = (found, entry.as_object_mut()) else {
            continue;
        };
        if let Ok(serde_json::Value::Object(numbers)) = serde_json::to_value(run_numbers(run, g)) {
            fields.extend(numbers);
        }
    }
    out
}

fn table(run: &Run<'_>) -> Table {
    let r = run.report;
    let mut t = Table::new([
        "GPU", "MODEL", "USED", "FREE", "TOTAL", "PEAK", "UTIL AVG", "UTIL MAX", "SAMPLES", "RISK",
        "GROWTH", "TTO", "CAUSE",
    ]);
    let worst = worst_risks(run.transitions);
    for g in &r.gpus {
        let n = run_numbers(run, g);
        let risk = match worst_of(r, g, &worst) {
            w if w > g.risk => format!("{} (was {w})", g.risk),
            _ => g.risk_text(),
        };
        t.row([
            gpu_label(r, g),
            g.model.clone(),
            format_bytes(g.used_bytes),
            format_bytes(n.free_bytes),
            format_bytes(g.total_bytes),
            format!(
                "{} ({})",
                format_bytes(g.peak_bytes),
                percent(g.peak_bytes, g.total_bytes)
            ),
            n.utilization_avg_percent
                .map_or("-".into(), |a| format!("{a:.0}%")),
            n.utilization_max_percent
                .map_or("-".into(), |m| format!("{m}%")),
            n.samples.map_or("-".into(), |s| s.to_string()),
            risk,
            growth(g),
            tto(g),
            g.cause_text().to_string(),
        ]);
    }
    t
}

/// Samples per GPU in a trace.
pub fn sample_counts(rows: &[TraceRow]) -> BTreeMap<u32, u64> {
    let mut m = BTreeMap::new();
    for r in rows {
        *m.entry(r.gpu).or_insert(0) += 1;
    }
    m
}

/// One line per distinct total memory, naming its GPUs when there are several.
fn total_lines(totals: &BTreeMap<u64, Vec<u32>>) -> Vec<HLine> {
    totals
        .iter()
        .map(|(total, gpus)| HLine {
            y: *total as f64,
            label: if totals.len() == 1 {
                "total memory".into()
            } else {
                let names: Vec<String> = gpus.iter().map(|g| format!("GPU {g}")).collect();
                format!("total of {}", names.join(", "))
            },
        })
        .collect()
}

/// Used memory of every sampled GPU over time, total memory, risk transitions.
pub fn timeline(
    rows: &[TraceRow],
    transitions: &[Transition],
    r: Option<&MemoryReportSpec>,
) -> LineChart {
    let mut per_gpu: BTreeMap<u32, Vec<(f64, f64)>> = BTreeMap::new();
    let mut totals: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
    for row in rows {
        per_gpu
            .entry(row.gpu)
            .or_default()
            .push((row.t, row.used_bytes as f64));
        let seen = totals.entry(row.total_bytes).or_default();
        if !seen.contains(&row.gpu) {
            seen.push(row.gpu);
        }
    }
    let model = |i: u32| {
        r.and_then(|r| r.gpus.iter().find(|g| g.index == i && is_sampled(r, g)))
            .map_or(String::new(), |g| format!(" ({})", g.model))
    };
    let source = r.map(|r| r.summary.source);
    let hlines = total_lines(&totals);
    LineChart {
        title: format!(
            "GPU memory used while profiling{}",
            match source {
                Some(DataSource::Sim) => " (simulated data)",
                Some(DataSource::Trace) => " (recorded trace)",
                _ => "",
            }
        ),
        x_label: "time since start".into(),
        x_unit: Unit::Seconds,
        y_label: "used memory".into(),
        y_unit: Unit::Bytes,
        series: per_gpu
            .into_iter()
            .map(|(i, pts)| Series::new(format!("GPU {i}{}", model(i)), pts, Style::Line))
            .collect(),
        hlines,
        marks: transitions
            .iter()
            .map(|t| Mark {
                x: t.elapsed_seconds,
                label: match t.gpu {
                    Some(g) => format!("GPU {g} {}", t.to),
                    None => t.to.to_string(),
                },
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_api::ReportSummary;

    const GIB: u64 = 1 << 30;

    fn gpu(index: u32, risk: RiskLevel) -> GpuReport {
        GpuReport {
            index,
            uuid: format!("GPU-{index}"),
            model: "sim".into(),
            total_bytes: 80 * GIB,
            used_bytes: 50 * GIB,
            peak_bytes: 60 * GIB,
            utilization_percent: Some(90),
            growth_bytes_per_second: 100.0 * 1024.0 * 1024.0,
            time_to_oom_seconds: Some(200.0),
            risk,
            source: DataSource::Sim,
            ..Default::default()
        }
    }

    fn run<'a>(
        report: &'a MemoryReportSpec,
        tracker: &'a Tracker,
        samples: &'a BTreeMap<u32, u64>,
        transitions: &'a [Transition],
    ) -> String {
        summary(&Run {
            report,
            tracker,
            samples,
            transitions,
            seconds: 30.0,
            pid: Some(42),
        })
    }

    fn report() -> MemoryReportSpec {
        MemoryReportSpec {
            sampled_at: "2026-11-22T10:00:00Z".into(),
            interval_ms: 1000,
            summary: ReportSummary {
                source: DataSource::Sim,
                ..Default::default()
            },
            gpus: vec![gpu(0, RiskLevel::Low), gpu(1, RiskLevel::High)],
            ..Default::default()
        }
    }

    #[test]
    fn the_summary_has_every_column_says_simulated_and_advises() {
        let mut tr = Tracker::default();
        tr.observe(&report());
        let mut r = report();
        r.gpus[0].utilization_percent = Some(50);
        tr.observe(&r);
        let s = run(&r, &tr, &BTreeMap::from([(0, 30), (1, 30)]), &[]);
        for want in [
            "simulated",
            "USED",
            "FREE",
            "TOTAL",
            "PEAK",
            "UTIL AVG",
            "UTIL MAX",
            "SAMPLES",
            "RISK",
            "GROWTH",
            "TTO",
            "70%",
            "+100MiB/s",
            "3m20s",
            "GPU 1: growing",
        ] {
            assert!(s.contains(want), "{want:?} missing from\n{s}");
        }
    }

    /// The JSON `--output` lacked what the table shows. Each GPU
    /// of the file gets the table's free memory, utilization and samples.
    #[test]
    fn the_report_file_gets_the_numbers_the_table_shows() {
        let mut tr = Tracker::default();
        tr.observe(&report());
        let mut r = report();
        r.gpus[0].utilization_percent = Some(50);
        tr.observe(&r);
        let mut agent = gpu(0, RiskLevel::Low);
        (agent.uuid, agent.source, agent.utilization_percent) =
            ("GPU-real".into(), DataSource::Agent, None);
        r.gpus.push(agent);
        let samples = BTreeMap::from([(0, 30), (1, 31)]);
        let run = Run {
            report: &r,
            tracker: &tr,
            samples: &samples,
            transitions: &[],
            seconds: 30.0,
            pid: None,
        };
        let written = serde_json::to_value(&r).unwrap();
        let json = with_run_numbers(&written, &run);
        let g = &json["gpus"];
        assert_eq!(g[0]["freeBytes"], 30 * GIB);
        assert_eq!(g[0]["utilizationAvgPercent"], 70.0);
        assert_eq!(g[0]["utilizationMaxPercent"], 90);
        assert_eq!(g[0]["samples"], 30);
        assert_eq!(g[1]["samples"], 31);
        // The agent's GPU has no samples and no utilization: left out, not 0.
        assert_eq!(g[2]["freeBytes"], 30 * GIB);
        assert!(g[2].get("samples").is_none() && g[2].get("utilizationAvgPercent").is_none());
        // Every field the sidecar wrote is kept; the file still reads as a report.
        assert_eq!(g[0]["peakBytes"], written["gpus"][0]["peakBytes"]);
        let back: MemoryReportSpec = serde_json::from_value(json).unwrap();
        assert_eq!(back, r);
        // The table prints the same numbers.
        let table = summary(&run);
        assert!(
            table.contains("70%") && table.contains("30.0GiB"),
            "{table}"
        );
    }

    /// The agent's CUDA ordinal 0 is not the simulated GPU 0: each keeps its
    /// own utilization, the agent's is labelled as such, and the agent's
    /// verdict is shown as `memprof report` shows it.
    #[test]
    fn the_agents_gpu_is_not_the_sampled_gpu_of_the_same_index() {
        let mut r = report();
        r.gpus.truncate(1);
        let mut agent = gpu(0, RiskLevel::High);
        (agent.uuid, agent.source, agent.utilization_percent) =
            ("GPU-real".into(), DataSource::Agent, None);
        r.gpus.push(agent);
        r.allocator = Some(memprof_api::AllocatorStats {
            growth: memprof_api::MemoryGrowth::Leak,
            allocated_bytes: 3 * GIB,
            reserved_bytes: 4 * GIB,
            phase_peaks: vec![memprof_api::PhasePeak {
                phase: "forward".into(),
                allocated_bytes: 5 * GIB,
            }],
            ..Default::default()
        });
        let mut tr = Tracker::default();
        tr.observe(&r);
        assert_eq!(tr.utilization("GPU-0"), (Some(90.0), Some(90)));
        assert_eq!(tr.utilization("GPU-real"), (None, None));
        let s = run(&r, &tr, &BTreeMap::from([(0, 30)]), &[]);
        let agent_row = s
            .lines()
            .find(|l| l.starts_with("cuda:0 (agent)"))
            .unwrap_or_else(|| panic!("no agent row in\n{s}"));
        assert!(!agent_row.contains("90%"), "{agent_row}");
        for want in [
            "GPU cuda:0 (agent): growing",
            "allocator (agent in 1 rank(s)): leak: allocated memory between steps keeps growing",
            "peak allocated by phase: forward 5.0GiB",
        ] {
            assert!(s.contains(want), "{want:?} missing from\n{s}");
        }
    }

    #[test]
    fn a_gpu_that_hit_the_ceiling_and_emptied_is_not_called_ok() {
        let mut g = gpu(0, RiskLevel::Low);
        (g.used_bytes, g.peak_bytes, g.time_to_oom_seconds) = (0, 80 * GIB, None);
        assert!(
            advice(&g, RiskLevel::Critical).contains("likely an OOM"),
            "{}",
            advice(&g, RiskLevel::Critical)
        );
        g.peak_bytes = 60 * GIB;
        assert!(advice(&g, RiskLevel::High).contains("reached high"));
        assert_eq!(advice(&g, RiskLevel::Low), "ok");
        let r = MemoryReportSpec {
            gpus: vec![g],
            ..report()
        };
        let t = Transition {
            elapsed_seconds: 1.0,
            from: RiskLevel::Low,
            to: RiskLevel::High,
            gpu: Some(0),
            used_bytes: None,
            growth_bytes_per_second: None,
            time_to_oom_seconds: None,
        };
        let s = run(&r, &Tracker::default(), &BTreeMap::new(), &[t]);
        assert!(s.contains("low (was high)"), "{s}");
    }

    #[test]
    fn the_timeline_has_a_series_per_gpu_the_total_and_the_transitions() {
        let rows: Vec<TraceRow> = (0..10)
            .flat_map(|i| {
                (0..2).map(move |g| TraceRow {
                    t: i as f64,
                    gpu: g,
                    used_bytes: (i + 1) * GIB,
                    total_bytes: 80 * GIB,
                    allocated_bytes: None,
                    reserved_bytes: None,
                })
            })
            .collect();
        let tr = [Transition {
            elapsed_seconds: 5.0,
            from: RiskLevel::Low,
            to: RiskLevel::High,
            gpu: Some(1),
            used_bytes: None,
            growth_bytes_per_second: None,
            time_to_oom_seconds: None,
        }];
        let c = timeline(&rows, &tr, Some(&report()));
        assert_eq!(c.series.len(), 2);
        assert!(c.title.contains("simulated"));
        assert_eq!(c.hlines[0].label, "total memory");
        assert_eq!(c.marks[0].label, "GPU 1 high");
        // A replayed trace is recorded data, not a simulation.
        let mut traced = report();
        traced.summary.source = DataSource::Trace;
        let c = timeline(&rows, &tr, Some(&traced));
        assert!(c.title.ends_with("(recorded trace)"), "{}", c.title);
    }
}
