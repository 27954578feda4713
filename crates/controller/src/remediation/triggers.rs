//! Pure trigger evaluation: does a policy fire for a profile, now, and if not,
//! why not? No client, no clock: time comes in as an argument, and the one
//! piece of memory a trigger needs (since when the risk has been at a level)
//! is a [`RiskClock`] the caller keeps.
//!
//! Why a policy's history is read from the profile's `status.remediations`
//! rather than kept in memory: cooldown and `maxRemediations` must hold
//! across operator restarts and across the Job's recreation, and the profile
//! is the one object that survives both.

use jiff::Timestamp;
use kube::core::{Selector, SelectorExt};
use memprof_api::{
    MemoryProfileStatus, OomRecord, RemediationPolicy, RemediationRecord, RemediationTotal,
    RiskLevel, Trigger,
};
use std::collections::BTreeMap;

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

/// Whether the profile holds a report newer than `since`: triggers computed
/// from reports must not fire again on the numbers that caused the last
/// remediation (the old pods' reports outlive the old Job for a while).
fn fresh(status: &MemoryProfileStatus, since: Option<Timestamp>) -> Result<(), String> {
    let Some(since) = since else { return Ok(()) };
    let newest = status
        .last_report_time
        .as_deref()
        .and_then(|t| t.parse::<Timestamp>().ok());
    match newest {
        Some(t) if t > since => Ok(()),
        _ => Err(format!(
            "no report newer than the last remediation ({since})"
        )),
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
    pub matches: Result<bool, String>,
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

/// Whether a label selector matches a Job's labels.
pub fn selector_matches(
    policy: &RemediationPolicy,
    labels: &BTreeMap<String, String>,
) -> Result<bool, String> {
    let selector = Selector::try_from(policy.spec.selector.clone())
        .map_err(|e| format!("invalid selector: {e}"))?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_api::{OomRecord, RemediationPolicySpec, RiskTrigger};

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + s).unwrap()
    }

    fn risk(level: RiskLevel, for_seconds: u32) -> Trigger {
        Trigger {
            risk_at_least: Some(RiskTrigger { level, for_seconds }),
            ..Default::default()
        }
    }

    fn policy(triggers: Vec<Trigger>) -> RemediationPolicy {
        let mut p = RemediationPolicy::new(
            "shrink",
            RemediationPolicySpec {
                triggers,
                cooldown_seconds: 600,
                max_remediations: 2,
                ..Default::default()
            },
        );
        p.spec
            .selector
            .match_labels
            .get_or_insert_with(Default::default)
            .insert("team".into(), "ml".into());
        p
    }

    fn record(policy: &str, phase: &str, at: i64) -> RemediationRecord {
        RemediationRecord {
            id: format!("{policy}-{at}"),
            policy: policy.into(),
            action: "scaleBatch BATCH_SIZE 32->24".into(),
            phase: phase.into(),
            time: ts(at).to_string(),
            message: None,
            ..Default::default()
        }
    }

    fn labels(team: &str) -> BTreeMap<String, String> {
        BTreeMap::from([("team".to_string(), team.to_string())])
    }

    #[test]
    fn risk_must_hold_for_the_required_time() {
        let st = MemoryProfileStatus {
            risk: RiskLevel::Critical,
            ..Default::default()
        };
        let mut clock = RiskClock::default();
        clock.observe(RiskLevel::High, ts(0));
        clock.observe(RiskLevel::Critical, ts(30));
        let t = risk(RiskLevel::High, 60);
        let e = evaluate(&t, &st, &clock, None, ts(40));
        assert!(!e.fired, "{e:?}");
        assert_eq!(e.recheck_after, Some(20.0));
        assert!(evaluate(&t, &st, &clock, None, ts(60)).fired);
        // Critical since 30 only.
        let e = evaluate(&risk(RiskLevel::Critical, 60), &st, &clock, None, ts(60));
        assert!(!e.fired && e.why.contains("30s of the 60s"), "{e:?}");
        clock.observe(RiskLevel::Low, ts(70));
        assert_eq!(clock.since(RiskLevel::High), None);
        assert_eq!(clock.since(RiskLevel::Low), Some(ts(0)));
    }

    #[test]
    fn report_triggers_ignore_numbers_from_before_the_last_remediation() {
        let mut st = MemoryProfileStatus {
            risk: RiskLevel::Critical,
            time_to_oom_seconds: Some(30.0),
            imbalance: Some(1.5),
            last_report_time: Some(ts(10).to_string()),
            ..Default::default()
        };
        let clock = RiskClock::default();
        let tto = Trigger {
            time_to_oom_below_seconds: Some(60.0),
            ..Default::default()
        };
        let imb = Trigger {
            imbalance_above: Some(1.3),
            ..Default::default()
        };
        for t in [&risk(RiskLevel::Critical, 0), &tto, &imb] {
            assert!(evaluate(t, &st, &clock, None, ts(20)).fired);
            let stale = evaluate(t, &st, &clock, Some(ts(15)), ts(20));
            assert!(!stale.fired && stale.why.contains("no report newer"));
        }
        st.last_report_time = Some(ts(16).to_string());
        assert!(evaluate(&tto, &st, &clock, Some(ts(15)), ts(20)).fired);
        st.imbalance = Some(1.2);
        assert!(!evaluate(&imb, &st, &clock, None, ts(20)).fired);
    }

    #[test]
    fn oom_trigger_fires_on_ooms_newer_than_the_last_remediation() {
        let t = Trigger {
            oom_observed: Some(true),
            ..Default::default()
        };
        let mut st = MemoryProfileStatus::default();
        let clock = RiskClock::default();
        assert!(!evaluate(&t, &st, &clock, None, ts(0)).fired);
        st.ooms.push(OomRecord {
            time: ts(5).to_string(),
            pod: "train-0".into(),
            evidence: "terminationMessage trainer#0: CUDA out of memory".into(),
            ..Default::default()
        });
        let e = evaluate(&t, &st, &clock, None, ts(6));
        assert!(e.fired && e.why.contains("train-0"), "{e:?}");
        assert!(!evaluate(&t, &st, &clock, Some(ts(5)), ts(6)).fired);
        assert!(evaluate(&t, &st, &clock, Some(ts(4)), ts(6)).fired);
    }

    #[test]
    fn cooldown_and_max_count_recorded_remediations_only() {
        let p = policy(vec![risk(RiskLevel::High, 0)]);
        let mut st = MemoryProfileStatus {
            risk: RiskLevel::Critical,
            last_report_time: Some(ts(1000).to_string()),
            ..Default::default()
        };
        let clock = RiskClock::default();
        let v = verdict(&p, &labels("ml"), None, &st, &clock, ts(100));
        assert!(v.acts(), "{v:?}");
        assert!(!verdict(&p, &labels("web"), None, &st, &clock, ts(100)).acts());

        finished(&mut st, record("shrink", PHASE_DRY_RUN, 90));
        finished(&mut st, record("other", PHASE_DONE, 95));
        finished(&mut st, record("shrink", PHASE_SKIPPED, 96));
        assert!(verdict(&p, &labels("ml"), None, &st, &clock, ts(100)).acts());

        finished(&mut st, record("shrink", PHASE_DONE, 100));
        let v = verdict(&p, &labels("ml"), None, &st, &clock, ts(400));
        assert_eq!(v.blocked, Some(Blocked::Cooldown { remaining: 300.0 }));
        assert_eq!(v.recheck_after(), Some(300.0));
        assert!(verdict(&p, &labels("ml"), None, &st, &clock, ts(700)).acts());

        st.remediations.push(record("shrink", PHASE_PENDING, 700));
        let v = verdict(&p, &labels("ml"), None, &st, &clock, ts(5000));
        assert_eq!(v.blocked, Some(Blocked::MaxReached { count: 2 }));
        assert!(!v.acts());
    }

    /// A record as `finish` leaves it: in the bounded list and, when it
    /// counts, in the policy's running total.
    fn finished(st: &mut MemoryProfileStatus, r: RemediationRecord) {
        add_to_totals(st, &r, MAX_POLICY_TOTALS);
        push_record(&mut st.remediations, r, memprof_api::MAX_HISTORY);
    }

    #[test]
    fn max_remediations_above_the_kept_history_is_still_honoured() {
        let mut p = policy(vec![risk(RiskLevel::High, 0)]);
        p.spec.max_remediations = 20;
        p.spec.cooldown_seconds = 0;
        let mut st = MemoryProfileStatus {
            risk: RiskLevel::Critical,
            last_report_time: Some(ts(100_000).to_string()),
            ..Default::default()
        };
        let clock = RiskClock::default();
        for i in 0..19 {
            finished(&mut st, record("shrink", PHASE_DONE, i));
        }
        assert_eq!(st.remediations.len(), 16, "the list stays bounded");
        assert!(verdict(&p, &labels("ml"), None, &st, &clock, ts(50_000)).acts());
        finished(&mut st, record("shrink", PHASE_DONE, 19));
        let v = verdict(&p, &labels("ml"), None, &st, &clock, ts(50_000));
        assert_eq!(v.blocked, Some(Blocked::MaxReached { count: 20 }));
    }

    #[test]
    fn a_failure_after_the_job_was_deleted_counts_and_starts_the_cooldown() {
        let p = policy(vec![risk(RiskLevel::High, 0)]);
        let mut st = MemoryProfileStatus {
            risk: RiskLevel::Critical,
            last_report_time: Some(ts(1000).to_string()),
            ..Default::default()
        };
        let clock = RiskClock::default();
        // Failed before touching the Job: does not count.
        finished(&mut st, record("shrink", PHASE_FAILED, 100));
        assert!(verdict(&p, &labels("ml"), None, &st, &clock, ts(200)).acts());
        // Failed after deleting it (someone else's Job took the name): counts.
        let mut foreign = record("shrink", PHASE_FAILED, 150);
        foreign.id = "foreign".into();
        foreign.job_deleted = true;
        finished(&mut st, foreign);
        let v = verdict(&p, &labels("ml"), None, &st, &clock, ts(200));
        assert_eq!(v.history.count, 1);
        assert_eq!(v.blocked, Some(Blocked::Cooldown { remaining: 550.0 }));
    }

    #[test]
    fn ooms_of_an_earlier_job_never_fire_on_the_new_one() {
        let t = Trigger {
            oom_observed: Some(true),
            ..Default::default()
        };
        let p = policy(vec![t]);
        let mut st = MemoryProfileStatus::default();
        st.ooms.push(OomRecord {
            time: ts(10).to_string(),
            pod: "train-0".into(),
            evidence: "terminationMessage trainer#0: CUDA out of memory".into(),
            job_uid: Some("old-uid".into()),
            ..Default::default()
        });
        let clock = RiskClock::default();
        assert!(verdict(&p, &labels("ml"), Some("old-uid"), &st, &clock, ts(20)).acts());
        let v = verdict(&p, &labels("ml"), Some("new-uid"), &st, &clock, ts(20));
        assert!(!v.acts(), "{v:?}");
    }

    #[test]
    fn an_oom_record_without_the_jobs_uid_never_fires() {
        let t = Trigger {
            oom_observed: Some(true),
            ..Default::default()
        };
        let p = policy(vec![t]);
        let mut st = MemoryProfileStatus::default();
        st.ooms.push(OomRecord {
            time: ts(10).to_string(),
            pod: "train-oom".into(),
            evidence: "terminationMessage trainer#0: CUDA out of memory".into(),
            job_uid: None,
            ..Default::default()
        });
        let clock = RiskClock::default();
        let v = verdict(&p, &labels("ml"), Some("uid"), &st, &clock, ts(20));
        assert!(!v.acts(), "{v:?}");
        st.ooms[0].job_uid = Some("uid".into());
        assert!(verdict(&p, &labels("ml"), Some("uid"), &st, &clock, ts(20)).acts());
        // Without a Job to compare with, no record is its own.
        assert!(!verdict(&p, &labels("ml"), None, &st, &clock, ts(20)).acts());
    }

    #[test]
    fn ids_are_deterministic_and_distinct() {
        let a = record_id("p-uid", 1, "j-uid", "risk>=critical", 0);
        assert_eq!(a, record_id("p-uid", 1, "j-uid", "risk>=critical", 0));
        assert_eq!(a.len(), 16);
        assert_ne!(a, record_id("p-uid", 1, "j-uid", "risk>=critical", 1));
        assert_ne!(a, record_id("p-uid", 2, "j-uid", "risk>=critical", 0));
        assert_ne!(a, record_id("p-uid", 1, "j-uid2", "risk>=critical", 0));
    }

    #[test]
    fn records_stay_bounded_and_pending_ones_are_kept() {
        let mut records = vec![record("p", PHASE_PENDING, 0)];
        for i in 1..40 {
            push_record(&mut records, record("p", PHASE_DONE, i), 16);
        }
        assert_eq!(records.len(), 16);
        assert_eq!(records[0].phase, PHASE_PENDING);
        assert_eq!(records[15].time, ts(39).to_string());
        let mut done = records[0].clone();
        done.phase = PHASE_DONE.into();
        push_record(&mut records, done, 16);
        assert_eq!(records.len(), 16);
        assert_eq!(records[0].phase, PHASE_DONE);
    }

    #[test]
    fn selectors_display_and_match() {
        let p = policy(vec![]);
        assert_eq!(selector_display(&p), "team=ml");
        assert_eq!(selector_matches(&p, &labels("ml")), Ok(true));
        let mut all = p.clone();
        all.spec.selector = Default::default();
        assert_eq!(selector_display(&all), "<all>");
        assert_eq!(selector_matches(&all, &BTreeMap::new()), Ok(true));
    }
}
