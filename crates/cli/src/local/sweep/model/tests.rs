//! The sweep's models on recorded numbers: grouping, what is called safe,
//! what is only predicted, and the words.

use super::*;
use memprof_analysis::memmodel::{Family, Support};

const GB: f64 = 1e9;
const GIB: f64 = (1u64 << 30) as f64;
const H100: Option<u64> = Some(80_000_000_000);

/// A run: `(variable, value)` pairs, status, peak reserved, device total.
fn run(vars: &[(&str, &str)], status: Status, peak: Option<f64>, total: Option<u64>) -> RunRecord {
    RunRecord {
        values: vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        status: Some(status),
        oom: status == Status::Oom,
        peak_reserved_bytes: peak.map(|p| p as u64),
        peak_allocated_bytes: peak.map(|p| (p * 0.9) as u64),
        device_total_bytes: total,
        ..Default::default()
    }
}

/// A LoRA fine-tune's peaks as a sweep records them: 6 GB static, 0.5 GB
/// per sample, a few MB of allocator noise; OOM above the device.
fn batch_sweep(oom_at: &[u32]) -> Vec<RunRecord> {
    let noise = [3e6, -2e6, 4e6, -5e6, 1e6, 2e6];
    [8u32, 16, 32, 64, 128, 256]
        .iter()
        .zip(noise)
        .map(|(&b, e)| {
            let v = b.to_string();
            let peak = 6.0 * GB + 0.5 * GB * b as f64 + e;
            if oom_at.contains(&b) || peak > 80.0 * GB {
                run(&[("BATCH_SIZE", &v)], Status::Oom, None, H100)
            } else {
                run(&[("BATCH_SIZE", &v)], Status::Ok, Some(peak), H100)
            }
        })
        .collect()
}

fn target() -> Target {
    Target {
        metric: Metric::Reserved,
        headroom: 0.1,
        ..Default::default()
    }
}

fn vars(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn the_largest_safe_batch_is_one_that_ran_and_the_search_names_the_next_run() {
    let runs = batch_sweep(&[]);
    let ms = models(&vars(&["BATCH_SIZE"]), &runs, &target());
    assert_eq!(ms.len(), 1);
    let m = &ms[0];
    assert_eq!(m.verdict, Verdict::Fitted);
    assert_eq!(m.points.len(), 5);
    assert_eq!(m.oom_values, vec![256.0]);
    let fit = m.fit.as_ref().unwrap();
    assert_eq!(fit.curve.family, Family::Linear);
    assert!((fit.curve.per_unit_bytes / GB - 0.5).abs() < 0.001);
    assert!((fit.curve.static_bytes / GB - 6.0).abs() < 0.01);
    // limit 72 GB: 128 ran at 70 GB; 256 OOMed.
    assert_eq!(m.limit_bytes, Some(72.0 * GB));
    assert_eq!(m.step, Some(8.0));
    assert_eq!(m.largest_safe, Some(128.0));
    assert_eq!(m.bound.map(|b| b.x()), Some(256.0));
    // 6 + 0.5 × 132 = 72: the model would have 128 < x ≤ 132 run, but on
    // the grid's step (8) the next value is 136: over, and it is sure.
    assert!(
        matches!(&m.search, Some(Next::Done { why }) if why.contains("136")),
        "{:?}",
        m.search
    );
    assert_eq!(m.agrees, Some(true));
    let text = describe(m).join("\n");
    assert!(
        text.contains("largest safe BATCH_SIZE = 128 (ran: peak 65.2GiB)"),
        "{text}"
    );
    assert!(text.contains("BATCH_SIZE = 256 OOMed"), "{text}");
}

#[test]
fn a_prediction_beyond_what_ran_is_printed_as_not_verified() {
    let runs: Vec<RunRecord> = batch_sweep(&[]).into_iter().take(3).collect(); // 8, 16, 32
    let m = &models(&vars(&["BATCH_SIZE"]), &runs, &target())[0];
    assert_eq!(m.largest_safe, Some(32.0), "only what ran is safe");
    let p = m.predicted.unwrap();
    // One held-out step (16) past 32.
    assert_eq!(p.x, 48.0);
    assert_eq!(
        p.support,
        Support::Extrapolated {
            from: 32.0,
            distance: 16.0
        }
    );
    assert!(!m.verified);
    // The search would try more than the backed 48: the model, its margin
    // growing with the distance, expects up to 128 to fit.
    assert!(
        matches!(m.search, Some(Next::Run { x, .. }) if x > 48.0),
        "{:?}",
        m.search
    );
    let text = describe(m).join("\n");
    assert!(
        text.contains("the model predicts BATCH_SIZE = 48 fits") && text.contains("NOT verified"),
        "{text}"
    );
    assert!(
        text.contains("16 above the largest measured value 32 (+50%)"),
        "{text}"
    );
}

#[test]
fn an_oom_where_the_model_predicted_a_fit_is_a_disagreement() {
    // The allocator fragmented at 64 although the line says 38 GB.
    let runs = batch_sweep(&[64]);
    let m = &models(&vars(&["BATCH_SIZE"]), &runs, &target())[0];
    assert_eq!(m.largest_safe, Some(32.0));
    assert_eq!(m.bound.map(|b| b.x()), Some(64.0));
    assert_eq!(m.agrees, Some(false));
    assert!(
        m.notes[0].starts_with("BATCH_SIZE=64 OOMed although the model predicted"),
        "{:?}",
        m.notes
    );
    // The search bisects between 32 (ran) and 64 (OOM).
    assert!(
        matches!(m.search, Some(Next::Run { x, .. }) if x > 32.0 && x < 64.0),
        "{:?}",
        m.search
    );
}

#[test]
fn the_issue_17_sequence_sweep_is_quadratic_and_calls_only_4096_safe() {
    let total = Some((79.2 * GIB) as u64);
    let runs: Vec<RunRecord> = [(1024, 4.0), (2048, 10.3), (3072, 21.3), (4096, 32.5)]
        .iter()
        .map(|&(s, g)| {
            run(
                &[("SEQ_LEN", &s.to_string())],
                Status::Ok,
                Some(g * GIB),
                total,
            )
        })
        .collect();
    let m = &models(&vars(&["SEQ_LEN"]), &runs, &target())[0];
    assert_eq!(m.fit.as_ref().unwrap().curve.family, Family::Quadratic);
    assert_eq!(m.largest_safe, Some(4096.0));
    assert_eq!(m.predicted.map(|p| p.x), Some(5120.0));
    assert!(matches!(m.search, Some(Next::Run { x, .. }) if x == 5120.0));
    let text = describe(m).join("\n");
    assert!(
        text.contains("linear refused: its static part -7.1GiB is negative"),
        "{text}"
    );
    assert!(!text.contains("8192"), "{text}");
}

#[test]
fn one_point_is_no_model_but_still_judged() {
    let one = vec![
        run(&[("B", "8")], Status::Ok, Some(10.0 * GB), H100),
        run(&[("B", "16")], Status::Oom, None, H100),
    ];
    let m = &models(&vars(&["B"]), &one, &target())[0];
    assert_eq!(m.verdict, Verdict::NoModel);
    assert_eq!(m.largest_safe, Some(8.0));
    assert!(m
        .no_model
        .as_deref()
        .unwrap()
        .starts_with("1 value(s) measured"));
    let falling = vec![
        run(&[("B", "8")], Status::Ok, Some(10.0 * GB), H100),
        run(&[("B", "16")], Status::Ok, Some(9.0 * GB), H100),
    ];
    let m = &models(&vars(&["B"]), &falling, &target())[0];
    assert_eq!(m.verdict, Verdict::NoModel);
    assert!(
        m.no_model.as_deref().unwrap().contains("does not grow"),
        "{m:?}"
    );
    assert_eq!(m.agrees, None);
}

#[test]
fn without_a_device_total_it_asks_for_limit_bytes() {
    let runs = vec![
        run(&[("B", "1")], Status::Ok, Some(2.0 * GB), None),
        run(&[("B", "2")], Status::Ok, Some(3.0 * GB), None),
    ];
    let m = &models(&vars(&["B"]), &runs, &target())[0];
    assert_eq!(m.verdict, Verdict::NoLimit);
    assert!(m.notes[0].contains("--limit-bytes"));
    let t = Target {
        limit_override: Some(10_000_000_000),
        ..target()
    };
    let m = &models(&vars(&["B"]), &runs, &t)[0];
    assert_eq!(m.largest_safe, Some(2.0));
    assert_eq!(m.limit_bytes, Some(9.0 * GB));
}

#[test]
fn each_variable_is_modelled_per_value_of_the_others_and_step_overrides() {
    let mut runs = vec![];
    for seq in ["512", "1024"] {
        for b in ["4", "8", "16"] {
            let peak = 2.0 * GB + b.parse::<f64>().unwrap() * seq.parse::<f64>().unwrap() * 1e6;
            runs.push(run(
                &[("BATCH_SIZE", b), ("SEQ_LEN", seq)],
                Status::Ok,
                Some(peak),
                H100,
            ));
        }
    }
    let t = Target {
        steps: [("BATCH_SIZE".to_string(), 2.0)].into(),
        ..target()
    };
    let ms = models(&vars(&["BATCH_SIZE", "SEQ_LEN"]), &runs, &t);
    // BATCH_SIZE per SEQ_LEN (2), SEQ_LEN per BATCH_SIZE (3).
    assert_eq!(ms.len(), 5);
    assert_eq!(ms[0].variable, "BATCH_SIZE");
    assert_eq!(ms[0].fixed.get("SEQ_LEN").map(String::as_str), Some("512"));
    assert_eq!(ms[0].step, Some(2.0), "--step BATCH_SIZE=2");
    assert_eq!(ms[2].step, Some(512.0), "the common step of 512, 1024");
    let per_unit = |m: &Model| m.fit.as_ref().unwrap().curve.per_unit_bytes;
    assert!((per_unit(&ms[0]) - 512e6).abs() < 1.0);
    assert!((per_unit(&ms[1]) - 1024e6).abs() < 1.0);
    assert_eq!(ms[2].fixed.get("BATCH_SIZE").map(String::as_str), Some("4"));
    // A variable with one value is not swept: no model.
    let one = vec![run(&[("A", "x"), ("B", "1")], Status::Ok, Some(GB), H100)];
    assert!(models(&vars(&["A", "B"]), &one, &target()).is_empty());
}

#[test]
fn words_are_not_numbers_and_metrics_pick_their_peak() {
    let runs = vec![
        run(&[("OPT", "adam")], Status::Ok, Some(GB), H100),
        run(&[("OPT", "sgd")], Status::Ok, Some(GB), H100),
    ];
    let m = &models(&vars(&["OPT"]), &runs, &target())[0];
    assert_eq!(m.verdict, Verdict::NotNumeric);
    let r = &batch_sweep(&[])[0];
    assert_eq!(Metric::Allocated.of(r), r.peak_allocated_bytes);
    assert_eq!(Metric::Nvml.of(r), None);
}

#[test]
fn verification_runs_are_named_and_a_confirmed_prediction_is_verified() {
    let mut runs: Vec<RunRecord> = batch_sweep(&[]).into_iter().take(3).collect();
    let mut trial = run(&[("BATCH_SIZE", "48")], Status::Ok, Some(30.0 * GB), H100);
    trial.trial = Some("the model predicts …".into());
    runs.push(trial);
    let m = &models(&vars(&["BATCH_SIZE"]), &runs, &target())[0];
    assert_eq!(m.trials, vec![48.0]);
    assert_eq!(m.largest_safe, Some(48.0));
    let text = describe(m).join("\n");
    assert!(text.contains("verified by a run after the grid"), "{text}");
    assert!(
        text.contains("verification runs: BATCH_SIZE = 48"),
        "{text}"
    );
}

#[test]
fn a_verification_run_joins_its_grid_group_and_starts_no_group_of_its_own() {
    // A 2 × 2 grid; the search for BATCH_SIZE at SEQ_LEN=128 ran batch 12.
    let cell = |b: &str, s: &str, peak: f64| {
        run(
            &[("BATCH_SIZE", b), ("SEQ_LEN", s)],
            Status::Ok,
            Some(peak * GB),
            H100,
        )
    };
    let mut runs = vec![
        cell("1", "128", 3.0),
        cell("1", "256", 4.0),
        cell("2", "128", 4.0),
        cell("2", "256", 6.0),
    ];
    let mut trial = cell("12", "128", 14.0);
    trial.trial = Some("the model predicts …".into());
    runs.push(trial);
    let ms = models(&vars(&["BATCH_SIZE", "SEQ_LEN"]), &runs, &target());
    let groups: Vec<String> = ms
        .iter()
        .map(|m| format!("{} {:?} {:?}", m.variable, m.fixed, m.trials))
        .collect();
    assert_eq!(
        groups,
        vec![
            r#"BATCH_SIZE {"SEQ_LEN": "128"} [12.0]"#,
            r#"BATCH_SIZE {"SEQ_LEN": "256"} []"#,
            r#"SEQ_LEN {"BATCH_SIZE": "1"} []"#,
            r#"SEQ_LEN {"BATCH_SIZE": "2"} []"#,
        ],
        "no SEQ_LEN model at BATCH_SIZE=12"
    );
}
