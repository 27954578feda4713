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
//!   memory (the largest step plus the cache no step uses, which the
//!   allocator does not hand back to a leak) grows in segments, and the
//!   OOM comes when the next segment no longer fits in free memory (on the
//!   H100 recordings the peak at the OOM was within 0.1–1.6 GB of that,
//!   1–2 GB short of free + reserved);
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

pub use advice::{advice, fragmentation, pinned, Facts, FRAGMENTATION_HIGH, SPLIT_HIGH};
pub use processes::{AgentState, MAX_PROCESSES};

use super::{assess, least_squares_slope, theil_sen, Assessment, GpuSeries, Sample};
use crate::hysteresis::{FlagGate, Hold};
use crate::risk::{by_trend, pace_confidence};
use crate::verdict::{level_of, Cause, NamedCause};
use memprof_api::agent::DeviceStats;
use memprof_api::thresholds::Thresholds;
use memprof_api::{MemoryGrowth, RiskLevel};
use pace::{Point, Recent, MIN_RISE_FRACTION};
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
/// Memory outside the allocator is kept this long, seconds.
const OTHERS_SECONDS: f64 = 120.0;
/// A segment size is current this long after reserved memory last rose, seconds.
const SEGMENT_FRESH_SECONDS: f64 = 30.0;
/// How long training steps must have run for NVML's clock to stand for
/// the trainer's own leak, seconds (`tracker::own_leak_sooner`): longer
/// than NVML's leak flag takes to see a regular run (4 rises over 10 s),
/// so a run that reaches back over a load (no step ran) is not taken.
const STEPPING_SECONDS: f64 = 20.0;
/// Pushes a pace's time to OOM looks back over for the trainer's largest
/// step, seconds ([`pace::Recent::highest_lifted`]): a trainer whose every
/// fifth step is its largest, 0.8 s apart, takes one each 4 s.
const STEP_CYCLE_SECONDS: f64 = 10.0;
/// How far back the cache no step uses is read, and how long reserved
/// memory's pace must be watched to count ([`AgentDevice::idle_cache`]),
/// seconds: a segment or two of filling at a leak's pace.
const IDLE_SECONDS: f64 = 20.0;
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

/// Reserved memory growing this many times as fast as the tensors is a
/// cache that does not serve its own allocations (fragmentation), not a
/// cache following a leak or a growing demand.
const CACHE_OVER_TENSORS: f64 = 4.0;

/// Rises of reserved memory, after the trainer's start, that make a
/// staircase of the cache ([`AgentDevice::cache_stairs`]): one more than
/// NVML's two, as the smooth climb reads the fast ones.
const CACHE_STAIRS_MIN_RISES: usize = 3;

/// r² the growth of memory outside the allocator needs to be a neighbour's.
const NEIGHBOUR_R2: f64 = 0.8;

/// One cause's predicted OOM.
#[derive(Clone, Debug)]
struct Forecast {
    tto: f64,
    growth: f64,
    confidence: f64,
    cause: NamedCause,
}

/// How the cache climbs toward the limit ([`AgentDevice::filling_cache`]):
/// its OOM, pace and trust, and how the climb was read, for the evidence.
#[derive(Clone, Debug)]
struct Climb {
    tto: f64,
    growth: f64,
    confidence: f64,
    /// Empty for a smooth climb; the segment and its gap for a staircase.
    how: String,
}

/// The earlier credible OOM of two: the one whose level ([`by_trend`]) is
/// higher, then the sooner.
fn earlier(a: Option<Forecast>, b: Forecast, th: &Thresholds) -> Option<Forecast> {
    let Some(a) = a else { return Some(b) };
    let la = by_trend(Some(a.tto), a.confidence, th);
    let lb = by_trend(Some(b.tto), b.confidence, th);
    Some(if lb > la || (lb == la && b.tto < a.tto) {
        b
    } else {
        a
    })
}

/// The level, time to OOM, confidence, cause and reason of `a` from the
/// earliest credible forecast and the usage in `a.level_fraction`
/// ([`level_of`], as everywhere). The forecast names the cause when it
/// makes the level (or nothing else is named); `watched` is how long the
/// device has been watched (a low level's confidence grows with it).
fn conclude(a: &mut Assessment, best: Option<Forecast>, th: &Thresholds, watched: f64) {
    let confidence = best.as_ref().map_or(0.0, |f| f.confidence);
    let tto = best.as_ref().map(|f| f.tto);
    let by_level = crate::risk::by_level(a.level_fraction, th);
    let trend = by_trend(tto, confidence, th);
    a.risk = level_of(tto, confidence, a.level_fraction, th);
    a.time_to_oom_seconds = tto;
    if let Some(f) = best {
        a.growth_bytes_per_second = f.growth;
        if trend >= by_level || a.cause.is_none() {
            a.cause = Some(f.cause);
        }
    }
    if trend > by_level {
        a.confidence = confidence;
        a.reason = format!(
            "{} {}, OOM predicted in {}",
            a.cause.as_ref().map_or("", |c| c.cause.as_str()),
            a.cause.as_ref().map_or("", |c| c.evidence.as_str()),
            memprof_api::format_duration(tto.unwrap_or(f64::INFINITY))
        );
        return;
    }
    a.confidence = if tto.is_some() {
        confidence
    } else if by_level > RiskLevel::Low {
        1.0
    } else {
        (watched / th.trust_span_seconds).min(1.0)
    };
    a.reason = match &a.cause {
        Some(c) if c.cause == Cause::Fragmentation => c.evidence.clone(),
        _ => format!(
            "{:.1}% of the allocator's limit allocated",
            100.0 * a.level_fraction
        ),
    };
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
    /// The pace of `recent` at the newest push (under the fast
    /// thresholds and [`Self::limit_or_total`]): read by the leak flag at
    /// each push and by the setup check at each assessment.
    pace: Option<pace::Pace>,
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
    /// Reserved bytes at the pushes of the last [`RECENT_SECONDS`]: with the
    /// steps' peaks, the cache no step uses ([`Self::idle_cache`]).
    reserved_at: VecDeque<(f64, f64)>,
    /// Free + reserved at the last push that told free memory.
    limit: Option<f64>,
    /// Device memory outside this allocator's cache ((total − free) −
    /// reserved: the CUDA context and other processes) at the pushes of the
    /// last [`OTHERS_SECONDS`].
    others: VecDeque<(f64, f64)>,
    leak: FlagGate,
    trend: fragment::Trend,
    peak_allocated: u64,
    /// Highest inactive split bytes any push told (`None`: no push told it).
    peak_inactive_split: Option<u64>,
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
    /// Growth of device memory outside this allocator's cache (the CUDA
    /// context and other processes), bytes per second, over the last
    /// [`OTHERS_SECONDS`]; `None` until the agent told free memory twice.
    pub outside_growth: Option<f64>,
    /// Training steps ran throughout the last [`STEPPING_SECONDS`] (the
    /// pushes' step count kept moving).
    pub stepping: bool,
}

impl AgentDevice {
    fn new(index: u32, th: &AgentThresholds) -> Self {
        AgentDevice {
            index,
            uuid: None,
            name: None,
            recent: Recent::default(),
            pace: None,
            used: GpuSeries::new(&th.fast),
            reserved: GpuSeries::new(&th.fast),
            floor_long: GpuSeries::new(&th.floor_long),
            phases: Vec::new(),
            retries: VecDeque::new(),
            segments: VecDeque::new(),
            reserved_at: VecDeque::new(),
            limit: None,
            others: VecDeque::new(),
            leak: FlagGate::default(),
            trend: fragment::Trend::default(),
            peak_allocated: 0,
            peak_inactive_split: None,
            last: DeviceStats::default(),
        }
    }

    /// Adds one push's numbers for this device at time `t`.
    fn observe(
        &mut self,
        t: f64,
        (phase, step): (Option<&str>, Option<u64>),
        d: &DeviceStats,
        th: &AgentThresholds,
    ) {
        if d.uuid.is_some() {
            self.uuid.clone_from(&d.uuid);
        }
        if d.name.is_some() {
            self.name.clone_from(&d.name);
        }
        let peak = d.peak_allocated_bytes.unwrap_or(d.allocated_bytes);
        self.peak_allocated = self.peak_allocated.max(peak);
        if let Some(split) = d.peak_inactive_split_bytes {
            self.peak_inactive_split = Some(self.peak_inactive_split.unwrap_or(0).max(split));
        }
        self.note_reserved(t, d);
        self.recent.push(Point {
            t,
            peak: peak as f64,
            floor: d.allocated_bytes as f64,
            step,
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
            let outside = total.saturating_sub(free).saturating_sub(d.reserved_bytes);
            push_within(&mut self.others, (t, outside as f64), OTHERS_SECONDS);
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
        self.note_pace(t, &th.fast);
    }

    /// The pace at the newest push, and the leak flag it raises.
    fn note_pace(&mut self, t: f64, th: &Thresholds) {
        self.pace = self
            .recent
            .pace(th.leak_bytes_per_second, self.limit_or_total());
        let raw = self.short_leak();
        self.leak.update(t, raw, Hold::from_thresholds(th));
    }

    /// Reserved memory at this push, kept for [`RECENT_SECONDS`], and its
    /// rise since the previous push ([`Self::note_segment`]).
    fn note_reserved(&mut self, t: f64, d: &DeviceStats) {
        self.note_segment(t, d);
        push_within(
            &mut self.reserved_at,
            (t, d.reserved_bytes as f64),
            RECENT_SECONDS,
        );
    }

    /// Reserved memory's rise since the previous push: one more segment.
    fn note_segment(&mut self, t: f64, d: &DeviceStats) {
        let rose = d.reserved_bytes.saturating_sub(self.last.reserved_bytes);
        if rose > 0 && self.last.reserved_bytes > 0 {
            self.segments.push_back((t, rose as f64));
            while self.segments.len() > MAX_SEGMENTS {
                self.segments.pop_front();
            }
        }
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

    /// The recent pace is setup: memory rising while no training step runs.
    fn setting_up(&self) -> bool {
        self.pace.is_some_and(|p| p.setup)
    }

    /// The allocator's limit, else the device's total.
    fn limit_or_total(&self) -> f64 {
        self.limit
            .unwrap_or(self.last.total_bytes.unwrap_or(0) as f64)
    }

    /// A pace of the peaks with memory between steps rising with it.
    fn short_leak(&self) -> bool {
        self.pace.is_some_and(|p| !p.floor_flat && !p.setup)
    }

    /// The device's own memory series (total − free), for its report entry.
    pub fn used_series(&self) -> &GpuSeries {
        &self.used
    }

    /// The last numbers pushed.
    pub fn last(&self) -> &DeviceStats {
        &self.last
    }

    /// The median of reserved memory's last rises, while fresh.
    fn segment_step(&self) -> Option<f64> {
        let now = self.recent.last().map_or(f64::NEG_INFINITY, |p| p.t);
        let &(at, _) = self.segments.back()?;
        if now - at > SEGMENT_FRESH_SECONDS {
            return None;
        }
        let mut steps: Vec<f64> = self.segments.iter().map(|s| s.1).collect();
        steps.sort_by(f64::total_cmp);
        Some(steps[(steps.len() - 1) / 2])
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
        let step = self.segment_step()?.min(newest);
        let reserved = self.last.reserved_bytes as f64;
        let free = (limit - reserved).max(0.0);
        Some((reserved + (free / step).floor() * step).min(limit))
    }

    /// Where a growing demand runs out: the allocator releases the cache's
    /// idle segments before it fails, so what counts as taken is the step's
    /// peak (`peak`), and the next segments (of the size reserved memory
    /// grew by lately) must fit in the rest of the limit.
    fn released_ceiling(&self, peak: f64) -> Option<f64> {
        let limit = self.limit?;
        let Some(step) = self.segment_step() else {
            return Some(limit);
        };
        let room = (limit - peak).max(0.0);
        Some((peak + (room / step).floor() * step).min(limit))
    }

    /// Risk and time to OOM: the earliest credible OOM among the causes the
    /// allocator can see (docs/analysis.md, "One verdict per GPU"):
    /// - the peaks' pace to the ceiling: a **leak** when memory between
    ///   steps rises with them, **growing demand** when it stays put; both
    ///   alarm when the forecast is credible (an OOM is an OOM, leak or not);
    /// - device memory (total − free, what NVML sees) growing **outside**
    ///   this allocator: a **neighbour** filling the GPU, forecast to the
    ///   moment it has taken the free memory;
    /// - a cache that fills the limit while much of it holds no tensor and
    ///   its free blocks do not serve the allocations (split blocks, or
    ///   retries): **fragmentation** blocks the next allocation the cache
    ///   cannot serve, judged on reserved memory against the limit.
    ///
    /// The level is [`level_of`] the chosen forecast, its confidence and the
    /// usage it was judged on, as everywhere.
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
            level_fraction: level / limit,
            ..Default::default()
        };
        let mut best = self.pace_forecast(th, limit, level);
        if let Some(n) = self.neighbour(th) {
            best = earlier(best, n, th);
        }
        let tensors = best.as_ref().map_or(0.0, |f| f.growth);
        if let Some(f) = self.filling_cache(th, tensors) {
            best = earlier(best, f, th);
        }
        if let Some(f) = self.blocking_fragmentation(th) {
            // What new segments can use is what the cache does not hold.
            a.level_fraction = self.last.reserved_bytes as f64 / limit;
            a.cause = Some(f);
        }
        conclude(&mut a, best, th, self.used.observed_span());
        a
    }

    /// The peaks' pace to the ceiling: a leak when memory between steps
    /// rises with them, growing demand when it stays put.
    fn pace_forecast(&self, th: &Thresholds, limit: f64, level: f64) -> Option<Forecast> {
        let p = self.recent.pace(th.leak_bytes_per_second, limit)?;
        // Segments fill up to the ceiling only where they keep what they
        // hold (a leak). A demand that grows frees its activations every
        // step, so the allocator releases its idle segments and tries
        // again before it fails: the OOM comes when a step's peak no
        // longer fits the limit.
        let ceiling = if p.floor_flat && !p.setup {
            self.released_ceiling(level)?
        } else {
            self.ceiling()?
        };
        if p.setup {
            return Some(setup_forecast(p, ceiling, level, th));
        }
        let level = self
            .recent
            .highest_lifted(p.slope, STEP_CYCLE_SECONDS)
            .map_or(level, |h| h.max(level));
        // A leak's OOM comes when reserved memory reaches the ceiling:
        // the largest step plus the cache no step uses, each at its pace.
        let (idle, idle_growth) = if p.floor_flat {
            (0.0, 0.0)
        } else {
            self.idle_cache(p.slope, p.span).unwrap_or((0.0, 0.0))
        };
        let tto = ((ceiling - level - idle) / (p.slope + idle_growth)).max(0.0);
        let rate = memprof_api::format_rate(p.slope);
        let rate = rate.trim_start_matches('+');
        let cause = if p.floor_flat {
            NamedCause::new(
                Cause::GrowingDemand,
                format!(
                    "step peaks rise {rate} while memory between steps stays put \
                     (longer inputs, a growing batch)"
                ),
            )
        } else {
            NamedCause::new(
                Cause::Leak,
                format!("step peaks and memory between steps rise {rate}"),
            )
        };
        Some(Forecast {
            tto,
            growth: p.slope,
            // A leak's pace is trusted once watched for the trust span; a
            // workload's demand can stop growing at any time (a schedule
            // does), so its pace is trusted only as far ahead as it was
            // watched.
            confidence: if p.floor_flat {
                (p.span / tto.max(1.0)).min(1.0)
            } else {
                (p.span / tto.clamp(1.0, PACE_TRUST_SECONDS)).min(1.0)
            },
            cause,
        })
    }

    /// The cache no step uses, and how fast it grows: reserved memory above
    /// the trainer's largest step (lifted by `slope`, as the level a
    /// forecast starts from) at its least over the pushes of the last
    /// [`IDLE_SECONDS`] whose step cycle lies inside the pace's window
    /// (`span` seconds: a lift across the leak's start would overshoot),
    /// and reserved memory's pace beyond the steps' over that window once
    /// it spans [`IDLE_SECONDS`]; (bytes, bytes per second), neither below 0. Why: the allocator does not hand
    /// this cache back to a leak. On the H200 leaks recorded to their OOM
    /// the largest step stopped 1-2 GB short of the limit, where that cache
    /// stood all along; a trainer that empties its cache every few seconds
    /// returns the whole free segments, the leak's tensors land in the next
    /// step's segments, and the free space around them (split blocks, which
    /// neither `empty_cache` nor the step's larger allocations can use)
    /// grows with the leak: 6 GB at the OOM of a leak of 0.7 GB/s with
    /// `empty_cache` every 3 s, reserved memory growing 8 % faster than the
    /// tensors. Counting that cache as free forecast the OOM 18 % late at
    /// half its life. The least, not the newest: the newest segment's
    /// unfilled part is what a leak fills next. Reserved memory rises in
    /// segments (0.5-2 GB), so its own pace shows only over a long window.
    fn idle_cache(&self, slope: f64, span: f64) -> Option<(f64, f64)> {
        let now = self.recent.last()?.t;
        let from = now - (span - STEP_CYCLE_SECONDS).clamp(0.0, IDLE_SECONDS);
        let least = self
            .reserved_at
            .iter()
            .filter(|p| p.0 >= from)
            .filter_map(|&(t, reserved)| {
                let step = self
                    .recent
                    .highest_lifted_at(t, slope, STEP_CYCLE_SECONDS)?;
                Some(reserved - step)
            })
            .reduce(f64::min)?;
        let reserved: Vec<(f64, f64)> = self
            .reserved_at
            .iter()
            .filter(|p| p.0 >= now - span)
            .map(|&(t, r)| (t - now, r))
            .collect();
        let fit = theil_sen(&reserved);
        // A cache that outgrows its tensors is fragmentation, with a
        // forecast of its own ([`Self::filling_cache`]), not a leak's cache.
        if fit.is_some_and(|f| f.slope >= CACHE_OVER_TENSORS * slope) {
            return None;
        }
        let growth = fit
            .filter(|f| f.span >= IDLE_SECONDS)
            .map_or(0.0, |f| (f.slope - slope).max(0.0));
        Some((least.max(0.0), growth))
    }

    /// Device memory growing outside this allocator (another process on a
    /// shared GPU): memory not in this allocator's cache grows steadily
    /// (r² ≥ 0.8 over the last `fitWindowSeconds`) faster than the leak
    /// rate; the device is full when it has taken the free memory. Like a
    /// workload's demand, another process's growth can stop at any time, so
    /// it is trusted as far ahead as it was watched.
    fn neighbour(&self, th: &Thresholds) -> Option<Forecast> {
        let now = self.others.back()?.0;
        let recent: Vec<(f64, f64)> = self
            .others
            .iter()
            .filter(|p| now - p.0 <= th.fit_window_seconds)
            .copied()
            .collect();
        let fit = theil_sen(&recent)?;
        let free = (self.limit? - self.last.reserved_bytes as f64).max(0.0);
        if fit.slope <= th.leak_bytes_per_second || fit.r2 < NEIGHBOUR_R2 {
            return None;
        }
        let tto = free / fit.slope;
        let rate = memprof_api::format_rate(fit.slope);
        Some(Forecast {
            tto,
            growth: fit.slope,
            confidence: (fit.span / tto.max(1.0)).min(1.0),
            cause: NamedCause::new(
                Cause::Neighbour,
                format!(
                    "device memory outside the trainer's allocator grows {}; {} free, the allocator's limit {}",
                    rate.trim_start_matches('+'),
                    memprof_api::format_bytes(free as u64),
                    memprof_api::format_bytes(self.limit.unwrap_or(0.0) as u64)
                ),
            ),
        })
    }

    /// Fragmentation before it blocks: reserved memory climbs toward the
    /// allocator's limit at least [`CACHE_OVER_TENSORS`] times as fast as
    /// the tensors grow (`tensors`, the fastest pace seen of allocated
    /// memory), while at least [`FRAGMENTATION_HIGH`] of it holds no
    /// tensor: the allocator takes new segments instead of serving from its
    /// free blocks, and the OOM comes when the next one no longer fits. The
    /// climb is read smoothly ([`Self::cache_climb`]) or, where it comes in
    /// whole segments far apart, as a staircase ([`Self::cache_stairs`]).
    fn filling_cache(&self, th: &Thresholds, tensors: f64) -> Option<Forecast> {
        let limit = self.limit?;
        let d = &self.last;
        let (idle, split) = fragmentation(d);
        let idle = idle?;
        if idle < FRAGMENTATION_HIGH {
            return None;
        }
        let faster_than = th.leak_bytes_per_second.max(CACHE_OVER_TENSORS * tensors);
        let left = (limit - d.reserved_bytes as f64).max(0.0);
        // Staircases are read only where the idle cache is [`pinned`].
        let climb = match self.cache_climb(th, faster_than, left) {
            Some(c) => c,
            None if pinned(idle, split) => self.cache_stairs(th, faster_than, limit)?,
            None => return None,
        };
        Some(Forecast {
            tto: climb.tto,
            growth: climb.growth,
            confidence: climb.confidence,
            cause: NamedCause::new(
                Cause::Fragmentation,
                format!(
                    "reserved memory grows {}{} while {:.0}% of it holds no tensor; {} left under the allocator's limit",
                    memprof_api::format_rate(climb.growth).trim_start_matches('+'),
                    climb.how,
                    100.0 * idle,
                    memprof_api::format_bytes(left as u64)
                ),
            ),
        })
    }

    /// The cache's smooth climb: reserved memory's upper envelope over the
    /// fit window (r² ≥ 0.8, watched for the trust span, rising in both
    /// halves, in two thirds of its buckets and by no jump of a fifth of the
    /// rise, where a start or an evaluation's cache rises in a few), faster
    /// than `faster_than`. Trusted as far ahead as watched (a cache stops
    /// growing once it holds what it needs).
    fn cache_climb(&self, th: &Thresholds, faster_than: f64, left: f64) -> Option<Climb> {
        let (upper, _) = self.reserved.envelopes(th.fit_window_seconds);
        let fit = theil_sen(&upper)?;
        let rise = fit.slope * fit.span;
        if fit.slope <= faster_than
            || fit.r2 < NEIGHBOUR_R2
            || fit.span < th.trust_span_seconds
            || !pace::both_halves(&upper, rise)
            || pace::largest_jump(&upper) > pace::MAX_JUMP * rise
            || !rises_almost_always(&upper)
        {
            return None;
        }
        let tto = left / fit.slope;
        Some(Climb {
            tto,
            growth: fit.slope,
            confidence: (fit.span / tto.max(1.0)).min(1.0),
            how: String::new(),
        })
    }

    /// The cache's climb in whole segments far apart: at least
    /// [`CACHE_STAIRS_MIN_RISES`] rises of reserved memory after the
    /// trainer's start, of agreeing sizes at agreeing gaps and still going
    /// (NVML's staircase, read on reserved memory), faster than
    /// `faster_than`. Each rise is a request no cached block could serve,
    /// so a pace of them over flat tensors is a cache that does not serve
    /// the trainer; the smooth climb refuses it (a few large jumps are
    /// what an evaluation's cache makes too), and one that keeps its
    /// schedule is told from those by being still going. Timed and trusted
    /// as NVML's pace is ([`crate::staircase::Staircase::oom_at`], [`pace_confidence`]).
    fn cache_stairs(&self, th: &Thresholds, faster_than: f64, limit: f64) -> Option<Climb> {
        let now = self.reserved.rises().last_t();
        let s = self
            .reserved
            .rises()
            .staircase(now, CACHE_STAIRS_MIN_RISES)
            .filter(|s| !s.during_start && s.rate() > faster_than)?;
        let tto = (s.oom_at(limit) - now).max(0.0);
        Some(Climb {
            tto,
            growth: s.rate(),
            confidence: pace_confidence(&s, tto, th),
            how: format!(
                " ({} a segment every {:.0} s)",
                memprof_api::format_bytes(s.step as u64),
                s.gap
            ),
        })
    }

    /// The cache holds nearly all the allocator may reserve
    /// (≥ `highFraction` of its limit), at least [`FRAGMENTATION_HIGH`] of
    /// it holds no tensor, and its free blocks do not serve the allocations
    /// (≥ [`SPLIT_HIGH`] in inactive split blocks, which the allocator
    /// cannot release, or retries within the last minute): the next
    /// allocation the free blocks cannot serve needs a segment that no
    /// longer fits.
    fn blocking_fragmentation(&self, th: &Thresholds) -> Option<NamedCause> {
        let limit = self.limit?;
        let d = &self.last;
        let (idle, split) = fragmentation(d);
        let idle = idle?;
        let full = d.reserved_bytes as f64 >= th.high_fraction * limit;
        let retries = recent_increase(&self.retries).unwrap_or(0);
        // Retries count only where the idle cache is [`pinned`]: a growing
        // demand's cache, refilled after each retry, holds whole free
        // segments the next retry frees (hold-g's read 99.5 % of the limit
        // reserved while its tensors' peak stood at 90 %).
        let unserved =
            split.is_some_and(|s| s >= SPLIT_HIGH) || (retries > 0 && pinned(idle, split));
        (full && idle >= FRAGMENTATION_HIGH && unserved).then(|| {
            NamedCause::new(
                Cause::Fragmentation,
                format!(
                    "{} reserved, {} of it holding no tensor ({} in split blocks, {} retries \
                     in the last minute), {} free on the device",
                    memprof_api::format_bytes(d.reserved_bytes),
                    memprof_api::format_bytes(d.reserved_bytes.saturating_sub(d.allocated_bytes)),
                    memprof_api::format_bytes(d.inactive_split_bytes.unwrap_or(0)),
                    retries,
                    memprof_api::format_bytes((limit - d.reserved_bytes as f64).max(0.0) as u64),
                ),
            )
        })
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
        let (leak, long) = self.leaks(ath);
        let reserved = assess(&self.reserved, th);
        let reserved_growth =
            (self.reserved.observed_span() > 0.0).then_some(reserved.growth_bytes_per_second);
        let growth = growth_kind(leak, reserved_growth, th);
        // The tensors' own pace, not the verdict's growth: that is the pace
        // of the forecast that made the verdict, which for a fragmenting
        // cache is reserved memory's and for a neighbour memory outside the
        // allocator (read as the tensors', it let NVML's leak flag through
        // as the trainer's own leak: `tracker::own_leak_sooner`).
        let pace = self.pace.map(|p| p.slope).filter(|&s| s > 0.0);
        let allocated_growth = pace.or(long.map(|f| f.slope));
        let (fragmentation, split_fraction) = fragmentation(&self.last);
        let recent_retries = recent_increase(&self.retries);
        let blocking = risk
            .cause
            .as_ref()
            .is_some_and(|c| c.cause == Cause::Fragmentation);
        let advice = advice(&Facts {
            growth,
            pace,
            fragmentation,
            split: split_fraction,
            recent_retries,
            blocking,
            device: &self.last,
            sizes,
        });
        risk.leak_suspected = leak;
        if leak {
            name_leak(&mut risk, allocated_growth.unwrap_or(0.0));
        }
        AllocatorAssessment {
            outside_growth: theil_sen(&self.others.iter().copied().collect::<Vec<_>>())
                .map(|f| f.slope),
            risk,
            growth,
            allocated_growth,
            reserved_growth,
            fragmentation,
            split_fraction,
            recent_retries,
            advice,
            stepping: self.recent.stepping_throughout(STEPPING_SECONDS),
        }
    }

    /// Whether memory leaks (the short pace's flag, or the floor rising on
    /// the user's horizon with every phase), and the floor's growth there.
    fn leaks(&self, ath: &AgentThresholds) -> (bool, Option<FloorGrowth>) {
        let idle = IDLE_FRACTION * self.limit.unwrap_or(0.0);
        // Memory kept while no step ran is setup, on every horizon: the
        // floor's growth counts from the end of the newest setup, so the
        // load's rise read with the flat steps after it is no leak.
        let since = self
            .recent
            .setup_ended_at(MIN_RISE_FRACTION * self.limit_or_total())
            .unwrap_or(f64::NEG_INFINITY);
        let long = growth_of_floor(
            &self.floor_long,
            since,
            idle,
            &ath.floor_long,
            LONG_FLOOR_R2,
        );
        // A leak lifts every point of the step, so every phase's memory
        // rises too; longer sequences lift the forward phase, not the floor.
        let every_phase_rises = self.phases.iter().all(|(_, s)| {
            phase_slope(s, idle, &ath.floor_long)
                .is_none_or(|slope| slope > ath.floor_long.leak_bytes_per_second / 2.0)
        });
        // Memory kept while no step runs is setup, on every horizon.
        let leak = self.leak.get()
            || (long.is_some_and(|f| f.leaks) && every_phase_rises && !self.setting_up());
        (leak, long)
    }
}

/// Memory that rose while no training step ran (weights loading, a second
/// model, a cache being built): setup, which ends where what is loaded
/// ends. Never a leak; it may warn, never alarm: a setup that will not fit
/// fails before any training is lost, and one that fits is no OOM.
fn setup_forecast(p: pace::Pace, ceiling: f64, level: f64, th: &Thresholds) -> Forecast {
    let tto = ((ceiling - level) / p.slope).max(0.0);
    let rate = memprof_api::format_rate(p.slope);
    Forecast {
        tto,
        growth: p.slope,
        confidence: crate::risk::warn_only((p.span / tto.max(1.0)).min(1.0), th),
        cause: NamedCause::new(
            Cause::GrowingDemand,
            format!(
                "memory rises {} while no training step runs (loading, setting up)",
                rate.trim_start_matches('+')
            ),
        ),
    }
}

/// What grows: a leak, else the cache when reserved memory grows.
fn growth_kind(leak: bool, reserved_growth: Option<f64>, th: &Thresholds) -> MemoryGrowth {
    if leak {
        MemoryGrowth::Leak
    } else if reserved_growth.is_some_and(|g| g > th.leak_bytes_per_second) {
        MemoryGrowth::Cache
    } else {
        MemoryGrowth::None
    }
}

/// A leak names itself when nothing else, or only growing demand (the
/// peaks' pace before the floor showed it), was named.
fn name_leak(risk: &mut Assessment, rate: f64) {
    let named = risk.cause.as_ref().map(|c| c.cause);
    if named.is_none_or(|c| c == Cause::GrowingDemand) {
        risk.cause = Some(NamedCause::new(
            Cause::Leak,
            format!(
                "memory between steps grows {}",
                memprof_api::format_rate(rate).trim_start_matches('+')
            ),
        ));
    }
}

/// At least two thirds of an envelope's steps rise: memory taken bucket
/// after bucket, not a cache that grew in a few jumps (an evaluation's
/// larger batch, a warm-up) and then holds what it needs.
fn rises_almost_always(points: &[(f64, f64)]) -> bool {
    let steps = points.len().saturating_sub(1);
    let rising = points.windows(2).filter(|w| w[1].1 > w[0].1).count();
    steps > 0 && 3 * rising >= 2 * steps
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

/// The floor's growth from `since` on (and from the trainer's start).
fn growth_of_floor(
    series: &GpuSeries,
    since: f64,
    idle_below: f64,
    th: &Thresholds,
    min_r2: f64,
) -> Option<FloorGrowth> {
    let mut lower = active_lower(series, idle_below, th);
    lower.retain(|p| p.0 > since);
    let fit = theil_sen(&lower)?;
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

/// Appends `p` to a window of points no older than `seconds` before it
/// (and at most [`MAX_POINTS`] of them).
fn push_within(points: &mut VecDeque<(f64, f64)>, p: (f64, f64), seconds: f64) {
    points.push_back(p);
    while points.front().is_some_and(|q| p.0 - q.0 > seconds) || points.len() > MAX_POINTS {
        points.pop_front();
    }
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
mod tests;
