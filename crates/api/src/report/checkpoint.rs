//! The trainer's newest checkpoint, as the pod's sidecar saw it announced
//! (`memprof_agent.record("checkpoint", note="step=N")`): what a restart by
//! a remediation would keep (docs/remediation.md, "Waiting for a checkpoint").
//!
//! Everything here is the trainer's word, so it is bounded and its time is
//! never trusted to be later than the sidecar saw the push that carried it.

use jiff::{SignedDuration, Timestamp};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The agent event name that announces a checkpoint.
pub const CHECKPOINT_EVENT: &str = "checkpoint";
/// Longest note kept, bytes.
pub const MAX_CHECKPOINT_NOTE: usize = 128;

/// A checkpoint a trainer announced.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Checkpoint {
    /// When the checkpoint was written (RFC 3339): the agent's event time,
    /// clamped to when the push carrying it was sent and received.
    #[schemars(length(max = 64))]
    pub time: String,
    /// The event's note, e.g. `step=1200`, cut to 128 bytes.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 128))]
    pub note: String,
    /// The training step, from `step=N` in the note (else the event's step).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
}

impl Checkpoint {
    /// The checkpoint an agent event announces, or `None` for any other
    /// event. `t`: the event's time (seconds since the Unix epoch, the
    /// trainer's claim); `pushed`: the push's own time (also a claim);
    /// `received`: when the sidecar took the push. The time kept is the
    /// earliest of the three: a checkpoint is never newer than the push that
    /// announced it, nor than its arrival, whatever the trainer's clock says.
    pub fn from_event(
        name: &str,
        note: Option<&str>,
        step: Option<u64>,
        (t, pushed): (f64, f64),
        received: Timestamp,
    ) -> Option<Checkpoint> {
        if name != CHECKPOINT_EVENT {
            return None;
        }
        let mut at = received;
        for claim in [t, pushed] {
            if let Some(c) = seconds_to_time(claim) {
                at = at.min(c);
            }
        }
        let mut note = note.unwrap_or_default().to_string();
        crate::truncate_utf8(&mut note, MAX_CHECKPOINT_NOTE);
        Some(Checkpoint {
            time: at.to_string(),
            step: step_in(&note).or(step),
            note,
        })
    }

    /// [`Checkpoint::time`] parsed; `None` when it is not RFC 3339.
    pub fn at(&self) -> Option<Timestamp> {
        self.time.parse().ok()
    }
}

/// What a restart that waited for a checkpoint kept or lost (a remediation
/// record's `checkpoint`). Bounded: two short strings and a checkpoint.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointOutcome {
    /// `checkpointed` (every rank checkpointed after the decision),
    /// `trainerExited` (a rank's trainer exited during the wait),
    /// `boundReached` (the wait ended without one) or `notWaited` (an OOM
    /// was already observed, no time was left before the predicted OOM, or
    /// no rank ever announced a checkpoint).
    #[schemars(length(max = 32))]
    pub result: String,
    /// Seconds from the decision to the Job's deletion.
    #[schemars(range(min = 0.0))]
    pub waited_seconds: f64,
    /// The wait's bound, seconds from the decision.
    #[schemars(range(min = 0.0))]
    pub bound_seconds: f64,
    /// What set the bound, e.g. `maxSeconds 600` or `time to OOM 150 s - margin 30 s`.
    #[schemars(length(max = 128))]
    pub bound: String,
    /// The Job's checkpoint the restart keeps: the oldest of its ranks'
    /// newest (absent when a rank had none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept: Option<Checkpoint>,
    /// Seconds of training lost: from the kept checkpoint to the Job's
    /// deletion (absent when no checkpoint is kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub lost_seconds: Option<f64>,
    /// Counted ranks whose report had a checkpoint at the deletion.
    pub ranks_with_checkpoint: u32,
    /// Counted ranks at the deletion.
    pub ranks: u32,
}

/// A time in seconds since the epoch, if it is one (finite, representable).
fn seconds_to_time(t: f64) -> Option<Timestamp> {
    if !t.is_finite() || t < 0.0 {
        return None;
    }
    SignedDuration::try_from_secs_f64(t)
        .ok()
        .and_then(|d| Timestamp::from_duration(d).ok())
}

/// `N` of the first `step=N` (or `step:N`) in `note`.
pub fn step_in(note: &str) -> Option<u64> {
    note.match_indices("step").find_map(|(at, _)| {
        let rest = note[at + 4..].trim_start();
        let rest = rest.strip_prefix(['=', ':'])?.trim_start();
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn received() -> Timestamp {
        "2026-11-24T12:00:00Z".parse().unwrap()
    }

    #[test]
    fn only_checkpoint_events_count_and_the_step_comes_from_the_note() {
        let r = received();
        let t = r.as_second() as f64 - 30.0;
        assert_eq!(Checkpoint::from_event("eval", None, None, (t, t), r), None);
        let c = Checkpoint::from_event("checkpoint", Some("step=1200"), Some(7), (t, t), r);
        let c = c.unwrap();
        assert_eq!((c.step, c.note.as_str()), (Some(1200), "step=1200"));
        assert_eq!(c.time, "2026-11-24T11:59:30Z");
        let c = Checkpoint::from_event("checkpoint", Some("epoch 3"), Some(7), (t, t), r);
        assert_eq!(
            c.unwrap().step,
            Some(7),
            "no step= in the note: the event's step"
        );
    }

    #[test]
    fn a_time_in_the_future_or_garbage_is_clamped_to_the_push_and_its_arrival() {
        let r = received();
        let now = r.as_second() as f64;
        // The event claims a time after the push that carried it.
        let c = Checkpoint::from_event("checkpoint", None, None, (now - 5.0, now - 10.0), r);
        assert_eq!(c.unwrap().time, "2026-11-24T11:59:50Z");
        // Both claim the future: the arrival wins.
        let c = Checkpoint::from_event("checkpoint", None, None, (now + 3600.0, now + 60.0), r);
        assert_eq!(c.unwrap().time, "2026-11-24T12:00:00Z");
        for garbage in [f64::NAN, f64::INFINITY, -1.0, 1e300] {
            let c = Checkpoint::from_event("checkpoint", None, None, (garbage, garbage), r);
            assert_eq!(c.unwrap().time, "2026-11-24T12:00:00Z", "{garbage}");
        }
    }

    #[test]
    fn the_note_is_bounded_on_a_char_boundary() {
        let note = format!("step=5 {}", "é".repeat(200));
        let c = Checkpoint::from_event("checkpoint", Some(&note), None, (1.0, 1.0), received());
        let c = c.unwrap();
        assert!(c.note.len() <= MAX_CHECKPOINT_NOTE);
        assert_eq!(c.step, Some(5));
    }

    #[test]
    fn steps_are_read_only_where_written_as_such() {
        assert_eq!(step_in("step=42"), Some(42));
        assert_eq!(step_in("saved at step: 7 of 10"), Some(7));
        assert_eq!(step_in("steps done"), None);
        assert_eq!(step_in("steps done, step=3"), Some(3));
        assert_eq!(step_in("step=x"), None);
        assert_eq!(step_in("step=99999999999999999999999"), None);
    }
}
