//! Pure trigger evaluation: does a policy fire for a profile, now, and if not,
//! why not? No client, no clock: time comes in as an argument, and the one
//! piece of memory a trigger needs (since when the risk has been at a level)
//! is a [`RiskClock`] the caller keeps.
//!
//! Why a policy's history is read from the profile's `status.remediations`
//! rather than kept in memory: cooldown and `maxRemediations` must hold
//! across operator restarts and across the Job's recreation, and the profile
//! is the one object that survives both.
//!
//! The history itself (record phases, totals, record ids) is in
//! `triggers/history.rs`; a policy's verdict on a Job, which combines the
//! triggers, the history and the selector, in `triggers/verdict.rs`.

use jiff::Timestamp;
use memprof_api::{MemoryProfileStatus, RiskLevel, Trigger};

mod history;
pub use history::{
    add_to_totals, counts, history, push_record, record_id, succession, History, Succession,
    ENV_CHANGE_RECREATE, MAX_POLICY_TOTALS, PHASE_DONE, PHASE_DRY_RUN, PHASE_FAILED, PHASE_PENDING,
    PHASE_SKIPPED,
};

mod verdict;
pub use verdict::{selector_display, selector_matches, verdict, Blocked, SelectorError, Verdict};

/// Since when the job's risk has been at or above each level, as observed by
/// this process. Lost on restart, deliberately: a restarted controller waits
/// `forSeconds` again, which can delay a remediation but never hasten one.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RiskClock {
    since: [Option<Timestamp>; 5],
}

impl RiskClock {
    /// Notes the risk seen at `now`.
    pub fn observe(&mut self, risk: RiskLevel, now: Timestamp) {
        for (i, since) in self.since.iter_mut().enumerate() {
            if risk as usize >= i {
                since.get_or_insert(now);
            } else {
                *since = None;
            }
        }
    }

    /// Since when the risk has been at or above `level`, if it is now.
    pub fn since(&self, level: RiskLevel) -> Option<Timestamp> {
        self.since[level as usize]
    }
}

/// What one trigger says now.
#[derive(Clone, Debug, PartialEq)]
pub struct Evaluation {
    /// Short name, as in ids and the `TRIGGERS` column: `risk>=critical`, `oom`, …
    pub name: String,
    /// Whether it fires.
    pub fired: bool,
    /// Why (or why not), for humans.
    pub why: String,
    /// When it does not fire yet but will if nothing changes: seconds to wait.
    pub recheck_after: Option<f64>,
}

/// Short name of a trigger.
pub fn trigger_name(t: &Trigger) -> String {
    if let Some(r) = &t.risk_at_least {
        return if r.for_seconds > 0 {
            format!("risk>={}/{}s", r.level, r.for_seconds)
        } else {
            format!("risk>={}", r.level)
        };
    }
    if let Some(s) = t.time_to_oom_below_seconds {
        return format!("tto<{s}s");
    }
    if t.oom_observed.is_some() {
        return "oom".into();
    }
    if let Some(i) = t.imbalance_above {
        return format!("imbalance>{i}");
    }
    "none".into()
}

/// A trigger that fired on reports no newer than the last remediation:
/// it waits for the new Job's reports (part of the trigger's explanation).
#[derive(Debug, thiserror::Error)]
#[error("no report newer than the last remediation ({since})")]
struct Stale {
    since: Timestamp,
}

/// Whether the profile holds a report newer than `since`: triggers computed
/// from reports must not fire again on the numbers that caused the last
/// remediation (the old pods' reports outlive the old Job for a while).
fn fresh(status: &MemoryProfileStatus, since: Option<Timestamp>) -> Result<(), Stale> {
    let Some(since) = since else { return Ok(()) };
    let newest = status
        .last_report_time
        .as_deref()
        .and_then(|t| t.parse::<Timestamp>().ok());
    match newest {
        Some(t) if t > since => Ok(()),
        _ => Err(Stale { since }),
    }
}

/// Evaluates one trigger against a profile status.
pub fn evaluate(
    t: &Trigger,
    status: &MemoryProfileStatus,
    clock: &RiskClock,
    last_acted: Option<Timestamp>,
    now: Timestamp,
) -> Evaluation {
    let name = trigger_name(t);
    let (fired, why, recheck_after) = evaluate_inner(t, status, clock, last_acted, now);
    Evaluation {
        name,
        fired,
        why,
        recheck_after,
    }
}

fn evaluate_inner(
    t: &Trigger,
    st: &MemoryProfileStatus,
    clock: &RiskClock,
    last_acted: Option<Timestamp>,
    now: Timestamp,
) -> (bool, String, Option<f64>) {
    if t.oom_observed == Some(true) {
        let newer: Vec<_> = st
            .ooms
            .iter()
            .filter(|o| match (last_acted, o.time.parse::<Timestamp>()) {
                (Some(l), Ok(t)) => t > l,
                (Some(_), Err(_)) => false,
                (None, _) => true,
            })
            .collect();
        return match newer.last() {
            Some(o) => (
                true,
                format!("GPU OOM in pod {} ({})", o.pod, o.evidence),
                None,
            ),
            None if st.ooms.is_empty() => (false, "no GPU OOM observed".into(), None),
            None => (
                false,
                "no GPU OOM since this policy last acted".into(),
                None,
            ),
        };
    }
    // Evidence first: a status with no counted report (a Job that runs
    // nothing, reports all refused) says `none` because nothing was seen, and
    // a trigger at `none` would act on that alone.
    if st.ranks_reporting == 0 {
        return (false, "no counted report: nothing to act on".into(), None);
    }
    let (fired, why, recheck) = evaluate_report_trigger(t, st, clock, now);
    match fresh(st, last_acted) {
        Err(stale) if fired => (false, format!("{why}, but {stale}"), None),
        _ => (fired, why, recheck),
    }
}

fn evaluate_report_trigger(
    t: &Trigger,
    st: &MemoryProfileStatus,
    clock: &RiskClock,
    now: Timestamp,
) -> (bool, String, Option<f64>) {
    if let Some(r) = &t.risk_at_least {
        if st.risk < r.level {
            return (
                false,
                format!("risk {} is below {}", st.risk, r.level),
                None,
            );
        }
        let held = clock
            .since(r.level)
            .map_or(0.0, |s| now.duration_since(s).as_secs_f64().max(0.0));
        let need = f64::from(r.for_seconds);
        return if held >= need {
            (
                true,
                format!("risk {} >= {} for {held:.0}s", st.risk, r.level),
                None,
            )
        } else {
            (
                false,
                format!(
                    "risk {} >= {} for {held:.0}s of the {need:.0}s required",
                    st.risk, r.level
                ),
                Some(need - held),
            )
        };
    }
    if let Some(limit) = t.time_to_oom_below_seconds {
        return match st.time_to_oom_seconds {
            Some(tto) if tto < limit => (true, format!("time to OOM {tto:.0}s < {limit}s"), None),
            Some(tto) => (false, format!("time to OOM {tto:.0}s >= {limit}s"), None),
            None => (false, "no OOM predicted".into(), None),
        };
    }
    if let Some(limit) = t.imbalance_above {
        return match st.imbalance {
            Some(i) if i > limit => (true, format!("imbalance {i:.2} > {limit}"), None),
            Some(i) => (false, format!("imbalance {i:.2} <= {limit}"), None),
            None => (false, "imbalance unknown".into(), None),
        };
    }
    (false, "empty trigger".into(), None)
}

#[cfg(test)]
mod tests;
