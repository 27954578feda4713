//! Contract B (docs/agent-wire.md, "The answer"): what the sidecar answers a push
//! with, and the acknowledgements the agent sends back in a later push.
//!
//! The answer is the sidecar's current verdict for the pod, the directives
//! the operator's policy has for the trainer, and whether to record
//! allocation history. The agent treats a missing or malformed answer as
//! "no verdict" (an old sidecar answers 204 without a body), so every field
//! here is one it may ignore.

use crate::{DataSource, RiskLevel};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// At most this many directives in one answer (the agent reads no more).
pub const MAX_DIRECTIVES: usize = 16;
/// Longest directive id, bytes (the agent skips longer ones).
pub const MAX_DIRECTIVE_ID: usize = 64;
/// Longest directive reason, bytes (the agent cuts longer ones).
pub const MAX_DIRECTIVE_REASON: usize = 256;
/// At most this many acknowledgements in one push.
pub const MAX_ACKS: usize = 16;
/// Longest acknowledgement action text, bytes.
pub const MAX_ACK_ACTION: usize = 128;

/// The answer to an accepted push (HTTP 200).
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PushReply {
    /// Always true: a refused push gets a 4xx status, not this body.
    pub accepted: bool,
    /// The sidecar's verdict as of its last analysis; null before the first
    /// one (about a second after start).
    pub verdict: Option<Verdict>,
    /// Orders for the trainer, from the operator's policy (empty until a
    /// policy asks for one).
    #[serde(default)]
    pub directives: Vec<Directive>,
    /// True once the pod's risk has reached `high`: turn allocation-history
    /// recording on, so that the OOM snapshot names the allocating code.
    #[serde(default)]
    pub history: bool,
}

/// The sidecar's risk verdict for the pod.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Verdict {
    /// The worst risk among the pod's GPUs.
    pub risk: RiskLevel,
    /// The smallest predicted time to OOM among the pod's GPUs, seconds;
    /// null when no GPU's memory is growing towards its limit.
    pub tto_seconds: Option<f64>,
    /// A GPU's memory is being retained (its lower envelope keeps growing).
    pub leak: bool,
    /// Where the worst GPU's assessment came from.
    pub source: DataSource,
    /// When the analysis ran, seconds since the Unix epoch.
    pub at: f64,
}

/// What a directive asks the trainer to do.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum DirectiveKind {
    /// Run the trainer's `on_risk` callbacks at `level`.
    #[default]
    NotifyTrainer,
}

/// One order for the trainer, relayed by the sidecar (and written by the
/// operator into the MemoryReport's `status.directives`).
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Directive {
    /// Opaque id (at most 64 bytes), acknowledged in a later push.
    #[schemars(length(min = 1, max = 64))]
    pub id: String,
    /// What to do.
    pub kind: DirectiveKind,
    /// The level to act at: `high` or `critical`.
    pub level: RiskLevel,
    /// Why, for the trainer's log (at most 256 bytes).
    #[serde(default)]
    #[schemars(length(max = 256))]
    pub reason: String,
}

impl Directive {
    /// The directive with its id and reason cut to their bounds (at a
    /// character boundary); `None` when the id is empty.
    pub fn bounded(mut self) -> Option<Self> {
        crate::truncate_utf8(&mut self.id, MAX_DIRECTIVE_ID);
        crate::truncate_utf8(&mut self.reason, MAX_DIRECTIVE_REASON);
        (!self.id.is_empty()).then_some(self)
    }
}

// Not the report's AgentAck, which adds when the sidecar got it and from which
// process (time, pid, rank).
/// The trainer's acknowledgement of a directive, in a push's `acks`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Ack {
    /// The directive's id.
    #[schemars(length(min = 1, max = MAX_DIRECTIVE_ID))]
    pub id: String,
    /// What the trainer did (its callbacks' own words).
    #[serde(default)]
    #[schemars(length(max = MAX_ACK_ACTION))]
    pub action: String,
    /// Whether it did what was asked.
    #[serde(default)]
    pub ok: bool,
}

/// Checks a push's `acks` against their bounds.
pub(super) fn validate_acks(acks: &[Ack]) -> Result<(), super::Error> {
    super::bound_len("acks", acks.len(), MAX_ACKS)?;
    for (i, a) in acks.iter().enumerate() {
        if a.id.is_empty() {
            return Err(super::Error::Empty {
                what: format!("acks[{i}].id"),
            });
        }
        super::bound_str(|| format!("acks[{i}].id"), &a.id, MAX_DIRECTIVE_ID)?;
        super::bound_str(|| format!("acks[{i}].action"), &a.action, MAX_ACK_ACTION)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_is_contract_b_with_a_null_tto_and_a_null_verdict_before_any() {
        let reply = PushReply {
            accepted: true,
            verdict: Some(Verdict {
                risk: RiskLevel::High,
                tto_seconds: None,
                leak: true,
                source: DataSource::Agent,
                at: 1_795_000_000.0,
            }),
            directives: vec![],
            history: true,
        };
        let v = serde_json::to_value(&reply).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"accepted": true,
                "verdict": {"risk": "high", "ttoSeconds": null, "leak": true,
                            "source": "agent", "at": 1_795_000_000.0},
                "directives": [], "history": true})
        );
        let none = serde_json::to_value(PushReply {
            accepted: true,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(none["verdict"], serde_json::Value::Null);
    }

    #[test]
    fn a_directive_is_spelled_as_the_agent_reads_it_and_bounded() {
        let d = Directive {
            id: "é".repeat(40),
            kind: DirectiveKind::NotifyTrainer,
            level: RiskLevel::Critical,
            reason: "r".repeat(300),
        }
        .bounded()
        .unwrap();
        assert!(d.id.len() <= MAX_DIRECTIVE_ID && d.id.chars().all(|c| c == 'é'));
        assert_eq!(d.reason.len(), MAX_DIRECTIVE_REASON);
        let v = serde_json::to_value(&d).unwrap();
        assert_eq!(v["kind"], "notifyTrainer");
        assert_eq!(v["level"], "critical");
        assert!(
            Directive::default().bounded().is_none(),
            "no id, no directive"
        );
    }

    #[test]
    fn acks_are_bounded() {
        let ack = |id: &str, action: &str| Ack {
            id: id.into(),
            action: action.into(),
            ok: true,
        };
        assert!(validate_acks(&[ack("a", "split 16x1 -> 8x2")]).is_ok());
        assert!(validate_acks(&vec![ack("a", ""); MAX_ACKS + 1]).is_err());
        assert!(validate_acks(&[ack("", "x")]).is_err());
        assert!(validate_acks(&[ack(&"i".repeat(65), "")]).is_err());
        let err = validate_acks(&[ack("a", &"x".repeat(129))]).unwrap_err();
        assert!(err.to_string().contains("acks[0].action"), "{err}");
    }
}
