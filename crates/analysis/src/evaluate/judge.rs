//! A replay's readings against the truth: when the leak flag, high and
//! critical came, false flags, the time to OOM at half the cause's life,
//! what the report said after the OOM, and per cause the lead of
//! the first high before the OOM, the seconds of false high and false leak
//! flag, and the risk transitions from the cause's start to its end; then
//! the counts over a set (precision and recall of the leak flag,
//! flags within 15 s of the leak becoming visible, time to OOM within 20 %
//! at half-life).

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

/// The time to OOM over the middle half of the cause's life (a quarter of it
/// gone to three quarters): one reading at half-life can fall on either
/// side of a forecast that swings from one reading to the next.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TtoSpread {
    /// Readings in that span that gave a time to OOM.
    pub readings: usize,
    /// Readings in that span with none.
    pub without: usize,
    /// The lowest error of them, percent ((estimate − truth) / truth).
    pub low_percent: f64,
    /// The highest.
    pub high_percent: f64,
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

/// One scenario, one mode. Times in seconds after the cause began (the
/// leak for a leak; no cause: after the trainer's start); `None`: never.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Judged {
    /// Scenario.
    pub name: String,
    /// `oom`, `leak`, `none` or `other`.
    pub truth: &'static str,
    /// What drove memory (the recording's `cause`).
    pub cause: String,
    /// The cause's life (its start to the OOM).
    pub life: Option<f64>,
    /// Seconds from the first high (at or after the cause began) to the OOM.
    pub lead_high: Option<f64>,
    /// Seconds at high or critical before the end (on a legitimate run: all false).
    pub high_seconds: f64,
    /// Seconds with a leak flag where no leak ran (before it began, or at all).
    pub false_leak_seconds: f64,
    /// Risk changes from the cause's start to its end (the OOM, or the run's end).
    pub transitions: usize,
    /// Levels reached in that span above the one it began at.
    pub levels: usize,
    /// The cause the verdict named at its first high at or after the cause
    /// began (never high: at its last reading before the end), if any.
    pub named: Option<String>,
    /// The process that reading's evidence named, if any.
    pub named_pid: Option<u32>,
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
    /// The time to OOM's error over the middle half of the life.
    pub tto_spread: Option<TtoSpread>,
    /// After an OOM: the report's allocator verdict at the end.
    pub after_oom: Option<AfterOom>,
}

fn rel(t: Option<f64>, origin: f64) -> Option<f64> {
    t.map(|t| ((t - origin) * 10.0).round() / 10.0)
}

/// Seconds each reading stands for: to the next one, at most 2 s (the
/// last: 1 s).
fn spans(during: &[&Reading]) -> Vec<f64> {
    (0..during.len())
        .map(|i| {
            during
                .get(i + 1)
                .map_or(1.0, |n| (n.t - during[i].t).clamp(0.0, 2.0))
        })
        .collect()
}

fn seconds_where(during: &[&Reading], pred: impl Fn(&Reading) -> bool) -> f64 {
    let s: f64 = during
        .iter()
        .zip(spans(during))
        .filter(|(r, _)| pred(r))
        .map(|(_, d)| d)
        .sum();
    // + 0.0: an empty sum is -0.0, which prints as "-0".
    (s * 10.0).round() / 10.0 + 0.0
}

/// Risk changes over `span`, and the levels reached above the first.
fn escalation(span: &[&Reading]) -> (usize, usize) {
    let changes = span.windows(2).filter(|w| w[0].risk != w[1].risk).count();
    let first = span.first().map_or(RiskLevel::None, |r| r.risk);
    let mut above: Vec<RiskLevel> = span.iter().map(|r| r.risk).filter(|l| *l > first).collect();
    above.sort();
    above.dedup();
    (changes, above.len())
}

/// The per-cause numbers of one replay (see [`Judged`]).
struct PerCause {
    lead_high: Option<f64>,
    high_seconds: f64,
    false_leak_seconds: f64,
    transitions: usize,
    levels: usize,
}

fn per_cause(rec: &Recording, during: &[&Reading], cause_from: Option<f64>) -> PerCause {
    let truth = &rec.truth;
    let from = cause_from.unwrap_or(truth.start);
    let lead_high = truth.oom_at.and_then(|oom| {
        let first = during
            .iter()
            .find(|r| r.t >= from && r.risk >= RiskLevel::High)?;
        Some(((oom - first.t) * 10.0).round() / 10.0)
    });
    let leak_from = truth.leak_from.filter(|_| truth.kind.leaks());
    let false_leak = seconds_where(during, |r| r.leak && leak_from.is_none_or(|f| r.t < f));
    let high = seconds_where(during, |r| r.risk >= RiskLevel::High);
    let span: Vec<&Reading> = during.iter().copied().filter(|r| r.t >= from).collect();
    let (transitions, levels) = escalation(&span);
    PerCause {
        lead_high,
        high_seconds: high,
        false_leak_seconds: false_leak,
        transitions,
        levels,
    }
}

/// Judges one replay of `rec`.
pub fn judge(rec: &Recording, replay: &Replay) -> Judged {
    let truth = &rec.truth;
    let end = truth.oom_at.unwrap_or(truth.end);
    let during: Vec<&Reading> = replay.readings.iter().filter(|r| r.t <= end).collect();
    let leak_from = truth.leak_from.filter(|_| truth.kind.leaks());
    let cause_from = truth
        .cause_from
        .filter(|_| !truth.legitimate())
        .or(leak_from);
    let origin = cause_from.unwrap_or(truth.start);
    let after = |pred: &dyn Fn(&Reading) -> bool| {
        during
            .iter()
            .find(|r| cause_from.is_none_or(|f| r.t >= f) && pred(r))
            .map(|r| r.t)
    };
    let leak_flag = leak_from.and(after(&|r| r.leak));
    let pc = per_cause(rec, &during, cause_from);
    let at = during
        .iter()
        .find(|r| r.t >= origin && r.risk >= RiskLevel::High)
        .or(during.last());
    let named = at.and_then(|r| r.cause).map(|c| c.as_str().to_string());
    let before: Vec<&&Reading> = during
        .iter()
        .filter(|r| leak_from.is_none_or(|f| r.t < f))
        .collect();
    let false_flags = before.iter().filter(|r| r.leak).count();
    Judged {
        name: rec.name.clone(),
        truth: truth.kind.as_str(),
        cause: truth.cause.clone(),
        life: match (truth.oom_at, cause_from) {
            (Some(o), Some(f)) => rel(Some(o), f),
            _ => None,
        },
        lead_high: pc.lead_high,
        high_seconds: pc.high_seconds,
        false_leak_seconds: pc.false_leak_seconds,
        transitions: pc.transitions,
        levels: pc.levels,
        named,
        named_pid: at.and_then(|r| r.pid),
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
        tto_at_half: tto_at_half(truth.oom_at, cause_from, &during),
        tto_spread: tto_spread(truth.oom_at, cause_from, &during),
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

/// The time to OOM's error over the readings from a quarter of the cause's
/// life to three quarters; `None` without an OOM or a reading there.
fn tto_spread(oom: Option<f64>, from: Option<f64>, during: &[&Reading]) -> Option<TtoSpread> {
    let (oom, from) = (oom?, from?);
    let life = oom - from;
    let middle: Vec<&&Reading> = during
        .iter()
        .filter(|r| (from + life / 4.0..=from + life * 3.0 / 4.0).contains(&r.t))
        .collect();
    let errors: Vec<f64> = middle
        .iter()
        .filter_map(|r| r.tto.map(|tto| 100.0 * (tto - (oom - r.t)) / (oom - r.t)))
        .collect();
    let round = |x: f64| x.round();
    Some(TtoSpread {
        readings: errors.len(),
        without: middle.len() - errors.len(),
        low_percent: round(errors.iter().copied().reduce(f64::min)?),
        high_percent: round(errors.iter().copied().reduce(f64::max)?),
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

/// The leak flag's counts over one mode's judgements.
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
    let leaks: Vec<&Judged> = judged
        .iter()
        .filter(|j| matches!(j.truth, "oom" | "leak"))
        .collect();
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::evaluate::recording::{Truth, TruthKind};

    /// A recording of `cause` that began at 10 s, its OOM at `oom` (None: the
    /// run ended at 100 s).
    pub(crate) fn rec(kind: TruthKind, cause: &str, oom: Option<f64>) -> Recording {
        Recording {
            name: cause.into(),
            truth: Truth {
                kind,
                start: 0.0,
                leak_from: (cause == "leak").then_some(10.0),
                visible: None,
                oom_at: oom,
                end: oom.unwrap_or(100.0),
                leak_rate: None,
                cause: cause.into(),
                cause_from: (!["churn", "steady"].contains(&cause)).then_some(10.0),
            },
            rows: Vec::new(),
            pushes: Vec::new(),
            refused_pushes: 0,
            processes: Vec::new(),
            utilization: Vec::new(),
            received: Vec::new(),
            uuid: None,
            uuid_gpu: 0,
        }
    }

    /// Readings once a second from 0 to 100 s.
    pub(crate) fn replay(f: impl Fn(f64) -> (RiskLevel, Option<f64>, bool)) -> Replay {
        let readings = (0..=100)
            .map(|i| {
                let t = i as f64;
                let (risk, tto, leak) = f(t);
                Reading {
                    t,
                    leak,
                    risk,
                    tto,
                    from_agent: false,
                    cause: None,
                    pid: None,
                }
            })
            .collect();
        Replay {
            readings,
            allocator: None,
        }
    }

    fn escalating(t: f64) -> RiskLevel {
        match t {
            t if t < 30.0 => RiskLevel::Low,
            t if t < 50.0 => RiskLevel::Medium,
            t if t < 70.0 => RiskLevel::High,
            _ => RiskLevel::Critical,
        }
    }

    #[test]
    fn a_monotone_escalation_to_an_oom_is_scored_from_the_causes_start() {
        // Growing demand from 10 s, OOM at 100 s; high at 50 s; an exact TTO.
        let r = rec(TruthKind::Other, "growingDemand", Some(100.0));
        let j = judge(&r, &replay(|t| (escalating(t), Some(100.0 - t), false)));
        assert_eq!(j.life, Some(90.0));
        assert_eq!(j.lead_high, Some(50.0));
        assert_eq!(j.high, Some(40.0));
        assert_eq!(j.tto_at_half.as_ref().map(|t| t.error_percent), Some(0.0));
        assert_eq!((j.transitions, j.levels), (3, 3));
        assert_eq!((j.high_seconds, j.false_leak_seconds), (51.0, 0.0));
        // No leak ran: a leak flag on growing demand is false, from the start.
        let j = judge(&r, &replay(|t| (escalating(t), None, t >= 60.0)));
        assert_eq!(
            (j.false_flags, j.false_leak_seconds, j.leak_flag),
            (41, 41.0, None)
        );
    }

    #[test]
    fn a_forecast_right_at_half_life_but_swinging_around_it_shows_its_spread() {
        // Growing demand from 10 s, OOM at 100 s: the middle half of its
        // life is 32.5 s to 77.5 s. The forecast is exact on odd seconds
        // (half-life, 55 s, is one) and 30 % late on even ones; before and after the middle it is off
        // by far more, which the spread leaves out.
        let r = rec(TruthKind::Other, "growingDemand", Some(100.0));
        let swing = |t: f64| {
            let left = 100.0 - t;
            let tto = match t {
                t if !(32.5..=77.5).contains(&t) => left * 3.0,
                t if (t as i64) % 2 == 1 => left,
                _ => left * 1.3,
            };
            (RiskLevel::Medium, Some(tto), false)
        };
        let j = judge(&r, &replay(swing));
        assert_eq!(j.tto_at_half.as_ref().map(|t| t.error_percent), Some(0.0));
        let s = j.tto_spread.expect("readings in the middle half");
        assert_eq!((s.low_percent, s.high_percent), (0.0, 30.0));
        assert_eq!((s.readings, s.without), (45, 0));
        // Readings that promise no time are counted, not judged.
        let some = |t: f64| (RiskLevel::Low, (t >= 60.0).then_some(100.0 - t), false);
        let s = judge(&r, &replay(some)).tto_spread.unwrap();
        assert_eq!((s.readings, s.without), (18, 27));
        // No OOM, no spread.
        let none = rec(TruthKind::None, "churn", None);
        assert_eq!(judge(&none, &replay(swing)).tto_spread, None);
    }

    #[test]
    fn a_flapping_escalation_counts_every_change() {
        let r = rec(TruthKind::Other, "neighbour", Some(100.0));
        let flap = |t: f64| {
            let l = if t >= 40.0 && (t as i64) % 2 == 0 {
                RiskLevel::High
            } else {
                RiskLevel::Medium
            };
            (l, None, false)
        };
        let j = judge(&r, &replay(flap));
        assert_eq!(j.levels, 1);
        assert!(j.transitions > j.levels + 1, "{j:?}");
        assert_eq!(j.lead_high, Some(60.0));
        // Before the cause began, nothing counts toward the escalation.
        let j = judge(
            &r,
            &replay(|t| {
                (
                    if t < 10.0 {
                        RiskLevel::High
                    } else {
                        RiskLevel::Low
                    },
                    None,
                    false,
                )
            }),
        );
        assert_eq!((j.lead_high, j.transitions, j.levels), (None, 0, 0));
    }

    #[test]
    fn a_legitimate_run_counts_its_false_seconds() {
        let r = rec(TruthKind::None, "churn", None);
        let j = judge(
            &r,
            &replay(|t| {
                let high = (20.0..25.0).contains(&t);
                (
                    if high {
                        RiskLevel::High
                    } else {
                        RiskLevel::Low
                    },
                    None,
                    (50.0..53.0).contains(&t),
                )
            }),
        );
        assert_eq!((j.high_seconds, j.false_leak_seconds), (5.0, 3.0));
        assert_eq!((j.life, j.lead_high), (None, None));
        assert!(r.truth.legitimate());
        assert!(!rec(TruthKind::None, "remediation", None).truth.legitimate());
        assert!(rec(TruthKind::None, "load", None).truth.legitimate());
    }
}
