//! The recorded calibration (bench/estimate/calibration.json, written by
//! bench/gpu/estimate_calibrate.py on a real GPU): the measured constants
//! (CUDA context, cuBLAS workspace, NCCL buffers) and the points, each a
//! real run's peaks beside the estimate of the same script. Built into the
//! binary, so every estimate can say its error on them.

use serde::{Deserialize, Serialize};
use std::path::Path;

/// The recorded file, as committed.
pub const RECORDED: &str = include_str!("../../../../../bench/estimate/calibration.json");

/// The calibration file.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Calibration {
    /// The GPU it was measured on.
    pub gpu: String,
    /// torch there.
    pub torch: String,
    /// The measured constants.
    pub constants: Constants,
    /// Real peaks beside estimates.
    pub points: Vec<Point>,
}

/// Bytes measured on the GPU, not modelled.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Constants {
    /// Device memory outside the allocator after training steps (context,
    /// cuBLAS handles, loaded kernels): the largest over the calibration split.
    pub context_bytes: u64,
    /// The cuBLAS workspace the allocator holds once matrix products ran.
    pub workspace_bytes: u64,
    /// NCCL's memory per rank beyond the context (2 GPUs, DDP), if measured.
    pub nccl_bytes: Option<u64>,
}

/// One configuration, run for real and estimated.
#[derive(Clone, Debug, Deserialize)]
pub struct Point {
    /// The configuration.
    pub name: String,
    /// `calibration` (may set constants) or `held-out` (sets nothing).
    pub split: String,
    /// The real run's peaks.
    pub real: Real,
    /// The estimate's peaks.
    pub estimate: Estimated,
}

/// A real run's peaks (torch.cuda.max_memory_allocated/reserved).
#[derive(Clone, Debug, Deserialize)]
pub struct Real {
    /// Peak allocated bytes.
    #[serde(default)]
    pub allocated: u64,
    /// Peak reserved bytes.
    #[serde(default)]
    pub reserved: u64,
    /// Why it did not run, if it did not.
    pub error: Option<serde_json::Value>,
}

/// The estimate's peaks for the same configuration.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Estimated {
    /// Modelled peak allocated bytes.
    #[serde(default)]
    pub allocated_peak_bytes: u64,
    /// Modelled peak reserved bytes.
    #[serde(default)]
    pub reserved_peak_bytes: u64,
    /// Why it did not run, if it did not.
    pub error: Option<serde_json::Value>,
}

/// How far the estimates were from the real peaks.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Accuracy {
    /// Where the points were measured.
    pub gpu: String,
    /// Points with both a real run and an estimate.
    pub points: usize,
    /// Of which held out (they set no constant).
    pub held_out: usize,
    /// Of the held-out, points profiled runs added (`--points`).
    pub profiled: usize,
    /// Median |error| of peak allocated over the held-out points, percent.
    pub median_allocated_pct: f64,
    /// Median |error| of peak reserved over the held-out points, percent.
    pub median_reserved_pct: f64,
    /// The largest under-estimate of peak allocated over all points, percent (>= 0).
    pub worst_allocated_under_pct: f64,
    /// The largest under-estimate of peak reserved over all points, percent
    /// (>= 0): the margin every verdict adds.
    pub worst_reserved_under_pct: f64,
    /// Held-out points that a margin from the calibration split alone would
    /// have called fitting on a card as small as their real peak.
    pub would_oom_with_calibration_margin: Vec<String>,
}

/// The recorded calibration; a build with a broken file cannot pass its tests.
pub fn recorded() -> Calibration {
    serde_json::from_str(RECORDED).expect("bench/estimate/calibration.json parses")
}

/// A calibration file that could not be used.
#[derive(Debug, thiserror::Error)]
#[error("cannot use --calibration {path}: {reason}; write one with `python3 bench/gpu/estimate_calibrate.py --out DIR` on the GPU (DIR/calibration.json)")]
pub struct BadCalibration {
    /// The file.
    pub path: String,
    /// Why.
    pub reason: String,
}

/// The calibration at `path` (one measured on the user's own cards), else the recorded one.
pub fn load(path: Option<&std::path::Path>) -> Result<Calibration, BadCalibration> {
    let Some(path) = path else {
        return Ok(recorded());
    };
    let bad = |reason: String| BadCalibration {
        path: path.display().to_string(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let c: Calibration = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    if usable(&c).is_empty() {
        return Err(bad("no point has both a real run and an estimate".into()));
    }
    Ok(c)
}

pub use crate::local::points::error_pct;
use crate::local::points::{Entry, Points, SPLIT_PROFILED};

/// The measured entries of a `--points` file as points (split
/// `profiled`: held out, they set no constant).
pub fn profiled(points: &Points) -> Vec<Point> {
    points.entries.iter().filter_map(point).collect()
}

fn point(e: &Entry) -> Option<Point> {
    let m = e.measured.as_ref()?;
    // The table's RUN column: the script's file name, then its arguments.
    let (script, rest) = e.command.split_once(' ').unwrap_or((&e.command, ""));
    let base = Path::new(script).file_name().and_then(|f| f.to_str());
    let mut name = format!("{} {rest}", base.unwrap_or(script))
        .trim()
        .to_string();
    if name.chars().count() > 40 {
        name = name.chars().take(39).collect::<String>() + "…";
    }
    Some(Point {
        name,
        split: SPLIT_PROFILED.into(),
        real: Real {
            allocated: m.peaks.allocated_bytes,
            reserved: m.peaks.reserved_bytes,
            error: None,
        },
        estimate: Estimated {
            allocated_peak_bytes: e.estimate.allocated_bytes,
            reserved_peak_bytes: e.estimate.reserved_bytes,
            error: None,
        },
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn worst_under(points: &[&Point], field: fn(&Point) -> (u64, u64)) -> f64 {
    points
        .iter()
        .map(|p| {
            let (est, real) = field(p);
            -error_pct(est, real)
        })
        .fold(0.0, f64::max)
}

fn allocated(p: &Point) -> (u64, u64) {
    (p.estimate.allocated_peak_bytes, p.real.allocated)
}

fn reserved(p: &Point) -> (u64, u64) {
    (p.estimate.reserved_peak_bytes, p.real.reserved)
}

/// The points that ran both ways.
pub fn usable(c: &Calibration) -> Vec<&Point> {
    let ok =
        |p: &&Point| p.real.error.is_none() && p.estimate.error.is_none() && p.real.reserved > 0;
    c.points.iter().filter(ok).collect()
}

/// The error table over the recorded points.
pub fn accuracy(c: &Calibration) -> Accuracy {
    let all = usable(c);
    // A profiled run's point set no constant either: it is held out.
    let is_held = |p: &&Point| p.split == "held-out" || p.split == SPLIT_PROFILED;
    let held: Vec<&Point> = all.iter().copied().filter(is_held).collect();
    let fit: Vec<&Point> = all.iter().copied().filter(|p| !is_held(p)).collect();
    let abs = |f: fn(&Point) -> (u64, u64)| {
        held.iter()
            .map(|p| {
                let (e, r) = f(p);
                error_pct(e, r).abs()
            })
            .collect::<Vec<_>>()
    };
    let fit_margin = worst_under(&fit, reserved) / 100.0;
    let would_oom = held
        .iter()
        .filter(|p| {
            (p.estimate.reserved_peak_bytes as f64) / (1.0 - fit_margin) < p.real.reserved as f64
        })
        .map(|p| p.name.clone())
        .collect();
    Accuracy {
        gpu: c.gpu.clone(),
        points: all.len(),
        held_out: held.len(),
        profiled: held.iter().filter(|p| p.split == SPLIT_PROFILED).count(),
        median_allocated_pct: median(abs(allocated)),
        median_reserved_pct: median(abs(reserved)),
        worst_allocated_under_pct: worst_under(&all, allocated),
        worst_reserved_under_pct: worst_under(&all, reserved),
        would_oom_with_calibration_margin: would_oom,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(name: &str, split: &str, est: u64, real: u64) -> Point {
        Point {
            name: name.into(),
            split: split.into(),
            real: Real {
                allocated: real,
                reserved: real,
                error: None,
            },
            estimate: Estimated {
                allocated_peak_bytes: est,
                reserved_peak_bytes: est,
                error: None,
            },
        }
    }

    fn calibration(points: Vec<Point>) -> Calibration {
        Calibration {
            gpu: "G".into(),
            torch: "2.11.0".into(),
            constants: Constants {
                context_bytes: 1,
                workspace_bytes: 2,
                nccl_bytes: None,
            },
            points,
        }
    }

    #[test]
    fn the_recorded_file_parses_and_has_held_out_points() {
        let c = recorded();
        let a = accuracy(&c);
        assert!(a.held_out >= 5, "{a:?}");
        assert!(c.constants.context_bytes > 0 && c.constants.workspace_bytes > 0);
    }

    /// The FSDP2 run on two GPUs is held out, and its reserved peak is
    /// under-estimated by less than the margin every verdict is judged
    /// with, so its "fits" would have held.
    #[test]
    fn the_recorded_fsdp2_run_is_held_out_and_inside_the_margin() {
        let c = recorded();
        let p = c
            .points
            .iter()
            .find(|p| p.name.starts_with("fsdp2-"))
            .expect("an FSDP2 point");
        assert_eq!(p.split, "held-out");
        let margin = accuracy(&c).worst_reserved_under_pct;
        let under = -error_pct(p.estimate.reserved_peak_bytes, p.real.reserved);
        assert!(under > 0.0 && under < margin, "{under} vs {margin}");
        assert!(error_pct(p.estimate.allocated_peak_bytes, p.real.allocated).abs() < 1.0);
    }

    #[test]
    fn medians_are_over_held_out_points_and_the_margin_over_all() {
        let c = calibration(vec![
            point("fit", "calibration", 80, 100), // -20 %: only in the margin
            point("a", "held-out", 99, 100),      // -1 %
            point("b", "held-out", 103, 100),     // +3 %
            point("c", "held-out", 95, 100),      // -5 %
        ]);
        let a = accuracy(&c);
        assert_eq!(a.median_reserved_pct, 3.0);
        assert_eq!(a.worst_reserved_under_pct, 20.0);
        assert!(a.would_oom_with_calibration_margin.is_empty());
    }

    #[test]
    fn a_held_out_point_beyond_the_calibration_margin_is_named() {
        let c = calibration(vec![
            point("fit", "calibration", 95, 100), // margin 5 %
            point("worse", "held-out", 80, 100),  // -20 %: would OOM
        ]);
        assert_eq!(
            accuracy(&c).would_oom_with_calibration_margin,
            vec!["worse"]
        );
        assert_eq!(accuracy(&c).worst_reserved_under_pct, 20.0);
    }

    /// A profiled run's point is held out: it counts in the median error
    /// and in the margin every verdict is judged with, named by its script.
    #[test]
    fn profiled_points_count_in_the_error_and_the_margin() {
        use crate::local::points::{Measured, Peaks};
        let mut cal = recorded();
        let before = accuracy(&cal);
        let g = 1u64 << 30;
        let mut points = Points::default();
        let peaks = |allocated, reserved| Peaks {
            allocated_bytes: allocated,
            reserved_bytes: reserved,
        };
        points.estimated(Entry {
            command: "/src/train.py --lr 3e-4".into(),
            world_size: 1,
            gpu: "H100-80GB".into(),
            estimate: peaks(40 * g, 50 * g),
            measured: None,
        });
        points.estimated(Entry {
            command: "pending.py".into(),
            world_size: 1,
            gpu: "H100-80GB".into(),
            estimate: peaks(g, g),
            measured: None,
        });
        points.entries[0].measured = Some(Measured {
            peaks: peaks(60 * g, 100 * g),
            on: "NVIDIA H200".into(),
        });
        let profiled = profiled(&points);
        assert_eq!(profiled.len(), 1, "only what a run measured");
        assert_eq!(profiled[0].name, "train.py --lr 3e-4");
        cal.points.extend(profiled);
        let after = accuracy(&cal);
        assert_eq!(after.held_out, before.held_out + 1);
        assert_eq!(after.profiled, 1);
        assert_eq!(after.worst_reserved_under_pct, 50.0, "{after:?}");
    }

    #[test]
    fn a_point_that_failed_is_left_out() {
        let mut p = point("x", "held-out", 50, 100);
        p.real.error = Some(serde_json::json!("exit 1"));
        assert_eq!(accuracy(&calibration(vec![p])).points, 0);
    }
}
