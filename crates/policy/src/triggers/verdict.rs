//! A policy's verdict on one Job: its selector, each trigger's evaluation
//! on the Job's own OOMs, and what blocks it (cooldown, `maxRemediations`).
//! Its own file because it is where the pieces meet: the triggers
//! (`triggers.rs`) and the history (`triggers/history.rs`) stay pure parts
//! that know nothing of selectors or limits.

use super::history::{history, History};
use super::{evaluate, Evaluation, RiskClock};
use jiff::Timestamp;
use kube::core::{Selector, SelectorExt};
use memprof_api::{MemoryProfileStatus, OomRecord, RemediationPolicy};
use std::collections::BTreeMap;

/// Why a policy that fired does not act now.
#[derive(Clone, Debug, PartialEq)]
pub enum Blocked {
    /// The last remediation was too recent.
    Cooldown {
        /// Seconds until the cooldown ends.
        remaining: f64,
    },
    /// `maxRemediations` reached.
    MaxReached {
        /// Remediations counted.
        count: u32,
    },
}

/// Everything a policy says about one Job.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    /// Policy name.
    pub policy: String,
    /// Whether the selector matches the Job's labels (`Err`: the selector is invalid).
    pub matches: Result<bool, SelectorError>,
    /// Each trigger's evaluation, in order.
    pub evaluations: Vec<Evaluation>,
    /// The policy's history with this Job.
    pub history: History,
    /// Why it may not act now, if so.
    pub blocked: Option<Blocked>,
}

impl Verdict {
    /// The first trigger that fired, if the policy matches.
    pub fn fired(&self) -> Option<&Evaluation> {
        match self.matches {
            Ok(true) => self.evaluations.iter().find(|e| e.fired),
            _ => None,
        }
    }

    /// Whether the policy should act now.
    pub fn acts(&self) -> bool {
        self.fired().is_some() && self.blocked.is_none()
    }

    /// Seconds after which evaluating again may give another answer.
    pub fn recheck_after(&self) -> Option<f64> {
        if self.matches != Ok(true) {
            return None;
        }
        if let (Some(_), Some(Blocked::Cooldown { remaining })) = (self.fired(), &self.blocked) {
            return Some(*remaining);
        }
        self.evaluations
            .iter()
            .filter_map(|e| e.recheck_after)
            .min_by(f64::total_cmp)
    }
}

/// A policy whose `spec.selector` cannot be read (an operator outside
/// `In`/`NotIn`/`Exists`/`DoesNotExist`, values where none may be). Whoever
/// shows it says where to fix it: the policy's Ready condition adds
/// `fix spec.selector`, `memprof policy explain` names the policy.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("invalid selector: {0}")]
pub struct SelectorError(String);

/// Whether a label selector matches a Job's labels.
pub fn selector_matches(
    policy: &RemediationPolicy,
    labels: &BTreeMap<String, String>,
) -> Result<bool, SelectorError> {
    let selector = Selector::try_from(policy.spec.selector.clone())
        .map_err(|e| SelectorError(e.to_string()))?;
    Ok(selector.matches(labels))
}

/// The selector for humans (`<all>` when empty).
pub fn selector_display(policy: &RemediationPolicy) -> String {
    match Selector::try_from(policy.spec.selector.clone()) {
        Ok(s) if s.selects_all() => "<all>".into(),
        Ok(s) => s.to_string(),
        Err(e) => format!("<invalid: {e}>"),
    }
}

/// Evaluates a policy against one Job (its labels and uid) and its profile's
/// status. Only OOMs recorded with this Job's uid are its own: one of an
/// earlier Job of the same name (before a recreation), or one without a uid
/// (a record no screened pod vouches for), never fires its policies; without
/// a Job uid, no OOM does.
pub fn verdict(
    policy: &RemediationPolicy,
    job_labels: &BTreeMap<String, String>,
    job_uid: Option<&str>,
    status: &MemoryProfileStatus,
    clock: &RiskClock,
    now: Timestamp,
) -> Verdict {
    let own_ooms;
    let status = if status.ooms.iter().all(|o| oom_of(o, job_uid)) {
        status
    } else {
        own_ooms = MemoryProfileStatus {
            ooms: status
                .ooms
                .iter()
                .filter(|o| oom_of(o, job_uid))
                .cloned()
                .collect(),
            ..status.clone()
        };
        &own_ooms
    };
    let name = policy.metadata.name.clone().unwrap_or_default();
    let history = history(status, &name);
    let evaluations = policy
        .spec
        .triggers
        .iter()
        .map(|t| evaluate(t, status, clock, history.last, now))
        .collect();
    let blocked = if history.count >= policy.spec.max_remediations {
        Some(Blocked::MaxReached {
            count: history.count,
        })
    } else {
        history.last.and_then(|last| {
            let elapsed = now.duration_since(last).as_secs_f64();
            let remaining = f64::from(policy.spec.cooldown_seconds) - elapsed;
            (remaining > 0.0).then_some(Blocked::Cooldown { remaining })
        })
    };
    Verdict {
        policy: name,
        matches: selector_matches(policy, job_labels),
        evaluations,
        history,
        blocked,
    }
}

/// Whether an OOM record belongs to the Job with `uid`: it says so.
fn oom_of(o: &OomRecord, uid: Option<&str>) -> bool {
    uid.is_some() && o.job_uid.as_deref() == uid
}
