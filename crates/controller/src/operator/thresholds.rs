//! The operator's side of the thresholds: which are in effect for a
//! profiled object (a Job, a JobSet, a TrainJob, a PyTorchJob), as its
//! profile's status shows them, and the Warning Event on an object whose
//! `memprof.dev/thresholds` annotation was refused. One home for every
//! kind. Parsing, merging and rendering are shared with the webhook, the
//! sidecar and the CLI, in `memprof_api::thresholds`.

use memprof_api::thresholds::{resolve, ANNOTATION_THRESHOLDS};
use memprof_api::ThresholdsInEffect;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// Reason of the Warning Event for an invalid annotation.
pub const REASON_INVALID: &str = "InvalidThresholds";

/// The thresholds in effect for a profiled object whose sidecars were
/// injected from `annotations` (a Job's own; a PyTorchJob's own; a JobSet's
/// or TrainJob's child Job's, which the JobSet controller copies from the
/// replicated job's template and Trainer from the TrainJob's
/// `spec.annotations`), over the cluster-wide `defaults`: what its
/// profile's `status.thresholds` shows. As cached, those annotations carry
/// the value the webhook read (the object's, else its pod template's) and
/// a value over the parser's bound as the marker it refuses as too long
/// (`pipeline/slim.rs`, `thresholds_given`). Read with the webhook's parser and
/// bounds (`memprof_api::thresholds::resolve`), so the status says what the
/// sidecars were given.
pub fn in_effect(
    defaults: &Map<String, Value>,
    annotations: &BTreeMap<String, String>,
) -> ThresholdsInEffect {
    let annotated = annotations.get(ANNOTATION_THRESHOLDS).map(String::as_str);
    resolve(defaults, annotated).status()
}

/// The Warning Event for a refused annotation, when its message is new
/// (not already recorded in the previous status).
pub fn invalid_event(
    previous: Option<&ThresholdsInEffect>,
    now: &ThresholdsInEffect,
) -> Option<super::reconcile::EventPlan> {
    let message = now.message.as_ref()?;
    if previous.and_then(|p| p.message.as_ref()) == Some(message) {
        return None;
    }
    Some(super::reconcile::EventPlan {
        reason: REASON_INVALID,
        warning: true,
        note: message.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_api::thresholds::parse_cluster;

    #[test]
    fn a_refused_annotation_is_announced_once_as_a_warning() {
        let cluster = parse_cluster(r#"{"highTtoSeconds": 900}"#).unwrap();
        for text in [
            r#"{"highTtoSeconds": 10}"#,
            r#"{"highTTOSeconds": 10}"#,
            "900",
        ] {
            let st = resolve(&cluster, Some(text)).status();
            let ev = invalid_event(None, &st).unwrap();
            assert_eq!((ev.reason, ev.warning), ("InvalidThresholds", true));
            assert_eq!(invalid_event(Some(&st), &st), None, "announced once");
        }
        let fine = resolve(&cluster, Some(r#"{"criticalTtoSeconds": 300}"#)).status();
        assert_eq!(
            invalid_event(None, &fine),
            None,
            "a valid annotation is no Event"
        );
    }
}
