//! The analysis half of a sidecar in one object: each GPU's NVML history,
//! the in-process agent's pushes, the rule that combines them, and the
//! hysteresis of the published level and leak flag. The sidecar's monitor
//! and the replay of recordings (`crate::evaluate`, `memprof analyze
//! --evaluate`) drive the same [`Tracker`], so what is measured on a
//! recording is what a pod would have reported.
//!
//! Combination (docs/analysis.md, "One verdict per GPU"): a GPU both see
//! keeps NVML's numbers; while the agent's pushes are fresh
//! ([`AGENT_FRESH_SECONDS`]) its verdict is the earliest credible OOM of the
//! allocator's (which forecasts its own limit, falling as neighbours grow)
//! and NVML's, NVML's counting when device memory outside the trainer's
//! allocator grows at least half as fast as NVML sees it grow (a
//! **neighbour**): the trainer's own cache is the allocator's to judge. A
//! GPU only the agent sees is assessed from the agent alone. Matching is by
//! UUID when the sampler knows the GPU's, else by index.
//!
//! Every verdict passes [`crate::verdict::check`] as published: its level
//! is never below what its time to OOM, confidence and usage call for, and
//! above it only while the hysteresis holds. A GPU that reached its ceiling
//! while growing keeps its leak flag and says OOM now (time to OOM 0).
//!
//! Pure: time comes with each call.

use crate::allocator::{AgentState, AllocatorAssessment};
use crate::hysteresis::{FlagGate, Hold, LevelGate};
use crate::verdict::{self, Cause, NamedCause};
use crate::{assess, theil_sen, Assessment, GpuSeries, Sample};
use memprof_api::agent::Push;
use memprof_api::thresholds::Thresholds;
use memprof_api::RiskLevel;
use std::collections::VecDeque;

/// The agent's assessment replaces NVML's for a GPU while its newest push
/// is at most this old (sample time, seconds): a trainer that stopped
/// pushing leaves the GPU to NVML again.
pub const AGENT_FRESH_SECONDS: f64 = 30.0;
/// Processes followed per GPU (NVML's per-process usage).
pub const MAX_PROCESSES_PER_GPU: usize = 16;
/// A process's usage is kept this long, seconds.
const PROCESS_SECONDS: f64 = 120.0;

/// What is published for one GPU after an analysis.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuVerdict {
    /// GPU index (the sampler's; for a GPU only the agent sees, its CUDA ordinal).
    pub index: u32,
    /// The sampler knows no such GPU: only the agent sees it.
    pub agent_only: bool,
    /// Risk, growth, time to OOM, leak flag and cause as published: `risk`
    /// and `leak_suspected` after the hysteresis.
    pub assessment: Assessment,
    /// The risk before the hysteresis.
    pub raw_risk: RiskLevel,
    /// The leak flag before the hysteresis.
    pub raw_leak: bool,
    /// Whether the assessment is the allocator's (the agent's).
    pub from_agent: bool,
    /// The published level is above what its own evidence calls for: the
    /// hysteresis holds a level reached within `levelHoldSeconds`.
    pub held: bool,
    /// While `held`: when the level falls if the evidence stays lower
    /// (seconds, the samples' clock).
    pub held_until: Option<f64>,
    /// The agent's device for this GPU, in the order of
    /// [`AgentState::devices`] and [`Tracker::agent_assessments`].
    pub agent_device: Option<usize>,
}

/// One process on a GPU, as NVML's per-process usage shows it.
#[derive(Clone, Debug, PartialEq)]
struct Process {
    pid: u32,
    /// (time, bytes), the last [`PROCESS_SECONDS`].
    usage: VecDeque<(f64, f64)>,
}

#[derive(Clone, Debug)]
struct Gpu {
    index: u32,
    uuid: Option<String>,
    level: LevelGate,
    leak: FlagGate,
    /// Until when the GPU counts as growing toward its ceiling.
    growing_until: f64,
    /// Since when the GPU has sat at its ceiling after growing.
    full_since: Option<f64>,
    /// The soonest OOM a credible forecast promised while the GPU was
    /// nearly full (at or above `highFraction`).
    doom: Option<f64>,
    /// The GPU fell back from its ceiling while its trainer ran on: the
    /// allocator freed its cache and retried (as PyTorch does before an
    /// OOM), so the card's memory no longer times the next failure.
    recycles: bool,
    /// The newest cause of growth published.
    growth_cause: Option<NamedCause>,
    /// The newest credible forecast: (time, time to OOM, confidence).
    credible: Option<(f64, f64, f64)>,
    processes: Vec<Process>,
}

impl Gpu {
    fn new(index: u32) -> Self {
        Gpu {
            index,
            uuid: None,
            level: LevelGate::default(),
            leak: FlagGate::default(),
            growing_until: f64::NEG_INFINITY,
            full_since: None,
            doom: None,
            recycles: false,
            growth_cause: None,
            credible: None,
            processes: Vec::new(),
        }
    }
}

/// Every GPU of a pod, and its trainer's agent, as the sidecar analyses them.
#[derive(Clone, Debug)]
pub struct Tracker {
    thresholds: Thresholds,
    hold: Hold,
    /// NVML's history of each GPU of `gpus`, in the same order.
    series: Vec<GpuSeries>,
    gpus: Vec<Gpu>,
    /// NVML's own assessment of each GPU of `gpus` at the last analysis.
    nvml: Vec<Assessment>,
    agent_only: Vec<Gpu>,
    agent: AgentState,
    agent_received: Option<f64>,
    last_t: f64,
    verdicts: Vec<GpuVerdict>,
    agent_assessments: Vec<AllocatorAssessment>,
    /// The trainer's processes known without the agent ([`Tracker::own_processes`]).
    own: Vec<u32>,
}

impl Tracker {
    /// No GPU and no push yet.
    pub fn new(th: &Thresholds) -> Self {
        Tracker {
            thresholds: th.clone(),
            hold: Hold::from_thresholds(th),
            series: Vec::new(),
            gpus: Vec::new(),
            nvml: Vec::new(),
            agent_only: Vec::new(),
            agent: AgentState::new(th),
            agent_received: None,
            last_t: f64::NEG_INFINITY,
            verdicts: Vec::new(),
            agent_assessments: Vec::new(),
            own: Vec::new(),
        }
    }

    /// The trainer's processes as the host knows them without the agent
    /// (`memprof profile`: the command it started and that command's
    /// children), in NVML's pid namespace. With them, growth NVML sees in
    /// another process is blamed on that process (cause `neighbour`, no
    /// leak flag) instead of on the trainer.
    pub fn own_processes(&mut self, pids: Vec<u32>) {
        self.own = pids;
    }

    /// The thresholds in force.
    pub fn thresholds(&self) -> &Thresholds {
        &self.thresholds
    }

    fn gpu_at(&mut self, index: u32) -> Option<usize> {
        match self.gpus.iter().position(|g| g.index == index) {
            Some(i) => Some(i),
            None if self.gpus.len() < memprof_api::MAX_GPUS_PER_REPORT => {
                self.gpus.push(Gpu::new(index));
                self.series.push(GpuSeries::new(&self.thresholds));
                self.nvml.push(Assessment::default());
                Some(self.gpus.len() - 1)
            }
            None => None,
        }
    }

    /// Registers GPU `index` of the sampler before its first sample (so the
    /// series are in the sampler's order from the start).
    pub fn add_gpu(&mut self, index: u32, uuid: Option<&str>) {
        if let (Some(at), Some(u)) = (self.gpu_at(index), uuid) {
            self.gpus[at].uuid = Some(u.to_string());
        }
    }

    /// One NVML (or simulated) sample of GPU `index` at time `t`.
    pub fn sample(&mut self, t: f64, index: u32, uuid: Option<&str>, used: u64, total: u64) {
        let Some(at) = self.gpu_at(index) else {
            return;
        };
        if let Some(u) = uuid {
            self.gpus[at].uuid = Some(u.to_string());
        }
        self.series[at].push(Sample { t, used, total });
        self.last_t = self.last_t.max(t);
    }

    /// NVML's utilization of GPU `index` at `t`, percent: memory that rises
    /// while the GPU computes next to nothing is setup, not a pace
    /// ([`crate::busy`]).
    pub fn utilization(&mut self, t: f64, index: u32, percent: u32) {
        if let Some(at) = self.gpu_at(index) {
            self.series[at].push_utilization(t, percent);
        }
    }

    /// NVML's PCIe receive throughput of GPU `index` at `t`, bytes per
    /// second: memory that rises as fast as the host's bytes arrive, while
    /// the GPU computes little, is a load ([`crate::busy`]).
    pub fn pcie_received(&mut self, t: f64, index: u32, bytes_per_second: u64) {
        if let Some(at) = self.gpu_at(index) {
            self.series[at].push_received(t, bytes_per_second);
        }
    }

    /// NVML's per-process usage of GPU `index` at `t`: (pid, bytes) of each
    /// compute process. Names the process that grows when the verdict is a
    /// neighbour's (or any growth NVML sees).
    pub fn processes(&mut self, t: f64, index: u32, list: &[(u32, u64)]) {
        let Some(at) = self.gpu_at(index) else {
            return;
        };
        let procs = &mut self.gpus[at].processes;
        procs.retain(|p| list.iter().any(|(pid, _)| *pid == p.pid));
        for &(pid, bytes) in list {
            let i = match procs.iter().position(|p| p.pid == pid) {
                Some(i) => i,
                None if procs.len() < MAX_PROCESSES_PER_GPU => {
                    procs.push(Process {
                        pid,
                        usage: VecDeque::new(),
                    });
                    procs.len() - 1
                }
                None => continue,
            };
            let u = &mut procs[i].usage;
            u.push_back((t, bytes as f64));
            while u.front().is_some_and(|p| t - p.0 > PROCESS_SECONDS) {
                u.pop_front();
            }
        }
    }

    /// One (validated) push of the agent, received after the latest sample.
    pub fn push(&mut self, p: &Push) {
        self.agent.observe(p);
        self.agent_received = Some(self.last_t);
    }

    /// What the agent pushed so far.
    pub fn agent(&self) -> &AgentState {
        &self.agent
    }

    /// The allocator's assessments of the last analysis, in the order of
    /// [`AgentState::devices`].
    pub fn agent_assessments(&self) -> &[AllocatorAssessment] {
        &self.agent_assessments
    }

    /// NVML's history of GPU `index`.
    pub fn series(&self, index: u32) -> Option<&GpuSeries> {
        let at = self.gpus.iter().position(|g| g.index == index)?;
        Some(&self.series[at])
    }

    /// NVML's history of every sampled GPU, in the order first sampled.
    pub fn all_series(&self) -> &[GpuSeries] {
        &self.series
    }

    /// NVML's own assessment of every sampled GPU at the last analysis (before
    /// the agent and the hysteresis), in the order of [`Tracker::all_series`].
    pub fn nvml_assessments(&self) -> &[Assessment] {
        &self.nvml
    }

    fn agent_fresh(&self) -> bool {
        self.agent_received
            .is_some_and(|at| self.last_t - at <= AGENT_FRESH_SECONDS)
    }

    /// The trainer's pids: the agent's and those known without it.
    fn trainer_pids(&self) -> Vec<u32> {
        let mut pids = self.agent.pids();
        for p in &self.own {
            if !pids.contains(p) {
                pids.push(*p);
            }
        }
        pids
    }

    /// Re-assesses every GPU at time `t` (the sidecar: once per second).
    pub fn analyse(&mut self, t: f64) -> &[GpuVerdict] {
        self.agent_assessments = self.agent.assess();
        let fresh = self.agent_fresh();
        let devices = self.agent.devices();
        let pids = self.trainer_pids();
        let th = &self.thresholds;
        let mut matched = vec![false; devices.len()];
        let mut out = Vec::with_capacity(self.gpus.len());
        for (i, g) in self.gpus.iter_mut().enumerate() {
            let nvml = assess(&self.series[i], th);
            self.nvml[i] = nvml.clone();
            let found = devices.iter().position(|d| match &g.uuid {
                Some(u) => d.uuid.as_deref() == Some(u.as_str()),
                None => d.index == g.index,
            });
            if let Some(i) = found {
                matched[i] = true;
            }
            let agent = found
                .map(|i| &self.agent_assessments[i])
                .filter(|a| fresh && a.risk.risk > RiskLevel::None);
            let (mut a, from_agent) = match agent {
                Some(aa) => fuse(aa, nvml, th),
                None => (nvml, false),
            };
            let full = ceiling_level(agent.filter(|_| from_agent), &a);
            // The allocator sees growth inside its cache that NVML's
            // per-process usage cannot: only NVML's own verdict is re-blamed.
            if !from_agent {
                blame_neighbour(g, &mut a, &pids, th);
            }
            let mut v = publish(g, a, full, t, th, self.hold, &pids);
            v.from_agent = from_agent;
            v.agent_device = found;
            out.push(v);
        }
        for (i, d) in devices.iter().enumerate() {
            if matched[i] {
                continue;
            }
            let at = match self.agent_only.iter().position(|g| g.index == d.index) {
                Some(at) => at,
                None => {
                    self.agent_only.push(Gpu::new(d.index));
                    self.agent_only.len() - 1
                }
            };
            let a = self.agent_assessments[i].risk.clone();
            let full = a.level_fraction;
            let mut v = publish(&mut self.agent_only[at], a, full, t, th, self.hold, &pids);
            v.agent_only = true;
            v.from_agent = true;
            v.agent_device = Some(i);
            out.push(v);
        }
        out.truncate(memprof_api::MAX_GPUS_PER_REPORT);
        self.verdicts = out;
        &self.verdicts
    }

    /// The verdicts of the last analysis.
    pub fn verdicts(&self) -> &[GpuVerdict] {
        &self.verdicts
    }
}

/// The level "at the ceiling" is judged on ([`publish`]): the allocator's
/// own where its verdict stands (`own`), else the verdict's.
fn ceiling_level(own: Option<&AllocatorAssessment>, a: &Assessment) -> f64 {
    own.map_or(a.level_fraction, |aa| aa.risk.level_fraction)
}

/// The agent-fed verdict of a GPU NVML sees too: the allocator's, or
/// NVML's where NVML sees an earlier credible OOM from memory outside the
/// trainer's allocator (a neighbour). Returns the verdict and whether it is
/// the allocator's.
fn fuse(aa: &AllocatorAssessment, nvml: Assessment, th: &Thresholds) -> (Assessment, bool) {
    let a = &aa.risk;
    let nvml_earlier = nvml.risk > a.risk
        || (nvml.risk == a.risk
            && nvml.risk >= RiskLevel::Medium
            && nvml
                .time_to_oom_seconds
                .is_some_and(|n| a.time_to_oom_seconds.is_none_or(|x| n < x)));
    let outside = aa.outside_growth.unwrap_or(0.0);
    let growth = nvml.growth_bytes_per_second;
    let neighbour = growth > 0.0 && outside > th.leak_bytes_per_second && outside >= growth / 2.0;
    if nvml_earlier && own_leak_sooner(aa, &nvml) {
        return (own_leak_by_nvml(aa, nvml), false);
    }
    if !(nvml_earlier && neighbour && nvml.time_to_oom_seconds.is_some()) {
        let a = corroborated(a.clone(), &nvml, th);
        return (at_least_the_device(a, &nvml, th), true);
    }
    let mut n = nvml;
    n.leak_suspected = a.leak_suspected;
    n.cause = Some(NamedCause::new(
        Cause::Neighbour,
        format!(
            "device memory grows {} outside the trainer's allocator, whose own pace is {}",
            memprof_api::format_rate(outside).trim_start_matches('+'),
            // The tensors' own pace, not the verdict's (which may be a
            // fragmenting cache's or this very neighbour's).
            memprof_api::format_rate(aa.allocated_growth.unwrap_or(0.0).max(0.0))
                .trim_start_matches('+'),
        ),
    ));
    (n, false)
}

/// Whether NVML reads as a leak, with a time to OOM, what the allocator
/// shows is the trainer's own: its allocated memory rising at least half
/// NVML's pace while training steps run. Why: a trainer that waits between
/// steps catches its largest step in some pushes only, so its peaks
/// scatter and the allocator's pace comes late (busy-c's idleleak2: the
/// agent-fed verdict went high 64 s before the OOM, NVML alone 72 s),
/// while NVML's staircase keeps time. Steps running rule out setup (a load
/// runs none), and the allocated rise rules out a cache the allocator
/// reuses.
fn own_leak_sooner(aa: &AllocatorAssessment, nvml: &Assessment) -> bool {
    let growth = nvml.growth_bytes_per_second;
    nvml.leak_suspected
        && nvml.time_to_oom_seconds.is_some()
        && aa.stepping
        && growth > 0.0
        && aa.allocated_growth.is_some_and(|g| g >= growth / 2.0)
}

/// NVML's verdict on the trainer's own leak, named from both sources.
fn own_leak_by_nvml(aa: &AllocatorAssessment, nvml: Assessment) -> Assessment {
    let mut n = nvml;
    n.cause = Some(NamedCause::new(
        Cause::Leak,
        format!(
            "device memory rises {} in regular steps while the trainer's tensors rise {}",
            memprof_api::format_rate(n.growth_bytes_per_second).trim_start_matches('+'),
            memprof_api::format_rate(aa.allocated_growth.unwrap_or(0.0)).trim_start_matches('+'),
        ),
    ));
    n
}

/// How far apart two forecasts of one OOM may be and still agree: a
/// quarter, as a credible forecast confirms a later one ([`confirm`]).
const AGREE: f64 = 1.25;

/// A fragmented cache's OOM, as certain as NVML's where both foresee the
/// same time. Where the allocator says its reserve grows and holds no
/// tensor a new request can use (fragmentation), the device's memory is
/// that reserve, so NVML's trend is the OOM's own clock, measured apart
/// from the allocator's: the agent-fed verdict does not wait for the
/// allocator's trust to build where NVML alone would already alarm. Not
/// for a leak or a growing demand: there NVML reads the same allocations
/// through a cache the allocator may reuse (or through setup, which NVML
/// cannot tell from growth), so its agreement adds nothing the allocator
/// does not already weigh.
fn corroborated(mut a: Assessment, nvml: &Assessment, th: &Thresholds) -> Assessment {
    let fragmented = a
        .cause
        .as_ref()
        .is_some_and(|c| c.cause == Cause::Fragmentation);
    let (Some(x), Some(n)) = (a.time_to_oom_seconds, nvml.time_to_oom_seconds) else {
        return a;
    };
    let agree = x.max(n) <= AGREE * x.min(n);
    if fragmented && agree && nvml.confidence >= th.min_confidence && nvml.confidence > a.confidence
    {
        a.confidence = nvml.confidence;
        a.reason = format!(
            "{}; the device's memory foresees the same OOM ({})",
            a.reason,
            memprof_api::format_duration(n)
        );
    }
    a
}

/// The allocator's verdict, judged on no less memory than the device has
/// in use: device memory (what NVML measures) is a measurement, not a
/// forecast the allocator's numbers could explain away, so the agent-fed
/// level is never below the level NVML's usage alone calls for. Where the
/// device is fuller than the allocator's limit shows, its usage becomes
/// the verdict's (and the reason says so); NVML's trends stay NVML's.
fn at_least_the_device(mut a: Assessment, nvml: &Assessment, th: &Thresholds) -> Assessment {
    let device = verdict::by_level(nvml.level_fraction, th);
    if nvml.level_fraction <= a.level_fraction || device <= a.risk {
        return a;
    }
    a.level_fraction = nvml.level_fraction;
    a.used = nvml.used;
    a.total = nvml.total;
    a.risk = device;
    if a.time_to_oom_seconds.is_none() {
        a.confidence = 1.0;
    }
    a.reason = format!(
        "{:.1}% of GPU memory in use (the allocator's limit shows less)",
        100.0 * nvml.level_fraction
    );
    a
}

/// The fastest-growing process on a GPU that is not the trainer's: (pid,
/// bytes now, bytes per second).
fn growing_process(g: &Gpu, trainer: &[u32], th: &Thresholds) -> Option<(u32, f64, f64)> {
    g.processes
        .iter()
        .filter(|p| !trainer.contains(&p.pid))
        .filter_map(|p| {
            // Its growth now: a slope through its whole history would count
            // its first allocation (a neighbour that took 100 GB at once,
            // then grew 0.4 GB/s, read +2.4 GiB/s on an H200).
            let slope = recent_growth(p, th.bucket_seconds).or_else(|| usage_slope(p))?;
            let now = p.usage.back()?.1;
            (slope > th.leak_bytes_per_second).then_some((p.pid, now, slope))
        })
        .max_by(|a, b| a.2.total_cmp(&b.2))
}

/// A forecast less certain than the newest credible one, but at least as
/// soon as that one aged (within a quarter), confirms it: it keeps that
/// one's confidence instead of starting trust from nothing (a regular run
/// of rises that restarts, or a staircase read as a bare envelope trend for
/// a while, sent a steady simulated leak high -> medium -> high). Only
/// within the fit window of the credible forecast, and while it has not
/// aged past its OOM.
fn confirm(g: &mut Gpu, a: &mut Assessment, t: f64, th: &Thresholds) {
    let Some(tto) = a.time_to_oom_seconds else {
        return;
    };
    if a.confidence >= th.min_confidence {
        g.credible = Some((t, tto, a.confidence));
        return;
    }
    let Some((t0, tto0, c0)) = g.credible else {
        return;
    };
    let aged = tto0 - (t - t0);
    if aged <= 0.0 || t - t0 > th.fit_window_seconds {
        g.credible = None;
        return;
    }
    if tto <= 1.25 * aged {
        a.confidence = a.confidence.max(c0);
    }
}

/// The raw assessment through the GPU's gates, as published: at the
/// ceiling after growing, OOM now and the leak flag kept; the level held
/// by the hysteresis, never below its evidence; the verdict checked.
/// `full` is the fraction "at the ceiling" is judged on: the allocator's
/// own level where its verdict stands, since the device's counts a cache
/// that the allocator's retry frees before any allocation fails (a growing
/// demand's cache fills the card a minute before its tensors do).
#[allow(clippy::too_many_arguments)]
fn publish(
    g: &mut Gpu,
    mut a: Assessment,
    full: f64,
    t: f64,
    th: &Thresholds,
    hold: Hold,
    trainer: &[u32],
) -> GpuVerdict {
    note_growth(g, &a, t, hold);
    g.recycles |= fell_back(g, &a, th);
    if !at_ceiling(g, &a, full, t, th) {
        g.full_since = None;
    } else if t - *g.full_since.get_or_insert(t) <= full_trust_seconds(th) {
        oom_now(g, &mut a, t, hold);
    } else {
        full_and_running(g, &mut a, t);
    }
    if outlived(g, &a, full, t, th) {
        full_and_running(g, &mut a, t);
    }
    confirm(g, &mut a, t, th);
    // The level is what the evidence says, whoever computed it.
    let due = verdict::evidence_level(&a, th);
    a.risk = a.risk.max(due);
    name_growing_process(g, &mut a, trainer, th);
    let raw_risk = a.risk;
    let raw_leak = a.leak_suspected;
    a.risk = g.level.update(t, raw_risk, hold);
    a.leak_suspected = g.leak.update(t, raw_leak, hold);
    let held = a.risk > due;
    let held_until = g.level.falls_at(hold).filter(|_| a.risk > raw_risk);
    debug_assert!(
        verdict::check(&a, th, held).is_ok(),
        "{:?}",
        verdict::check(&a, th, held)
    );
    GpuVerdict {
        index: g.index,
        agent_only: false,
        assessment: a,
        raw_risk,
        raw_leak,
        from_agent: false,
        held,
        held_until,
        agent_device: None,
    }
}

/// The causes of growth toward the ceiling (a forecast of one): a
/// fragmenting cache's too, so that the card it fills keeps its name.
fn growth_cause(a: &Assessment) -> Option<&NamedCause> {
    a.cause.as_ref().filter(|c| {
        matches!(
            c.cause,
            Cause::Leak | Cause::GrowingDemand | Cause::Neighbour | Cause::Fragmentation
        ) && a.time_to_oom_seconds.is_some()
    })
}

/// Remembers a forecast growth and its cause for the hold: a GPU that then
/// sits at its ceiling got there by growing.
fn note_growth(g: &mut Gpu, a: &Assessment, t: f64, hold: Hold) {
    if let Some(c) = growth_cause(a) {
        g.growth_cause = Some(c.clone());
        g.growing_until = t + hold.seconds;
    }
}

/// Full (`full` of the ceiling taken), having grown within the hold (or
/// while its leak flag is up).
fn at_ceiling(g: &Gpu, a: &Assessment, full: f64, t: f64, th: &Thresholds) -> bool {
    a.risk > RiskLevel::None
        && full >= th.critical_fraction
        && (t <= g.growing_until || g.leak.get())
}

/// Full after growing: the next allocation fails. Not a stale forecast of
/// a pace that can no longer go on: OOM now, the leak flag and the cause
/// of the growth kept.
fn oom_now(g: &mut Gpu, a: &mut Assessment, t: f64, hold: Hold) {
    g.growing_until = t + hold.seconds;
    a.time_to_oom_seconds = Some(0.0);
    a.confidence = 1.0;
    a.leak_suspected |= g.leak.get();
    if let Some(c) = &g.growth_cause {
        a.cause = Some(c.clone());
    }
    a.reason = format!(
        "{:.1}% of memory in use after growing: at its ceiling, OOM now",
        100.0 * a.level_fraction
    );
}

/// How long "OOM now" stands at the ceiling: two buckets, time for the
/// growth that filled it to ask for the next block. A trainer still
/// running after that is not failing its allocations.
fn full_trust_seconds(th: &Thresholds) -> f64 {
    2.0 * th.bucket_seconds
}

/// The newest sample left the ceiling the GPU sat at, but the card did not
/// empty: the trainer that filled it is still there, holding most of it,
/// so the allocation that "fails now" did not (an OOM ends the process and
/// empties the card, below half of `mediumFraction`). The sample, not the
/// level: the level is the upper envelope, which keeps a bucket's top.
fn fell_back(g: &Gpu, a: &Assessment, th: &Thresholds) -> bool {
    let now = a.used as f64 / a.total.max(1) as f64;
    g.full_since.is_some() && (th.medium_fraction / 2.0..th.critical_fraction).contains(&now)
}

/// A nearly full GPU (at or above `highFraction`) that outlived the
/// soonest OOM its credible forecasts promised by [`full_trust_seconds`]:
/// those forecasts were refuted (a cache that fills the card reads as
/// demand that never fails), so none is promised on a nearly full GPU
/// until it empties (below half of `mediumFraction`: a new run), since
/// device memory that dips a little each step is the same cache. "Nearly
/// full" is `full`, as in [`publish`]: where the allocator's verdict
/// stands, its own level, since its numbers still time the OOM in a card
/// full of cache.
fn outlived(g: &mut Gpu, a: &Assessment, full: f64, t: f64, th: &Thresholds) -> bool {
    if a.level_fraction < th.medium_fraction / 2.0 {
        g.doom = None;
        g.recycles = false;
    }
    let due = a
        .time_to_oom_seconds
        .filter(|_| a.confidence >= th.min_confidence)
        .map(|tto| t + tto);
    if let Some(due) = due {
        g.doom = Some(g.doom.map_or(due, |d| d.min(due)));
    }
    full >= th.high_fraction
        && (g.recycles || g.doom.is_some_and(|d| t - d > full_trust_seconds(th)))
}

/// Full for longer than [`full_trust_seconds`] and still running: a
/// caching allocator holds the card and recycles its own cache, so device
/// memory no longer shows the demand and cannot time the OOM (the agent's
/// allocator numbers can). No time to OOM is promised; the level (the
/// memory in use) stands, with the cause of the growth and the leak flag.
fn full_and_running(g: &Gpu, a: &mut Assessment, t: f64) {
    a.time_to_oom_seconds = None;
    a.confidence = 1.0;
    a.leak_suspected |= g.leak.get();
    if let Some(c) = &g.growth_cause {
        a.cause = Some(c.clone());
    }
    a.reason = format!(
        "{:.1}% of memory in use and still running {:.0} s after the OOM first predicted: \
         the cache holds the card, so its memory no longer shows when the next allocation fails",
        100.0 * a.level_fraction,
        t - g.doom.or(g.full_since).unwrap_or(t)
    );
}

/// Growth whose cause could be another process's: the evidence names the
/// fastest-growing process that is not the trainer's, with its memory.
fn name_growing_process(g: &Gpu, a: &mut Assessment, trainer: &[u32], th: &Thresholds) {
    let Some(c) = a.cause.as_mut() else {
        return;
    };
    if !matches!(
        c.cause,
        Cause::Neighbour | Cause::GrowingDemand | Cause::Leak
    ) {
        return;
    }
    if let Some((pid, bytes, rate)) = growing_process(g, trainer, th) {
        let named = format!(
            "; pid {pid} holds {}, {}",
            memprof_api::format_bytes(bytes as u64),
            memprof_api::format_rate(rate)
        );
        *c = NamedCause::new(c.cause, format!("{}{named}", c.evidence));
    }
}

/// Growth NVML sees in another process is that process's, not the
/// trainer's: where the trainer's own processes are on this GPU in NVML's
/// list (so its pids and NVML's are one namespace), a leak is flagged only
/// while they grow at least half of the device's pace, and where another
/// process grows at least half of it while they do not, a growth named a
/// leak or a growing demand is that neighbour's. Without the trainer's pids on the list (an
/// agent in a container reports its own namespace's pid) nothing changes:
/// a pid NVML shows could be the trainer's own.
fn blame_neighbour(g: &Gpu, a: &mut Assessment, trainer: &[u32], th: &Thresholds) {
    let own: Option<Vec<f64>> = g
        .processes
        .iter()
        .filter(|p| trainer.contains(&p.pid))
        .map(|p| recent_growth(p, th.bucket_seconds))
        .collect();
    let Some(own) = own.filter(|o| !o.is_empty()) else {
        return;
    };
    let own_rate: f64 = own.iter().map(|s| s.max(0.0)).sum();
    if own_rate <= th.leak_bytes_per_second || own_rate < a.growth_bytes_per_second / 2.0 {
        a.leak_suspected = false;
    }
    let Some(c) = a.cause.as_ref() else {
        return;
    };
    let Some((_, _, rate)) = growing_process(g, trainer, th) else {
        return;
    };
    let named = matches!(c.cause, Cause::Leak | Cause::GrowingDemand);
    if named && rate >= a.growth_bytes_per_second / 2.0 && own_rate < rate / 2.0 {
        a.cause = Some(NamedCause::new(Cause::Neighbour, c.evidence.clone()));
        a.leak_suspected = false;
    }
}

/// A process's growth now, bytes per second: the highest usage of the
/// newest `bucket` seconds over that of the bucket before (envelopes, as
/// everywhere: a trainer that empties its cache dips between them). Not
/// over all its history: a trainer whose start climb is still in view has
/// not grown since a neighbour began to. `None` before two buckets.
fn recent_growth(p: &Process, bucket: f64) -> Option<f64> {
    let now = p.usage.back()?.0;
    if p.usage.front()?.0 > now - 2.0 * bucket {
        return None;
    }
    let top = |from: f64, to: f64| {
        p.usage
            .iter()
            .filter(|u| u.0 > from && u.0 <= to)
            .map(|u| u.1)
            .fold(f64::NEG_INFINITY, f64::max)
    };
    let (newest, before) = (
        top(now - bucket, now),
        top(now - 2.0 * bucket, now - bucket),
    );
    (newest.is_finite() && before.is_finite()).then(|| (newest - before) / bucket)
}

/// A process's pace over its recent usage, bytes per second.
fn usage_slope(p: &Process) -> Option<f64> {
    let pts: Vec<(f64, f64)> = p.usage.iter().copied().collect();
    theil_sen(&pts).map(|f| f.slope)
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_api::agent::{DeviceStats, VERSION};

    const G: u64 = 1 << 30;

    fn push(t: f64, allocated: u64) -> Push {
        Push {
            version: VERSION,
            time: t,
            devices: vec![DeviceStats {
                index: 0,
                uuid: Some("GPU-a".into()),
                allocated_bytes: allocated,
                reserved_bytes: allocated + G,
                peak_allocated_bytes: Some(allocated),
                free_bytes: Some(78 * G - allocated),
                total_bytes: Some(80 * G),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn the_agent_assesses_a_gpu_it_shares_with_nvml_while_it_pushes() {
        let th = Thresholds::default();
        let mut tr = Tracker::new(&th);
        for s in 0..40 {
            let t = s as f64;
            tr.sample(t, 0, Some("GPU-a"), 40 * G, 80 * G);
            tr.push(&push(t, 10 * G));
            let v = &tr.analyse(t)[0];
            assert!(v.from_agent && !v.agent_only);
        }
        // The pushes stop: after 30 s the GPU is NVML's again.
        for s in 40..80 {
            tr.sample(s as f64, 0, Some("GPU-a"), 40 * G, 80 * G);
            tr.analyse(s as f64);
        }
        assert!(!tr.verdicts()[0].from_agent);
        // A GPU the agent sees and NVML does not is reported from the agent alone.
        let mut tr = Tracker::new(&th);
        tr.sample(0.0, 0, Some("GPU-b"), 40 * G, 80 * G);
        tr.push(&push(0.0, 10 * G));
        let v = tr.analyse(0.0);
        assert_eq!(v.len(), 2);
        assert!(v[1].agent_only && v[1].from_agent);
    }

    /// Another process grows 400 MB/s until the card is
    /// full while the trainer's allocator is flat. The agent-fed verdict
    /// judged the allocator alone (2 s of warning, against NVML's 81 s); now
    /// it never sees less than the NVML-only one, names the cause a
    /// neighbour and the growing process by pid, and every published
    /// verdict passes the invariant.
    #[test]
    fn a_neighbour_is_seen_with_the_agent_as_without_and_named() {
        let th = Thresholds::default();
        let mut with = Tracker::new(&th);
        let mut without = Tracker::new(&th);
        let trainer = 42 * G;
        let mut first_high = None;
        for s in 0..=100 {
            let t = s as f64;
            let others = (0.4e9 * t) as u64;
            let used = (trainer + G / 2 + others).min(80 * G);
            for tr in [&mut with, &mut without] {
                tr.sample(t, 0, Some("GPU-a"), used, 80 * G);
                tr.processes(t, 0, &[(100, trainer + G / 2), (200, others)]);
            }
            let mut p = push(t, 30 * G);
            p.pid = 100;
            p.devices[0].reserved_bytes = trainer;
            p.devices[0].peak_allocated_bytes = Some(40 * G);
            p.devices[0].free_bytes = Some((80 * G).saturating_sub(used));
            with.push(&p);
            let a = with.analyse(t)[0].clone();
            let b = without.analyse(t)[0].clone();
            for v in [&a, &b] {
                verdict::check(&v.assessment, &th, v.held).unwrap();
            }
            assert!(
                a.assessment.risk >= b.assessment.risk,
                "t={t}: {:?} with the agent, {:?} without",
                a.assessment,
                b.assessment
            );
            if a.assessment.risk >= RiskLevel::High && first_high.is_none() {
                first_high = Some(s);
                let c = a.assessment.cause.clone().unwrap();
                assert_eq!(c.cause, Cause::Neighbour, "{c:?}");
                // The neighbour's pid and its memory now (0.4 GB/s x ~40 s).
                assert!(c.evidence.contains("pid 200 holds "), "{c:?}");
                assert!(c.evidence.contains("GiB"), "{c:?}");
                // The trainer's tensors are flat: its own pace is theirs,
                // not the neighbour's that made the verdict.
                assert!(c.evidence.contains("whose own pace is 0B/s"), "{c:?}");
            }
        }
        // Full at t = (80 GiB - 42.5 GiB) / 0.4 GB/s = 100 s.
        let first = first_high.expect("high before the GPU is full");
        assert!(100 - first >= 30, "first high at {first} s");
    }

    /// A fragmenting cache, both sources fed: reserved memory climbs 1 GiB/s
    /// (what NVML sees) while `kept` of each new GiB stays allocated. Returns
    /// the second the agent-fed verdict first published the leak flag, and
    /// the cause it named at its first high.
    fn fragmenting(kept: f64) -> (Option<u64>, Option<Cause>) {
        let th = Thresholds::default();
        let (total, mut tr) = (80 * G, Tracker::new(&th));
        let (mut flag, mut named) = (None, None);
        for s in 0..=70u64 {
            let t = s as f64;
            let reserved = 6 * G + s.saturating_sub(10) * G;
            let allocated = 3 * G + (kept * (reserved - 6 * G) as f64) as u64;
            let used = reserved + G / 2;
            tr.sample(t, 0, Some("GPU-a"), used, total);
            let mut p = push(t, allocated);
            p.step = Some(2 * s);
            let d = &mut p.devices[0];
            d.reserved_bytes = reserved;
            d.peak_allocated_bytes = Some(allocated + G);
            d.inactive_split_bytes = Some((reserved - allocated - G) * 9 / 10);
            d.free_bytes = Some(total - used);
            tr.push(&p);
            let v = tr.analyse(t)[0].clone();
            verdict::check(&v.assessment, &th, v.held).unwrap();
            assert!(v.from_agent, "t={t}: {v:?}");
            if v.assessment.leak_suspected && flag.is_none() {
                flag = Some(s);
            }
            if v.assessment.risk >= RiskLevel::High && named.is_none() {
                named = v.assessment.cause.map(|c| c.cause);
            }
        }
        (flag, named)
    }

    /// The leak flag is the allocator's tensors, not its cache: a cache
    /// that fragments (reserved memory climbing 1 GiB/s, 95 % of it holding
    /// no tensor, the device filling as NVML sees it) raises no leak flag
    /// over flat tensors, and is named fragmentation. Where the tensors
    /// that pin its segments are kept and grow with them (4 % of each
    /// segment, as the recorded fragmenter keeps 2.1 MB of every 50.4 MB:
    /// 41 MiB/s here, 250 times the leak rate) the flag is up, a true leak
    /// of allocated memory, and the cause stays fragmentation.
    #[test]
    fn fragmentation_raises_the_leak_flag_only_with_kept_tensors() {
        let (flag, named) = fragmenting(0.0);
        assert_eq!(flag, None);
        assert_eq!(named, Some(Cause::Fragmentation));
        let (flag, named) = fragmenting(0.04);
        assert!(flag.is_some_and(|s| s <= 40), "{flag:?}");
        assert_eq!(named, Some(Cause::Fragmentation));
    }

    /// A caching allocator fills the card and keeps running (its cache
    /// recycled, its demand still below the card): from NVML alone the
    /// card reads full after growing, "OOM now". That promise stands for
    /// two buckets; a trainer alive past the OOM its credible forecasts
    /// promised gets no time to OOM (the level stays critical, the cause
    /// the growth's), until the card empties for a new run.
    #[test]
    fn a_full_gpu_that_outlived_its_predicted_oom_promises_no_time() {
        let th = Thresholds::default();
        let total = 80 * G;
        // Held at the ceiling (98 %: "OOM now", then refuted), and just
        // below it (96.5 %: the forecast's OOM passed, refuted).
        for (held, level) in [
            (total - G / 4, RiskLevel::Critical),
            (total * 965 / 1000, RiskLevel::High),
        ] {
            let mut tr = Tracker::new(&th);
            let mut last = None;
            for s in 0..=200 {
                let t = s as f64;
                // Idle, a start to 40 GiB, then 0.5 GiB/s of cache, held.
                let used = match s {
                    0..=9 => G / 2,
                    10..=19 => 40 * G,
                    _ => (40 * G + (s - 20) * G / 2).min(held),
                };
                tr.sample(t, 0, Some("GPU-a"), used, total);
                let v = tr.analyse(t)[0].clone();
                verdict::check(&v.assessment, &th, v.held).unwrap();
                last = Some(v.assessment);
            }
            let a = last.unwrap();
            assert!(a.risk >= level, "{a:?}");
            assert_eq!(a.time_to_oom_seconds, None, "{a:?}");
            assert!(a.reason.contains("still running"), "{a:?}");
        }
        // The card empties (a new run): forecasts are believed again.
        let mut g = Gpu::new(0);
        g.doom = Some(10.0);
        let idle = Assessment {
            level_fraction: 0.01,
            ..Default::default()
        };
        assert!(!outlived(&mut g, &idle, idle.level_fraction, 100.0, &th));
        assert_eq!(g.doom, None);
    }

    /// A demand that grows while its cache fills the card: PyTorch frees
    /// the cache and retries when an allocation fails, so the card's memory
    /// saws between its ceiling and 90 % while the trainer runs on (the
    /// GPU recordings' growing demand, which NVML alone called "OOM now"
    /// for 20 s at each top of the saw, 0 s where 50 s were left). The
    /// first time at the ceiling is still "OOM now" (a leak dies there);
    /// once the card fell back with the trainer still on it, no time is
    /// promised while it is nearly full, until it empties for a new run.
    #[test]
    fn a_card_that_fell_back_from_its_ceiling_promises_no_time() {
        let th = Thresholds::default();
        let total = 80 * G;
        let mut tr = Tracker::new(&th);
        let saw = |s: u64| match s {
            0..=9 => G / 2,
            10..=19 => 60 * G,
            // 1 GiB/s to the ceiling, then the saw: 4 s at the top, back to 90 %, up again.
            20..=39 => (60 * G + (s - 20) * G).min(total - G / 8),
            _ if (s - 40) % 8 < 4 => total - G / 8,
            _ => total * 9 / 10,
        };
        let mut first_top = None;
        let mut promised_after_fall = Vec::new();
        for s in 0..=120 {
            let t = s as f64;
            tr.sample(t, 0, Some("GPU-a"), saw(s), total);
            let v = tr.analyse(t)[0].clone();
            verdict::check(&v.assessment, &th, v.held).unwrap();
            let a = v.assessment;
            if s == 41 {
                first_top = Some(a.clone());
            }
            if s >= 44 && a.level_fraction >= th.high_fraction && a.time_to_oom_seconds.is_some() {
                promised_after_fall.push((s, a.time_to_oom_seconds));
            }
        }
        let first = first_top.unwrap();
        assert_eq!(first.time_to_oom_seconds, Some(0.0), "{first:?}");
        assert!(promised_after_fall.is_empty(), "{promised_after_fall:?}");
        // The card empties (a new run): forecasts are believed again.
        for s in 121..=160 {
            let t = s as f64;
            let used = if s < 130 {
                G / 2
            } else {
                60 * G + (s - 130) * G
            };
            tr.sample(t, 0, Some("GPU-a"), used, total);
            tr.analyse(t);
        }
        let a = tr.analyse(160.0)[0].assessment.clone();
        assert!(a.time_to_oom_seconds.is_some(), "{a:?}");
    }

    /// The allocator's limit shows 50 % in use while the device is 96 %
    /// full (a cache the allocator holds beyond its tensors, or memory
    /// outside it that does not grow): the agent-fed verdict is never below
    /// what the device's usage alone calls for (high at 95 %), as the
    /// NVML-only one is, and says why.
    #[test]
    fn the_agent_fed_verdict_is_never_below_the_devices_usage() {
        let th = Thresholds::default();
        let mut tr = Tracker::new(&th);
        let total = 80 * G;
        let used = total * 96 / 100;
        let mut v = None;
        for s in 0..=30 {
            let t = s as f64;
            tr.sample(t, 0, Some("GPU-a"), used, total);
            let mut p = push(t, 30 * G);
            p.devices[0].reserved_bytes = 31 * G;
            p.devices[0].free_bytes = Some(29 * G);
            tr.push(&p);
            let a = tr.analyse(t)[0].clone();
            verdict::check(&a.assessment, &th, a.held).unwrap();
            v = Some(a);
        }
        let v = v.unwrap();
        assert!(v.from_agent, "{v:?}");
        assert!(v.assessment.risk >= RiskLevel::High, "{:?}", v.assessment);
        assert!(
            v.assessment.reason.contains("GPU memory in use"),
            "{:?}",
            v.assessment
        );
    }

    /// The allocator's and NVML's forecasts of one run, 80 s and `nvml_tto`
    /// ahead: the allocator's cause `cause` at confidence 0.32, NVML's at
    /// 0.65.
    fn two_forecasts(cause: Cause, nvml_tto: f64) -> (AllocatorAssessment, Assessment) {
        let aa = AllocatorAssessment {
            risk: Assessment {
                risk: RiskLevel::Medium,
                confidence: 0.32,
                time_to_oom_seconds: Some(80.0),
                level_fraction: 0.3,
                cause: Some(NamedCause::new(cause, "reserved memory grows")),
                ..Default::default()
            },
            ..Default::default()
        };
        let nvml = Assessment {
            risk: RiskLevel::Critical,
            confidence: 0.65,
            time_to_oom_seconds: Some(nvml_tto),
            growth_bytes_per_second: 1.2e9,
            level_fraction: 0.3,
            ..Default::default()
        };
        (aa, nvml)
    }

    /// A fragmented cache that fills the card is NVML's growth and the
    /// allocator's: where both foresee the same OOM, the agent-fed verdict
    /// is as certain as NVML's (it alarmed 37 s later than NVML alone on a
    /// recorded fragmenter), names fragmentation, and keeps the allocator's
    /// time. A leak's forecast, or times a quarter apart, stay the
    /// allocator's own.
    #[test]
    fn a_fragmented_cache_foreseen_by_both_sources_is_as_certain_as_nvml() {
        let th = Thresholds::default();
        let (aa, nvml) = two_forecasts(Cause::Fragmentation, 83.0);
        let (a, from_agent) = fuse(&aa, nvml, &th);
        assert!(from_agent);
        assert_eq!(a.confidence, 0.65);
        assert_eq!(a.time_to_oom_seconds, Some(80.0));
        assert_eq!(a.cause.as_ref().unwrap().cause, Cause::Fragmentation);
        assert!(verdict::evidence_level(&a, &th) >= RiskLevel::High, "{a:?}");
        for (cause, tto) in [
            (Cause::Leak, 83.0),
            (Cause::GrowingDemand, 83.0),
            (Cause::Fragmentation, 101.0),
        ] {
            let (aa, nvml) = two_forecasts(cause, tto);
            let (a, _) = fuse(&aa, nvml, &th);
            assert_eq!(a.confidence, 0.32, "{cause:?} {tto}");
        }
    }

    /// A trainer that waits between steps and leaks: NVML's staircase
    /// calls the leak (critical, 50 s) while the allocator's scattered
    /// peaks make no pace yet (medium, 80 s). Its tensors rise at NVML's
    /// pace while steps run, so NVML's clock is the trainer's: the
    /// agent-fed verdict takes it, named a leak. Not while no step runs
    /// (a load), nor where the tensors rise much slower (a cache the
    /// allocator reuses), nor without NVML's leak flag.
    #[test]
    fn nvml_s_clock_stands_for_the_trainer_s_own_leak_while_steps_run() {
        let th = Thresholds::default();
        let (mut aa, mut nvml) = two_forecasts(Cause::Leak, 50.0);
        aa.stepping = true;
        aa.allocated_growth = Some(1.1e9);
        nvml.leak_suspected = true;
        let (a, from_agent) = fuse(&aa, nvml.clone(), &th);
        assert!(!from_agent);
        assert_eq!(
            (a.risk, a.time_to_oom_seconds),
            (RiskLevel::Critical, Some(50.0))
        );
        assert_eq!(a.cause.as_ref().unwrap().cause, Cause::Leak);
        let mut load = aa.clone();
        load.stepping = false;
        let mut cache = aa.clone();
        cache.allocated_growth = Some(0.3e9);
        let mut unflagged = nvml.clone();
        unflagged.leak_suspected = false;
        for (aa, nvml) in [(&load, &nvml), (&cache, &nvml), (&aa, &unflagged)] {
            let (a, from_agent) = fuse(aa, nvml.clone(), &th);
            assert!(from_agent, "{aa:?} {nvml:?}");
            assert_eq!(a.time_to_oom_seconds, Some(80.0));
        }
    }

    /// From NVML alone, a neighbour growing in 512 MiB segments beside a
    /// steady trainer (from 30 s on) reads as the trainer's growth. Told the trainer's
    /// pids (`memprof profile` knows the command it started), the growth
    /// is the neighbour's: cause `neighbour` naming its pid, no leak flag
    /// at any reading. Told pids NVML does not list (another pid
    /// namespace), nothing is re-named.
    #[test]
    fn nvml_alone_blames_a_neighbour_once_it_knows_the_trainers_pids() {
        let th = Thresholds::default();
        let run = |own: Vec<u32>| {
            let mut tr = Tracker::new(&th);
            tr.own_processes(own);
            let trainer = 40 * G;
            let mut at_high = None;
            let mut leak = false;
            for s in 0..=150 {
                let t = s as f64;
                // The neighbour starts 30 s after the trainer.
                let others = (s.max(30) - 30) as u64 / 2 * (G / 2);
                let used = (trainer + others).min(80 * G);
                tr.sample(t, 0, Some("GPU-a"), used, 80 * G);
                let list = [(100, trainer), (200, others)];
                tr.processes(t, 0, &list[..if s < 30 { 1 } else { 2 }]);
                let v = tr.analyse(t)[0].clone();
                leak |= v.assessment.leak_suspected;
                if v.assessment.risk >= RiskLevel::High && at_high.is_none() {
                    at_high = v.assessment.cause.clone();
                }
            }
            (at_high.expect("high before the GPU is full"), leak)
        };
        let (c, leak) = run(vec![100]);
        assert_eq!(c.cause, Cause::Neighbour, "{c:?}");
        assert!(c.evidence.contains("pid 200 holds "), "{c:?}");
        assert!(!leak);
        for own in [vec![], vec![4242]] {
            let (c, _) = run(own.clone());
            assert_ne!(c.cause, Cause::Neighbour, "{own:?}: {c:?}");
        }
    }

    /// The rate the evidence gives a growing process is its growth now: a
    /// neighbour that took 30 GiB at once and then grew 0.4 GB/s reads
    /// 0.4 GB/s, not a slope through its first allocation (which read
    /// +2.4 GiB/s for 0.4 GB/s on an H200).
    #[test]
    fn a_neighbours_rate_is_its_growth_now_not_its_first_allocation() {
        let th = Thresholds::default();
        let mut tr = Tracker::new(&th);
        for s in 0..60u64 {
            let t = s as f64;
            tr.sample(t, 0, Some("GPU-a"), 70 * G, 80 * G);
            // Its CUDA context from the start, 30 GiB at 30 s, then 0.4 GB/s.
            let others = if s < 30 {
                G / 2
            } else {
                30 * G + (0.4e9 * (t - 30.0)) as u64
            };
            tr.processes(t, 0, &[(100, 10 * G), (200, others)]);
        }
        let (pid, _, rate) = growing_process(&tr.gpus[0], &[100], &th).unwrap();
        assert_eq!(pid, 200);
        assert!((rate - 0.4e9).abs() < 0.04e9, "{rate}");
    }
}
