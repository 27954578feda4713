//! The allocator half of the analysis: what the in-process agent's numbers
//! (docs/agent.md) say that NVML's cannot.
//!
//! NVML sees a process's total, the caching allocator's cache included, so a
//! leak is a staircase and the ceiling is the whole GPU. The agent reports
//! allocated memory, its peak over each interval, reserved memory and the
//! free memory of the device, so:
//! - **pace** ([`pace`]): the interval peaks rising steadily (a leak, or a
//!   workload growing step by step); **leak** when memory between steps
//!   rises with them (a window of 8–60 s, so a fast leak is called within
//!   seconds and a slow one once it shows), or on the user's horizon when
//!   the floor keeps growing for minutes;
//! - **time to OOM** at that pace, to the allocator's real ceiling: reserved
//!   memory grows in segments, and the OOM comes when the next segment no
//!   longer fits in free memory (on the H100 recordings the peak at the OOM
//!   was within 0.1–1.6 GB of that, 1–2 GB short of free + reserved);
//! - **leak vs cache**: reserved growing while nothing leaks is cache;
//! - **fragmentation** and advice ([`advice`]), per-phase peaks, the step
//!   rate, the OOM snapshot; after an OOM the verdict from before it is kept
//!   ([`AgentState`]).
//!
//! Pure: time comes with the pushes (the agent's clock, seconds since the
//! epoch), so every rule is unit-tested on plain values.

mod advice;
pub mod carried;
pub mod fragment;
pub mod pace;
mod processes;
mod state;

pub use advice::{advice, fragmentation, Facts, FRAGMENTATION_HIGH, SPLIT_HIGH};
pub use processes::{AgentState, MAX_PROCESSES};

use super::{assess, least_squares_slope, theil_sen, Assessment, GpuSeries, Sample};
use crate::hysteresis::{FlagGate, Hold};
use crate::risk::by_trend;
use memprof_api::agent::DeviceStats;
use memprof_api::thresholds::Thresholds;
use memprof_api::{MemoryGrowth, RiskLevel};
use pace::{Point, Recent};
use std::collections::VecDeque;

/// Phases tracked per device (the first seen).
pub const MAX_PHASES: usize = 8;
/// Events and OOM blocks kept for the report.
pub const MAX_REPORT_EVENTS: usize = 8;
/// Blocks of an OOM snapshot kept for the report.
pub const MAX_REPORT_BLOCKS: usize = 8;
/// Frames per block kept for the report.
pub const MAX_REPORT_FRAMES: usize = 4;
/// "Recent", for retries and the step rate, seconds.
const RECENT_SECONDS: f64 = 60.0;
/// Points of (time, counter) history kept.
const MAX_POINTS: usize = 256;
/// Reserved memory's segment-sized rises kept (for the ceiling).
const MAX_SEGMENTS: usize = 8;
/// A segment size is current this long after reserved memory last rose, seconds.
const SEGMENT_FRESH_SECONDS: f64 = 30.0;
/// A pace is trusted fully once watched this long (or as long as the time
/// to OOM it projects, when shorter), seconds: allocated memory is smooth
/// and each push carries its interval's exact peak.
const PACE_TRUST_SECONDS: f64 = 15.0;

/// How the agent's series are bucketed and trusted: reserved and device
/// memory on a fine grid (2 s buckets, a 30 s window, 15 s of trust); the
/// floor on the user's horizon for slow leaks. Horizons, fractions and the
/// leak rate stay the user's.
#[derive(Clone, Debug)]
pub struct AgentThresholds {
    /// For reserved (cache) and device memory.
    pub fast: Thresholds,
    /// The floor and the phases on the user's horizon: slow leaks.
    pub floor_long: Thresholds,
}

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
    /// Interval peaks and allocated bytes at each push.
    recent: Recent,
    /// Device memory in use (total − free) against total: what NVML would see.
    used: GpuSeries,
    /// Reserved bytes against total.
    reserved: GpuSeries,
    /// Allocated bytes at push instants (the floor between steps), user's horizon.
    floor_long: GpuSeries,
    /// Allocated bytes per phase, sampled at pushes.
    phases: Vec<(String, GpuSeries)>,
    retries: VecDeque<(f64, u64)>,
    /// The last rises of reserved memory from one push to the next, with their time.
    segments: VecDeque<(f64, f64)>,
    /// Free + reserved at the last push that told free memory.
    limit: Option<f64>,
    leak: FlagGate,
    trend: fragment::Trend,
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
    /// Slope of allocated memory (its steady pace, else between steps), bytes per second.
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
            recent: Recent::default(),
            used: GpuSeries::new(&th.fast),
            reserved: GpuSeries::new(&th.fast),
            floor_long: GpuSeries::new(&th.floor_long),
            phases: Vec::new(),
            retries: VecDeque::new(),
            segments: VecDeque::new(),
            limit: None,
            leak: FlagGate::default(),
            trend: fragment::Trend::default(),
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
        let rose = d.reserved_bytes.saturating_sub(self.last.reserved_bytes);
        if rose > 0 && self.last.reserved_bytes > 0 {
            self.segments.push_back((t, rose as f64));
            while self.segments.len() > MAX_SEGMENTS {
                self.segments.pop_front();
            }
        }
        self.recent.push(Point {
            t,
            peak: peak as f64,
            floor: d.allocated_bytes as f64,
        });
        if let (Some(free), Some(total)) = (d.free_bytes, d.total_bytes) {
            let limit = free.saturating_add(d.reserved_bytes);
            self.limit = Some(limit as f64);
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
            self.floor_long.push(Sample {
                t,
                used: d.allocated_bytes.min(limit),
                total: limit,
            });
        }
        self.observe_phase(t, phase, d, th);
        self.trend.push(t, d);
        push_point(&mut self.retries, (t, d.alloc_retries));
        self.last = d.clone();
        let raw = self.short_leak(&th.fast);
        self.leak.update(t, raw, Hold::from_thresholds(&th.fast));
    }

    fn observe_phase(
        &mut self,
        t: f64,
        phase: Option<&str>,
        d: &DeviceStats,
        th: &AgentThresholds,
    ) {
        let Some(name) = phase else { return };
        let known = self.phases.iter().position(|(n, _)| n == name);
        let at = match known {
            Some(i) => i,
            None if self.phases.len() < MAX_PHASES => {
                self.phases
                    .push((name.to_string(), GpuSeries::new(&th.floor_long)));
                self.phases.len() - 1
            }
            None => return,
        };
        self.phases[at].1.push(Sample {
            t,
            used: d.allocated_bytes,
            total: d.total_bytes.unwrap_or(u64::MAX),
        });
    }

    /// A pace of the peaks with memory between steps rising with it.
    fn short_leak(&self, th: &Thresholds) -> bool {
        let limit = self
            .limit
            .unwrap_or(self.last.total_bytes.unwrap_or(0) as f64);
        self.recent
            .pace(th.leak_bytes_per_second, limit)
            .is_some_and(|p| !p.floor_flat)
    }

    /// The device's own memory series (total − free), for its report entry.
    pub fn used_series(&self) -> &GpuSeries {
        &self.used
    }

    /// The last numbers pushed.
    pub fn last(&self) -> &DeviceStats {
        &self.last
    }

    /// Where allocated memory runs out: reserved memory grows by segments,
    /// and the OOM comes when the next one no longer fits in free memory.
    /// The segment is the smaller of the newest rise of reserved memory and
    /// the median of the last few (a trainer's start rises by tens of GB
    /// at once); free + reserved when reserved memory has not risen for
    /// [`SEGMENT_FRESH_SECONDS`] (the next segment's size is not known).
    pub fn ceiling(&self) -> Option<f64> {
        let limit = self.limit?;
        let now = self.recent.last().map_or(f64::NEG_INFINITY, |p| p.t);
        let Some(&(at, newest)) = self.segments.back() else {
            return Some(limit);
        };
        if now - at > SEGMENT_FRESH_SECONDS {
            return Some(limit);
        }
        let mut steps: Vec<f64> = self.segments.iter().map(|s| s.1).collect();
        steps.sort_by(f64::total_cmp);
        let step = newest.min(steps[(steps.len() - 1) / 2]);
        let reserved = self.last.reserved_bytes as f64;
        let free = (limit - reserved).max(0.0);
        Some((reserved + (free / step).floor() * step).min(limit))
    }

    /// Risk and time to OOM: the peaks' level against the limit, and their
    /// pace to the ceiling, trusted as far as it was watched.
    fn risk(&self, th: &Thresholds) -> Assessment {
        let Some(last) = self.recent.last() else {
            return Assessment {
                reason: "no samples yet".into(),
                ..Default::default()
            };
        };
        let limit = self.limit.unwrap_or(last.peak.max(1.0)).max(1.0);
        let level = last.peak;
        let mut a = Assessment {
            used: level as u64,
            total: limit as u64,
            peak: self.peak_allocated,
            ..Default::default()
        };
        let pace = self.recent.pace(th.leak_bytes_per_second, limit);
        let mut confidence = 0.0;
        // A pace over memory between steps that stays put is the workload
        // growing (longer sequences, a batch schedule): it may warn, not alarm.
        let mut cap = RiskLevel::Critical;
        if let (Some(p), Some(ceiling)) = (pace, self.ceiling()) {
            let tto = ((ceiling - level) / p.slope).max(0.0);
            a.growth_bytes_per_second = p.slope;
            a.time_to_oom_seconds = Some(tto);
            confidence = (p.span / tto.clamp(1.0, PACE_TRUST_SECONDS)).min(1.0);
            if p.floor_flat {
                cap = RiskLevel::Medium;
            }
        }
        let fraction = level / limit;
        let by_level = crate::risk::by_level(fraction, th);
        let trend = by_trend(a.time_to_oom_seconds, confidence, th).min(cap);
        if trend > by_level {
            a.risk = trend;
            a.confidence = confidence;
            a.reason = format!(
                "allocated memory grows {}, OOM predicted in {}",
                memprof_api::format_rate(a.growth_bytes_per_second).trim_start_matches('+'),
                memprof_api::format_duration(a.time_to_oom_seconds.unwrap_or(f64::INFINITY))
            );
        } else {
            a.risk = by_level;
            a.confidence = if by_level > RiskLevel::Low {
                1.0
            } else {
                (self.used.observed_span() / th.trust_span_seconds).min(1.0)
            };
            a.reason = format!(
                "{:.1}% of the allocator's limit allocated",
                100.0 * fraction
            );
        }
        a
    }

    /// The cache over the run.
    pub fn fragmentation_trend(&self) -> &[memprof_api::FragmentationPoint] {
        self.trend.points()
    }

    /// Assesses this device; `sizes` is the allocation-size pattern the
    /// agent read of it, if any.
    pub fn assess(
        &self,
        ath: &AgentThresholds,
        sizes: Option<&memprof_api::AllocationSizes>,
    ) -> AllocatorAssessment {
        let th = &ath.fast;
        let mut risk = self.risk(th);
        let idle = IDLE_FRACTION * self.limit.unwrap_or(0.0);
        let long = growth_of_floor(&self.floor_long, idle, &ath.floor_long, LONG_FLOOR_R2);
        // A leak lifts every point of the step, so every phase's memory
        // rises too; longer sequences lift the forward phase, not the floor.
        let every_phase_rises = self.phases.iter().all(|(_, s)| {
            phase_slope(s, idle, &ath.floor_long)
                .is_none_or(|slope| slope > ath.floor_long.leak_bytes_per_second / 2.0)
        });
        let leak = self.leak.get() || (long.is_some_and(|f| f.leaks) && every_phase_rises);
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
        let pace = (risk.growth_bytes_per_second > 0.0).then_some(risk.growth_bytes_per_second);
        let (fragmentation, split_fraction) = fragmentation(&self.last);
        let recent_retries = recent_increase(&self.retries);
        let advice = advice(&Facts {
            growth,
            pace,
            fragmentation,
            split: split_fraction,
            recent_retries,
            device: &self.last,
            sizes,
        });
        risk.leak_suspected = leak;
        AllocatorAssessment {
            risk,
            growth,
            allocated_growth: pace.or(long.map(|f| f.slope)),
            reserved_growth,
            fragmentation,
            split_fraction,
            recent_retries,
            advice,
        }
    }
}

/// The slope of a series' lower envelope and whether it reads as a leak
/// (faster than the leak threshold, linear, watched long enough).
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

#[cfg(test)]
#[path = "allocator_tests.rs"]
mod tests;
