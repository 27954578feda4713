//! From a GPU's history to a risk level with a confidence.

use super::{least_squares_slope, theil_sen, GpuSeries};
use memprof_api::thresholds::Thresholds;
use memprof_api::RiskLevel;

/// What the analysis concluded about one GPU.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Assessment {
    /// Risk level.
    pub risk: RiskLevel,
    /// Confidence in the risk level, 0 to 1.
    pub confidence: f64,
    /// Growth of the upper envelope, bytes per second.
    pub growth_bytes_per_second: f64,
    /// Predicted seconds until the upper envelope reaches total memory.
    pub time_to_oom_seconds: Option<f64>,
    /// The lower envelope grows faster than the leak threshold, consistently.
    pub leak_suspected: bool,
    /// A bucket rose by more than the spike fraction over its predecessor.
    pub spike_detected: bool,
    /// Used memory at the newest sample, bytes.
    pub used: u64,
    /// Total memory, bytes.
    pub total: u64,
    /// Peak used memory, bytes.
    pub peak: u64,
    /// Why, in one sentence (for logs, events and `memprof analyze`).
    pub reason: String,
}

/// At or below this fraction of total memory a GPU is idle (a CUDA context
/// alone is 0.5 GB of 80 GB).
const IDLE_FRACTION: f64 = 0.02;

/// Assesses one GPU's history against the thresholds.
pub fn assess(series: &GpuSeries, th: &Thresholds) -> Assessment {
    let Some(last) = series.last() else {
        return Assessment {
            reason: "no samples yet".into(),
            ..Default::default()
        };
    };
    let total = last.total.max(1) as f64;
    let (mut upper, mut lower) = series.envelopes(th.fit_window_seconds);
    // An idle GPU (no process, or a bare CUDA context) filling up in seconds
    // is a trainer starting, not a trend, a leak or a spike (seen on every
    // real start: 0 to 29 GB within one bucket). Only buckets after the GPU
    // was last idle count; a process that dies (an OOM) starts a new history.
    let idle = IDLE_FRACTION * total;
    let active_from = series
        .buckets()
        .rev()
        .find(|b| b.min as f64 <= idle)
        .map_or(f64::NEG_INFINITY, |b| b.start + series.bucket_seconds());
    upper.retain(|p| p.0 > active_from);
    lower.retain(|p| p.0 > active_from);
    // The ceiling is what the envelope reaches now: the fullest recent bucket.
    let level = upper
        .last()
        .map_or(last.used as f64, |p| p.1)
        .max(last.used as f64);
    let fraction = level / total;

    let mut a = Assessment {
        used: last.used,
        total: last.total,
        peak: series.peak(),
        ..Default::default()
    };

    // Trend of the upper envelope, trusted by linearity and by how long we watched.
    // A trend must still be going on: growth is the smaller of the window's
    // slope and the recent half's, so loading weights or allocator warm-up
    // (steep, then flat) stops counting as soon as it stops.
    let trend = theil_sen(&upper);
    // "Still growing?" is asked of the last minute (at least the trust span),
    // with least squares, not Theil–Sen: PyTorch's allocator grows by whole
    // segments, so on NVML a real leak is a staircase (a 4 GB step every 40 s
    // at 100 MB/s on an H100). A shorter window falls on one tread, and most
    // pairs of any window lie on one tread, so their median slope is 0: on
    // the real trace, risk flapped high -> low -> critical.
    let min_recent = (th.trust_span_seconds / th.bucket_seconds).ceil() as usize + 1;
    let recent = least_squares_slope(
        &upper[upper
            .len()
            .saturating_sub((upper.len() / 2).max(min_recent).max(3))..],
    );
    let span_factor = (series.observed_span() / th.trust_span_seconds).min(1.0);
    let mut trend_confidence = 0.0;
    if let Some(fit) = trend {
        a.growth_bytes_per_second = recent.map_or(fit.slope, |r| r.min(fit.slope));
        trend_confidence = fit.r2 * span_factor * (fit.span / th.trust_span_seconds).min(1.0);
        if a.growth_bytes_per_second > 0.0 {
            a.time_to_oom_seconds = Some(((total - level) / a.growth_bytes_per_second).max(0.0));
        }
    }

    // A leak: memory held between steps keeps growing, linearly enough, and
    // in rises that recur (see `keeps_rising`).
    if let Some(fit) = theil_sen(&lower) {
        a.leak_suspected = fit.slope > th.leak_bytes_per_second
            && fit.r2 >= 0.8
            && fit.span >= th.trust_span_seconds.min(th.fit_window_seconds / 2.0)
            && keeps_rising(&lower, th);
    }

    let buckets: Vec<_> = series
        .buckets()
        .filter(|b| b.start >= active_from)
        .collect();
    let recent = buckets
        .len()
        .saturating_sub((th.fit_window_seconds / th.bucket_seconds) as usize);
    a.spike_detected = buckets[recent..]
        .windows(2)
        .any(|w| w[1].max as f64 - w[0].max as f64 >= th.spike_fraction * total);

    let by_level = if fraction >= th.critical_fraction {
        RiskLevel::Critical
    } else if fraction >= th.high_fraction {
        RiskLevel::High
    } else if fraction >= th.medium_fraction {
        RiskLevel::Medium
    } else {
        RiskLevel::Low
    };
    let by_trend = match a.time_to_oom_seconds {
        Some(tto) if tto <= th.medium_tto_seconds => {
            let raw = if tto <= th.critical_tto_seconds {
                RiskLevel::Critical
            } else if tto <= th.high_tto_seconds {
                RiskLevel::High
            } else {
                RiskLevel::Medium
            };
            // An uncertain trend may warn, but not alarm.
            if trend_confidence >= th.min_confidence {
                raw
            } else if trend_confidence >= th.min_confidence / 2.0 {
                raw.min(RiskLevel::Medium)
            } else {
                RiskLevel::Low
            }
        }
        _ => RiskLevel::Low,
    };

    if by_trend > by_level {
        a.risk = by_trend;
        a.confidence = trend_confidence;
        a.reason = format!(
            "memory grows {}, OOM predicted in {}",
            memprof_api::format_rate(a.growth_bytes_per_second),
            memprof_api::format_duration(a.time_to_oom_seconds.unwrap_or(f64::INFINITY))
        );
    } else {
        a.risk = by_level;
        // A level is a measurement; for `low`, trust grows with what we watched.
        a.confidence = if by_level > RiskLevel::Low {
            1.0
        } else {
            span_factor
        };
        a.reason = format!("{:.1}% of GPU memory in use", fraction * 100.0);
    }
    if !trend_confidence.is_finite() {
        a.confidence = 0.0;
    }
    a.confidence = a.confidence.clamp(0.0, 1.0);
    a
}

/// Rises of the lower envelope that make a leak, not a change of workload.
pub const MIN_LEAK_RISES: usize = 3;

/// Whether the lower envelope rises again and again, and still does. Through
/// NVML a leak and a workload that grew (a larger batch, longer sequences)
/// both raise the floor in the allocator's segment-sized steps; what tells
/// them apart is that a leak does not stop: at least [`MIN_LEAK_RISES`] rises
/// in the window, the last one no longer ago than twice the usual gap
/// between rises (and at least the trust span). A batch that grew twice, then
/// trains on, is not called a leak; a ramp of three or more steps is, until
/// it has been flat for twice its step interval (NVML alone cannot tell
/// better: docs/analysis.md).
fn keeps_rising(lower: &[(f64, f64)], th: &Thresholds) -> bool {
    let min_rise = 0.5 * th.leak_bytes_per_second * th.bucket_seconds;
    let rises: Vec<f64> = lower
        .windows(2)
        .filter(|w| w[1].1 - w[0].1 >= min_rise)
        .map(|w| w[1].0)
        .collect();
    let (Some(last_rise), Some(now)) = (rises.last(), lower.last().map(|p| p.0)) else {
        return false;
    };
    if rises.len() < MIN_LEAK_RISES {
        return false;
    }
    let mut gaps: Vec<f64> = rises.windows(2).map(|w| w[1] - w[0]).collect();
    gaps.sort_by(f64::total_cmp);
    let usual_gap = gaps[gaps.len() / 2];
    now - last_rise <= (2.0 * usual_gap).max(th.trust_span_seconds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Sample;

    const GB: f64 = 1e9;
    const TOTAL: u64 = 80_000_000_000;

    fn run(
        th: &Thresholds,
        secs: f64,
        hz: f64,
        used: impl Fn(f64) -> f64,
    ) -> (GpuSeries, Vec<Assessment>) {
        let mut s = GpuSeries::new(th);
        let mut out = vec![];
        let n = (secs * hz) as usize;
        for i in 0..=n {
            let t = i as f64 / hz;
            s.push(Sample {
                t,
                used: used(t).clamp(0.0, TOTAL as f64) as u64,
                total: TOTAL,
            });
            if i % (hz as usize) == 0 {
                out.push(assess(&s, th));
            }
        }
        (s, out)
    }

    /// Forward/backward saw-tooth with a 2 s step on top of 40 GB of weights and cache.
    fn training(t: f64) -> f64 {
        40.0 * GB + 20.0 * GB * ((t % 2.0) / 2.0)
    }

    #[test]
    fn periodic_training_without_a_leak_stays_low() {
        let th = Thresholds::default();
        let (_, all) = run(&th, 1800.0, 10.0, training);
        for a in &all {
            assert!(a.risk <= RiskLevel::Low, "{a:?}");
            assert!(!a.leak_suspected, "{a:?}");
        }
        assert!(all.last().unwrap().confidence > 0.9);
    }

    #[test]
    fn warm_up_staircase_then_flat_is_not_a_trend() {
        let th = Thresholds::default();
        // Allocator reserves in steps for 30 s, then stays flat (what NVML sees).
        let (_, all) = run(&th, 900.0, 1.0, |t| {
            if t < 30.0 {
                10.0 * GB + (t / 5.0).floor() * 5.0 * GB
            } else {
                40.0 * GB
            }
        });
        // While it rises, warm-up is growth, but too short to be trusted: at most medium.
        assert!(all[..40].iter().all(|a| a.risk <= RiskLevel::Medium));
        // The known cost of reading staircases (see `assess`): a gradual
        // warm-up that does not start from an idle GPU looks like a staircase
        // leak until a minute of flat envelope shows no next step; real
        // trainers jump from idle, and that start is ignored altogether
        // (`a_trainer_starting_on_an_idle_gpu_is_not_a_trend`). After that
        // minute, and for good, the flat envelope wins.
        for a in &all[100..] {
            assert!(a.risk <= RiskLevel::Low, "{a:?}");
        }
    }

    #[test]
    fn a_trainer_starting_on_an_idle_gpu_is_not_a_trend() {
        let th = Thresholds::default();
        // Idle for 15 s, then 0 to 30 GB in 5 s, then training: seen on every real start.
        let (_, all) = run(&th, 300.0, 10.0, |t| match t {
            t if t < 15.0 => 0.0,
            t if t < 20.0 => (t - 15.0) * 6.0 * GB,
            t => training(t) * 0.75,
        });
        for a in &all {
            assert!(a.risk <= RiskLevel::Low, "{a:?}");
            assert!(!a.leak_suspected && !a.spike_detected, "{a:?}");
        }
    }

    #[test]
    fn a_linear_leak_is_predicted_within_20_percent_after_two_minutes() {
        let th = Thresholds::default();
        let rate = 100e6; // 100 MB/s on top of the training pattern
        let leak = |t: f64| training(t) * 0.5 + rate * t;
        // Truth: the upper envelope (30 GB + 100 MB/s * t) reaches 80 GB at t = 500 s.
        let truth_oom = (TOTAL as f64 - 30.0 * GB) / rate;
        let (_, all) = run(&th, 400.0, 10.0, leak);
        let at = |t: usize| &all[t];
        let a = at(120);
        let tto = a.time_to_oom_seconds.expect("a trend after 2 minutes");
        let truth = truth_oom - 120.0;
        assert!(
            (tto - truth).abs() <= 0.2 * truth,
            "tto {tto} vs truth {truth}"
        );
        assert!(a.leak_suspected);
        // High at least a minute before the OOM, critical before it.
        let first_high = all.iter().position(|a| a.risk >= RiskLevel::High).unwrap() as f64;
        assert!(truth_oom - first_high >= 60.0, "first high at {first_high}");
    }

    /// What NVML sees when the batch size grows twice (no leak): the
    /// allocator's reserved memory in two steps, then flat. Before the
    /// recurring-rises rule this was a leak for two minutes.
    #[test]
    fn a_batch_that_grew_twice_is_not_a_leak_but_a_ramp_that_goes_on_is() {
        let th = Thresholds::default();
        let (_, all) = run(&th, 900.0, 10.0, |t| match t {
            t if t < 120.0 => 30.0 * GB,
            t if t < 240.0 => 42.0 * GB,
            _ => 54.0 * GB,
        });
        assert!(
            all.iter().all(|a| !a.leak_suspected),
            "two steps called a leak"
        );
        // A leak seen through the allocator: a 4 GB step every 40 s.
        let (_, all) = run(&th, 400.0, 10.0, |t| {
            30.0 * GB + 4.0 * GB * (t / 40.0).floor()
        });
        let first = all
            .iter()
            .position(|a| a.leak_suspected)
            .expect("a staircase leak");
        assert!(first <= 130, "flagged after {first} s");
        assert!(all[first..].iter().all(|a| a.leak_suspected));
        // A ramp of four steps, then flat: a leak while it rises, not for long after.
        let (_, all) = run(&th, 600.0, 10.0, |t| {
            30.0 * GB + 4.0 * GB * (t / 40.0).floor().min(4.0)
        });
        assert!(all[150].leak_suspected);
        assert!(all[160 + 100..].iter().all(|a| !a.leak_suspected));
    }

    #[test]
    fn a_late_spike_is_flagged_and_its_level_counts() {
        let th = Thresholds::default();
        let (_, all) = run(&th, 600.0, 10.0, |t| {
            if t > 500.0 {
                77.0 * GB
            } else {
                training(t)
            }
        });
        let last = all.last().unwrap();
        assert!(last.spike_detected);
        assert_eq!(last.risk, RiskLevel::High);
        assert!(!all[400].spike_detected);
    }

    #[test]
    fn near_the_ceiling_is_critical_whatever_the_trend() {
        let th = Thresholds::default();
        let (_, all) = run(&th, 60.0, 1.0, |_| 79.5 * GB);
        assert_eq!(all.last().unwrap().risk, RiskLevel::Critical);
        assert_eq!(all.last().unwrap().confidence, 1.0);
    }

    #[test]
    fn no_samples_means_no_risk_and_no_confidence() {
        let th = Thresholds::default();
        let a = assess(&GpuSeries::new(&th), &th);
        assert_eq!(a.risk, RiskLevel::None);
        assert_eq!(a.confidence, 0.0);
    }

    #[test]
    fn thresholds_are_validated() {
        assert!(Thresholds::default().validate().is_ok());
        let bad = Thresholds {
            high_fraction: 0.99,
            ..Default::default()
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("medium <= high <= critical"));
        let bad = Thresholds {
            bucket_seconds: 0.0,
            ..Default::default()
        };
        assert!(bad.validate().is_err());
    }
}
