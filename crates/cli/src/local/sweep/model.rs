//! The sweep's models: per swept variable, and per combination of the other
//! variables' values (a group), the one memory model of
//! `memprof_analysis::memmodel` over the runs that ended `ok`, and the
//! search state of `memprof_analysis::memsearch` (what is safe because it
//! ran, what bounds it, what the model predicts, what to run next). Pure:
//! recorded runs in, numbers and words out.

use crate::local::sweep::record::{RunRecord, Status};
use memprof_analysis::memmodel::{self, Prediction};
pub use memprof_analysis::memmodel::{num, signed_bytes};
use memprof_analysis::memsearch::{self, Bound, Next, Outcome};
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

/// What the model could say.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Verdict {
    /// A memory model was fitted (see `fit`).
    Fitted,
    /// No model fits (too few runs, or every family was refused:
    /// `noModel` says why); tested values are still judged.
    NoModel,
    /// The device total is unknown (pass `--limit-bytes`).
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
    /// `(value, peak bytes)` of the runs fitted (ended ok, with a peak).
    pub points: Vec<(f64, f64)>,
    /// Values whose run hit an OOM.
    pub oom_values: Vec<f64>,
    /// The memory model: curve, held-out predictions, margin, support.
    pub fit: Option<memmodel::Model>,
    /// Why there is no model.
    pub no_model: Option<String>,
    /// Device memory (summary or `--limit-bytes`).
    pub device_total_bytes: Option<f64>,
    /// Fraction of the device kept free.
    pub headroom: f64,
    /// deviceTotal × (1 − headroom): the target every peak must stay under.
    pub limit_bytes: Option<f64>,
    /// The values searched: multiples of this (the grid's common step, or
    /// `--step`); null when the values are not whole numbers.
    pub step: Option<f64>,
    /// The largest value that RAN with its peak under the limit, below any
    /// value that OOMed or went over: the only value called safe.
    pub largest_safe: Option<f64>,
    /// Its measured peak.
    pub largest_safe_peak_bytes: Option<f64>,
    /// The smallest value that OOMed or ran over the limit.
    pub bound: Option<Bound>,
    /// The model's largest value that fits and that the data backs
    /// (interpolated, or at most one held-out step beyond the data).
    pub predicted: Option<Prediction>,
    /// Whether a run confirmed the prediction (largestSafe ≥ predicted).
    pub verified: bool,
    /// Where the search stands: done (why), or the run it would do next.
    pub search: Option<Next>,
    /// Values run by the verification for this model, in order.
    pub trials: Vec<f64>,
    /// Whether every run agrees with the model (no OOM or over-limit run
    /// where it predicted a fit); null without a model and a limit.
    pub agrees: Option<bool>,
    /// Words: what disagrees, what is missing, what to do.
    pub notes: Vec<String>,
}

/// What the models are computed from besides the runs.
#[derive(Clone, Debug, Default)]
pub struct Target {
    /// The peak to fit.
    pub metric: Metric,
    /// Fraction of the device to keep free.
    pub headroom: f64,
    /// Device memory to use instead of the summaries' `deviceTotalBytes`.
    pub limit_override: Option<u64>,
    /// `--step VAR=N`: the search's step per variable.
    pub steps: BTreeMap<String, f64>,
}

/// One model per swept variable (with at least two values) and per
/// combination of the other variables' values, in grid order.
pub fn models(variables: &[String], runs: &[RunRecord], target: &Target) -> Vec<Model> {
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

/// Runs grouped by the other variables' values, in order of first
/// appearance. The groups are the grid's: a verification run joins the
/// group whose values it shares and never starts one, so a run that
/// searched BATCH_SIZE at SEQ_LEN=128 is not a SEQ_LEN model of its own at
/// the batch it tried.
fn groups<'a>(
    var: &str,
    variables: &[String],
    runs: &'a [RunRecord],
) -> Vec<(BTreeMap<String, String>, Vec<&'a RunRecord>)> {
    let key = |r: &RunRecord| -> BTreeMap<String, String> {
        variables
            .iter()
            .filter(|v| *v != var)
            .filter_map(|v| r.values.get(v).map(|x| (v.clone(), x.clone())))
            .collect()
    };
    let mut out: Vec<(BTreeMap<String, String>, Vec<&RunRecord>)> = vec![];
    let with_var = || runs.iter().filter(|r| r.values.contains_key(var));
    for r in with_var().filter(|r| r.trial.is_none()) {
        let k = key(r);
        if !out.iter().any(|(g, _)| *g == k) {
            out.push((k, vec![]));
        }
    }
    for r in with_var() {
        let k = key(r);
        if let Some((_, g)) = out.iter_mut().find(|(g, _)| *g == k) {
            g.push(r);
        }
    }
    out
}

fn empty(var: &str, fixed: BTreeMap<String, String>, target: &Target) -> Model {
    Model {
        variable: var.to_string(),
        fixed,
        metric: target.metric,
        verdict: Verdict::NoModel,
        points: vec![],
        oom_values: vec![],
        fit: None,
        no_model: None,
        device_total_bytes: None,
        headroom: target.headroom,
        limit_bytes: None,
        step: None,
        largest_safe: None,
        largest_safe_peak_bytes: None,
        bound: None,
        predicted: None,
        verified: false,
        search: None,
        trials: vec![],
        agrees: None,
        notes: vec![],
    }
}

fn model_for(
    var: &str,
    fixed: BTreeMap<String, String>,
    group: &[&RunRecord],
    target: &Target,
) -> Model {
    let mut m = empty(var, fixed, target);
    m.device_total_bytes = target
        .limit_override
        .or_else(|| group.iter().filter_map(|r| r.device_total_bytes).max())
        .map(|t| t as f64);
    let Some(trials) = trials_of(var, group, target.metric) else {
        m.verdict = Verdict::NotNumeric;
        m.notes.push(format!(
            "{var}'s values are not all numbers: no model to fit"
        ));
        return m;
    };
    m.points = trials
        .iter()
        .filter_map(|(x, o)| match o {
            Outcome::Ran(p) => Some((*x, *p)),
            Outcome::Oom => None,
        })
        .collect();
    m.oom_values = trials
        .iter()
        .filter(|t| t.1 == Outcome::Oom)
        .map(|t| t.0)
        .collect();
    m.oom_values.sort_by(f64::total_cmp);
    m.trials = group
        .iter()
        .filter(|r| r.trial.is_some())
        .filter_map(|r| r.values.get(var)?.parse().ok())
        .collect();
    let grid: Vec<f64> = trials.iter().map(|t| t.0).collect();
    m.step = target
        .steps
        .get(var)
        .copied()
        .or_else(|| memsearch::common_step(&grid));
    let Some(total) = m.device_total_bytes else {
        m.verdict = Verdict::NoLimit;
        m.fit = memmodel::fit(&m.points).ok();
        m.notes.push("device total unknown (no deviceTotalBytes in the agent summaries): pass --limit-bytes to get a recommendation".into());
        return m;
    };
    let limit = total * (1.0 - target.headroom);
    m.limit_bytes = Some(limit);
    judge(&mut m, &trials, limit);
    m
}

/// The runs of a group as the search sees them: ran with a peak, or OOM;
/// None when a value is not a number. Runs that failed otherwise, timed
/// out or left no peak say nothing about memory and are left out.
fn trials_of(var: &str, group: &[&RunRecord], metric: Metric) -> Option<Vec<(f64, Outcome)>> {
    let mut out = vec![];
    for r in group {
        let x: f64 = r.values.get(var)?.parse().ok()?;
        if !x.is_finite() {
            return None;
        }
        match (r.status, metric.of(r)) {
            (Some(Status::Oom), _) => out.push((x, Outcome::Oom)),
            (Some(Status::Ok), Some(p)) => out.push((x, Outcome::Ran(p as f64))),
            _ => {}
        }
    }
    Some(out)
}

/// The search state and the judgement of the model against the runs.
fn judge(m: &mut Model, trials: &[(f64, Outcome)], limit: f64) {
    let state = memsearch::assess(trials, limit, m.step);
    m.largest_safe = state.safe.map(|s| s.0);
    m.largest_safe_peak_bytes = state.safe.map(|s| s.1);
    m.bound = state.bound;
    m.predicted = state.predicted;
    m.search = Some(state.next);
    m.verified = match (m.predicted, m.largest_safe) {
        (Some(p), Some(s)) => s >= p.x,
        _ => false,
    };
    match state.model {
        Ok(fit) => {
            m.verdict = Verdict::Fitted;
            let var = m.variable.clone();
            let mut agrees = true;
            for (x, o) in trials {
                let failed = match o {
                    Outcome::Oom => Some("OOMed".to_string()),
                    Outcome::Ran(p) if *p > limit => {
                        Some(format!("ran over the limit ({})", format_bytes(*p as u64)))
                    }
                    Outcome::Ran(_) => None,
                };
                let p = fit.predict(*x, None);
                if let (Some(what), true) = (failed, p.support.backed() && p.fits(limit)) {
                    agrees = false;
                    m.notes.push(format!(
                        "{var}={} {what} although the model predicted {} ± {} there: it under-estimates",
                        num(*x),
                        format_bytes(p.peak_bytes.max(0.0) as u64),
                        format_bytes(p.margin_bytes as u64)
                    ));
                }
            }
            m.agrees = Some(agrees);
            m.fit = Some(fit);
        }
        Err(e) => {
            m.verdict = Verdict::NoModel;
            m.no_model = Some(e.why);
        }
    }
}

/// The model in a few lines for the terminal (and the HTML report).
pub fn describe(m: &Model) -> Vec<String> {
    let mut lines = vec![head(m)];
    if let Some(f) = &m.fit {
        lines.extend(f.notes.iter().map(|n| format!("  {n}")));
    }
    if let (Some(limit), Some(total)) = (m.limit_bytes, m.device_total_bytes) {
        lines.push(format!(
            "  limit {} = device {} − {:.0}% headroom",
            format_bytes(limit as u64),
            format_bytes(total as u64),
            m.headroom * 100.0
        ));
    }
    lines.extend(verdict_lines(m));
    lines.extend(m.notes.iter().map(|n| format!("  note: {n}")));
    lines
}

fn head(m: &Model) -> String {
    let fixed: Vec<String> = m.fixed.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let name = if fixed.is_empty() {
        m.variable.clone()
    } else {
        format!("{} ({})", m.variable, fixed.join(" "))
    };
    match (&m.fit, &m.no_model) {
        (Some(f), _) => format!(
            "{name}: peak = {}  ({}, {} runs; held-out error {}, margin {})",
            f.curve.describe(&m.variable),
            f.curve.family.word(),
            f.n,
            f.held_out_rms_bytes
                .map_or("- (two values: nothing to hold out)".into(), |e| {
                    format!("rms {}", format_bytes(e as u64))
                }),
            format_bytes(f.margin_bytes as u64)
        ),
        (None, Some(why)) => format!("{name}: no model: {why}"),
        (None, None) => format!("{name}: no model"),
    }
}

/// Largest safe (what ran), the bound, the model's prediction and where
/// the search stands.
fn verdict_lines(m: &Model) -> Vec<String> {
    let var = &m.variable;
    let mut lines = vec![];
    match (m.largest_safe, m.largest_safe_peak_bytes) {
        (Some(s), Some(p)) => lines.push(format!(
            "  largest safe {var} = {} (ran: peak {}{})",
            num(s),
            format_bytes(p as u64),
            if m.trials.contains(&s) {
                ", verified by a run after the grid"
            } else {
                ""
            }
        )),
        _ if m.limit_bytes.is_some() => {
            lines.push(format!("  no value of {var} ran under the limit"))
        }
        _ => {}
    }
    if let Some(b) = m.bound {
        lines.push(match b {
            Bound::Oom { x } => format!("  {var} = {} OOMed", num(x)),
            Bound::OverTarget { x, peak_bytes } => format!(
                "  {var} = {} ran over the limit (peak {})",
                num(x),
                format_bytes(peak_bytes as u64)
            ),
        });
    }
    if let Some(p) = m
        .predicted
        .filter(|p| !m.largest_safe.is_some_and(|s| s >= p.x))
    {
        lines.push(format!(
            "  the model predicts {var} = {} fits ({} ± {}; {}): NOT verified, run it before relying on it",
            num(p.x),
            format_bytes(p.peak_bytes.max(0.0) as u64),
            format_bytes(p.margin_bytes as u64),
            p.support.describe()
        ));
    }
    if !m.trials.is_empty() {
        let t: Vec<String> = m.trials.iter().map(|x| num(*x)).collect();
        lines.push(format!("  verification runs: {var} = {}", t.join(", ")));
    }
    match &m.search {
        Some(Next::Done { why }) => lines.push(format!("  search done: {why}")),
        Some(Next::Run { x, why }) => {
            lines.push(format!("  next run to try: {var} = {} ({why})", num(*x)))
        }
        None => {}
    }
    lines
}

#[cfg(test)]
mod tests;
