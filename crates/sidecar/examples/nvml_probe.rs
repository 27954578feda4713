//! Probe of the NVML backend on a real GPU box, used by `bench/gpu/`:
//!
//! - `nvml_probe bench [--samples N] [--gpus 0,1]`: times `NvmlSampler::sample`
//!   and prints the per-GPU cost (median, p99) as one JSON line;
//! - `nvml_probe monitor --hz 10 --duration 300 --trace t.csv --events e.jsonl
//!   --report r.json [--stop-file F]`: the sidecar's sample → analyse path
//!   ([`memprof_sidecar::monitor::Monitor`] over [`NvmlSampler`]) without Kubernetes,
//!   writing the raw trace, the assessment of every GPU once a second, and the
//!   final report.
//!
//! The standalone sidecar does the same with the sidecar's own loop; this
//! example needs nothing but the library.

use anyhow::Context;
use clap::{Parser, Subcommand};
use memprof_api::thresholds::Thresholds;
use memprof_api::trace::TraceWriter;
use memprof_sidecar::monitor::{Identity, Monitor};
use memprof_sidecar::sampler::discovery::{self, DiscoveryOptions};
use memprof_sidecar::sampler::nvml::NvmlSampler;
use memprof_sidecar::sampler::Sampler;
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Time the sampler.
    Bench {
        /// Samples to time.
        #[arg(long, default_value_t = 20_000)]
        samples: usize,
        /// NVML indices, comma-separated (default: every GPU).
        #[arg(long)]
        gpus: Option<String>,
        /// Also time samples taken this many milliseconds apart (as the sidecar does).
        #[arg(long, default_value_t = 100)]
        gap_ms: u64,
        /// Samples taken with the gap.
        #[arg(long, default_value_t = 50)]
        gap_samples: usize,
    },
    /// Sample and analyse like the sidecar.
    Monitor {
        /// Samples per second.
        #[arg(long, default_value_t = 10.0)]
        hz: f64,
        /// Seconds to run (0: until the stop file appears).
        #[arg(long, default_value_t = 0.0)]
        duration: f64,
        /// NVML indices, comma-separated (default: discovery from the environment).
        #[arg(long)]
        gpus: Option<String>,
        /// Raw trace CSV `t_s,gpu,used_bytes,total_bytes` (t_s: Unix seconds).
        #[arg(long)]
        trace: Option<PathBuf>,
        /// Assessments, one JSON line per second.
        #[arg(long)]
        events: Option<PathBuf>,
        /// Final MemoryReport spec (JSON).
        #[arg(long)]
        report: Option<PathBuf>,
        /// Stop when this file exists.
        #[arg(long)]
        stop_file: Option<PathBuf>,
        /// Pod name and rank written into the report.
        #[arg(long, default_value = "standalone")]
        pod: String,
        /// Rank written into the report.
        #[arg(long)]
        rank: Option<u32>,
    },
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn parse_indices(s: &str) -> anyhow::Result<Vec<u32>> {
    s.split(',')
        .filter(|x| !x.trim().is_empty())
        .map(|x| x.trim().parse().context("--gpus takes NVML indices"))
        .collect()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// `VmRSS`, `RssAnon` and `RssFile` of this process, KiB.
fn rss() -> serde_json::Value {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let mut v = serde_json::Map::new();
    for line in text.lines() {
        if let Some((k, rest)) = line.split_once(':') {
            if ["VmRSS", "RssAnon", "RssFile", "VmHWM"].contains(&k) {
                let kib: u64 = rest
                    .split_whitespace()
                    .next()
                    .and_then(|x| x.parse().ok())
                    .unwrap_or(0);
                v.insert(k.into(), kib.into());
            }
        }
    }
    v.into()
}

fn bench(
    samples: usize,
    gpus: Option<String>,
    gap_ms: u64,
    gap_samples: usize,
) -> anyhow::Result<()> {
    let rss_before = rss();
    let mut s = match gpus {
        Some(g) => NvmlSampler::new(&parse_indices(&g)?)?,
        None => NvmlSampler::all()?,
    };
    let n = s.gpus().len().max(1) as f64;
    let run = |s: &mut NvmlSampler| -> anyhow::Result<Vec<f64>> {
        for _ in 0..100 {
            s.sample(0.0)?;
        }
        let mut us = Vec::with_capacity(samples);
        for _ in 0..samples {
            let t0 = Instant::now();
            s.sample(0.0)?;
            us.push(t0.elapsed().as_secs_f64() * 1e6 / n);
        }
        us.sort_by(f64::total_cmp);
        Ok(us)
    };
    // As the sidecar runs it (utilization at most once a second), then with
    // utilization read at every sample (the worst case).
    let rss_opened = rss();
    let memory_only = run(&mut s)?;
    // Samples with a pause between them, as in the sidecar's loop: caches and
    // CPU clocks are cold at every call.
    let mut gapped = Vec::with_capacity(gap_samples);
    for _ in 0..gap_samples {
        std::thread::sleep(Duration::from_millis(gap_ms));
        let t0 = Instant::now();
        s.sample(0.0)?;
        gapped.push(t0.elapsed().as_secs_f64() * 1e6 / n);
    }
    gapped.sort_by(f64::total_cmp);
    let mut s = s.with_utilization_every(Duration::ZERO);
    let with_util = run(&mut s)?;
    let detail = s.memory_detail()?;
    println!(
        "{}",
        json!({
            "gpus": s.gpus().iter().map(|g| json!({"index": g.index, "uuid": g.uuid, "model": g.model, "totalBytes": g.total_bytes})).collect::<Vec<_>>(),
            "memory": detail.iter().map(|m| json!({"total": m.total, "reserved": m.reserved, "used": m.used, "free": m.free})).collect::<Vec<_>>(),
            "samples": samples,
            "perGpuUs": {
                "median": percentile(&memory_only, 0.5),
                "p99": percentile(&memory_only, 0.99),
                "max": percentile(&memory_only, 1.0),
            },
            "perGpuUsGapped": {
                "gapMs": gap_ms,
                "samples": gap_samples,
                "median": percentile(&gapped, 0.5),
                "p99": percentile(&gapped, 0.99),
            },
            "rssKiB": {"beforeNvml": rss_before, "samplerOpen": rss_opened, "end": rss()},
            "perGpuUsWithUtilization": {
                "median": percentile(&with_util, 0.5),
                "p99": percentile(&with_util, 0.99),
            },
            "processes": s.processes().iter().map(|p| json!({"gpu": p.gpu_index, "pid": p.pid, "usedBytes": p.used_bytes})).collect::<Vec<_>>(),
        })
    );
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn monitor(
    hz: f64,
    duration: f64,
    gpus: Option<String>,
    trace: Option<PathBuf>,
    events: Option<PathBuf>,
    report: Option<PathBuf>,
    stop_file: Option<PathBuf>,
    id: Identity,
) -> anyhow::Result<()> {
    let (sampler, condition) = match gpus {
        Some(g) => (
            NvmlSampler::new(&parse_indices(&g)?)?,
            memprof_api::Condition::new("GpuVisible", true, "ExplicitUuids", "--gpus"),
        ),
        None => {
            let opts = DiscoveryOptions::from_env().map_err(anyhow::Error::msg)?;
            let (s, d) = discovery::open_nvml_sampler(&opts).await;
            eprintln!("discovery: {:?}", d.condition);
            (s.context(d.condition.message.clone())?, d.condition)
        }
    };
    let mut m = Monitor::new(Box::new(sampler), Thresholds::default());
    let create =
        |p: &Option<PathBuf>| -> anyhow::Result<Option<std::io::BufWriter<std::fs::File>>> {
            p.as_ref()
                .map(|p| {
                    std::fs::File::create(p)
                        .map(std::io::BufWriter::new)
                        .with_context(|| format!("cannot create {}", p.display()))
                })
                .transpose()
        };
    let mut trace_w = create(&trace)?.map(TraceWriter::new).transpose()?;
    let mut events_w = create(&events)?;
    let interval = Duration::from_secs_f64(1.0 / hz);
    let start = Instant::now();
    let mut next = start;
    let mut next_analysis = start;
    let mut cost_us = Vec::new();
    loop {
        let elapsed = start.elapsed().as_secs_f64();
        if duration > 0.0 && elapsed >= duration {
            break;
        }
        let t = now();
        let t0 = Instant::now();
        m.sample(t)?;
        cost_us.push(t0.elapsed().as_secs_f64() * 1e6 / m.series().len().max(1) as f64);
        if let Some(w) = trace_w.as_mut() {
            for (g, s) in m.sampler().gpus().iter().zip(m.series()) {
                if let Some(last) = s.last() {
                    w.write(t, g.index, last.used, last.total)?;
                }
            }
        }
        if Instant::now() >= next_analysis {
            next_analysis += Duration::from_secs(1);
            m.analyse();
            if let Some(w) = events_w.as_mut() {
                for (g, a) in m.sampler().gpus().iter().zip(m.assessments()) {
                    writeln!(
                        w,
                        "{}",
                        json!({
                            "t": (t * 1000.0).round() / 1000.0,
                            "gpu": g.index,
                            "used": a.used,
                            "total": a.total,
                            "peak": a.peak,
                            "risk": a.risk,
                            "confidence": (a.confidence * 1000.0).round() / 1000.0,
                            "growth": a.growth_bytes_per_second.round(),
                            "tto": a.time_to_oom_seconds.map(|x| (x * 10.0).round() / 10.0),
                            "leak": a.leak_suspected,
                            "spike": a.spike_detected,
                        })
                    )?;
                }
                w.flush()?;
            }
            if let Some(w) = trace_w.as_mut() {
                w.flush()?;
            }
            if stop_file.as_ref().is_some_and(|f| f.exists()) {
                break;
            }
        }
        next += interval;
        let now_i = Instant::now();
        if next > now_i {
            tokio::time::sleep(next - now_i).await;
        } else {
            next = now_i;
        }
    }
    m.analyse();
    cost_us.sort_by(f64::total_cmp);
    let spec = m.report(
        &id,
        jiff::Timestamp::now().to_string(),
        (1000.0 / hz) as u64,
        vec![condition],
    );
    eprintln!(
        "samples {} per-GPU cost median {:.1} us p99 {:.1} us; risk {}",
        cost_us.len(),
        percentile(&cost_us, 0.5),
        percentile(&cost_us, 0.99),
        spec.summary.risk
    );
    if let Some(p) = report {
        std::fs::write(&p, serde_json::to_vec_pretty(&spec)?)
            .with_context(|| format!("cannot write {}", p.display()))?;
    }
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Bench {
            samples,
            gpus,
            gap_ms,
            gap_samples,
        } => bench(samples, gpus, gap_ms, gap_samples),
        Command::Monitor {
            hz,
            duration,
            gpus,
            trace,
            events,
            report,
            stop_file,
            pod,
            rank,
        } => {
            let id = Identity {
                pod_name: pod,
                rank,
                ..Default::default()
            };
            monitor(hz, duration, gpus, trace, events, report, stop_file, id).await
        }
    }
}
