//! The model on recorded numbers.

use super::*;

const GB: f64 = 1e9;

/// A run of a batch sweep: `(batch, status, peak reserved)`.
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

const H100: Option<u64> = Some(80_000_000_000);

/// A LoRA fine-tune's peaks as a sweep records them: 6 GB static, 0.5 GB
/// per sample, a few MB of allocator noise.
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
        limit_override: None,
    }
}

fn vars(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn least_squares_recovers_the_line_and_its_residuals() {
    let exact = least_squares(&[(1.0, 5.0), (2.0, 7.0), (4.0, 11.0)]).unwrap();
    assert!((exact.static_bytes - 3.0).abs() < 1e-9);
    assert!((exact.per_unit_bytes - 2.0).abs() < 1e-9);
    assert!(exact.rms_residual_bytes < 1e-9);
    assert_eq!(exact.r2.map(|r| (r * 1e6).round()), Some(1e6));
    // y = 1 + x with residuals +1, -1, +1, -1 around it.
    let noisy = least_squares(&[(0.0, 2.0), (1.0, 1.0), (2.0, 4.0), (3.0, 3.0)]).unwrap();
    assert!((noisy.per_unit_bytes - 0.6).abs() < 1e-9);
    assert!((noisy.static_bytes - 1.6).abs() < 1e-9);
    assert!((noisy.max_residual_bytes - 1.2).abs() < 1e-9);
    assert!((noisy.rms_residual_bytes - 0.8944271909999159).abs() < 1e-9);
    assert!((noisy.r2.unwrap() - 0.36).abs() < 1e-9);
    assert_eq!(least_squares(&[(8.0, 1.0)]), None);
    assert_eq!(least_squares(&[(8.0, 1.0), (8.0, 2.0)]), None);
    assert_eq!(least_squares(&[]), None);
}

#[test]
fn the_largest_safe_batch_is_the_last_ladder_value_under_the_headroom() {
    let runs = batch_sweep(&[]);
    let ms = models(&vars(&["BATCH_SIZE"]), &runs, target());
    assert_eq!(ms.len(), 1);
    let m = &ms[0];
    assert_eq!(m.verdict, Verdict::Fitted);
    // 256 would need 134 GB: it OOMed; 8..128 ran and were fitted.
    assert_eq!(m.points.len(), 5);
    assert_eq!(m.oom_values, vec![256.0]);
    let fit = m.fit.as_ref().unwrap();
    assert!((fit.per_unit_bytes / GB - 0.5).abs() < 0.001);
    assert!((fit.static_bytes / GB - 6.0).abs() < 0.01);
    assert!(fit.max_residual_bytes < 10e6);
    // limit 72 GB: 6 + 0.5 × 128 = 70 GB fits, 256 does not.
    assert_eq!(m.limit_bytes, Some(72.0 * GB));
    assert_eq!(m.largest_safe, Some(128.0));
    assert!(m.largest_safe_tested);
    assert_eq!(m.model_bound.map(f64::floor), Some(132.0));
    assert_eq!(m.next_up, Some(256.0));
    assert!((m.next_up_predicted_bytes.unwrap() / GB - 134.0).abs() < 0.1);
    assert_eq!(m.next_up_observed, Some(Status::Oom));
    assert_eq!(m.agrees, Some(true));
    assert_eq!(m.overridden_by_oom_at, None);
}

#[test]
fn above_the_grid_the_ladder_doubles_and_says_it_extrapolates() {
    let runs: Vec<RunRecord> = batch_sweep(&[]).into_iter().take(3).collect(); // 8, 16, 32
    let m = &models(&vars(&["BATCH_SIZE"]), &runs, target())[0];
    assert_eq!(m.largest_safe, Some(128.0));
    assert!(!m.largest_safe_tested);
    assert_eq!(m.next_up, Some(256.0));
    assert_eq!(m.next_up_observed, None);
    assert!(m
        .notes
        .iter()
        .any(|n| n.contains("BATCH_SIZE=128 was not run")));
    // Arithmetic steps continue by the last step.
    assert_eq!(
        extend(&[100.0, 200.0, 300.0], |x| x < 500.0),
        vec![100.0, 200.0, 300.0, 400.0, 500.0]
    );
    assert_eq!(extend(&[8.0], |x| x <= 16.0), vec![8.0, 16.0, 32.0]);
    // Gaps in a powers-of-two grid are filled.
    assert_eq!(
        extend(&[2.0, 8.0, 32.0], |x| x < 8.0),
        vec![2.0, 4.0, 8.0, 16.0, 32.0]
    );
    assert_eq!(extend(&[0.0, 0.0], |_| true), vec![0.0, 0.0]);
}

#[test]
fn an_observed_oom_below_the_recommendation_overrides_the_model() {
    // The allocator fragmented at 64 although the line says 38 GB.
    let runs = batch_sweep(&[64]);
    let m = &models(&vars(&["BATCH_SIZE"]), &runs, target())[0];
    assert_eq!(m.overridden_by_oom_at, Some(64.0));
    assert_eq!(m.largest_safe, Some(32.0));
    assert_eq!(m.next_up, Some(64.0));
    assert_eq!(m.next_up_observed, Some(Status::Oom));
    assert_eq!(m.agrees, Some(false));
    assert!(m.notes[0].starts_with("observed OOM at BATCH_SIZE=64 overrides the model"));
    let text = describe(m).join("\n");
    assert!(text.contains("largest safe BATCH_SIZE = 32"), "{text}");
    assert!(text.contains("DISAGREE"), "{text}");
}

#[test]
fn an_oom_the_model_did_not_expect_above_the_recommendation_is_a_disagreement() {
    // Headroom 0.3: limit 56 GB, safe 64 (38 GB); 128 (70 GB < 80) OOMed.
    let runs = batch_sweep(&[128]);
    let t = Target {
        headroom: 0.3,
        ..target()
    };
    let m = &models(&vars(&["BATCH_SIZE"]), &runs, t)[0];
    assert_eq!(m.largest_safe, Some(64.0));
    assert_eq!(m.overridden_by_oom_at, None);
    assert_eq!(m.agrees, Some(false));
    assert!(m.notes.iter().any(|n| n.contains("OOM at BATCH_SIZE=128")));
}

#[test]
fn one_point_or_a_falling_peak_is_insufficient_data() {
    let one = vec![
        run(&[("B", "8")], Status::Ok, Some(10.0 * GB), H100),
        run(&[("B", "16")], Status::Oom, None, H100),
    ];
    let m = &models(&vars(&["B"]), &one, target())[0];
    assert_eq!(m.verdict, Verdict::Insufficient);
    assert_eq!(m.largest_safe, None);
    assert!(m.notes[0].starts_with("insufficient data: 1 run(s)"));
    let falling = vec![
        run(&[("B", "8")], Status::Ok, Some(10.0 * GB), H100),
        run(&[("B", "16")], Status::Ok, Some(9.0 * GB), H100),
    ];
    let m = &models(&vars(&["B"]), &falling, target())[0];
    assert_eq!(m.verdict, Verdict::Insufficient);
    assert!(m.notes[0].contains("does not grow"), "{:?}", m.notes);
    assert_eq!(m.agrees, None);
}

#[test]
fn without_a_device_total_it_asks_for_limit_bytes() {
    let runs = vec![
        run(&[("B", "1")], Status::Ok, Some(2.0 * GB), None),
        run(&[("B", "2")], Status::Ok, Some(3.0 * GB), None),
    ];
    let m = &models(&vars(&["B"]), &runs, target())[0];
    assert_eq!(m.verdict, Verdict::NoLimit);
    assert!(m.notes[0].contains("--limit-bytes"));
    let t = Target {
        limit_override: Some(10_000_000_000),
        ..target()
    };
    let m = &models(&vars(&["B"]), &runs, t)[0];
    // limit 9 GB = 1 + 1 × B: B = 8 fits exactly, 16 does not.
    assert_eq!(m.largest_safe, Some(8.0));
    assert_eq!(m.next_up, Some(16.0));
}

#[test]
fn each_variable_is_modelled_per_value_of_the_others() {
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
    let ms = models(&vars(&["BATCH_SIZE", "SEQ_LEN"]), &runs, target());
    // BATCH_SIZE per SEQ_LEN (2), SEQ_LEN per BATCH_SIZE (3).
    assert_eq!(ms.len(), 5);
    assert_eq!(ms[0].variable, "BATCH_SIZE");
    assert_eq!(ms[0].fixed.get("SEQ_LEN").map(String::as_str), Some("512"));
    assert!((ms[0].fit.as_ref().unwrap().per_unit_bytes - 512e6).abs() < 1.0);
    assert!((ms[1].fit.as_ref().unwrap().per_unit_bytes - 1024e6).abs() < 1.0);
    assert_eq!(ms[2].variable, "SEQ_LEN");
    assert_eq!(ms[2].fixed.get("BATCH_SIZE").map(String::as_str), Some("4"));
    // A variable with one value is not swept: no model.
    let one = vec![run(&[("A", "x"), ("B", "1")], Status::Ok, Some(GB), H100)];
    assert!(models(&vars(&["A", "B"]), &one, target()).is_empty());
}

#[test]
fn words_are_not_numbers_and_metrics_pick_their_peak() {
    let runs = vec![
        run(&[("OPT", "adam")], Status::Ok, Some(GB), H100),
        run(&[("OPT", "sgd")], Status::Ok, Some(GB), H100),
    ];
    let m = &models(&vars(&["OPT"]), &runs, target())[0];
    assert_eq!(m.verdict, Verdict::NotNumeric);
    let r = &batch_sweep(&[])[0];
    assert_eq!(Metric::Allocated.of(r), r.peak_allocated_bytes);
    assert_eq!(Metric::Nvml.of(r), None);
}
