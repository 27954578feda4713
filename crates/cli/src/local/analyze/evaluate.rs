//! `memprof analyze --evaluate PATH`: how good memprof's verdicts are on
//! recordings whose truth is known. PATH is a `bench/gpu/record.sh` set
//! (a folder with plan.txt and NAME.{trace.csv,pushes.jsonl,summary.json,
//! steps.csv,sidecar.log}), a folder of fixture traces (`*.csv` whose `#`
//! lines give `leak_from_s`, `oom_at_s`), or one such trace. Every recording
//! is replayed through the sidecar's analysis from its NVML trace alone and
//! with the agent's pushes (`memprof_analysis::evaluate`), and judged: leak
//! flag precision and recall, flag latency after the leak became visible,
//! first high/critical, false flags, time to OOM at half the leak's life,
//! and the verdict after the OOM; then per cause and source beside two
//! baselines (a 90 % used alert, a straight line to the total): lead of the
//! first high before the OOM, TTO error at half-life, false seconds on
//! legitimate runs, risk transitions. Tables, or `-o json|yaml`.

use crate::output::{structured, Format};
use anyhow::Context as _;
use memprof_analysis::evaluate::recording::{
    read_fixture, read_scenario, set_scenarios, Recording,
};
use memprof_analysis::evaluate::{evaluate, render};
use memprof_api::thresholds::Thresholds;
use std::path::Path;

/// Reads the recordings under `path`.
pub fn recordings(path: &Path) -> anyhow::Result<Vec<Recording>> {
    if path.is_file() {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let name = path
            .file_name()
            .map_or(String::new(), |n| n.to_string_lossy().into());
        return Ok(vec![read_fixture(&name, &text)?]);
    }
    let read = |name: &str| std::fs::read_to_string(path.join(name)).ok();
    let scenarios = set_scenarios(&read);
    if !scenarios.is_empty() {
        return scenarios
            .into_iter()
            .map(|(name, kind)| Ok(read_scenario(&read, &name, kind)?))
            .collect();
    }
    let mut traces: Vec<_> = std::fs::read_dir(path)
        .with_context(|| format!("cannot read the folder {}", path.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "csv"))
        .collect();
    traces.sort();
    traces
        .iter()
        .map(|p| recordings(p).map(|mut v| v.remove(0)))
        .collect()
}

/// Evaluates the recordings under `path`; the text for stdout.
pub fn run(path: &Path, th: &Thresholds, format: Format) -> anyhow::Result<String> {
    let recs = recordings(path)?;
    anyhow::ensure!(
        !recs.is_empty(),
        "{}: no recordings (a record.sh folder with plan.txt, or trace CSVs with `# oom_at_s=` truth lines)",
        path.display()
    );
    let e = evaluate(&recs, th);
    Ok(if format.is_structured() {
        structured(&e, format)
    } else {
        render(&e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The held-out causes set through the command, as a user runs it:
    /// the per-cause table, and in JSON the two baselines beside memprof's
    /// sources for each of its seven recordings.
    #[test]
    fn the_causes_set_is_judged_per_cause_beside_the_baselines() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/recordings/causes-heldout");
        let text = run(&dir, &Thresholds::default(), Format::Table).unwrap();
        assert!(text.contains("per cause and source"), "{text}");
        assert!(text.contains("neighbour      neighbour"), "{text}");
        assert!(text.contains("usedAlert90: first high"), "{text}");
        let json = run(&dir, &Thresholds::default(), Format::Json).unwrap();
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        for key in ["nvml", "agent", "usedAlert", "linear"] {
            assert_eq!(v[key].as_array().map(Vec::len), Some(7), "{key}");
        }
        assert_eq!(v["linear"][0]["cause"], "growingDemand");
        let goals = v["goals"].as_array().unwrap();
        let names: Vec<&str> = goals
            .iter()
            .map(|g| g["source"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["nvml", "agent", "usedAlert90", "linear30s"]);
        assert_eq!(goals[1]["legitimate"], 3);
    }

    #[test]
    fn the_repository_fixtures_evaluate_without_false_flags() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/traces");
        let text = run(&dir, &Thresholds::default(), Format::Table).unwrap();
        assert!(text.contains("leak100_h100.csv"), "{text}");
        let json = run(&dir, &Thresholds::default(), Format::Json).unwrap();
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["nvmlTotals"]["falseFlagScenarios"], 0, "{text}");
        assert_eq!(v["nvmlTotals"]["leaks"], 4, "{text}");
        let missing = run(
            Path::new("/nonexistent-memprof-dir"),
            &Thresholds::default(),
            Format::Table,
        );
        assert!(missing.is_err());
    }
}
