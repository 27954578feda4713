//! The per-cause benchmark over a judged set: per recording (one cause each)
//! and per source (memprof from NVML alone, memprof with the agent, the
//! dcgm-exporter 90 % alert, the straight line), the lead of the first high
//! before the OOM, the TTO error at half the cause's life, the seconds of
//! false high and false leak flag on legitimate runs and the risk
//! transitions on the way to the OOM; then each source's counts against the
//! issue's goals ([`goals`]).

use super::judge::Judged;
use super::recording::LEGITIMATE;
use super::Evaluation;
use serde::Serialize;

/// The goals' lead: a first high at least this long before the OOM...
pub const GOAL_LEAD_SECONDS: f64 = 60.0;
/// ...for causes that live at least this long.
pub const GOAL_LIFE_SECONDS: f64 = 90.0;
/// The goals' TTO error at half-life, percent.
pub const GOAL_TTO_PERCENT: f64 = 10.0;

/// Causes NVML's device numbers can tell from a legitimate rise: a leak, a
/// growing demand, a neighbour (its own process). Fragmentation and a
/// spike's cause are the allocator's, which only the agent sees.
pub const NVML_VISIBLE: [&str; 3] = ["leak", "growingDemand", "neighbour"];

/// One source's counts against the goals.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Goals {
    /// `nvml`, `agent`, `usedAlert90` or `linear30s`.
    pub source: &'static str,
    /// OOMs of a cause this source can see that lived >= 90 s.
    pub long_ooms: usize,
    /// Of those, a first high >= 60 s before the OOM.
    pub lead_met: usize,
    /// OOMs of a cause this source can see, any life.
    pub ooms: usize,
    /// Of those, a first high >= 2/3 of the life before the OOM (the goal's
    /// 60 of 90 s, for shorter lives).
    pub lead_two_thirds: usize,
    /// OOMs with a TTO at half-life.
    pub with_tto: usize,
    /// Of those, within 10 %.
    pub tto_met: usize,
    /// OOMs with a TTO over the middle half of the life.
    pub with_spread: usize,
    /// Of those, a time within 10 % at every reading there.
    pub spread_met: usize,
    /// Legitimate runs judged.
    pub legitimate: usize,
    /// Seconds of high on them, summed.
    pub false_high_seconds: f64,
    /// Seconds of leak flag on them, summed.
    pub false_leak_seconds: f64,
    /// OOM runs (escalations).
    pub escalations: usize,
    /// Of those, transitions <= levels reached + 1.
    pub escalations_met: usize,
}

fn sees(source: &str, cause: &str) -> bool {
    source == "agent" || NVML_VISIBLE.contains(&cause)
}

fn is_oom(j: &Judged) -> bool {
    j.life.is_some()
}

/// Counts of one source's judgements.
pub fn goals(source: &'static str, judged: &[Judged]) -> Goals {
    let ooms: Vec<&Judged> = judged
        .iter()
        .filter(|j| is_oom(j) && sees(source, &j.cause))
        .collect();
    let long: Vec<&&Judged> = ooms
        .iter()
        .filter(|j| j.life.is_some_and(|l| l >= GOAL_LIFE_SECONDS))
        .collect();
    let legit: Vec<&Judged> = judged
        .iter()
        .filter(|j| LEGITIMATE.contains(&j.cause.as_str()))
        .collect();
    let escalations: Vec<&Judged> = judged.iter().filter(|j| is_oom(j)).collect();
    let sum =
        |f: fn(&Judged) -> f64| (legit.iter().map(|j| f(j)).sum::<f64>() * 10.0).round() / 10.0;
    Goals {
        source,
        long_ooms: long.len(),
        lead_met: long
            .iter()
            .filter(|j| j.lead_high.is_some_and(|l| l >= GOAL_LEAD_SECONDS))
            .count(),
        ooms: ooms.len(),
        lead_two_thirds: ooms
            .iter()
            .filter(
                |j| matches!((j.lead_high, j.life), (Some(l), Some(life)) if l >= life * 2.0 / 3.0),
            )
            .count(),
        with_tto: ooms.iter().filter(|j| j.tto_at_half.is_some()).count(),
        tto_met: ooms
            .iter()
            .filter(|j| {
                j.tto_at_half
                    .as_ref()
                    .is_some_and(|t| t.error_percent.abs() <= GOAL_TTO_PERCENT)
            })
            .count(),
        with_spread: ooms.iter().filter(|j| j.tto_spread.is_some()).count(),
        spread_met: ooms
            .iter()
            .filter(|j| {
                j.tto_spread.as_ref().is_some_and(|s| {
                    s.without == 0
                        && s.low_percent.abs().max(s.high_percent.abs()) <= GOAL_TTO_PERCENT
                })
            })
            .count(),
        legitimate: legit.len(),
        false_high_seconds: sum(|j| j.high_seconds),
        false_leak_seconds: sum(|j| j.false_leak_seconds),
        escalations: escalations.len(),
        escalations_met: escalations
            .iter()
            .filter(|j| j.transitions <= j.levels + 1)
            .count(),
    }
}

/// The four sources of an evaluation, in the table's order.
pub fn sources(e: &Evaluation) -> [(&'static str, &[Judged]); 4] {
    [
        ("nvml", &e.nvml),
        ("agent", &e.agent),
        ("usedAlert90", &e.used_alert),
        ("linear30s", &e.linear),
    ]
}

fn opt(v: Option<f64>) -> String {
    v.map_or("-".into(), |x| format!("{x:.1}"))
}

/// Whether the source's verdicts name a cause (memprof's do, the baselines' do not).
fn names(source: &str) -> bool {
    matches!(source, "nvml" | "agent")
}

/// LEAD (or on a legitimate run FALSE high/leak seconds), TTO, TR (and the
/// cause named, for memprof's sources) of one source.
fn cells(source: &str, j: Option<&Judged>) -> String {
    let named = |j: Option<&Judged>| {
        let n = j.and_then(|j| j.named.as_deref()).unwrap_or("-");
        let pid = j
            .and_then(|j| j.named_pid)
            .map_or(String::new(), |p| format!(" pid {p}"));
        if names(source) {
            format!(" {:<22}", format!("{n}{pid}"))
        } else {
            String::new()
        }
    };
    let Some(j) = j else {
        return format!("{:>11} {:>7} {:>5}{}", "", "", "", named(None));
    };
    let first = if LEGITIMATE.contains(&j.cause.as_str()) {
        format!("{:.0}/{:.0}", j.high_seconds, j.false_leak_seconds)
    } else if is_oom(j) {
        j.lead_high.map_or("never".into(), |l| format!("{l:.1}"))
    } else {
        format!("h@{}", opt(j.high))
    };
    let tto = j
        .tto_at_half
        .as_ref()
        .map_or("-".into(), |t| format!("{:+.0}%", t.error_percent));
    format!(
        "{first:>11} {tto:>7} {:>5}{}",
        format!("{}/{}", j.transitions, j.levels),
        named(Some(j))
    )
}

fn header() -> String {
    let mut out = String::from(
        "per cause and source (under each source's name its LEAD): LEAD = s from the first high to the OOM (never: no high; h@T: no OOM, first high T s \
         after the cause began; a legitimate run: s of high/s of leak flag, all false); TTO = error at half the \
         cause's life; TR = risk changes/levels reached above the first, from the cause's start to its end; NAMED = the cause memprof named at its \
         first high (never high: at its last reading)\n",
    );
    out.push_str(&format!(
        "{:<14} {:<14} {:>6}",
        "RECORDING", "CAUSE", "LIFE"
    ));
    for s in ["nvml", "agent", "usedAlert90", "linear30s"] {
        out.push_str(&format!(" | {s:>11} {:>7} {:>5}", "TTO", "TR"));
        if names(s) {
            out.push_str(&format!(" {:<22}", "NAMED"));
        }
    }
    out.push('\n');
    out
}

fn goals_line(g: &Goals) -> String {
    format!(
        "{}: first high >= {GOAL_LEAD_SECONDS:.0} s before the OOM {}/{} (lives >= {GOAL_LIFE_SECONDS:.0} s), \
         >= 2/3 of the life {}/{} (any life); TTO within {GOAL_TTO_PERCENT:.0} % at half-life {}/{}{}, \
         at every reading of the middle half of the life {}/{}; legitimate runs ({}): {} s high, {} s leak flag; transitions <= levels + 1: {}/{}\n",
        g.source,
        g.lead_met,
        g.long_ooms,
        g.lead_two_thirds,
        g.ooms,
        g.tto_met,
        g.with_tto,
        match g.ooms - g.with_tto {
            0 => String::new(),
            n => format!(" ({n} promised no time)"),
        },
        g.spread_met,
        g.with_spread,
        g.legitimate,
        g.false_high_seconds,
        g.false_leak_seconds,
        g.escalations_met,
        g.escalations
    )
}

/// A row's recording, cause and life, as both tables start it.
fn row_head(j: &Judged) -> String {
    format!("{:<14} {:<14} {:>6}", j.name, j.cause, opt(j.life))
}

/// One source's judgement of recording `name`.
fn find<'a>(list: &'a [Judged], name: &str) -> Option<&'a Judged> {
    list.iter().find(|x| x.name == name)
}

/// The per-cause table and each source's goal counts: for a person.
pub fn render(e: &Evaluation) -> String {
    let mut out = header();
    let srcs = sources(e);
    for j in &e.nvml {
        out.push_str(&row_head(j));
        for (s, list) in &srcs {
            out.push_str(&format!(" | {}", cells(s, find(list, &j.name))));
        }
        out.push('\n');
    }
    out.push_str(&spread_table(e));
    for g in &e.goals {
        out.push_str(&goals_line(g));
    }
    out
}

/// Each OOM's TTO error over the middle half of its cause's life, per
/// source: what one reading at half-life cannot show.
fn spread_table(e: &Evaluation) -> String {
    let mut out = String::from(
        "TTO error over the middle half of each cause's life (a quarter of it gone to three quarters): \
         the lowest..highest of the readings that gave a time, and how many did of those there\n",
    );
    let srcs = sources(e);
    for j in e.nvml.iter().filter(|j| is_oom(j)) {
        out.push_str(&row_head(j));
        for (_, list) in &srcs {
            let cell = find(list, &j.name)
                .and_then(|x| x.tto_spread.as_ref())
                .map_or("-".into(), |s| {
                    format!(
                        "{:+.0}..{:+.0}% {}/{}",
                        s.low_percent,
                        s.high_percent,
                        s.readings,
                        s.readings + s.without
                    )
                });
            out.push_str(&format!(" | {cell:>20}"));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evaluate::judge::judge;
    use crate::evaluate::judge::tests::{rec, replay};
    use crate::evaluate::recording::TruthKind;
    use memprof_api::RiskLevel;

    #[test]
    fn the_spread_goal_wants_a_time_within_10_percent_at_every_reading() {
        let r = rec(TruthKind::Other, "growingDemand", Some(100.0));
        let exact = judge(&r, &replay(|t| (RiskLevel::High, Some(100.0 - t), false)));
        let late = judge(
            &r,
            &replay(|t| (RiskLevel::High, Some(1.2 * (100.0 - t)), false)),
        );
        // Exact wherever it gives a time, but silent at one reading.
        let gap = judge(
            &r,
            &replay(|t| (RiskLevel::High, (t != 50.0).then_some(100.0 - t), false)),
        );
        let g = goals("agent", &[exact, late, gap]);
        assert_eq!((g.spread_met, g.with_spread), (1, 3));
    }
}
