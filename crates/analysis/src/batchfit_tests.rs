//! Unit tests of `batchfit.rs` on recorded and synthetic numbers.

use super::*;

const GB: f64 = 1e9;
const GIB: u64 = 1 << 30;
/// An H200's memory as NVML reports it (143771 MiB).
const H200: u64 = 143_771 * (1 << 20);

fn obs(batch: u64, peak: f64, total: u64) -> BatchObservation {
    BatchObservation {
        batch,
        peak_bytes: peak as u64,
        total_bytes: total,
    }
}

fn evidence<'a>(observations: &'a [BatchObservation], current: Option<u64>) -> Evidence<'a> {
    Evidence {
        env_var: "BATCH_SIZE",
        current,
        limit_bytes: observations.last().map(|o| o.total_bytes),
        headroom_fraction: DEFAULT_HEADROOM_FRACTION,
        breakdown: None,
        observations,
    }
}

#[test]
fn two_recorded_batch_sizes_give_the_largest_safe_batch() {
    // docs/gpu-results.md run (d): the same trainer at batch 8 and 24 on H200s
    // peaked at 18.96 GB and 47.06 GB.
    let seen = [obs(8, 18.96 * GB, H200), obs(24, 47.06 * GB, H200)];
    let rec = recommend(&evidence(&seen, Some(24)));
    assert_eq!(rec.method, METHOD_TWO_BATCH_SIZES, "{}", rec.reason);
    // slope (47.06 - 18.96) / 16 = 1.75625 GB; static 18.96 - 8 × 1.75625 = 4.91 GB;
    // target 0.9 × 150.755 GB = 135.679 GB; (135.679 - 4.91) / 1.75625 = 74.46.
    assert_eq!(rec.per_sample_bytes, Some(1_756_250_000));
    assert_eq!(rec.static_bytes, Some(4_910_000_000));
    assert_eq!(rec.recommended, Some(74));
    assert_eq!(rec.next_up, Some(75));
    assert_eq!(rec.residual_bytes, Some(0), "two points: an exact line");
    let target = 0.9 * H200 as f64;
    assert!(rec.predicted_peak_bytes.unwrap() as f64 <= target);
    assert!(rec.predicted_next_up_bytes.unwrap() as f64 > target);
    assert!(rec.reason.contains("2 batch sizes"), "{}", rec.reason);
}

#[test]
fn noisy_peaks_are_fitted_by_least_squares_with_a_residual() {
    // static 12 GiB + 1.5 GiB/sample on an 80 GiB device, each peak off by up to ±0.4 GiB.
    let noise = [0.31, -0.4, 0.12, -0.22, 0.38];
    let seen: Vec<_> = [4u64, 8, 12, 16, 24]
        .iter()
        .zip(noise)
        .map(|(b, n)| {
            let peak = (12.0 + 1.5 * *b as f64 + n) * GIB as f64;
            obs(*b, peak, 80 * GIB)
        })
        .collect();
    let m = fit_peaks(
        &seen
            .iter()
            .map(|o| (o.batch, o.peak_bytes))
            .collect::<Vec<_>>(),
    )
    .unwrap();
    let per = m.per_sample_bytes / GIB as f64;
    assert!((per - 1.5).abs() < 0.05, "per-sample {per} GiB");
    let resid = m.residual_bytes / GIB as f64;
    assert!(resid > 0.1 && resid < 0.4, "residual {resid} GiB");
    let rec = recommend(&evidence(&seen, Some(24)));
    // target 72 GiB: (72 - 12) / 1.5 = 40, give or take the noise.
    let r = rec.recommended.unwrap();
    assert!((39..=41).contains(&r), "{r}");
    assert!(m.at(r) <= 72.0 * GIB as f64 && m.at(r + 1) > 72.0 * GIB as f64);
    assert!(rec.residual_bytes.unwrap() > 0);
}

#[test]
fn flat_or_shrinking_peaks_are_not_a_model() {
    for (a, b) in [(20.0, 20.0), (30.0, 25.0)] {
        let seen = [obs(8, a * GB, H200), obs(24, b * GB, H200)];
        let rec = recommend(&evidence(&seen, Some(24)));
        assert_eq!(rec.method, METHOD_INSUFFICIENT);
        assert_eq!(rec.recommended, None);
        assert!(
            rec.reason.contains("do not grow with the batch"),
            "{}",
            rec.reason
        );
    }
}

#[test]
fn one_batch_size_without_a_breakdown_says_what_is_missing() {
    let seen = [obs(64, 79.3 * GIB as f64, 80 * GIB)];
    let rec = recommend(&evidence(&seen, Some(64)));
    assert_eq!(rec.method, METHOD_INSUFFICIENT);
    assert!(
        rec.reason
            .starts_with("too little evidence: 1 batch size(s) observed, at least 2 needed"),
        "{}",
        rec.reason
    );
    assert!(rec.reason.contains("no agent breakdown"), "{}", rec.reason);
    assert_eq!(rec.current, Some(64));
    assert_eq!(rec.limit_bytes, Some(80 * GIB));
}

#[test]
fn a_peak_at_the_ceiling_is_censored() {
    let seen = [
        obs(64, 80.0 * GIB as f64, 80 * GIB),
        obs(48, 70.0 * GIB as f64, 80 * GIB),
    ];
    let rec = recommend(&evidence(&seen, Some(48)));
    assert_eq!(rec.method, METHOD_INSUFFICIENT);
    assert!(
        rec.reason
            .contains("1 peak(s) at the device's ceiling left out"),
        "{}",
        rec.reason
    );
}

#[test]
fn the_agent_breakdown_alone_is_enough_and_anchors_on_the_nvml_peak() {
    let breakdown = AgentBreakdown {
        static_bytes: 20 * GIB,
        activations_peak_bytes: Some(32 * GIB),
        batch_size: None,
    };
    // No NVML peak: static from the allocator view, activations / current batch.
    let mut e = evidence(&[], Some(64));
    e.limit_bytes = Some(80 * GIB);
    e.breakdown = Some(breakdown);
    let rec = recommend(&e);
    assert_eq!(rec.method, METHOD_AGENT_BREAKDOWN);
    assert_eq!(rec.per_sample_bytes, Some(GIB / 2));
    // (72 - 20) / 0.5 = 104.
    assert_eq!(rec.recommended, Some(104));
    // With the NVML peak at 64 (54 GiB: context and cache on top of 52): static 22 GiB.
    let seen = [obs(64, 54.0 * GIB as f64, 80 * GIB)];
    let mut e = evidence(&seen, Some(64));
    e.breakdown = Some(breakdown);
    let rec = recommend(&e);
    assert_eq!(rec.static_bytes, Some(22 * GIB as i64));
    assert_eq!(rec.recommended, Some(100));
    assert!(
        rec.reason.contains("anchored at the NVML peak"),
        "{}",
        rec.reason
    );
    // A breakdown without activations is not enough.
    let mut e = evidence(&seen, Some(64));
    e.breakdown = Some(AgentBreakdown {
        activations_peak_bytes: None,
        ..breakdown
    });
    let rec = recommend(&e);
    assert_eq!(rec.method, METHOD_INSUFFICIENT);
    assert!(rec.reason.contains("no activations peak"), "{}", rec.reason);
}

#[test]
fn per_sample_gradients_grow_with_the_batch() {
    let b = memprof_api::MemoryBreakdown {
        static_bytes: 30,
        per_sample_gradients_bytes: Some(10),
        activations_peak_bytes: Some(20),
        batch_size: Some(4),
        ..Default::default()
    };
    assert_eq!(
        AgentBreakdown::of(&b),
        AgentBreakdown {
            static_bytes: 20,
            activations_peak_bytes: Some(30),
            batch_size: Some(4)
        }
    );
}

#[test]
fn no_device_or_non_finite_numbers_are_insufficient_not_a_panic() {
    let rec = recommend(&evidence(&[], None));
    assert_eq!(rec.method, METHOD_INSUFFICIENT);
    assert!(rec.reason.contains("device's memory is unknown"));
    let mut e = evidence(&[], None);
    e.limit_bytes = Some(H200);
    let rec = recommend(&e);
    assert!(
        rec.reason
            .contains("the Job sets no literal integer env BATCH_SIZE (name its batch variable with annotation memprof.dev/batch-env)"),
        "{}",
        rec.reason
    );
    let seen = [obs(8, 10.0 * GB, H200), obs(16, 20.0 * GB, H200)];
    let mut e = evidence(&seen, Some(16));
    e.headroom_fraction = f64::NAN;
    assert_eq!(recommend(&e).headroom_fraction, DEFAULT_HEADROOM_FRACTION);
    let m = LinearModel {
        static_bytes: 0.0,
        per_sample_bytes: f64::INFINITY,
        residual_bytes: 0.0,
    };
    assert_eq!(m.largest_within(1e9), None);
    // Static memory alone over the target: no batch fits, said so.
    let seen = [obs(8, 140.0 * GB, H200), obs(16, 141.0 * GB, H200)];
    let rec = recommend(&evidence(&seen, Some(16)));
    assert_eq!((rec.recommended, rec.next_up), (None, Some(1)));
    assert!(rec.reason.contains("no batch fits"), "{}", rec.reason);
}

#[test]
fn exact_boundaries_are_inclusive() {
    let m = LinearModel {
        static_bytes: 0.0,
        per_sample_bytes: 3.0,
        residual_bytes: 0.0,
    };
    assert_eq!(m.largest_within(30.0), Some(10));
    assert_eq!(m.largest_within(29.9), Some(9));
    assert_eq!(m.largest_within(2.0), None);
}

#[test]
fn a_policy_value_respects_minimum_round_to_and_its_headroom() {
    let seen = [
        obs(48, 76.1 * GIB as f64, 80 * GIB),
        obs(64, 79.3 * GIB as f64, 80 * GIB),
    ];
    let rec = recommend(&evidence(&seen, Some(48)));
    // 66.5 GiB + 0.2 GiB/sample; (72 - 66.5) / 0.2 = 27.5.
    assert_eq!(rec.recommended, Some(27), "{}", rec.reason);
    let v = |h, min, round| policy_value(Some(&rec), "BATCH_SIZE", h, min, round);
    assert_eq!(v(0.1, 1, None).unwrap().value, 27);
    assert_eq!(v(0.1, 1, Some(8)).unwrap().value, 24);
    assert_eq!(v(0.1, 32, Some(8)).unwrap().value, 32);
    // 20 % headroom: (64 - 66.5) < 0: nothing fits, so the minimum.
    assert_eq!(v(0.2, 4, None).unwrap().value, 4);
    assert!(v(0.1, 1, None).unwrap().note.contains("→ 27"));
    let other = policy_value(Some(&rec), "MICRO_BATCH", 0.1, 1, None).unwrap_err();
    assert!(
        other.contains("memprof.dev/batch-env: MICRO_BATCH"),
        "{other}"
    );
    let thin = recommend(&evidence(&seen[..1], Some(48)));
    assert!(policy_value(Some(&thin), "BATCH_SIZE", 0.1, 1, None)
        .unwrap_err()
        .contains("too little evidence"));
    assert!(policy_value(None, "BATCH_SIZE", 0.1, 1, None).is_err());
}

#[test]
fn observations_keep_the_highest_peak_per_batch_newest_last_and_are_bounded() {
    let mut seen = observe(&[], Some(64), 70, 100);
    seen = observe(&seen, Some(48), 60, 100);
    seen = observe(&seen, Some(64), 65, 100);
    assert_eq!(
        seen.iter()
            .map(|o| (o.batch, o.peak_bytes))
            .collect::<Vec<_>>(),
        vec![(48, 60), (64, 70)]
    );
    assert_eq!(observe(&seen, Some(8), 0, 100), seen, "no report: nothing");
    assert_eq!(observe(&seen, None, 50, 100), seen);
    for b in 1..=20 {
        seen = observe(&seen, Some(b), 10 + b, 100);
    }
    assert_eq!(seen.len(), MAX_OBSERVATIONS);
    assert_eq!(seen.last().unwrap().batch, 20);
    assert_eq!(seen[0].batch, 13);
}

#[test]
fn report_and_explain_show_the_arithmetic() {
    let seen = [
        obs(48, 76.1 * GIB as f64, 80 * GIB),
        obs(64, 79.3 * GIB as f64, 80 * GIB),
    ];
    let rec = recommend(&evidence(&seen, Some(48)));
    let text = render(&rec);
    assert!(
        text.starts_with(
            "  batch size: BATCH_SIZE = 48 now; largest safe 27 (predicted peak 71.9GiB), 28 predicted at 72.1GiB\n    twoBatchSizes: NVML peaks at 2 batch sizes"
        ),
        "{text}"
    );
    assert!(
        text.contains("    peaks seen: 48 -> 76.1GiB, 64 -> 79.3GiB"),
        "{text}"
    );
    // `memprof report` shows it: pinned in the CLI's report tests.
    let lines = explain_lines(&rec, 0.1).join("\n");
    assert!(
        lines.contains("static 66.5GiB, per-sample 205MiB, residual 0B"),
        "{lines}"
    );
    assert!(
        lines.contains("limit 80.0GiB, headroom 10% → target 72.0GiB"),
        "{lines}"
    );
    assert!(
        lines.contains(
            "→ recommended BATCH_SIZE = 27 (predicted 71.9GiB); next up 28 predicted 72.1GiB"
        ),
        "{lines}"
    );
    let thin = recommend(&evidence(&seen[..1], Some(48)));
    assert!(explain_lines(&thin, 0.1)[0].starts_with("batch fit: too little evidence"));
}
