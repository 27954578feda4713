//! What people use today, computed from the same NVML traces, so the
//! judge can put memprof's verdicts beside them:
//!
//! - [`used_alert`]: an alert on device memory used over 90 % of the total,
//!   as dcgm-exporter users write it (`DCGM_FI_DEV_FB_USED /
//!   (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE) > 0.9`): high while it
//!   holds, no time to OOM, no leak flag;
//! - [`linear`]: a straight line through the last [`LINEAR_WINDOW_SECONDS`]
//!   of device used (least squares, as Prometheus' `predict_linear`),
//!   extrapolated to the total: its time to OOM, and the level memprof's own
//!   thresholds give that time (critical, high, medium at or under
//!   `critical_tto_seconds`, `high_tto_seconds`, `medium_tto_seconds`), so
//!   the two differ by the estimate, not by the level table.
//!
//! Both read once per second of trace, as the replay does, and give
//! [`Replay`]s the judge scores like memprof's.

use super::recording::Recording;
use super::replay::{Reading, Replay};
use memprof_api::thresholds::Thresholds;
use memprof_api::RiskLevel;

/// The share of device memory used at which the dcgm-exporter alert fires.
pub const USED_ALERT_FRACTION: f64 = 0.90;

/// The straight line's window. 30 s: the causes recorded live 55-90 s and
/// begin mid-run, so a window of minutes (what `predict_linear` is often
/// given) would still average the flat start when the OOM is half a life
/// away; a window of a few seconds follows each step's sawtooth. Chosen
/// before judging, not tuned on the recordings.
pub const LINEAR_WINDOW_SECONDS: f64 = 30.0;

/// Device memory, summed over the recording's GPUs at one time.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Point {
    t: f64,
    used: f64,
    total: f64,
}

/// One point per sample time: the trace's GPUs added (the recordings have one).
fn points(rec: &Recording) -> Vec<Point> {
    let mut out: Vec<Point> = Vec::new();
    for r in &rec.rows {
        match out.last_mut() {
            Some(p) if p.t == r.t => {
                p.used += r.used_bytes as f64;
                p.total += r.total_bytes as f64;
            }
            _ => out.push(Point {
                t: r.t,
                used: r.used_bytes as f64,
                total: r.total_bytes as f64,
            }),
        }
    }
    out
}

/// Calls `f` with the points up to each analysis (once per second of trace).
fn each_second(rec: &Recording, mut f: impl FnMut(&[Point]) -> Reading) -> Replay {
    let pts = points(rec);
    let mut readings = Vec::new();
    let mut next = f64::NEG_INFINITY;
    for i in 0..pts.len() {
        if pts[i].t >= next {
            next = pts[i].t + 1.0;
            readings.push(f(&pts[..=i]));
        }
    }
    Replay {
        readings,
        allocator: None,
    }
}

fn reading(t: f64, risk: RiskLevel, tto: Option<f64>) -> Reading {
    Reading {
        t,
        leak: false,
        risk,
        tto,
        from_agent: false,
        cause: None,
        pid: None,
    }
}

/// The dcgm-exporter alert: high while used ≥ 90 % of the total.
pub fn used_alert(rec: &Recording) -> Replay {
    each_second(rec, |pts| {
        let p = pts[pts.len() - 1];
        let fired = p.total > 0.0 && p.used >= USED_ALERT_FRACTION * p.total;
        let risk = if fired {
            RiskLevel::High
        } else {
            RiskLevel::Low
        };
        reading(p.t, risk, None)
    })
}

/// Least-squares slope of used over the points, bytes per second.
fn slope(pts: &[Point]) -> Option<f64> {
    let n = pts.len() as f64;
    if pts.len() < 2 {
        return None;
    }
    let mt = pts.iter().map(|p| p.t).sum::<f64>() / n;
    let mu = pts.iter().map(|p| p.used).sum::<f64>() / n;
    let var: f64 = pts.iter().map(|p| (p.t - mt).powi(2)).sum();
    let cov: f64 = pts.iter().map(|p| (p.t - mt) * (p.used - mu)).sum();
    (var > 0.0).then(|| cov / var)
}

/// The level `th`'s time-to-OOM thresholds give `tto`.
fn level_of_tto(tto: f64, th: &Thresholds) -> RiskLevel {
    if tto <= th.critical_tto_seconds {
        RiskLevel::Critical
    } else if tto <= th.high_tto_seconds {
        RiskLevel::High
    } else if tto <= th.medium_tto_seconds {
        RiskLevel::Medium
    } else {
        RiskLevel::Low
    }
}

/// The straight line through the last [`LINEAR_WINDOW_SECONDS`] to the total.
pub fn linear(rec: &Recording, th: &Thresholds) -> Replay {
    each_second(rec, |pts| {
        let p = pts[pts.len() - 1];
        let from = pts.partition_point(|q| q.t < p.t - LINEAR_WINDOW_SECONDS);
        let tto = slope(&pts[from..])
            .filter(|s| *s > 0.0)
            .map(|s| ((p.total - p.used) / s).max(0.0));
        let risk = tto.map_or(RiskLevel::Low, |x| level_of_tto(x, th));
        reading(p.t, risk, tto)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evaluate::recording::read_fixture;

    const GB: u64 = 1_000_000_000;

    /// A one-GPU trace of 100 GB: `used(t)` GB each second for `n` s.
    fn trace(n: usize, used: impl Fn(f64) -> f64) -> Recording {
        let mut text = String::from("t_s,gpu,used_bytes,total_bytes\n");
        for i in 0..n {
            let t = i as f64;
            text.push_str(&format!(
                "{t},0,{},{}\n",
                (used(t) * GB as f64) as u64,
                100 * GB
            ));
        }
        read_fixture("t.csv", &text).unwrap()
    }

    fn first_high(r: &Replay) -> Option<f64> {
        r.readings
            .iter()
            .find(|x| x.risk >= RiskLevel::High)
            .map(|x| x.t)
    }

    #[test]
    fn the_used_alert_fires_at_90_percent_and_not_before() {
        // 1 GB/s from 50.5 GB: 89.5 GB at 39 s, 90.5 GB at 40 s.
        let r = used_alert(&trace(45, |t| 50.5 + t));
        assert_eq!(first_high(&r), Some(40.0));
        assert!(r.readings.iter().all(|x| x.tto.is_none() && !x.leak));
        // Flat at 89 %: never.
        assert_eq!(first_high(&used_alert(&trace(60, |_| 89.0))), None);
    }

    #[test]
    fn the_straight_line_extrapolates_the_window_to_the_total() {
        // Flat at 20 GB for 40 s, then 1 GB/s: the window holds only the
        // ramp 30 s after it began, and its TTO is then exact.
        let r = linear(
            &trace(90, |t| 20.0 + (t - 40.0).max(0.0)),
            &Thresholds::default(),
        );
        let at = |t: f64| r.readings.iter().find(|x| x.t == t).unwrap();
        let tto = at(70.0).tto.unwrap();
        assert!((tto - 50.0).abs() < 1e-6, "{tto}");
        // Inside the window's first 30 s of ramp, the flat start still
        // slows the slope: the TTO is too long.
        assert!(at(50.0).tto.unwrap() > 70.0);
        // Flat: no TTO, low.
        let flat = linear(&trace(60, |_| 50.0), &Thresholds::default());
        assert!(flat
            .readings
            .iter()
            .all(|x| x.tto.is_none() && x.risk == RiskLevel::Low));
    }

    #[test]
    fn the_straight_line_uses_memprofs_tto_thresholds() {
        let th = Thresholds::default();
        assert_eq!(
            level_of_tto(th.critical_tto_seconds, &th),
            RiskLevel::Critical
        );
        assert_eq!(level_of_tto(th.high_tto_seconds, &th), RiskLevel::High);
        assert_eq!(
            level_of_tto(th.high_tto_seconds + 1.0, &th),
            RiskLevel::Medium
        );
        assert_eq!(
            level_of_tto(th.medium_tto_seconds + 1.0, &th),
            RiskLevel::Low
        );
    }
}
