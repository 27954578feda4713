//! The sampling → analysis half of a sidecar, without any I/O of its own:
//! a [`Monitor`] owns a [`Sampler`] and one [`GpuSeries`] per GPU, plus what
//! the in-process agent pushed ([`AgentState`]), and turns them into a
//! [`MemoryReportSpec`]. The sidecar, its standalone mode and the CLI all
//! drive one, so what runs on a GPU box is what runs in a pod.
//!
//! NVML and the agent together: a GPU both see (same UUID) keeps NVML's
//! used/peak/timeline, and takes its risk, growth, time to OOM, leak flag and
//! fragmentation from the allocator (`assessedFrom: agent`) while the agent's
//! pushes are fresh; GPUs only the agent sees (`agentOnly` pods) are
//! reported from its numbers alone (`source: agent`).

use crate::sampler::{self, Sampler};
use memprof_analysis::allocator::{AgentDevice, AgentState};
use memprof_analysis::tracker::{GpuVerdict, Tracker};
use memprof_analysis::{Assessment, GpuSeries};
use memprof_api::thresholds::Thresholds;
use memprof_api::{
    Condition, DataSource, GpuReport, MemoryReportSpec, RiskLevel, TimelinePoint,
    MAX_TIMELINE_POINTS,
};

pub use memprof_analysis::tracker::AGENT_FRESH_SECONDS;

/// Who the report is about.
#[derive(Clone, Debug, Default)]
pub struct Identity {
    /// Pod name.
    pub pod_name: String,
    /// Node name.
    pub node_name: Option<String>,
    /// Job name.
    pub job_name: Option<String>,
    /// Rank.
    pub rank: Option<u32>,
}

/// Samples GPUs and keeps their analysed history: the analysis is the
/// library's [`Tracker`] (NVML's series, the agent's pushes, the rule that
/// combines them and the hysteresis of the published level and leak flag),
/// the one `memprof analyze --evaluate` replays.
pub struct Monitor {
    sampler: Box<dyn Sampler>,
    tracker: Tracker,
    utilization: Vec<Option<u32>>,
    /// The newest breakdown of each trainer process.
    breakdowns: memprof_analysis::breakdown::Latest,
    worst: RiskLevel,
    last_t: f64,
}

impl Monitor {
    /// A monitor over `sampler`'s GPUs.
    pub fn new(sampler: Box<dyn Sampler>, thresholds: Thresholds) -> Self {
        let n = sampler.gpus().len();
        let mut tracker = Tracker::new(&thresholds);
        for g in sampler.gpus() {
            tracker.add_gpu(g.index, Some(&g.uuid));
        }
        Monitor {
            tracker,
            utilization: vec![None; n],
            breakdowns: Default::default(),
            worst: RiskLevel::None,
            sampler,
            last_t: 0.0,
        }
    }

    /// Takes one sample of every GPU at time `t` (seconds). Cheap: the
    /// analysis runs separately, in [`Monitor::analyse`].
    pub fn sample(&mut self, t: f64) -> Result<(), sampler::Error> {
        let readings = self.sampler.sample(t)?;
        let gpus = self.sampler.gpus();
        for (i, (r, g)) in readings.iter().zip(gpus).enumerate() {
            self.tracker
                .sample(t, g.index, Some(&g.uuid), r.used_bytes, r.total_bytes);
            if let Some(u) = r.utilization_percent {
                self.tracker.utilization(t, g.index, u);
            }
            if let Some(rx) = r.received_bytes_per_second {
                self.tracker.pcie_received(t, g.index, rx);
            }
            self.utilization[i] = r.utilization_percent;
        }
        self.last_t = t;
        Ok(())
    }

    /// The trainer's processes known without the agent (see
    /// [`memprof_analysis::tracker::Tracker::own_processes`]).
    pub fn own_processes(&mut self, pids: Vec<u32>) {
        self.tracker.own_processes(pids);
    }

    /// Re-assesses every GPU, NVML's and the agent's; returns the worst
    /// published risk.
    pub fn analyse(&mut self) -> RiskLevel {
        if let Some(list) = self.sampler.processes() {
            for g in self.sampler.gpus() {
                let on: Vec<(u32, u64)> = list
                    .iter()
                    .filter(|p| p.gpu_index == g.index)
                    .filter_map(|p| Some((p.pid, p.used_bytes?)))
                    .collect();
                self.tracker.processes(self.last_t, g.index, &on);
            }
        }
        self.tracker.analyse(self.last_t);
        self.worst = self
            .gpu_reports()
            .iter()
            .map(|g| g.risk)
            .max()
            .unwrap_or_default();
        self.worst
    }

    /// The worst risk of the last analysis.
    pub fn worst_risk(&self) -> RiskLevel {
        self.worst
    }

    /// NVML's own assessments of the last analysis (before the agent and the
    /// hysteresis), one per sampled GPU.
    pub fn assessments(&self) -> &[Assessment] {
        self.tracker.nvml_assessments()
    }

    /// The published verdicts of the last analysis: the sampler's GPUs, then
    /// the GPUs only the agent sees.
    pub fn verdicts(&self) -> &[GpuVerdict] {
        self.tracker.verdicts()
    }

    /// The history of every GPU.
    pub fn series(&self) -> &[GpuSeries] {
        self.tracker.all_series()
    }

    /// The sampler.
    pub fn sampler(&self) -> &dyn Sampler {
        self.sampler.as_ref()
    }

    /// Processes computing on the GPUs, when the backend can tell.
    pub fn active_processes(&mut self) -> Option<usize> {
        self.sampler.active_processes()
    }

    /// Takes one push of the in-process agent (already validated). Its
    /// numbers count from the next [`Monitor::analyse`].
    pub fn agent_push(&mut self, push: memprof_api::agent::Push) {
        self.tracker.push(&push);
        self.breakdowns.observe(&push);
    }

    /// What the agent pushed so far.
    pub fn agent(&self) -> &AgentState {
        self.tracker.agent()
    }

    /// One entry per GPU: the sampler's (with the agent-fed verdict where
    /// the agent sees the same GPU), then the GPUs only the agent sees.
    fn gpu_reports(&self) -> Vec<GpuReport> {
        let verdicts = self.tracker.verdicts();
        let assessments = self.tracker.agent_assessments();
        let devices = self.tracker.agent().devices();
        let mut gpus: Vec<GpuReport> = Vec::new();
        for (i, info) in self.sampler.gpus().iter().enumerate() {
            let Some(series) = self.tracker.series(info.index) else {
                continue;
            };
            let v = verdicts
                .iter()
                .find(|v| !v.agent_only && v.index == info.index);
            let default = Assessment::default();
            let a = v.map_or(&default, |v| &v.assessment);
            let util = self.utilization.get(i).copied().flatten();
            let mut g = self.sampled_gpu(info, series, a, util);
            if let Some(v) = v {
                g.risk_held_until = v.held_until.map(memprof_api::rfc3339);
                if let Some(aa) = v.agent_device.and_then(|d| assessments.get(d)) {
                    g.fragmentation = aa.fragmentation;
                }
                if v.from_agent {
                    g.assessed_from = Some(DataSource::Agent);
                }
            }
            gpus.push(g);
        }
        for v in verdicts.iter().filter(|v| v.agent_only) {
            let Some(d) = v.agent_device.and_then(|d| devices.get(d)) else {
                continue;
            };
            let frag = v
                .agent_device
                .and_then(|d| assessments.get(d))
                .and_then(|aa| aa.fragmentation);
            if let Some(mut g) = agent_only_gpu(d, &v.assessment, frag) {
                g.risk_held_until = v.held_until.map(memprof_api::rfc3339);
                gpus.push(g);
            }
        }
        gpus.truncate(memprof_api::MAX_GPUS_PER_REPORT);
        gpus
    }

    /// A sampled GPU as its own series and assessment say.
    fn sampled_gpu(
        &self,
        info: &crate::sampler::GpuInfo,
        series: &GpuSeries,
        a: &Assessment,
        util: Option<u32>,
    ) -> GpuReport {
        let mut g = GpuReport {
            index: info.index,
            uuid: info.uuid.clone(),
            model: info.model.clone(),
            total_bytes: series.last().map_or(info.total_bytes, |s| s.total),
            used_bytes: series.last().map_or(0, |s| s.used),
            peak_bytes: series.peak(),
            utilization_percent: util,
            spike_detected: a.spike_detected,
            source: self.sampler.source(),
            timeline: timeline(series),
            ..Default::default()
        };
        take_assessment(&mut g, a);
        g
    }

    /// The report as of the last sample and analysis. `conditions` come from
    /// the caller (GPU discovery knows why GPUs are or are not visible).
    pub fn report(
        &self,
        id: &Identity,
        sampled_at: String,
        interval_ms: u64,
        conditions: Vec<Condition>,
    ) -> MemoryReportSpec {
        let gpus = self.gpu_reports();
        // Numbers from the agent alone when no sampler GPU is there (agentOnly).
        let source = if self.sampler.gpus().is_empty() && !gpus.is_empty() {
            DataSource::Agent
        } else {
            self.sampler.source()
        };
        MemoryReportSpec {
            pod_name: id.pod_name.clone(),
            node_name: id.node_name.clone(),
            job_name: id.job_name.clone(),
            rank: id.rank,
            sampled_at,
            interval_ms: interval_ms.max(1),
            summary: memprof_analysis::summarize(&gpus, source),
            gpus,
            allocator: self.agent().stats(),
            breakdown: self.breakdowns.report(),
            conditions,
            // The loop's own: its heartbeat and the trainers' acknowledgements.
            heartbeat_seconds: None,
            agent_acks: vec![],
            allocation_sites: None,
            last_checkpoint: None,
        }
    }
}

/// The published verdict of a GPU: risk, growth, time to OOM, confidence,
/// leak flag and the cause it names, all from one assessment (so a report
/// never pairs one verdict's risk with another's cause or TTO).
fn take_assessment(g: &mut GpuReport, a: &Assessment) {
    g.growth_bytes_per_second = finite(a.growth_bytes_per_second);
    g.time_to_oom_seconds = a.time_to_oom_seconds.filter(|t| t.is_finite());
    g.risk = a.risk;
    g.confidence = finite(a.confidence);
    g.leak_suspected = a.leak_suspected;
    g.cause = a.cause.clone();
}

/// A GPU only the agent sees: memory in use is the device's (total − free,
/// what NVML would show), the assessment the allocator's.
fn agent_only_gpu(
    d: &AgentDevice,
    a: &Assessment,
    fragmentation: Option<f64>,
) -> Option<GpuReport> {
    let used = d.used_series();
    let last = used.last()?;
    let mut g = GpuReport {
        index: d.index,
        // Both are required strings, and an API server of 1.20 reads "" in a
        // required field as null and refuses the whole report: name what
        // the agent left out.
        uuid: agent_uuid(d),
        model: d
            .name
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "unknown (agent)".into()),
        total_bytes: last.total,
        used_bytes: last.used,
        peak_bytes: used.peak(),
        spike_detected: a.spike_detected,
        fragmentation,
        source: DataSource::Agent,
        timeline: timeline(used),
        ..Default::default()
    };
    take_assessment(&mut g, a);
    Some(g)
}

/// The UUID of a GPU only the agent sees, as NVML (and `nvidia-smi -L`)
/// spells it. CUDA names a MIG instance `<product> MIG <profile>` and gives
/// it the instance's UUID, which the agent prefixes `GPU-` like any other:
/// `MIG-` is what it is, and no exporter's `GPU-` UUID will match it by
/// mistake (docs/observability.md: MIG devices are not joined).
fn agent_uuid(d: &AgentDevice) -> String {
    let Some(uuid) = d.uuid.clone().filter(|u| !u.is_empty()) else {
        return format!("cuda:{}", d.index);
    };
    let mig = d.name.as_deref().is_some_and(|n| n.contains(" MIG "));
    match uuid.get(..4) {
        Some(p) if mig && p.eq_ignore_ascii_case("GPU-") => format!("MIG-{}", &uuid[4..]),
        _ => uuid,
    }
}

fn finite(v: f64) -> f64 {
    if v.is_finite() {
        v
    } else {
        0.0
    }
}

/// The newest buckets of a series as timeline points, merged pairwise until
/// they fit the report's bound.
fn timeline(series: &GpuSeries) -> Vec<TimelinePoint> {
    let mut points: Vec<TimelinePoint> = series
        .buckets()
        .map(|b| TimelinePoint {
            t: b.start as i64,
            max: b.max,
            min: b.min,
        })
        .collect();
    while points.len() > MAX_TIMELINE_POINTS {
        points = points
            .chunks(2)
            .map(|c| TimelinePoint {
                t: c[0].t,
                max: c.iter().map(|p| p.max).max().unwrap_or(0),
                min: c.iter().map(|p| p.min).min().unwrap_or(0),
            })
            .collect();
    }
    points
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::sim::{Scenario, SimSampler};

    /// Two GPUs, one at high risk with 5 min to OOM, the other low with a
    /// young trend of 20 s: the summary shows the high GPU's risk and time
    /// to OOM (the low GPU's 20 s was paired with the worst risk before),
    /// and the low GPU's trend is shown nowhere.
    #[test]
    fn the_summary_shows_one_gpus_risk_and_time_to_oom() {
        let gpu = |index, risk, tto| GpuReport {
            index,
            total_bytes: 80 << 30,
            risk,
            time_to_oom_seconds: Some(tto),
            ..Default::default()
        };
        let gpus = [gpu(0, RiskLevel::Low, 20.0), gpu(1, RiskLevel::High, 300.0)];
        let s = memprof_analysis::summarize(&gpus, DataSource::Sim);
        assert_eq!(
            (s.risk, s.time_to_oom.as_deref()),
            (RiskLevel::High, Some("5m0s"))
        );
        assert_eq!(gpus[0].tto_text(), "-");
        let calm = memprof_analysis::summarize(&gpus[..1], DataSource::Sim);
        assert_eq!((calm.risk, calm.time_to_oom), (RiskLevel::Low, None));
    }

    /// The verdict's cause reaches the report with its evidence (a 50 MiB/s
    /// leak is medium with ~15 min to go; growth NVML cannot yet call a
    /// leak is named growing demand until its regular steps make it one).
    #[test]
    fn a_leaking_gpus_report_names_the_leak() {
        let mut m = leaking_monitor();
        let mut named = None;
        for i in 0..=300 {
            m.sample(1_000_000.0 + i as f64).unwrap();
            m.analyse();
            let r = m.report(&Identity::default(), String::new(), 1000, vec![]);
            let cause = r.gpus[0].cause.clone();
            if r.gpus[0].risk >= RiskLevel::Medium
                && cause
                    .as_ref()
                    .is_some_and(|c| c.cause == memprof_api::Cause::Leak)
            {
                named = cause;
                break;
            }
        }
        let c = named.expect("a medium risk with a named cause");
        assert_eq!(c.cause, memprof_api::Cause::Leak, "{c:?}");
        assert!(!c.evidence.is_empty());
    }

    fn leaking_monitor() -> Monitor {
        let s = Scenario::parse("default: { leakMiBPerSecond: 50, noiseGiB: 0 }").unwrap();
        Monitor::new(Box::new(SimSampler::new(s, 0)), Thresholds::default())
    }

    /// A steady 100 MiB/s simulated leak logged 17 `risk changed`
    /// lines in 5.5 minutes (critical -> high at TTO 24 s and 8 s), and at
    /// the ceiling lost its leak flag while its TTO stayed 4 s. Through the
    /// sidecar's analysis, every published verdict agrees with its own
    /// evidence, the escalation reads each level once, and at the ceiling
    /// the GPU keeps its leak flag and says OOM now; still running two
    /// buckets later (the simulated trainer never fails), it keeps the
    /// flag and promises no time.
    #[test]
    fn a_steady_simulated_leak_escalates_once_per_level_and_never_contradicts_itself() {
        let th = Thresholds::default();
        let s = Scenario::parse("default: { leakMiBPerSecond: 100 }").unwrap();
        let mut m = Monitor::new(Box::new(SimSampler::new(s, 7)), th.clone());
        let mut published = Vec::new();
        for i in 0..=700 {
            let t = 1_000_000.0 + i as f64;
            m.sample(t).unwrap();
            m.analyse();
            for v in m.verdicts() {
                if let Err(e) = memprof_analysis::verdict::check(&v.assessment, &th, v.held) {
                    panic!("t={i}: {e}");
                }
            }
            let r = m.report(&Identity::default(), String::new(), 1000, vec![]);
            let g = &r.gpus[0];
            published.push((i, r.summary.risk, g.time_to_oom_seconds, g.leak_suspected));
        }
        let transitions = published.windows(2).filter(|w| w[0].1 != w[1].1).count();
        let reached: std::collections::BTreeSet<RiskLevel> =
            published.iter().map(|p| p.1).collect();
        let changes: Vec<_> = published
            .windows(2)
            .filter(|w| w[0].1 != w[1].1)
            .map(|w| w[1])
            .collect();
        assert!(
            transitions <= reached.len() + 1,
            "{transitions} transitions over {reached:?}: {changes:?}"
        );
        // At most one fall (the goal: levels reached + 1), none to
        // low, none once the leak is within two minutes of its OOM.
        let falls = published.windows(2).filter(|w| w[1].1 < w[0].1).count();
        assert!(falls <= 1, "{changes:?}");
        assert!(published[40..].iter().all(|p| p.1 >= RiskLevel::Medium));
        assert!(published[340..].iter().all(|p| p.1 == RiskLevel::Critical));
        assert!(reached.contains(&RiskLevel::Critical));
        // The peaks reach 80 GiB at ~410 s: full after growing is OOM now,
        // then, still running, no time to OOM; critical and the leak flag stay.
        let full = published
            .iter()
            .position(|p| p.2 == Some(0.0))
            .expect("OOM now at the ceiling");
        for p in &published[full + 25..] {
            assert_eq!((p.1, p.2, p.3), (RiskLevel::Critical, None, true), "{p:?}");
        }
    }

    #[test]
    fn a_report_carries_analysis_and_a_bounded_timeline() {
        let mut m = leaking_monitor();
        for i in 0..600 {
            m.sample(1_000_000.0 + i as f64 * 0.5).unwrap();
        }
        m.analyse();
        let id = Identity {
            pod_name: "train-0".into(),
            rank: Some(0),
            ..Default::default()
        };
        let r = m.report(&id, "2026-11-22T10:00:00Z".into(), 500, vec![]);
        assert_eq!(r.gpus.len(), 1);
        let g = &r.gpus[0];
        assert!(g.risk >= RiskLevel::High, "{g:?}");
        assert!(g.leak_suspected);
        assert!(g.peak_bytes >= g.used_bytes);
        assert!(g.timeline.len() <= MAX_TIMELINE_POINTS && g.timeline.len() > 10);
        assert_eq!(r.summary.source, memprof_api::DataSource::Sim);
        assert!(r.summary.time_to_oom.is_some());
        assert!(memprof_analysis::validate_report(&r).is_ok());
        // Bounded size whatever the run length.
        assert!(serde_json::to_vec(&r).unwrap().len() < 8 * 1024);
    }

    const GB: f64 = 1e9;
    const TOTAL: u64 = 80_000_000_000;

    /// A push of one device leaking `rate` bytes/s from 30 GB at time `t`.
    fn leak_push(uuid: &str, t: f64, rate: f64) -> memprof_api::agent::Push {
        let allocated = (30.0 * GB + rate * t) as u64;
        let reserved = allocated + 2_000_000_000;
        memprof_api::agent::Push {
            version: 1,
            time: 1.8e9 + t,
            step: Some(t as u64),
            devices: vec![memprof_api::agent::DeviceStats {
                uuid: Some(uuid.into()),
                allocated_bytes: allocated,
                reserved_bytes: reserved,
                inactive_split_bytes: Some(1_000_000_000),
                free_bytes: Some(TOTAL - reserved - 500_000_000),
                total_bytes: Some(TOTAL),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    /// What a curve gives at `t`: memory used, utilization and the bytes
    /// per second received over PCIe.
    type Reading = (f64, u32, Option<u64>);

    /// One GPU whose memory and activity at `t` the function gives.
    struct Curve(fn(f64) -> Reading, Vec<crate::sampler::GpuInfo>);
    impl Sampler for Curve {
        fn source(&self) -> DataSource {
            DataSource::Nvml
        }
        fn gpus(&self) -> &[crate::sampler::GpuInfo] {
            &self.1
        }
        fn sample(&mut self, t: f64) -> Result<Vec<crate::sampler::GpuReading>, sampler::Error> {
            let (used, utilization, received) = (self.0)(t);
            Ok(vec![crate::sampler::GpuReading {
                used_bytes: used as u64,
                total_bytes: 80_000_000_000,
                utilization_percent: Some(utilization),
                received_bytes_per_second: received,
            }])
        }
    }

    /// A monitor over `curve` after `secs` seconds sampled at 10 Hz and
    /// analysed each second; the worst risk published on the way.
    fn run_curve(curve: fn(f64) -> Reading, secs: usize) -> (Monitor, RiskLevel) {
        let gpu = crate::sampler::GpuInfo {
            index: 0,
            uuid: "GPU-curve".into(),
            ..Default::default()
        };
        let mut m = Monitor::new(Box::new(Curve(curve, vec![gpu])), Thresholds::default());
        let mut worst = RiskLevel::None;
        for i in 0..=secs * 10 {
            let t = i as f64 / 10.0;
            m.sample(t).unwrap();
            if i % 10 == 0 {
                worst = worst.max(m.analyse());
            }
        }
        (m, worst)
    }

    /// 1 GB/s from 10 s (weights arriving, or a leak).
    fn climb(t: f64) -> f64 {
        10e9 + (t - 10.0).max(0.0).floor() * 1e9
    }

    /// The sampler's utilization reaches the analysis: the same climb on
    /// an idle GPU is setup (at most medium), on a busy one an alarm.
    #[test]
    fn the_gpus_utilization_tells_a_load_from_a_leak() {
        let idle = run_curve(|t| (climb(t), if t < 10.0 { 90 } else { 2 }, None), 60).1;
        assert!(idle <= RiskLevel::Medium);
        let busy = run_curve(|t| (climb(t), 70, None), 60).1;
        assert!(busy >= RiskLevel::High);
    }

    /// The sampler's PCIe throughput reaches the analysis: the same climb
    /// at 13 % (a load too fast for the utilization rule) is setup when
    /// the host's bytes arrive at its pace, an alarm when none arrive.
    #[test]
    fn the_bytes_the_gpu_receives_tell_a_fast_load_from_a_leak() {
        let load = run_curve(
            |t| (climb(t), 13, Some(if t < 10.0 { 0 } else { 1_050_000_000 })),
            60,
        )
        .1;
        assert!(load <= RiskLevel::Medium, "{load:?}");
        let leak = run_curve(|t| (climb(t), 13, Some(0)), 60).1;
        assert!(leak >= RiskLevel::High, "{leak:?}");
    }

    /// A level held above its evidence says so in the report: the climb
    /// ends (the trainer freed its memory at 62 s), the published level
    /// stays for the hold, with `riskHeldUntil` and a view's `(held)`.
    #[test]
    fn a_held_level_is_reported_with_when_it_may_fall() {
        let (m, worst) = run_curve(|t| (if t < 62.0 { climb(t) } else { 10e9 }, 70, None), 70);
        assert!(worst >= RiskLevel::High);
        let r = m.report(&Identity::default(), String::new(), 1000, vec![]);
        let g = &r.gpus[0];
        assert!(g.risk >= RiskLevel::High, "{g:?}");
        let until = g.risk_held_until.as_deref().expect("held");
        let until: jiff::Timestamp = until.parse().unwrap();
        let first_lower = 62.0;
        let hold = Thresholds::default().level_hold_seconds;
        let until = until.as_millisecond() as f64 / 1000.0;
        assert!(
            until > 70.0 && until >= first_lower + hold && until <= first_lower + hold + 10.0,
            "{until}"
        );
        assert!(g.risk_text().ends_with("(held)"));
    }

    /// No GPU visible to the sampler: what an `agentOnly` pod runs.
    struct NoGpus;
    impl Sampler for NoGpus {
        fn source(&self) -> DataSource {
            DataSource::Nvml
        }
        fn gpus(&self) -> &[crate::sampler::GpuInfo] {
            &[]
        }
        fn sample(&mut self, _t: f64) -> Result<Vec<crate::sampler::GpuReading>, sampler::Error> {
            Ok(vec![])
        }
    }

    #[test]
    fn an_agent_only_pod_gets_risk_tto_peak_and_timeline_from_the_agent() {
        let mut m = Monitor::new(Box::new(NoGpus), Thresholds::default());
        for i in 0..=200 {
            let t = i as f64;
            m.sample(t).unwrap();
            m.agent_push(leak_push("GPU-a", t, 100e6));
        }
        m.analyse();
        let r = m.report(&Identity::default(), String::new(), 1000, vec![]);
        assert_eq!(r.summary.source, DataSource::Agent);
        assert_eq!(r.gpus.len(), 1);
        let g = &r.gpus[0];
        assert_eq!((g.source, g.uuid.as_str()), (DataSource::Agent, "GPU-a"));
        assert!(g.risk >= RiskLevel::High && g.leak_suspected, "{g:?}");
        assert!(g.time_to_oom_seconds.is_some() && r.summary.time_to_oom.is_some());
        assert!(g.peak_bytes >= g.used_bytes && g.used_bytes > 50_000_000_000);
        assert!(g.timeline.len() > 10);
        let a = r.allocator.as_ref().unwrap();
        assert_eq!(a.growth, memprof_api::MemoryGrowth::Leak);
        assert!(a.steps_per_second.is_some());
        assert_eq!(m.worst_risk(), g.risk);
        let r = MemoryReportSpec {
            sampled_at: "2026-01-01T00:00:00Z".into(),
            ..r
        };
        assert_eq!(memprof_analysis::validate_report(&r), Ok(()));
    }

    #[test]
    fn a_mig_instance_the_agent_sees_is_named_mig_not_gpu() {
        let mut m = Monitor::new(Box::new(NoGpus), Thresholds::default());
        let mut push = leak_push("GPU-1b2c3d4e-0000-5000-8000-000000000001", 1.0, 0.0);
        push.devices[0].name = Some("NVIDIA A100-SXM4-40GB MIG 1g.5gb".into());
        m.sample(1.0).unwrap();
        m.agent_push(push.clone());
        m.analyse();
        let r = m.report(&Identity::default(), String::new(), 1000, vec![]);
        assert_eq!(r.gpus[0].uuid, "MIG-1b2c3d4e-0000-5000-8000-000000000001");
        // A whole GPU keeps its name.
        push.devices[0].name = Some("NVIDIA H100 80GB HBM3".into());
        let mut m = Monitor::new(Box::new(NoGpus), Thresholds::default());
        m.sample(1.0).unwrap();
        m.agent_push(push);
        m.analyse();
        let r = m.report(&Identity::default(), String::new(), 1000, vec![]);
        assert_eq!(r.gpus[0].uuid, "GPU-1b2c3d4e-0000-5000-8000-000000000001");
    }

    #[test]
    fn nvml_and_agent_together_keep_nvml_numbers_and_take_the_allocator_assessment() {
        let s = Scenario::parse("default: { baseGiB: 30, amplitudeGiB: 0, noiseGiB: 0 }").unwrap();
        let mut m = Monitor::new(Box::new(SimSampler::new(s, 0)), Thresholds::default());
        let uuid = m.sampler().gpus()[0].uuid.clone();
        for i in 0..=200 {
            let t = i as f64;
            m.sample(t).unwrap();
            m.agent_push(leak_push(&uuid, t, 100e6));
        }
        m.analyse();
        let r = m.report(&Identity::default(), String::new(), 1000, vec![]);
        assert_eq!(r.gpus.len(), 1, "one GPU, seen by both");
        let g = &r.gpus[0];
        // NVML (here sim) saw a flat 30 GiB; the allocator sees the leak.
        assert_eq!(g.source, DataSource::Sim);
        assert_eq!(g.assessed_from, Some(DataSource::Agent));
        assert!(g.leak_suspected && g.risk >= RiskLevel::High, "{g:?}");
        assert_eq!(g.used_bytes, 30 << 30);
        assert!(g.fragmentation.is_some());

        // The trainer stops pushing: NVML's own assessment again.
        // (30 s until the pushes are stale, then the hold of the level and flag.)
        for i in 201..=300 {
            m.sample(i as f64).unwrap();
            m.analyse();
        }
        m.analyse();
        let g = &m
            .report(&Identity::default(), String::new(), 1000, vec![])
            .gpus[0];
        assert_eq!(g.assessed_from, None);
        assert!(!g.leak_suspected && g.risk <= RiskLevel::Low, "{g:?}");
    }
}
