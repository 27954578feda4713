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

/// The sim scenario of tests/batch_fit.rs: 66.5 GiB + 0.2 GiB per sample
/// on an 80 GiB GPU, peaks observed at `batches`.
fn sim(batches: &[u64]) -> Vec<BatchObservation> {
    batches
        .iter()
        .map(|&b| obs(b, (66.5 + 0.2 * b as f64) * GIB as f64, 80 * GIB))
        .collect()
}

#[test]
fn two_recorded_batch_sizes_back_only_what_lies_between_them() {
    // docs/gpu-results.md run (d): the same trainer at batch 8 and 24 on H200s
    // peaked at 18.96 GB and 47.06 GB.
    let seen = [obs(8, 18.96 * GB, H200), obs(24, 47.06 * GB, H200)];
    let rec = recommend(&evidence(&seen, Some(24)));
    assert_eq!(rec.method, METHOD_TWO_BATCH_SIZES, "{}", rec.reason);
    // slope (47.06 - 18.96) / 16 = 1.75625 GB; static 18.96 - 8 × 1.75625 = 4.91 GB.
    assert_eq!(rec.per_sample_bytes, Some(1_756_250_000));
    assert_eq!(rec.static_bytes, Some(4_910_000_000));
    assert_eq!(rec.residual_bytes, Some(0), "two points: an exact line");
    let m = rec.model.as_ref().unwrap();
    assert_eq!(
        (m.family.as_str(), m.held_out_error_bytes),
        ("linear", None)
    );
    assert_eq!((m.backed_min, m.backed_max), (8, 24));
    // The line reaches 90 % of the H200 at 74: three times the largest
    // batch measured, with nothing held out to check it. Only 24 is backed.
    assert_eq!(rec.recommended, Some(24));
    assert_eq!(rec.support.as_deref(), Some("measured"));
    assert_eq!(rec.unbacked, Some(74));
    assert!(
        rec.reason.contains("the curve alone would allow 74, unsupported: 50 above the largest measured value 24 (+208%)"),
        "{}",
        rec.reason
    );
    assert!(rec.reason.contains("2 batch sizes"), "{}", rec.reason);
}

#[test]
fn three_batch_sizes_back_one_held_out_step_below_the_data() {
    // The sim at 64, 48 and 36: each predicted from the other two exactly,
    // so the line may go one step (12) below 36.
    let rec = recommend(&evidence(&sim(&[64, 48, 36]), Some(36)));
    let m = rec.model.as_ref().unwrap();
    assert_eq!((m.backed_min, m.backed_max), (24, 80));
    // (72 - 66.5) / 0.2 = 27.5 on the line; with the margin (the noise
    // floor, growing by one per held-out step out) 25, 11 below 36.
    assert_eq!(rec.recommended, Some(25), "{}", rec.reason);
    assert_eq!(
        rec.support.as_deref(),
        Some("extrapolated 11 below the smallest measured value 36 (-31%)")
    );
    assert_eq!(rec.unbacked, None);
    let target = 0.9 * 80.0 * GIB as f64;
    assert!(rec.predicted_peak_bytes.unwrap() as f64 <= target);
    // 26 is predicted under the target, but not with its margin.
    assert_eq!(rec.next_up, Some(26));
    assert!((rec.predicted_next_up_bytes.unwrap() as f64) < target);
    let f = largest_fitting(Some(&rec), "BATCH_SIZE", 26, 0.1).unwrap();
    assert_eq!(f.value, 25);
}

#[test]
fn noisy_peaks_are_fitted_with_a_margin_from_held_out_errors() {
    // static 12 GiB + 1.5 GiB/sample on an 80 GiB device, each peak off by up to ±0.4 GiB.
    let noise = [0.31, -0.4, 0.38, -0.22, 0.12];
    let seen: Vec<_> = [4u64, 8, 12, 16, 24]
        .iter()
        .zip(noise)
        .map(|(b, n)| obs(*b, (12.0 + 1.5 * *b as f64 + n) * GIB as f64, 80 * GIB))
        .collect();
    let rec = recommend(&evidence(&seen, Some(24)));
    let m = rec.model.as_ref().unwrap();
    assert_eq!(m.family, "linear");
    let per = m.per_sample_bytes / GIB as f64;
    assert!((per - 1.5).abs() < 0.05, "per-sample {per} GiB");
    let margin = m.margin_bytes as f64 / GIB as f64;
    assert!(margin > 0.3 && margin < 1.0, "margin {margin} GiB");
    // The line reaches 72 GiB near 40, but the data backs up to 32 (24 + the
    // held-out step of 8): 32 predicted ~60 GiB, with room.
    assert_eq!(rec.recommended, Some(32), "{}", rec.reason);
    let u = rec.unbacked.unwrap();
    assert!((38..=40).contains(&u), "{u}");
}

#[test]
fn flat_or_shrinking_peaks_are_not_a_model() {
    for (a, b) in [(20.0, 20.0), (30.0, 25.0)] {
        let seen = [obs(8, a * GB, H200), obs(24, b * GB, H200)];
        let rec = recommend(&evidence(&seen, Some(24)));
        assert_eq!(rec.method, METHOD_INSUFFICIENT);
        assert_eq!(rec.recommended, None);
        assert!(
            rec.reason
                .contains("they are no memory law: linear refused: the peak does not grow"),
            "{}",
            rec.reason
        );
    }
}

#[test]
fn a_negative_static_part_is_not_a_model() {
    // Three batches whose peaks grow faster than a line: the line through
    // them says -20 GB at batch 0, and under-predicts the largest.
    let seen = [
        obs(8, 10.0 * GB, H200),
        obs(16, 30.0 * GB, H200),
        obs(24, 70.0 * GB, H200),
    ];
    let rec = recommend(&evidence(&seen, Some(24)));
    assert_eq!(rec.method, METHOD_INSUFFICIENT, "{}", rec.reason);
    assert!(rec.reason.contains("linear refused"), "{}", rec.reason);
    assert!(policy_value(Some(&rec), "BATCH_SIZE", 0.1, 1, None, 24).is_err());
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
fn a_peak_at_the_ceiling_is_censored_and_bounds_every_answer() {
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
    // With two usable batches under it, nothing at or above 64 is proposed.
    let seen = [
        obs(16, 30.0 * GIB as f64, 80 * GIB),
        obs(32, 40.0 * GIB as f64, 80 * GIB),
        obs(48, 50.0 * GIB as f64, 80 * GIB),
        obs(64, 80.0 * GIB as f64, 80 * GIB),
    ];
    let rec = recommend(&evidence(&seen, Some(48)));
    let r = rec.recommended.unwrap();
    assert!((48..64).contains(&r), "{}", rec.reason);
    assert!(rec.unbacked.is_none_or(|u| u < 64));
}

#[test]
fn the_agent_breakdown_backs_every_batch_up_to_the_measured_one() {
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
    // (72 - 20) / 0.5 = 104 on the line, but the breakdown measured batch
    // 64: 64 is the largest backed (52 GiB), 104 is shown, not used.
    assert_eq!(rec.recommended, Some(64));
    assert!(
        rec.unbacked.is_some_and(|u| (100..=104).contains(&u)),
        "{:?}",
        rec.unbacked
    );
    // Under a tighter target the breakdown backs a smaller batch: 40 GiB →
    // (40 - 20) / 0.5 = 40, less the margin.
    let f = largest_fitting(Some(&rec), "BATCH_SIZE", 64, 0.5).unwrap();
    assert!(f.backed && (38..=40).contains(&f.value), "{f:?}");
    assert_eq!(f.support, Support::Interpolated);
    // With the NVML peak at 64 (54 GiB: context and cache on top of 52): static 22 GiB.
    let seen = [obs(64, 54.0 * GIB as f64, 80 * GIB)];
    let mut e = evidence(&seen, Some(64));
    e.breakdown = Some(breakdown);
    let rec = recommend(&e);
    assert_eq!(rec.static_bytes, Some(22 * GIB as i64));
    assert_eq!(rec.recommended, Some(64));
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
    let mut broken = recommend(&evidence(&seen, Some(16)));
    broken.model.as_mut().unwrap().per_sample_bytes = f64::INFINITY;
    assert!(model_in(&broken).is_none());
    assert!(largest_fitting(Some(&broken), "BATCH_SIZE", 16, 0.1).is_err());
    // Static memory alone over the target: no batch fits, said so.
    let seen = [obs(8, 140.0 * GB, H200), obs(16, 141.0 * GB, H200)];
    let rec = recommend(&evidence(&seen, Some(16)));
    assert_eq!(
        (rec.recommended, rec.next_up, rec.unbacked),
        (None, Some(1), None)
    );
    assert!(
        rec.reason
            .contains("no batch the evidence backs stays under"),
        "{}",
        rec.reason
    );
    let err = largest_fitting(Some(&rec), "BATCH_SIZE", 16, 0.1).unwrap_err();
    assert!(
        matches!(err, NoFit::NothingFits { at_most: 16, .. }),
        "{err:?}"
    );
    assert!(
        err.to_string().starts_with("no batch up to 16 fits"),
        "{err}"
    );
}

#[test]
fn the_accumulation_query_gives_the_largest_backed_micro_batch_under_a_cap() {
    let rec = recommend(&evidence(&sim(&[64, 48, 36]), Some(36)));
    // Keep the global batch: the micro-batch may not exceed 16.
    let f = largest_fitting(Some(&rec), "BATCH_SIZE", 16, 0.1).unwrap();
    assert_eq!(f.value, 16, "{f:?}");
    assert!(
        !f.backed,
        "16 is 20 below 36, further than the held-out step of 12"
    );
    let f = largest_fitting(Some(&rec), "BATCH_SIZE", 30, 0.1).unwrap();
    assert_eq!((f.value, f.backed), (25, true), "{f:?}");
    let target = (0.9 * 80.0 * GIB as f64) as u64;
    assert_eq!(f.target_bytes, target);
    assert!(f.predicted_peak_bytes + f.margin_bytes <= target);
    assert!(f.margin_bytes >= memmodel::NOISE_FLOOR_BYTES as u64);
    assert!(
        f.note
            .starts_with("fit twoBatchSizes: 66.5GiB + 205MiB × B, ≤72.0GiB → 25 (extrapolated"),
        "{}",
        f.note
    );
    let other = largest_fitting(Some(&rec), "MICRO_BATCH", 30, 0.1).unwrap_err();
    assert!(
        other
            .to_string()
            .contains("memprof.dev/batch-env: MICRO_BATCH"),
        "{other}"
    );
    assert_eq!(
        largest_fitting(None, "BATCH_SIZE", 30, 0.1).unwrap_err(),
        NoFit::NoRecommendation
    );
}

#[test]
fn a_policy_value_is_backed_rounded_and_at_least_the_minimum() {
    // Two batches (48, 64): the line's 25 is 23 below the data, with
    // nothing held out: not backed.
    let two = recommend(&evidence(&sim(&[64, 48]), Some(48)));
    assert_eq!(
        (two.recommended, two.unbacked),
        (None, Some(25)),
        "{}",
        two.reason
    );
    let err = policy_value(Some(&two), "BATCH_SIZE", 0.1, 1, None, 48).unwrap_err();
    assert_eq!(err.kind(), "not backed by the measured batches");
    assert!(
        err.to_string().starts_with("not backed: the curve would allow 25, but that is unsupported: 23 below the smallest measured value 48 (-48%)"),
        "{err}"
    );
    // Three (36, 48, 64): 25 is within the held-out step below 36.
    let rec = recommend(&evidence(&sim(&[64, 48, 36]), Some(36)));
    let v = |h, min, round| policy_value(Some(&rec), "BATCH_SIZE", h, min, round, 36);
    assert_eq!(v(0.1, 1, None).unwrap().value, 25);
    assert_eq!(v(0.1, 1, Some(8)).unwrap().value, 24);
    assert_eq!(v(0.1, 32, Some(8)).unwrap().value, 32);
    // 20 % headroom: 64 GiB < 66.5 GiB static: nothing fits.
    assert!(v(0.2, 4, None)
        .unwrap_err()
        .to_string()
        .starts_with("no batch up to 36 fits"));
    assert!(v(0.1, 1, None).unwrap().note.contains("→ 25"));
    let thin = recommend(&evidence(&sim(&[48]), Some(48)));
    let thin_err = policy_value(Some(&thin), "BATCH_SIZE", 0.1, 1, None, 48).unwrap_err();
    assert!(thin_err.to_string().contains("too little evidence"));
    assert_eq!(thin_err.kind(), "too little evidence");
    assert!(policy_value(None, "BATCH_SIZE", 0.1, 1, None, 48).is_err());
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
    let rec = recommend(&evidence(&sim(&[64, 48, 36]), Some(36)));
    let text = render(&rec);
    assert!(
        text.starts_with(
            "  batch size: BATCH_SIZE = 36 now; largest safe 25 (predicted peak 71.5GiB; extrapolated 11 below the smallest measured value 36 (-31%)), 26 predicted at 71.7GiB\n    twoBatchSizes: NVML peaks at 3 batch sizes"
        ),
        "{text}"
    );
    assert!(
        text.contains("    peaks seen: 64 -> 79.3GiB, 48 -> 76.1GiB, 36 -> 73.7GiB"),
        "{text}"
    );
    let lines = explain_lines(&rec, 0.1).join("\n");
    assert!(
        lines.contains("batch fit (twoBatchSizes, linear): peak = 66.5GiB + 205MiB × B"),
        "{lines}"
    );
    assert!(lines.contains("  backed for batches 24..80"), "{lines}");
    assert!(
        lines.contains("limit 80.0GiB, headroom 10% → target 72.0GiB"),
        "{lines}"
    );
    assert!(
        lines.contains("  → BATCH_SIZE = 25 (predicted 71.5GiB + margin "),
        "{lines}"
    );
    let two = recommend(&evidence(&sim(&[64, 48]), Some(48)));
    let lines = explain_lines(&two, 0.1).join("\n");
    assert!(
        lines.contains("  → not backed: the curve would allow BATCH_SIZE = 25"),
        "{lines}"
    );
    let thin = recommend(&evidence(&sim(&[48]), Some(48)));
    assert!(explain_lines(&thin, 0.1)[0].starts_with("batch fit: too little evidence"));
}
