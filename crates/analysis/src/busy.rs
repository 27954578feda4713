//! What a GPU was doing while its memory rose: computing (NVML's
//! utilization, the share of each sample period in which a kernel ran) and
//! receiving bytes from the host (NVML's PCIe receive throughput), kept
//! beside the memory history.
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
//! Utilization alone misses the fastest loads: a copy from pageable host
//! memory at full speed read 13 % (6 GB/s), from pinned memory 96 %
//! (46 GB/s). What such a load does have is bytes arriving over PCIe at
//! the pace memory rises (1.05-1.18 times it, measured), which a leak made
//! on the GPU does not (0.01 GB/s beside a trainer leaking 0.24 GB/s). So
//! memory that rose no faster than the host's bytes arrived, while the GPU
//! computed little, is setup too. A trainer that keeps every input batch
//! it receives while computing under [`COPY_MAX_PERCENT`] reads the same:
//! the documented blind spot (its level still alarms as the card fills).
//!
//! Pure: time comes with each reading. Bounded: readings older than the
//! span kept are dropped, and at most [`MAX_READINGS`] of each are kept.

use std::collections::VecDeque;

/// A rise is idle when the GPU's mean utilization over it is at most this,
/// percent: the loads measured stayed at or under it, every training run
/// above twice it.
pub const IDLE_PERCENT: f64 = 5.0;
/// A rise is a copy from the host when the bytes received over PCIe during
/// it come to at least this share of its pace: the loads measured received
/// 1.05-1.18 times what they kept (NVML samples the link over 20 ms, so a
/// reading is a glimpse; their mean over a rise is what is compared).
pub const COPY_SHARE: f64 = 0.8;
/// ... and the GPU's mean utilization over it is at most this, percent:
/// pageable loads measured 6-13 %, trainers 55-100 % (one idle 300 ms a
/// step included); a pinned load at 96 % is over in seconds.
pub const COPY_MAX_PERCENT: f64 = 25.0;
/// Readings kept at most (a sampler reading each 100 ms over the span).
pub const MAX_READINGS: usize = 4096;
/// The readings must cover at least this share of a rise, else the rise
/// is not judged (a sampler without utilization, or one that stalled).
const MIN_COVER: f64 = 0.5;
/// And be at least this many.
const MIN_READINGS: usize = 5;

/// Why a rise is setup rather than a training pace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setup {
    /// The GPU computed next to nothing over it.
    Idle,
    /// Bytes arriving from the host over PCIe account for it.
    Copied,
}

/// One GPU's recent readings of its work and of the bytes it received.
#[derive(Clone, Debug, Default)]
pub struct Busy {
    work: Window,
    received: Window,
}

impl Busy {
    /// Readings kept for `keep_seconds` (the memory history's own span).
    pub fn new(keep_seconds: f64) -> Self {
        Busy {
            work: Window::new(keep_seconds),
            received: Window::new(keep_seconds),
        }
    }

    /// Utilization `percent` at time `t` (seconds, the samples' clock). A
    /// reading older than the newest is dropped (the clock stepped back).
    pub fn push(&mut self, t: f64, percent: u32) {
        self.work.push(t, f64::from(percent.min(100)));
    }

    /// PCIe receive throughput at `t`, bytes per second.
    pub fn push_received(&mut self, t: f64, bytes_per_second: u64) {
        self.received.push(t, bytes_per_second as f64);
    }

    /// Mean utilization over `[from, to]`, percent; `None` when the readings
    /// there are too few or cover too little of it to say.
    pub fn mean_over(&self, from: f64, to: f64) -> Option<f64> {
        self.work.mean_over(from, to)
    }

    /// Whether the GPU computed next to nothing over `[from, to]`: `None`
    /// when the readings cannot say (no utilization known).
    pub fn idle_over(&self, from: f64, to: f64) -> Option<bool> {
        self.mean_over(from, to).map(|m| m <= IDLE_PERCENT)
    }

    /// Whether memory rising at `rate` bytes per second over `[from, to]`
    /// is bytes copied from the host: `None` when the readings cannot say
    /// (no PCIe or no utilization readings).
    pub fn copied_over(&self, from: f64, to: f64, rate: f64) -> Option<bool> {
        let received = self.received.mean_over(from, to)?;
        let work = self.mean_over(from, to)?;
        Some(received >= COPY_SHARE * rate && work <= COPY_MAX_PERCENT)
    }

    /// Why memory rising at `rate` over `[from, to]` is setup, if it is.
    /// Where the bytes received over the rise are known they decide: a
    /// load brings its bytes over PCIe, so a climb the host's bytes do not
    /// account for was made on the GPU itself, however little it computed
    /// (a trainer idle two thirds of each step reads 5-6 %, as a slow load
    /// does). Idleness alone decides only where PCIe cannot be read.
    pub fn setup_over(&self, from: f64, to: f64, rate: f64) -> Option<Setup> {
        if let Some(copied) = self.copied_over(from, to, rate) {
            return copied.then_some(Setup::Copied);
        }
        (self.idle_over(from, to) == Some(true)).then_some(Setup::Idle)
    }
}

/// Timed readings of one quantity, oldest first, kept for a span and
/// bounded in count.
#[derive(Clone, Debug, Default)]
struct Window {
    readings: VecDeque<(f64, f64)>,
    keep_seconds: f64,
}

impl Window {
    fn new(keep_seconds: f64) -> Self {
        Window {
            readings: VecDeque::new(),
            keep_seconds,
        }
    }

    fn push(&mut self, t: f64, value: f64) {
        if self.readings.back().is_some_and(|&(last, _)| t < last) {
            return;
        }
        self.readings.push_back((t, value));
        while self
            .readings
            .front()
            .is_some_and(|&(first, _)| t - first > self.keep_seconds)
            || self.readings.len() > MAX_READINGS
        {
            self.readings.pop_front();
        }
    }

    fn mean_over(&self, from: f64, to: f64) -> Option<f64> {
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
        assert_eq!(b.work.readings.len(), 11);
        let mut many = Busy::new(f64::INFINITY);
        for i in 0..(MAX_READINGS + 10) {
            many.push(i as f64 * 0.001, 50);
        }
        assert_eq!(many.work.readings.len(), MAX_READINGS);
        // A reading from before the newest is dropped.
        many.push(0.0, 0);
        assert_eq!(many.work.readings.back().unwrap().1, 50.0);
    }

    /// As measured on an H200 (docs/gpu-results.md): a pageable load at
    /// full speed read 13 % and received 1.06 times what it kept; a
    /// trainer leaking on the GPU received next to nothing at 99 %; one
    /// that keeps its inputs received them, but computed.
    #[test]
    fn bytes_from_the_host_that_account_for_a_rise_make_it_a_copy_while_the_gpu_computes_little() {
        let at = |percent: u32, rx: u64| {
            let mut b = Busy::new(240.0);
            for t in 0..20 {
                b.push(t as f64, percent);
                b.push_received(t as f64, rx);
            }
            b
        };
        let gb = 1e9;
        let load = at(13, 6_300_000_000);
        assert_eq!(load.idle_over(0.0, 19.0), Some(false));
        assert_eq!(load.setup_over(0.0, 19.0, 5.9 * gb), Some(Setup::Copied));
        // A leak made on the GPU: nothing received.
        let leak = at(13, 10_000_000);
        assert_eq!(leak.setup_over(0.0, 19.0, 0.24 * gb), None);
        // Received, but less than four fifths of the pace.
        assert_eq!(at(13, 700_000_000).setup_over(0.0, 19.0, gb), None);
        // Received at the pace, but computing: a trainer keeping its inputs.
        assert_eq!(at(85, gb as u64).setup_over(0.0, 19.0, gb), None);
        // An idle GPU that received nothing made the rise itself: not
        // setup where PCIe is read, setup by idleness where it is not.
        assert_eq!(at(3, 0).setup_over(0.0, 19.0, gb), None);
        let mut idle = Busy::new(240.0);
        (0..20).for_each(|t| idle.push(t as f64, 3));
        assert_eq!(idle.setup_over(0.0, 19.0, gb), Some(Setup::Idle));
        // An idle load that received its bytes is a copy.
        assert_eq!(
            at(3, gb as u64).setup_over(0.0, 19.0, gb),
            Some(Setup::Copied)
        );
        // Without PCIe readings the copy rule says nothing.
        let mut no_rx = Busy::new(240.0);
        (0..20).for_each(|t| no_rx.push(t as f64, 13));
        assert_eq!(no_rx.copied_over(0.0, 19.0, gb), None);
    }
}
