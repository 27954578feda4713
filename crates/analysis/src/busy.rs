//! Whether a GPU computed while its memory rose: NVML's utilization (the
//! share of each sample period in which a kernel ran), kept beside the
//! memory history.
//!
//! Device memory alone cannot tell weights arriving from a disk from a leak
//! at the same pace: both are a straight climb. What differs is the work.
//! A trainer that leaks (or whose demand grows, or beside whom a neighbour
//! grows) runs its steps, so the GPU computes; a load copies bytes and runs
//! next to no kernel (on two H200: 0-5 % while weights were copied from
//! host memory, 60-100 % while training, about 12 % for a trainer idle
//! 150 ms after each step; docs/gpu-results.md). So memory that rose while
//! the GPU was idle is setup, which ends where what is loaded ends: it may
//! warn, never alarm, and is never a leak (`risk::assess`).
//!
//! Pure: time comes with each reading. Bounded: readings older than the
//! span kept are dropped, and at most [`MAX_READINGS`] are kept.

use std::collections::VecDeque;

/// A rise is idle when the GPU's mean utilization over it is at most this,
/// percent: the loads measured stayed at or under it, every training run
/// above twice it.
pub const IDLE_PERCENT: f64 = 5.0;
/// Readings kept at most (a sampler reading each 100 ms over the span).
pub const MAX_READINGS: usize = 4096;
/// The readings must cover at least this share of a rise, else the rise
/// is not judged (a sampler without utilization, or one that stalled).
const MIN_COVER: f64 = 0.5;
/// And be at least this many.
const MIN_READINGS: usize = 5;

/// One GPU's recent utilization readings, oldest first.
#[derive(Clone, Debug, Default)]
pub struct Busy {
    readings: VecDeque<(f64, f64)>,
    keep_seconds: f64,
}

impl Busy {
    /// Readings kept for `keep_seconds` (the memory history's own span).
    pub fn new(keep_seconds: f64) -> Self {
        Busy {
            readings: VecDeque::new(),
            keep_seconds,
        }
    }

    /// Utilization `percent` at time `t` (seconds, the samples' clock). A
    /// reading older than the newest is dropped (the clock stepped back).
    pub fn push(&mut self, t: f64, percent: u32) {
        if self.readings.back().is_some_and(|&(last, _)| t < last) {
            return;
        }
        self.readings.push_back((t, f64::from(percent.min(100))));
        while self
            .readings
            .front()
            .is_some_and(|&(first, _)| t - first > self.keep_seconds)
            || self.readings.len() > MAX_READINGS
        {
            self.readings.pop_front();
        }
    }

    /// Mean utilization over `[from, to]`, percent; `None` when the readings
    /// there are too few or cover too little of it to say.
    pub fn mean_over(&self, from: f64, to: f64) -> Option<f64> {
        let inside: Vec<(f64, f64)> = self
            .readings
            .iter()
            .copied()
            .filter(|&(t, _)| t >= from && t <= to)
            .collect();
        let (first, last) = (inside.first()?.0, inside.last()?.0);
        let covers = to - from <= 0.0 || (last - first) / (to - from) >= MIN_COVER;
        (inside.len() >= MIN_READINGS && covers)
            .then(|| inside.iter().map(|r| r.1).sum::<f64>() / inside.len() as f64)
    }

    /// Whether the GPU computed next to nothing over `[from, to]`: `None`
    /// when the readings cannot say (no utilization known).
    pub fn idle_over(&self, from: f64, to: f64) -> Option<bool> {
        self.mean_over(from, to).map(|m| m <= IDLE_PERCENT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn busy(readings: impl IntoIterator<Item = (f64, u32)>) -> Busy {
        let mut b = Busy::new(240.0);
        for (t, p) in readings {
            b.push(t, p);
        }
        b
    }

    #[test]
    fn a_load_is_idle_and_a_trainer_is_not_even_when_it_waits_between_steps() {
        // As recorded: a load from host memory read 0-5 %, with one stray 44.
        let load = busy((0..40).map(|t| (t as f64, if t == 3 { 44 } else { (t % 6) as u32 })));
        assert_eq!(load.idle_over(0.0, 39.0), Some(true));
        // An input-bound trainer: 0 or 18 % in turn (sleeping 150 ms a step).
        let waits = busy((0..40).map(|t| (t as f64, if t % 2 == 0 { 0 } else { 18 })));
        assert_eq!(waits.idle_over(0.0, 39.0), Some(false));
    }

    #[test]
    fn without_enough_readings_over_the_rise_nothing_is_said() {
        assert_eq!(Busy::new(240.0).idle_over(0.0, 30.0), None);
        // Four readings are too few.
        assert_eq!(
            busy((0..4).map(|t| (t as f64, 0))).idle_over(0.0, 3.0),
            None
        );
        // Readings over the last 10 s of a 40 s rise cover a quarter of it.
        let late = busy((30..40).map(|t| (t as f64, 0)));
        assert_eq!(late.idle_over(0.0, 40.0), None);
        assert_eq!(late.idle_over(30.0, 40.0), Some(true));
    }

    #[test]
    fn readings_are_kept_for_the_span_and_bounded_in_count() {
        let mut b = Busy::new(10.0);
        for t in 0..100 {
            b.push(t as f64, 0);
        }
        assert_eq!(b.readings.len(), 11);
        let mut many = Busy::new(f64::INFINITY);
        for i in 0..(MAX_READINGS + 10) {
            many.push(i as f64 * 0.001, 50);
        }
        assert_eq!(many.readings.len(), MAX_READINGS);
        // A reading from before the newest is dropped.
        many.push(0.0, 0);
        assert_eq!(many.readings.back().unwrap().1, 50.0);
    }
}
