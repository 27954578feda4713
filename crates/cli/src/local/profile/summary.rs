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

/// The GPUs to show: `--devices` entries, each an index or a UUID; empty: all.
#[derive(Clone, Debug, Default)]
pub struct Devices(pub Vec<String>);

impl Devices {
    /// Whether the GPU with this index and UUID is shown.
    pub fn keeps(&self, index: u32, uuid: &str) -> bool {
        self.0.is_empty()
            || self.0.iter().any(|d| {
                d.trim().parse::<u32>().is_ok_and(|i| i == index)
                    || d.trim().eq_ignore_ascii_case(uuid)
            })
    }
}

/// Utilization and recent memory of one GPU, from the reports polled.
#[derive(Clone, Debug, Default)]
struct Seen {
    util_sum: f64,
    util_n: u32,
    util_max: Option<u32>,
    recent: VecDeque<f64>,
}

/// What the CLI saw of the reports it polled (about once a second).
#[derive(Clone, Debug, Default)]
pub struct Tracker {
    gpus: BTreeMap<u32, Seen>,
}

/// Used memory values kept per GPU for the status line's sparkline.
const RECENT: usize = 24;

impl Tracker {
    /// Takes a polled report into account.
    pub fn observe(&mut self, r: &MemoryReportSpec) {
        for g in &r.gpus {
            let s = self.gpus.entry(g.index).or_default();
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
    pub fn utilization(&self, index: u32) -> (Option<f64>, Option<u32>) {
        match self.gpus.get(&index) {
            Some(s) if s.util_n > 0 => (Some(s.util_sum / f64::from(s.util_n)), s.util_max),
            _ => (None, None),
        }
    }

    fn sparkline(&self, index: u32) -> String {
        self.gpus.get(&index).map_or(String::new(), |s| {
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
    let v = g.growth_bytes_per_second;
    if !v.is_finite() || v.abs() < 1.0 {
        return "0/s".into();
    }
    let sign = if v > 0.0 { "+" } else { "-" };
    format!("{sign}{}/s", format_bytes(v.abs() as u64))
}

fn tto(g: &GpuReport) -> String {
    g.time_to_oom_seconds.map_or("-".into(), format_duration)
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

/// One status line per shown GPU, for the live display.
pub fn status_lines(r: &MemoryReportSpec, tr: &Tracker, devices: &Devices) -> Vec<String> {
    r.gpus
        .iter()
        .filter(|g| devices.keeps(g.index, &g.uuid))
        .map(|g| {
            let util = g
                .utilization_percent
                .map_or("-".into(), |u| format!("{u}%"));
            format!(
                "GPU {}  used {} / {} ({})  peak {}  util {}  risk {}  tto {}  {}",
                g.index,
                format_bytes(g.used_bytes),
                format_bytes(g.total_bytes),
                percent(g.used_bytes, g.total_bytes),
                format_bytes(g.peak_bytes),
                util,
                g.risk,
                tto(g),
                tr.sparkline(g.index)
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

/// The summary printed at the end: a header, the table, advice per GPU.
pub fn summary(
    r: &MemoryReportSpec,
    tr: &Tracker,
    samples: &BTreeMap<u32, u64>,
    transitions: &[Transition],
    devices: &Devices,
    seconds: f64,
) -> String {
    let shown: Vec<&GpuReport> = r
        .gpus
        .iter()
        .filter(|g| devices.keeps(g.index, &g.uuid))
        .collect();
    let mut out = format!(
        "memprof profile: {} GPU(s), source {}, {:.0} s, {} risk transition(s)\n",
        shown.len(),
        source_words(r.summary.source),
        seconds,
        transitions.len()
    );
    if shown.is_empty() {
        let why = r
            .conditions
            .first()
            .map_or("no report condition".into(), |c| c.message.clone());
        out.push_str(&format!("no GPU to show: {why}\n"));
        return out;
    }
    let mut t = Table::new([
        "GPU", "MODEL", "USED", "FREE", "TOTAL", "PEAK", "UTIL AVG", "UTIL MAX", "SAMPLES", "RISK",
        "GROWTH", "TTO",
    ]);
    let worst = worst_risks(transitions);
    let worst_of = |g: &GpuReport| worst.get(&g.index).copied().unwrap_or_default().max(g.risk);
    for g in &shown {
        let (avg, max) = tr.utilization(g.index);
        let risk = match worst_of(g) {
            w if w > g.risk => format!("{} (was {w})", g.risk),
            _ => g.risk.to_string(),
        };
        t.row([
            g.index.to_string(),
            g.model.clone(),
            format_bytes(g.used_bytes),
            format_bytes(g.total_bytes.saturating_sub(g.used_bytes)),
            format_bytes(g.total_bytes),
            format!(
                "{} ({})",
                format_bytes(g.peak_bytes),
                percent(g.peak_bytes, g.total_bytes)
            ),
            avg.map_or("-".into(), |a| format!("{a:.0}%")),
            max.map_or("-".into(), |m| format!("{m}%")),
            samples.get(&g.index).copied().unwrap_or(0).to_string(),
            risk,
            growth(g),
            tto(g),
        ]);
    }
    out.push_str(&t.render());
    for g in &shown {
        out.push_str(&format!("GPU {}: {}\n", g.index, advice(g, worst_of(g))));
    }
    out
}

/// Samples per GPU in a trace.
pub fn sample_counts(rows: &[TraceRow]) -> BTreeMap<u32, u64> {
    let mut m = BTreeMap::new();
    for r in rows {
        *m.entry(r.gpu).or_insert(0) += 1;
    }
    m
}

/// Used memory of every shown GPU over time, total memory, risk transitions.
pub fn timeline(
    rows: &[TraceRow],
    transitions: &[Transition],
    devices: &Devices,
    r: Option<&MemoryReportSpec>,
) -> LineChart {
    let uuid = |i: u32| {
        r.and_then(|r| r.gpus.iter().find(|g| g.index == i))
            .map_or(String::new(), |g| g.uuid.clone())
    };
    let mut per_gpu: BTreeMap<u32, Vec<(f64, f64)>> = BTreeMap::new();
    let mut totals: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
    for row in rows
        .iter()
        .filter(|row| devices.keeps(row.gpu, &uuid(row.gpu)))
    {
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
        r.and_then(|r| r.gpus.iter().find(|g| g.index == i))
            .map_or(String::new(), |g| format!(" ({})", g.model))
    };
    let source = r.map(|r| r.summary.source);
    let hlines = totals
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
        .collect();
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
            ..Default::default()
        }
    }

    fn report() -> MemoryReportSpec {
        MemoryReportSpec {
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
        let s = summary(
            &r,
            &tr,
            &BTreeMap::from([(0, 30), (1, 30)]),
            &[],
            &Devices::default(),
            30.0,
        );
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
        let only_one = summary(
            &r,
            &tr,
            &BTreeMap::new(),
            &[],
            &Devices(vec!["1".into()]),
            1.0,
        );
        assert!(
            only_one.contains("1 GPU(s)") && !only_one.contains("GPU 0:"),
            "{only_one}"
        );
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
            ..Default::default()
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
        let s = summary(
            &r,
            &Tracker::default(),
            &BTreeMap::new(),
            &[t],
            &Devices::default(),
            1.0,
        );
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
        let c = timeline(&rows, &tr, &Devices::default(), Some(&report()));
        assert_eq!(c.series.len(), 2);
        assert!(c.title.contains("simulated"));
        assert_eq!(c.hlines[0].label, "total memory");
        assert_eq!(c.marks[0].label, "GPU 1 high");
        // A replayed trace is recorded data, not a simulation.
        let mut traced = report();
        traced.summary.source = DataSource::Trace;
        let c = timeline(&rows, &tr, &Devices::default(), Some(&traced));
        assert!(c.title.ends_with("(recorded trace)"), "{}", c.title);
    }
}
