//! Where the analysis thresholds come from, and which ones a Job gets.
//!
//! The thresholds ([`Thresholds`]) are used by the **sidecars**: each one
//! assesses its pod's GPUs (risk, time to OOM, leak) with them, and the
//! operator's roll-up only takes the worst of what the ranks report. So a
//! Job's thresholds travel to its sidecars as `MEMPROF_THRESHOLDS` (set by
//! the injection), and the operator shows in the MemoryProfile status which
//! ones are in effect and where they come from:
//!
//! 1. `default`: the built-in [`Thresholds::default`];
//! 2. `chart`: the cluster-wide overrides (`--default-thresholds`, the chart's
//!    `thresholds` value), over the built-in ones;
//! 3. `annotation`: the Job's `memprof.dev/thresholds` (JSON of camelCase
//!    fields), over the cluster-wide ones. Invalid: ignored (the cluster-wide
//!    thresholds apply), with a Warning Event `InvalidThresholds` on the Job
//!    and an admission warning.
//!
//! Pure: parsing, merging and rendering; no client. Shared by the webhook
//! (which injects them), the operator (which reports them), the sidecar
//! (which assesses with them) and the CLI (which shows them). The Warning
//! Event for a refused annotation is the operator's (`operator/thresholds.rs`).

use super::{truncate_utf8, ThresholdsInEffect};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// Job annotation: per-Job thresholds, JSON of camelCase [`Thresholds`] fields.
pub const ANNOTATION_THRESHOLDS: &str = "memprof.dev/thresholds";
/// Longest annotation value read (a full set of fields is ~400 bytes).
pub const MAX_ANNOTATION: usize = 4096;
/// What a cache keeps in place of an annotation value longer than
/// [`MAX_ANNOTATION`] (the operator's, which bounds what it holds per
/// object): the parser refuses it as too long, as it refuses the value it
/// stands for, so the refusal is announced rather than the annotation read
/// as absent. A tenant who writes it gets the same refusal everywhere.
pub const TOO_LONG: &str = "\0memprof: a value over the length read";

/// `value` as a cache keeps it: itself up to [`MAX_ANNOTATION`] bytes,
/// [`TOO_LONG`] beyond (which [`parse_overrides`] refuses as the value).
pub fn bounded(value: &str) -> &str {
    if value.len() > MAX_ANNOTATION {
        TOO_LONG
    } else {
        value
    }
}
/// Longest piece of the tenant's text (a key, the parser's words, which
/// quote the value) an error repeats: the error goes into admission
/// warnings, the status and an Event, and must keep its advice.
const MAX_QUOTED: usize = 96;

/// `s` cut to [`MAX_QUOTED`] bytes, marked with `...` when cut.
fn quoted(s: &str) -> String {
    let mut out = s.to_string();
    if out.len() > MAX_QUOTED {
        truncate_utf8(&mut out, MAX_QUOTED);
        out.push_str("...");
    }
    out
}

/// Why a set of thresholds was refused. The message says what to do.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ThresholdsError {
    /// Not a JSON object.
    #[error("{origin} is not a JSON object of threshold fields ({why}); write e.g. {{\"highTtoSeconds\": 900}}")]
    NotJson {
        /// Where it came from (annotation or flag).
        origin: &'static str,
        /// What the parser said.
        why: String,
    },
    /// A key that is not a threshold (a typo would otherwise be silently ignored).
    #[error("{origin}: unknown field {field:?}; known fields: {known}")]
    UnknownField {
        /// Where it came from.
        origin: &'static str,
        /// The key.
        field: String,
        /// The valid keys.
        known: String,
    },
    /// A value that is not a number.
    #[error("{origin}: field {field:?} must be a number")]
    NotNumber {
        /// Where it came from.
        origin: &'static str,
        /// The key.
        field: String,
    },
    /// The merged thresholds do not make sense together.
    #[error("{origin}: {source}; fix that field")]
    Invalid {
        /// Where it came from.
        origin: &'static str,
        /// What `Thresholds::validate` found.
        source: Error,
    },
    /// Too long to be thresholds.
    #[error("{origin} is longer than {MAX_ANNOTATION} bytes")]
    TooLong {
        /// Where it came from.
        origin: &'static str,
    },
}

/// Where the thresholds in effect come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// Built-in defaults.
    Default,
    /// The cluster-wide `--default-thresholds` (chart value `thresholds`).
    Chart,
    /// The Job's `memprof.dev/thresholds` annotation.
    Annotation,
}

impl Source {
    /// The spelling in the MemoryProfile status.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Default => "default",
            Source::Chart => "chart",
            Source::Annotation => "annotation",
        }
    }
}

fn known_fields() -> Map<String, Value> {
    match serde_json::to_value(Thresholds::default()) {
        Ok(Value::Object(m)) => m,
        _ => Map::new(),
    }
}

/// Parses overrides (a partial JSON object of camelCase fields) and checks
/// them over `base`; returns the overrides, as given, once valid.
pub fn parse_overrides(
    origin: &'static str,
    text: &str,
    base: &Thresholds,
) -> Result<Map<String, Value>, ThresholdsError> {
    if text.len() > MAX_ANNOTATION || text == TOO_LONG {
        return Err(ThresholdsError::TooLong { origin });
    }
    let overrides: Map<String, Value> =
        serde_json::from_str(text).map_err(|e| ThresholdsError::NotJson {
            origin,
            why: quoted(&e.to_string()),
        })?;
    let known = known_fields();
    for (field, value) in &overrides {
        if !known.contains_key(field) {
            let names: Vec<&str> = known.keys().map(String::as_str).collect();
            return Err(ThresholdsError::UnknownField {
                origin,
                field: quoted(field),
                known: names.join(", "),
            });
        }
        if !value.is_number() {
            return Err(ThresholdsError::NotNumber {
                origin,
                field: field.clone(),
            });
        }
    }
    apply(base, &overrides)
        .validate()
        .map_err(|source| ThresholdsError::Invalid { origin, source })?;
    Ok(overrides)
}

/// `base` with `overrides` (already checked by [`parse_overrides`]) applied.
pub fn apply(base: &Thresholds, overrides: &Map<String, Value>) -> Thresholds {
    let mut merged = match serde_json::to_value(base) {
        Ok(Value::Object(m)) => m,
        _ => Map::new(),
    };
    merged.extend(overrides.clone());
    serde_json::from_value(Value::Object(merged)).unwrap_or_else(|_| base.clone())
}

/// The cluster-wide overrides, as `--default-thresholds` gives them (empty: none).
pub fn parse_cluster(text: &str) -> Result<Map<String, Value>, ThresholdsError> {
    if text.trim().is_empty() {
        return Ok(Map::new());
    }
    parse_overrides("--default-thresholds", text, &Thresholds::default())
}

/// What a Job gets: the overrides to hand its sidecars (cluster-wide, then
/// the annotation's), their source, and the annotation's error if it was
/// refused (then only the cluster-wide overrides apply).
#[derive(Clone, Debug, PartialEq)]
pub struct Resolved {
    /// Overrides over the built-in defaults (what `MEMPROF_THRESHOLDS` carries).
    pub overrides: Map<String, Value>,
    /// Where the thresholds come from.
    pub source: Source,
    /// Why the annotation was ignored.
    pub error: Option<String>,
}

impl Resolved {
    /// The thresholds in effect.
    pub fn thresholds(&self) -> Thresholds {
        apply(&Thresholds::default(), &self.overrides)
    }

    /// `MEMPROF_THRESHOLDS` for the sidecar; `None` when nothing is overridden.
    pub fn env(&self) -> Option<String> {
        (!self.overrides.is_empty()).then(|| Value::Object(self.overrides.clone()).to_string())
    }

    /// The MemoryProfile status field.
    pub fn status(&self) -> ThresholdsInEffect {
        let values: BTreeMap<String, f64> = match serde_json::to_value(self.thresholds()) {
            Ok(Value::Object(m)) => m
                .into_iter()
                .filter_map(|(k, v)| Some((k, v.as_f64()?)))
                .collect(),
            _ => BTreeMap::new(),
        };
        let message = self.error.as_ref().map(|e| {
            let mut m = format!(
                "{ANNOTATION_THRESHOLDS} ignored: {e}; the cluster-wide thresholds apply until it is fixed"
            );
            truncate_utf8(&mut m, 512);
            m
        });
        ThresholdsInEffect {
            source: self.source.as_str().into(),
            values,
            message,
        }
    }
}

/// The thresholds of a Job with the annotation value `annotation`, over the
/// cluster-wide overrides `cluster` (already valid).
pub fn resolve(cluster: &Map<String, Value>, annotation: Option<&str>) -> Resolved {
    let cluster_source = if cluster.is_empty() {
        Source::Default
    } else {
        Source::Chart
    };
    let base = apply(&Thresholds::default(), cluster);
    let fallback = |error| Resolved {
        overrides: cluster.clone(),
        source: cluster_source,
        error,
    };
    let Some(text) = annotation else {
        return fallback(None);
    };
    match parse_overrides("annotation memprof.dev/thresholds", text, &base) {
        Ok(own) => {
            let mut overrides = cluster.clone();
            overrides.extend(own);
            Resolved {
                overrides,
                source: Source::Annotation,
                error: None,
            }
        }
        Err(e) => fallback(Some(e.to_string())),
    }
}

/// The `memprof report` lines for the thresholds in effect: the source,
/// the values that differ from the built-in ones (all of them would be
/// noise), and why an annotation was ignored.
pub fn render(t: &ThresholdsInEffect) -> String {
    let defaults: BTreeMap<String, f64> = match serde_json::to_value(Thresholds::default()) {
        Ok(Value::Object(m)) => m
            .into_iter()
            .filter_map(|(k, v)| Some((k, v.as_f64()?)))
            .collect(),
        _ => BTreeMap::new(),
    };
    let changed: Vec<String> = t
        .values
        .iter()
        .filter(|(k, v)| defaults.get(*k) != Some(*v))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let values = if changed.is_empty() {
        "built-in values".to_string()
    } else {
        changed.join(" ")
    };
    let mut out = format!("  thresholds ({}): {values}\n", t.source);
    if let Some(m) = &t.message {
        out.push_str(&format!("  warning: {m}\n"));
    }
    out
}

/// Tunable thresholds of the analysis. The defaults were chosen so a periodic
/// training pattern stays `low` and a leak of ≥ 100 MB/s on an 80 GB GPU is
/// `high` more than a minute before the OOM (see docs/analysis.md).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct Thresholds {
    /// Width of one envelope bucket, seconds. Should exceed the training step time.
    pub bucket_seconds: f64,
    /// How far back the trend is fitted, seconds.
    pub fit_window_seconds: f64,
    /// Observation span after which a trend is fully trusted, seconds.
    pub trust_span_seconds: f64,
    /// Time to OOM at or below which the risk is critical, seconds.
    pub critical_tto_seconds: f64,
    /// Time to OOM at or below which the risk is high, seconds.
    pub high_tto_seconds: f64,
    /// Time to OOM at or below which the risk is medium, seconds.
    pub medium_tto_seconds: f64,
    /// Fraction of total memory at or above which the risk is critical.
    pub critical_fraction: f64,
    /// Fraction of total memory at or above which the risk is high.
    pub high_fraction: f64,
    /// Fraction of total memory at or above which the risk is medium.
    pub medium_fraction: f64,
    /// Trend confidence needed before a predicted OOM may raise the risk above medium.
    pub min_confidence: f64,
    /// Lower-envelope growth, bytes per second, above which a leak is suspected.
    pub leak_bytes_per_second: f64,
    /// A rise of at least this fraction of total memory from one bucket to the next is a spike.
    pub spike_fraction: f64,
    /// A GPU's published risk level (and leak flag) falls only after the
    /// lower readings held this long, seconds (and 3 readings); it rises at once.
    pub level_hold_seconds: f64,
    /// Host-memory growth (the trainer's RSS, its container's working set),
    /// bytes per second, above which a host-memory leak is suspected.
    pub host_leak_bytes_per_second: f64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            bucket_seconds: 10.0,
            fit_window_seconds: 300.0,
            trust_span_seconds: 60.0,
            critical_tto_seconds: 120.0,
            high_tto_seconds: 600.0,
            medium_tto_seconds: 1800.0,
            critical_fraction: 0.98,
            high_fraction: 0.95,
            medium_fraction: 0.90,
            min_confidence: 0.6,
            // 10 MB/min, the default of the seed toolkit's `leak` command.
            leak_bytes_per_second: 10.0e6 / 60.0,
            spike_fraction: 0.10,
            level_hold_seconds: 30.0,
            // 10 MB/min, seed 000's `leak --threshold` default, as for the GPU.
            host_leak_bytes_per_second: 10.0e6 / 60.0,
        }
    }
}

/// Errors of threshold validation.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum Error {
    /// A threshold is out of its range.
    #[error("invalid analysis threshold {name}={value}: {why}")]
    InvalidThreshold {
        /// Field name.
        name: &'static str,
        /// Offending value.
        value: f64,
        /// What would be valid.
        why: &'static str,
    },
}

impl Thresholds {
    /// Checks that the thresholds make sense together; the first that does
    /// not is named.
    pub fn validate(&self) -> Result<(), Error> {
        let positive = [
            ("bucketSeconds", self.bucket_seconds),
            ("fitWindowSeconds", self.fit_window_seconds),
            ("trustSpanSeconds", self.trust_span_seconds),
            ("hostLeakBytesPerSecond", self.host_leak_bytes_per_second),
        ];
        for (name, value) in positive {
            let ok = value.is_finite() && value > 0.0;
            check(ok, name, value, "must be a positive number")?;
        }
        // Both finite and positive by now.
        check(
            self.fit_window_seconds >= 3.0 * self.bucket_seconds,
            "fitWindowSeconds",
            self.fit_window_seconds,
            "must span at least 3 buckets",
        )?;
        check(
            self.critical_tto_seconds <= self.high_tto_seconds
                && self.high_tto_seconds <= self.medium_tto_seconds,
            "highTtoSeconds",
            self.high_tto_seconds,
            "time-to-OOM horizons must satisfy critical <= high <= medium",
        )?;
        let fractions_ordered = 0.0 < self.medium_fraction
            && self.medium_fraction <= self.high_fraction
            && self.high_fraction <= self.critical_fraction
            && self.critical_fraction <= 1.0;
        check(
            fractions_ordered,
            "highFraction",
            self.high_fraction,
            "usage fractions must satisfy 0 < medium <= high <= critical <= 1",
        )?;
        let hold = self.level_hold_seconds;
        check(
            hold.is_finite() && (0.0..=3600.0).contains(&hold),
            "levelHoldSeconds",
            hold,
            "must be in [0, 3600]",
        )?;
        check(
            (0.0..=1.0).contains(&self.min_confidence),
            "minConfidence",
            self.min_confidence,
            "must be in [0, 1]",
        )
    }
}

/// `Ok` when `ok`, else the threshold `name` named with its value and why.
fn check(ok: bool, name: &'static str, value: f64, why: &'static str) -> Result<(), Error> {
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidThreshold { name, value, why })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_lines_name_the_source_the_changed_values_and_a_refusal() {
        let cluster = parse_cluster(r#"{"highTtoSeconds": 900}"#).unwrap();
        let ok = render(&resolve(&cluster, Some(r#"{"criticalTtoSeconds": 300}"#)).status());
        assert_eq!(
            ok,
            "  thresholds (annotation): criticalTtoSeconds=300 highTtoSeconds=900\n"
        );
        let bad = render(&resolve(&cluster, Some("{")).status());
        assert!(bad.starts_with("  thresholds (chart): highTtoSeconds=900\n  warning: memprof.dev/thresholds ignored"), "{bad}");
        let none = render(&resolve(&Map::new(), None).status());
        assert_eq!(none, "  thresholds (default): built-in values\n");
    }

    #[test]
    fn the_annotation_overrides_the_cluster_which_overrides_the_defaults() {
        let none = resolve(&Map::new(), None);
        assert_eq!(none.source, Source::Default);
        assert_eq!(none.env(), None);
        assert_eq!(none.thresholds(), Thresholds::default());

        let cluster =
            parse_cluster(r#"{"highTtoSeconds": 900, "mediumTtoSeconds": 3600}"#).unwrap();
        let chart = resolve(&cluster, None);
        assert_eq!(chart.source, Source::Chart);
        assert_eq!(chart.thresholds().high_tto_seconds, 900.0);

        let job = resolve(&cluster, Some(r#"{"criticalTtoSeconds": 300}"#));
        assert_eq!(job.source, Source::Annotation);
        let t = job.thresholds();
        assert_eq!((t.critical_tto_seconds, t.high_tto_seconds), (300.0, 900.0));
        let st = job.status();
        assert_eq!(st.source, "annotation");
        assert_eq!(st.values["criticalTtoSeconds"], 300.0);
        assert_eq!(st.message, None);
        let env: Thresholds = serde_json::from_str(&job.env().unwrap()).unwrap();
        assert_eq!(env, t, "the sidecar parses what the injection sets");
    }

    #[test]
    fn an_invalid_annotation_is_refused_with_the_field_and_what_to_do() {
        let cluster = parse_cluster(r#"{"highTtoSeconds": 900}"#).unwrap();
        for (text, says) in [
            (r#"{"highTtoSeconds": 10}"#, "critical <= high <= medium"),
            (
                r#"{"highTTOSeconds": 10}"#,
                "unknown field \"highTTOSeconds\"",
            ),
            (
                r#"{"minConfidence": "high"}"#,
                "\"minConfidence\" must be a number",
            ),
            ("900", "not a JSON object"),
        ] {
            let r = resolve(&cluster, Some(text));
            assert_eq!(r.source, Source::Chart, "{text}");
            assert_eq!(r.thresholds().high_tto_seconds, 900.0);
            let st = r.status();
            let msg = st.message.clone().unwrap();
            assert!(msg.contains(says) && msg.contains("cluster-wide"), "{msg}");
        }
        assert!(parse_cluster(r#"{"bucketSeconds": -1}"#).is_err());
        assert_eq!(parse_cluster("").unwrap(), Map::new());
    }

    #[test]
    fn a_value_over_the_bound_and_its_cached_marker_are_refused_alike() {
        let fits = format!(
            r#"{{"highTtoSeconds": 900{}}}"#,
            " ".repeat(MAX_ANNOTATION - 30)
        );
        assert!(fits.len() <= MAX_ANNOTATION && fits.len() > 512);
        assert_eq!(bounded(&fits), fits, "kept as written up to the bound");
        assert_eq!(resolve(&Map::new(), Some(&fits)).source, Source::Annotation);
        let long = format!(r#"{{"highTtoSeconds": 900{}}}"#, " ".repeat(MAX_ANNOTATION));
        assert_eq!(bounded(&long), TOO_LONG);
        let as_written = resolve(&Map::new(), Some(&long));
        let as_cached = resolve(&Map::new(), Some(bounded(&long)));
        assert_eq!(as_written, as_cached);
        assert!(as_cached.error.unwrap().contains("longer than 4096 bytes"));
    }

    #[test]
    fn a_long_annotation_is_not_repeated_in_the_error_which_keeps_its_advice() {
        // Under MAX_ANNOTATION, so parsed: a long unknown key, and a long
        // JSON string (the parser's message quotes the value).
        let key = format!(r#"{{"{}": 1}}"#, "k".repeat(4000));
        let string = format!(r#""{}""#, "s".repeat(4000));
        for (text, advice) in [(key, "known fields: "), (string, "write e.g.")] {
            let e = resolve(&Map::new(), Some(&text)).error.unwrap();
            assert!(e.len() < 600, "{} bytes: {e}", e.len());
            assert!(e.contains(advice), "{e}");
            let st = resolve(&Map::new(), Some(&text)).status();
            assert!(st.message.unwrap().ends_with("until it is fixed"));
        }
    }
}
