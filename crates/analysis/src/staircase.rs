//! What NVML can tell of growth: the rises of a GPU's used memory.
//!
//! NVML sees the caching allocator's reserved memory, which grows by whole
//! segments: a leak is a staircase of equal rises at equal intervals (4.19 GB
//! every 41 s at 100 MB/s on the H100 fixtures; 0.79 GB every 7.5 s, 1.05 GB
//! every 4 s, 4.06 GB every 3 s on the dev recordings), or, when it is fast, a
//! rise every sample. A workload that grew (a larger batch, longer
//! sequences) rises too, but in steps whose sizes follow the change
//! (7.4, 9.4, 12.6 GB for a batch growing 4 → 8 → 12 → 16), and a trainer
//! starting climbs from an idle GPU however it likes (loading weights at disk
//! speed is a steady climb too). So:
//!
//! - a **rise** is a 1 s slot whose maximum exceeds the level of the last rise
//!   by at least [`MIN_RISE_FRACTION`] of the GPU (slow growth accumulates
//!   until it makes one; memory that an `empty_cache` returned and the
//!   allocator takes back is not growth);
//! - the **start** is the climb from an idle GPU, up to the first slot that
//!   does not rise: its rises never make a leak;
//! - a **regular staircase** is the longest run of recent rises whose sizes
//!   agree (at least 3 in 4 within ±25 % of their median, none outside
//!   0.4–2.5×) and whose gaps agree (each within 0.5–2× their median, or
//!   their times keep one schedule: [`on_schedule`]), still going (the last
//!   rise no older than twice the usual gap plus a slot).
//!
//! Bounded: at most [`MAX_RISES`] rises are kept.

use crate::least_squares_slope;
use std::collections::VecDeque;

/// A rise is at least this fraction of total memory (0.25 %: 212 MB on an
/// H100): below it, NVML's readings of one process move by allocator noise.
pub const MIN_RISE_FRACTION: f64 = 0.0025;
/// Rises kept.
pub const MAX_RISES: usize = 64;
/// At or below this fraction of total memory a GPU is idle (as in `assess`).
const IDLE_FRACTION: f64 = 0.02;
/// Width of a slot, seconds (or the sampling interval, when longer).
const SLOT_SECONDS: f64 = 1.0;

/// One rise of used memory.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rise {
    /// Start of the slot that rose, seconds.
    pub t: f64,
    /// Bytes above the previous rise's level.
    pub size: f64,
    /// The level reached, bytes.
    pub level: f64,
    /// Part of the trainer's start (the climb from idle).
    pub start: bool,
}

/// A run of regular rises: what NVML can say about sustained growth.
#[derive(Clone, Debug, PartialEq)]
pub struct Staircase {
    /// The rises, oldest first (at least 2).
    pub rises: Vec<Rise>,
    /// Median rise, bytes.
    pub step: f64,
    /// Gap between rises at the run's pace (its step over the slope of
    /// its levels), seconds.
    pub gap: f64,
    /// Some of the rises belong to the trainer's start.
    pub during_start: bool,
}

impl Staircase {
    /// Growth, bytes per second: a step per gap.
    pub fn rate(&self) -> f64 {
        self.step / self.gap
    }

    /// Seconds from the first to the last rise.
    pub fn span(&self) -> f64 {
        self.rises[self.rises.len() - 1].t - self.rises[0].t
    }

    /// When the allocator runs out at this pace: the rises that still fit in
    /// the free memory (whole steps), then one more, which cannot be
    /// allocated. Exact for a segment staircase; for a climb, free / rate
    /// plus a gap.
    pub fn oom_at(&self, total: f64) -> f64 {
        let last = self.rises[self.rises.len() - 1];
        let fit = ((total - last.level).max(0.0) / self.step).floor();
        last.t + (fit + 1.0) * self.gap
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq)]
enum Phase {
    #[default]
    Idle,
    Starting,
    Running,
}

/// The rises of one GPU's used memory.
#[derive(Clone, Debug, Default)]
pub struct Rises {
    slot: Option<(i64, f64, f64)>,
    phase: Phase,
    base: f64,
    rises: VecDeque<Rise>,
    last_t: f64,
}

impl Rises {
    /// Adds a sample.
    pub fn push(&mut self, t: f64, used: u64, total: u64) {
        self.last_t = t;
        let k = (t / SLOT_SECONDS).floor() as i64;
        match &mut self.slot {
            Some((slot, max, _)) if *slot == k => *max = max.max(used as f64),
            _ => {
                if let Some((slot, max, total)) = self.slot.take() {
                    self.close(slot as f64 * SLOT_SECONDS, max, total);
                }
                self.slot = Some((k, used as f64, total as f64));
            }
        }
    }

    fn close(&mut self, t: f64, max: f64, total: f64) {
        if max <= IDLE_FRACTION * total {
            self.phase = Phase::Idle;
            self.rises.clear();
            self.base = max;
            return;
        }
        let rose = max - self.base >= MIN_RISE_FRACTION * total;
        match self.phase {
            Phase::Idle => self.phase = Phase::Starting,
            Phase::Starting if !rose => self.phase = Phase::Running,
            _ => {}
        }
        if rose {
            self.rises.push_back(Rise {
                t,
                size: max - self.base,
                level: max,
                start: self.phase == Phase::Starting,
            });
            while self.rises.len() > MAX_RISES {
                self.rises.pop_front();
            }
            self.base = max;
        }
    }

    /// The rises kept, oldest first.
    pub fn rises(&self) -> impl Iterator<Item = &Rise> {
        self.rises.iter()
    }

    /// The longest regular run of the newest rises, when it has at least
    /// `min_rises` and is still going at `now`.
    pub fn staircase(&self, now: f64, min_rises: usize) -> Option<Staircase> {
        // The start's rises (the climb from idle) are a run of their own,
        // read only while nothing rose after it; one rise after the start is
        // a step, not yet a run.
        let after: Vec<Rise> = self.rises.iter().filter(|r| !r.start).copied().collect();
        let all: Vec<Rise> = match after.len() {
            0 => self.rises.iter().copied().collect(),
            1 => return None,
            _ => after,
        };
        let n = all.len();
        let best = (0..n.saturating_sub(1))
            .map(|from| &all[from..])
            .find(|run| regular(run, MAX_PATTERN))?;
        // The gap the run's pace implies: its step over the least-squares
        // slope of the levels it reached, not the median gap. Rises land on
        // whole slots, so a rise every 1.6 s comes 2, 2, 1, 2, 1 s apart,
        // whose median (2 s) reads the pace 20 % slow (smooth-a's leak300);
        // for a staircase of equal steps at equal gaps the two agree.
        let step = step_of(best, MAX_PATTERN)
            .unwrap_or_else(|| median(best.iter().map(|r| r.size).collect()));
        let levels: Vec<(f64, f64)> = best.iter().map(|r| (r.t, r.level)).collect();
        let median_gap = median(best.windows(2).map(|w| w[1].t - w[0].t).collect());
        let gap = least_squares_slope(&levels)
            .filter(|slope| *slope > 0.0)
            .map_or(median_gap, |slope| step / slope);
        let s = Staircase {
            rises: best.to_vec(),
            step,
            gap,
            during_start: best.iter().any(|r| r.start),
        };
        let last = best[best.len() - 1].t;
        (best.len() >= min_rises && now - last <= 2.0 * gap + 2.0 * SLOT_SECONDS).then_some(s)
    }

    /// Time of the newest sample.
    pub fn last_t(&self) -> f64 {
        self.last_t
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return 0.0;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Whether a run of rises (at least 2) has agreeing sizes and gaps.
fn regular(run: &[Rise], pattern: usize) -> bool {
    if run.len() < 2 {
        return false;
    }
    step_of(run, pattern).is_some() && (gaps_agree(run) || on_schedule(run))
}

/// Rises a schedule is judged on, at least ([`on_schedule`]).
const SCHEDULE_MIN_RISES: usize = 5;

/// Each gap within 0.5–2× their median.
fn gaps_agree(run: &[Rise]) -> bool {
    let gaps: Vec<f64> = run.windows(2).map(|w| w[1].t - w[0].t).collect();
    let gap = median(gaps.clone());
    gaps.iter().all(|g| *g >= 0.5 * gap && *g <= 2.0 * gap)
}

/// Whether at least [`SCHEDULE_MIN_RISES`] rises keep to one schedule:
/// each within half a gap and a slot of the line through their times, by
/// number (fewer leave a line too free to tell jitter from a pause). Why: a pace slower
/// than a slot lands on whole slots and late or early by a step's jitter,
/// so its gaps read 3, 3, 4, 3, 1, 4 s for one every 3.1 s (a trainer
/// idle 300 ms a step, its rises due at a step's end); the short gap
/// broke the run, and NVML alone went high 34 s before the OOM. Gaps
/// that disagree while the times keep time are one pace; steps at times
/// of their own (a batch grown twice) stay off any line.
fn on_schedule(run: &[Rise]) -> bool {
    if run.len() < SCHEDULE_MIN_RISES {
        return false;
    }
    let times: Vec<(f64, f64)> = run
        .iter()
        .enumerate()
        .map(|(i, r)| (i as f64, r.t))
        .collect();
    let Some(gap) = least_squares_slope(&times).filter(|g| *g > 0.0) else {
        return false;
    };
    let n = times.len() as f64;
    let mean_i = (n - 1.0) / 2.0;
    let mean_t = times.iter().map(|p| p.1).sum::<f64>() / n;
    times
        .iter()
        .all(|&(i, t)| (t - (mean_t + (i - mean_i) * gap)).abs() <= 0.5 * gap + SLOT_SECONDS)
}

/// The longest repeating pattern of per-slot rises read as one pace
/// ([`group_sums`]).
const MAX_PATTERN: usize = 3;

/// The run's typical rise when its sizes agree: their median, or, for a
/// rise in every slot whose single sizes disagree, the median sum of the
/// shortest groups of consecutive rises (at most `pattern`) that agree,
/// over the group's length ([`group_sums`]).
fn step_of(run: &[Rise], pattern: usize) -> Option<f64> {
    let sizes: Vec<f64> = run.iter().map(|r| r.size).collect();
    if sizes_agree(&sizes) {
        return Some(median(sizes));
    }
    let gap = median(run.windows(2).map(|w| w[1].t - w[0].t).collect());
    if gap > 1.5 * SLOT_SECONDS {
        return None;
    }
    (2..=pattern).find_map(|k| {
        let sums = group_sums(&sizes, k);
        let agree = if k == 2 {
            sizes_agree(&sums)
        } else {
            sums_all_close(&sums)
        };
        agree.then(|| median(sums) / k as f64)
    })
}

/// At least 3 in 4 sizes within ±25 % of their median, none outside
/// 0.4–2.5× it.
fn sizes_agree(sizes: &[f64]) -> bool {
    if sizes.is_empty() {
        return false;
    }
    let step = median(sizes.to_vec());
    let close = sizes
        .iter()
        .filter(|s| (*s - step).abs() <= 0.25 * step)
        .count();
    4 * close >= 3 * sizes.len() && sizes.iter().all(|s| *s >= 0.4 * step && *s <= 2.5 * step)
}

/// Every sum within a tenth of their median: a longer pattern is read only
/// where it repeats closely, so that it never stretches a run back over
/// rises of another pace (a load's before a leak's) that a looser test
/// would let in.
fn sums_all_close(sums: &[f64]) -> bool {
    let m = median(sums.to_vec());
    !sums.is_empty() && sums.iter().all(|s| (s - m).abs() <= 0.1 * m)
}

/// The sums of consecutive groups of `k` sizes, newest group whole (the
/// oldest sizes left out when their number is not a multiple of `k`);
/// fewer than two groups: none. Why: growth that lands in whole allocator
/// segments rises by a pattern of segments per slot, not by one size: one
/// segment then two, turn about (0.52 and 1.05 GB for 800 MB/s in 524 MB
/// segments on an H200), or two, two, one (0.90, 0.90, 0.45 GB for
/// 750 MB/s: busy-d's leak750). A steady pace whose single rises disagree
/// by 2x, and whose groups over the pattern agree.
fn group_sums(sizes: &[f64], k: usize) -> Vec<f64> {
    let groups: Vec<f64> = sizes.rchunks_exact(k).map(|g| g.iter().sum()).collect();
    if groups.len() < 2 {
        return vec![];
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    const GB: f64 = 1e9;
    const TOTAL: u64 = 85_000_000_000;

    fn feed(points: &[(f64, f64)]) -> Rises {
        let mut r = Rises::default();
        let end = points.last().unwrap().0;
        let mut t = 0.0;
        while t <= end + 1.0 {
            let level = points.iter().rev().find(|p| p.0 <= t).map_or(0.0, |p| p.1);
            r.push(t, (level * GB) as u64, TOTAL);
            t += 0.5;
        }
        r
    }

    /// The dev recording leak100: a 1.2 GB context, 80 GB at once (the
    /// ballast and the first step), then a 0.79 GB segment every ~7.5 s.
    #[test]
    fn a_segment_staircase_after_the_start_is_regular_and_names_its_oom() {
        let r = feed(&[
            (0.0, 0.0),
            (1.0, 1.2),
            (7.0, 81.1),
            (13.0, 81.9),
            (21.0, 82.7),
            (28.0, 83.5),
            (36.0, 84.3),
        ]);
        let s = r.staircase(37.0, 4).expect("four regular rises");
        assert_eq!(s.rises.len(), 4);
        assert!(!s.during_start);
        assert!((s.step - 0.8 * GB).abs() < 0.05 * GB, "{s:?}");
        // 0.7 GB free, less than a step: the next rise is the OOM (real: 43.5 s).
        let oom = s.oom_at(TOTAL as f64);
        assert!((oom - 43.5).abs() < 1.5, "{oom}");
        assert!(r.staircase(60.0, 4).is_none(), "not still going");
    }

    /// The leaks-long-b recording leak800: 800 MB/s in 524 MB segments,
    /// one segment in one second and two in the next, turn about. A steady
    /// pace whose single rises disagree by 2x; its pairs agree.
    #[test]
    fn one_and_two_segments_a_slot_turn_about_are_a_regular_pace() {
        let mut points = vec![(0.0, 0.0), (2.0, 1.4), (7.0, 70.0)];
        let mut level = 70.0;
        for i in 0..20 {
            level += if i % 2 == 0 { 0.524 } else { 1.048 };
            points.push((8.0 + i as f64, level));
        }
        let r = feed(&points);
        let s = r.staircase(28.0, 4).expect("a regular pace");
        assert!(s.rises.len() >= 16, "{s:?}");
        let rate = s.rate() / GB;
        assert!((rate - 0.786).abs() < 0.05, "{rate} GB/s");
    }

    /// pcie-a's idleleak3 on an H200: a trainer idle 300 ms a step leaking
    /// 0.88 GiB every 3.06 s, whose rises land on whole slots 3, 4, 3, 1,
    /// 4 s apart (one late by a step). The times keep one schedule, so the
    /// run is one pace and the short gap does not end it.
    #[test]
    fn rises_late_by_a_step_keep_their_schedule() {
        let mut points = vec![(0.0, 0.0), (2.0, 1.4), (7.0, 70.0)];
        let times = [
            15.0, 18.0, 22.0, 25.0, 26.0, 30.0, 33.0, 36.0, 39.0, 42.0, 46.0, 49.0, 50.0,
        ];
        for (i, t) in times.iter().enumerate() {
            points.push((*t, 70.0 + 0.92 * (i + 1) as f64));
        }
        let r = feed(&points);
        let s = r.staircase(51.0, 4).expect("a regular pace");
        assert_eq!(s.rises.len(), times.len(), "{s:?}");
        let rate = s.rate() / GB;
        assert!((rate - 0.30).abs() < 0.02, "{rate} GB/s");
        // Equal rises that pause once are two runs: the newest is the pace.
        let mut paused = vec![(0.0, 0.0), (2.0, 1.4), (7.0, 70.0)];
        for (i, t) in [10.0, 13.0, 16.0, 19.0, 22.0, 40.0, 43.0]
            .iter()
            .enumerate()
        {
            paused.push((*t, 70.0 + 0.92 * (i + 1) as f64));
        }
        let s = feed(&paused).staircase(44.0, 2).expect("the newest run");
        assert_eq!(s.rises.len(), 2, "{s:?}");
    }

    /// busy-d's leak750 on an H200: 0.90, 0.90, 0.45 GB a slot, over and
    /// over (two half-segments, two, then one). Neither the single rises
    /// nor pairs agree; groups of three do. Read as one pace, its climb is
    /// trusted once it held, and NVML went high 74.5 s before the OOM
    /// instead of 9.5 s.
    #[test]
    fn two_two_one_segments_a_slot_are_a_regular_pace() {
        let mut points = vec![(0.0, 0.0), (2.0, 1.4), (7.0, 75.0)];
        let mut level = 75.0;
        for i in 0..30 {
            level += if i % 3 == 2 { 0.451 } else { 0.902 };
            points.push((8.0 + i as f64, level));
        }
        let r = feed(&points);
        let s = r.staircase(38.0, 4).expect("a regular pace");
        assert!(s.span() >= 24.0, "{s:?}");
        let rate = s.rate() / GB;
        assert!((rate - 0.752).abs() < 0.04, "{rate} GB/s");
    }

    /// A pattern of three is read only where it repeats closely: rises
    /// that merely agree as loosely as single sizes may (a faster climb
    /// before, then a steadier one) are not stretched into one run.
    #[test]
    fn a_loose_pattern_of_three_is_no_pace() {
        let sizes = [0.9, 0.9, 0.45, 1.3, 0.9, 0.45, 0.9, 0.5, 0.45];
        assert!(group_sums(&sizes, 3).len() == 3);
        assert!(!sums_all_close(&group_sums(&sizes, 3)));
        let steady = [0.9, 0.9, 0.45, 0.9, 0.9, 0.45, 0.9, 0.9, 0.45];
        assert!(sums_all_close(&group_sums(&steady, 3)));
    }

    /// smooth-a's leak300: one 0.49 GB segment every 1.63 s, which whole
    /// 1 s slots see 2, 2, 1, 2, 1 s apart. The pace is the levels' slope
    /// (0.30 GB/s), not a step per median gap (0.245 GB/s: 20 % slow).
    #[test]
    fn rises_on_whole_slots_keep_their_pace() {
        let mut points = vec![(0.0, 0.0), (2.0, 1.4), (7.0, 60.0)];
        let mut level = 60.0;
        for i in 0..20 {
            level += 0.49;
            points.push((10.0 + i as f64 * 1.63, level));
        }
        let r = feed(&points);
        let s = r.staircase(41.5, 4).expect("a regular pace");
        let rate = s.rate() / GB;
        assert!((rate - 0.30).abs() < 0.015, "{rate} GB/s");
    }

    /// The dev recording growbatch: batch 4 → 8 → 12 → 16 every 20 s.
    #[test]
    fn steps_that_follow_a_growing_batch_are_not_regular() {
        let r = feed(&[
            (0.0, 0.0),
            (1.0, 1.2),
            (8.0, 9.7),
            (21.0, 17.0),
            (41.0, 26.4),
            (61.0, 39.0),
            (81.0, 55.0),
        ]);
        assert!(r.staircase(82.0, 3).is_none(), "{:?}", r.staircase(82.0, 2));
        // The held-out schedule 2 → 3 → 4 → 6 → 8: steps a, a, 2a, 2a.
        let r = feed(&[
            (0.0, 0.0),
            (1.0, 1.2),
            (7.0, 10.0),
            (16.0, 13.0),
            (32.0, 16.0),
            (48.0, 22.0),
            (64.0, 28.0),
        ]);
        assert!(r.staircase(65.0, 4).is_none());
    }

    /// The dev recording leak2000: the leak starts as the warm-up ends, so
    /// the climb from idle never stops. Regular, but all of it the start.
    #[test]
    fn a_climb_from_idle_is_the_start() {
        let mut points = vec![(0.0, 0.0), (1.0, 1.2), (10.0, 4.9), (11.0, 18.5)];
        points.extend((12..44).map(|s| (s as f64, 18.5 + 2.1 * (s - 11) as f64)));
        let r = feed(&points);
        let s = r.staircase(44.0, 4).unwrap();
        assert!(s.during_start && s.rises.len() >= 20, "{s:?}");
        assert!((s.rate() - 2.1 * GB).abs() < 0.1 * GB);
    }

    #[test]
    fn slow_growth_accumulates_into_rises_and_idle_starts_again() {
        // 50 MB/s: a rise of >= 212 MB every ~5 s.
        let mut r = Rises::default();
        for i in 0..600 {
            let t = i as f64 * 0.1;
            let used = if t < 1.0 { 0.0 } else { 30.0 * GB + 50e6 * t };
            r.push(t, used as u64, TOTAL);
        }
        let s = r
            .staircase(60.0, 4)
            .unwrap_or_else(|| panic!("{:?}", r.rises().collect::<Vec<_>>()));
        assert!((s.rate() - 50e6).abs() < 10e6, "{}", s.rate());
        r.push(61.0, 0, TOTAL);
        r.push(62.5, 0, TOTAL);
        assert_eq!(r.rises().count(), 0);
    }
}
