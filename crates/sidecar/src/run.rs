//! The sidecar's pipeline: sample → analyse → decide to write → write.

use crate::budget::{Budget, Reason, Snapshot};
use crate::metrics::{GpuLabel, Metrics};
use crate::monitor::Monitor;
use crate::{gpus, identity, server, writer, Args};
use anyhow::Context;
use memprof_api::thresholds::Thresholds;
use memprof_api::trace::TraceWriter;
use memprof_api::{Condition, MemoryReportSpec, RiskLevel};
use prometheus_client::registry::Registry;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::net::TcpListener;
use tokio::sync::watch;

/// How often the analysis runs, whatever the sampling rate: it is cheap, but
/// there is no point re-fitting envelopes of 10 s buckets at 100 Hz.
const ANALYSIS_EVERY: Duration = Duration::from_secs(1);

/// Condition a report carries when the endpoints could not listen.
pub const ENDPOINTS_CONDITION: &str = "EndpointsServing";

/// Where the endpoints listen: `--port` on every interface, so Prometheus can
/// scrape the pod IP (`POST /v1/agent` still takes loopback peers only), else
/// `--listen`. IPv4 only: on a dual-stack socket a loopback peer shows as
/// `::ffff:127.0.0.1`, which the agent endpoint would refuse.
pub fn listen_addr(args: &Args) -> SocketAddr {
    match args.port {
        Some(port) => SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)),
        None => args.listen,
    }
}

/// Binds the endpoints' listener. A failure is logged, counted and returned
/// as a condition for the report, never fatal: the port may be the
/// trainer's (9464 is also OpenTelemetry's Prometheus exporter's), and a
/// sidecar that exits non-zero fails a legacy sidecar's training pod. Not
/// retried: a retry could take the port in the moment a restarting trainer
/// lets go of it, and fail the trainer instead.
async fn bind(addr: SocketAddr, metrics: &Metrics) -> Result<TcpListener, Condition> {
    TcpListener::bind(addr).await.map_err(|e| {
        metrics.listen_errors.inc();
        let message = format!(
            "cannot listen on {addr}: {e}; /healthz, /metrics, /v1/report and POST /v1/agent \
             are not served, sampling and reports go on. Give the sidecar a free port with the \
             annotation memprof.dev/port (or --port / MEMPROF_PORT)"
        );
        tracing::error!("{message}");
        Condition::new(ENDPOINTS_CONDITION, false, "ListenFailed", message)
    })
}

fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .round(jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Runs the sidecar until interrupted or `--duration` elapses.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let thresholds: Thresholds = match &args.thresholds {
        Some(json) => serde_json::from_str(json)
            .context("--thresholds is not valid JSON of analysis thresholds")?,
        None => Thresholds::default(),
    };
    thresholds.validate()?;
    if !(args.speed > 0.0 && args.speed.is_finite()) {
        anyhow::bail!("--speed must be a positive number");
    }
    let pod_name = match (&args.pod_name, args.standalone) {
        (Some(p), _) => p.clone(),
        (None, true) => std::env::var("HOSTNAME").unwrap_or_else(|_| "standalone".into()),
        (None, false) => anyhow::bail!("POD_NAME is not set: pass --pod-name or set it through the downward API (or use --standalone)"),
    };
    let rank = args.rank.or_else(|| {
        identity::rank_from(
            std::env::var("JOB_COMPLETION_INDEX").ok().as_deref(),
            std::env::var("RANK").ok().as_deref(),
            &pod_name,
        )
    });
    let id = identity::identity(
        &pod_name,
        args.node_name.clone(),
        args.job_name.clone(),
        rank,
    );

    let gpus::Opened {
        sampler,
        condition: visible,
        mut agent_named,
    } = gpus::open(&args, rank.unwrap_or(0)).await;
    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry);
    metrics.gpu_visible.set(i64::from(visible.is_true()));
    tracing::info!(pod = %pod_name, rank = ?rank, gpus = sampler.gpus().len(), source = %sampler.source(), "{}", visible.message);

    let (report_tx, report_rx) = watch::channel::<Option<MemoryReportSpec>>(None);
    let agent_inbox = server::AgentInbox::default();
    let (write_tx, write_rx) = watch::channel::<Option<(Reason, MemoryReportSpec)>>(None);
    let (stop_tx, stop_rx) = watch::channel(false);

    let mut conditions = vec![visible];
    let shared = server::Shared {
        registry: Arc::new(Mutex::new(registry)),
        report: report_rx,
        agent: agent_inbox.clone(),
        metrics: metrics.clone(),
    };
    let server_task = match bind(listen_addr(&args), &metrics).await {
        Ok(listener) => {
            if let Ok(addr) = listener.local_addr() {
                tracing::info!(%addr, "serving /healthz, /metrics, /v1/report, POST /v1/agent");
            }
            let mut stop = stop_rx.clone();
            Some(tokio::spawn(server::serve(listener, shared, async move {
                let _ = stop.wait_for(|s| *s).await;
            })))
        }
        Err(condition) => {
            conditions.push(condition);
            None
        }
    };

    let writer_task = if args.standalone {
        None
    } else {
        let target = writer::Target {
            namespace: args.namespace.clone(),
            name: pod_name.clone(),
            pod_uid: args.pod_uid.clone(),
        };
        let m = metrics.clone();
        Some(tokio::spawn(async move {
            // A missing kubeconfig is retried, not fatal: the pod must stay healthy.
            let mut delay = Duration::from_secs(1);
            let client = loop {
                match kube::Client::try_default().await {
                    Ok(c) => break c,
                    Err(e) => {
                        tracing::error!(error = %e, "no Kubernetes client; reports are kept locally (GET /v1/report) until one works");
                        m.write_failed("no_client");
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(Duration::from_secs(60));
                    }
                }
            };
            writer::run(client, target, write_rx, m).await
        }))
    };

    let mut trace_out = match &args.trace_out {
        Some(p) => {
            let f = std::fs::File::create(p).with_context(|| format!("cannot create {p}"))?;
            Some(TraceWriter::new(f).with_context(|| format!("cannot write {p}"))?)
        }
        None => None,
    };

    let mut monitor = Monitor::new(sampler, thresholds.clone());
    let budget = Budget {
        heartbeat: args.heartbeat_seconds,
        ..Budget::default()
    };
    let started = Instant::now();
    let t0 = unix_now();
    let sim_time = |elapsed: Duration| t0 + args.speed * elapsed.as_secs_f64();
    let mut last_written: Option<Snapshot> = None;
    let mut last_analysis: Option<Instant> = None;
    let mut last_risk = RiskLevel::None;
    let mut next = Instant::now();
    let mut sample_error_logged = false;
    let mut alone = crate::alone::AloneDetector::new(args.alone_grace_seconds);
    let mut agent_pushes_seen = 0u64;
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);

    loop {
        let deadline =
            (args.duration > 0.0).then(|| started + Duration::from_secs_f64(args.duration));
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tokio::time::sleep_until(next.into()) => {}
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        let t = sim_time(started.elapsed());
        let began = Instant::now();
        match monitor.sample(t) {
            Ok(()) => {
                metrics.samples.inc();
                sample_error_logged = false;
            }
            Err(e) => {
                metrics.sample_errors.inc();
                if !sample_error_logged {
                    tracing::warn!(error = %e, "sampling failed; will keep trying");
                    sample_error_logged = true;
                }
            }
        }
        metrics
            .sampler_duration
            .observe(began.elapsed().as_secs_f64());
        if let Some(f) = trace_out.as_mut() {
            for (i, s) in monitor.series().iter().enumerate() {
                if let Some(last) = s.last() {
                    let gpu = monitor.sampler().gpus()[i].index;
                    let _ = f.write(t - t0, gpu, last.used, last.total);
                }
            }
        }
        for push in agent_inbox.drain() {
            let named = agent_named.as_mut().and_then(|a| a.learn(&push));
            if let Some((sampler, condition)) = named {
                // The pod's GPUs, named by the agent: sampled from now on. A
                // fresh monitor, as its series are per GPU; this happens at
                // the trainers' first pushes, before much history exists.
                tracing::info!("{}", condition.message);
                metrics.gpu_visible.set(i64::from(condition.is_true()));
                conditions[0] = condition;
                monitor = Monitor::new(sampler, thresholds.clone());
            }
            monitor.agent_push(push);
        }

        if last_analysis.is_none_or(|a| a.elapsed() >= ANALYSIS_EVERY) {
            last_analysis = Some(Instant::now());
            let risk = monitor.analyse();
            export_gauges(&metrics, &monitor);
            let report = monitor.report(
                &id,
                now_rfc3339(),
                args.interval.as_millis() as u64,
                conditions.clone(),
            );
            if risk != last_risk {
                transition(&args, &report, last_risk, t - t0);
                last_risk = risk;
            }
            let snap = snapshot(
                &monitor,
                started.elapsed().as_secs_f64(),
                report.breakdown.clone(),
            );
            if !args.standalone {
                if let Some(reason) = budget.decide(last_written.as_ref(), &snap) {
                    write_tx.send_replace(Some((reason, report.clone())));
                    last_written = Some(snap);
                }
            }
            report_tx.send_replace(Some(report));
            if args.exit_when_alone {
                let pushes = metrics.agent_pushes.get();
                let pushed = pushes != agent_pushes_seen;
                agent_pushes_seen = pushes;
                if alone.observe(
                    started.elapsed().as_secs_f64(),
                    monitor.active_processes(),
                    pushed,
                ) {
                    tracing::info!("the trainer is gone (no GPU process, no agent push for {} s): exiting so the Job can complete", args.alone_grace_seconds);
                    break;
                }
            }
        }

        let interval = match args.fast_interval {
            Some(fast) if monitor.worst_risk() >= RiskLevel::Medium => fast,
            _ => args.interval,
        };
        next += interval;
        let now = Instant::now();
        if next < now {
            // Fell behind (suspended, overloaded): skip, don't burst.
            next = now + interval;
        }
    }

    if let Some(f) = trace_out.as_mut() {
        f.flush()?;
    }
    if let Some(path) = &args.output {
        monitor.analyse();
        let report = monitor.report(
            &id,
            now_rfc3339(),
            args.interval.as_millis() as u64,
            conditions.clone(),
        );
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("cannot write {path}"))?;
        tracing::info!(path, "final report written");
    }
    // Give the writer a moment to flush the newest report, then stop everything.
    if let Some(task) = writer_task {
        drop(write_tx);
        let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
    }
    let _ = stop_tx.send(true);
    if let Some(task) = server_task {
        let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
    }
    tracing::info!(
        samples = metrics.samples.get(),
        writes = metrics.writes_total(),
        "stopped"
    );
    Ok(())
}

/// What the write budget looks at: per GPU the upper envelope of the last
/// two buckets (stable across a training step), the peak and the total; the
/// agent's breakdown.
fn snapshot(m: &Monitor, t: f64, breakdown: Option<memprof_api::MemoryBreakdown>) -> Snapshot {
    let gpus = m
        .series()
        .iter()
        .map(|s| {
            let level = s.buckets().rev().take(2).map(|b| b.max).max().unwrap_or(0);
            (level, s.peak(), s.last().map_or(0, |x| x.total))
        })
        .collect();
    Snapshot {
        t,
        risk: m.worst_risk(),
        gpus,
        breakdown,
    }
}

fn export_gauges(metrics: &Metrics, m: &Monitor) {
    for ((info, s), a) in m
        .sampler()
        .gpus()
        .iter()
        .zip(m.series())
        .zip(m.assessments())
    {
        let l = GpuLabel::of(info);
        if let Some(last) = s.last() {
            metrics.gpu_used.get_or_create(&l).set(last.used as f64);
            metrics.gpu_total.get_or_create(&l).set(last.total as f64);
        }
        metrics.gpu_peak.get_or_create(&l).set(s.peak() as f64);
        metrics.gpu_risk.get_or_create(&l).set(a.risk as i64);
        match a.time_to_oom_seconds {
            Some(tto) => {
                metrics.gpu_time_to_oom.get_or_create(&l).set(tto);
            }
            None => {
                metrics.gpu_time_to_oom.remove(&l);
            }
        }
    }
}

/// Logs a risk transition; in standalone mode also prints it as a JSON line.
fn transition(args: &Args, r: &MemoryReportSpec, from: RiskLevel, elapsed: f64) {
    let worst = r.gpus.iter().max_by_key(|g| g.risk);
    tracing::info!(from = %from, to = %r.summary.risk, tto = ?r.summary.time_to_oom, "risk changed");
    if args.standalone {
        let line = serde_json::json!({
            "event": "risk",
            "elapsedSeconds": (elapsed * 10.0).round() / 10.0,
            "from": from,
            "to": r.summary.risk,
            "gpu": worst.map(|g| g.index),
            "usedBytes": worst.map(|g| g.used_bytes),
            "growthBytesPerSecond": worst.map(|g| g.growth_bytes_per_second),
            "timeToOomSeconds": worst.and_then(|g| g.time_to_oom_seconds),
            "confidence": worst.map(|g| g.confidence),
        });
        println!("{line}");
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return ctrl_c.await.unwrap_or(()),
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn port_means_every_interface_and_wins_over_listen() {
        let args = |argv: &[&str]| {
            Args::try_parse_from(["memprof-sidecar"].iter().chain(argv)).expect("valid flags")
        };
        let a = args(&["--listen", "127.0.0.1:9000"]);
        assert_eq!(listen_addr(&a), "127.0.0.1:9000".parse().unwrap());
        let a = args(&["--listen", "127.0.0.1:9000", "--port", "9500"]);
        assert_eq!(listen_addr(&a), "0.0.0.0:9500".parse().unwrap());
    }

    #[tokio::test]
    async fn a_taken_port_is_counted_and_reported_not_fatal() {
        let taken = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = taken.local_addr().unwrap();
        let metrics = Metrics::new(&mut Registry::default());
        let c = bind(addr, &metrics).await.unwrap_err();
        assert_eq!(metrics.listen_errors.get(), 1);
        assert_eq!(
            (c.type_.as_str(), c.is_true(), c.reason.as_str()),
            (ENDPOINTS_CONDITION, false, "ListenFailed")
        );
        assert!(c.message.contains("memprof.dev/port"), "{}", c.message);
    }
}
