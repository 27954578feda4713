//! A replay's readings against the truth: when the leak flag, high and
//! critical came, false flags, the time to OOM at half the leak's life, and
//! what the report said after the OOM; then the counts of issue 17 over a
//! set (precision and recall of the leak flag, flags within 15 s of the leak
//! becoming visible, time to OOM within 20 % at half-life).

use super::recording::Recording;
use super::replay::{Reading, Replay};
use memprof_api::{MemoryGrowth, RiskLevel};
use serde::Serialize;

/// The time to OOM nearest to half the leak's life.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TtoAtHalf {
    /// Seconds after the leak began.
    pub at: f64,
    /// What was reported, seconds.
    pub estimate: f64,
    /// The real time left, seconds.
    pub truth: f64,
    /// (estimate − truth) / truth, percent.
    pub error_percent: f64,
}

/// What the report said once the trainer was gone.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AfterOom {
    /// The allocator's growth.
    pub growth: MemoryGrowth,
    /// Its fragmentation.
    pub fragmentation: Option<f64>,
    /// Whether it gave advice.
    pub advice: bool,
    /// Whether the verdict was the one kept from before the OOM.
    pub kept_from_before: bool,
}

/// One scenario, one mode. Times in seconds after the leak began (no leak:
/// after the trainer's start); `None`: never.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Judged {
    /// Scenario.
    pub name: String,
    /// `oom`, `leak` or `none`.
    pub truth: &'static str,
    /// The leak's life (leak start to OOM).
    pub life: Option<f64>,
    /// When the leak became visible (1 % of the GPU kept).
    pub visible: Option<f64>,
    /// First leak flag at or after the leak began, before the end.
    pub leak_flag: Option<f64>,
    /// That flag after the leak became visible.
    pub leak_flag_after_visible: Option<f64>,
    /// Readings with a leak flag before the leak began (or at all, without a leak).
    pub false_flags: usize,
    /// The first of them, seconds after the trainer's start.
    pub first_false_flag: Option<f64>,
    /// First high or critical.
    pub high: Option<f64>,
    /// First critical.
    pub critical: Option<f64>,
    /// The worst risk before the end.
    pub worst: RiskLevel,
    /// The time to OOM nearest to half-life (within 5 s).
    pub tto_at_half: Option<TtoAtHalf>,
    /// After an OOM: the report's allocator verdict at the end.
    pub after_oom: Option<AfterOom>,
}

fn rel(t: Option<f64>, origin: f64) -> Option<f64> {
    t.map(|t| ((t - origin) * 10.0).round() / 10.0)
}

/// Judges one replay of `rec`.
pub fn judge(rec: &Recording, replay: &Replay) -> Judged {
    let truth = &rec.truth;
    let end = truth.oom_at.unwrap_or(truth.end);
    let during: Vec<&Reading> = replay.readings.iter().filter(|r| r.t <= end).collect();
    let leak_from = truth.leak_from.filter(|_| truth.kind.leaks());
    let origin = leak_from.unwrap_or(truth.start);
    let after = |pred: &dyn Fn(&Reading) -> bool| {
        during
            .iter()
            .find(|r| leak_from.is_none_or(|f| r.t >= f) && pred(r))
            .map(|r| r.t)
    };
    let leak_flag = leak_from.and(after(&|r| r.leak));
    let before: Vec<&&Reading> = during
        .iter()
        .filter(|r| leak_from.is_none_or(|f| r.t < f))
        .collect();
    let false_flags = before.iter().filter(|r| r.leak).count();
    Judged {
        name: rec.name.clone(),
        truth: truth.kind.as_str(),
        life: match (truth.oom_at, leak_from) {
            (Some(o), Some(f)) => rel(Some(o), f),
            _ => None,
        },
        visible: leak_from.and_then(|f| rel(truth.visible, f)),
        leak_flag: rel(leak_flag, origin),
        leak_flag_after_visible: match (leak_flag, truth.visible) {
            (Some(f), Some(v)) => rel(Some(f), v),
            _ => None,
        },
        false_flags,
        first_false_flag: rel(before.iter().find(|r| r.leak).map(|r| r.t), truth.start),
        high: rel(after(&|r| r.risk >= RiskLevel::High), origin),
        critical: rel(after(&|r| r.risk >= RiskLevel::Critical), origin),
        worst: during.iter().map(|r| r.risk).max().unwrap_or_default(),
        tto_at_half: tto_at_half(truth.oom_at, leak_from, &during),
        after_oom: truth.oom_at.and_then(|_| after_oom(replay)),
    }
}

fn tto_at_half(oom: Option<f64>, leak_from: Option<f64>, during: &[&Reading]) -> Option<TtoAtHalf> {
    let (oom, from) = (oom?, leak_from?);
    let half = from + (oom - from) / 2.0;
    let r = during
        .iter()
        .filter(|r| r.tto.is_some() && (r.t - half).abs() <= 5.0)
        .min_by(|a, b| (a.t - half).abs().total_cmp(&(b.t - half).abs()))?;
    let estimate = r.tto?;
    let truth = oom - r.t;
    let round = |x: f64| (x * 10.0).round() / 10.0;
    Some(TtoAtHalf {
        at: round(r.t - from),
        estimate: round(estimate),
        truth: round(truth),
        error_percent: round(100.0 * (estimate - truth) / truth),
    })
}

fn after_oom(replay: &Replay) -> Option<AfterOom> {
    let a = replay.allocator.as_ref()?;
    Some(AfterOom {
        growth: a.growth,
        fragmentation: a.fragmentation,
        advice: a.advice.is_some(),
        kept_from_before: a.verdict_before_oom.is_some(),
    })
}

/// Issue 17's counts over one mode's judgements.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Totals {
    /// Scenarios with a leak.
    pub leaks: usize,
    /// Leaks flagged after they began, without a flag before.
    pub true_flags: usize,
    /// Scenarios flagged wrongly: without a leak, or before it began.
    pub false_flag_scenarios: usize,
    /// true / (true + false), when anything was flagged.
    pub precision: Option<f64>,
    /// true / leaks.
    pub recall: Option<f64>,
    /// Leaks whose flag came within 15 s of the leak becoming visible.
    pub flagged_within_15s_of_visible: usize,
    /// Leaks whose visibility is known.
    pub with_visibility: usize,
    /// Leaks that lived 30 s or more before their OOM.
    pub long_lived: usize,
    /// Of those, time to OOM within 20 % at half-life.
    pub tto_within_20_percent: usize,
}

/// Counts over `judged`.
pub fn totals(judged: &[Judged]) -> Totals {
    let leaks: Vec<&Judged> = judged.iter().filter(|j| j.truth != "none").collect();
    let wrong = |j: &Judged| j.false_flags > 0;
    let true_flags = leaks
        .iter()
        .filter(|j| j.leak_flag.is_some() && !wrong(j))
        .count();
    let false_flag_scenarios = judged.iter().filter(|j| wrong(j)).count();
    let flagged = true_flags + false_flag_scenarios;
    let long: Vec<&&Judged> = leaks
        .iter()
        .filter(|j| j.life.is_some_and(|l| l >= 30.0))
        .collect();
    Totals {
        leaks: leaks.len(),
        true_flags,
        false_flag_scenarios,
        precision: (flagged > 0).then(|| true_flags as f64 / flagged as f64),
        recall: (!leaks.is_empty()).then(|| true_flags as f64 / leaks.len() as f64),
        flagged_within_15s_of_visible: leaks
            .iter()
            .filter(|j| j.leak_flag_after_visible.is_some_and(|d| d <= 15.0))
            .count(),
        with_visibility: leaks.iter().filter(|j| j.visible.is_some()).count(),
        long_lived: long.len(),
        tto_within_20_percent: long
            .iter()
            .filter(|j| {
                j.tto_at_half
                    .as_ref()
                    .is_some_and(|t| t.error_percent.abs() <= 20.0)
            })
            .count(),
    }
}
