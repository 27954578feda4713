//! Levels that hold, on every recording in the repository: each fixture
//! set of `tests/fixtures/recordings/*/` replayed through the sidecar's
//! [`Tracker`] from NVML alone and with the agent's pushes, as `memprof
//! analyze --evaluate` replays it, with every GPU's published verdict of
//! every analysis checked against its own evidence ([`verdict::check`]),
//! and each recorded leak's escalation counted.
//!
//! The replay is the judge's (samples grouped by time, pushes received and
//! NVML's per-process polls made up to a sample's time applied before it,
//! one analysis per second of trace),
//! kept here because the judge rolls a pod's GPUs up into one reading and
//! this test needs each GPU's verdict and whether its level was held.

use memprof_analysis::evaluate::recording::{read_scenario, set_scenarios, Recording};
use memprof_analysis::evaluate::replay::{drive, Mode};
use memprof_analysis::tracker::GpuVerdict;
use memprof_analysis::verdict;
use memprof_api::thresholds::Thresholds;
use memprof_api::RiskLevel;
use std::path::{Path, PathBuf};

fn recordings_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/recordings")
}

/// Every set (a folder with a `plan.txt`) and its recordings.
fn all_sets() -> Vec<(String, Vec<Recording>)> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(recordings_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("plan.txt").is_file())
        .collect();
    dirs.sort();
    dirs.iter()
        .map(|dir| {
            let read = |file: &str| std::fs::read_to_string(dir.join(file)).ok();
            let recs = set_scenarios(&read)
                .into_iter()
                .map(|(name, kind)| read_scenario(&read, &name, kind).unwrap())
                .collect();
            let name = dir.file_name().unwrap().to_string_lossy().to_string();
            (name, recs)
        })
        .collect()
}

/// One analysis: its time and every GPU's published verdict.
type Analysis = (f64, Vec<GpuVerdict>);

/// `rec` through the judge's own replay ([`drive`]), with the agent's pushes
/// or without: every analysis's time and published verdicts.
fn replay(rec: &Recording, th: &Thresholds, with_agent: bool) -> Vec<Analysis> {
    let mode = if with_agent { Mode::Agent } else { Mode::Nvml };
    let mut out = Vec::new();
    drive(rec, th, mode, |t, v| out.push((t, v.to_vec())));
    out
}

/// Changes of GPU 0's published level over `analyses`.
fn transitions(analyses: &[Analysis]) -> Vec<(f64, RiskLevel)> {
    let levels: Vec<(f64, RiskLevel)> = analyses
        .iter()
        .filter_map(|(t, v)| Some((*t, v.first()?.assessment.risk)))
        .collect();
    levels
        .windows(2)
        .filter(|w| w[0].1 != w[1].1)
        .map(|w| w[1])
        .collect()
}

/// "levels that hold": no published level contradicts its own
/// time to OOM and confidence. Every recording, both modes, every GPU of
/// every analysis (the replay runs the same Tracker the sidecar runs).
#[test]
fn every_published_verdict_of_every_recording_agrees_with_its_evidence() {
    let th = Thresholds::default();
    let sets = all_sets();
    assert!(sets.len() >= 3, "dev, heldout and fresh at least");
    let mut checked = 0;
    for (set, recs) in &sets {
        for rec in recs {
            for with_agent in [false, true] {
                for (t, verdicts) in replay(rec, &th, with_agent) {
                    for v in &verdicts {
                        if let Err(e) = verdict::check(&v.assessment, &th, v.held) {
                            panic!("{set}/{} agent={with_agent} t={t:.1}: {e}", rec.name);
                        }
                        // A level the hysteresis holds above the reading says
                        // until when, and only such a level.
                        let until = v.held_until.filter(|u| *u >= t);
                        let gate_holds = v.assessment.risk > v.raw_risk;
                        assert_eq!(
                            gate_holds,
                            until.is_some(),
                            "{set}/{} t={t:.1} {v:?}",
                            rec.name
                        );
                        checked += 1;
                    }
                }
            }
        }
    }
    assert!(checked > 1000, "{checked} verdicts checked");
}

/// A monotone escalation reads low → medium → high → critical
/// once each. Each recorded leak, from its start to its OOM, in both
/// modes: at most (levels reached + 1) changes of the published level,
/// and none of them a fall. (An OOM frees the trainer's memory: what
/// follows is no escalation.)
#[test]
fn a_recorded_leak_escalates_at_most_once_per_level_reached_plus_one() {
    let th = Thresholds::default();
    let mut leaks = 0;
    for (set, recs) in &all_sets() {
        for rec in recs.iter().filter(|r| r.truth.leak_from.is_some()) {
            let end = rec.truth.oom_at.unwrap_or(rec.truth.end);
            for with_agent in [false, true] {
                let mut analyses = replay(rec, &th, with_agent);
                analyses.retain(|(t, _)| *t >= rec.truth.start && *t < end);
                let changes = transitions(&analyses);
                let reached: std::collections::BTreeSet<RiskLevel> = analyses
                    .iter()
                    .filter_map(|(_, v)| Some(v.first()?.assessment.risk))
                    .collect();
                println!(
                    "{set}/{} agent={with_agent}: {} changes over {reached:?}: {changes:?}",
                    rec.name,
                    changes.len()
                );
                assert!(
                    changes.len() <= reached.len() + 1,
                    "{set}/{} agent={with_agent}: {changes:?}",
                    rec.name
                );
                // Stricter than the bound: no fall at all before the OOM.
                let mut prev = RiskLevel::None;
                for &(t, level) in &changes {
                    assert!(
                        level > prev,
                        "{set}/{} agent={with_agent}: fell to {level:?} at {t:.1}: {changes:?}",
                        rec.name
                    );
                    prev = level;
                }
                leaks += 1;
            }
        }
    }
    assert!(leaks >= 20, "{leaks} leak replays");
}
