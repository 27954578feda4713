//! Waiting for the trainer's next checkpoint before a restart
//! (`waitForCheckpoint`, docs/remediation.md "Waiting for a checkpoint").
//!
//! The wait is decided once, when the plan is made: its deadline (decision
//! time + bound, the bound `min(maxSeconds, timeToOom - margin)`) is part of
//! the plan, so it is saved in the plan's ConfigMap and covered by the
//! record's digest before any wait starts. A restarted operator reads the
//! same deadline: it neither starts the wait from zero nor waits twice. The
//! wait ends when every counted rank's report shows a checkpoint newer than
//! the decision, or at the deadline; what it came to (`CheckpointOutcome`)
//! is written into the `Pending` record before the Job is deleted, and a
//! record that has it never waits again.
//!
//! The Job's checkpoint is the OLDEST of its counted ranks' newest: a
//! restart keeps only what every rank saved. A counted rank without one
//! means the Job has none. A trainer none of whose ranks ever announced a
//! checkpoint is not waited for (as before this feature).
//!
//! The wait runs in the remediation task: while it lasts the task ends with
//! "look again" (at the deadline at the latest; a report's change wakes the
//! Job sooner), never blocking a reconcile.

use super::executor::Executor;
use super::Result;
use crate::key::JobKey;
use jiff::{SignedDuration, Timestamp};
use kube::runtime::events::EventType;
use memprof_api::{
    Checkpoint, CheckpointOutcome, CheckpointWait, MemoryProfileStatus, RemediationPolicy,
    RemediationRecord,
};
pub use memprof_policy::plan::CheckpointGate;
use memprof_policy::plan::Plan;
use std::time::Duration;
use tracing::info;

/// Longest pause between two looks while waiting (a report's change wakes sooner).
const POLL: Duration = Duration::from_secs(10);
/// Look again soon: the checkpoints are not known yet, or the record moved.
const AGAIN: Duration = Duration::from_millis(200);
/// Event reason when a restart starts waiting for a checkpoint.
pub const REASON_WAITING: &str = "RemediationWaitingForCheckpoint";

/// `CheckpointOutcome::result` values.
pub const CHECKPOINTED: &str = "checkpointed";
/// The wait ended at its bound.
pub const BOUND_REACHED: &str = "boundReached";
/// No wait (an OOM was observed, no time was left, or no rank checkpoints).
pub const NOT_WAITED: &str = "notWaited";
/// The wait ended early: a rank's trainer exited (an OOM, a crash), it
/// checkpoints no more.
pub const TRAINER_EXITED: &str = "trainerExited";

/// The counted ranks' newest checkpoints of one Job, as the pipeline found
/// them in their reports (screened: only reports that count).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JobCheckpoints {
    /// One entry per counted rank: its newest checkpoint, if any.
    pub ranks: Vec<Option<Checkpoint>>,
    /// Counted ranks whose trainer container has terminated.
    pub exited: u32,
}

impl JobCheckpoints {
    /// From the counted ranks' `lastCheckpoint`s.
    pub fn new(ranks: impl IntoIterator<Item = Option<Checkpoint>>) -> Self {
        JobCheckpoints {
            ranks: ranks.into_iter().collect(),
            exited: 0,
        }
    }

    /// Counted ranks with a (readable) checkpoint.
    pub fn with_checkpoint(&self) -> u32 {
        let n = self.ranks.iter().flatten().filter(|c| c.at().is_some());
        u32::try_from(n.count()).unwrap_or(u32::MAX)
    }

    /// Whether any counted rank ever announced a checkpoint.
    pub fn any(&self) -> bool {
        self.with_checkpoint() > 0
    }

    /// The Job's checkpoint: the oldest of the ranks' newest; `None` when
    /// there is no counted rank or one of them has none.
    pub fn job_checkpoint(&self) -> Option<(Timestamp, Checkpoint)> {
        let mut oldest: Option<(Timestamp, Checkpoint)> = None;
        for rank in &self.ranks {
            let c = rank.as_ref()?;
            let t = c.at()?;
            if oldest.as_ref().is_none_or(|(o, _)| t < *o) {
                oldest = Some((t, c.clone()));
            }
        }
        oldest
    }
}

/// Pure: the wait for a restart decided at `decided`, under `wait`, with
/// the roll-up's predicted time to OOM `tto` (seconds) at the decision.
pub fn gate_for(
    wait: &CheckpointWait,
    tto: Option<f64>,
    oom_observed: bool,
    decided: Timestamp,
) -> CheckpointGate {
    let max = f64::from(wait.max_seconds);
    let margin = f64::from(wait.margin_seconds);
    let tto = tto.filter(|t| t.is_finite() && *t >= 0.0);
    let (bound_seconds, bound) = match tto {
        Some(t) if t - margin < max => (
            (t - margin).max(0.0),
            format!("time to OOM {} - margin {}", secs(t), secs(margin)),
        ),
        _ => (max, format!("maxSeconds {}", wait.max_seconds)),
    };
    let no_wait = if oom_observed {
        Some("a GPU OOM of this workload was already observed".to_string())
    } else if bound_seconds <= 0.0 {
        Some(format!("no time left ({bound})"))
    } else {
        None
    };
    // Rounded as the record states it, and the deadline from the rounded
    // value: the recorded wait is never shorter than the recorded bound.
    let bound_seconds = if no_wait.is_some() {
        0.0
    } else {
        round(bound_seconds)
    };
    let deadline = decided
        .checked_add(SignedDuration::from_secs_f64(bound_seconds))
        .unwrap_or(decided);
    CheckpointGate {
        decided: decided.to_string(),
        deadline: deadline.to_string(),
        bound_seconds,
        bound,
        no_wait,
    }
}

/// Adds the wait `policy` asks for to a plan that restarts the Job, as
/// decided at `decided` on `status` (`oom_fired`: the decision answers an OOM).
pub fn attach(
    plan: &mut Plan,
    policy: &RemediationPolicy,
    status: Option<&MemoryProfileStatus>,
    decided: Timestamp,
    oom_fired: bool,
) {
    let Some(wait) = &policy.spec.wait_for_checkpoint else {
        return;
    };
    // Both ways restart the pods: a recreation, and a suspension (the
    // workload's controller removes them) to change the environment.
    if super::workload::env_change_of(plan).is_none() {
        return;
    }
    let tto = status.and_then(|s| s.time_to_oom_seconds);
    let observed = status.is_some_and(|s| {
        s.ooms
            .iter()
            .any(|o| o.job_uid.as_deref() == Some(plan.job_uid.as_str()))
    });
    plan.checkpoint = Some(gate_for(wait, tto, oom_fired || observed, decided));
}

/// [`attach`] for a plan made again for a recorded decision (a restart
/// before the first plan was saved): the wait runs from the recorded
/// decision, not from now.
pub fn attach_recorded(
    plan: &mut Plan,
    policy: &RemediationPolicy,
    status: Option<&MemoryProfileStatus>,
    record: &RemediationRecord,
) {
    let decided = record.time.parse().unwrap_or_else(|_| Timestamp::now());
    // The record's message starts with the trigger's name (`recording.rs`).
    let oom_fired = record
        .message
        .as_deref()
        .is_some_and(|m| m.starts_with("oom: "));
    attach(plan, policy, status, decided, oom_fired);
}

/// What the wait says now.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Look again within this long.
    Wait(Duration),
    /// Go on with the restart; this is what it keeps or loses.
    Go(CheckpointOutcome),
}

/// Pure: the wait `gate` at `now`, with the ranks' checkpoints `ranks`.
pub fn evaluate(gate: &CheckpointGate, ranks: &JobCheckpoints, now: Timestamp) -> Verdict {
    let parsed = gate
        .decided
        .parse::<Timestamp>()
        .ok()
        .zip(gate.deadline.parse::<Timestamp>().ok());
    let Some((decided, deadline)) = parsed else {
        // Written by this controller and covered by the record's digest:
        // unreadable only through a bug. Go on rather than wait forever.
        return Verdict::Go(outcome(gate, ranks, now, None, NOT_WAITED));
    };
    let kept = ranks.job_checkpoint();
    let result = if gate.no_wait.is_some() || !ranks.any() {
        NOT_WAITED
    } else if kept.as_ref().is_some_and(|(t, _)| *t > decided) {
        CHECKPOINTED
    } else if ranks.exited > 0 {
        TRAINER_EXITED
    } else if now >= deadline {
        BOUND_REACHED
    } else {
        let left = Duration::try_from(now.duration_until(deadline)).unwrap_or_default();
        return Verdict::Wait(left.min(POLL).max(Duration::from_millis(100)));
    };
    Verdict::Go(outcome(gate, ranks, now, Some(decided), result))
}

fn outcome(
    gate: &CheckpointGate,
    ranks: &JobCheckpoints,
    now: Timestamp,
    decided: Option<Timestamp>,
    result: &str,
) -> CheckpointOutcome {
    let kept = ranks.job_checkpoint();
    let since = |t: Timestamp| t.duration_until(now).as_secs_f64().max(0.0);
    CheckpointOutcome {
        result: result.into(),
        waited_seconds: decided.map_or(0.0, |d| round(since(d))),
        bound_seconds: gate.bound_seconds,
        bound: gate.bound.clone(),
        lost_seconds: kept.as_ref().map(|(t, _)| round(since(*t))),
        kept: kept.map(|(_, c)| c),
        ranks_with_checkpoint: ranks.with_checkpoint(),
        ranks: u32::try_from(ranks.ranks.len()).unwrap_or(u32::MAX),
    }
}

/// Pure: the outcome in words, for the record's message and the Event.
pub fn describe(o: &CheckpointOutcome, no_wait: Option<&str>) -> String {
    let head = match o.result.as_str() {
        CHECKPOINTED => format!("waited {} for a checkpoint", secs(o.waited_seconds)),
        BOUND_REACHED => format!(
            "no checkpoint within {} (bound: {})",
            secs(o.bound_seconds),
            o.bound
        ),
        TRAINER_EXITED => format!(
            "a rank's trainer exited {} into the wait for a checkpoint",
            secs(o.waited_seconds)
        ),
        _ => format!(
            "did not wait for a checkpoint: {}",
            no_wait.unwrap_or("no rank ever announced a checkpoint")
        ),
    };
    let tail = match (&o.kept, o.lost_seconds) {
        (Some(c), Some(lost)) => {
            let step = c.step.map(|s| format!(" step {s}")).unwrap_or_default();
            format!(
                "checkpoint{step} at {} kept; lost {} since it",
                c.time,
                secs(lost)
            )
        }
        _ if o.ranks_with_checkpoint > 0 => format!(
            "{}/{} ranks had a checkpoint: the restart keeps none",
            o.ranks_with_checkpoint, o.ranks
        ),
        _ => "the restart keeps no checkpoint memprof knows of".into(),
    };
    format!("{head}; {tail}")
}

/// Seconds for people: `42 s`, `14 min`, `3.5 h` (whole seconds up to 10 min).
fn secs(s: f64) -> String {
    if s < 600.0 {
        format!("{} s", s.round())
    } else if s < 7200.0 {
        format!("{} min", (s / 60.0).round())
    } else {
        format!("{:.1} h", s / 3600.0)
    }
}

fn round(s: f64) -> f64 {
    (s * 10.0).round() / 10.0
}

/// What the hook before a plan's steps says.
pub(super) enum Hold {
    /// Look again within this long (still waiting, or the checkpoints are not known).
    Again(Duration),
    /// Go on; the words for the record's message (`""` when the plan does not wait).
    Go(String),
}

/// The hook before a plan's steps. `ranks`: the counted ranks'
/// checkpoints (`None`: not known here, the resume brings them). On going
/// on, the outcome is first written into the `Pending` record, so that a
/// restarted operator goes on too, without waiting again.
pub(super) async fn hold(
    exec: &Executor,
    key: &JobKey,
    plan: &Plan,
    record: &RemediationRecord,
    ranks: Option<&JobCheckpoints>,
) -> Result<Hold> {
    let Some(gate) = &plan.checkpoint else {
        return Ok(Hold::Go(String::new()));
    };
    let words = |o: &CheckpointOutcome| format!("{}; ", describe(o, gate.no_wait.as_deref()));
    if let Some(o) = &record.checkpoint {
        return Ok(Hold::Go(words(o)));
    }
    let Some(ranks) = ranks else {
        return Ok(Hold::Again(AGAIN));
    };
    let outcome = match evaluate(gate, ranks, Timestamp::now()) {
        Verdict::Wait(delay) => {
            announce_wait(exec, key, plan, gate, ranks).await;
            return Ok(Hold::Again(delay));
        }
        Verdict::Go(o) => o,
    };
    info!(id = %plan.id, result = %outcome.result, "checkpoint wait over");
    let (id, o) = (record.id.clone(), outcome);
    let written = exec
        .edit(key, move |st| {
            let r = super::records::pending_mut(st, &id)?;
            Some(r.checkpoint.get_or_insert_with(|| o.clone()).clone())
        })
        .await?;
    Ok(match written {
        Some((_, o)) => Hold::Go(words(&o)),
        None => Hold::Again(AGAIN),
    })
}

/// The Event of a wait that starts, once per remediation and process.
async fn announce_wait(
    exec: &Executor,
    key: &JobKey,
    plan: &Plan,
    gate: &CheckpointGate,
    ranks: &JobCheckpoints,
) {
    let first = exec
        .published
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(format!("{}/checkpoint", plan.id));
    if !first {
        return;
    }
    info!(id = %plan.id, deadline = %gate.deadline, "waiting for a checkpoint before the restart");
    let note = format!(
        "remediation {} waits until {} ({}) for a checkpoint newer than {} on every rank \
         ({}/{} ranks have one now) before restarting Job {key}",
        plan.id,
        gate.deadline,
        gate.bound,
        gate.decided,
        ranks.with_checkpoint(),
        ranks.ranks.len()
    );
    let regarding = exec.regarding(key, Some(plan.job_uid.clone()));
    exec.publish(EventType::Normal, REASON_WAITING, note, &regarding)
        .await;
}

#[cfg(test)]
mod tests;
