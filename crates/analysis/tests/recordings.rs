//! The verdicts on real H100 recordings (`tests/fixtures/recordings/dev`,
//! recorded by `bench/gpu/record.sh dev`), on the H200 recordings of every
//! cause of an OOM (`recordings/causes-dev`, `recordings/causes-heldout`)
//! and on the repository's NVML traces (`tests/fixtures/traces`), replayed
//! through the sidecar's analysis (the `Tracker`) from NVML alone and with
//! the agent's pushes, beside two baselines, judged against what really
//! happened. What each number means: docs/analysis.md; the per-cause
//! numbers: docs/gpu-results.md.

use memprof_analysis::evaluate::causes::goals;
use memprof_analysis::evaluate::judge::Judged;
use memprof_analysis::evaluate::recording::{
    read_fixture, read_scenario, set_scenarios, Recording,
};
use memprof_analysis::evaluate::replay::{replay, Mode};
use memprof_analysis::evaluate::{evaluate, render, Evaluation};
use memprof_api::thresholds::Thresholds;
use memprof_api::{Cause, MemoryGrowth, RiskLevel};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

/// The recordings of the set `recordings/NAME`, which must hold `n`.
fn set(name: &str, n: usize) -> Vec<Recording> {
    let dir = root().join("recordings").join(name);
    let read = |file: &str| std::fs::read_to_string(dir.join(file)).ok();
    let scenarios = set_scenarios(&read);
    assert_eq!(scenarios.len(), n, "{name}");
    scenarios
        .into_iter()
        .map(|(name, kind)| read_scenario(&read, &name, kind).unwrap())
        .collect()
}

/// Every recording of the set `recordings/NAME`.
fn whole(name: &str) -> Vec<Recording> {
    let dir = root().join("recordings").join(name);
    let read = |file: &str| std::fs::read_to_string(dir.join(file)).ok();
    let n = set_scenarios(&read).len();
    set(name, n)
}

/// The set's evaluation, printed as `memprof analyze --evaluate` prints it.
fn evaluation(name: &str, n: usize) -> Evaluation {
    let e = evaluate(&set(name, n), &Thresholds::default());
    println!("{}", render(&e));
    e
}

fn traces() -> Vec<Recording> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(root().join("traces"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            read_fixture(&name, &std::fs::read_to_string(p).unwrap()).unwrap()
        })
        .collect()
}

fn one<'a>(list: &'a [Judged], name: &str) -> &'a Judged {
    list.iter().find(|j| j.name == name).unwrap()
}

/// A legitimate run: no second of high and none of leak flag from either source.
fn quiet_from_both(e: &Evaluation, run: &str) {
    for j in [one(&e.nvml, run), one(&e.agent, run)] {
        assert_eq!((j.high_seconds, j.false_leak_seconds), (0.0, 0.0), "{j:?}");
    }
}

fn dev_evaluation() -> Evaluation {
    evaluation("dev", 9)
}

/// With the agent, every leak is flagged within 15 s of
/// becoming visible in allocated memory and nothing else is; the time to OOM
/// at half the leak's life is within 20 % for every leak that lived 30 s or
/// more. (Before: leak100 and valloss never flagged, the others 14.0–15.6 s
/// after visible, TTO +19.7 %, +20.3 %, +53.8 %.)
#[test]
fn with_the_agent_every_leak_is_flagged_within_15_s_and_its_oom_predicted_within_20_percent() {
    let e = dev_evaluation();
    let t = &e.agent_totals;
    assert_eq!(
        (t.leaks, t.true_flags, t.false_flag_scenarios),
        (7, 7, 0),
        "{t:?}"
    );
    assert_eq!(t.flagged_within_15s_of_visible, 7, "{t:?}");
    assert_eq!((t.long_lived, t.tto_within_20_percent), (3, 3), "{t:?}");
    // No leak, no alarm: a batch that grew four times warns at most.
    assert!(one(&e.agent, "growbatch").worst <= RiskLevel::Medium);
    assert!(one(&e.agent, "steadyeval").worst <= RiskLevel::Low);
}

/// From NVML alone a leak is called only when the data show
/// one (a regular staircase after the trainer's start): no false flag on
/// the dev set or the fixtures, a batch that grew four times never above
/// medium; what NVML cannot tell (a leak that starts with the trainer, a
/// 30 MB/s leak inside a 60 GB cache) is left unflagged. (Before: 3 of 11
/// leaks flagged, the growing batch critical at 73 s.)
#[test]
fn from_nvml_alone_a_leak_is_called_only_when_the_data_show_one() {
    let e = dev_evaluation();
    let mut all = e.nvml.clone();
    all.extend(evaluate(&traces(), &Thresholds::default()).nvml);
    assert!(all.iter().all(|j| j.false_flags == 0), "{all:?}");
    for name in ["growbatch", "steadyeval"] {
        let j = one(&all, name);
        assert!(
            j.worst <= RiskLevel::Medium && j.leak_flag.is_none(),
            "{j:?}"
        );
    }
    let flagged: Vec<&str> = all
        .iter()
        .filter(|j| j.leak_flag.is_some())
        .map(|j| j.name.as_str())
        .collect();
    for name in [
        "leak500",
        "leak100",
        "emptycache",
        "fullgpu",
        "valloss",
        "leak100_h100.csv",
        "leak300_h100.csv",
        "leak1000_h100.csv",
        "leak1000_h200.csv",
    ] {
        assert!(flagged.contains(&name), "{name} not flagged: {flagged:?}");
    }
    for name in ["leak2000", "slowleak"] {
        assert!(!flagged.contains(&name), "{name}");
    }
    // The staircase's time to OOM on the long-lived leaks.
    for j in all
        .iter()
        .filter(|j| j.life.is_some_and(|l| l >= 30.0) && j.name != "leak2000")
    {
        let tto = j.tto_at_half.as_ref().unwrap_or_else(|| panic!("{j:?}"));
        assert!(tto.error_percent.abs() <= 20.0, "{j:?}");
    }
}

/// After a leak's OOM the report keeps the verdict from
/// before it: a leak, not cache, not fragmentation. (Before: leak100 and
/// valloss said `growth: cache` after their OOM.)
#[test]
fn after_a_leaks_oom_the_report_keeps_the_verdict_from_before_it() {
    let e = dev_evaluation();
    for j in e.agent.iter().filter(|j| j.truth == "oom") {
        let a = j.after_oom.as_ref().unwrap_or_else(|| panic!("{j:?}"));
        assert!(a.kept_from_before, "{j:?}");
        assert_eq!(a.growth, MemoryGrowth::Leak, "{j:?}");
        assert!(a.fragmentation.is_some_and(|f| f < 0.25), "{j:?}");
    }
}

/// The held-out H100 set (other seeds, rates 22 MB/s to 1.7 GB/s, headrooms
/// and cadences; never seen while the analysis was tuned, first evaluated
/// on 2026-11-24 and committed afterwards, so from now on it is a
/// regression fixture, not a held-out set). What it showed, pinned: with the
/// agent every leak flagged within 15 s of visible, no false flag, the time
/// to OOM at half-life within 20 % for the three leaks that lived 30 s or
/// more; from NVML alone 5 of 7 leaks, 4 within 15 s of visible, no false
/// flag. (Before, main at b0c3e97: agent 4/7 flagged, 1 within 15 s, TTO 1/3.)
#[test]
fn on_the_held_out_set_the_verdicts_hold_as_on_the_dev_set() {
    let e = evaluation("heldout", 9);
    let t = &e.agent_totals;
    assert_eq!(
        (t.leaks, t.true_flags, t.false_flag_scenarios),
        (7, 7, 0),
        "{t:?}"
    );
    assert_eq!(t.flagged_within_15s_of_visible, 7, "{t:?}");
    assert_eq!((t.long_lived, t.tto_within_20_percent), (3, 3), "{t:?}");
    assert!(one(&e.agent, "growbatch").worst <= RiskLevel::Medium);
    assert!(one(&e.agent, "steadyeval").worst <= RiskLevel::Low);
    let n = &e.nvml_totals;
    assert_eq!((n.true_flags, n.false_flag_scenarios), (5, 0), "{n:?}");
    assert_eq!(n.flagged_within_15s_of_visible, 4, "{n:?}");
    for j in e.agent.iter().filter(|j| j.truth == "oom") {
        let a = j.after_oom.as_ref().unwrap_or_else(|| panic!("{j:?}"));
        assert!(
            a.kept_from_before && a.growth == MemoryGrowth::Leak,
            "{j:?}"
        );
    }
}

/// The fresh H100 set, recorded after the tuning with the sidecar and agent
/// it produced (another model shape, rates 40 MB/s – 2.5 GB/s). What held
/// and what did not, pinned so that a change is seen either way: no false
/// flag in either mode; with the agent 6 of 7 leaks flagged within 15 s of
/// visible and the time to OOM at half-life within 20 % for both long-lived
/// leaks. The misses (docs/analysis.md, "The fresh set"): valloss (graphs
/// kept every 5 s, dead 15 s after its first kept graph) is never flagged and
/// its report says `cache` after the OOM; from NVML alone the growing batch
/// reaches high.
#[test]
fn on_the_fresh_set_no_false_flag_and_the_misses_are_the_known_ones() {
    let e = evaluation("fresh", 8);
    let (a, n) = (&e.agent_totals, &e.nvml_totals);
    assert_eq!(
        (a.leaks, a.true_flags, a.false_flag_scenarios),
        (7, 6, 0),
        "{a:?}"
    );
    assert_eq!(a.flagged_within_15s_of_visible, 6, "{a:?}");
    assert_eq!((a.long_lived, a.tto_within_20_percent), (2, 2), "{a:?}");
    assert_eq!((n.true_flags, n.false_flag_scenarios), (5, 0), "{n:?}");
    assert!(one(&e.agent, "valloss").leak_flag.is_none());
    assert!(one(&e.agent, "growbatch").worst <= RiskLevel::Medium);
    assert_eq!(one(&e.nvml, "growbatch").worst, RiskLevel::High);
}

/// A summary's JSON of a scenario of the set `recordings/NAME`.
fn summary(set: &str, scenario: &str) -> serde_json::Value {
    let path = root()
        .join("recordings")
        .join(set)
        .join(format!("{scenario}.summary.json"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// What the baselines give is a function of the NVML traces alone: pinned
/// exactly. The dcgm-exporter alert never fires on the legitimate runs and
/// flaps on the growing demand (5 changes for 1 level); the straight line
/// fires on every legitimate run (the warm-up's rise extrapolates to the
/// card within 600 s).
fn baselines_as_first_judged(e: &Evaluation, set: &str) {
    let used = goals("usedAlert90", &e.used_alert);
    let line = goals("linear30s", &e.linear);
    assert_eq!(
        (used.false_high_seconds, used.false_leak_seconds),
        (0.0, 0.0),
        "{used:?}"
    );
    assert!(line.false_high_seconds >= 40.0, "{line:?}");
    assert!(e
        .used_alert
        .iter()
        .all(|j| j.named.is_none() && j.false_flags == 0));
    if set == "causes-heldout" {
        assert_eq!(one(&e.used_alert, "growdemand").transitions, 9);
        assert_eq!(one(&e.linear, "neighbour").lead_high, Some(97.3));
        assert_eq!(one(&e.used_alert, "neighbour").lead_high, Some(32.3));
    }
}

/// From both sources: no false high and no false leak flag on the three
/// legitimate runs, every escalation within levels + 1 transitions, and
/// the neighbour's time to OOM at half its life within `tto_percent`.
fn legitimate_quiet_escalations_clean_neighbour_timed(e: &Evaluation, tto_percent: f64) {
    for (source, list) in [("nvml", &e.nvml), ("agent", &e.agent)] {
        let g = goals(source, list);
        assert_eq!(
            (g.legitimate, g.false_high_seconds, g.false_leak_seconds),
            (3, 0.0, 0.0),
            "{g:?}"
        );
        assert_eq!(g.escalations_met, g.escalations, "{g:?}");
        let n = one(list, "neighbour");
        assert!(
            n.tto_at_half
                .as_ref()
                .is_some_and(|t| t.error_percent.abs() <= tto_percent),
            "{n:?}"
        );
    }
}

/// The per-cause goals on the causes-heldout H200 set (recorded again
/// with the neighbour outside the agent and lives of 98-115 s): what held
/// after the analysis changes its first look informed (the floor read over
/// the last few buckets and a scattered floor read as no leak, after it
/// named its growing demand a leak; the released ceiling, after it timed
/// that demand 28 % short), pinned with bounds an improvement keeps: no
/// false high and no false leak flag on the legitimate runs from either
/// source; every escalation within levels + 1 transitions; the neighbour's
/// TTO at half-life within 5 % and its first high 71 s before the card was
/// full from either source; the growing demand's first high 78 s (NVML)
/// and 61 s (agent) before its OOM, named growing demand by the agent,
/// its TTO at half-life within 10 % with the agent; fragmentation named by
/// the agent 85 s before its OOM; a false leak flag in at most one
/// scenario with the agent (the fragmenter keeps small blocks, which the
/// agent reads as one) and two from NVML (the neighbour's steps and the
/// growing demand's pace, which NVML cannot tell from a leak's). The sets
/// never looked at before judging are causes-fresh and causes-fresh2.
#[test]
fn causes_heldout_per_cause_as_first_judged() {
    let e = evaluation("causes-heldout", 7);
    legitimate_quiet_escalations_clean_neighbour_timed(&e, 5.0);
    assert!(one(&e.nvml, "neighbour").lead_high >= Some(71.0));
    assert!(one(&e.agent, "neighbour").lead_high >= Some(71.0));
    assert!(one(&e.agent, "growdemand").lead_high >= Some(61.0));
    assert!(one(&e.nvml, "growdemand").lead_high >= Some(78.0));
    let demand = one(&e.agent, "growdemand");
    assert_eq!(demand.named.as_deref(), Some("growingDemand"));
    assert!(
        demand
            .tto_at_half
            .as_ref()
            .is_some_and(|t| t.error_percent.abs() <= 10.0),
        "{demand:?}"
    );
    assert!(one(&e.agent, "fragmentation").lead_high >= Some(85.0));
    assert_eq!(
        one(&e.agent, "fragmentation").named.as_deref(),
        Some("fragmentation")
    );
    // NVML's second: the growing demand's regular pace once its cache
    // holds the card (234 MiB every 2 s), which a gap one slot short had
    // hidden until rises were read by their schedule (as causes-fresh's
    // growing demand already read).
    assert!(
        e.agent_totals.false_flag_scenarios <= 1 && e.nvml_totals.false_flag_scenarios <= 2,
        "{:?} {:?}",
        e.agent_totals,
        e.nvml_totals
    );
    baselines_as_first_judged(&e, "causes-heldout");
}

/// The replay feeds NVML's per-process usage (NAME.processes.csv) to the
/// tracker as the live sidecar's sampler does: from NVML alone, the
/// verdict on the neighbour names the neighbour's pid (the process the
/// recording started); without the file, no pid.
#[test]
fn the_neighbours_pid_reaches_the_verdict_through_the_recorded_process_usage() {
    let recs = set("causes-heldout", 7);
    let rec = recs.iter().find(|r| r.name == "neighbour").unwrap();
    let pid = summary("causes-heldout", "neighbour")["neighbour"]["pid"]
        .as_u64()
        .unwrap() as u32;
    assert!(!rec.processes.is_empty());
    let with = evaluate(std::slice::from_ref(rec), &Thresholds::default());
    assert_eq!(one(&with.nvml, "neighbour").named_pid, Some(pid));
    let mut blind = rec.clone();
    blind.processes.clear();
    let without = evaluate(&[blind], &Thresholds::default());
    assert_eq!(one(&without.nvml, "neighbour").named_pid, None);
}

/// On the GPU through the real `memprof-sidecar`: the
/// first causes-heldout recording's growing demand (kept in `causes-split`) died of a CUDA OOM 75 s after its ramp began;
/// the same run with the agent's `MicroBatchLoop` listening split its
/// micro-batch on the sidecar's critical, 31 s into the ramp (44 s before
/// the control's OOM), kept 12 samples per optimizer step on every step,
/// and ran to its end, 106 s into the ramp, at sequences the control never
/// survived.
#[test]
fn the_real_sidecar_split_the_micro_batch_before_the_oom_and_kept_the_global_batch() {
    let control = summary("causes-split", "growdemand");
    let split = summary("causes-split", "demandsplit");
    let num = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap();
    assert_eq!(control["exit"], "oom");
    let control_life = num(&control, "oomAt") - num(&control, "causeFrom");
    assert_eq!(split["exit"], "duration");
    assert!(split["oomAt"].is_null());
    let first = &split["splitAt"][0];
    let split_after = first[0].as_f64().unwrap() - num(&split, "causeFrom");
    assert_eq!(first[1], 2);
    assert!(
        split_after < control_life - 30.0,
        "{split_after} vs {control_life}"
    );
    assert_eq!(split["samplesPerStep"], serde_json::json!([12]));
    assert_eq!(control["samplesPerStep"], serde_json::json!([12]));
    assert!(num(&split, "end") - num(&split, "causeFrom") > control_life + 25.0);
}

/// The dev set of the causes (tune on it): what held when it was
/// committed, with bounds an improvement keeps: no false high and no false
/// leak flag on the legitimate runs; every escalation within levels + 1
/// transitions; the neighbour's first high 79 s before the card was full
/// from either source, its TTO at half-life within 5 %; the growing
/// demand's first high 77 s (NVML) and 60 s (agent) before its OOM.
#[test]
fn causes_dev_per_cause_as_first_judged() {
    let e = evaluation("causes-dev", 7);
    legitimate_quiet_escalations_clean_neighbour_timed(&e, 5.0);
    assert!(one(&e.nvml, "neighbour").lead_high >= Some(79.0));
    assert!(one(&e.agent, "neighbour").lead_high >= Some(79.0));
    assert!(one(&e.nvml, "growdemand").lead_high >= Some(77.0));
    assert!(one(&e.agent, "growdemand").lead_high >= Some(60.0));
    baselines_as_first_judged(&e, "causes-dev");
}

/// The two sets nobody looked at before the analysis of d3db612 judged
/// them (`recordings/causes-fresh`, `causes-fresh2`), as first judged:
/// from both sources no false high and no false leak flag on the
/// legitimate runs, every escalation within levels + 1 transitions, the
/// neighbour's TTO at half-life within 2 % and its first high 73 s and
/// 65 s before the card was full; the growing demand's first high 76 s and
/// 94 s (NVML) and 57 s and 107 s (agent) before its OOM, its TTO at
/// half-life within 10 % with the agent; fragmentation named by the agent
/// 70 s and 90 s before its OOM, its TTO within 1 %. The misses (bounds
/// here keep them from getting worse, never pin them as misses) are in
/// docs/gpu-results.md: the agent's 57 s on causes-fresh's growing demand
/// (the goal is 60), the growing demand of causes-fresh2 named a leak by
/// the agent, NVML's time to OOM on a growing demand once the cache fills
/// the card, a spike never high.
#[test]
fn causes_fresh_sets_as_first_judged() {
    for (name, neighbour, demand_nvml, demand_agent, fragmentation) in [
        ("causes-fresh", 73.0, 76.0, 57.0, 70.0),
        ("causes-fresh2", 65.0, 94.0, 107.0, 90.0),
    ] {
        let e = evaluation(name, 7);
        legitimate_quiet_escalations_clean_neighbour_timed(&e, 2.0);
        assert!(
            one(&e.nvml, "neighbour").lead_high >= Some(neighbour),
            "{name}"
        );
        assert!(
            one(&e.agent, "neighbour").lead_high >= Some(neighbour),
            "{name}"
        );
        assert!(
            one(&e.nvml, "growdemand").lead_high >= Some(demand_nvml),
            "{name}"
        );
        let d = one(&e.agent, "growdemand");
        assert!(d.lead_high >= Some(demand_agent), "{name}");
        assert!(
            d.tto_at_half
                .as_ref()
                .is_some_and(|t| t.error_percent.abs() <= 10.0),
            "{name} {d:?}"
        );
        let f = one(&e.agent, "fragmentation");
        assert!(f.lead_high >= Some(fragmentation), "{name}");
        assert_eq!(f.named.as_deref(), Some("fragmentation"), "{name}");
        // NVML alone: 6 s ahead as first judged (the fragmenter's reserved
        // memory climbs from the start without a pause); 74 s and 95 s since
        // the start's climb is trusted once it held.
        let n = one(&e.nvml, "fragmentation");
        assert!(n.lead_high >= Some(fragmentation + 4.0), "{name} {n:?}");
        assert!(
            f.tto_at_half
                .as_ref()
                .is_some_and(|t| t.error_percent.abs() <= 1.0),
            "{name} {f:?}"
        );
    }
}

/// Leaks living >= 90 s (`recordings/leaks-long-a`, `leaks-long-b`), never
/// looked at before the analysis of dde9cb3 judged them, as first judged:
/// with the agent every leak flagged within 8 s of becoming visible, its
/// first high 89-95 s before the OOM and its TTO at half-life within 8 %;
/// from NVML alone, TTO within 5 % everywhere, the first high 74 s and 77 s
/// ahead on the two leaks that step. The two that grow smoothly from the
/// first step went high only 6 s and 10 s ahead as first judged (their
/// climb never left the trainer's start, and 800 MB/s in 524 MB segments
/// rose by one segment and two, turn about); since the start's climb is
/// trusted once it held and such turns are read in pairs, 75 s ahead (seen
/// data: the fresh smooth-leak sets judge that change).
#[test]
fn leaks_living_90_s_as_first_judged() {
    for (name, stepping, smooth) in [
        ("leaks-long-a", ("leak400", 74.0), ("leak1200", 74.0)),
        ("leaks-long-b", ("leak250", 77.0), ("leak800", 74.0)),
    ] {
        let e = evaluation(name, 2);
        assert_eq!(e.agent_totals.true_flags, 2, "{name}");
        assert_eq!(e.agent_totals.false_flag_scenarios, 0, "{name}");
        for j in &e.agent {
            assert!(
                j.leak_flag_after_visible.is_some_and(|f| f <= 8.0),
                "{name} {j:?}"
            );
            assert!(j.lead_high >= Some(89.0), "{name} {j:?}");
            let t = j.tto_at_half.as_ref().unwrap();
            assert!(t.error_percent.abs() <= 8.0, "{name} {j:?}");
        }
        for j in &e.nvml {
            let t = j.tto_at_half.as_ref().unwrap();
            assert!(t.error_percent.abs() <= 5.0, "{name} {j:?}");
        }
        assert!(
            one(&e.nvml, stepping.0).lead_high >= Some(stepping.1),
            "{name}"
        );
        assert!(one(&e.nvml, smooth.0).lead_high >= Some(smooth.1), "{name}");
    }
}

/// `recordings/smooth-c` and `smooth-d`, never looked at before the
/// analysis of e8d5a94 judged them, as first judged: from NVML alone the
/// time to OOM at half-life within 2 % on every leak and neighbour, and the
/// first high >= 69 s before the OOM on five of the six causes (leak900,
/// which rises smoothly with `empty_cache` every 5 s: 55 s, a miss in
/// docs/gpu-results.md that the bound here keeps from getting worse); with
/// the agent every first high >= 69 s ahead and every TTO within 7 %; no
/// false high or leak flag on the legitimate runs from either source.
#[test]
fn smooth_sets_as_first_judged() {
    for (name, nvml_leads) in [
        (
            "smooth-c",
            [("neighbour", 69.0), ("growdemand", 88.0), ("leak700", 74.0)],
        ),
        (
            "smooth-d",
            [("leak350", 74.0), ("leak900", 55.0), ("neighbour", 71.0)],
        ),
    ] {
        let e = evaluation(name, 4);
        for (scenario, lead) in nvml_leads {
            let n = one(&e.nvml, scenario);
            assert!(n.lead_high >= Some(lead), "{name} {n:?}");
            if scenario != "growdemand" {
                let t = n.tto_at_half.as_ref().expect("a time at half-life");
                assert!(t.error_percent.abs() <= 2.0, "{name} {n:?}");
            }
            let a = one(&e.agent, scenario);
            assert!(a.lead_high >= Some(69.0), "{name} {a:?}");
            let t = a.tto_at_half.as_ref().expect("a time at half-life");
            assert!(t.error_percent.abs() <= 7.0, "{name} {a:?}");
        }
        for j in e.nvml.iter().chain(&e.agent).filter(|j| j.life.is_none()) {
            assert_eq!(
                (j.high_seconds, j.false_leak_seconds),
                (0.0, 0.0),
                "{name} {j:?}"
            );
        }
    }
}

/// `recordings/smooth-a` and `smooth-b` (judged first with the analysis of
/// 3f64975; the pace change that followed was made on them, so they are
/// seen): smooth leaks from the first step go high >= 70 s before the OOM
/// from NVML alone with their TTO within 1 %. Legitimate weights loading
/// after the first steps (33 s, 60 s and 14 s climbs, then steady
/// training) is a miss of both sources, the same before the start change
/// (NVML reads a climb that paused once as running growth): seconds of high
/// and of leak flag NVML 11/24, 34/48, 0/0, the agent 28/30, 56/56, 8/8,
/// which bounds here keep from getting worse (docs/gpu-results.md).
#[test]
fn smooth_leaks_from_the_first_step_and_weights_loading() {
    for (name, leaks, loads) in [
        (
            "smooth-a",
            ["leak600", "leak300"],
            vec![("loadmid", (11.0, 24.0), (28.0, 30.0))],
        ),
        (
            "smooth-b",
            ["leak1000", "leak450"],
            vec![
                ("loadlong", (34.0, 48.0), (56.0, 56.0)),
                ("loadshort", (0.0, 0.0), (8.0, 8.0)),
            ],
        ),
    ] {
        let e = evaluation(name, 4);
        for leak in leaks {
            let n = one(&e.nvml, leak);
            assert!(n.lead_high >= Some(70.0), "{name} {n:?}");
            let t = n.tto_at_half.as_ref().expect("a time at half-life");
            assert!(t.error_percent.abs() <= 1.0, "{name} {n:?}");
        }
        for (load, nvml, agent) in loads {
            let (n, a) = (one(&e.nvml, load), one(&e.agent, load));
            assert!(n.high_seconds <= nvml.0, "{name} {n:?}");
            assert!(n.false_leak_seconds <= nvml.1, "{name} {n:?}");
            assert!(a.high_seconds <= agent.0, "{name} {a:?}");
            assert!(a.false_leak_seconds <= agent.1, "{name} {a:?}");
        }
    }
}

/// `recordings/setup-a` and `setup-b` (never looked at before the analysis
/// of 6b00d1d judged them; the agent counts optimizer steps), as first
/// judged: with the agent, weights loading after the first steps raised
/// 6, 10, 10 and 9 s of high (33, 74, 10 and 49 s without the setup rule,
/// on the same pushes), while the leaks and the growing demand, whose steps
/// run, kept their first high >= 71 s before the OOM and their TTO at
/// half-life within 3 %. NVML alone is unchanged by the rule (its loads:
/// 9, 50, 0 and 31 s of high), a miss in docs/gpu-results.md that the
/// bounds here keep from getting worse.
#[test]
fn setup_sets_as_first_judged() {
    for (name, loads, causes) in [
        (
            "setup-a",
            vec![("loadmid2", 9.0, 6.0), ("loadlong2", 50.0, 10.0)],
            vec!["leak500"],
        ),
        (
            "setup-b",
            vec![("loadshort2", 0.0, 10.0), ("load", 31.0, 9.0)],
            vec!["growdemand", "leak800s"],
        ),
    ] {
        let e = evaluation(name, 4);
        for (load, nvml, agent) in loads {
            let (n, a) = (one(&e.nvml, load), one(&e.agent, load));
            assert!(n.high_seconds <= nvml, "{name} {n:?}");
            assert!(a.high_seconds <= agent, "{name} {a:?}");
        }
        for cause in causes {
            let a = one(&e.agent, cause);
            assert!(a.lead_high >= Some(71.0), "{name} {a:?}");
            let t = a.tto_at_half.as_ref().expect("a time at half-life");
            assert!(t.error_percent.abs() <= 3.0, "{name} {a:?}");
        }
    }
}

/// `recordings/mixed-a` and `mixed-b` (never looked at before the analysis
/// of the fourth session's end judged them): a leak of kept evaluation
/// graphs, a slow neighbour, a slow leak, a growing demand without
/// accumulation, a fragmenter and 60 s legitimate runs, on two models no
/// earlier set used. As first judged, every cause living at least 90 s went
/// high at least 66 s before its OOM from each source that can see it, with every
/// promised TTO at half-life within 5 %, and no legitimate run raised a
/// high or a leak flag, except one miss: with the agent, the fragmenter
/// went high 46 s ahead, 38 s after NVML alone. Since the two sources'
/// agreement on a fragmented cache counts (`corroborated` in the tracker),
/// it goes high 84 s ahead (docs/gpu-results.md).
#[test]
fn mixed_sets_as_first_judged() {
    // (recording, NVML lead, agent lead), seconds; a TTO bound for both.
    for (name, n, causes, legit) in [
        (
            "mixed-a",
            5,
            vec![("valloss", 66.0, 81.0), ("neighbour", 68.0, 68.0)],
            vec!["churnlong", "varlenlong", "steadyeval"],
        ),
        (
            "mixed-b",
            4,
            vec![
                ("fragmentation", 84.0, 83.0),
                ("growdemand", 86.0, 94.0),
                ("leak180", 71.0, 97.0),
            ],
            vec!["churnlong"],
        ),
    ] {
        let e = evaluation(name, n);
        for (cause, nvml, agent) in causes {
            for (j, lead) in [(one(&e.nvml, cause), nvml), (one(&e.agent, cause), agent)] {
                assert!(j.lead_high >= Some(lead), "{name} {j:?}");
                // mixed-b's growing demand, agent: +0.3 % as first judged,
                // +6.3 % since its cache, full after retries, is no
                // longer read as blocking fragmentation (the reading
                // nearest half-life moved; over the middle half the
                // forecast read -100 .. +17 % before, -41 .. +17 % since).
                let bound = if (name, cause) == ("mixed-b", "growdemand") {
                    7.0
                } else {
                    5.0
                };
                if let Some(t) = &j.tto_at_half {
                    assert!(t.error_percent.abs() <= bound, "{name} {j:?}");
                }
            }
        }
        for run in legit {
            for j in [one(&e.nvml, run), one(&e.agent, run)] {
                assert_eq!(
                    (j.high_seconds, j.false_leak_seconds),
                    (0.0, 0.0),
                    "{name} {j:?}"
                );
            }
        }
    }
}

/// The allocator's forecast of a fragmented cache holds from one reading
/// to the next: on `mixed-b`'s fragmenter its gate on the largest jump sat
/// where the fragmenter's buckets land, so the forecast came and went
/// every other second and the published time to OOM jumped between ~80 s
/// and ~45 min 6 times (once now, as the OOM comes).
#[test]
fn a_fragmented_cache_s_time_to_oom_holds_from_one_reading_to_the_next() {
    use memprof_analysis::evaluate::replay::{replay, Mode};
    let recs = set("mixed-b", 4);
    let rec = recs.iter().find(|r| r.name == "fragmentation").unwrap();
    let r = replay(rec, &Thresholds::default(), Mode::Agent);
    let jumps = r
        .readings
        .windows(2)
        .filter_map(|w| Some((w[0].tto?, w[1].tto?)))
        .filter(|(x, y)| x.max(*y) > 30.0 && x.max(*y) > 2.0 * x.min(*y))
        .count();
    assert!(jumps <= 1, "{jumps} jumps of the time to OOM");
}

/// `recordings/setup-a` and `setup-b` since a pace window never reaches
/// back into setup that ended (seen: the rule was made after their first
/// judgement showed the agent's remaining false highs come the moment
/// steps run again, when a window read the load's rise with the flat
/// steps after it as a leak at confidence 1), and since the step period
/// counts from the push before the first move (a warm-up whose steps all
/// fell in one push interval gave no period, so its load was no setup:
/// loadshort2's 10 s). With the agent, the four loads raise no high (6,
/// 10, 10 and 9 s before) and no leak flag: loadlong2's last 2 s of flag
/// came from memory between steps on the user's horizon, a minute that
/// held the load's rise, which now counts from the end of the load. The
/// causes whose steps run keep
/// their leads and times (`setup_sets_as_first_judged`).
#[test]
fn setup_that_ended_is_no_training_pace() {
    for (name, load) in [
        ("setup-a", "loadmid2"),
        ("setup-a", "loadlong2"),
        ("setup-b", "load"),
        ("setup-b", "loadshort2"),
    ] {
        let e = evaluation(name, 4);
        let a = one(&e.agent, load);
        assert_eq!(a.high_seconds, 0.0, "{name} {a:?}");
        assert_eq!(a.false_leak_seconds, 0.0, "{name} {a:?}");
    }
}

/// `recordings/smooth-a` and `smooth-b` with the agent, whose pushes there
/// carry no step count (recorded before the agent counted optimizer
/// steps), since a push whose interval freed memory counts as a step where
/// none is counted (seen: the rule was made on these loads). Weights
/// placed piece by piece free nothing, so each push's peak is the memory
/// at the push; training frees its activations at every step. The three
/// loads raised 28/30, 56/56 and 8/8 s of high / leak flag; now none, and
/// the four leaks, whose steps run, keep their first high >= 88 s before
/// the OOM and their TTO at half-life within 3 % (docs/gpu-results.md).
#[test]
fn loads_are_setup_where_the_agent_counts_no_steps() {
    for (name, loads, leaks) in [
        ("smooth-a", vec!["loadmid"], ["leak600", "leak300"]),
        (
            "smooth-b",
            vec!["loadlong", "loadshort"],
            ["leak1000", "leak450"],
        ),
    ] {
        let e = evaluation(name, 4);
        for load in loads {
            let a = one(&e.agent, load);
            assert_eq!(a.high_seconds, 0.0, "{name} {a:?}");
            assert_eq!(a.false_leak_seconds, 0.0, "{name} {a:?}");
        }
        for leak in leaks {
            let a = one(&e.agent, leak);
            assert!(a.lead_high >= Some(88.0), "{name} {a:?}");
            let t = a.tto_at_half.as_ref().expect("a time at half-life");
            assert!(t.error_percent.abs() <= 3.0, "{name} {a:?}");
        }
    }
}

/// Every recorded neighbour, from NVML alone told the trainer's pid (as
/// `memprof profile` knows the command it started; the recordings' trainer
/// is the process the agent pushed from): named `neighbour` with the
/// neighbour's pid at its first high, and no leak flag at any reading,
/// where NVML alone without the pid named each one a leak and raised the
/// flag. Its first high comes as soon as before.
#[test]
fn nvml_told_the_trainers_pid_blames_every_recorded_neighbour() {
    use memprof_analysis::evaluate::replay::{drive_tracker, Mode};
    use memprof_analysis::tracker::Tracker;
    let th = Thresholds::default();
    let first_high = |tr: Tracker, rec: &Recording| {
        let (mut at, mut leak) = (None, false);
        drive_tracker(tr, rec, Mode::Nvml, |t, v| {
            let a = &v[0].assessment;
            leak |= a.leak_suspected && t >= rec.truth.cause_from.unwrap_or(t);
            if a.risk >= RiskLevel::High && at.is_none() {
                at = Some((t, a.cause.clone().unwrap()));
            }
        });
        (at.unwrap(), leak)
    };
    let mut seen = 0;
    for (name, n) in [
        ("causes-fresh", 7),
        ("causes-fresh2", 7),
        ("smooth-c", 4),
        ("smooth-d", 4),
        ("mixed-a", 5),
    ] {
        for rec in set(name, n).iter().filter(|r| r.truth.cause == "neighbour") {
            let pid = rec.pushes[0].1.pid;
            let mut told = Tracker::new(&th);
            told.own_processes(vec![pid]);
            let ((t, c), leak) = first_high(told, rec);
            let ((t0, c0), leak0) = first_high(Tracker::new(&th), rec);
            assert_eq!(c.cause, Cause::Neighbour, "{name}: {c:?}");
            assert_ne!(c0.cause, Cause::Neighbour, "{name}: {c0:?}");
            assert!(c.evidence.contains("pid ") && !c.evidence.contains(&format!("pid {pid} ")));
            assert!(!leak && leak0, "{name}: leak flag {leak} told, {leak0} not");
            assert!(t <= t0, "{name}: first high at {t}, {t0} before");
            seen += 1;
        }
    }
    assert_eq!(seen, 5);
}

/// `recordings/mixed-c` (never looked at before the analysis of 5a62331
/// judged it): with the agent, the two loads raised 42 and 75 s of false
/// high (and of leak flag): their warm-up's 12 steps fell in one push
/// interval, so the step count moved once and gave no period, and the load
/// never read as setup. Since the period counts from the push before the
/// first move, they raise none; the fragmenter and the leak, whose steps
/// run, went high 84 and 93 s before their OOM (TTO within 1 %), the same
/// before and after. NVML alone, with no step count, raises 18 and 50 s of
/// high on the loads: the miss in docs/gpu-results.md.
#[test]
fn mixed_c_as_first_judged_and_its_loads_since() {
    let e = evaluation("mixed-c", 4);
    for load in ["loadmid3", "loadlong3"] {
        let a = one(&e.agent, load);
        assert_eq!((a.high_seconds, a.false_leak_seconds), (0.0, 0.0), "{a:?}");
        let n = one(&e.nvml, load);
        assert!(n.high_seconds <= 50.0, "{n:?}");
    }
    for (cause, nvml, agent) in [("fragmentation", 80.0, 84.0), ("leak650", 74.0, 92.0)] {
        for (j, lead) in [(one(&e.nvml, cause), nvml), (one(&e.agent, cause), agent)] {
            assert!(j.lead_high >= Some(lead), "{j:?}");
            let t = j.tto_at_half.as_ref().expect("a time at half-life");
            assert!(t.error_percent.abs() <= 2.5, "{j:?}");
        }
    }
}

/// The set's recordings with NVML's utilization left out (as a sampler
/// that does not read it sees them).
fn without_utilization(name: &str, n: usize) -> Evaluation {
    let mut recs = set(name, n);
    for r in &mut recs {
        assert!(
            !r.utilization.is_empty(),
            "{name} {}: utilization recorded",
            r.name
        );
        r.utilization.clear();
    }
    evaluate(&recs, &Thresholds::default())
}

/// `recordings/busy-a` and `busy-b` (utilization recorded beside each
/// trace; the idle-rise rule's 5 % was chosen on them, so they are seen):
/// NVML alone raised no high and no leak flag on three weights loads,
/// which without the utilization raised 37/51, 16/30 and 52/66 s of high
/// and leak flag; every cause NVML can time kept its first high >= 69 s
/// before the OOM, an input-bound trainer's leak (idle 150 ms a step)
/// included.
#[test]
fn busy_sets_loads_while_idle_are_setup() {
    for (name, loads, causes) in [
        (
            "busy-a",
            vec!["loadlong4"],
            vec!["idleleak", "leak550", "neighbour"],
        ),
        (
            "busy-b",
            vec!["loadmid5", "loadlong5"],
            vec!["growdemand", "fragmentation"],
        ),
    ] {
        let e = evaluation(name, 4);
        let blind = without_utilization(name, 4);
        for load in loads {
            let n = one(&e.nvml, load);
            assert_eq!((n.high_seconds, n.false_leak_seconds), (0.0, 0.0), "{n:?}");
            assert!(one(&blind.nvml, load).high_seconds >= 16.0, "{name} {load}");
        }
        for cause in causes {
            for j in [one(&e.nvml, cause), one(&e.agent, cause)] {
                assert!(j.lead_high >= Some(69.0), "{name} {j:?}");
            }
        }
    }
}

/// `recordings/busy-c` and `busy-d`, recorded after the idle-rise rule and
/// judged once as they came (the pattern-of-three pace was then made on
/// busy-d's leak750, so that scenario is seen). From NVML alone: two loads
/// raise nothing (49 and 19 s of high without the utilization), one 8 s
/// (21), and the fastest (2.6 GB/s, read at 5-6 % utilization, above the
/// 5 % an idle rise may reach) is unchanged at 15 s: a known miss. A
/// trainer idle 300 ms a step read near 5 % too, so its leak flag came
/// 17 s later than without the rule (27 s after the leak was visible), its
/// first high still 72 s before the OOM. leak750 went high 9.5 s before
/// the OOM before the pattern of three, 74.5 s after.
#[test]
fn busy_sets_held_out_as_first_judged() {
    let c = evaluation("busy-c", 4);
    let d = evaluation("busy-d", 5);
    let high = |e: &Evaluation, load: &str| one(&e.nvml, load).high_seconds;
    assert_eq!(high(&c, "loadlong6"), 0.0);
    assert_eq!(high(&d, "loaddevice"), 0.0);
    assert!(high(&d, "loadmid6") <= 8.0);
    assert!(high(&c, "loadfast") <= 15.0);
    let idle = one(&c.nvml, "idleleak2");
    assert!(idle.lead_high >= Some(72.0), "{idle:?}");
    assert!(
        idle.leak_flag_after_visible.is_some_and(|s| s <= 27.0),
        "{idle:?}"
    );
    for (e, cause, lead) in [
        (&c, "growdemand", 69.0),
        (&d, "neighbour", 67.0),
        (&d, "leak750", 74.0),
    ] {
        let n = one(&e.nvml, cause);
        assert!(n.lead_high >= Some(lead), "{n:?}");
        assert!(one(&e.agent, cause).lead_high >= Some(64.0), "{cause}");
    }
    for j in d
        .nvml
        .iter()
        .chain(&d.agent)
        .filter(|j| j.name == "steadylong")
    {
        assert_eq!((j.high_seconds, j.false_leak_seconds), (0.0, 0.0), "{j:?}");
    }
}

/// The set's recordings with NVML's PCIe receive throughput left out (as
/// a sampler that does not read it sees them).
fn without_pcie(name: &str, n: usize) -> Evaluation {
    let mut recs = set(name, n);
    for r in &mut recs {
        assert!(!r.received.is_empty(), "{name} {}: PCIe recorded", r.name);
        r.received.clear();
    }
    evaluate(&recs, &Thresholds::default())
}

/// `recordings/pcie-a` and `pcie-b`, recorded with NVML's PCIe receive
/// throughput beside each trace after the copy rule (its share and
/// utilization bound set on bench/gpu/pcie_probe.py's output, not on
/// these), judged once as they came. From NVML alone, five loads from
/// host memory (2.6, 3 and 4 GB/s, two at full speed) raise no high and no
/// leak flag; without the PCIe readings two of them raised 8 s and
/// 19 s of high (26 s of leak flag). No cause changed with the readings.
/// A trainer idle 300 ms a step (utilization 5.9 %) that leaks on the GPU
/// went high only 33.9 s before its OOM from NVML alone, the idle rule's
/// known risk (with the readings or without), 60.9 s with the agent.
/// The agent-fed verdict flagged the two fastest loads as leaks for
/// 35 s, held from a flag raised two seconds into each load; the rule
/// that a rise gathered since the step count last moved is setup
/// (`allocator::pace`) was made on pcie-a after that judgement, so
/// pcie-a's loads are seen for it.
#[test]
fn pcie_sets_as_first_judged() {
    let a = evaluation("pcie-a", 5);
    let b = evaluation("pcie-b", 5);
    let (blind_a, blind_b) = (without_pcie("pcie-a", 5), without_pcie("pcie-b", 5));
    let false_secs = |j: &Judged| (j.high_seconds, j.false_leak_seconds);
    for (e, blind, load) in [
        (&a, &blind_a, "loadfast2"),
        (&a, &blind_a, "loadfull"),
        (&a, &blind_a, "load4g"),
        (&b, &blind_b, "loadfast3"),
        (&b, &blind_b, "loadfull2"),
    ] {
        assert_eq!(false_secs(one(&e.nvml, load)), (0.0, 0.0), "{load}");
        assert_eq!(false_secs(one(&e.agent, load)), (0.0, 0.0), "{load}");
        // The two full-speed loads are over before any trend from NVML.
        assert!(one(&blind.nvml, load).high_seconds <= 19.0, "{load}");
    }
    assert!(one(&blind_a.nvml, "loadfast2").high_seconds >= 8.0);
    assert!(false_secs(one(&blind_b.nvml, "loadfast3")) >= (19.0, 26.0));
    for (e, cause, nvml, agent) in [
        (&a, "leak500", 74.0, 89.0),
        (&b, "idleleak4", 73.0, 90.0),
        (&b, "growdemand", 69.0, 67.0),
        (&a, "idleleak3", 71.0, 69.0),
    ] {
        assert!(one(&e.nvml, cause).lead_high >= Some(nvml), "{cause}");
        assert!(one(&e.agent, cause).lead_high >= Some(agent), "{cause}");
    }
    // The trainer idle 300 ms a step: its rises, late by a step now and
    // then, keep one schedule (`staircase::on_schedule`); before, the short
    // gap broke the run and NVML went high 33.9 s ahead, its TTO +13 %.
    let idle = one(&a.nvml, "idleleak3");
    assert!(
        idle.tto_at_half
            .as_ref()
            .is_some_and(|t| t.error_percent.abs() <= 2.0),
        "{idle:?}"
    );
    for j in b
        .nvml
        .iter()
        .chain(&b.agent)
        .filter(|j| j.name == "steadylong")
    {
        assert_eq!(false_secs(j), (0.0, 0.0), "{j:?}");
    }
}

/// `recordings/pcie-c`, recorded after both rules (the PCIe copy rule and
/// the rise gathered since the steps last moved), never tuned on, judged
/// once: four legitimate runs (loads from host memory at 2 and 5 GB/s and
/// at full speed, steady training with evaluation passes) raise no high
/// and no leak flag from either source (without the PCIe readings the
/// 2 GB/s load raised 10 s of each from NVML alone); two leaks, one in a
/// trainer idle 200 ms a step, go high >= 70 s before their OOM from NVML
/// alone and >= 87 s with the agent, their time to OOM at half-life within
/// 6 %.
#[test]
fn pcie_c_never_tuned_on() {
    let e = evaluation("pcie-c", 6);
    let blind = without_pcie("pcie-c", 6);
    for run in ["loadmid7", "loadfull3", "load2g", "steadyeval"] {
        quiet_from_both(&e, run);
    }
    assert!(one(&blind.nvml, "load2g").high_seconds >= 10.0);
    for (cause, nvml, agent) in [("leak400", 70.0, 87.0), ("idleleak5", 70.0, 91.0)] {
        for (j, lead) in [(one(&e.nvml, cause), nvml), (one(&e.agent, cause), agent)] {
            assert!(j.lead_high >= Some(lead), "{j:?}");
            let t = j.tto_at_half.as_ref().expect("a time at half-life");
            assert!(t.error_percent.abs() <= 6.5, "{j:?}");
        }
    }
}

/// `recordings/pcie-d`, recorded after rises were read by their schedule
/// and PCIe readings were made to decide whether an idle rise is setup
/// (8a8dbfb, which the live sidecar carried), judged once as it came.
/// From NVML alone: a trainer idle 800 ms a step (utilization 2.8 %) that
/// leaks went high 73.2 s before its OOM (without the PCIe readings the
/// idle rule read its rises as setup: 20.2 s); a leak whose rises
/// `empty_cache` breaks up every 3 s went high 67 s ahead, TTO −2 %; a
/// load from host memory and variable-length batches raised nothing. The
/// cost, measured: a paced fill made on the GPU itself, with no bytes from
/// the host and no kernel of note (`torch.ones` in 256 MB pieces, a
/// stand-in for a load no real weights take), read as growth: 17 s of
/// high and 32 s of leak flag from NVML alone (0/0 before, the idle rule).
/// With the agent: both leaks high >= 80 s ahead, no false flag; the time
/// to OOM at half-life +24 % and +19 %. The first was the newest push's
/// peak standing for the trainer's largest step (a trainer that waits
/// runs a step or none per push); the pace now forecasts from the largest
/// step of the last 10 s (`pace::Recent::highest_lifted`), made on this
/// set: +3 %. The second was the cache: it held 6 GB that `empty_cache`
/// could not release and the step's allocations could not use, which the
/// forecast counted as room; it now counts the cache no step uses
/// (`AgentDevice::idle_cache`): +3.8 %.
#[test]
fn pcie_d_as_first_judged() {
    let e = evaluation("pcie-d", 5);
    let blind = without_pcie("pcie-d", 5);
    for run in ["load1g", "varlen2"] {
        quiet_from_both(&e, run);
    }
    let fill = one(&e.nvml, "loaddevice2");
    assert!(
        fill.high_seconds <= 17.0 && fill.false_leak_seconds <= 32.0,
        "{fill:?}"
    );
    let agent_fill = one(&e.agent, "loaddevice2");
    assert_eq!(
        (agent_fill.high_seconds, agent_fill.false_leak_seconds),
        (0.0, 0.0)
    );
    assert!(one(&e.nvml, "idleleak6").lead_high >= Some(73.0));
    assert!(one(&blind.nvml, "idleleak6").lead_high <= Some(21.0));
    assert!(one(&e.nvml, "leakec3").lead_high >= Some(66.0));
    let tto = |j: &Judged| j.tto_at_half.as_ref().map(|t| t.error_percent.abs());
    // leakec3 was +18.4 % (bound 19) until the forecast counted the cache
    // no step uses: +3.8 %.
    for (cause, lead, within) in [("idleleak6", 92.0, 4.0), ("leakec3", 80.0, 4.0)] {
        let j = one(&e.agent, cause);
        assert!(j.lead_high >= Some(lead), "{j:?}");
        assert!(tto(j).is_some_and(|p| p <= within), "{j:?}");
    }
    assert!(tto(one(&e.nvml, "idleleak6")).is_some_and(|p| p <= 2.0));
}

/// `recordings/hold-a` and `hold-b`, recorded on an H200 after every
/// analysis change of the causes work, with the release sidecar of that
/// day, and judged once as they came: nothing was tuned on them. Every
/// cause living >= 90 s was warned about >= 60 s ahead by each source
/// that can see it (the agent: 6 of 6; NVML: its 5, and fragmentation too);
/// the four legitimate runs (a 2.8 GB/s load from host memory, steady,
/// cache churn, variable length) raised nothing from either source; every
/// escalation took <= levels + 1 transitions. Misses, as published in
/// docs/gpu-results.md: NVML's growing demand once the cache holds the
/// card (TTO 0 at half-life), the agent's TTO on a leak that empties its
/// cache (leak800 +14 %), and names from NVML alone (the neighbour called
/// a leak, a leak and fragmentation called growing demand). The spike
/// (21 s) was warned about by neither, as a sudden rise cannot be.
#[test]
fn hold_sets_as_first_judged() {
    let a = evaluation("hold-a", 5);
    let b = evaluation("hold-b", 6);
    for (e, run) in [
        (&a, "loadfast"),
        (&a, "steady"),
        (&b, "churn"),
        (&b, "varlen"),
    ] {
        quiet_from_both(e, run);
    }
    let tto = |j: &Judged| j.tto_at_half.as_ref().map(|t| t.error_percent.abs());
    // (set, run, lead of NVML's first high, of the agent's; TTO bound of each)
    let causes = [
        (&a, "idleleak45", Some((72.0, 6.0)), (89.0, 6.0)),
        (&a, "growdemand", None, (74.0, 3.0)),
        (&a, "neighbour", Some((68.0, 3.0)), (68.0, 3.0)),
        // The agent's TTO on leak800 was +14 % as first judged (bound 15);
        // +2.8 % since the forecast counts the cache no step uses.
        (&b, "leak800", Some((67.0, 2.0)), (83.0, 3.0)),
        (&b, "fragment", Some((89.0, 1.0)), (101.0, 1.0)),
        (&b, "idleleak25", Some((70.0, 1.0)), (92.0, 1.0)),
    ];
    for (e, run, nvml, (lead, within)) in causes {
        let j = one(&e.agent, run);
        assert!(j.lead_high >= Some(lead), "{j:?}");
        assert!(tto(j).is_some_and(|p| p <= within), "{j:?}");
        assert!(j.transitions <= j.levels + 1, "{j:?}");
        let n = one(&e.nvml, run);
        assert!(n.lead_high >= Some(60.0), "{n:?}");
        assert!(n.transitions <= n.levels + 1, "{n:?}");
        if let Some((lead, within)) = nvml {
            assert!(n.lead_high >= Some(lead), "{n:?}");
            assert!(tto(n).is_some_and(|p| p <= within), "{n:?}");
        }
    }
    assert_eq!(one(&a.nvml, "growdemand").lead_high, Some(77.4));
    // First judged -100 % (0 s, "OOM now", at a top of the cache's saw);
    // since the card that fell back promises no time: none.
    assert!(one(&a.nvml, "growdemand").tto_at_half.is_none());
    // ... and the goals line counts it as no time, not as a time met.
    assert!(
        render(&a).contains("nvml: first high >= 60 s before the OOM 3/3 (lives >= 90 s), >= 2/3 of the life 3/3 (any life); TTO within 10 % at half-life 2/2 (1 promised no time), at every reading"),
        "{}",
        render(&a)
    );
    let named = |e: &Evaluation, run| one(&e.agent, run).named.clone();
    assert_eq!(named(&a, "neighbour").as_deref(), Some("neighbour"));
    assert_eq!(named(&a, "growdemand").as_deref(), Some("growingDemand"));
    assert_eq!(named(&b, "fragment").as_deref(), Some("fragmentation"));
    for run in ["idleleak45", "idleleak25", "leak800"] {
        let e = if run == "idleleak45" { &a } else { &b };
        assert_eq!(named(e, run).as_deref(), Some("leak"), "{run}");
        assert_eq!(one(&e.agent, run).false_flags, 0, "{run}");
    }
    assert_eq!(one(&b.agent, "spike").lead_high, None);
}

/// hold-c and hold-d, recorded on an H200 after every change above and
/// judged once as they came (bench/gpu/record.sh has their arguments):
/// two more models, a leak with and without `empty_cache`, a neighbour,
/// growing demand, and a fragmenter pinning each segment with one 1 MiB
/// block, whose own leak is under `leakBytesPerSecond` (fragmentation that
/// leaks nothing, which no earlier set had). The misses of the first
/// judgement stay in the comments, and each bound is the number then.
#[test]
fn hold_c_and_hold_d_as_first_judged() {
    let c = evaluation("hold-c", 4);
    let d = evaluation("hold-d", 4);
    for (e, run) in [(&c, "steadyeval"), (&d, "varlen")] {
        quiet_from_both(e, run);
    }
    let tto = |j: &Judged| j.tto_at_half.as_ref().map(|t| t.error_percent);
    // (set, run, the agent's lead and TTO error bound; NVML's lead)
    for (e, run, lead, within, nvml_lead) in [
        (&c, "leak600", 89.0, 1.0, 68.0),
        (&d, "leakec5", 87.0, 6.5, 71.0),
        (&d, "neighbour", 68.0, 1.0, 68.0),
        // First judged -19.7 %: the cache's share of the forecast.
        (&c, "growdemand", 80.0, 20.0, 84.0),
    ] {
        let j = one(&e.agent, run);
        assert!(j.lead_high >= Some(lead), "{j:?}");
        assert!(tto(j).is_some_and(|p| p.abs() <= within), "{j:?}");
        assert!(j.transitions <= j.levels + 1, "{j:?}");
        assert_eq!(j.false_flags, 0, "{j:?}");
        let n = one(&e.nvml, run);
        assert!(n.lead_high >= Some(nvml_lead), "{n:?}");
        assert!(n.transitions <= n.levels + 1, "{n:?}");
    }
    // Fragmentation without a leak: named by the agent, with no leak flag.
    // First judged: the agent's first high 9.7 s (hold-c) and 10.7 s
    // (hold-d) before the OOM, NVML's 58.7 s and 45.7 s: the fragmenter's
    // segments come 10-12 s apart, which the smooth climb refuses as
    // jumps. Since the cache's staircase of pinned segments is read:
    // 68.7 s (TTO -19.8 %, early) and 45.7 s (+0.9 %).
    for (e, lead, within) in [(&c, 68.0, 20.0), (&d, 45.0, 1.0)] {
        let j = one(&e.agent, "fraglean");
        assert_eq!(j.named.as_deref(), Some("fragmentation"), "{j:?}");
        assert_eq!(j.false_leak_seconds, 0.0, "{j:?}");
        assert!(j.lead_high >= Some(lead), "{j:?}");
        assert!(tto(j).is_some_and(|p| p.abs() <= within), "{j:?}");
        assert!(j.lead_high >= one(&e.nvml, "fraglean").lead_high, "{j:?}");
    }
}

/// hold-e, recorded after the cache's staircase was read and judged once
/// (fragmenters that leak nothing at ticks of 6 s and 15 s, a batch grown
/// in five steps, evaluations with large batches): the agent warns each
/// fragmenter at least as early as NVML alone, names it, and raises
/// nothing on the legitimate runs most like a staircase. The forecast is
/// early (TTO -13 % and -37 % at half-life): the OOM came after the retry
/// that released the trainer's own idle cache.
#[test]
fn hold_e_as_first_judged() {
    let e = evaluation("hold-e", 4);
    for run in ["growbatch", "bigeval"] {
        let j = one(&e.agent, run);
        assert_eq!((j.high_seconds, j.false_leak_seconds), (0.0, 0.0), "{j:?}");
    }
    for (run, lead) in [("fraglean6", 76.0), ("fraglean15", 43.0)] {
        let j = one(&e.agent, run);
        assert_eq!(j.named.as_deref(), Some("fragmentation"), "{j:?}");
        assert!(j.lead_high >= Some(lead), "{j:?}");
        assert!(j.lead_high >= one(&e.nvml, run).lead_high, "{j:?}");
        assert_eq!(j.false_leak_seconds, 0.0, "{j:?}");
        assert!(j.transitions <= j.levels + 1, "{j:?}");
    }
}

/// hold-f, recorded at the end of the day's work and judged once with the
/// analysis as it stood (19a5090): a leak, a neighbour, growing demand and
/// cache churn. The miss of that judgement stays in the comment: the
/// agent's growing-demand TTO at half-life +27 % (late; hold-c's was -19.7 %).
#[test]
fn hold_f_as_first_judged() {
    let f = evaluation("hold-f", 4);
    quiet_from_both(&f, "churn");
    let tto = |j: &Judged| j.tto_at_half.as_ref().map(|t| t.error_percent.abs());
    // (run, the agent's lead and TTO bound, NVML's lead)
    for (run, lead, within, nvml_lead) in [
        ("leak350", 90.0, 2.0, 73.0),
        ("neighbour", 71.0, 2.0, 71.0),
        ("growdemand", 69.0, 28.0, 72.0),
    ] {
        let j = one(&f.agent, run);
        assert!(j.lead_high >= Some(lead), "{j:?}");
        assert!(tto(j).is_some_and(|p| p <= within), "{j:?}");
        assert!(j.transitions <= j.levels + 1, "{j:?}");
        assert_eq!(j.false_flags, 0, "{j:?}");
        assert!(one(&f.nvml, run).lead_high >= Some(nvml_lead), "{run}");
    }
    assert_eq!(
        one(&f.agent, "neighbour").named.as_deref(),
        Some("neighbour")
    );
    assert_eq!(one(&f.agent, "leak350").named.as_deref(), Some("leak"));
}

/// Growing demand whose cache fills the card, from NVML alone: PyTorch frees
/// the cache and retries at the ceiling, so the card's memory saws under it
/// while the trainer runs; once it fell back, NVML promises no time (it was
/// "OOM now", 0 s, at each top: -91 to -100 % at half-life on 7 sets). The
/// level stays critical and the lead is untouched. causes-dev's -83 % is the
/// known miss: a forecast of the cache filling the card, made before it
/// first did, which NVML cannot tell from the demand's.
#[test]
fn growing_demand_from_nvml_alone_promises_no_time_once_the_card_fell_back() {
    for name in [
        "busy-b",
        "busy-c",
        "causes-fresh",
        "causes-fresh2",
        "causes-heldout",
        "causes-split",
        "hold-a",
        "mixed-b",
        "pcie-b",
        "setup-b",
        "smooth-c",
    ] {
        let e = evaluate(&whole(name), &Thresholds::default());
        let j = one(&e.nvml, "growdemand");
        assert!(j.tto_at_half.is_none(), "{name}: {j:?}");
        let goal = j.life.map(|life| (life * 2.0 / 3.0).min(60.0));
        assert!(j.lead_high >= goal, "{name}: {j:?}");
    }
    let e = evaluate(&whole("causes-dev"), &Thresholds::default());
    let miss = one(&e.nvml, "growdemand")
        .tto_at_half
        .as_ref()
        .map(|t| t.error_percent);
    assert!(
        miss.is_some_and(|p| (-84.0..=-82.0).contains(&p)),
        "{miss:?}"
    );
}

/// The agent's leak flag on a fragmenter is a true leak of allocated
/// memory, not its cache read as one. bench/gpu's `Fragmenter` carves
/// each new segment into 48 MiB blocks it frees between 2.1 MB blocks it
/// keeps for the rest of the run (so no segment can be released): 4.0 % of
/// reserved memory's pace stays allocated, 47-55 MB/s on the H200 sets,
/// about 300 times the leak rate. From 30 s after the fragmenter began
/// to 5 s before the OOM, memory between steps leaks (on at least 95 %
/// of the readings) at that rate (within 5 %: 0.97-1.02 of it), on every
/// set with a fragmenter, and the verdict names fragmentation. The judge counts the flag false (the
/// recordings' truth has no leak): docs/gpu-results.md, hold-a and hold-b.
#[test]
fn the_agent_s_leak_flag_on_a_fragmenter_is_its_kept_tensors() {
    use memprof_analysis::allocator::AgentState;
    const KEPT: f64 = 2_100_000.0 / (48.0 * 1048576.0 + 7.0 * 4096.0 + 2_100_000.0);
    let th = Thresholds::default();
    for (name, run) in [
        ("causes-dev", "fragmentation"),
        ("causes-heldout", "fragmentation"),
        ("causes-fresh", "fragmentation"),
        ("causes-fresh2", "fragmentation"),
        ("busy-b", "fragmentation"),
        ("mixed-b", "fragmentation"),
        ("mixed-c", "fragmentation"),
        ("hold-b", "fragment"),
    ] {
        let file = root().join(format!("recordings/{name}/{run}.summary.json"));
        let summary: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
        let kept = KEPT * summary["fragmentMBps"].as_f64().unwrap() * 1e6;
        let rec = whole(name).into_iter().find(|r| r.name == run).unwrap();
        let (from, oom) = (rec.truth.cause_from.unwrap(), rec.truth.oom_at.unwrap());
        let mut agent = AgentState::new(&th);
        let (mut paces, mut named, mut readings) = (Vec::new(), false, 0);
        for (t, p) in &rec.pushes {
            agent.observe(p);
            if (from + 30.0..oom - 5.0).contains(t) {
                let a = agent.assess().remove(0);
                named |= a
                    .risk
                    .cause
                    .is_some_and(|c| c.cause == Cause::Fragmentation);
                readings += 1;
                if a.growth == MemoryGrowth::Leak {
                    paces.push(a.allocated_growth.unwrap() / kept);
                }
            }
        }
        // Up on 83 of 85 readings on causes-fresh2, all on the others.
        assert!(
            paces.len() * 100 >= readings * 95,
            "{name}: {}/{readings}",
            paces.len()
        );
        assert!(
            paces.iter().all(|p| (0.95..=1.05).contains(p)),
            "{name}: {paces:?}"
        );
        assert!(named, "{name}");
    }
}

/// A fragmenting cache that fills the card keeps its name at the ceiling:
/// "OOM now" carries the cause of the growth that got there, and a
/// fragmenting cache is one (it named the stale leak of the fragmenter's
/// kept blocks for the last seconds before: causes-dev, hold-b).
#[test]
fn at_the_ceiling_a_fragmenting_cache_keeps_its_name() {
    for name in [
        "busy-b",
        "causes-dev",
        "causes-fresh",
        "causes-fresh2",
        "causes-heldout",
        "hold-b",
        "mixed-b",
        "mixed-c",
    ] {
        let recs = whole(name);
        let rec = recs
            .iter()
            .find(|r| r.name.starts_with("fragment"))
            .unwrap_or_else(|| panic!("{name}: no fragmentation run"));
        let r = replay(rec, &Thresholds::default(), Mode::Agent);
        let now: Vec<_> = r
            .readings
            .iter()
            .filter(|x| x.tto == Some(0.0))
            .map(|x| x.cause)
            .collect();
        assert!(
            !now.is_empty() && now.iter().all(|c| *c == Some(Cause::Fragmentation)),
            "{name}: {now:?}"
        );
    }
}

/// A growing demand's cache fills the card about a minute before its
/// tensors reach the allocator's limit (the allocator's retry frees that
/// cache before any allocation fails): with the agent, "OOM now" is judged
/// on the allocator's own level, not on the device's. Before, the cache
/// filling the card published a critical "OOM now" and then no time at
/// all for the rest of the run (hold-f: 5 of the 34 readings of the middle
/// half of the life, "OOM now" 59 s before the OOM). So is "outlived": a
/// forecast refuted while the card sits full promises no time until it
/// empties, and the card full of cache said so for 7 of mixed-b's 37
/// readings. What is left of the spread (-50 % .. +44 %) is the
/// forecast's own swing (docs/gpu-results.md). Judged on every recorded
/// growing demand: at high or above over the middle half of its life, a
/// time, and not 0.
#[test]
fn a_growing_demands_cache_filling_the_card_is_no_oom_now() {
    let sets = std::fs::read_dir(root().join("recordings")).unwrap();
    let mut judged = 0;
    for set in sets.map(|d| d.unwrap().file_name().into_string().unwrap()) {
        for rec in whole(&set)
            .iter()
            .filter(|r| r.truth.cause == "growingDemand")
        {
            let (from, oom) = (rec.truth.cause_from.unwrap(), rec.truth.oom_at.unwrap());
            let life = oom - from;
            let middle = from + life / 4.0..=from + life * 3.0 / 4.0;
            let r = replay(rec, &Thresholds::default(), Mode::Agent);
            for x in r.readings.iter().filter(|x| middle.contains(&x.t)) {
                if x.risk >= RiskLevel::High {
                    let tto = x
                        .tto
                        .unwrap_or_else(|| panic!("{set} {}: no time at {x:?}", rec.name));
                    assert!(tto > 0.0, "{set} {}: OOM now at {x:?}", rec.name);
                }
            }
            judged += 1;
        }
    }
    assert_eq!(judged, 18, "every recorded growing demand");
}

/// hold-g and hold-h (H200, two at once on two GPUs), recorded after
/// 65e0694 and judged once: every cause warned >= 60 s ahead by both
/// sources; a leak's and a neighbour's time within 5 % at every reading of
/// the middle half of the life; the agent's growing-demand time within
/// 20 % at half-life but swinging -40 % .. +32 % over the middle half, and
/// "OOM now" or no time at 1 and 4 readings of two of the four runs as
/// first judged (docs/gpu-results.md). Pins the numbers, and one change
/// since.
#[test]
fn hold_g_and_hold_h_as_first_judged() {
    let g = evaluation("hold-g", 4);
    let h = evaluation("hold-h", 4);
    quiet_from_both(&g, "churn");
    quiet_from_both(&h, "steadyeval");
    let tto = |j: &Judged| j.tto_at_half.as_ref().map(|t| t.error_percent.abs());
    let spread = |j: &Judged| {
        let s = j.tto_spread.as_ref().expect("an OOM");
        (s.low_percent, s.high_percent, s.without)
    };
    // (set, run, the agent's lead and TTO bound, NVML's lead)
    for (e, run, lead, within, nvml_lead) in [
        (&g, "growdemand", 68.0, 7.0, 69.0),
        (&g, "growdemand2", 73.0, 18.0, 76.0),
        (&g, "leak450", 89.0, 1.0, 70.0),
        (&h, "growdemand3", 67.0, 4.0, 67.0),
        (&h, "growdemand4", 72.0, 2.0, 74.0),
        (&h, "neighbour", 72.0, 1.0, 72.0),
    ] {
        let j = one(&e.agent, run);
        assert!(j.lead_high >= Some(lead), "{j:?}");
        assert!(tto(j).is_some_and(|p| p <= within), "{j:?}");
        assert!(j.transitions <= j.levels + 1, "{j:?}");
        assert_eq!(j.false_flags, 0, "{j:?}");
        let n = one(&e.nvml, run);
        assert!(n.lead_high >= Some(nvml_lead), "{n:?}");
        assert!(n.transitions <= n.levels + 1, "{n:?}");
    }
    for (e, run) in [(&g, "leak450"), (&h, "neighbour")] {
        for list in [&e.agent, &e.nvml] {
            let (low, high, without) = spread(one(list, run));
            assert!(low >= -5.0 && high <= 5.0 && without == 0, "{run}");
        }
    }
    assert_eq!(spread(one(&g.agent, "growdemand")), (-31.0, 29.0, 0));
    // As first judged (-100, 32, 1) and (-100, 29, 4): "OOM now" and no
    // time where a cache full after retries read as blocking
    // fragmentation; since it is not (`a_growing_demands_cache_full_after_retries_is_not_fragmentation`):
    assert_eq!(spread(one(&g.agent, "growdemand2")), (-34.0, 32.0, 0));
    assert_eq!(spread(one(&h.agent, "growdemand3")), (-40.0, 25.0, 1));
    assert_eq!(spread(one(&h.agent, "growdemand4")), (-34.0, 29.0, 0));
    // NVML alone: "OOM now" at growdemand3's half-life (the card's saw),
    // and the neighbour named a leak (no trainer pid told).
    assert_eq!(tto(one(&h.nvml, "growdemand3")), Some(100.0));
    assert_eq!(one(&h.nvml, "neighbour").named.as_deref(), Some("leak"));
    assert_eq!(
        one(&h.agent, "neighbour").named.as_deref(),
        Some("neighbour")
    );
}

/// A growing demand's cache, full after the allocator's retries released
/// and refilled it, holds whole free segments the next retry frees: not
/// fragmentation, unless most of its idle memory sits in split blocks
/// (segments a tensor still holds). Read as blocking fragmentation, it was
/// judged on reserved memory (99.5 % of the limit while the tensors' peak
/// stood at 90 %: hold-g growdemand2, 36 s before its OOM) and published
/// "OOM now", then no time. The old fragmenters' runs, whose idle cache is
/// split, keep their verdicts (`at_the_ceiling_a_fragmenting_cache_keeps_its_name`).
#[test]
fn a_growing_demands_cache_full_after_retries_is_not_fragmentation() {
    for (name, run) in [
        ("causes-dev", "growdemand"),
        ("mixed-b", "growdemand"),
        ("hold-g", "growdemand2"),
        ("hold-h", "growdemand4"),
    ] {
        let recs = whole(name);
        let rec = recs.iter().find(|r| r.name == run).unwrap();
        let r = replay(rec, &Thresholds::default(), Mode::Agent);
        let fragmentation = r
            .readings
            .iter()
            .filter(|x| x.cause == Some(Cause::Fragmentation))
            .count();
        assert_eq!(fragmentation, 0, "{name} {run}");
        let e = evaluate(std::slice::from_ref(rec), &Thresholds::default());
        let s = e.agent[0].tto_spread.clone().expect("an OOM");
        assert!(s.low_percent > -60.0, "{name} {run}: {s:?}");
    }
}
