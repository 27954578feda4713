//! The one memory model: peak memory as a function of one knob (batch size,
//! sequence length), shared by `memprof sweep`, the operator's
//! `batchRecommendation` (`scaleBatch mode: fit`) and `memprof policy
//! explain`. Pure: points in, a curve, its error and what it may be used
//! for out.
//!
//! Why it is built this way (a line through an
//! eager-attention sweep called a crashing value safe):
//! - **Curvature is allowed**: `peak = static + a·x + b·x²` with `b ≥ 0`.
//!   Activations are linear in the batch, attention scores quadratic in the
//!   sequence length; memory never grows slower than linearly, so a concave
//!   fit is rejected (it would under-predict every value above the data).
//! - **Chosen by held-out points, not R²**: each family is refitted without
//!   each point in turn (leave-one-out) and judged by how well it predicted
//!   the point it did not see. A quadratic must beat the line by a clear
//!   factor ([`OCCAM`]); a quadratic is only tried with four points or more,
//!   so that it, too, can be held out.
//! - **Wrong models are refused**: a static part more negative than the
//!   model's own error (weights and optimizer state are not negative), or a
//!   residual that grows at the top (fitted on the smaller values, the model
//!   under-predicts the largest by more than noise), mean the curve is not
//!   the memory law; [`fit`] says why and no value is predicted.
//! - **No further than the data supports**: a value between tested values is
//!   interpolated; above the largest (or below the smallest) the model may go
//!   one step, the distance its own held-out check covered (predicting the
//!   end point from the others), and only when that check passed. Two points
//!   give no held-out check: interpolation only. Every prediction says where
//!   it stands ([`Support`]) and carries a margin: the worst held-out error
//!   (at least the noise floor), doubled at a full step of extrapolation.

use serde::{Deserialize, Serialize};

mod lsq;
mod support;
use lsq::distinct_x;
pub use lsq::least_squares;
pub use support::Support;

/// Noise under which two peaks are the same, bytes: the caching allocator
/// rounds to 2 MiB blocks and 20 MiB buffers, the H100 LoRA sweeps repeat
/// their reserved peaks within ~30 MiB, recorded tables round to 0.1 GiB,
/// and an NVML peak sampled every 100 ms can miss a short spike.
pub const NOISE_FLOOR_BYTES: f64 = 128.0 * 1024.0 * 1024.0;
/// The noise floor also scales with the peak: 0.25 % of the largest one.
pub const NOISE_FLOOR_FRACTION: f64 = 0.0025;
/// A quadratic is chosen over the line only when its held-out error is
/// below this fraction of the line's (a curve has one more way to fit noise).
pub const OCCAM: f64 = 0.7;

/// The shape of the curve.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Family {
    /// `static + a·x`.
    #[default]
    Linear,
    /// `static + a·x + b·x²`, `b ≥ 0`.
    Quadratic,
}

impl Family {
    /// Coefficients fitted.
    fn params(self) -> usize {
        match self {
            Family::Linear => 2,
            Family::Quadratic => 3,
        }
    }

    /// The word in outputs.
    pub fn word(self) -> &'static str {
        match self {
            Family::Linear => "linear",
            Family::Quadratic => "quadratic",
        }
    }
}

/// `peak = static + perUnit·x + perUnitSquared·x²`, bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Curve {
    /// Which family.
    pub family: Family,
    /// Bytes at x = 0 (weights, gradients, optimizer state, context).
    pub static_bytes: f64,
    /// Bytes per unit of x.
    pub per_unit_bytes: f64,
    /// Bytes per unit of x² (0 for a line).
    #[serde(default)]
    pub per_unit_squared_bytes: f64,
}

impl Curve {
    /// The predicted peak at `x`.
    pub fn at(&self, x: f64) -> f64 {
        self.static_bytes + self.per_unit_bytes * x + self.per_unit_squared_bytes * x * x
    }

    /// The slope at `x`, bytes per unit.
    pub fn slope_at(&self, x: f64) -> f64 {
        self.per_unit_bytes + 2.0 * self.per_unit_squared_bytes * x
    }

    /// The curve in words: `2.1GiB + 5.3GiB × B` or `… + 1.2MiB × S²`.
    pub fn describe(&self, var: &str) -> String {
        let mut s = format!(
            "{} + {} × {var}",
            signed_bytes(self.static_bytes),
            signed_bytes(self.per_unit_bytes)
        );
        if self.family == Family::Quadratic {
            s.push_str(&format!(
                " + {} × {var}²",
                signed_bytes(self.per_unit_squared_bytes)
            ));
        }
        s
    }
}

/// One point predicted by the model fitted without it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HeldOut {
    /// The value held out.
    pub x: f64,
    /// Its measured peak, bytes.
    pub actual_bytes: f64,
    /// What the others predicted, bytes.
    pub predicted_bytes: f64,
}

impl HeldOut {
    /// Measured minus predicted: positive when the model under-predicted.
    pub fn residual(&self) -> f64 {
        self.actual_bytes - self.predicted_bytes
    }
}

/// A fitted model and what it may be used for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Model {
    /// The curve.
    pub curve: Curve,
    /// Points fitted.
    pub n: usize,
    /// Smallest and largest value fitted.
    pub x_min: f64,
    /// See `x_min`.
    pub x_max: f64,
    /// Root mean square of the in-sample residuals, bytes.
    pub rms_residual_bytes: f64,
    /// Largest absolute in-sample residual, bytes.
    pub max_residual_bytes: f64,
    /// Each point predicted without it (empty with too few points).
    pub held_out: Vec<HeldOut>,
    /// Root mean square of the held-out residuals, bytes; null without them.
    pub held_out_rms_bytes: Option<f64>,
    /// Error added to every prediction inside the data: the worst held-out
    /// error, at least the noise floor, bytes.
    pub margin_bytes: f64,
    /// Lowest value the evidence backs (a step below the data when the
    /// held-out check at the bottom passed, else `xMin`).
    pub support_min: f64,
    /// Highest value the evidence backs (a step above the data when the
    /// held-out check at the top passed, else `xMax`).
    pub support_max: f64,
    /// Why this family, and why the others were refused.
    pub notes: Vec<String>,
}

/// Why no model: what was tried and what was wrong with it.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{why}")]
pub struct NoModel {
    /// One sentence for the user.
    pub why: String,
}

/// A prediction at one value.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Prediction {
    /// The value.
    pub x: f64,
    /// The predicted peak (at a measured value: the higher of the
    /// prediction and the measurement), bytes.
    pub peak_bytes: f64,
    /// The error allowed for, bytes.
    pub margin_bytes: f64,
    /// Where the value stands.
    pub support: Support,
}

impl Prediction {
    /// Whether the peak plus its margin stays at or under `target`, support
    /// aside: check [`Support::backed`] before acting on it.
    pub fn fits(&self, target: f64) -> bool {
        self.peak_bytes + self.margin_bytes <= target
    }

    /// Whether the peak minus its margin is still over `target`: the model
    /// is sure this value does not fit.
    pub fn surely_over(&self, target: f64) -> bool {
        self.peak_bytes - self.margin_bytes > target
    }
}

/// The noise floor of a set of peaks.
pub fn noise_floor(points: &[(f64, f64)]) -> f64 {
    let top = points.iter().map(|p| p.1).fold(0.0, f64::max);
    NOISE_FLOOR_BYTES.max(NOISE_FLOOR_FRACTION * top)
}

/// Fits the model to `(value, peak bytes)` points that ran. Points that
/// are not finite, or at a negative value, are ignored.
pub fn fit(points: &[(f64, f64)]) -> Result<Model, NoModel> {
    let mut pts: Vec<(f64, f64)> = points
        .iter()
        .copied()
        .filter(|(x, y)| x.is_finite() && y.is_finite() && *x >= 0.0)
        .collect();
    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    let distinct = distinct_x(&pts);
    if distinct < 2 {
        return Err(NoModel {
            why: format!(
                "{distinct} value(s) measured: a model needs at least two different values"
            ),
        });
    }
    let floor = noise_floor(&pts);
    let mut notes = vec![];
    let mut valid = vec![];
    for family in [Family::Linear, Family::Quadratic] {
        // A quadratic through three points has nothing left to hold out.
        if family == Family::Quadratic && distinct < 4 {
            continue;
        }
        let Some(c) = candidate(&pts, family) else {
            continue;
        };
        match refusal(&c, &pts, floor) {
            Some(why) => notes.push(format!("{} refused: {why}", family.word())),
            None => valid.push(c),
        }
    }
    let chosen = choose(valid, floor, &mut notes).ok_or_else(|| NoModel {
        why: if notes.is_empty() {
            "no model could be fitted".into()
        } else {
            notes.join("; ")
        },
    })?;
    Ok(finish(chosen, &pts, floor, notes))
}

/// A family fitted to all points, with its held-out predictions.
#[derive(Clone, Debug)]
struct Candidate {
    curve: Curve,
    held_out: Vec<HeldOut>,
}

impl Candidate {
    fn held_out_rms(&self) -> Option<f64> {
        let n = self.held_out.len();
        (n > 0).then(|| {
            (self
                .held_out
                .iter()
                .map(|h| h.residual().powi(2))
                .sum::<f64>()
                / n as f64)
                .sqrt()
        })
    }
}

fn candidate(pts: &[(f64, f64)], family: Family) -> Option<Candidate> {
    let curve = least_squares(pts, family)?;
    let mut held_out = vec![];
    if distinct_x(pts) > family.params() {
        // Every measurement at a value is held out together (against the
        // highest of them): a repeat left in would vouch for itself, and
        // the check at the top would pass on the value it is to test.
        let mut xs: Vec<f64> = pts.iter().map(|p| p.0).collect();
        xs.dedup();
        for x in xs {
            let rest: Vec<(f64, f64)> = pts.iter().copied().filter(|p| p.0 != x).collect();
            let actual = pts
                .iter()
                .filter(|p| p.0 == x)
                .map(|p| p.1)
                .fold(f64::MIN, f64::max);
            let c = least_squares(&rest, family)?;
            held_out.push(HeldOut {
                x,
                actual_bytes: actual,
                predicted_bytes: c.at(x),
            });
        }
    }
    Some(Candidate { curve, held_out })
}

/// Why a fitted family is not the memory law, if it is not.
fn refusal(c: &Candidate, pts: &[(f64, f64)], floor: f64) -> Option<String> {
    let curve = c.curve;
    let x_max = pts.last().map_or(0.0, |p| p.0);
    if curve.slope_at(x_max) <= 0.0 {
        return Some(format!(
            "the peak does not grow at the largest value ({} per unit there)",
            signed_bytes(curve.slope_at(x_max))
        ));
    }
    if curve.family == Family::Quadratic && curve.per_unit_squared_bytes < 0.0 {
        return Some(
            "it bends down (memory that grows ever slower is not a memory law; \
             it would under-predict every larger value)"
                .into(),
        );
    }
    let tolerance = floor.max(c.held_out_rms().unwrap_or(0.0));
    if curve.static_bytes < -tolerance {
        return Some(format!(
            "its static part {} is negative by more than its own error {} \
             (weights and optimizer state are not negative): the curve is not the memory law",
            signed_bytes(curve.static_bytes),
            bytes(tolerance)
        ));
    }
    let rms = in_sample(&curve, pts).0;
    if let Some(top) = c.held_out.last() {
        if top.residual() > floor.max(2.0 * rms) {
            return Some(format!(
                "the residual grows at the top: fitted on the smaller values it predicts {} at {} \
                 where {} was measured ({} short)",
                bytes(top.predicted_bytes),
                num(top.x),
                bytes(top.actual_bytes),
                bytes(top.residual())
            ));
        }
    }
    None
}

/// The valid family with the best held-out error (a quadratic only when
/// it beats the line by [`OCCAM`] and the line misses by more than noise).
fn choose(mut valid: Vec<Candidate>, floor: f64, notes: &mut Vec<String>) -> Option<Candidate> {
    if valid.len() == 2 {
        let (l, q) = (valid[0].held_out_rms(), valid[1].held_out_rms());
        if let (Some(l), Some(q)) = (l, q) {
            // Under the noise floor the line is as good as measurement allows.
            let quad = q < OCCAM * l && l > floor;
            notes.push(format!(
                "held-out error: linear {}, quadratic {}: {}",
                bytes(l),
                bytes(q),
                if quad {
                    "the curve predicts unseen points better"
                } else {
                    "the line does as well"
                }
            ));
            return Some(valid.swap_remove(usize::from(quad)));
        }
    }
    valid.into_iter().next()
}

fn in_sample(curve: &Curve, pts: &[(f64, f64)]) -> (f64, f64) {
    let r: Vec<f64> = pts.iter().map(|p| p.1 - curve.at(p.0)).collect();
    let rms = (r.iter().map(|x| x * x).sum::<f64>() / r.len().max(1) as f64).sqrt();
    (rms, r.iter().fold(0.0, |m, x| m.max(x.abs())))
}

/// The model of the chosen candidate: margin and support.
fn finish(c: Candidate, pts: &[(f64, f64)], floor: f64, notes: Vec<String>) -> Model {
    let (rms, max) = in_sample(&c.curve, pts);
    let worst = c
        .held_out
        .iter()
        .map(|h| h.residual().abs())
        .fold(0.0, f64::max);
    let n = pts.len();
    let (x_min, x_max) = (pts[0].0, pts[n - 1].0);
    // Each end may be extended by the step its held-out check covered,
    // when the model did not under-predict that end by more than noise.
    let step_ok = |h: Option<&HeldOut>| h.is_some_and(|h| h.residual() <= floor.max(2.0 * rms));
    let second = pts
        .iter()
        .map(|p| p.0)
        .find(|x| *x > x_min)
        .unwrap_or(x_min);
    let before_last = pts
        .iter()
        .rev()
        .map(|p| p.0)
        .find(|x| *x < x_max)
        .unwrap_or(x_max);
    let support_min = if step_ok(c.held_out.first()) {
        (x_min - (second - x_min)).max(0.0)
    } else {
        x_min
    };
    let support_max = if step_ok(c.held_out.last()) {
        x_max + (x_max - before_last)
    } else {
        x_max
    };
    Model {
        curve: c.curve,
        n,
        x_min,
        x_max,
        rms_residual_bytes: rms,
        max_residual_bytes: max,
        held_out_rms_bytes: c.held_out_rms(),
        margin_bytes: floor.max(worst),
        held_out: c.held_out,
        support_min,
        support_max,
        notes,
    }
}

impl Model {
    /// A model rebuilt from what a status kept of it (no held-out detail,
    /// no notes): the curve, its margin and the ranges it was fitted on and
    /// is backed over.
    pub fn from_parts(
        curve: Curve,
        n: usize,
        measured: (f64, f64),
        margin: f64,
        backed: (f64, f64),
    ) -> Model {
        Model {
            curve,
            n,
            x_min: measured.0,
            x_max: measured.1,
            rms_residual_bytes: 0.0,
            max_residual_bytes: 0.0,
            held_out: vec![],
            held_out_rms_bytes: None,
            margin_bytes: margin,
            support_min: backed.0.min(measured.0),
            support_max: backed.1.max(measured.1),
            notes: vec![],
        }
    }

    /// Where `x` stands, and the predicted peak with its margin; `measured`
    /// is the peak measured at `x`, if any.
    pub fn predict(&self, x: f64, measured: Option<f64>) -> Prediction {
        let model = self.curve.at(x);
        let (support, scale) = self.support_of(x, measured.is_some());
        Prediction {
            x,
            peak_bytes: measured.map_or(model, |m| m.max(model)),
            margin_bytes: self.margin_bytes * scale,
            support,
        }
    }

    /// Support and margin scale: 1 inside, growing by 1 per step out (a
    /// step: what the held-out check covered, else the data's mean gap), so
    /// 2 at the end of the supported reach.
    fn support_of(&self, x: f64, measured: bool) -> (Support, f64) {
        if measured {
            return (Support::Measured, 1.0);
        }
        if (self.x_min..=self.x_max).contains(&x) {
            return (Support::Interpolated, 1.0);
        }
        let (from, reach) = if x > self.x_max {
            (self.x_max, self.support_max - self.x_max)
        } else {
            (self.x_min, self.x_min - self.support_min)
        };
        let distance = x - from;
        let stride = if reach > 0.0 { reach } else { self.mean_gap() };
        let scale = 1.0 + distance.abs() / stride;
        if reach > 0.0 && distance.abs() <= reach * (1.0 + 1e-9) {
            (Support::Extrapolated { from, distance }, scale)
        } else {
            (Support::Unsupported { from, distance }, scale)
        }
    }

    /// The mean distance between fitted values.
    fn mean_gap(&self) -> f64 {
        ((self.x_max - self.x_min) / (self.n.max(2) - 1) as f64).max(f64::MIN_POSITIVE)
    }

    /// The largest value `k × step` (k ≥ 1) in `[lowest, highest]` that the
    /// evidence backs and whose peak plus margin stays at or under `target`;
    /// `measured(x)` gives the peak measured at `x`, if any. None when no
    /// such value exists. Memory does not shrink when the knob grows, so
    /// every smaller value fits too (its own support aside).
    pub fn largest_fitting(
        &self,
        lowest: f64,
        highest: f64,
        target: f64,
        step: f64,
        measured: impl Fn(f64) -> Option<f64>,
    ) -> Option<Prediction> {
        self.scan(
            lowest,
            highest.min(self.support_max),
            target,
            step,
            &measured,
            true,
        )
    }

    /// The largest value `k × step` in `[lowest, highest]` whose peak plus
    /// margin fits, *ignoring support*: beyond the data the margin keeps
    /// growing by one margin per step out. A value for a real run to try,
    /// never one to call safe.
    pub fn largest_to_try(
        &self,
        lowest: f64,
        highest: f64,
        target: f64,
        step: f64,
        measured: impl Fn(f64) -> Option<f64>,
    ) -> Option<Prediction> {
        let far = self.x_max + 64.0 * self.mean_gap().max(step);
        self.scan(lowest, highest.min(far), target, step, &measured, false)
    }

    fn scan(
        &self,
        lowest: f64,
        top: f64,
        target: f64,
        step: f64,
        measured: &dyn Fn(f64) -> Option<f64>,
        backed_only: bool,
    ) -> Option<Prediction> {
        if !(step > 0.0 && step.is_finite() && top.is_finite()) {
            return None;
        }
        let floor = if backed_only { self.support_min } else { 0.0 };
        let bottom = lowest.max(floor).max(step);
        let mut k = (top / step).floor();
        // Bounded: a knob is never swept over more than a million steps.
        let mut left = 1_000_000u32;
        while k * step >= bottom && left > 0 {
            let x = k * step;
            let p = self.predict(x, measured(x));
            if (p.support.backed() || !backed_only) && p.fits(target) {
                return Some(p);
            }
            k -= 1.0;
            left -= 1;
        }
        None
    }
}

/// A value as written in a grid: integers without a fraction.
pub fn num(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{}", x as i64)
    } else {
        format!("{x:.3}")
    }
}

/// Bytes for humans, never negative (a negative input shows as 0B).
fn bytes(b: f64) -> String {
    memprof_api::format_bytes(b.max(0.0) as u64)
}

/// Bytes for humans with a sign: `-1.5GiB`.
pub fn signed_bytes(b: f64) -> String {
    if b < 0.0 {
        format!("-{}", memprof_api::format_bytes((-b) as u64))
    } else {
        memprof_api::format_bytes(b as u64)
    }
}

#[cfg(test)]
mod tests;
