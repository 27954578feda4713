//! The sidecar's pipeline, one step after the other at every tick:
//!
//! 1. **sample** the GPUs ([`Sidecar::sample`]) and take the agent's pushes
//!    ([`Sidecar::take_pushes`]);
//! 2. **analyse** (once a second): the report as of now ([`Sidecar::analyse`]);
//! 3. **decide** whether to write it, whether the risk changed, what to
//!    answer the agent ([`Sidecar::decide`], pure but for the answer's
//!    memory of `high`);
//! 4. **write**: hand the report to the writer task, the endpoints and the
//!    agent's answer ([`Sidecar::write`]).
//!
//! Start-up is in [`crate::setup`]; the API server is only ever touched by
//! the writer task, so a slow one never delays sampling.

use crate::acks::AckLog;
use crate::alone::AloneDetector;
use crate::answer::{Answers, Directives, NoDirectives};
use crate::budget::{Budget, Reason, Snapshot};
use crate::checkpoints::CheckpointLog;
use crate::gpus::{self, AgentNamed};
use crate::metrics::Metrics;
use crate::monitor::{Identity, Monitor};
use crate::server::{AgentInbox, Shared};
use crate::setup::{Endpoints, Setup};
use crate::Args;
use anyhow::Context;
use memprof_api::agent::PushReply;
use memprof_api::thresholds::Thresholds;
use memprof_api::trace::TraceWriter;
use memprof_api::{Condition, MemoryReportSpec, RiskLevel};
use prometheus_client::registry::Registry;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How often the analysis runs, whatever the sampling rate: it is cheap, but
/// there is no point re-fitting envelopes of 10 s buckets at 100 Hz.
const ANALYSIS_EVERY: Duration = Duration::from_secs(1);

pub use crate::setup::{listen_addr, ENDPOINTS_CONDITION};

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
    let setup = Setup::from_args(&args)?;
    let trace_out = match &args.trace_out {
        Some(p) => {
            let f = std::fs::File::create(p).with_context(|| format!("cannot create {p}"))?;
            Some(TraceWriter::new(f).with_context(|| format!("cannot write {p}"))?)
        }
        None => None,
    };
    let (mut sidecar, endpoints, writer) = Sidecar::start(args, setup, trace_out).await;
    sidecar.run_loop().await;
    sidecar.finish(endpoints, writer).await
}

/// What the pipeline hands to others: the writer task, the endpoints, the
/// agent's answers.
struct Outputs {
    /// To the writer task (none in standalone mode).
    write: Option<watch::Sender<Option<(Reason, MemoryReportSpec)>>>,
    /// To `GET /v1/report`.
    report: watch::Sender<Option<MemoryReportSpec>>,
    /// To `POST /v1/agent`'s answer.
    answer: watch::Sender<PushReply>,
}

/// What [`Sidecar::decide`] concluded about one analysis.
#[derive(Debug, PartialEq)]
pub struct Decision {
    /// Write the report, and why.
    pub write: Option<Reason>,
    /// What the budget compares the next analysis with, once written.
    pub snapshot: Snapshot,
    /// The risk before, when it changed.
    pub risk_changed_from: Option<RiskLevel>,
    /// The answer to the agent's pushes from now on.
    pub answer: PushReply,
}

/// The endpoints' view of the pipeline, and the pipeline's ends of it (the
/// writer's is added when there is a writer).
fn wire(registry: Registry, metrics: &Metrics) -> (Shared, Outputs, AgentInbox) {
    let (report, report_rx) = watch::channel(None);
    let (answer, answer_rx) = watch::channel(PushReply {
        accepted: true,
        ..Default::default()
    });
    let inbox = AgentInbox::default();
    let shared = Shared {
        registry: Arc::new(Mutex::new(registry)),
        report: report_rx,
        agent: inbox.clone(),
        answer: answer_rx,
        metrics: metrics.clone(),
    };
    let out = Outputs {
        write: None,
        report,
        answer,
    };
    (shared, out, inbox)
}

/// Sample time: the wall clock, or a scenario's or trace's clock at `--speed`.
struct Clock {
    started: Instant,
    t0: f64,
    speed: f64,
}

impl Clock {
    fn now(&self) -> f64 {
        self.t0 + self.speed * self.started.elapsed().as_secs_f64()
    }
}

/// The sidecar's state between ticks.
pub struct Sidecar {
    args: Args,
    id: Identity,
    thresholds: Thresholds,
    monitor: Monitor,
    agent_named: Option<AgentNamed>,
    conditions: Vec<Condition>,
    metrics: Metrics,
    inbox: AgentInbox,
    acks: AckLog,
    /// The newest checkpoint the pod's trainers announced.
    checkpoints: CheckpointLog,
    /// The newest allocation-site snapshot of the pod's trainers, and how many were pushed.
    sites: (Option<memprof_api::AllocationSites>, u64),
    answers: Answers,
    directives: Box<dyn Directives>,
    budget: Budget,
    out: Outputs,
    trace_out: Option<TraceWriter<std::fs::File>>,
    clock: Clock,
    last_written: Option<Snapshot>,
    last_analysis: Option<Instant>,
    last_risk: RiskLevel,
    sample_error_logged: bool,
    alone: AloneDetector,
    agent_pushes_seen: u64,
    /// The kubelet's names for a neighbour the verdict blames.
    neighbours: crate::neighbours::Neighbours,
}

impl Sidecar {
    /// Opens the GPUs, starts the endpoints and (outside standalone mode) the
    /// writer task.
    async fn start(
        args: Args,
        setup: Setup,
        trace_out: Option<TraceWriter<std::fs::File>>,
    ) -> (Sidecar, Endpoints, Option<JoinHandle<()>>) {
        let opened = gpus::open(&args, setup.rank.unwrap_or(0)).await;
        let mut registry = Registry::default();
        let metrics = Metrics::new(&mut registry);
        metrics
            .gpu_visible
            .set(i64::from(opened.condition.is_true()));
        tracing::info!(pod = %setup.id.pod_name, rank = ?setup.rank, gpus = opened.sampler.gpus().len(), source = %opened.sampler.source(), "{}", opened.condition.message);
        let (shared, mut out, inbox) = wire(registry, &metrics);
        let (endpoints, endpoint_conditions) = Endpoints::start(&args, shared).await;
        let writer = (!args.standalone).then(|| {
            let (tx, rx) = watch::channel(None);
            out.write = Some(tx);
            crate::setup::start_writer(&args, &setup.id.pod_name, rx, metrics.clone())
        });
        let mut conditions = vec![opened.condition];
        conditions.extend(endpoint_conditions);
        let sidecar = Sidecar {
            monitor: Monitor::new(opened.sampler, setup.thresholds.clone()),
            agent_named: opened.agent_named,
            conditions,
            metrics,
            inbox,
            acks: AckLog::default(),
            checkpoints: CheckpointLog::default(),
            sites: (None, 0),
            answers: Answers::default(),
            directives: if args.standalone {
                Box::new(NoDirectives)
            } else {
                Box::new(crate::setup::start_directives(&args, &setup.id.pod_name))
            },
            budget: Budget {
                heartbeat: args.heartbeat_seconds,
                ..Budget::default()
            },
            out,
            trace_out,
            clock: Clock {
                started: Instant::now(),
                t0: unix_now(),
                speed: args.speed,
            },
            last_written: None,
            last_analysis: None,
            last_risk: RiskLevel::None,
            sample_error_logged: false,
            alone: AloneDetector::new(args.alone_grace_seconds),
            agent_pushes_seen: 0,
            neighbours: crate::neighbours::Neighbours::from_env(),
            id: setup.id,
            thresholds: setup.thresholds,
            args,
        };
        (sidecar, endpoints, writer)
    }

    /// Ticks until a signal, `--duration`, or the trainer is gone.
    async fn run_loop(&mut self) {
        let shutdown = shutdown_signal();
        tokio::pin!(shutdown);
        let deadline = (self.args.duration > 0.0)
            .then(|| self.clock.started + Duration::from_secs_f64(self.args.duration));
        let mut next = Instant::now();
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                _ = tokio::time::sleep_until(next.into()) => {}
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                break;
            }
            let t = self.clock.now();
            self.sample(t);
            self.take_pushes();
            if self.analysis_due() {
                let mut report = self.analyse();
                self.neighbours.name(&mut report);
                let decision = self.decide(&report);
                self.write(report, decision, t);
                if self.trainer_gone() {
                    break;
                }
            }
            next = self.next_tick(next);
        }
    }

    /// Step 1: one sample of every GPU, into the series and the trace.
    fn sample(&mut self, t: f64) {
        let began = Instant::now();
        match self.monitor.sample(t) {
            Ok(()) => {
                self.metrics.samples.inc();
                self.sample_error_logged = false;
            }
            Err(e) => {
                self.metrics.sample_errors.inc();
                if !self.sample_error_logged {
                    tracing::warn!(error = %e, "sampling failed; will keep trying");
                    self.sample_error_logged = true;
                }
            }
        }
        self.metrics
            .sampler_duration
            .observe(began.elapsed().as_secs_f64());
        if let Some(f) = self.trace_out.as_mut() {
            for (s, g) in self
                .monitor
                .series()
                .iter()
                .zip(self.monitor.sampler().gpus())
            {
                if let Some(last) = s.last() {
                    let _ = f.write(t - self.clock.t0, g.index, last.used, last.total);
                }
            }
        }
    }

    /// Step 1, the agent's half: every push queued since the last tick.
    fn take_pushes(&mut self) {
        let pushes = self.inbox.drain();
        if pushes.is_empty() {
            return;
        }
        let received = now_rfc3339();
        let received_at = jiff::Timestamp::now();
        for push in pushes {
            let named = self.agent_named.as_mut().and_then(|a| a.learn(&push));
            if let Some((sampler, condition)) = named {
                // The pod's GPUs, named by the agent: sampled from now on. A
                // fresh monitor, as its series are per GPU; this happens at
                // the trainers' first pushes, before much history exists.
                tracing::info!("{}", condition.message);
                self.metrics.gpu_visible.set(i64::from(condition.is_true()));
                self.conditions[0] = condition;
                self.monitor = Monitor::new(sampler, self.thresholds.clone());
            }
            self.acks.observe(&push, &received);
            self.checkpoints.observe(&push, received_at);
            if let Some(s) = &push.sites {
                let at =
                    jiff::Timestamp::from_duration(jiff::SignedDuration::from_secs_f64(s.time))
                        .map_or_else(|_| received.clone(), |t| t.to_string());
                self.sites = (
                    Some(memprof_api::AllocationSites::from_snapshot(s, at)),
                    self.sites.1 + 1,
                );
            }
            self.monitor.agent_push(push);
        }
    }

    fn analysis_due(&mut self) -> bool {
        let due = self
            .last_analysis
            .is_none_or(|a| a.elapsed() >= ANALYSIS_EVERY);
        if due {
            self.last_analysis = Some(Instant::now());
        }
        due
    }

    /// Step 2: the report as of now, and the per-GPU gauges from it.
    fn analyse(&mut self) -> MemoryReportSpec {
        // Only NVML lists processes to match the pids against: the sim and
        // trace backends would scan /proc each second for nothing.
        let nvml = self.args.backend == crate::gpus::Backend::Nvml;
        if let Some(file) = self.args.trainer_pid_file.as_ref().filter(|_| nvml) {
            self.monitor.own_processes(crate::trainer::processes(file));
        }
        self.monitor.analyse();
        let mut report = self.monitor.report(
            &self.id,
            now_rfc3339(),
            self.args.interval.as_millis() as u64,
            self.conditions.clone(),
        );
        report.heartbeat_seconds = Some(heartbeat_seconds(self.args.heartbeat_seconds));
        report.agent_acks = self.acks.report();
        report.last_checkpoint = self.checkpoints.report();
        report.allocation_sites = self.sites.0.clone();
        self.metrics.export(&report);
        report
    }

    /// Step 3: whether to write (the write budget), whether the risk changed,
    /// and the answer to the agent's next pushes.
    pub fn decide(&mut self, report: &MemoryReportSpec) -> Decision {
        let snapshot = snapshot(
            &self.monitor,
            self.clock.started.elapsed().as_secs_f64(),
            report.breakdown.clone(),
            (self.acks.generation(), self.checkpoints.generation()),
            self.sites.1,
        );
        let write = match self.out.write {
            Some(_) => self.budget.decide(self.last_written.as_ref(), &snapshot),
            None => None,
        };
        let risk = report.summary.risk;
        let directives = self.directives.current();
        Decision {
            write,
            snapshot,
            risk_changed_from: (risk != self.last_risk).then_some(self.last_risk),
            answer: self.answers.answer(report, unix_now(), directives),
        }
    }

    /// Step 4: hand the report to the writer (when decided), the endpoints
    /// and the agent's answers; log a risk change.
    fn write(&mut self, report: MemoryReportSpec, d: Decision, t: f64) {
        if let Some(from) = d.risk_changed_from {
            transition(&self.args, &report, from, t - self.clock.t0);
            self.last_risk = report.summary.risk;
        }
        if let (Some(reason), Some(tx)) = (d.write, &self.out.write) {
            tx.send_replace(Some((reason, report.clone())));
            self.last_written = Some(d.snapshot);
        }
        self.out.answer.send_replace(d.answer);
        self.out.report.send_replace(Some(report));
    }

    /// With `--exit-when-alone`: whether the trainer is gone.
    fn trainer_gone(&mut self) -> bool {
        if !self.args.exit_when_alone {
            return false;
        }
        let pushes = self.metrics.agent_pushes.get();
        let pushed = pushes != self.agent_pushes_seen;
        self.agent_pushes_seen = pushes;
        let gone = self.alone.observe(
            self.clock.started.elapsed().as_secs_f64(),
            self.monitor.active_processes(),
            pushed,
        );
        if gone {
            tracing::info!("the trainer is gone (no GPU process, no agent push for {} s): exiting so the Job can complete", self.args.alone_grace_seconds);
        }
        gone
    }

    /// The next tick: the fast interval while the risk is medium or above;
    /// after a stall (suspended, overloaded) skip, don't burst.
    fn next_tick(&self, previous: Instant) -> Instant {
        let interval = match self.args.fast_interval {
            Some(fast) if self.monitor.worst_risk() >= RiskLevel::Medium => fast,
            _ => self.args.interval,
        };
        let now = Instant::now();
        let next = previous + interval;
        if next < now {
            now + interval
        } else {
            next
        }
    }

    /// Flushes the trace, writes `--output`, lets the writer send the newest
    /// report, stops the endpoints (removing the socket).
    async fn finish(
        mut self,
        endpoints: Endpoints,
        writer: Option<JoinHandle<()>>,
    ) -> anyhow::Result<()> {
        if let Some(f) = self.trace_out.as_mut() {
            f.flush()?;
        }
        if let Some(path) = self.args.output.clone() {
            let report = self.analyse();
            std::fs::write(&path, serde_json::to_string_pretty(&report)?)
                .with_context(|| format!("cannot write {path}"))?;
            tracing::info!(path, "final report written");
        }
        if let Some(task) = writer {
            drop(self.out.write.take());
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
        endpoints.stop().await;
        tracing::info!(
            samples = self.metrics.samples.get(),
            writes = self.metrics.writes_total(),
            "stopped"
        );
        Ok(())
    }
}

/// The heartbeat as the report states it: whole seconds, rounded up, at least 1.
fn heartbeat_seconds(heartbeat: f64) -> u64 {
    if heartbeat.is_finite() && heartbeat > 1.0 {
        heartbeat.ceil().min(86_400.0) as u64
    } else {
        1
    }
}

/// What the write budget looks at: per GPU the upper envelope of the last
/// two buckets (stable across a training step), the peak and the total; the
/// agent's breakdown and acknowledgements.
fn snapshot(
    m: &Monitor,
    t: f64,
    breakdown: Option<memprof_api::MemoryBreakdown>,
    (acks, checkpoint): (u64, u64),
    sites: u64,
) -> Snapshot {
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
        acks,
        sites,
        checkpoint,
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
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return ctrl_c.await.unwrap_or(()),
    };
    tokio::select! {
        _ = ctrl_c => {}
        _ = term.recv() => {}
    }
}

#[cfg(test)]
mod tests;
