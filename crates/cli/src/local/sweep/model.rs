//! The memory model of a sweep: per swept variable, and per combination of
//! the other variables' values, peak = static + perUnit × value by least
//! squares over the runs that ended `ok`, and from it the largest value that
//! stays under the headroom target, with the prediction for the next value
//! up. Pure: recorded numbers in, numbers and words out.

use crate::local::sweep::record::{RunRecord, Status};
use memprof_api::format_bytes;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Which peak the model fits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "camelCase")]
pub enum Metric {
    /// The allocator's peak reserved bytes (what the process took from the device).
    #[default]
    Reserved,
    /// The allocator's peak allocated bytes (live tensors).
    Allocated,
    /// The busiest GPU's peak used bytes as NVML saw it (needs `--nvml`).
    Nvml,
}

impl Metric {
    /// This metric's value in a run's record.
    pub fn of(self, r: &RunRecord) -> Option<u64> {
        match self {
            Metric::Reserved => r.peak_reserved_bytes,
            Metric::Allocated => r.peak_allocated_bytes,
            Metric::Nvml => r.nvml_peak_bytes,
        }
    }
}

/// A least-squares line and how well it fits.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LineFit {
    /// Intercept: bytes at value 0.
    pub static_bytes: f64,
    /// Slope: bytes per unit of the variable.
    pub per_unit_bytes: f64,
    /// Points fitted.
    pub n: usize,
    /// Root mean square of the residuals, bytes.
    pub rms_residual_bytes: f64,
    /// Largest absolute residual, bytes.
    pub max_residual_bytes: f64,
    /// Coefficient of determination; null when every peak is the same.
    pub r2: Option<f64>,
}

impl LineFit {
    /// The predicted peak at `x`.
    pub fn predict(&self, x: f64) -> f64 {
        self.static_bytes + self.per_unit_bytes * x
    }
}

/// Fits y = a + b·x; None with fewer than two different x.
pub fn least_squares(points: &[(f64, f64)]) -> Option<LineFit> {
    let n = points.len() as f64;
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    if points.len() < 2 || sxx <= 0.0 || !sxx.is_finite() {
        return None;
    }
    let slope = sxy / sxx;
    let intercept = mean_y - slope * mean_x;
    let residuals: Vec<f64> = points
        .iter()
        .map(|p| p.1 - (intercept + slope * p.0))
        .collect();
    let ss_res: f64 = residuals.iter().map(|r| r * r).sum();
    let ss_tot: f64 = points.iter().map(|p| (p.1 - mean_y).powi(2)).sum();
    Some(LineFit {
        static_bytes: intercept,
        per_unit_bytes: slope,
        n: points.len(),
        rms_residual_bytes: (ss_res / n).sqrt(),
        max_residual_bytes: residuals.iter().fold(0.0, |m, r| m.max(r.abs())),
        r2: (ss_tot > 0.0).then(|| 1.0 - ss_res / ss_tot),
    })
}

/// Whether the model could say something.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Verdict {
    /// Fitted, with a limit: a recommendation (or a reason why none fits).
    Fitted,
    /// Too few points, or the peak does not grow with the variable.
    Insufficient,
    /// Fitted, but the device total is unknown (pass `--limit-bytes`).
    NoLimit,
    /// The variable's values are not numbers.
    NotNumeric,
}

/// The model of one variable for one combination of the other variables.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Model {
    /// The swept variable.
    pub variable: String,
    /// The other variables' values, held fixed.
    pub fixed: BTreeMap<String, String>,
    /// The peak fitted.
    pub metric: Metric,
    /// What the model could say.
    pub verdict: Verdict,
    /// `(value, peak bytes)` of the runs fitted.
    pub points: Vec<(f64, f64)>,
    /// Values whose run hit an OOM.
    pub oom_values: Vec<f64>,
    /// The line.
    pub fit: Option<LineFit>,
    /// Device memory (summary or `--limit-bytes`).
    pub device_total_bytes: Option<f64>,
    /// Fraction of the device kept free.
    pub headroom: f64,
    /// deviceTotal × (1 − headroom).
    pub limit_bytes: Option<f64>,
    /// Largest value of the ladder (grid, extended upward) under the limit.
    pub largest_safe: Option<f64>,
    /// Its predicted peak (or its observed one, when higher).
    pub largest_safe_peak_bytes: Option<f64>,
    /// Whether a run at that value ended ok in this sweep.
    pub largest_safe_tested: bool,
    /// Where the line crosses the limit.
    pub model_bound: Option<f64>,
    /// The ladder's next value above the largest safe one.
    pub next_up: Option<f64>,
    /// Its predicted peak.
    pub next_up_predicted_bytes: Option<f64>,
    /// How a run at the next value up ended in this sweep, if one ran.
    pub next_up_observed: Option<Status>,
    /// An observed OOM at or below what the model allowed, which set the recommendation instead.
    pub overridden_by_oom_at: Option<f64>,
    /// Whether the observed runs agree with the model; null without a fit and a limit.
    pub agrees: Option<bool>,
    /// Words: why, what disagrees, what is missing.
    pub notes: Vec<String>,
}

/// What the models are computed from besides the runs.
#[derive(Clone, Copy, Debug)]
pub struct Target {
    /// The peak to fit.
    pub metric: Metric,
    /// Fraction of the device to keep free.
    pub headroom: f64,
    /// Device memory to use instead of the summaries' `deviceTotalBytes`.
    pub limit_override: Option<u64>,
}

/// One model per swept variable (with at least two values) and per
/// combination of the other variables' values, in grid order.
pub fn models(variables: &[String], runs: &[RunRecord], target: Target) -> Vec<Model> {
    let mut out = vec![];
    for var in variables {
        let distinct: Vec<&String> = dedup(runs.iter().filter_map(|r| r.values.get(var)));
        if distinct.len() < 2 {
            continue;
        }
        for (fixed, group) in groups(var, variables, runs) {
            out.push(model_for(var, fixed, &group, target));
        }
    }
    out
}

fn dedup<'a>(it: impl Iterator<Item = &'a String>) -> Vec<&'a String> {
    let mut v: Vec<&String> = vec![];
    for x in it {
        if !v.contains(&x) {
            v.push(x);
        }
    }
    v
}

/// Runs grouped by the other variables' values, in order of first appearance.
fn groups<'a>(
    var: &str,
    variables: &[String],
    runs: &'a [RunRecord],
) -> Vec<(BTreeMap<String, String>, Vec<&'a RunRecord>)> {
    let mut out: Vec<(BTreeMap<String, String>, Vec<&RunRecord>)> = vec![];
    for r in runs {
        let key: BTreeMap<String, String> = variables
            .iter()
            .filter(|v| *v != var)
            .filter_map(|v| r.values.get(v).map(|x| (v.clone(), x.clone())))
            .collect();
        match out.iter_mut().find(|(k, _)| *k == key) {
            Some((_, g)) => g.push(r),
            None => out.push((key, vec![r])),
        }
    }
    out
}

fn model_for(
    var: &str,
    fixed: BTreeMap<String, String>,
    group: &[&RunRecord],
    target: Target,
) -> Model {
    let mut m = Model {
        variable: var.to_string(),
        fixed,
        metric: target.metric,
        verdict: Verdict::Insufficient,
        points: vec![],
        oom_values: vec![],
        fit: None,
        device_total_bytes: target
            .limit_override
            .or_else(|| group.iter().filter_map(|r| r.device_total_bytes).max())
            .map(|t| t as f64),
        headroom: target.headroom,
        limit_bytes: None,
        largest_safe: None,
        largest_safe_peak_bytes: None,
        largest_safe_tested: false,
        model_bound: None,
        next_up: None,
        next_up_predicted_bytes: None,
        next_up_observed: None,
        overridden_by_oom_at: None,
        agrees: None,
        notes: vec![],
    };
    let Some(observed) = numeric(var, group, target.metric) else {
        m.verdict = Verdict::NotNumeric;
        m.notes.push(format!(
            "{var}'s values are not all numbers: no line to fit"
        ));
        return m;
    };
    m.points = observed
        .iter()
        .filter(|o| o.status == Some(Status::Ok))
        .filter_map(|o| o.peak.map(|p| (o.x, p)))
        .collect();
    m.oom_values = observed
        .iter()
        .filter(|o| o.status == Some(Status::Oom))
        .map(|o| o.x)
        .collect();
    m.oom_values.sort_by(f64::total_cmp);
    m.fit = least_squares(&m.points);
    if let Some(why) = insufficient(var, &m) {
        m.notes.push(why);
        return m;
    }
    let Some(total) = m.device_total_bytes else {
        m.verdict = Verdict::NoLimit;
        m.notes.push("device total unknown (no deviceTotalBytes in the agent summaries): pass --limit-bytes to get a recommendation".into());
        return m;
    };
    m.verdict = Verdict::Fitted;
    recommend(var, &mut m, &observed, total);
    m
}

/// One run as the model sees it.
struct Observed {
    x: f64,
    peak: Option<f64>,
    status: Option<Status>,
}

fn numeric(var: &str, group: &[&RunRecord], metric: Metric) -> Option<Vec<Observed>> {
    group
        .iter()
        .map(|r| {
            let x: f64 = r.values.get(var)?.parse().ok()?;
            x.is_finite().then(|| Observed {
                x,
                peak: metric.of(r).map(|p| p as f64),
                status: r.status,
            })
        })
        .collect()
}

fn insufficient(var: &str, m: &Model) -> Option<String> {
    let Some(fit) = &m.fit else {
        return Some(format!(
            "insufficient data: {} run(s) of {var} ended ok with a peak; the line needs two different values",
            m.points.len()
        ));
    };
    (fit.per_unit_bytes <= 0.0).then(|| {
        format!(
            "insufficient data: the peak does not grow with {var} ({} per unit): the model cannot say where memory runs out",
            signed_bytes(fit.per_unit_bytes)
        )
    })
}

fn recommend(var: &str, m: &mut Model, observed: &[Observed], total: f64) {
    let fit = m.fit.clone().expect("fitted");
    let limit = total * (1.0 - m.headroom);
    m.limit_bytes = Some(limit);
    m.model_bound = Some((limit - fit.static_bytes) / fit.per_unit_bytes);
    // A value is judged by the higher of its prediction and what was seen.
    let seen = |x: f64| {
        observed
            .iter()
            .filter(|o| o.x == x && o.status == Some(Status::Ok))
            .filter_map(|o| o.peak)
            .fold(None, |a: Option<f64>, p| Some(a.map_or(p, |a| a.max(p))))
    };
    let peak = |x: f64| seen(x).map_or(fit.predict(x), |s| s.max(fit.predict(x)));
    let mut grid: Vec<f64> = observed.iter().map(|o| o.x).collect();
    grid.sort_by(f64::total_cmp);
    grid.dedup();
    let ladder = extend(&grid, |x| peak(x) <= limit);
    let mut safe = ladder.iter().rev().copied().find(|x| peak(*x) <= limit);
    if let Some(&first_oom) = m.oom_values.first() {
        if safe.is_some_and(|s| s >= first_oom) {
            m.overridden_by_oom_at = Some(first_oom);
            m.notes.push(format!(
                "observed OOM at {var}={} overrides the model, which predicted {} there (under the limit {})",
                num(first_oom),
                format_bytes(fit.predict(first_oom).max(0.0) as u64),
                format_bytes(limit as u64)
            ));
            safe = ladder
                .iter()
                .rev()
                .copied()
                .find(|x| *x < first_oom && peak(*x) <= limit);
        }
    }
    let next = match safe {
        Some(s) => ladder.iter().copied().find(|x| *x > s),
        None => ladder.first().copied(),
    };
    if safe.is_none() {
        m.notes.push(format!(
            "no value of {var} fits: {var}={} is predicted at {}, over the limit {}",
            ladder.first().map_or("-".into(), |x| num(*x)),
            ladder
                .first()
                .map_or("-".into(), |x| format_bytes(peak(*x).max(0.0) as u64)),
            format_bytes(limit as u64)
        ));
    }
    m.largest_safe = safe;
    m.largest_safe_peak_bytes = safe.map(peak);
    m.largest_safe_tested = safe.is_some_and(|s| seen(s).is_some());
    m.next_up = next;
    m.next_up_predicted_bytes = next.map(|x| fit.predict(x));
    m.next_up_observed = next.and_then(|x| {
        observed
            .iter()
            .filter(|o| o.x == x)
            .filter_map(|o| o.status)
            .find(|s| matches!(s, Status::Ok | Status::Oom))
    });
    judge(var, m, &fit, total, limit);
}

/// The tested values, then further values up the same ladder (doubling for
/// powers of two, else the last step) while they still fit, plus one more.
/// A powers-of-two grid with gaps (8, 32) gets the missing rungs (16).
pub fn extend(grid: &[f64], fits: impl Fn(f64) -> bool) -> Vec<f64> {
    let doubling = grid.len() < 2
        || grid
            .iter()
            .all(|x| *x >= 1.0 && x.fract() == 0.0 && (*x as u64).is_power_of_two());
    let mut ladder = grid.to_vec();
    if doubling && grid.len() >= 2 {
        let (lo, hi) = (grid[0], grid[grid.len() - 1]);
        ladder = std::iter::successors(Some(lo), |x| Some(x * 2.0))
            .take_while(|x| *x <= hi)
            .collect();
    }
    for _ in 0..64 {
        let Some(&top) = ladder.last() else { break };
        if !fits(top) {
            break;
        }
        let next = match ladder.len() {
            n if doubling || n < 2 => top * 2.0,
            n => top + (top - ladder[n - 2]),
        };
        if next <= top || !next.is_finite() {
            break;
        }
        ladder.push(next);
    }
    ladder
}

/// Whether what was observed agrees with the line.
fn judge(var: &str, m: &mut Model, fit: &LineFit, total: f64, limit: f64) {
    let mut agrees = m.overridden_by_oom_at.is_none();
    for &x in &m.oom_values {
        let p = fit.predict(x);
        if p < total && m.overridden_by_oom_at != Some(x) {
            agrees = false;
            m.notes.push(format!(
                "OOM at {var}={} although the model predicts {}, under the device total {}: it underestimates there",
                num(x),
                format_bytes(p.max(0.0) as u64),
                format_bytes(total as u64)
            ));
        }
    }
    if fit.max_residual_bytes > 0.05 * limit {
        m.notes.push(format!(
            "the line misses a run by {} (more than 5% of the limit): the peak is not linear in {var}; trust tested values only",
            format_bytes(fit.max_residual_bytes as u64)
        ));
    }
    if fit.n == 2 {
        m.notes.push(
            "two points: the line passes through both, so there is no residual to judge it by"
                .into(),
        );
    }
    if m.largest_safe.is_some() && !m.largest_safe_tested {
        m.notes.push(format!(
            "{var}={} was not run in this sweep: it is extrapolated",
            m.largest_safe.map_or("-".into(), num)
        ));
    }
    m.agrees = Some(agrees);
}

/// A value as written in a grid: integers without a fraction.
pub fn num(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{}", x as i64)
    } else {
        format!("{x:.3}")
    }
}

/// Bytes for humans with a sign: `-1.5GiB`.
pub fn signed_bytes(b: f64) -> String {
    if b < 0.0 {
        format!("-{}", format_bytes((-b) as u64))
    } else {
        format_bytes(b as u64)
    }
}

/// The model in a few lines for the terminal.
pub fn describe(m: &Model) -> Vec<String> {
    let mut lines = vec![];
    let fixed: Vec<String> = m.fixed.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let head = if fixed.is_empty() {
        m.variable.clone()
    } else {
        format!("{} ({})", m.variable, fixed.join(" "))
    };
    match &m.fit {
        Some(f) => lines.push(format!(
            "{head}: peak = {} + {} × {}  ({} runs, R² {}, residual rms {}, max {})",
            signed_bytes(f.static_bytes),
            signed_bytes(f.per_unit_bytes),
            m.variable,
            f.n,
            f.r2.map_or("-".into(), |r| format!("{r:.4}")),
            format_bytes(f.rms_residual_bytes as u64),
            format_bytes(f.max_residual_bytes as u64)
        )),
        None => lines.push(format!("{head}: no fit")),
    }
    if let (Some(limit), Some(total)) = (m.limit_bytes, m.device_total_bytes) {
        lines.push(format!(
            "  limit {} = device {} − {:.0}% headroom",
            format_bytes(limit as u64),
            format_bytes(total as u64),
            m.headroom * 100.0
        ));
    }
    if let Some(s) = m.largest_safe {
        lines.push(format!(
            "  largest safe {} = {} ({} {}){}",
            m.variable,
            num(s),
            if m.largest_safe_tested {
                "peak"
            } else {
                "predicted"
            },
            format_bytes(m.largest_safe_peak_bytes.unwrap_or(0.0).max(0.0) as u64),
            m.model_bound.map_or(String::new(), |b| format!(
                "; the line reaches the limit at {}",
                num(b.floor())
            ))
        ));
    }
    if let (Some(n), Some(p)) = (m.next_up, m.next_up_predicted_bytes) {
        let seen = match m.next_up_observed {
            Some(Status::Oom) => ", observed: OOM",
            Some(Status::Ok) => ", observed: ran",
            _ => ", not run",
        };
        lines.push(format!(
            "  next up {} = {}: predicted {}{seen}",
            m.variable,
            num(n),
            format_bytes(p.max(0.0) as u64)
        ));
    }
    if let Some(a) = m.agrees {
        lines.push(format!(
            "  observed runs {}",
            if a {
                "agree with the model"
            } else {
                "DISAGREE with the model (see notes)"
            }
        ));
    }
    lines.extend(m.notes.iter().map(|n| format!("  note: {n}")));
    lines
}

#[cfg(test)]
#[path = "model_tests.rs"]
mod tests;
