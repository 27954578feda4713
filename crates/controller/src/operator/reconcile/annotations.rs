//! The Job annotations the operator keeps: values that change only when what
//! they tell a user does.
//!
//! Why: the imbalance printed to two decimals wobbled with every report
//! (1.26, 1.27, 1.26, …) and the time to OOM moved every second, so a run
//! of 200 Jobs × 16 ranks patched Jobs 1,100–1,300 times, each patch
//! triggering another reconcile. Each value is now rounded to what a human
//! reads (imbalance to 0.1, time to OOM to a coarse step) and, on top, kept
//! while the new value stays within a band around the annotated one (75 %
//! of a step, and for the time to OOM at least 25 % of its value: a value
//! must move past the rounding boundary by a quarter step before the
//! annotation follows), so noise around a boundary never flips it.

use super::format_location;
use memprof_api::{
    MemoryProfileStatus, ANNOTATION_BOTTLENECK, ANNOTATION_GPU_OOM, ANNOTATION_IMBALANCE,
    ANNOTATION_OOM_RISK, ANNOTATION_TIME_TO_OOM,
};
use std::collections::BTreeMap;

/// The annotations the operator writes on a Job, in a stable order.
pub const JOB_ANNOTATIONS: [&str; 5] = [
    ANNOTATION_OOM_RISK,
    ANNOTATION_TIME_TO_OOM,
    ANNOTATION_IMBALANCE,
    ANNOTATION_BOTTLENECK,
    ANNOTATION_GPU_OOM,
];

/// `memprof.dev/gpu-oom` for the Job with uid `job_uid`: its newest
/// recorded GPU OOM, `"<time> rank N"`. `None` (no annotation) until one
/// is recorded, and for a Job memprof recreated: the records of the Job it
/// replaced are the profile's history, not this run's.
pub fn gpu_oom_annotation(status: &MemoryProfileStatus, job_uid: &str) -> Option<String> {
    status
        .ooms
        .iter()
        .rev()
        .find(|o| o.job_uid.as_deref().is_none_or(|u| u == job_uid))
        .map(|o| o.annotation_value())
}

/// Share of a step a value may move from the annotated value before the
/// annotation follows (0.5 would be plain rounding).
const BAND: f64 = 0.75;
/// Step of the imbalance annotation (one decimal).
const IMBALANCE_STEP: f64 = 0.1;

/// The annotations the Job should carry for `status`, given those it carries
/// (`current`): each value stays as annotated while the status's value is
/// within its band (see the module docs). The risk level needs no band: the
/// status's level is already held against flapping.
pub fn job_annotations(
    status: &MemoryProfileStatus,
    current: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let dash = || "-".to_string();
    let now = |key: &str| current.get(key).map(String::as_str);
    let tto = status
        .time_to_oom
        .as_ref()
        .and(status.time_to_oom_seconds)
        .map_or_else(dash, |t| stable_tto(t, now(ANNOTATION_TIME_TO_OOM)));
    let imbalance = status
        .imbalance
        .map_or_else(dash, |i| stable_imbalance(i, now(ANNOTATION_IMBALANCE)));
    let bottleneck = stable_bottleneck(status, now(ANNOTATION_BOTTLENECK));
    BTreeMap::from([
        (ANNOTATION_OOM_RISK.into(), status.risk.as_str().into()),
        (ANNOTATION_TIME_TO_OOM.into(), tto),
        (ANNOTATION_IMBALANCE.into(), imbalance),
        (ANNOTATION_BOTTLENECK.into(), bottleneck),
    ])
}

/// Whether any desired annotation is missing or different on the Job.
pub fn annotations_outdated(
    current: &BTreeMap<String, String>,
    desired: &BTreeMap<String, String>,
) -> bool {
    desired.iter().any(|(k, v)| current.get(k) != Some(v))
}

fn stable_imbalance(value: f64, current: Option<&str>) -> String {
    if let Some(shown) = current.and_then(|c| c.parse::<f64>().ok()) {
        if (value - shown).abs() < BAND * IMBALANCE_STEP {
            return current.unwrap_or_default().to_string();
        }
    }
    // One decimal: times ten, so that 1.25 rounds up as it reads.
    format!("{:.1}", (value * 10.0).round() / 10.0)
}

/// A time to OOM for humans, in steps that grow with it (`<1m`, whole
/// minutes to 10 minutes, 5 minutes to an hour, hours to a day, then days),
/// rounded down: a label never promises more time than the prediction
/// gives (2m17s reads `2m`, never `3m`).
fn tto_label(seconds: f64) -> String {
    let s = seconds.max(0.0);
    if s < 60.0 {
        return "<1m".into();
    }
    if s < 600.0 {
        return format!("{}m", (s / 60.0).floor() as u64);
    }
    if s < 3600.0 {
        return format!("{}m", (s / 300.0).floor() as u64 * 5);
    }
    if s < 86_400.0 {
        return format!("{}h", (s / 3600.0).floor() as u64);
    }
    format!("{}d", (s / 86_400.0).floor() as u64)
}

/// The least time a label stands for and its step, for labels
/// [`tto_label`] makes.
fn tto_value(label: &str) -> Option<(f64, f64)> {
    if label == "<1m" {
        return Some((0.0, 60.0));
    }
    let (n, unit) = label.split_at(label.len().checked_sub(1)?);
    let n: f64 = n.parse().ok()?;
    Some(match unit {
        "m" if n < 10.0 => (n * 60.0, 60.0),
        "m" => (n * 60.0, 300.0),
        "h" => (n * 3600.0, 3600.0),
        "d" => (n * 86_400.0, 86_400.0),
        _ => return None,
    })
}

/// Predictions jitter in proportion to themselves (a few % to tens of %
/// between reports), so a rise must also pass this share of the label's
/// value before the label follows it up (holding a lower label is safe: it
/// only understates the time left).
const TTO_RELATIVE_BAND: f64 = 0.5;

/// The annotated label holds while it does not overstate the prediction
/// (its least time is at most the prediction) and the prediction has not
/// risen past the next label by a margin: so a falling prediction is
/// followed at once, and noise around a boundary flips the label at most
/// once (down), never back and forth.
fn stable_tto(seconds: f64, current: Option<&str>) -> String {
    if let Some((shown, step)) = current.and_then(tto_value) {
        let margin = (BAND * step).max(TTO_RELATIVE_BAND * shown);
        if shown <= seconds && seconds < shown + step + margin {
            return current.unwrap_or_default().to_string();
        }
    }
    tto_label(seconds)
}

/// The annotated bottleneck stays while its GPU is still among the top
/// ranks at the worst risk level with a time to OOM close to the worst
/// (within 25 % and 30 s): GPUs neck and neck do not take turns.
fn stable_bottleneck(status: &MemoryProfileStatus, current: Option<&str>) -> String {
    let Some(best) = status.bottleneck.as_ref() else {
        return "-".into();
    };
    let Some(worst) = status.top_ranks.first() else {
        return format_location(best);
    };
    let close = |t: Option<f64>| match (t, worst.time_to_oom_seconds) {
        (None, None) => true,
        (Some(t), Some(w)) => t <= w * 1.25 + 30.0,
        _ => false,
    };
    let kept = status.top_ranks.iter().find(|r| {
        r.risk == worst.risk
            && close(r.time_to_oom_seconds)
            && Some(format_location(&r.location).as_str()) == current
    });
    match kept {
        Some(r) => format_location(&r.location),
        None => format_location(best),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_api::{GpuLocation, RankSummary, RiskLevel};

    fn noisy(imbalance: f64, tto: f64) -> MemoryProfileStatus {
        MemoryProfileStatus {
            risk: RiskLevel::High,
            imbalance: Some(imbalance),
            imbalance_display: Some(format!("{imbalance:.2}")),
            time_to_oom_seconds: Some(tto),
            time_to_oom: Some("x".into()),
            ..Default::default()
        }
    }

    /// Patches a Job would get over `statuses`, applying each as the operator does.
    fn patches(statuses: &[MemoryProfileStatus]) -> usize {
        let mut on_job = BTreeMap::new();
        let mut n = 0;
        for st in statuses {
            let desired = job_annotations(st, &on_job);
            if annotations_outdated(&on_job, &desired) {
                on_job = desired;
                n += 1;
            }
        }
        n
    }

    #[test]
    fn the_gpu_oom_annotation_names_this_jobs_newest_oom() {
        use memprof_api::OomRecord;
        let oom = |time: &str, rank, job: &str| OomRecord {
            time: time.into(),
            rank: Some(rank),
            job_uid: Some(job.into()),
            ..Default::default()
        };
        let mut st = MemoryProfileStatus::default();
        assert_eq!(gpu_oom_annotation(&st, "new"), None);
        st.ooms = vec![
            oom("2026-11-24T09:00:00Z", 1, "old"),
            oom("2026-11-24T09:05:00Z", 2, "new"),
            oom("2026-11-24T09:06:00Z", 3, "old"),
        ];
        assert_eq!(
            gpu_oom_annotation(&st, "new").as_deref(),
            Some("2026-11-24T09:05:00Z rank 2")
        );
        assert_eq!(
            gpu_oom_annotation(&st, "old").as_deref(),
            Some("2026-11-24T09:06:00Z rank 3")
        );
        assert_eq!(gpu_oom_annotation(&st, "other"), None);
    }

    #[test]
    fn noise_around_a_rounding_boundary_never_flips_an_annotation() {
        // The wobble that cost ~1,200 patches a run: 1.24 … 1.27 around the
        // 1.25 boundary, and a time to OOM jittering around 4m30s.
        let statuses: Vec<_> = (0..200)
            .map(|i| {
                let jitter = if i % 2 == 0 { 1.0 } else { -1.0 };
                noisy(1.255 + 0.015 * jitter, 270.0 + 20.0 * jitter)
            })
            .collect();
        assert_eq!(patches(&statuses), 1, "only the first write");
        // Today's two-decimal values would have changed on every status.
        let old: std::collections::BTreeSet<_> = statuses
            .iter()
            .map(|s| s.imbalance_display.clone())
            .collect();
        assert_eq!(old.len(), 2);
    }

    #[test]
    fn a_real_move_is_followed() {
        let mut on_job = job_annotations(&noisy(1.25, 600.0), &BTreeMap::new());
        assert_eq!(on_job[ANNOTATION_IMBALANCE], "1.3");
        assert_eq!(on_job[ANNOTATION_TIME_TO_OOM], "10m");
        on_job = job_annotations(&noisy(1.40, 290.0), &on_job);
        assert_eq!(on_job[ANNOTATION_IMBALANCE], "1.4");
        assert_eq!(on_job[ANNOTATION_TIME_TO_OOM], "4m");
        // A steady leak: the time to OOM walks down minute by minute.
        let labels: Vec<_> = [250.0, 190.0, 130.0, 70.0, 30.0, 10.0]
            .iter()
            .map(|t| {
                on_job = job_annotations(&noisy(1.4, *t), &on_job);
                on_job[ANNOTATION_TIME_TO_OOM].clone()
            })
            .collect();
        // (A label holds while it does not overstate: 250 s keeps `4m`.)
        assert_eq!(labels, ["4m", "3m", "2m", "1m", "<1m", "<1m"]);
        // Below medium risk there is no time to OOM to show.
        let low = MemoryProfileStatus::default();
        assert_eq!(job_annotations(&low, &on_job)[ANNOTATION_TIME_TO_OOM], "-");
    }

    #[test]
    fn tto_labels_grow_with_the_time_and_read_back() {
        for (s, label) in [
            (59.0, "<1m"),
            (89.0, "1m"),
            (137.0, "2m"),
            (599.0, "9m"),
            (600.0, "10m"),
            (1000.0, "15m"),
            (3599.0, "55m"),
            (3600.0, "1h"),
            (86_399.0, "23h"),
            (86_400.0, "1d"),
            (200_000.0, "2d"),
        ] {
            assert_eq!(tto_label(s), label, "{s}");
            let (v, _) = tto_value(label).unwrap();
            assert_eq!(tto_label(v), label, "{label} reads back");
        }
        assert_eq!(tto_value("4m20s"), None, "an older format is replaced");
    }

    /// A user reading the annotation never gets more time than the status
    /// predicts: over a jittering, falling prediction (with rises), every
    /// label's least time is at most the prediction it was written for.
    #[test]
    fn the_annotation_never_promises_more_time_than_the_prediction() {
        let mut on_job = BTreeMap::new();
        let mut flips = 0;
        let mut last = String::new();
        for i in 0..2000 {
            let trend = 5000.0 - 2.4 * i as f64;
            let jitter = ((i * 7919) % 97) as f64 / 97.0 - 0.5;
            let tto = (trend * (1.0 + 0.3 * jitter)).max(0.0);
            on_job = job_annotations(&noisy(1.0, tto), &on_job);
            let label = on_job[ANNOTATION_TIME_TO_OOM].clone();
            let (least, _) = tto_value(&label).unwrap();
            assert!(least <= tto, "{label} for {tto:.0} s");
            flips += usize::from(label != last);
            last = label;
        }
        // A falling prediction walks down the labels, jitter or not.
        // (About 20 labels from 1h23m down to <1m; 249 changes when a rise
        // had to pass only a quarter of the value.)
        assert!(flips <= 25, "{flips} label changes");
    }

    fn top(rank: u32, risk: RiskLevel, tto: Option<f64>) -> RankSummary {
        RankSummary {
            location: GpuLocation {
                rank: Some(rank),
                pod: format!("train-{rank}"),
                ..Default::default()
            },
            risk,
            time_to_oom_seconds: tto,
            ..Default::default()
        }
    }

    #[test]
    fn the_bottleneck_stays_while_it_is_neck_and_neck_with_the_worst() {
        let st = |ranks: Vec<RankSummary>| MemoryProfileStatus {
            bottleneck: Some(ranks[0].location.clone()),
            top_ranks: ranks,
            ..Default::default()
        };
        let a = st(vec![
            top(3, RiskLevel::High, Some(100.0)),
            top(5, RiskLevel::High, Some(110.0)),
        ]);
        let on_job = job_annotations(&a, &BTreeMap::new());
        assert!(on_job[ANNOTATION_BOTTLENECK].starts_with("rank=3 "));
        // Rank 5 edges ahead by noise: the annotation stays on rank 3.
        let b = st(vec![
            top(5, RiskLevel::High, Some(99.0)),
            top(3, RiskLevel::High, Some(101.0)),
        ]);
        assert_eq!(job_annotations(&b, &on_job), on_job);
        // Rank 5 pulls clearly ahead, or to a worse level: it moves.
        let c = st(vec![
            top(5, RiskLevel::High, Some(20.0)),
            top(3, RiskLevel::High, Some(101.0)),
        ]);
        assert!(job_annotations(&c, &on_job)[ANNOTATION_BOTTLENECK].starts_with("rank=5 "));
        let d = st(vec![
            top(5, RiskLevel::Critical, Some(99.0)),
            top(3, RiskLevel::High, Some(101.0)),
        ]);
        assert!(job_annotations(&d, &on_job)[ANNOTATION_BOTTLENECK].starts_with("rank=5 "));
    }

    #[test]
    fn annotations_are_patched_only_when_a_value_differs() {
        let st = MemoryProfileStatus::default();
        let desired = job_annotations(&st, &BTreeMap::new());
        assert_eq!(desired[ANNOTATION_TIME_TO_OOM], "-");
        let mut current = desired.clone();
        current.insert("user/other".into(), "x".into());
        assert!(!annotations_outdated(&current, &desired));
        current.insert(ANNOTATION_OOM_RISK.into(), "high".into());
        assert!(annotations_outdated(&current, &desired));
        assert!(annotations_outdated(&BTreeMap::new(), &desired));
    }
}
