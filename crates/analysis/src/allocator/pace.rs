//! The pace of allocated memory, from the agent's pushes: each push carries
//! the exact peak of its interval (`peakAllocatedBytes`) and the allocated
//! bytes at the push, a random point of a step (the floor plus part of the
//! activations).
//!
//! In steady training every step peaks at the same height, so the interval
//! peaks are flat to the byte; a leak lifts every one of them by what it
//! kept (0.1 GB/s reads as +0.1 GB per push on the H100 recordings). A
//! workload that grew lifts them too, but in a step (the batch changed) or
//! while memory between steps stays put (longer sequences). So a **pace**
//! is a window ending now in which the peaks rise steadily: over 2 s
//! buckets (the lowest peak of each, so one long step or an eval pass does
//! not count), a Theil–Sen slope above the leak rate, r² ≥ 0.9, a rise of at
//! least [`MIN_RISE_FRACTION`] of the limit, both halves of the window
//! rising by at least a quarter of it each (a single step puts all of it in
//! one half) and no bucket rising by more than 40 % of it (a jump). Windows of 8 to 60 s are tried; the longest steady one
//! gives the slope (a window that reaches back over the trainer's start or a
//! step is not steady, so it is never used).
//!
//! A pace is a leak when memory between steps rises with it: the floor
//! (the lowest allocated bytes at the pushes of the last few buckets)
//! rising at least half the peaks' pace, along a line.

use crate::theil_sen;
use std::collections::VecDeque;

/// The window's rise must be at least this fraction of the limit (0.2 %:
/// 170 MB on an H100): a drift of a few MB is not a pace.
pub const MIN_RISE_FRACTION: f64 = 0.002;
/// Windows tried, seconds.
const WINDOWS: [f64; 10] = [8.0, 10.0, 12.0, 15.0, 20.0, 25.0, 30.0, 40.0, 50.0, 60.0];
/// Bucket width, seconds.
const BUCKET: f64 = 2.0;
/// r² the peaks of a window need.
const MIN_R2: f64 = 0.9;
/// No rise from one bucket to the next may be more than this share of the
/// window's rise: a steady rise has no jump (a trainer starting, a batch
/// that grew). The peaks' pace and a filling cache share it: a stricter
/// bound for the cache (it was a fifth) sat where a fragmenter's buckets
/// land (one or two segments each), so its forecast came and went every
/// other second, and the time to OOM shown with it jumped 80 s ↔ 45 min.
pub(crate) const MAX_JUMP: f64 = 0.4;
/// Points kept: two minutes at 2 pushes a second.
const MAX_POINTS: usize = 240;

/// One push's numbers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point {
    /// Push time.
    pub t: f64,
    /// The interval's peak allocated bytes.
    pub peak: f64,
    /// Allocated bytes at the push.
    pub floor: f64,
    /// The trainer's step at the push, when the agent counts steps.
    pub step: Option<u64>,
}

/// A steady rise of the peaks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pace {
    /// Bytes per second.
    pub slope: f64,
    /// Seconds the window spans.
    pub span: f64,
    /// Memory between steps stays put: not a leak.
    pub floor_flat: bool,
    /// No training step ran in the window (every push counts steps, and
    /// the count never moved): setup, not training ([`setup`]).
    pub setup: bool,
}

/// The recent pushes of one device.
#[derive(Clone, Debug, Default)]
pub struct Recent {
    points: VecDeque<Point>,
    /// The push before the first move of the step count, and the newest
    /// push whose count moved, kept past the points' two minutes: (time,
    /// step).
    moves: Option<((f64, u64), (f64, u64))>,
    /// The newest stretch of at least the shortest window whose pushes'
    /// step count stood still, once steps ran again ([`Stall`]).
    stall: Option<Stall>,
    /// Some push carried the trainer's own step count.
    counted: bool,
    /// Where no push counts steps: the pushes whose interval freed memory
    /// ([`Recent::freed_count`]).
    freed: u64,
    /// The newest push without the trainer's own step count.
    uncounted_at: Option<f64>,
}

/// Pushes between two moves of the step count: when they began and ended,
/// how far the peaks rose over them, and the trainer's usual step before
/// them.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Stall {
    from: f64,
    to: f64,
    rise: f64,
    /// Seconds per step as known when the stall began: the period read
    /// after it spreads the stall's own seconds over the steps, so a
    /// trainer that stepped a few times before a long load looked as slow
    /// as the load was long, and the load too short to be setup.
    period: Option<f64>,
}

impl Stall {
    /// The stepless stretch of pushes that ends at the newest of `points`
    /// (all carrying `step`).
    fn ending(points: &VecDeque<Point>, step: u64, period: Option<f64>) -> Option<Stall> {
        let last = points.back()?;
        let mut first = last;
        let mut top = last.peak;
        for p in points.iter().rev().take_while(|p| p.step == Some(step)) {
            first = p;
            top = top.max(p.peak);
        }
        Some(Stall {
            from: first.t,
            to: last.t,
            rise: top - first.peak,
            period,
        })
    }

    /// Setup that ended: memory rose by a pace's least rise while no step
    /// ran for at least three of the trainer's usual steps (`period`) and
    /// the shortest window, the rule [`Recent::setup_since`] reads while it
    /// lasts. `period` is the usual step now, read where none was known
    /// before the stall.
    fn was_setup(&self, period: f64, min_rise: f64) -> bool {
        let period = self.period.unwrap_or(period);
        self.to - self.from >= (3.0 * period).max(WINDOWS[0]) && self.rise >= min_rise
    }
}

impl Recent {
    /// Adds a push. Where no push counts steps, the pushes whose interval
    /// freed memory count them ([`Recent::freed_count`]).
    pub fn push(&mut self, mut p: Point) {
        if p.step.is_some() {
            self.counted = true;
        } else {
            self.uncounted_at = Some(p.t);
            if !self.counted {
                p.step = Some(self.freed_count(&p));
            }
        }
        let before = self.points.back().and_then(|b| Some((b.t, b.step?)));
        if let (Some((t0, x)), Some(y)) = (before, p.step) {
            if y > x {
                let usual = self.step_period();
                // The first move counts from the push before it: y - x
                // steps ran between the two (a warm-up of 12 steps inside
                // one push interval gives the period at once).
                let first = self.moves.map_or((t0, x), |m| m.0);
                self.moves = Some((first, (p.t, y)));
                // A usual step is no stall: the newest long one is kept.
                let stall = Stall::ending(&self.points, x, usual);
                if stall.is_some_and(|s| s.to - s.from >= WINDOWS[0]) {
                    self.stall = stall;
                }
            }
        }
        self.points.push_back(p);
        while self.points.len() > MAX_POINTS
            || self
                .points
                .front()
                .is_some_and(|f| p.t - f.t > WINDOWS[WINDOWS.len() - 1] + BUCKET)
        {
            self.points.pop_front();
        }
    }

    /// Forgets everything (a new process).
    pub fn clear(&mut self) {
        *self = Recent::default();
    }

    /// The step count of an agent that counts none: one more for each push
    /// whose interval peak stands above the allocated bytes at the push.
    /// Why: a training step frees its activations before the next begins,
    /// so an interval in which a step ended freed memory; one whose peak is
    /// what is allocated at its end freed nothing since that peak, and a run
    /// of them ran no step. Weights arriving piece by piece free nothing;
    /// a leak lifts memory while its steps still free their activations.
    /// The count then feeds the same setup rules as the trainer's own.
    fn freed_count(&mut self, p: &Point) -> u64 {
        if p.peak > p.floor {
            self.freed += 1;
        }
        self.freed
    }

    /// The newest push.
    pub fn last(&self) -> Option<&Point> {
        self.points.back()
    }

    /// Whether training steps ran throughout the last `span` seconds: the
    /// pushes cover it and the step count never stood still longer than
    /// three of the trainer's usual steps (at least 4 s). `false` where
    /// pushes carry no count, or it never moved. A load runs no step, and
    /// a forecast that reaches back over one is not the trainer's pace.
    pub fn stepping_throughout(&self, span: f64) -> bool {
        let (Some(period), Some(last)) = (self.step_period(), self.points.back()) else {
            return false;
        };
        let from = last.t - span;
        // Steps counted from freed memory say when memory was freed, not
        // that the trainer stepped throughout.
        if self.points.front().is_none_or(|f| f.t > from)
            || self.uncounted_at.is_some_and(|u| u >= from)
        {
            return false;
        }
        let still = (3.0 * period).max(4.0);
        let mut moved_at = from;
        let mut step = None;
        for p in self.points.iter().filter(|p| p.t >= from) {
            if p.step.is_none() {
                return false;
            }
            if step.is_some_and(|s| s != p.step) {
                if p.t - moved_at > still {
                    return false;
                }
                moved_at = p.t;
            }
            step = Some(p.step);
        }
        last.t - moved_at <= still
    }

    /// The highest interval peak of the last `span` seconds, each lifted
    /// to the newest push by `slope` bytes per second: the largest step
    /// the trainer takes, where it stands now. Why: a push's interval peak
    /// holds the largest step of its interval, and a trainer that waits
    /// between steps runs one step or none per push, so the newest peak is
    /// often a small step; the OOM comes when the largest one no longer
    /// fits.
    pub fn highest_lifted(&self, slope: f64, span: f64) -> Option<f64> {
        self.highest_lifted_at(self.points.back()?.t, slope, span)
    }

    /// [`Recent::highest_lifted`] as it stood at the push of time `at`:
    /// the largest step of the `span` seconds before it, lifted to it.
    pub fn highest_lifted_at(&self, at: f64, slope: f64, span: f64) -> Option<f64> {
        self.points
            .iter()
            .filter(|p| p.t >= at - span && p.t <= at)
            .map(|p| p.peak + slope * (at - p.t))
            .reduce(f64::max)
    }

    /// The longest steady window ending at the newest push, if any.
    pub fn pace(&self, leak_rate: f64, limit: f64) -> Option<Pace> {
        let now = self.points.back()?.t;
        WINDOWS
            .iter()
            .rev()
            .find_map(|w| self.window(now - w, leak_rate, MIN_RISE_FRACTION * limit))
    }

    /// Seconds per training step, from the push before the first move of
    /// the count to the newest push that moved it; `None` before a move. A
    /// process whose
    /// steps never moved (inference, evaluation alone, a count that stays
    /// 0 with no optimizer) never reads as setting up: its growth is judged
    /// as any other. Why the period: a window holds setup only if steps
    /// would have shown in it (a step longer than the window is no setup).
    fn step_period(&self) -> Option<f64> {
        let ((t0, s0), (t1, s1)) = self.moves?;
        (s1 > s0 && t1 > t0).then(|| (t1 - t0) / (s1 - s0) as f64)
    }

    /// Whether the newest half of a window of `span` seconds (at least
    /// three of the trainer's usual steps) ran no training step.
    fn setup_since(&self, span: f64) -> bool {
        let now = self.points.back().map_or(0.0, |p| p.t);
        let Some(period) = self.step_period() else {
            return false;
        };
        let tail = (span / 2.0).max(3.0 * period);
        self.points.front().is_some_and(|f| f.t <= now - tail)
            && setup(self.points.iter().filter(|p| p.t >= now - tail))
    }

    /// Whether a window from `from` reaches back into setup that has ended
    /// (weights loaded while no step ran, then training). The rise of
    /// setup is not a training pace, as the trainer's start is not: read
    /// with the flat steps after it, it made a leak of a load the moment
    /// steps ran again.
    fn reaches_into_setup(&self, from: f64, min_rise: f64) -> bool {
        match (self.stall, self.step_period()) {
            (Some(s), Some(period)) => s.to > from && s.was_setup(period, min_rise),
            _ => false,
        }
    }

    /// When the newest setup that ended (a stepless stretch in which memory
    /// rose by `min_rise`, then steps again) ended: what rose in it is
    /// setup on every horizon, so memory between steps counts from here.
    pub fn setup_ended_at(&self, min_rise: f64) -> Option<f64> {
        let (s, period) = (self.stall?, self.step_period()?);
        s.was_setup(period, min_rise).then_some(s.to)
    }

    /// Buckets of the points from `from`: (middle, lowest peak, lowest floor).
    fn buckets(&self, from: f64) -> Vec<(f64, f64, f64)> {
        let mut out: Vec<(f64, f64, f64)> = Vec::new();
        let mut key = i64::MIN;
        for p in self.points.iter().filter(|p| p.t >= from) {
            let k = ((p.t - from) / BUCKET).floor() as i64;
            match out.last_mut() {
                Some(b) if k == key => {
                    b.1 = b.1.min(p.peak);
                    b.2 = b.2.min(p.floor);
                }
                _ => {
                    key = k;
                    out.push((from + (k as f64 + 0.5) * BUCKET, p.peak, p.floor));
                }
            }
        }
        out
    }

    fn window(&self, from: f64, leak_rate: f64, min_rise: f64) -> Option<Pace> {
        // The window must be covered: its oldest push no later than a bucket in.
        if self.points.front()?.t > from + BUCKET || self.reaches_into_setup(from, min_rise) {
            return None;
        }
        let b = self.buckets(from);
        if b.len() < 4 {
            return None;
        }
        let peaks: Vec<(f64, f64)> = b.iter().map(|x| (x.0, x.1)).collect();
        let fit = theil_sen(&peaks)?;
        let rise = fit.slope * fit.span;
        if fit.slope <= leak_rate
            || fit.r2 < MIN_R2
            || rise < min_rise
            || !both_halves(&peaks, rise)
            || largest_jump(&peaks) > MAX_JUMP * rise
        {
            return None;
        }
        let floors = lowest_recent(&b);
        Some(Pace {
            slope: fit.slope,
            span: fit.span,
            floor_flat: floor_flat(&floors, fit.slope),
            setup: self.setup_since(fit.span) || self.rose_while_stalled(from, min_rise),
        })
    }

    /// Whether most of the window's rise came after the step count last
    /// moved: since the push that last moved it, over at least two more
    /// pushes and three of the trainer's usual steps, the peaks rose by a
    /// pace's least rise and by at least half the window's rise (counted
    /// from the trainer's first step). A fast load
    /// rises so much in its first seconds that the window's newest half
    /// still holds the last steps ([`Recent::setup_since`] reads it only
    /// later), and a leak flag raised then was held for half a minute. A
    /// leak keeps memory at every step, so its rise is spread over its
    /// steps, never gathered where none ran.
    fn rose_while_stalled(&self, from: f64, min_rise: f64) -> bool {
        let (Some(period), Some(last)) = (self.step_period(), self.points.back()) else {
            return false;
        };
        let run: Vec<&Point> = self
            .points
            .iter()
            .rev()
            .take_while(|p| p.step.is_some() && p.step == last.step)
            .collect();
        // A newest push without a step count (an agent that stopped
        // counting) says nothing of setup.
        let Some(&moved) = run.last() else {
            return false;
        };
        // The window's rise counts from the trainer's first step: the climb
        // before it (the model placed) is its start, never a pace.
        let before_first = self.moves.map_or(f64::NEG_INFINITY, |((t0, _), _)| t0);
        let lowest = self
            .points
            .iter()
            .filter(|p| p.t >= from && p.t > before_first)
            .map(|p| p.peak)
            .fold(f64::INFINITY, f64::min);
        let stalled_rise = last.peak - moved.peak;
        run.len() > 2
            && last.t - moved.t >= 3.0 * period
            && stalled_rise >= min_rise
            && stalled_rise >= 0.5 * (last.peak - lowest)
    }
}

/// Buckets a floor point looks back over: 8 s. A push lands at a random
/// point of a step, so one bucket's lowest push is often mid-step (its
/// activations held); a step long enough (long sequences, accumulation)
/// leaves whole buckets without a push between steps. The lowest over the
/// last few buckets finds memory between steps again; a leak lifts it as
/// it lifts every point, at the same pace.
const FLOOR_BUCKETS: usize = 4;

/// Each bucket's floor as the lowest floor of it and the
/// [`FLOOR_BUCKETS`] − 1 before it, from the first bucket with that many
/// before it: (middle, floor). A window too short for three such points
/// keeps each bucket's own floor (a leak is judged within 8 s).
fn lowest_recent(b: &[(f64, f64, f64)]) -> Vec<(f64, f64)> {
    if b.len() < FLOOR_BUCKETS + 2 {
        return b.iter().map(|x| (x.0, x.2)).collect();
    }
    (FLOOR_BUCKETS - 1..b.len())
        .map(|i| {
            let from = i + 1 - FLOOR_BUCKETS;
            let low = b[from..=i]
                .iter()
                .map(|x| x.2)
                .fold(f64::INFINITY, f64::min);
            (b[i].0, low)
        })
        .collect()
}

/// The largest rise from one bucket to the next, bytes.
pub(crate) fn largest_jump(points: &[(f64, f64)]) -> f64 {
    points
        .windows(2)
        .map(|w| w[1].1 - w[0].1)
        .fold(0.0, f64::max)
}

/// Each half of the window rose by at least a quarter of the window's rise.
pub(crate) fn both_halves(points: &[(f64, f64)], rise: f64) -> bool {
    let n = points.len();
    let half = n.div_ceil(2);
    let first = points[half - 1].1 - points[0].1;
    let second = points[n - 1].1 - points[n - half].1;
    first >= rise / 4.0 && second >= rise / 4.0
}

/// r² the floor needs to read as a leak: a leak lifts memory between steps
/// along a line.
const FLOOR_LINE_R2: f64 = 0.8;

/// Memory between steps is not seen to rise with the peaks (at `slope`):
/// a leak lifts it at least half as fast, along a line (r² ≥
/// [`FLOOR_LINE_R2`]). A floor that scatters (pushes caught mid-step, as
/// long sequences make every step) shows no leak: the pace is then growing
/// demand, which alarms from the same forecast but raises no leak flag
/// until the floor draws a line.
fn floor_flat(floors: &[(f64, f64)], slope: f64) -> bool {
    let Some(fit) = theil_sen(floors) else {
        return true;
    };
    !(fit.slope >= slope / 2.0 && fit.r2 >= FLOOR_LINE_R2)
}

/// Whether no training step ran among `points`: each carries the
/// trainer's step count and it never moved. A leak keeps memory from one
/// step to the next, so memory that rose while no step ran (weights
/// loading, a second model) is setup, whatever its pace (read over the
/// newest half of the pace's window, and at least three of the trainer's
/// usual steps, once its steps were seen to move: `Recent::setup_since`).
/// Unknown steps (a push without a count after counted ones) are not
/// evidence of setup; an agent that never counts has its pushes counted by
/// the memory they freed (`Recent::freed_count`).
fn setup<'a>(mut points: impl Iterator<Item = &'a Point>) -> bool {
    let Some(first) = points.next().and_then(|p| p.step) else {
        return false;
    };
    points.all(|p| p.step == Some(first))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GB: f64 = 1e9;
    const LIMIT: f64 = 84e9;
    const LEAK: f64 = 10e6 / 60.0;

    fn recent(secs: usize, f: impl Fn(f64) -> (f64, f64)) -> Recent {
        let mut r = Recent::default();
        for i in 0..=secs {
            let t = i as f64;
            let (peak, floor) = f(t);
            r.push(Point {
                t,
                peak,
                floor,
                step: Some(i as u64),
            });
        }
        r
    }

    /// Steps every push for 25 s: training throughout the last 20 s. A
    /// 10 s stretch without a step in it (a load), a window the pushes do
    /// not cover, or pushes without a count: not.
    #[test]
    fn steps_throughout_a_span_are_training_and_a_stall_is_not() {
        let r = recent(25, |t| (t, t));
        assert!(r.stepping_throughout(20.0));
        assert!(!r.stepping_throughout(30.0), "not covered");
        let mut stalled = Recent::default();
        for i in 0..=25 {
            let step = if (8..18).contains(&i) { 8 } else { i };
            stalled.push(Point {
                t: i as f64,
                peak: 1.0,
                floor: 1.0,
                step: Some(step),
            });
        }
        assert!(!stalled.stepping_throughout(20.0));
        assert!(stalled.stepping_throughout(6.0), "steps again since");
        let mut uncounted = Recent::default();
        for i in 0..=25 {
            uncounted.push(Point {
                t: i as f64,
                peak: 1.0,
                floor: 1.0,
                step: None,
            });
        }
        assert!(!uncounted.stepping_throughout(20.0));
    }

    /// A trainer whose every fifth push holds its largest step (2 GB over
    /// the others), leaking 0.3 GB/s: the level a forecast starts from is
    /// that step, lifted by the pace to now, not the newest push's.
    #[test]
    fn the_largest_recent_step_lifted_to_now_is_the_level() {
        let gb = 1e9;
        let r = recent(20, |t| {
            let big = if t as u64 % 5 == 0 { 2.0 * gb } else { 0.0 };
            (50.0 * gb + 0.3 * gb * t + big, 40.0 * gb + 0.3 * gb * t)
        });
        // The newest push (t = 20) is a big one: itself.
        let h = r.highest_lifted(0.3 * gb, 10.0).unwrap();
        assert!((h - 58.0 * gb).abs() < 1e6, "{h}");
        // Two pushes later the big step is 2 s old: lifted by 0.6 GB.
        let mut r2 = r.clone();
        for t in [21.0, 22.0] {
            r2.push(Point {
                t,
                peak: 50.0 * gb + 0.3 * gb * t,
                floor: 40.0 * gb,
                step: Some(t as u64),
            });
        }
        let h = r2.highest_lifted(0.3 * gb, 10.0).unwrap();
        assert!((h - 58.6 * gb).abs() < 1e6, "{h}");
        assert!(h > r2.last().unwrap().peak + 1.9 * gb);
    }

    #[test]
    fn a_leak_lifts_peaks_and_floor_and_is_a_pace_within_8_seconds() {
        // The dev recording leak100: 0.1 GB/s on a 5 GB saw-tooth.
        let r = recent(10, |t| {
            (
                79.8 * GB + 0.1 * GB * t,
                75.0 * GB + 0.1 * GB * t + if t as u64 % 3 == 0 { 2.0 * GB } else { 0.0 },
            )
        });
        let p = r.pace(LEAK, LIMIT).expect("a pace");
        assert!((p.slope - 0.1 * GB).abs() < 0.01 * GB, "{p:?}");
        assert!(!p.floor_flat);
    }

    #[test]
    fn a_step_is_not_a_pace() {
        // The dev recording growbatch: the peak steps 8.0 -> 13.6 GB once.
        for step_at in [2.0, 5.0, 9.0, 14.0] {
            let r = recent(20, |t| {
                (if t < step_at { 8.0 * GB } else { 13.6 * GB }, 2.1 * GB)
            });
            assert_eq!(r.pace(LEAK, LIMIT), None, "step at {step_at}");
        }
    }

    #[test]
    fn rising_peaks_over_a_flat_floor_are_a_pace_but_not_a_leak() {
        // Longer sequences every step: activations grow, the floor stays.
        let r = recent(30, |t| (20.0 * GB + 0.2 * GB * t, 2.1 * GB));
        let p = r.pace(LEAK, LIMIT).unwrap();
        assert!(p.floor_flat, "{p:?}");
    }

    #[test]
    fn flat_training_with_eval_spikes_has_no_pace() {
        let r = recent(60, |t| {
            (
                if t as u64 % 12 == 0 {
                    18.1 * GB
                } else {
                    10.8 * GB
                },
                2.1 * GB,
            )
        });
        assert_eq!(r.pace(LEAK, LIMIT), None);
        // A drift of a few MB is no pace either.
        let r = recent(60, |t| (10.8 * GB + 1e6 * t, 2.1 * GB));
        assert_eq!(r.pace(LEAK, LIMIT), None);
    }

    /// As recorded on an H200 (pcie-a load4g): ten warm-up steps in two
    /// seconds lift the peaks 0.9 -> 8.6 GB (the trainer's start), then
    /// weights arrive at 4 GB/s with no step. Two seconds into the load
    /// the window's newest half still holds the last steps, so only the
    /// rise since the count last moved tells it is setup; it was a leak
    /// flag then, held for 35 s. The same rise with a step at every push
    /// (a leak) is no setup.
    #[test]
    fn a_fast_load_after_the_first_steps_is_setup_at_once() {
        let run = |steps_go_on: bool| {
            let mut r = Recent::default();
            for (t, peak, floor, step) in [
                (0.29, 0.0, 0.0, 0),
                (1.30, 0.0, 0.0, 0),
                (2.33, 0.88, 0.88, 0),
                (3.37, 0.88, 0.88, 0),
                (4.39, 0.88, 0.88, 0),
                (5.50, 0.88, 0.88, 0),
                (6.52, 5.83, 2.84, 4),
                (7.53, 8.57, 5.79, 10),
                (8.53, 9.88, 9.88, 10),
                (9.53, 13.98, 13.98, 10),
            ] {
                let step = if steps_go_on && t > 7.0 {
                    (t * 10.0) as u64
                } else {
                    step
                };
                r.push(Point {
                    t,
                    peak: peak * GB,
                    floor: floor * GB,
                    step: Some(step),
                });
            }
            r.pace(LEAK, 140.0 * GB)
        };
        assert!(run(false).expect("a pace").setup);
        assert!(!run(true).expect("a pace").setup);
    }

    /// Steps counted, then pushes without a count (as an agent-only pod's
    /// were in a fresh-clone run, where this panicked on an empty run):
    /// no setup is read from pushes that carry no step.
    #[test]
    fn pushes_without_a_step_after_steps_are_no_setup_and_no_panic() {
        let mut r = Recent::default();
        for i in 0..=20u64 {
            let t = i as f64;
            r.push(Point {
                t,
                peak: 20.0 * GB + 0.5 * GB * t,
                floor: 10.0 * GB + 0.5 * GB * t,
                step: (i < 10).then_some(i),
            });
        }
        let p = r.pace(LEAK, LIMIT).expect("a pace");
        assert!(!p.setup, "{p:?}");
    }

    /// A leak in a trainer whose steps take 20 s each: a window with no
    /// step in it is not setup, since steps that slow would not show.
    #[test]
    fn a_window_shorter_than_three_steps_is_no_setup() {
        let mut r = Recent::default();
        for i in 0..=60 {
            let t = i as f64;
            let rise = 0.1 * GB * t;
            r.push(Point {
                t,
                peak: 20.0 * GB + rise,
                floor: 10.0 * GB + rise,
                step: Some(i / 20),
            });
        }
        let p = r.pace(LEAK, LIMIT).expect("a pace");
        assert!(!p.setup && !p.floor_flat, "{p:?}");
        // Steps every second, then none for the last 30 s: setup there.
        let mut r = Recent::default();
        for i in 0..=60u64 {
            let t = i as f64;
            let rise = if i < 30 { 0.0 } else { 0.5 * GB * (t - 30.0) };
            r.push(Point {
                t,
                peak: 20.0 * GB + rise,
                floor: 10.0 * GB + rise,
                step: Some(i.min(30)),
            });
        }
        let p = r.pace(LEAK, LIMIT).expect("a pace");
        assert!(p.setup, "{p:?}");
    }

    /// Weights loaded while no step ran (30 s at 0.5 GB/s), then steady
    /// training: no window reaches back into the load once steps run
    /// again, so the load's rise is never a training pace (it was a leak
    /// at confidence 1 the moment steps resumed). A leak after it is a
    /// pace once a window fits after the load.
    #[test]
    fn a_window_never_reaches_back_into_setup_that_ended() {
        let run = |leak: f64| {
            let mut r = Recent::default();
            let mut out = Vec::new();
            for i in 0..=90u64 {
                let t = i as f64;
                let load = 0.5 * GB * (t - 20.0).clamp(0.0, 30.0);
                let kept = leak * (t - 50.0).max(0.0);
                let step = if i < 20 {
                    i
                } else if i < 50 {
                    20
                } else {
                    i - 30
                };
                r.push(Point {
                    t,
                    peak: 20.0 * GB + load + kept,
                    floor: 10.0 * GB + load + kept,
                    step: Some(step),
                });
                out.push((t, r.pace(LEAK, LIMIT)));
            }
            out
        };
        for (t, p) in run(0.0) {
            assert!(t <= 50.0 || p.is_none(), "at {t}: {p:?}");
        }
        let leak = run(0.1 * GB);
        let (t, p) = leak
            .iter()
            .find(|(_, p)| p.is_some_and(|p| !p.setup))
            .unwrap();
        assert!(*t >= 58.0 && *t <= 62.0, "at {t}: {p:?}");
        assert!(!p.unwrap().floor_flat && (p.unwrap().slope - 0.1 * GB).abs() < 0.02 * GB);
    }

    /// A warm-up of 12 steps inside one push interval, then weights
    /// loading with no step: setup, though the count moved only once (the
    /// period counts from the push before that move).
    #[test]
    fn one_move_of_many_steps_gives_the_period() {
        let mut r = Recent::default();
        for i in 0..=80u64 {
            let t = i as f64 / 2.0;
            let rise = if t < 5.0 { 0.0 } else { 1.0 * GB * (t - 5.0) };
            r.push(Point {
                t,
                peak: 20.0 * GB + rise,
                floor: 10.0 * GB + rise,
                step: Some(if t < 4.5 { 0 } else { 12 }),
            });
        }
        let p = r.pace(LEAK, LIMIT).expect("a pace");
        assert!(p.setup, "{p:?}");
    }

    /// A process whose step count never moved (no optimizer: inference,
    /// evaluation alone) is never read as setting up: its leak is a leak.
    #[test]
    fn steps_that_never_moved_are_no_setup() {
        let mut r = Recent::default();
        for i in 0..=60 {
            let t = i as f64;
            let rise = 0.2 * GB * t;
            r.push(Point {
                t,
                peak: 20.0 * GB + rise,
                floor: 10.0 * GB + rise,
                step: Some(0),
            });
        }
        let p = r.pace(LEAK, LIMIT).expect("a pace");
        assert!(!p.setup && !p.floor_flat, "{p:?}");
    }

    #[test]
    fn the_window_never_reaches_back_over_the_start() {
        // 0.7 GB for 10 s, then a jump to 17 GB and +2 GB/s (the dev leak2000).
        let r = recent(22, |t| {
            if t < 10.0 {
                (0.7 * GB, 0.7 * GB)
            } else {
                (
                    17.0 * GB + 2.0 * GB * (t - 10.0),
                    12.0 * GB + 2.0 * GB * (t - 10.0),
                )
            }
        });
        let p = r.pace(LEAK, LIMIT).unwrap();
        assert!((p.slope - 2.0 * GB).abs() < 0.05 * GB, "{p:?}");
        assert!(p.span <= 12.0, "{p:?}");
    }

    /// An agent that counts no steps (the recorded smooth sets): 10 s of
    /// training whose every push freed its activations (peak over the
    /// memory at the push), then weights arriving at 1 GB/s piece by piece
    /// for 30 s, nothing freed, then training again. The load is setup
    /// while it lasts and no window reaches back into it once steps free
    /// memory again; the same rise with activations freed at every push
    /// (a leak) is a leak's pace. Counted so, the pushes still say nothing
    /// of stepping throughout.
    #[test]
    fn an_agent_that_counts_no_steps_counts_the_pushes_that_freed_memory() {
        let run = |load_frees: bool| {
            let mut r = Recent::default();
            let mut out = Vec::new();
            for i in 0..=70u64 {
                let t = i as f64;
                let kept = 20.0 * GB + 1.0 * GB * (t - 10.0).clamp(0.0, 30.0);
                let loading = (11..=40).contains(&i);
                let activations = if loading && !load_frees {
                    0.0
                } else {
                    2.0 * GB
                };
                r.push(Point {
                    t,
                    peak: kept + activations,
                    floor: kept,
                    step: None,
                });
                out.push((t, r.pace(LEAK, LIMIT)));
            }
            (r, out)
        };
        let (r, load) = run(false);
        for (t, p) in &load {
            match *t {
                t if t > 20.0 && t <= 40.0 => assert!(p.expect("a pace").setup, "at {t}: {p:?}"),
                t if t > 40.0 => assert!(p.is_none_or(|p| p.setup), "at {t}: {p:?}"),
                _ => {}
            }
        }
        assert!(
            !r.stepping_throughout(20.0),
            "freed memory is no step count"
        );
        let (_, leak) = run(true);
        let (t, p) = leak[30];
        assert!(
            !p.expect("a pace").setup && !p.unwrap().floor_flat,
            "at {t}: {p:?}"
        );
    }

    /// Two steps of warm-up 1 s apart, 25 s of weights loading with the
    /// count standing still, then a step a second: the stall is judged by
    /// the step the trainer took before it (1 s), not by the period read
    /// after it, which spreads the stall over three steps (9 s a step, so
    /// 25 s looked shorter than three steps and the load's window was a
    /// leak the moment steps resumed: smooth-a's loadmid, 11 s of flag).
    #[test]
    fn a_stall_is_judged_by_the_usual_step_before_it() {
        let mut r = Recent::default();
        for i in 0..=50u64 {
            let t = i as f64;
            let kept = 20.0 * GB + 1.5 * GB * (t - 10.0).clamp(0.0, 25.0);
            let step = match i {
                0..=8 => 0,
                9 => 1,
                10..=35 => 2,
                _ => i - 33,
            };
            r.push(Point {
                t,
                peak: kept + 2.0 * GB,
                floor: kept,
                step: Some(step),
            });
            let p = r.pace(LEAK, LIMIT);
            assert!(t <= 35.0 || p.is_none_or(|p| p.setup), "at {t}: {p:?}");
        }
        let ended = r.setup_ended_at(MIN_RISE_FRACTION * LIMIT).expect("setup");
        assert!((ended - 35.0).abs() < 1e-9, "{ended}");
    }
}
