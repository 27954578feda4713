//! Where a sweep stands, and which run to try next: the model of
//! [`crate::memmodel`] proposes, real runs decide. After the grid, the value
//! the model predicts to be the largest that fits is run; a run that OOMs or
//! goes over the target becomes the bound, and the search goes on between
//! the largest value that ran under the target and that bound (bisection,
//! as Lightning's `BatchSizeFinder` does with real trials) wherever the
//! model cannot decide. Only a value seen to run under the target is ever
//! called safe. Pure: trials in, a verdict and the next trial out.

use crate::memmodel::{self, num, Model, NoModel, Prediction};
use serde::{Deserialize, Serialize};

/// How one run at one value ended, as the search uses it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Outcome {
    /// It ran to the end; its peak, bytes.
    Ran(f64),
    /// It hit a CUDA OOM (or its peak reached the device's ceiling).
    Oom,
}

/// The smallest value known not to fit, and how it is known.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum Bound {
    /// A run at it hit an OOM.
    Oom {
        /// The value.
        x: f64,
    },
    /// A run at it ran, above the target.
    OverTarget {
        /// The value.
        x: f64,
        /// Its peak, bytes.
        peak_bytes: f64,
    },
}

impl Bound {
    /// The value.
    pub fn x(&self) -> f64 {
        match *self {
            Bound::Oom { x } | Bound::OverTarget { x, .. } => x,
        }
    }
}

/// What to do next.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum Next {
    /// The search is over.
    Done {
        /// Why.
        why: String,
    },
    /// Run this value.
    Run {
        /// The value.
        x: f64,
        /// Why this one.
        why: String,
    },
}

/// The state of a search after some trials.
#[derive(Clone, Debug)]
pub struct State {
    /// The model of the runs that ran (or why none).
    pub model: Result<Model, NoModel>,
    /// The largest value that ran with its peak at or under the target,
    /// below the bound, and that peak: what may be called safe.
    pub safe: Option<(f64, f64)>,
    /// The smallest value that OOMed or ran over the target.
    pub bound: Option<Bound>,
    /// The model's largest backed value that fits, below the bound.
    pub predicted: Option<Prediction>,
    /// What to do next.
    pub next: Next,
}

/// The search over `trials` (every run at every value so far) for the
/// largest value whose peak stays at or under `target`, on the values
/// `k × step` (`None`: the tested values only, no search).
pub fn assess(trials: &[(f64, Outcome)], target: f64, step: Option<f64>) -> State {
    let ran: Vec<(f64, f64)> = trials
        .iter()
        .filter_map(|(x, o)| match o {
            Outcome::Ran(p) => Some((*x, *p)),
            Outcome::Oom => None,
        })
        .collect();
    let bound = bound_of(trials, target);
    let below = |x: f64| bound.is_none_or(|b| x < b.x());
    let safe = ran.iter().filter(|(x, p)| *p <= target && below(*x)).fold(
        None,
        |a: Option<(f64, f64)>, &(x, p)| match a {
            Some((ax, _)) if ax >= x => a,
            _ => Some((x, p)),
        },
    );
    let model = memmodel::fit(&ran);
    let measured = |x: f64| {
        ran.iter()
            .filter(|r| r.0 == x)
            .map(|r| r.1)
            .reduce(f64::max)
    };
    let highest = |step: f64| bound.map_or(f64::INFINITY, |b| b.x() - step);
    let (predicted, to_try) = match (&model, step) {
        (Ok(m), Some(step)) => (
            m.largest_fitting(0.0, highest(step), target, step, measured),
            m.largest_to_try(0.0, highest(step), target, step, measured),
        ),
        _ => (None, None),
    };
    let tried = |x: f64| trials.iter().any(|t| t.0 == x);
    let next = next_trial(&Ctx {
        model: model.as_ref().ok(),
        safe,
        bound,
        predicted,
        to_try,
        step,
        target,
        ran: &ran,
        tried: &tried,
    });
    State {
        model,
        safe,
        bound,
        predicted,
        next,
    }
}

fn bound_of(trials: &[(f64, Outcome)], target: f64) -> Option<Bound> {
    trials
        .iter()
        .filter_map(|(x, o)| match *o {
            Outcome::Oom => Some(Bound::Oom { x: *x }),
            Outcome::Ran(p) if p > target => Some(Bound::OverTarget {
                x: *x,
                peak_bytes: p,
            }),
            Outcome::Ran(_) => None,
        })
        .min_by(|a, b| a.x().total_cmp(&b.x()))
}

struct Ctx<'a> {
    model: Option<&'a Model>,
    safe: Option<(f64, f64)>,
    bound: Option<Bound>,
    predicted: Option<Prediction>,
    to_try: Option<Prediction>,
    step: Option<f64>,
    target: f64,
    ran: &'a [(f64, f64)],
    tried: &'a dyn Fn(f64) -> bool,
}

fn next_trial(c: &Ctx<'_>) -> Next {
    let Some(step) = c.step else {
        return done(
            "the values are not whole numbers on a common step: only tested values are judged",
        );
    };
    let lo = c.safe.map_or(0.0, |s| s.0);
    // The largest value the model, its margin growing with the distance,
    // expects to fit: a run tells whether it does.
    let candidate = c.to_try.or(c.predicted);
    if let Some(p) = candidate.filter(|p| p.x > lo && !(c.tried)(p.x)) {
        return Next::Run {
            x: p.x,
            why: format!(
                "the model predicts {} at {} (margin {}; {}): a run tells",
                bytes(p.peak_bytes),
                num(p.x),
                bytes(p.margin_bytes),
                p.support.describe()
            ),
        };
    }
    let v1 = lo + step;
    if let Some(b) = c.bound.filter(|b| v1 >= b.x()) {
        return done(&match c.safe {
            Some((s, _)) => format!(
                "{} ran under the target and the next value {} did not",
                num(s),
                num(b.x())
            ),
            None => format!(
                "even {} does not fit and nothing smaller is on the step {}",
                num(b.x()),
                num(step)
            ),
        });
    }
    if let Some(m) = c.model {
        let p = m.predict(v1, None);
        if p.support.backed() && p.surely_over(c.target) && !(c.tried)(v1) {
            return done(&format!(
                "the model is sure the next value {} does not fit (predicted {} ± {}, over {})",
                num(v1),
                bytes(p.peak_bytes),
                bytes(p.margin_bytes),
                bytes(c.target)
            ));
        }
    }
    match c.bound {
        Some(b) => bisect(lo, b.x(), step),
        None => explore(c.ran, lo, step, c.tried),
    }
}

/// The middle of (lo, hi) on the step, if a value lies strictly between.
fn bisect(lo: f64, hi: f64, step: f64) -> Next {
    let mut mid = (((lo + hi) / 2.0) / step).floor() * step;
    if mid <= lo {
        mid = lo + step;
    }
    if mid >= hi {
        return done(&format!(
            "no value on the step {} lies between {} and {}",
            num(step),
            num(lo),
            num(hi)
        ));
    }
    Next::Run {
        x: mid,
        why: format!(
            "the model cannot decide between {} (ran) and {} (did not): bisecting",
            num(lo),
            num(hi)
        ),
    }
}

/// One step up from the largest value that ran under the target (the
/// grid's last step, at least `step`), when nothing has failed yet.
fn explore(ran: &[(f64, f64)], lo: f64, step: f64, tried: &dyn Fn(f64) -> bool) -> Next {
    let below = ran
        .iter()
        .map(|r| r.0)
        .filter(|x| *x < lo)
        .fold(f64::NAN, f64::max);
    let stride = if below.is_finite() { lo - below } else { lo };
    let x = lo + ((stride / step).round() * step).max(step);
    if tried(x) {
        return done(&format!("{} was tried already", num(x)));
    }
    Next::Run {
        x,
        why: format!(
            "nothing failed yet and the model cannot say whether {} fits: one step up",
            num(x)
        ),
    }
}

fn done(why: &str) -> Next {
    Next::Done { why: why.into() }
}

fn bytes(b: f64) -> String {
    memprof_api::format_bytes(b.max(0.0) as u64)
}

/// The common step of whole-number values (their greatest common divisor),
/// or None when a value is not a whole number ≥ 1.
pub fn common_step(values: &[f64]) -> Option<f64> {
    let mut g = 0u64;
    for &v in values {
        if !(v >= 1.0 && v.fract() == 0.0 && v < 1e15) {
            return None;
        }
        g = gcd(g, v as u64);
    }
    (g > 0).then_some(g as f64)
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

#[cfg(test)]
mod tests;
