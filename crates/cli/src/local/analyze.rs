//! `memprof analyze TRACE.csv`: the sidecar's analysis, offline, as fast as it
//! can: each risk transition, time-to-OOM estimates and a summary per GPU,
//! as tables for a person or JSON lines (`-o json`, one object per line, the
//! shape scripts rely on), and `--plot` draws one GPU's envelope, fitted
//! trend and predicted OOM. For post-mortems and for tuning thresholds on
//! recorded traces.

pub mod evaluate;
pub mod plot;

use crate::output::{Format, OutputArgs, Table};
use anyhow::Context as _;
use memprof_analysis::evaluate::replay::{drive_inputs, Inputs};
use memprof_analysis::tracker::Tracker;
use memprof_analysis::Assessment;
use memprof_api::thresholds::Thresholds;
use memprof_api::trace::TraceRow;
use memprof_api::{format_bytes, format_duration, RiskLevel};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::PathBuf;

/// Flags of `memprof analyze`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Trace files (CSV `t_s,gpu,used_bytes,total_bytes`, as `--trace-out`
    /// writes), analysed one after another, each under its name; with
    /// `--evaluate`, one record.sh folder, folder of fixture traces, or trace.
    #[arg(required = true, value_name = "TRACE")]
    pub traces: Vec<String>,
    /// Judge the verdicts on recordings with their truth (leak flag precision
    /// and recall, latency, time to OOM at half-life), from NVML alone and
    /// with the agent's pushes.
    #[arg(long)]
    pub evaluate: bool,
    /// Analysis thresholds as JSON (camelCase fields of the analysis thresholds).
    #[arg(long)]
    pub thresholds: Option<String>,
    /// Trace time between two `estimate` lines (`10`, `10s`, `1m`; 0: none;
    /// JSON/YAML only).
    #[arg(long, default_value = "10s", value_name = "DURATION", value_parser = crate::duration::parse)]
    pub estimate_every: std::time::Duration,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub output: OutputArgs,
    /// Draw the envelope, the fitted trend and the predicted OOM crossing of
    /// one GPU as SVG into this file.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// The GPU to draw (default: the one that reached the worst risk).
    #[arg(long, value_name = "INDEX")]
    pub gpu: Option<u32>,
}

/// Runs the subcommand; returns the process exit code.
pub async fn run(args: Args) -> anyhow::Result<i32> {
    let thresholds: Thresholds = match &args.thresholds {
        Some(j) => serde_json::from_str(j)
            .context("--thresholds is not valid JSON of analysis thresholds")?,
        None => Thresholds::default(),
    };
    thresholds.validate()?;
    let several = args.traces.len() > 1;
    if several && (args.evaluate || args.plot.is_some()) {
        anyhow::bail!(
            "--evaluate and --plot take one trace ({} given): run them once per file",
            args.traces.len()
        );
    }
    if args.evaluate {
        let out = evaluate::run(
            std::path::Path::new(&args.traces[0]),
            &thresholds,
            args.output.format,
        )?;
        write_stdout(&out)?;
        return Ok(0);
    }
    if let Some(p) = args.plot.as_deref() {
        crate::outfile::prepare_image("--plot", p)?;
    }
    // Every file read before the first is analysed: a missing third file
    // is said before two tables, not after them.
    let traces = args
        .traces
        .iter()
        .map(|t| {
            // The trace error's message already ends with its cause: one
            // line, not the cause twice (`{:#}` prints the chain).
            let rows = memprof_api::trace::read_trace(t).map_err(|e| anyhow::anyhow!("{e}"))?;
            Ok((t.as_str(), rows))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    for (i, (trace, rows)) in traces.iter().enumerate() {
        if several {
            write_stdout(&heading(trace, i, args.output.format))?;
        }
        analyze_one(&args, &thresholds, trace, rows)?;
    }
    Ok(0)
}

/// What precedes each trace's lines when several are analysed: a blank
/// line and `==> FILE <==` (as `tail` heads files) before a table, a
/// `{"event":"trace","file":…}` line before JSON lines, a comment in YAML.
pub fn heading(trace: &str, index: usize, format: Format) -> String {
    match format {
        Format::Json => format!("{}\n", json!({"event": "trace", "file": trace})),
        Format::Yaml => format!("# {trace}\n"),
        Format::Table | Format::Wide => {
            let gap = if index > 0 { "\n" } else { "" };
            format!("{gap}==> {trace} <==\n")
        }
    }
}

/// One trace: its lines, then `--plot`.
fn analyze_one(
    args: &Args,
    thresholds: &Thresholds,
    trace: &str,
    rows: &[TraceRow],
) -> anyhow::Result<()> {
    let opts = Options {
        thresholds: thresholds.clone(),
        estimate_every: args.estimate_every.as_secs_f64(),
    };
    let mut lines = vec![];
    analyze(rows, &opts, |l| lines.push(l));
    let text = render(&lines, args.output.format, trace, rows);
    write_stdout(&text)?;
    if let Some(path) = &args.plot {
        let gpu = plot::pick_gpu(rows, &lines, args.gpu).context("the trace has no GPU to draw")?;
        let name = std::path::Path::new(trace)
            .file_name()
            .map_or(trace.to_string(), |n| n.to_string_lossy().into_owned());
        let chart = plot::chart(rows, &lines, thresholds, gpu, &name);
        crate::plot::write_image(path, &chart.to_svg())?;
        if !args.output.format.is_structured() {
            write_stdout(&format!(
                "plot of GPU {gpu} written to {}\n",
                path.display()
            ))?;
        }
    }
    Ok(())
}

/// Writes to stdout; a closed pipe (`| head`) is not an error.
fn write_stdout(text: &str) -> anyhow::Result<()> {
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

/// The lines in the format asked: JSON lines, a YAML stream, or tables.
pub fn render(lines: &[Value], format: Format, trace: &str, rows: &[TraceRow]) -> String {
    match format {
        Format::Json => lines.iter().map(|l| format!("{l}\n")).collect(),
        Format::Yaml => lines
            .iter()
            .map(|l| format!("---\n{}", crate::output::structured(l, Format::Yaml)))
            .collect(),
        Format::Table | Format::Wide => tables(lines, format == Format::Wide, trace, rows),
    }
}

fn bytes(v: &Value) -> String {
    v.as_u64().map_or("-".into(), format_bytes)
}

fn seconds(v: &Value) -> String {
    v.as_f64().map_or("-".into(), format_duration)
}

/// Transitions, then the summary per GPU; `wide` adds each transition's reason.
fn tables(lines: &[Value], wide: bool, trace: &str, rows: &[TraceRow]) -> String {
    let span = rows.last().map_or(0.0, |r| r.t) - rows.first().map_or(0.0, |r| r.t);
    let gpus = lines.iter().filter(|l| l["event"] == "summary").count();
    let mut out = format!(
        "{trace}: {gpus} GPU(s), {} samples over {}\n\n",
        rows.len(),
        format_duration(span)
    );
    let t = transitions_table(lines, wide);
    out.push_str("RISK TRANSITIONS\n");
    out.push_str(&if t.is_empty() {
        "none\n".into()
    } else {
        t.render()
    });
    out.push_str("\nSUMMARY\n");
    out.push_str(&summary_table(lines).render());
    out
}

/// One row per `risk` line.
fn transitions_table(lines: &[Value], wide: bool) -> Table {
    let mut head = vec![
        "T",
        "GPU",
        "FROM",
        "TO",
        "USED",
        "TOTAL",
        "GROWTH",
        "TTO",
        "CONFIDENCE",
    ];
    if wide {
        head.push("REASON");
    }
    let mut t = Table::new(head);
    for l in lines.iter().filter(|l| l["event"] == "risk") {
        let growth = l["growthBytesPerSecond"].as_f64().unwrap_or(0.0);
        let mut row = vec![
            seconds(&l["t"]),
            l["gpu"].to_string(),
            l["from"].as_str().unwrap_or("-").to_string(),
            l["risk"].as_str().unwrap_or("-").to_string(),
            bytes(&l["usedBytes"]),
            bytes(&l["totalBytes"]),
            format!(
                "{}{}/s",
                if growth < 0.0 { "-" } else { "+" },
                format_bytes(growth.abs() as u64)
            ),
            seconds(&l["timeToOomSeconds"]),
            l["confidence"]
                .as_f64()
                .map_or("-".into(), |c| format!("{c:.2}")),
        ];
        if wide {
            row.push(l["reason"].as_str().unwrap_or("").to_string());
        }
        t.row(row);
    }
    t
}

/// One row per `summary` line (per GPU), with the warning it gave before
/// the ceiling.
fn summary_table(lines: &[Value]) -> Table {
    let mut s = Table::new([
        "GPU",
        "SAMPLES",
        "PEAK",
        "FINAL RISK",
        "FIRST HIGH",
        "FIRST CRITICAL",
        "FIRST SPIKE",
        "CEILING AT",
        "WARNING BEFORE CEILING",
    ]);
    for l in lines.iter().filter(|l| l["event"] == "summary") {
        let first = |k: &str| l["firstAt"][k].as_f64();
        let warned = match (first("high").or(first("critical")), l["ceilingAt"].as_f64()) {
            (Some(w), Some(c)) if c >= w => format_duration(c - w),
            (_, Some(_)) => "none".into(),
            _ => "-".into(),
        };
        s.row([
            l["gpu"].to_string(),
            l["samples"].to_string(),
            bytes(&l["peakBytes"]),
            l["finalRisk"].as_str().unwrap_or("-").to_string(),
            first("high").map_or("-".into(), format_duration),
            first("critical").map_or("-".into(), format_duration),
            seconds(&l["firstSpikeAt"]),
            seconds(&l["ceilingAt"]),
            warned,
        ]);
    }
    s
}

/// Options of an offline analysis.
#[derive(Clone, Debug)]
pub struct Options {
    /// Analysis thresholds.
    pub thresholds: Thresholds,
    /// Trace seconds between two `estimate` lines (0: none).
    pub estimate_every: f64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            thresholds: Thresholds::default(),
            estimate_every: 10.0,
        }
    }
}

/// What the offline view keeps of one GPU's published verdicts.
#[derive(Default)]
struct Gpu {
    risk: RiskLevel,
    next_estimate: f64,
    first_at: BTreeMap<RiskLevel, f64>,
    ceiling_at: Option<f64>,
    /// When a spike was first seen (a rise of `spikeFraction` of the GPU
    /// within a bucket): a spike that leaves the risk low is no transition,
    /// so it is said here and by its own `spike` line.
    first_spike: Option<f64>,
    last: Option<Assessment>,
    samples: u64,
    peak: u64,
}

fn line(event: &str, t: f64, gpu: u32, a: &Assessment) -> Value {
    json!({
        "event": event,
        "t": (t * 1000.0).round() / 1000.0,
        "gpu": gpu,
        "risk": a.risk,
        "confidence": (a.confidence * 1000.0).round() / 1000.0,
        "usedBytes": a.used,
        "totalBytes": a.total,
        "growthBytesPerSecond": a.growth_bytes_per_second.round(),
        "timeToOomSeconds": a.time_to_oom_seconds.map(|x| (x * 10.0).round() / 10.0),
        "leakSuspected": a.leak_suspected,
        "spikeDetected": a.spike_detected,
        "cause": a.cause.as_ref().map(|c| c.cause),
        "reason": a.reason,
    })
}

/// Analyses `rows` as the sidecar does (the same [`Tracker`], one analysis
/// per second of trace, the published level and leak flag after its
/// hysteresis: what a report would have said, not the raw assessment),
/// calling `emit` with each JSON line: `risk` on every transition (with
/// `from`), `spike` the first time a spike is seen, `estimate` every
/// `estimate_every` seconds while a time to OOM exists, and one `summary`
/// per GPU at the end (peak, first time at each risk level, first spike,
/// first time within 1% of the ceiling).
pub fn analyze(rows: &[TraceRow], opts: &Options, mut emit: impl FnMut(Value)) {
    let mut gpus = ceilings(rows);
    let tracker = drive_inputs(
        Tracker::new(&opts.thresholds),
        &Inputs::trace(rows),
        |t, verdicts| {
            for v in verdicts {
                let g = gpus.entry(v.index).or_default();
                published(g, t, v.index, &v.assessment, opts, &mut emit);
            }
        },
    );
    for (index, g) in &mut gpus {
        if let Some(series) = tracker.series(*index) {
            (g.samples, g.peak) = (series.sample_count(), series.peak());
        }
        emit(summary_line(*index, g));
    }
}

/// Each GPU of `rows`, with when it first came within 1 % of its ceiling.
fn ceilings(rows: &[TraceRow]) -> BTreeMap<u32, Gpu> {
    let mut gpus: BTreeMap<u32, Gpu> = BTreeMap::new();
    for r in rows {
        let g = gpus.entry(r.gpu).or_insert_with(|| Gpu {
            next_estimate: r.t,
            ..Default::default()
        });
        if g.ceiling_at.is_none() && r.used_bytes as f64 >= 0.99 * r.total_bytes as f64 {
            g.ceiling_at = Some(r.t);
        }
    }
    gpus
}

/// One published verdict of GPU `index` at `t`: the lines it makes.
fn published(
    g: &mut Gpu,
    t: f64,
    index: u32,
    a: &Assessment,
    opts: &Options,
    emit: &mut impl FnMut(Value),
) {
    if a.risk != g.risk {
        let mut l = line("risk", t, index, a);
        l["from"] = json!(g.risk);
        emit(l);
        g.risk = a.risk;
        g.first_at.entry(a.risk).or_insert(t);
    }
    if a.spike_detected && g.first_spike.is_none() {
        g.first_spike = Some(t);
        emit(line("spike", t, index, a));
    }
    if opts.estimate_every > 0.0 && t >= g.next_estimate && a.time_to_oom_seconds.is_some() {
        g.next_estimate = t + opts.estimate_every;
        emit(line("estimate", t, index, a));
    }
    g.last = Some(a.clone());
}

/// One GPU's `summary` line.
fn summary_line(index: u32, g: &Gpu) -> Value {
    let first: BTreeMap<String, f64> = g
        .first_at
        .iter()
        .map(|(k, v)| (k.to_string(), *v))
        .collect();
    json!({
        "event": "summary",
        "gpu": index,
        "samples": g.samples,
        "peakBytes": g.peak,
        "finalRisk": g.last.as_ref().map(|a| a.risk),
        "firstAt": first,
        "ceilingAt": g.ceiling_at,
        "firstSpikeAt": g.first_spike,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leak_trace() -> Vec<TraceRow> {
        let total = 80_000_000_000u64;
        (0..6000)
            .map(|i| {
                let t = i as f64 * 0.1;
                let used = (30e9 + 100e6 * t + 10e9 * ((t % 2.0) / 2.0)).min(total as f64) as u64;
                TraceRow {
                    t,
                    gpu: 0,
                    used_bytes: used,
                    total_bytes: total,
                    allocated_bytes: None,
                    reserved_bytes: None,
                }
            })
            .collect()
    }

    /// smooth-d's leak900 on an H200 (a 0.9 GB/s leak whose rises
    /// `empty_cache` breaks up): the raw assessment went low, medium,
    /// critical and back 12 times; the view prints what the sidecar
    /// publishes, its hysteresis included, so a leak escalates once per
    /// level, as the report and `--evaluate` say.
    #[test]
    fn the_view_prints_the_levels_the_sidecar_publishes() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/recordings/smooth-d/leak900.trace.csv"
        );
        let rows = memprof_api::trace::read_trace(path).expect("the recorded trace");
        let mut lines = vec![];
        analyze(&rows, &Options::default(), |l| lines.push(l));
        let levels: Vec<RiskLevel> = lines
            .iter()
            .filter(|l| l["event"] == "risk")
            .map(|l| serde_json::from_value(l["risk"].clone()).unwrap())
            .collect();
        assert!(levels.windows(2).all(|w| w[0] < w[1]), "{levels:?}");
        let mut published = vec![];
        let inputs = Inputs::trace(&rows);
        drive_inputs(Tracker::new(&Thresholds::default()), &inputs, |_, v| {
            published.push(v[0].assessment.risk)
        });
        published.dedup();
        assert_eq!(levels, published, "the table is the sidecar's levels");
    }

    #[test]
    fn json_is_the_same_lines_and_a_table_is_for_people() {
        let rows = leak_trace();
        let mut lines = vec![];
        analyze(&rows, &Options::default(), |l| lines.push(l));
        let json = render(&lines, Format::Json, "t.csv", &rows);
        // Exactly the lines `analyze` emits, one per line, as before `-o`.
        let want: Vec<String> = lines.iter().map(Value::to_string).collect();
        assert_eq!(json.lines().collect::<Vec<_>>(), want);
        let table = render(&lines, Format::Table, "t.csv", &rows);
        assert!(
            table.starts_with("t.csv: 1 GPU(s), 6000 samples over 10m0s"),
            "{table}"
        );
        for want in [
            "RISK TRANSITIONS",
            "critical",
            "SUMMARY",
            "WARNING BEFORE CEILING",
        ] {
            assert!(table.contains(want), "{want:?} missing from\n{table}");
        }
        assert!(!table.contains("REASON"));
        assert!(render(&lines, Format::Wide, "t.csv", &rows).contains("REASON"));
        let yaml = render(&lines, Format::Yaml, "t.csv", &rows);
        assert_eq!(yaml.matches("---").count(), lines.len());
    }

    #[test]
    fn prints_transitions_estimates_and_a_summary() {
        let mut lines = vec![];
        analyze(&leak_trace(), &Options::default(), |l| lines.push(l));
        let risks: Vec<_> = lines
            .iter()
            .filter(|l| l["event"] == "risk")
            .map(|l| l["risk"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(risks.first().map(String::as_str), Some("low"));
        assert!(
            risks.contains(&"high".to_string()) && risks.contains(&"critical".to_string()),
            "{risks:?}"
        );
        assert!(lines.iter().any(|l| l["event"] == "estimate"));
        let summary = lines.last().unwrap();
        assert_eq!(summary["event"], "summary");
        let ceiling = summary["ceilingAt"].as_f64().unwrap();
        let high = summary["firstAt"]["high"].as_f64().unwrap();
        assert!(
            ceiling - high >= 60.0,
            "high at {high}, ceiling at {ceiling}"
        );
    }

    /// The H100 recording of a 16 GiB spike (31 -> 48 GB on an 80 GB card,
    /// 96 s in): the risk stays low (60 % in use), so no transition says
    /// it; the spike line and the summary do. A leak's climb is no spike.
    #[test]
    fn a_spike_that_leaves_the_risk_low_is_still_said() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/traces/spike_h100.csv"
        );
        let rows = memprof_api::trace::read_trace(path).unwrap();
        let mut lines = vec![];
        analyze(&rows, &Options::default(), |l| lines.push(l));
        let spikes: Vec<_> = lines.iter().filter(|l| l["event"] == "spike").collect();
        assert_eq!(spikes.len(), 1, "{lines:?}");
        let at = spikes[0]["t"].as_f64().unwrap();
        assert!((96.0..=110.0).contains(&at), "{at}");
        let summary = lines.last().unwrap();
        assert_eq!(summary["firstSpikeAt"].as_f64(), Some(at));
        assert_eq!(summary["finalRisk"], "low");
        let table = render(&lines, Format::Table, "spike.csv", &rows);
        assert!(table.contains("FIRST SPIKE"), "{table}");
        let mut leak = vec![];
        analyze(&leak_trace(), &Options::default(), |l| leak.push(l));
        assert!(leak.last().unwrap()["firstSpikeAt"].is_null());
    }
}
