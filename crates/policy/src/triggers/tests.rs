//! Unit tests of `triggers.rs`, `triggers/history.rs` and
//! `triggers/verdict.rs`: triggers, history and verdicts on plain statuses.

use super::*;
use memprof_api::{
    OomRecord, RemediationPolicy, RemediationPolicySpec, RemediationRecord, RiskTrigger,
};
use std::collections::BTreeMap;

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
        ranks_reporting: 1,
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
        ranks_reporting: 1,
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
        ranks_reporting: 1,
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
        ranks_reporting: 1,
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
        ranks_reporting: 1,
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
    let mut bad = p.clone();
    bad.spec.selector = serde_json::from_value(serde_json::json!({
        "matchExpressions": [{"key": "team", "operator": "Near", "values": ["ml"]}]
    }))
    .unwrap();
    let err = selector_matches(&bad, &labels("ml")).unwrap_err();
    assert!(err.to_string().starts_with("invalid selector: "), "{err}");
}

/// A policy that fires at risk `none` with no report at all (200 Jobs that
/// run nothing) would act on every one of them: triggers computed from
/// reports need one counted report first; OOM triggers need an OOM record.
#[test]
fn no_report_trigger_fires_without_a_counted_report() {
    let clock = RiskClock::default();
    let empty = MemoryProfileStatus::default();
    let e = evaluate(&risk(RiskLevel::None, 0), &empty, &clock, None, ts(0));
    assert!(!e.fired, "{}", e.why);
    assert!(e.why.contains("no counted report"), "{}", e.why);
    let seen = MemoryProfileStatus {
        ranks_reporting: 1,
        ..Default::default()
    };
    let e = evaluate(&risk(RiskLevel::None, 0), &seen, &clock, None, ts(0));
    assert!(e.fired, "{}", e.why);
}
