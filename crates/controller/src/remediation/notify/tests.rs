//! Unit tests of `notify.rs`: the directive list, the answers and the tally,
//! and the plan a `notifyTrainer` action makes.

use super::*;
use memprof_api::{
    AgentAck, MemoryReportSpec, MemoryReportStatus, NotifyTrainerAction, RemediationAction,
    RemediationPolicy, RemediationPolicySpec, RiskLevel,
};
use memprof_policy::plan::{build, PlanInput, Step};
use std::collections::{BTreeMap, BTreeSet};

fn d(id: &str) -> Directive {
    directive(id, NotifyLevel::Critical, "r")
}

#[test]
fn a_directive_is_added_once_and_the_newest_sixteen_are_kept() {
    let existing: Vec<Directive> = (0..16).map(|i| d(&format!("old{i}"))).collect();
    assert_eq!(with_directive(&existing, &d("old3")), None, "already there");
    let next = with_directive(&existing, &d("new")).unwrap();
    assert_eq!(next.len(), MAX_REPORT_DIRECTIVES);
    assert_eq!(next[0].id, "old1", "the oldest goes");
    assert_eq!(next.last().unwrap().id, "new");
    let one = with_directive(&[], &d("x")).unwrap();
    assert_eq!(one[0].kind, DirectiveKind::NotifyTrainer);
    assert_eq!(one[0].level, RiskLevel::Critical);
}

fn report(name: &str, rank: Option<u32>, carried: bool, acks: &[(&str, bool)]) -> MemoryReport {
    let mut r = MemoryReport::new(
        name,
        MemoryReportSpec {
            rank,
            agent_acks: acks
                .iter()
                .map(|(id, ok)| AgentAck {
                    id: id.to_string(),
                    ok: *ok,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        },
    );
    r.status = carried.then(|| MemoryReportStatus {
        directives: vec![d("n1")],
    });
    r
}

#[test]
fn a_rank_is_ok_when_every_process_did_it_failed_when_one_could_not() {
    assert_eq!(
        answer(&report("a", Some(0), true, &[]), "n1"),
        Some(Answer::Pending)
    );
    assert_eq!(
        answer(&report("a", Some(0), false, &[]), "n1"),
        None,
        "not its directive"
    );
    let ok = report(
        "a",
        Some(0),
        true,
        &[("n1", true), ("n1", true), ("other", false)],
    );
    assert_eq!(answer(&ok, "n1"), Some(Answer::Ok));
    let mixed = report("a", Some(0), true, &[("n1", true), ("n1", false)]);
    assert_eq!(answer(&mixed, "n1"), Some(Answer::Failed));
    // An acknowledgement of another directive is no answer to this one.
    assert_eq!(
        answer(&report("a", Some(0), true, &[("n2", true)]), "n1"),
        Some(Answer::Pending)
    );
}

#[test]
fn the_tally_says_which_ranks_answered_what_and_is_bounded() {
    let reports = [
        report("p0", Some(0), true, &[("n1", true)]),
        report("p1", Some(1), true, &[("n1", false)]),
        report("p2", Some(2), true, &[]),
        report("p9", Some(9), false, &[]),
    ];
    let t = tally(reports.iter(), "n1", 1);
    assert_eq!(
        (t.delivered, t.ok, t.failed, t.pending, t.not_delivered),
        (3, 1, 1, 1, 1)
    );
    assert_eq!(
        (t.failed_ranks.as_slice(), t.pending_ranks.as_slice()),
        (&[1][..], &[2][..])
    );
    assert_eq!(
        t.summary,
        "2/4 acknowledged (1 failed: rank 1; 1 pending: rank 2; 1 not delivered)"
    );

    let many: Vec<MemoryReport> = (0..20)
        .rev()
        .map(|i| report(&format!("p{i}"), Some(i), true, &[]))
        .collect();
    let t = tally(many.iter(), "n1", 0);
    assert_eq!(t.pending, 20);
    assert_eq!(
        t.pending_ranks,
        (0..8).collect::<Vec<u32>>(),
        "the lowest 8"
    );
    assert_eq!(
        t.summary,
        "0/20 acknowledged (20 pending: ranks 0, 1, 2, 3, 4, 5, 6, 7, ...)"
    );

    let none = tally(std::iter::empty(), "n1", 0);
    assert_eq!(none.summary, "0/0 acknowledged");
}

#[test]
fn a_tally_is_open_while_a_rank_is_pending_within_the_window() {
    let now: jiff::Timestamp = "2026-01-01T01:00:00Z".parse().unwrap();
    let rec = |id: &str, time: &str, pending: u32| RemediationRecord {
        id: id.into(),
        time: time.into(),
        acknowledged: Some(Acknowledgements {
            pending,
            ..Default::default()
        }),
        ..Default::default()
    };
    let records = [
        rec("fresh", "2026-01-01T00:59:00Z", 2),
        rec("answered", "2026-01-01T00:59:00Z", 0),
        rec("old", "2026-01-01T00:20:00Z", 2),
        RemediationRecord {
            id: "scale".into(),
            time: "2026-01-01T00:59:00Z".into(),
            ..Default::default()
        },
    ];
    let open: Vec<String> = open_tallies(&records, now)
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(open, ["fresh"]);
}

#[test]
fn a_notify_trainer_action_plans_one_step_with_the_level_and_a_reason() {
    let job = serde_json::json!({
        "metadata": {"name": "train", "namespace": "ml", "uid": "u1"},
        "spec": {"template": {"spec": {"containers": [{"name": "trainer"}]}}},
    });
    let action = |reason: Option<&str>| RemediationAction {
        notify_trainer: Some(NotifyTrainerAction {
            level: NotifyLevel::High,
            reason: reason.map(str::to_string),
        }),
        ..Default::default()
    };
    let policy = RemediationPolicy::new(
        "tell",
        RemediationPolicySpec {
            actions: vec![action(None)],
            ..Default::default()
        },
    );
    let input = PlanInput {
        policy: &policy,
        job: &job,
        config_maps: &BTreeMap::new(),
        not_opted_in: &BTreeSet::new(),
        id: "abc",
        why: "risk critical",
        batch_fit: None,
        nonce: "n0nce",
    };
    let plan = build(&input).unwrap();
    assert_eq!(
        plan.steps,
        [Step::NotifyTrainer {
            level: NotifyLevel::High,
            reason: "RemediationPolicy tell: risk critical".into()
        }]
    );
    assert_eq!(plan.summary(), "notifyTrainer high");
    assert!(plan.recreate().is_none(), "a live action: no restart");
    let mut own = policy.clone();
    own.spec.actions = vec![action(Some("activations spike"))];
    let plan = build(&PlanInput {
        policy: &own,
        ..input
    })
    .unwrap();
    assert!(
        matches!(&plan.steps[0], Step::NotifyTrainer { reason, .. } if reason == "activations spike")
    );
}
