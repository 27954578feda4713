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

/// Whether a record memprof wrote in `status` says memprof made the Job of
/// uid `job_uid`, annotated `memprof.dev/remediation: <annotated>`, to
/// replace one of `replaced` (uids of earlier Jobs of its name the profile
/// names as owners): a record of that id, for one of those Jobs (its
/// `jobUid`), that recreates it (`Pending` with `envChange: recreate`) or
/// did (`Done` with `jobDeleted`). The annotation is anyone's to write and
/// its value anyone's to copy, so it counts only as a pointer to such a
/// record: a made-up id matches none, and the id of a record for another
/// Job (an earlier namesake's, another profile's) names another uid.
pub fn made_by_memprof(
    status: Option<&MemoryProfileStatus>,
    annotated: &str,
    replaced: &[&str],
    job_uid: &str,
) -> bool {
    let recreate = Some(ENV_CHANGE_RECREATE);
    let recreates = |r: &RemediationRecord| match r.phase.as_str() {
        PHASE_PENDING => r.env_change.as_deref() == recreate,
        PHASE_DONE => r.job_deleted,
        _ => false,
    };
    !annotated.is_empty()
        && status.is_some_and(|s| {
            s.remediations.iter().any(|r| {
                let old = r.job_uid.as_deref().unwrap_or_default();
                r.id == annotated
                    && !old.is_empty()
                    && old != job_uid
                    && replaced.contains(&old)
                    && recreates(r)
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_memprof_s_own_record_of_a_recreation_of_the_replaced_job_counts() {
        let record = |id: &str, phase: &str, old: &str, how: Option<&str>| RemediationRecord {
            id: id.into(),
            phase: phase.into(),
            job_uid: Some(old.into()),
            job_deleted: phase == PHASE_DONE,
            env_change: how.map(str::to_string),
            ..Default::default()
        };
        let recreate = Some(ENV_CHANGE_RECREATE);
        let status = MemoryProfileStatus {
            remediations: vec![
                // An earlier recreation: the Job of uid "older" replaced by "old".
                record("r-older", PHASE_DONE, "older", recreate),
                record("r-done", PHASE_DONE, "old", recreate),
                record("r-pending", PHASE_PENDING, "old", recreate),
                record("r-notify", PHASE_PENDING, "old", None),
                record("r-failed", PHASE_FAILED, "old", recreate),
                record("r-dry", PHASE_DRY_RUN, "old", recreate),
            ],
            ..Default::default()
        };
        let st = Some(&status);
        let replaced = ["old"];
        assert!(made_by_memprof(st, "r-done", &replaced, "new"));
        assert!(made_by_memprof(st, "r-pending", &replaced, "new"));
        // Anything else a tenant may write or copy proves nothing.
        for id in ["", "made-up", "r-older", "r-notify", "r-failed", "r-dry"] {
            assert!(!made_by_memprof(st, id, &replaced, "new"), "{id}");
        }
        // Not the Job the profile names as owner, or that very Job.
        assert!(!made_by_memprof(st, "r-done", &["other"], "new"));
        assert!(!made_by_memprof(st, "r-done", &replaced, "old"));
        assert!(!made_by_memprof(None, "r-done", &replaced, "new"));
        // A record of a suspend-patch-resume replaces nothing.
        let kept = MemoryProfileStatus {
            remediations: vec![record(
                "r-spr",
                PHASE_PENDING,
                "old",
                Some("suspend-patch-resume"),
            )],
            ..Default::default()
        };
        assert!(!made_by_memprof(Some(&kept), "r-spr", &replaced, "new"));
    }
}
