//! A policy's history with one Job, read from the profile's records: the
//! record phases, which finished records count, the running totals that
//! outlive the kept records, deterministic record ids and the bounded record
//! list. Its own file because this is bookkeeping of what was done, apart
//! from evaluating what a trigger says now (`triggers.rs`).

use jiff::Timestamp;
use memprof_api::{MemoryProfileStatus, RemediationRecord, RemediationTotal};

/// Record phase: decided, not finished (the plan is in a ConfigMap).
pub const PHASE_PENDING: &str = "Pending";
/// Record phase: every action of the plan was carried out.
pub const PHASE_DONE: &str = "Done";
/// Record phase: the plan could not apply (no such env var, …); nothing was done.
pub const PHASE_SKIPPED: &str = "Skipped";
/// Record phase: an action failed in a way retrying cannot fix.
pub const PHASE_FAILED: &str = "Failed";
/// Record phase: dry run; what would have been done.
pub const PHASE_DRY_RUN: &str = "DryRun";
/// A record's `envChange` when memprof deleted the workload and created it
/// again (the other way, suspend-patch-resume, keeps it).
pub const ENV_CHANGE_RECREATE: &str = "recreate";

/// What a policy did to one Job so far, from the profile's records.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct History {
    /// Remediations performed or pending (dry runs and skips do not count).
    pub count: u32,
    /// When the newest of them was decided.
    pub last: Option<Timestamp>,
}

/// Policies whose totals a profile keeps (least recently acting dropped first).
pub const MAX_POLICY_TOTALS: usize = 32;

/// Whether a finished record changed the workload and so counts toward
/// `maxRemediations` and the cooldown: it completed, or it deleted the Job
/// (whatever happened after: someone else's Job in its place, or a Job that
/// could not be created again).
pub fn counts(r: &RemediationRecord) -> bool {
    r.phase == PHASE_DONE || r.job_deleted
}

/// Folds a finished record into its policy's running total, which outlives
/// the 16 records the status keeps.
pub fn add_to_totals(st: &mut MemoryProfileStatus, r: &RemediationRecord, max: usize) {
    if !counts(r) {
        return;
    }
    match st
        .remediation_totals
        .iter_mut()
        .find(|t| t.policy == r.policy)
    {
        Some(t) => {
            t.count = t.count.saturating_add(1);
            if later(&r.time, &t.last) {
                t.last = r.time.clone();
            }
        }
        None => st.remediation_totals.push(RemediationTotal {
            policy: r.policy.clone(),
            count: 1,
            last: r.time.clone(),
        }),
    }
    while st.remediation_totals.len() > max {
        let oldest = st
            .remediation_totals
            .iter()
            .enumerate()
            .min_by_key(|(_, t)| t.last.parse::<Timestamp>().ok())
            .map(|(i, _)| i);
        if let Some(i) = oldest {
            st.remediation_totals.remove(i);
        }
    }
}

fn later(a: &str, b: &str) -> bool {
    match (a.parse::<Timestamp>(), b.parse::<Timestamp>()) {
        (Ok(a), Ok(b)) => a > b,
        (Ok(_), Err(_)) => true,
        _ => false,
    }
}

/// What a policy did to one Job so far: its running total of finished
/// remediations plus any still pending.
pub fn history(status: &MemoryProfileStatus, policy: &str) -> History {
    let mut h = History::default();
    let mut seen = |time: &str| {
        if let Ok(t) = time.parse::<Timestamp>() {
            h.last = Some(h.last.map_or(t, |l: Timestamp| l.max(t)));
        }
    };
    let mut count = 0u32;
    if let Some(t) = status
        .remediation_totals
        .iter()
        .find(|t| t.policy == policy)
    {
        count = t.count;
        seen(&t.last);
    }
    for r in status
        .remediations
        .iter()
        .filter(|r| r.policy == policy && r.phase == PHASE_PENDING)
    {
        count = count.saturating_add(1);
        seen(&r.time);
    }
    h.count = count;
    h
}

/// Deterministic id of a remediation: the same decision (policy and its
/// spec generation, Job, trigger, how many remediations came before) always
/// gets the same id, so a restarted controller recognizes a decision it
/// already recorded. FNV-1a, because std's hasher is not stable across
/// releases and the id outlives the process.
pub fn record_id(
    policy_uid: &str,
    generation: i64,
    job_uid: &str,
    trigger: &str,
    n: u32,
) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let input = format!("{policy_uid}\0{generation}\0{job_uid}\0{trigger}\0{n}");
    for b in input.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// Appends a record, keeping at most `max` (oldest dropped first, but never a
/// `Pending` one: it is the only trace of an unfinished Job recreation).
pub fn push_record(records: &mut Vec<RemediationRecord>, record: RemediationRecord, max: usize) {
    match records.iter_mut().find(|r| r.id == record.id) {
        Some(existing) => *existing = record,
        None => records.push(record),
    }
    while records.len() > max {
        match records.iter().position(|r| r.phase != PHASE_PENDING) {
            Some(i) => {
                records.remove(i);
            }
            None => break,
        }
    }
}

/// Whose a profile is once the workload it names is gone (or going):
/// `memprof_policy`'s answer for every path and kind, from memprof's own
/// records alone. Annotations, labels and names are anyone's to write or
/// copy; the uid of what memprof created is not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Succession {
    /// memprof's record says it created this workload in place of the
    /// profile's: the profile, and its history, are its.
    Heir,
    /// memprof is replacing the profile's workload and has not recorded
    /// the replacement yet: nothing may take the profile meanwhile.
    Pending,
    /// No record of memprof's names this workload: the profile describes
    /// another run (deleted by someone, or replaced by someone else), so
    /// it is not this workload's to inherit.
    Stranger,
}

/// The succession of the workload of uid `uid` to a profile whose status
/// is `status` and whose earlier workload is gone or going (`replaced`:
/// the uids the profile still names as owners; empty once the garbage
/// collector removed them). `Heir` only through a record that names `uid`
/// as the workload memprof created (`replacementUid`, written once the
/// create succeeded); `Pending` while a recreation of a workload the
/// profile names (any, when it names none) is under way, and for the
/// workload memprof replaces or replaced itself (a lagging cache).
pub fn succession(
    status: Option<&MemoryProfileStatus>,
    replaced: &[&str],
    uid: &str,
) -> Succession {
    let records = status
        .map(|s| s.remediations.as_slice())
        .unwrap_or_default();
    // The workload memprof replaces (or replaced), as a lagging cache may
    // still show it: no heir, nor a stranger to delete the profile for.
    let replacing_me = |r: &RemediationRecord| {
        let recreates = r.env_change.as_deref() == Some(ENV_CHANGE_RECREATE);
        r.job_uid.as_deref() == Some(uid)
            && (r.job_deleted || (r.phase == PHASE_PENDING && recreates))
    };
    if records.iter().any(replacing_me) {
        return Succession::Pending;
    }
    if !uid.is_empty()
        && records
            .iter()
            .any(|r| r.replacement_uid.as_deref() == Some(uid))
    {
        return Succession::Heir;
    }
    let recreating = |r: &RemediationRecord| {
        let old = r.job_uid.as_deref().unwrap_or_default();
        r.phase == PHASE_PENDING
            && r.env_change.as_deref() == Some(ENV_CHANGE_RECREATE)
            && !old.is_empty()
            && (replaced.is_empty() || replaced.contains(&old))
    };
    if records.iter().any(recreating) {
        return Succession::Pending;
    }
    Succession::Stranger
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_workload_memprof_recorded_creating_inherits() {
        let record =
            |phase: &str, old: &str, how: Option<&str>, new: Option<&str>| RemediationRecord {
                phase: phase.into(),
                job_uid: Some(old.into()),
                job_deleted: phase == PHASE_DONE,
                env_change: how.map(str::to_string),
                replacement_uid: new.map(str::to_string),
                ..Default::default()
            };
        let recreate = Some(ENV_CHANGE_RECREATE);
        let of = |records: Vec<RemediationRecord>| MemoryProfileStatus {
            remediations: records,
            ..Default::default()
        };
        use Succession::*;
        // Done: the recorded replacement inherits, owners or none; nothing else does.
        let done = of(vec![
            record(PHASE_DONE, "older", recreate, Some("old")),
            record(PHASE_DONE, "old", recreate, Some("new")),
        ]);
        for replaced in [&[][..], &["old"][..]] {
            assert_eq!(succession(Some(&done), replaced, "new"), Heir);
            assert_eq!(succession(Some(&done), replaced, "other"), Stranger);
        }
        assert_eq!(succession(Some(&done), &[], ""), Stranger);
        // Under way: every claimant waits, but the workload being replaced
        // is not its own successor, and a recreation of another workload
        // than the owners is not this profile's.
        let pending = of(vec![record(PHASE_PENDING, "old", recreate, None)]);
        assert_eq!(succession(Some(&pending), &[], "new"), Pending);
        assert_eq!(succession(Some(&pending), &["old"], "new"), Pending);
        // The workload being replaced, still in a lagging cache: left alone.
        assert_eq!(succession(Some(&pending), &["old"], "old"), Pending);
        assert_eq!(succession(Some(&done), &[], "old"), Pending);
        assert_eq!(succession(Some(&pending), &["elsewhere"], "new"), Stranger);
        // Ended without a replacement of memprof's (someone else's Job took
        // the name, the create failed), a notification, a suspend-patch-
        // resume, a dry run, no history: nobody inherits.
        for r in [
            record(PHASE_FAILED, "old", recreate, None),
            record(PHASE_DONE, "old", recreate, None),
            record(PHASE_PENDING, "old", None, None),
            record(PHASE_PENDING, "old", Some("suspend-patch-resume"), None),
            record(PHASE_DRY_RUN, "old", recreate, None),
        ] {
            assert_eq!(
                succession(Some(&of(vec![r.clone()])), &[], "new"),
                Stranger,
                "{r:?}"
            );
        }
        assert_eq!(succession(None, &[], "new"), Stranger);
    }
}
