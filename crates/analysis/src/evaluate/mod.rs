//! How good the verdicts are on recordings with their truth (the leak
//! flag and time to OOM per recording, and the per-cause benchmark): each recording replayed
//! through the sidecar's analysis ([`crate::tracker::Tracker`]) from its
//! NVML trace alone and with the in-process agent's pushes, and two
//! baselines computed from the same trace ([`baseline`]), judged against
//! what really happened. `memprof analyze --evaluate DIR` prints it;
//! docs/analysis.md and docs/gpu-results.md quote it.
//!
//! Pure: the caller reads the files ([`recording`] takes a reader).

pub mod baseline;
pub mod causes;
pub mod judge;
pub mod recording;
pub mod replay;

use judge::{judge, totals, Judged, Totals};
use memprof_api::thresholds::Thresholds;
use recording::Recording;
use replay::{replay, Mode};
use serde::Serialize;

/// Every recording judged in both modes, and the counts per mode.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Evaluation {
    /// From the NVML trace alone.
    pub nvml: Vec<Judged>,
    /// With the agent's pushes (recordings without pushes are left out).
    pub agent: Vec<Judged>,
    /// Counts from the NVML trace alone.
    pub nvml_totals: Totals,
    /// Counts with the agent.
    pub agent_totals: Totals,
    /// The dcgm-exporter alert at 90 % of device memory used ([`baseline::used_alert`]).
    pub used_alert: Vec<Judged>,
    /// The straight line to the total ([`baseline::linear`]).
    pub linear: Vec<Judged>,
    /// Each source's counts against the verdict's goals (docs/gpu-results.md), in the order nvml,
    /// agent, usedAlert90, linear30s.
    pub goals: Vec<causes::Goals>,
}

/// Replays and judges every recording.
pub fn evaluate(recordings: &[Recording], th: &Thresholds) -> Evaluation {
    let nvml: Vec<Judged> = recordings
        .iter()
        .map(|r| judge(r, &replay(r, th, Mode::Nvml)))
        .collect();
    let agent: Vec<Judged> = recordings
        .iter()
        .filter(|r| !r.pushes.is_empty())
        .map(|r| judge(r, &replay(r, th, Mode::Agent)))
        .collect();
    let used_alert: Vec<Judged> = recordings
        .iter()
        .map(|r| judge(r, &baseline::used_alert(r)))
        .collect();
    let linear: Vec<Judged> = recordings
        .iter()
        .map(|r| judge(r, &baseline::linear(r, th)))
        .collect();
    let goals = vec![
        causes::goals("nvml", &nvml),
        causes::goals("agent", &agent),
        causes::goals("usedAlert90", &used_alert),
        causes::goals("linear30s", &linear),
    ];
    Evaluation {
        nvml_totals: totals(&nvml),
        agent_totals: totals(&agent),
        nvml,
        agent,
        used_alert,
        linear,
        goals,
    }
}

fn cell(v: Option<f64>) -> String {
    v.map_or("-".into(), |x| format!("{x:.1}"))
}

/// One line per recording and mode, then the counts: for a person.
pub fn render(e: &Evaluation) -> String {
    let mut out = String::from(
        "times in s after the leak began (no leak: after the start); flag-vis: the leak flag after the leak became visible\n",
    );
    out.push_str(&format!(
        "{:<22} {:<5} {:<5} {:>6} {:>5} {:>6} {:>8} {:>6} {:>6} {:>5} {:<9} {}\n",
        "RECORDING",
        "MODE",
        "TRUTH",
        "LIFE",
        "VIS",
        "LEAK",
        "FLAG-VIS",
        "HIGH",
        "CRIT",
        "FALSE",
        "WORST",
        "TTO@HALF"
    ));
    for (mode, list) in [("nvml", &e.nvml), ("agent", &e.agent)] {
        for j in list {
            out.push_str(&row(mode, j));
        }
    }
    for (mode, t) in [("nvml", &e.nvml_totals), ("agent", &e.agent_totals)] {
        out.push_str(&totals_line(mode, t));
    }
    out.push('\n');
    out.push_str(&causes::render(e));
    out
}

fn row(mode: &str, j: &Judged) -> String {
    let tto = j.tto_at_half.as_ref().map_or("-".into(), |t| {
        format!(
            "{:.1} vs {:.1} ({:+.1}%)",
            t.estimate, t.truth, t.error_percent
        )
    });
    let mut out = format!(
        "{:<22} {:<5} {:<5} {:>6} {:>5} {:>6} {:>8} {:>6} {:>6} {:>5} {:<9} {}\n",
        j.name,
        mode,
        j.truth,
        cell(j.life),
        cell(j.visible),
        cell(j.leak_flag),
        cell(j.leak_flag_after_visible),
        cell(j.high),
        cell(j.critical),
        j.false_flags,
        j.worst.to_string(),
        tto
    );
    if let Some(a) = &j.after_oom {
        out.push_str(&format!(
            "{:<28}   after the OOM: growth={:?} fragmentation={} advice={} kept from before the OOM={}\n",
            "",
            a.growth,
            a.fragmentation.map_or("-".into(), |f| format!("{f:.3}")),
            a.advice,
            a.kept_from_before
        ));
    }
    out
}

fn totals_line(mode: &str, t: &Totals) -> String {
    format!(
        "{mode}: leak flag precision {} recall {} ({} true, {} scenario(s) with false flags, {} leaks); \
         flag within 15 s of visible {}/{}; TTO within 20 % at half-life {}/{} (leaks living >= 30 s)\n",
        t.precision.map_or("-".into(), |p| format!("{p:.2}")),
        t.recall.map_or("-".into(), |r| format!("{r:.2}")),
        t.true_flags,
        t.false_flag_scenarios,
        t.leaks,
        t.flagged_within_15s_of_visible,
        t.with_visibility,
        t.tto_within_20_percent,
        t.long_lived
    )
}
