//! The admission warning for a Job predicted not to fit its GPU: kubectl
//! prints an AdmissionReview's `warnings`, so a user learns before launch,
//! from the same `kubectl create`, that the run will run out of GPU memory.
//!
//! The prediction is the Job's own claim, attached by annotation
//! (`memprof.dev/predicted-peak`, `memprof.dev/gpu-memory`, and in words
//! `memprof.dev/predicted-by`; `memprof estimate` prints them). A warning,
//! never a denial: an annotation is the Job creator's input, and profiling
//! must never block training.

use memprof_api::{
    format_bytes, parse_bytes, ANNOTATION_GPU_MEMORY, ANNOTATION_PREDICTED_BY,
    ANNOTATION_PREDICTED_PEAK,
};

/// The basis named when the Job does not say (`memprof.dev/predicted-by`).
const DEFAULT_BASIS: &str = "an estimate attached by annotation";
/// Longest basis quoted back (an annotation is input: bounded).
const MAX_BASIS: usize = 120;

/// The warning for a Job whose annotations (looked up by `get`) predict a
/// peak above its GPU's memory, or that name a value that cannot be read;
/// None when it fits or says nothing.
pub fn warning<'a>(get: impl Fn(&str) -> Option<&'a str>) -> Option<String> {
    let (peak, gpu) = (get(ANNOTATION_PREDICTED_PEAK)?, get(ANNOTATION_GPU_MEMORY));
    let peak = match parse_bytes(peak) {
        Ok(p) => p,
        Err(e) => {
            return Some(format!(
                "memprof: ignoring {ANNOTATION_PREDICTED_PEAK}: {e}"
            ))
        }
    };
    let Some(gpu) = gpu else {
        return Some(format!(
            "memprof: {ANNOTATION_PREDICTED_PEAK} is set but not {ANNOTATION_GPU_MEMORY}: \
             add the memory of the GPU each rank gets (e.g. {ANNOTATION_GPU_MEMORY}: 80GiB) \
             to be warned when the prediction does not fit"
        ));
    };
    let gpu = match parse_bytes(gpu) {
        Ok(g) if g > 0 => g,
        Ok(_) => {
            return Some(format!(
                "memprof: ignoring {ANNOTATION_GPU_MEMORY}: 0 bytes"
            ))
        }
        Err(e) => return Some(format!("memprof: ignoring {ANNOTATION_GPU_MEMORY}: {e}")),
    };
    (peak > gpu).then(|| {
        let basis: String = get(ANNOTATION_PREDICTED_BY)
            .unwrap_or(DEFAULT_BASIS)
            .chars()
            // Said back to the user: no line breaks or escapes of theirs.
            .filter(|c| !c.is_control())
            .take(MAX_BASIS)
            .collect();
        format!(
            "memprof: predicted peak {} per rank exceeds the GPU's {} by {} ({basis}): \
             this Job is expected to run out of GPU memory; lower its batch \
             (`memprof estimate --vary` finds the largest that fits)",
            format_bytes(peak),
            format_bytes(gpu),
            format_bytes(peak - gpu),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn warn(pairs: &[(&str, &str)]) -> Option<String> {
        let m: BTreeMap<&str, &str> = pairs.iter().copied().collect();
        warning(|k| m.get(k).copied())
    }

    #[test]
    fn a_peak_above_the_gpu_warns_with_its_basis() {
        let w = warn(&[
            (ANNOTATION_PREDICTED_PEAK, "85.3GiB"),
            (ANNOTATION_GPU_MEMORY, "80GiB"),
            (
                ANNOTATION_PREDICTED_BY,
                "memprof estimate (median error 3 %)",
            ),
        ])
        .unwrap();
        assert!(
            w.starts_with("memprof: predicted peak 85.3GiB per rank exceeds the GPU's 80.0GiB by 5.3GiB (memprof estimate (median error 3 %))"),
            "{w}"
        );
    }

    #[test]
    fn a_peak_that_fits_or_no_prediction_says_nothing() {
        assert_eq!(warn(&[]), None);
        assert_eq!(
            warn(&[
                (ANNOTATION_PREDICTED_PEAK, "79GiB"),
                (ANNOTATION_GPU_MEMORY, "80GiB")
            ]),
            None
        );
        // Decimal and binary units compare as bytes: 80 GB < 80 GiB.
        assert_eq!(
            warn(&[
                (ANNOTATION_PREDICTED_PEAK, "80GB"),
                (ANNOTATION_GPU_MEMORY, "80GiB")
            ]),
            None
        );
    }

    #[test]
    fn unreadable_or_missing_values_are_named() {
        let w = warn(&[
            (ANNOTATION_PREDICTED_PEAK, "lots"),
            (ANNOTATION_GPU_MEMORY, "80GiB"),
        ]);
        assert!(w.unwrap().contains("ignoring memprof.dev/predicted-peak"));
        let w = warn(&[(ANNOTATION_PREDICTED_PEAK, "81GiB")]).unwrap();
        assert!(w.contains("add the memory of the GPU"), "{w}");
        let w = warn(&[
            (ANNOTATION_PREDICTED_PEAK, "81GiB"),
            (ANNOTATION_GPU_MEMORY, "0"),
        ]);
        assert!(w.unwrap().contains("0 bytes"));
    }

    #[test]
    fn the_basis_quoted_back_is_bounded() {
        let long = "x".repeat(10_000);
        let w = warn(&[
            (ANNOTATION_PREDICTED_PEAK, "81GiB"),
            (ANNOTATION_GPU_MEMORY, "80GiB"),
            (ANNOTATION_PREDICTED_BY, &long),
        ])
        .unwrap();
        assert!(w.len() < 400, "{}", w.len());
        let w = warn(&[
            (ANNOTATION_PREDICTED_PEAK, "81GiB"),
            (ANNOTATION_GPU_MEMORY, "80GiB"),
            (ANNOTATION_PREDICTED_BY, "mine\nWarning: forged\u{1b}[2J"),
        ])
        .unwrap();
        assert!(w.contains("(mineWarning: forged[2J)"), "{w}");
    }
}
