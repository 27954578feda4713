//! The allocator half of the analysis: what the in-process agent's numbers
//! (docs/agent.md) say that NVML's cannot.
//!
//! NVML sees a process's total, the caching allocator's cache included, so a
//! leak is a staircase and the ceiling is the whole GPU. The agent reports
//! allocated memory, its peak over each interval, reserved memory and the
//! free memory of the device, so:
//! - **time to OOM** is fitted to allocated memory against the allocator's
//!   real limit, free + reserved (the cache is reclaimable: the allocator
//!   frees it and retries before it raises an OOM);
//! - **leak vs cache**: allocated memory between steps (the lower envelope;
//!   with phase markers, every phase's) growing is a leak; reserved growing
//!   while it stays flat is cache;
//! - **fragmentation**: reserved − allocated and inactive split blocks, with
//!   advice when allocation retries climb;
//! - per-phase peaks, the step rate, the OOM snapshot.
//!
//! Pure: time comes with the pushes (the agent's clock, seconds since the
//! epoch), so every rule is unit-tested on plain values.

use super::{assess, least_squares_slope, theil_sen, Assessment, GpuSeries, Sample};
use memprof_api::agent::{DeviceStats, Push};
use memprof_api::thresholds::Thresholds;
use memprof_api::{
    format_bytes, truncate_utf8, AgentEvent, AllocatorStats, MemoryGrowth, OomBlock,
    OomSnapshotSummary, PhasePeak,
};
use std::collections::VecDeque;

/// Phases tracked per device (the first seen).
pub const MAX_PHASES: usize = 8;
/// Events and OOM blocks kept for the report.
pub const MAX_REPORT_EVENTS: usize = 8;
/// Blocks of an OOM snapshot kept for the report.
pub const MAX_REPORT_BLOCKS: usize = 8;
/// Frames per block kept for the report.
pub const MAX_REPORT_FRAMES: usize = 4;
/// Share of reserved memory holding no tensor at or above which climbing
/// retries are blamed on fragmentation.
pub const FRAGMENTATION_HIGH: f64 = 0.25;
/// Share of reserved memory in inactive split blocks at or above which
/// climbing retries are blamed on fragmentation.
pub const SPLIT_HIGH: f64 = 0.10;
/// "Recent", for retries and the step rate, seconds.
const RECENT_SECONDS: f64 = 60.0;
/// Points of (time, counter) history kept.
const MAX_POINTS: usize = 256;

/// How the agent's series are bucketed and trusted. Allocated memory is
/// smooth (no segment staircase) and each push carries the exact peak of its
/// interval, so the risk series is bucketed finer and trusted sooner than
/// NVML's: on a real H100, with NVML's 10 s buckets and a minute of trust,
/// a 1 GB/s leak went from 0 to the OOM in 46 s with the estimate updated
/// every 10 s and 132 % late at half its life (docs/gpu-results.md). The
/// floor (allocated memory between steps, for the leak call) is sampled at
/// push instants, so it is read on two horizons: a short one for fast leaks
/// (which must be very linear) and the user's for slow ones. Horizons,
/// fractions and the leak rate stay the user's.
#[derive(Clone, Debug)]
pub struct AgentThresholds {
    /// For allocated (risk, time to OOM) and reserved (cache) memory.
    pub fast: Thresholds,
    /// The floor on a short horizon: fast leaks, called before their OOM.
    pub floor_short: Thresholds,
    /// The floor and the phases on the user's horizon: slow leaks.
    pub floor_long: Thresholds,
}

/// r² the short horizon's floor needs: fewer points, so a straighter line.
const SHORT_FLOOR_R2: f64 = 0.9;
/// r² the long horizon's floor needs (as NVML's lower envelope).
const LONG_FLOOR_R2: f64 = 0.8;

impl AgentThresholds {
    /// The agent's bucketing from the user's thresholds.
    pub fn from(th: &Thresholds) -> Self {
        AgentThresholds {
            fast: Thresholds {
                bucket_seconds: 2.0,
                fit_window_seconds: 30.0,
                trust_span_seconds: 15.0,
                ..th.clone()
            },
            floor_short: Thresholds {
                bucket_seconds: 3.0,
                fit_window_seconds: 30.0,
                trust_span_seconds: 12.0,
                ..th.clone()
            },
            floor_long: th.clone(),
        }
    }
}

/// One device's allocator history.
#[derive(Clone, Debug)]
pub struct AgentDevice {
    /// CUDA ordinal as the trainer sees it.
    pub index: u32,
    /// `GPU-…` UUID, when the agent told it.
    pub uuid: Option<String>,
    /// Product name.
    pub name: Option<String>,
    /// Allocated bytes (each interval's peak, then the current value)
    /// against the limit, free + reserved.
    allocated: GpuSeries,
    /// Device memory in use (total − free) against total: what NVML would see.
    used: GpuSeries,
    /// Reserved bytes against total.
    reserved: GpuSeries,
    /// Allocated bytes at push instants (the floor between steps), short horizon.
    floor_short: GpuSeries,
    /// The same on the user's horizon.
    floor_long: GpuSeries,
    /// Allocated bytes per phase, sampled at pushes.
    phases: Vec<(String, GpuSeries)>,
    retries: VecDeque<(f64, u64)>,
    peak_allocated: u64,
    last: DeviceStats,
}

/// What the allocator's numbers say about one device.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AllocatorAssessment {
    /// Risk and time to OOM of allocated memory against the allocator's limit.
    pub risk: Assessment,
    /// What grows.
    pub growth: MemoryGrowth,
    /// Slope of allocated memory between steps, bytes per second.
    pub allocated_growth: Option<f64>,
    /// Growth of reserved memory, bytes per second.
    pub reserved_growth: Option<f64>,
    /// (reserved − allocated) / reserved.
    pub fragmentation: Option<f64>,
    /// inactive split / reserved.
    pub split_fraction: Option<f64>,
    /// Allocation retries within the last minute.
    pub recent_retries: Option<u64>,
    /// What to do, when something is to be done.
    pub advice: Option<String>,
}

impl AgentDevice {
    fn new(index: u32, th: &AgentThresholds) -> Self {
        AgentDevice {
            index,
            uuid: None,
            name: None,
            allocated: GpuSeries::new(&th.fast),
            used: GpuSeries::new(&th.fast),
            reserved: GpuSeries::new(&th.fast),
            floor_short: GpuSeries::new(&th.floor_short),
            floor_long: GpuSeries::new(&th.floor_long),
            phases: Vec::new(),
            retries: VecDeque::new(),
            peak_allocated: 0,
            last: DeviceStats::default(),
        }
    }

    /// Adds one push's numbers for this device at time `t`.
    fn observe(&mut self, t: f64, phase: Option<&str>, d: &DeviceStats, th: &AgentThresholds) {
        if d.uuid.is_some() {
            self.uuid.clone_from(&d.uuid);
        }
        if d.name.is_some() {
            self.name.clone_from(&d.name);
        }
        let peak = d.peak_allocated_bytes.unwrap_or(d.allocated_bytes);
        self.peak_allocated = self.peak_allocated.max(peak);
        if let (Some(free), Some(total)) = (d.free_bytes, d.total_bytes) {
            let limit = free.saturating_add(d.reserved_bytes);
            // The interval's peak raises the bucket's maximum; the current
            // value is what the interval ended with (the lower envelope).
            for used in [peak, d.allocated_bytes] {
                self.allocated.push(Sample {
                    t,
                    used: used.min(limit),
                    total: limit,
                });
            }
            self.used.push(Sample {
                t,
                used: total - free,
                total,
            });
            self.reserved.push(Sample {
                t,
                used: d.reserved_bytes,
                total,
            });
            let at_push = Sample {
                t,
                used: d.allocated_bytes.min(limit),
                total: limit,
            };
            self.floor_short.push(at_push);
            self.floor_long.push(at_push);
        }
        if let Some(name) = phase {
            let known = self.phases.iter().position(|(n, _)| n == name);
            let at = match known {
                Some(i) => Some(i),
                None if self.phases.len() < MAX_PHASES => {
                    self.phases
                        .push((name.to_string(), GpuSeries::new(&th.floor_long)));
                    Some(self.phases.len() - 1)
                }
                None => None,
            };
            if let Some(i) = at {
                self.phases[i].1.push(Sample {
                    t,
                    used: d.allocated_bytes,
                    total: d.total_bytes.unwrap_or(u64::MAX),
                });
            }
        }
        push_point(&mut self.retries, (t, d.alloc_retries));
        self.last = d.clone();
    }

    /// The device's own memory series (total − free), for its report entry.
    pub fn used_series(&self) -> &GpuSeries {
        &self.used
    }

    /// The last numbers pushed.
    pub fn last(&self) -> &DeviceStats {
        &self.last
    }

    /// Assesses this device.
    pub fn assess(&self, ath: &AgentThresholds) -> AllocatorAssessment {
        let th = &ath.fast;
        let risk = assess(&self.allocated, th);
        let idle = IDLE_FRACTION * self.allocated.last().map_or(0, |s| s.total) as f64;
        let short = growth_of_floor(&self.floor_short, idle, &ath.floor_short, SHORT_FLOOR_R2);
        let long = growth_of_floor(&self.floor_long, idle, &ath.floor_long, LONG_FLOOR_R2);
        // A leak lifts every point of the step, so every phase's memory
        // rises too; longer sequences lift the forward phase, not the floor.
        let every_phase_rises = self.phases.iter().all(|(_, s)| {
            phase_slope(s, idle, &ath.floor_long)
                .is_none_or(|slope| slope > ath.floor_long.leak_bytes_per_second / 2.0)
        });
        let leak =
            (short.is_some_and(|f| f.leaks) || long.is_some_and(|f| f.leaks)) && every_phase_rises;
        let floor = long
            .filter(|l| l.leaks || !short.is_some_and(|s| s.leaks))
            .or(short);
        let reserved = assess(&self.reserved, th);
        let reserved_growth =
            (self.reserved.observed_span() > 0.0).then_some(reserved.growth_bytes_per_second);
        let growth = if leak {
            MemoryGrowth::Leak
        } else if reserved_growth.is_some_and(|g| g > th.leak_bytes_per_second) {
            MemoryGrowth::Cache
        } else {
            MemoryGrowth::None
        };
        let (fragmentation, split_fraction) = fragmentation(&self.last);
        let recent_retries = recent_increase(&self.retries);
        let advice = advice(fragmentation, split_fraction, recent_retries, &self.last);
        let mut risk = risk;
        risk.leak_suspected = leak;
        AllocatorAssessment {
            risk,
            growth,
            allocated_growth: floor.map(|f| f.slope),
            reserved_growth,
            fragmentation,
            split_fraction,
            recent_retries,
            advice,
        }
    }
}

/// The slope of a series' lower envelope and whether it reads as a leak
/// (the same rule as NVML's lower envelope: faster than the leak threshold,
/// linear, watched long enough).
#[derive(Clone, Copy, Debug, PartialEq)]
struct FloorGrowth {
    slope: f64,
    leaks: bool,
}

/// At or below this fraction of the limit, allocated memory is a trainer
/// not yet started (or restarted): as in [`assess`], not a trend.
const IDLE_FRACTION: f64 = 0.02;

/// The lower envelope after the last idle bucket (a trainer starting is
/// not a trend, as in [`assess`]).
fn active_lower(series: &GpuSeries, idle_below: f64, th: &Thresholds) -> Vec<(f64, f64)> {
    let (_, mut lower) = series.envelopes(th.fit_window_seconds);
    let active_from = series
        .buckets()
        .rev()
        .find(|b| b.min as f64 <= idle_below)
        .map_or(f64::NEG_INFINITY, |b| b.start + series.bucket_seconds());
    lower.retain(|p| p.0 > active_from);
    lower
}

fn growth_of_floor(
    series: &GpuSeries,
    idle_below: f64,
    th: &Thresholds,
    min_r2: f64,
) -> Option<FloorGrowth> {
    let fit = theil_sen(&active_lower(series, idle_below, th))?;
    Some(FloorGrowth {
        slope: fit.slope,
        leaks: fit.slope > th.leak_bytes_per_second
            && fit.r2 >= min_r2
            && fit.span >= th.trust_span_seconds.min(th.fit_window_seconds / 2.0),
    })
}

/// Least-squares slope of a phase's lower envelope (it responds to a rise
/// that began late in the window, where a median of slopes would not).
fn phase_slope(series: &GpuSeries, idle_below: f64, th: &Thresholds) -> Option<f64> {
    let lower = active_lower(series, idle_below, th);
    if lower.len() < 3 {
        return None;
    }
    least_squares_slope(&lower)
}

fn push_point(points: &mut VecDeque<(f64, u64)>, p: (f64, u64)) {
    // A counter that went down is a new process: its history starts again.
    if points.back().is_some_and(|last| p.1 < last.1) {
        points.clear();
    }
    points.push_back(p);
    while points.len() > MAX_POINTS {
        points.pop_front();
    }
}

/// How much a counter rose within the last minute (since the newest point
/// at least a minute old, or the first point).
fn recent_increase(points: &VecDeque<(f64, u64)>) -> Option<u64> {
    let last = points.back()?;
    let base = points
        .iter()
        .rev()
        .find(|p| last.0 - p.0 >= RECENT_SECONDS)
        .or(points.front())?;
    Some(last.1.saturating_sub(base.1))
}

/// Change of a counter per second within the last minute.
fn recent_rate(points: &VecDeque<(f64, u64)>) -> Option<f64> {
    let last = points.back()?;
    let first = points.iter().find(|p| last.0 - p.0 <= RECENT_SECONDS)?;
    let dt = last.0 - first.0;
    (dt > 0.0).then(|| last.1.saturating_sub(first.1) as f64 / dt)
}

/// (reserved − allocated) / reserved and inactive split / reserved.
pub fn fragmentation(d: &DeviceStats) -> (Option<f64>, Option<f64>) {
    if d.reserved_bytes == 0 {
        return (None, None);
    }
    let reserved = d.reserved_bytes as f64;
    let free = d.reserved_bytes.saturating_sub(d.allocated_bytes) as f64 / reserved;
    let split = d
        .inactive_split_bytes
        .map(|s| (s as f64 / reserved).clamp(0.0, 1.0));
    (Some(free.clamp(0.0, 1.0)), split)
}

/// Advice when retries climb: fragmentation's cure when reserved memory is
/// fragmented, otherwise a word on pressure. Nothing while retries are flat:
/// cached memory that is never missed costs nothing.
pub fn advice(
    fragmentation: Option<f64>,
    split: Option<f64>,
    recent_retries: Option<u64>,
    d: &DeviceStats,
) -> Option<String> {
    let retries = recent_retries.filter(|r| *r > 0)?;
    let fragmented = fragmentation.is_some_and(|f| f >= FRAGMENTATION_HIGH)
        || split.is_some_and(|s| s >= SPLIT_HIGH);
    let idle = d.reserved_bytes.saturating_sub(d.allocated_bytes);
    Some(if fragmented {
        format!(
            "fragmentation: {} of reserved memory holds no tensor ({} in inactive split blocks) \
             and the allocator retried {retries} allocation(s) in the last minute: set \
             PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (PyTorch >= 2.1), or \
             max_split_size_mb:N (N a little above the largest common allocation, in MiB) \
             so large cached blocks are not split",
            format_bytes(idle),
            format_bytes(d.inactive_split_bytes.unwrap_or(0)),
        )
    } else {
        format!(
            "memory pressure: the allocator freed its cache and retried {retries} \
             allocation(s) in the last minute (each one synchronizes the GPU); \
             allocated memory is close to the limit"
        )
    })
}

/// The agent's view of the whole trainer process: its devices and the
/// process-wide markers (steps, events, the newest OOM).
#[derive(Clone, Debug)]
pub struct AgentState {
    thresholds: AgentThresholds,
    devices: Vec<AgentDevice>,
    steps: VecDeque<(f64, u64)>,
    events: VecDeque<AgentEvent>,
    oom: Option<OomSnapshotSummary>,
    step: Option<u64>,
    phase: Option<String>,
    rss: Option<u64>,
    last_push: Option<f64>,
}

impl AgentState {
    /// No pushes yet.
    pub fn new(th: &Thresholds) -> Self {
        AgentState {
            thresholds: AgentThresholds::from(th),
            devices: Vec::new(),
            steps: VecDeque::new(),
            events: VecDeque::new(),
            oom: None,
            step: None,
            phase: None,
            rss: None,
            last_push: None,
        }
    }

    /// Takes one (validated) push.
    pub fn observe(&mut self, p: &Push) {
        self.last_push = Some(p.time);
        self.step = p.step;
        self.phase.clone_from(&p.phase);
        self.rss = p.rss_bytes.or(self.rss);
        if let Some(step) = p.step {
            push_point(&mut self.steps, (p.time, step));
        }
        for d in &p.devices {
            let at = match self.devices.iter().position(|x| x.index == d.index) {
                Some(i) => i,
                None if self.devices.len() < memprof_api::agent::MAX_DEVICES => {
                    self.devices
                        .push(AgentDevice::new(d.index, &self.thresholds));
                    self.devices.len() - 1
                }
                None => continue,
            };
            self.devices[at].observe(p.time, p.phase.as_deref(), d, &self.thresholds);
        }
        for e in &p.events {
            self.events.push_back(AgentEvent {
                time: rfc3339(e.t),
                name: e.name.clone(),
                note: e.note.clone(),
                step: e.step,
                allocated_bytes: e.allocated_bytes,
            });
            while self.events.len() > MAX_REPORT_EVENTS {
                self.events.pop_front();
            }
        }
        if let Some(oom) = &p.oom {
            self.oom = Some(oom_summary(p.time, oom));
        }
    }

    /// Time of the newest push (the agent's clock), if any.
    pub fn last_push(&self) -> Option<f64> {
        self.last_push
    }

    /// The devices seen, in the order first seen.
    pub fn devices(&self) -> &[AgentDevice] {
        &self.devices
    }

    /// Assesses every device, in the order of [`AgentState::devices`].
    pub fn assess(&self) -> Vec<AllocatorAssessment> {
        self.devices
            .iter()
            .map(|d| d.assess(&self.thresholds))
            .collect()
    }

    /// Training steps per second within the last minute.
    pub fn steps_per_second(&self) -> Option<f64> {
        recent_rate(&self.steps)
    }

    /// The report's allocator section: the device with the most allocated
    /// memory, with its assessment.
    pub fn stats(&self, assessments: &[AllocatorAssessment]) -> Option<AllocatorStats> {
        let (dev, a) = self
            .devices
            .iter()
            .zip(assessments)
            .max_by_key(|(d, _)| d.last.allocated_bytes)?;
        let d = &dev.last;
        let limit = d.free_bytes.map(|f| f.saturating_add(d.reserved_bytes));
        let mut phase_peaks: Vec<PhasePeak> = dev
            .phases
            .iter()
            .map(|(name, s)| PhasePeak {
                phase: name.clone(),
                allocated_bytes: s.peak(),
            })
            .collect();
        phase_peaks.sort_by_key(|p| std::cmp::Reverse(p.allocated_bytes));
        Some(AllocatorStats {
            allocated_bytes: d.allocated_bytes,
            reserved_bytes: d.reserved_bytes,
            active_bytes: d.active_bytes,
            inactive_split_bytes: d.inactive_split_bytes,
            alloc_retries: d.alloc_retries,
            num_ooms: self
                .devices
                .iter()
                .map(|x| x.last.num_ooms)
                .max()
                .unwrap_or(0),
            step: self.step,
            phase: self.phase.clone(),
            device: Some(dev.index),
            peak_allocated_bytes: Some(dev.peak_allocated),
            limit_bytes: limit,
            growth: a.growth,
            allocated_growth_bytes_per_second: a.allocated_growth.filter(|g| g.is_finite()),
            reserved_growth_bytes_per_second: a.reserved_growth.filter(|g| g.is_finite()),
            fragmentation: a.fragmentation,
            inactive_split_fraction: a.split_fraction,
            recent_alloc_retries: a.recent_retries,
            advice: a.advice.clone(),
            steps_per_second: self.steps_per_second().filter(|s| s.is_finite()),
            phase_peaks,
            rss_bytes: self.rss,
            events: self.events.iter().cloned().collect(),
            oom: self.oom.clone(),
            verdict_before_oom: None,
        })
    }
}

fn rfc3339(t: f64) -> String {
    jiff::Timestamp::from_millisecond((t * 1000.0) as i64)
        .map(|ts| ts.to_string())
        .unwrap_or_default()
}

/// The report's bounded view of an OOM snapshot.
fn oom_summary(t: f64, o: &memprof_api::agent::OomSnapshot) -> OomSnapshotSummary {
    let mut message = o.message.clone();
    truncate_utf8(&mut message, 512);
    let source = match o.source {
        memprof_api::agent::SnapshotSource::History => "history",
        memprof_api::agent::SnapshotSource::Segments => "segments",
        memprof_api::agent::SnapshotSource::None => "none",
    };
    OomSnapshotSummary {
        time: rfc3339(t),
        device: o.device,
        requested_bytes: o.requested_bytes,
        message,
        source: source.into(),
        blocks: o
            .blocks
            .iter()
            .take(MAX_REPORT_BLOCKS)
            .map(|b| OomBlock {
                size_bytes: b.size_bytes,
                count: b.count,
                frames: b
                    .frames
                    .iter()
                    .take(MAX_REPORT_FRAMES)
                    .map(|f| {
                        let mut s = format!("{}:{} {}", f.filename, f.line, f.name);
                        truncate_utf8(&mut s, 256);
                        s
                    })
                    .collect(),
            })
            .collect(),
    }
}

#[cfg(test)]
#[path = "allocator_tests.rs"]
mod tests;
