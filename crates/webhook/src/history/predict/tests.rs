use super::*;
use memprof_api::{BatchObservation, BatchRecommendation, MemoryProfileStatus};

const GIB: u64 = 1 << 30;

/// A line: 20 GiB static, 1 GiB per sample, fitted on 3 points at 8..32.
fn fitted(name: &str, points: u32) -> Fitted {
    Fitted {
        profile: name.into(),
        env_var: "BATCH_SIZE".into(),
        model: BatchFitModel {
            family: "linear".into(),
            static_bytes: 20 * GIB as i64,
            per_sample_bytes: GIB as f64,
            margin_bytes: GIB,
            held_out_error_bytes: Some(GIB / 2),
            points,
            measured_min: 8,
            measured_max: 32,
            backed_min: 8,
            backed_max: 48,
            ..Default::default()
        },
        gpu_bytes: Some(80 * GIB),
        recommended: Some(52),
    }
}

fn env(batch: &str) -> BTreeMap<String, String> {
    [("BATCH_SIZE".to_string(), batch.to_string())].into()
}

#[test]
fn the_peak_is_the_models_curve_at_the_batch_rounded_up() {
    let mut f = fitted("a", 3);
    assert_eq!(f.peak_at(0), 20 * GIB);
    assert_eq!(f.peak_at(40), 60 * GIB);
    f.model.per_sample_squared_bytes = 0.5;
    assert_eq!(f.peak_at(3), 20 * GIB + 3 * GIB + 5, "4.5 bytes round up");
    f.model.static_bytes = -100 * GIB as i64;
    assert_eq!(f.peak_at(1), 0, "never negative");
}

#[test]
fn a_batch_whose_peak_exceeds_the_gpu_is_predicted_to_run_out() {
    // 20 + 64 = 84 GiB > 80 GiB measured.
    let Outcome::Exceeds(p) = predict(&[fitted("a", 3)], &env("64"), None) else {
        panic!("exceeds")
    };
    assert_eq!(
        (p.peak, p.gpu, p.gpu_basis),
        (84 * GIB, 80 * GIB, GpuBasis::Measured)
    );
    let w = warning(&Outcome::Exceeds(p), "Job", "llama").unwrap();
    assert!(
        w.starts_with("memprof: predicted peak 84.0GiB per rank at BATCH_SIZE=64"),
        "{w}"
    );
    for part in [
        "against the GPU's 80.0GiB",
        "measured history of family llama in this namespace: MemoryProfile a",
        "a linear fit of 3 measured points at batches 8..32",
        "error margin 1.0GiB, held-out error 512MiB",
        "extrapolated beyond the batches the measurements back",
        "is expected to run out of GPU memory",
        "recommends at most 52",
    ] {
        assert!(w.contains(part), "{part:?} in {w}");
    }
}

#[test]
fn a_batch_that_fits_says_nothing_and_the_margin_alone_warns_softly() {
    // 20 + 40 = 60 GiB: fits.
    let out = predict(&[fitted("a", 3)], &env("40"), None);
    assert!(matches!(out, Outcome::Fits(_)), "{out:?}");
    assert_eq!(warning(&out, "Job", "f"), None);
    // 20 + 59.5 = 79.5 GiB, 80.5 GiB with the margin.
    let mut f = fitted("a", 3);
    f.model.static_bytes += (GIB / 2) as i64;
    let out = predict(&[f], &env("59"), None);
    assert!(matches!(out, Outcome::MayExceed(_)), "{out:?}");
    assert!(warning(&out, "Job", "f").unwrap().contains("may run out"));
}

#[test]
fn the_annotated_gpu_wins_over_the_measured_one() {
    let out = predict(&[fitted("a", 3)], &env("40"), Some(48 * GIB));
    let Outcome::Exceeds(p) = &out else {
        panic!("{out:?}")
    };
    assert_eq!(p.gpu_basis, GpuBasis::Annotation);
    assert!(warning(&out, "Job", "f")
        .unwrap()
        .contains("from memprof.dev/gpu-memory"));
    let mut f = fitted("a", 3);
    f.gpu_bytes = None;
    assert_eq!(predict(&[f], &env("40"), None), Outcome::NoGpu);
}

#[test]
fn the_most_measured_profile_is_the_basis() {
    let fits = [fitted("b", 2), fitted("a", 5), fitted("c", 5)];
    let Outcome::Exceeds(p) = predict(&fits, &env("64"), None) else {
        panic!()
    };
    assert_eq!((p.basis.profile.as_str(), p.profiles), ("a", 3));
    assert!(basis_words(&p, "f").contains("the most measured of 3 profiles"));
}

#[test]
fn no_history_or_no_batch_is_said_or_left_alone() {
    assert_eq!(predict(&[], &env("64"), None), Outcome::NoHistory);
    assert_eq!(warning(&Outcome::NoHistory, "Job", "f"), None);
    for e in [BTreeMap::new(), env("$(B)"), env("-1")] {
        let out = predict(&[fitted("a", 3)], &e, None);
        assert_eq!(
            out,
            Outcome::NoBatch {
                env_var: "BATCH_SIZE".into()
            }
        );
        assert!(warning(&out, "Job", "f")
            .unwrap()
            .contains("sets no numeric BATCH_SIZE"));
    }
}

#[test]
fn text_from_a_status_is_said_back_without_control_characters() {
    let mut f = fitted("a", 3);
    f.env_var = "B\nWarning: forged\u{1b}[2J".into();
    let e: BTreeMap<String, String> = [(f.env_var.clone(), "64".to_string())].into();
    let w = warning(&predict(&[f], &e, None), "Job", "f").unwrap();
    assert!(!w.chars().any(char::is_control), "{w}");
    assert!(w.len() < 1200, "{}", w.len());
}

#[test]
fn a_profile_without_a_fitted_model_is_no_history() {
    let mut p = MemoryProfile::new("a", Default::default());
    assert_eq!(Fitted::of(&p), None);
    let rec = BatchRecommendation {
        env_var: "BATCH_SIZE".into(),
        observations: vec![BatchObservation {
            batch: 8,
            peak_bytes: 28 * GIB,
            total_bytes: 80 * GIB,
        }],
        ..Default::default()
    };
    p.status = Some(MemoryProfileStatus {
        batch_recommendation: Some(rec.clone()),
        ..Default::default()
    });
    assert_eq!(Fitted::of(&p), None, "observations without a model");
    let model = fitted("a", 3).model;
    p.status.as_mut().unwrap().batch_recommendation = Some(BatchRecommendation {
        model: Some(model.clone()),
        ..rec
    });
    let f = Fitted::of(&p).unwrap();
    assert_eq!(
        (f.gpu_bytes, f.model),
        (Some(80 * GIB), model),
        "GPU from the observations"
    );
}
