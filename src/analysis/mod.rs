//! Pure analysis of GPU memory over time, shared by the sidecar, the operator
//! and the CLI. Nothing here does I/O or reads a clock: time comes in with the
//! samples, so every behaviour is unit-tested on plain values without sleeping.
//!
//! Training memory is periodic (activations rise in forward, fall in backward)
//! and PyTorch's caching allocator keeps what it reserved, so NVML sees a
//! staircase. Trends are therefore fitted to envelopes, not raw samples: the
//! samples are bucketed (default 10 s), the upper envelope (bucket maxima)
//! predicts OOM, the lower envelope (bucket minima) reveals a leak.

pub mod allocator;
mod allocator_rollup;
pub mod batchfit;
pub mod breakdown;
mod fit;
mod risk;
mod rollup;
mod series;

pub use fit::{least_squares_slope, theil_sen, LinearFit};
pub use risk::{assess, Assessment};
pub use rollup::{rollup, validate_report, RollupInput};
pub use series::{GpuSeries, Sample};

use serde::{Deserialize, Serialize};

/// Tunable thresholds of the analysis. The defaults were chosen so a periodic
/// training pattern stays `low` and a leak of ≥ 100 MB/s on an 80 GB GPU is
/// `high` more than a minute before the OOM (see docs/analysis.md).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct Thresholds {
    /// Width of one envelope bucket, seconds. Should exceed the training step time.
    pub bucket_seconds: f64,
    /// How far back the trend is fitted, seconds.
    pub fit_window_seconds: f64,
    /// Observation span after which a trend is fully trusted, seconds.
    pub trust_span_seconds: f64,
    /// Time to OOM at or below which the risk is critical, seconds.
    pub critical_tto_seconds: f64,
    /// Time to OOM at or below which the risk is high, seconds.
    pub high_tto_seconds: f64,
    /// Time to OOM at or below which the risk is medium, seconds.
    pub medium_tto_seconds: f64,
    /// Fraction of total memory at or above which the risk is critical.
    pub critical_fraction: f64,
    /// Fraction of total memory at or above which the risk is high.
    pub high_fraction: f64,
    /// Fraction of total memory at or above which the risk is medium.
    pub medium_fraction: f64,
    /// Trend confidence needed before a predicted OOM may raise the risk above medium.
    pub min_confidence: f64,
    /// Lower-envelope growth, bytes per second, above which a leak is suspected.
    pub leak_bytes_per_second: f64,
    /// A rise of at least this fraction of total memory from one bucket to the next is a spike.
    pub spike_fraction: f64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            bucket_seconds: 10.0,
            fit_window_seconds: 300.0,
            trust_span_seconds: 60.0,
            critical_tto_seconds: 120.0,
            high_tto_seconds: 600.0,
            medium_tto_seconds: 1800.0,
            critical_fraction: 0.98,
            high_fraction: 0.95,
            medium_fraction: 0.90,
            min_confidence: 0.6,
            // 10 MB/min, the default of the seed toolkit's `leak` command.
            leak_bytes_per_second: 10.0e6 / 60.0,
            spike_fraction: 0.10,
        }
    }
}

/// Errors of threshold validation.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum Error {
    /// A threshold is out of its range.
    #[error("invalid analysis threshold {name}={value}: {why}")]
    InvalidThreshold {
        /// Field name.
        name: &'static str,
        /// Offending value.
        value: f64,
        /// What would be valid.
        why: &'static str,
    },
}

impl Thresholds {
    /// Checks that the thresholds make sense together.
    pub fn validate(&self) -> Result<(), Error> {
        let positive = [
            ("bucketSeconds", self.bucket_seconds),
            ("fitWindowSeconds", self.fit_window_seconds),
            ("trustSpanSeconds", self.trust_span_seconds),
        ];
        for (name, value) in positive {
            if !(value.is_finite() && value > 0.0) {
                return Err(Error::InvalidThreshold {
                    name,
                    value,
                    why: "must be a positive number",
                });
            }
        }
        if self.fit_window_seconds < 3.0 * self.bucket_seconds {
            return Err(Error::InvalidThreshold {
                name: "fitWindowSeconds",
                value: self.fit_window_seconds,
                why: "must span at least 3 buckets",
            });
        }
        if !(self.critical_tto_seconds <= self.high_tto_seconds
            && self.high_tto_seconds <= self.medium_tto_seconds)
        {
            return Err(Error::InvalidThreshold {
                name: "highTtoSeconds",
                value: self.high_tto_seconds,
                why: "time-to-OOM horizons must satisfy critical <= high <= medium",
            });
        }
        let fractions_ordered = 0.0 < self.medium_fraction
            && self.medium_fraction <= self.high_fraction
            && self.high_fraction <= self.critical_fraction
            && self.critical_fraction <= 1.0;
        if !fractions_ordered {
            return Err(Error::InvalidThreshold {
                name: "highFraction",
                value: self.high_fraction,
                why: "usage fractions must satisfy 0 < medium <= high <= critical <= 1",
            });
        }
        if !(0.0..=1.0).contains(&self.min_confidence) {
            return Err(Error::InvalidThreshold {
                name: "minConfidence",
                value: self.min_confidence,
                why: "must be in [0, 1]",
            });
        }
        Ok(())
    }
}
