//! The operator's side of the thresholds: the Warning Event on a Job whose
//! `memprof.dev/thresholds` annotation was refused. Parsing, merging and
//! rendering are shared with the webhook, the sidecar and the CLI, in
//! `memprof_api::thresholds`.

use memprof_api::ThresholdsInEffect;

/// Reason of the Warning Event for an invalid annotation.
pub const REASON_INVALID: &str = "InvalidThresholds";

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
    use memprof_api::thresholds::{parse_cluster, resolve};

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
