//! A GPU's recent memory history, bucketed into envelopes with bounded memory.

use crate::busy::Busy;
use crate::staircase::Rises;
use memprof_api::thresholds::Thresholds;
use std::collections::VecDeque;

/// One observation of one GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sample {
    /// Seconds (any fixed origin: Unix time for live sampling, trace time offline).
    pub t: f64,
    /// Memory in use, bytes.
    pub used: u64,
    /// Total memory, bytes.
    pub total: u64,
}

/// Minimum and maximum of the samples within one bucket.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bucket {
    /// Start of the bucket (a multiple of the bucket width).
    pub start: f64,
    /// Lowest used memory in the bucket.
    pub min: u64,
    /// Highest used memory in the bucket.
    pub max: u64,
}

/// Points `(t, bytes)` of an envelope, oldest first.
pub type Envelope = Vec<(f64, f64)>;

/// The bounded history of one GPU. Pushing is O(1) amortized; the buckets
/// kept cover at most twice the fit window, so memory does not grow with time.
#[derive(Clone, Debug)]
pub struct GpuSeries {
    bucket_seconds: f64,
    keep_buckets: usize,
    buckets: VecDeque<Bucket>,
    first_t: Option<f64>,
    last: Option<Sample>,
    peak: u64,
    samples: u64,
    rises: Rises,
    busy: Busy,
}

impl GpuSeries {
    /// An empty history bucketed as the thresholds say.
    pub fn new(th: &Thresholds) -> Self {
        let keep = ((2.0 * th.fit_window_seconds / th.bucket_seconds).ceil() as usize).max(8);
        GpuSeries {
            bucket_seconds: th.bucket_seconds,
            keep_buckets: keep,
            buckets: VecDeque::with_capacity(keep + 1),
            first_t: None,
            last: None,
            peak: 0,
            samples: 0,
            rises: Rises::default(),
            busy: Busy::new(2.0 * th.fit_window_seconds),
        }
    }

    /// Adds a sample. Samples older than the newest bucket are folded into it
    /// (clocks may step back a little); the peak is tracked at every sample.
    pub fn push(&mut self, s: Sample) {
        self.peak = self.peak.max(s.used);
        self.samples += 1;
        self.rises.push(s.t, s.used, s.total);
        self.first_t.get_or_insert(s.t);
        let start = (s.t / self.bucket_seconds).floor() * self.bucket_seconds;
        match self.buckets.back_mut() {
            Some(b) if start <= b.start => {
                b.min = b.min.min(s.used);
                b.max = b.max.max(s.used);
            }
            _ => {
                self.buckets.push_back(Bucket {
                    start,
                    min: s.used,
                    max: s.used,
                });
                while self.buckets.len() > self.keep_buckets {
                    self.buckets.pop_front();
                }
            }
        }
        self.last = Some(s);
    }

    /// NVML's utilization of the GPU at `t`, percent (kept as long as the
    /// buckets): whether it computed while its memory rose.
    pub fn push_utilization(&mut self, t: f64, percent: u32) {
        self.busy.push(t, percent);
    }

    /// NVML's PCIe receive throughput of the GPU at `t`, bytes per second
    /// (kept as long as the buckets): whether the host's bytes account for
    /// a rise.
    pub fn push_received(&mut self, t: f64, bytes_per_second: u64) {
        self.busy.push_received(t, bytes_per_second);
    }

    /// The utilization and PCIe readings kept.
    pub fn busy(&self) -> &Busy {
        &self.busy
    }

    /// The newest sample.
    pub fn last(&self) -> Option<Sample> {
        self.last
    }

    /// The rises of used memory (what NVML can tell of sustained growth).
    pub fn rises(&self) -> &Rises {
        &self.rises
    }

    /// Highest used memory ever pushed.
    pub fn peak(&self) -> u64 {
        self.peak
    }

    /// Number of samples pushed.
    pub fn sample_count(&self) -> u64 {
        self.samples
    }

    /// Seconds between the first and the newest sample.
    pub fn observed_span(&self) -> f64 {
        match (self.first_t, self.last) {
            (Some(f), Some(l)) => (l.t - f).max(0.0),
            _ => 0.0,
        }
    }

    /// Width of a bucket, seconds.
    pub fn bucket_seconds(&self) -> f64 {
        self.bucket_seconds
    }

    /// The buckets, oldest first (the last one may still be filling).
    pub fn buckets(&self) -> impl DoubleEndedIterator<Item = &Bucket> + ExactSizeIterator {
        self.buckets.iter()
    }

    /// Upper and lower envelope points `(bucket middle, bytes)` within the
    /// fit window ending at the newest sample. The bucket still filling is
    /// left out once there are enough complete ones: its max is not final yet.
    pub fn envelopes(&self, fit_window_seconds: f64) -> (Envelope, Envelope) {
        let Some(last) = self.last else {
            return (vec![], vec![]);
        };
        let from = last.t - fit_window_seconds;
        let complete = self.buckets.len().saturating_sub(1);
        let take = if complete >= 3 {
            complete
        } else {
            self.buckets.len()
        };
        let half = self.bucket_seconds / 2.0;
        let mut upper = Vec::with_capacity(take);
        let mut lower = Vec::with_capacity(take);
        for b in self
            .buckets
            .iter()
            .take(take)
            .filter(|b| b.start + half >= from)
        {
            upper.push((b.start + half, b.max as f64));
            lower.push((b.start + half, b.min as f64));
        }
        (upper, lower)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_keep_min_and_max_and_stay_bounded() {
        let th = Thresholds {
            bucket_seconds: 1.0,
            fit_window_seconds: 10.0,
            ..Default::default()
        };
        let mut s = GpuSeries::new(&th);
        for i in 0..1000 {
            s.push(Sample {
                t: i as f64 * 0.1,
                used: (i % 10) as u64,
                total: 100,
            });
        }
        assert!(s.buckets().len() <= 20);
        let b = s.buckets().next().unwrap();
        assert_eq!((b.min, b.max), (0, 9));
        assert_eq!(s.peak(), 9);
        assert_eq!(s.sample_count(), 1000);
        assert!((s.observed_span() - 99.9).abs() < 1e-9);
    }

    #[test]
    fn envelopes_leave_out_the_bucket_still_filling() {
        let th = Thresholds {
            bucket_seconds: 1.0,
            fit_window_seconds: 100.0,
            ..Default::default()
        };
        let mut s = GpuSeries::new(&th);
        for i in 0..50 {
            s.push(Sample {
                t: i as f64 * 0.1,
                used: i,
                total: 100,
            });
        }
        let (upper, lower) = s.envelopes(100.0);
        assert_eq!(upper.len(), 4); // buckets 0..4 complete, 4.x still filling
        assert_eq!(upper[0], (0.5, 9.0));
        assert_eq!(lower[3], (3.5, 30.0));
    }
}
