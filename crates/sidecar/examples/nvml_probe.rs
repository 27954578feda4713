//! Probe of the NVML backend on a real GPU box, used by `bench/gpu/`:
//!
//! - `nvml_probe bench [--samples N] [--gpus 0,1]`: times `NvmlSampler::sample`
//!   and prints the per-GPU cost (median, p99) as one JSON line;
//! - `nvml_probe mig [--requested N]`: what NVML says about MIG (mode,
//!   instances, their memory) and what the sidecar's discovery concludes;
//!   exits non-zero if it would sample a MIG-enabled GPU;
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
use memprof_sidecar::sampler::nvml::{self, NvmlSampler};
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
    /// What NVML says about MIG, and what discovery makes of it (self-checking).
    Mig {
        /// GPUs the pod is taken to request (default: as many as NVML sees).
        #[arg(long)]
        requested: Option<u32>,
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

/// Per-GPU cost of `samples` samples, microseconds, sorted (after 100 to warm up).
fn time_samples(s: &mut NvmlSampler, samples: usize) -> anyhow::Result<Vec<f64>> {
    let n = s.gpus().len().max(1) as f64;
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
}

/// Samples with a pause between them, as in the sidecar's loop: caches and
/// CPU clocks are cold at every call.
fn time_gapped(s: &mut NvmlSampler, gap_ms: u64, gap_samples: usize) -> anyhow::Result<Vec<f64>> {
    let n = s.gpus().len().max(1) as f64;
    let mut gapped = Vec::with_capacity(gap_samples);
    for _ in 0..gap_samples {
        std::thread::sleep(Duration::from_millis(gap_ms));
        let t0 = Instant::now();
        s.sample(0.0)?;
        gapped.push(t0.elapsed().as_secs_f64() * 1e6 / n);
    }
    gapped.sort_by(f64::total_cmp);
    Ok(gapped)
}

fn quantiles(us: &[f64]) -> serde_json::Value {
    json!({"median": percentile(us, 0.5), "p99": percentile(us, 0.99), "max": percentile(us, 1.0)})
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
    // As the sidecar runs it (utilization at most once a second), then with
    // utilization read at every sample (the worst case).
    let rss_opened = rss();
    let memory_only = time_samples(&mut s, samples)?;
    let gapped = time_gapped(&mut s, gap_ms, gap_samples)?;
    let mut s = s.with_utilization_every(Duration::ZERO);
    let with_util = time_samples(&mut s, samples)?;
    let detail = s.memory_detail()?;
    println!(
        "{}",
        json!({
            "gpus": s.gpus().iter().map(|g| json!({"index": g.index, "uuid": g.uuid, "model": g.model, "totalBytes": g.total_bytes})).collect::<Vec<_>>(),
            "memory": detail.iter().map(|m| json!({"total": m.total, "reserved": m.reserved, "used": m.used, "free": m.free})).collect::<Vec<_>>(),
            "samples": samples,
            "perGpuUs": quantiles(&memory_only),
            "perGpuUsGapped": {"gapMs": gap_ms, "samples": gap_samples, "median": percentile(&gapped, 0.5), "p99": percentile(&gapped, 0.99)},
            "rssKiB": {"beforeNvml": rss_before, "samplerOpen": rss_opened, "end": rss()},
            "perGpuUsWithUtilization": quantiles(&with_util),
            "processes": s.processes().iter().map(|p| json!({"gpu": p.gpu_index, "pid": p.pid, "usedBytes": p.used_bytes})).collect::<Vec<_>>(),
        })
    );
    Ok(())
}

/// What NVML says about MIG on this machine, and what the sidecar's GPU
/// discovery concludes from it (one JSON line). Self-checking: every GPU
/// whose MIG mode is on must be left out of what discovery would sample.
fn mig(requested: Option<u32>) -> anyhow::Result<()> {
    let nvml = nvml::nvml()?;
    let count = nvml.device_count()?;
    let mut gpus = vec![];
    for index in 0..count {
        let d = nvml.device_by_index(index)?;
        let mode = d
            .mig_mode()
            .map(|m| json!({"current": m.current, "pending": m.pending}));
        let instances = d.mig_device_count().map_err(|e| e.to_string());
        let mut found = vec![];
        for i in 0..instances.clone().unwrap_or(0) {
            if let Ok(m) = d.mig_device_by_index(i) {
                let mem = m
                    .memory_info()
                    .map(|x| json!({"total": x.total, "used": x.used, "free": x.free}));
                found.push(json!({"index": i, "uuid": m.uuid().ok(), "name": m.name().ok(),
                    "memory": mem.map_err(|e| e.to_string()).unwrap_or_else(|e| json!({"error": e}))}));
            }
        }
        gpus.push(
            json!({"index": index, "uuid": d.uuid().ok(), "name": d.name().ok(),
            "migMode": mode.map_err(|e| e.to_string()).unwrap_or_else(|e| json!({"error": e})),
            "maxMigDevices": match &instances { Ok(n) => json!(n), Err(e) => json!({"error": e}) },
            "migDevices": found}),
        );
    }
    let listed = nvml::list_gpus()?;
    let opts = DiscoveryOptions {
        requested_gpus: requested.or(Some(count)),
        ..Default::default()
    };
    let d = discovery::decide(&opts, Ok(&listed), None, &[]);
    let mig_sampled: Vec<u32> = d.gpus.iter().filter(|g| g.mig).map(|g| g.index).collect();
    let ok = mig_sampled.is_empty();
    println!(
        "{}",
        json!({"gpus": gpus, "listed": listed.iter().map(|g| json!({"index": g.index, "uuid": g.uuid, "mig": g.mig})).collect::<Vec<_>>(),
        "discovery": {"requestedGpus": opts.requested_gpus, "reason": d.condition.reason, "status": d.condition.status, "message": d.condition.message,
                      "sampled": d.gpus.iter().map(|g| g.index).collect::<Vec<_>>()},
        "ok": ok})
    );
    anyhow::ensure!(
        ok,
        "discovery would sample MIG-enabled GPU(s) {mig_sampled:?}"
    );
    Ok(())
}

/// The GPUs to sample: `--gpus`, else discovery from the environment.
async fn open(gpus: Option<String>) -> anyhow::Result<(NvmlSampler, memprof_api::Condition)> {
    Ok(match gpus {
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
    })
}

fn create(p: &Option<PathBuf>) -> anyhow::Result<Option<std::io::BufWriter<std::fs::File>>> {
    p.as_ref()
        .map(|p| {
            std::fs::File::create(p)
                .map(std::io::BufWriter::new)
                .with_context(|| format!("cannot create {}", p.display()))
        })
        .transpose()
}

/// One JSON line per GPU: its assessment at `t`.
fn write_events(w: &mut impl Write, m: &Monitor, t: f64) -> anyhow::Result<()> {
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
    Ok(w.flush()?)
}

/// What `monitor` writes to.
struct Outputs {
    trace: Option<TraceWriter<std::io::BufWriter<std::fs::File>>>,
    events: Option<std::io::BufWriter<std::fs::File>>,
    report: Option<PathBuf>,
    stop_file: Option<PathBuf>,
}

/// One sample into the monitor and the trace; its per-GPU cost, µs.
fn sample_once(m: &mut Monitor, out: &mut Outputs, t: f64) -> anyhow::Result<f64> {
    let t0 = Instant::now();
    m.sample(t)?;
    let cost = t0.elapsed().as_secs_f64() * 1e6 / m.series().len().max(1) as f64;
    if let Some(w) = out.trace.as_mut() {
        for (g, s) in m.sampler().gpus().iter().zip(m.series()) {
            if let Some(last) = s.last() {
                w.write(t, g.index, last.used, last.total)?;
            }
        }
    }
    Ok(cost)
}

/// Samples at `hz` until `duration` or the stop file; analyses once a second.
async fn sample_loop(
    m: &mut Monitor,
    out: &mut Outputs,
    hz: f64,
    duration: f64,
) -> anyhow::Result<Vec<f64>> {
    let interval = Duration::from_secs_f64(1.0 / hz);
    let start = Instant::now();
    let (mut next, mut next_analysis) = (start, start);
    let mut cost_us = Vec::new();
    while duration <= 0.0 || start.elapsed().as_secs_f64() < duration {
        let t = now();
        cost_us.push(sample_once(m, out, t)?);
        if Instant::now() >= next_analysis {
            next_analysis += Duration::from_secs(1);
            m.analyse();
            if let Some(w) = out.events.as_mut() {
                write_events(w, m, t)?;
            }
            if let Some(w) = out.trace.as_mut() {
                w.flush()?;
            }
            if out.stop_file.as_ref().is_some_and(|f| f.exists()) {
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
    cost_us.sort_by(f64::total_cmp);
    Ok(cost_us)
}

async fn monitor(
    hz: f64,
    duration: f64,
    gpus: Option<String>,
    mut out: Outputs,
    id: Identity,
) -> anyhow::Result<()> {
    let (sampler, condition) = open(gpus).await?;
    let mut m = Monitor::new(Box::new(sampler), Thresholds::default());
    let cost_us = sample_loop(&mut m, &mut out, hz, duration).await?;
    m.analyse();
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
    if let Some(p) = out.report {
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
        Command::Mig { requested } => mig(requested),
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
            let out = Outputs {
                trace: create(&trace)?.map(TraceWriter::new).transpose()?,
                events: create(&events)?,
                report,
                stop_file,
            };
            monitor(hz, duration, gpus, out, id).await
        }
    }
}
