use super::*;

fn at(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn decided() -> Timestamp {
    at("2026-11-24T12:00:00Z")
}

fn wait(max: u32, margin: u32) -> CheckpointWait {
    CheckpointWait {
        max_seconds: max,
        margin_seconds: margin,
    }
}

fn ckpt(time: &str, step: u64) -> Option<Checkpoint> {
    Some(Checkpoint {
        time: time.into(),
        note: format!("step={step}"),
        step: Some(step),
    })
}

#[test]
fn the_bound_is_the_sooner_of_max_seconds_and_time_to_oom_less_the_margin() {
    let g = gate_for(&wait(600, 30), None, false, decided());
    assert_eq!(
        (g.bound_seconds, g.bound.as_str()),
        (600.0, "maxSeconds 600")
    );
    assert_eq!(g.deadline, "2026-11-24T12:10:00Z");
    assert_eq!(g.decided, "2026-11-24T12:00:00Z");
    let g = gate_for(&wait(600, 30), Some(150.0), false, decided());
    assert_eq!(g.bound_seconds, 120.0);
    assert_eq!(g.bound, "time to OOM 150 s - margin 30 s");
    assert_eq!(g.deadline, "2026-11-24T12:02:00Z");
    assert_eq!(g.no_wait, None);
    // A time to OOM further away than maxSeconds: maxSeconds bounds it.
    let g = gate_for(&wait(60, 30), Some(3600.0), false, decided());
    assert_eq!((g.bound_seconds, g.bound.as_str()), (60.0, "maxSeconds 60"));
    // Garbage time to OOM: as if none.
    let g = gate_for(&wait(60, 30), Some(f64::NAN), false, decided());
    assert_eq!(g.bound_seconds, 60.0);
}

#[test]
fn no_wait_when_the_oom_is_closer_than_the_margin_or_already_happened() {
    let g = gate_for(&wait(600, 30), Some(20.0), false, decided());
    assert_eq!(g.bound_seconds, 0.0);
    assert_eq!(g.deadline, g.decided);
    let why = g.no_wait.unwrap();
    assert!(why.starts_with("no time left (time to OOM 20 s"), "{why}");
    let g = gate_for(&wait(600, 30), Some(500.0), true, decided());
    assert_eq!(
        (g.bound_seconds, g.deadline.as_str()),
        (0.0, "2026-11-24T12:00:00Z")
    );
    assert!(g
        .no_wait
        .unwrap()
        .contains("OOM of this workload was already observed"));
}

#[test]
fn the_jobs_checkpoint_is_the_oldest_of_its_ranks_newest_and_none_if_a_rank_has_none() {
    let ranks = JobCheckpoints::new([
        ckpt("2026-11-24T11:50:00Z", 1200),
        ckpt("2026-11-24T11:49:00Z", 1190),
    ]);
    let (t, c) = ranks.job_checkpoint().unwrap();
    assert_eq!((t, c.step), (at("2026-11-24T11:49:00Z"), Some(1190)));
    let ranks = JobCheckpoints::new([ckpt("2026-11-24T11:50:00Z", 1200), None]);
    assert_eq!(ranks.job_checkpoint(), None);
    assert_eq!((ranks.with_checkpoint(), ranks.any()), (1, true));
    // Unreadable time: as none.
    let ranks = JobCheckpoints::new([ckpt("yesterday", 1)]);
    assert_eq!((ranks.job_checkpoint(), ranks.any()), (None, false));
    assert_eq!(JobCheckpoints::default().job_checkpoint(), None);
}

#[test]
fn it_waits_until_every_rank_checkpointed_after_the_decision() {
    let g = gate_for(&wait(600, 30), Some(150.0), false, decided());
    let old = JobCheckpoints::new([
        ckpt("2026-11-24T11:50:00Z", 1200),
        ckpt("2026-11-24T11:50:00Z", 1200),
    ]);
    let now = at("2026-11-24T12:00:05Z");
    assert_eq!(evaluate(&g, &old, now), Verdict::Wait(POLL));
    // Close to the deadline: look again exactly at it.
    let near = at("2026-11-24T12:01:57Z");
    assert_eq!(
        evaluate(&g, &old, near),
        Verdict::Wait(Duration::from_secs(3))
    );
    // One rank newer is not enough: the Job's checkpoint is the oldest.
    let half = JobCheckpoints::new([
        ckpt("2026-11-24T12:00:20Z", 1300),
        ckpt("2026-11-24T11:50:00Z", 1200),
    ]);
    assert!(matches!(evaluate(&g, &half, now), Verdict::Wait(_)));
    let both = JobCheckpoints::new([
        ckpt("2026-11-24T12:00:20Z", 1300),
        ckpt("2026-11-24T12:00:21Z", 1300),
    ]);
    let now = at("2026-11-24T12:00:23Z");
    let Verdict::Go(o) = evaluate(&g, &both, now) else {
        panic!("every rank checkpointed")
    };
    assert_eq!((o.result.as_str(), o.waited_seconds), (CHECKPOINTED, 23.0));
    assert_eq!(
        (o.lost_seconds, o.kept.as_ref().unwrap().step),
        (Some(3.0), Some(1300))
    );
    assert_eq!((o.ranks_with_checkpoint, o.ranks), (2, 2));
}

#[test]
fn at_the_bound_it_goes_on_and_says_what_is_lost() {
    let g = gate_for(&wait(600, 30), Some(150.0), false, decided());
    let old = JobCheckpoints::new([ckpt("2026-11-24T11:48:00Z", 1200)]);
    let now = at("2026-11-24T12:02:00Z");
    let Verdict::Go(o) = evaluate(&g, &old, now) else {
        panic!("the bound is reached")
    };
    assert_eq!(o.result, BOUND_REACHED);
    assert_eq!((o.waited_seconds, o.lost_seconds), (120.0, Some(840.0)));
    assert_eq!(
        describe(&o, None),
        "no checkpoint within 120 s (bound: time to OOM 150 s - margin 30 s); \
         checkpoint step 1200 at 2026-11-24T11:48:00Z kept; lost 14 min since it"
    );
    let partial = JobCheckpoints::new([ckpt("2026-11-24T11:48:00Z", 1200), None]);
    let Verdict::Go(o) = evaluate(&g, &partial, now) else {
        panic!("the bound is reached")
    };
    assert_eq!((o.lost_seconds, o.kept.as_ref()), (None, None));
    assert!(describe(&o, None).ends_with("1/2 ranks had a checkpoint: the restart keeps none"));
}

#[test]
fn a_trainer_that_never_checkpoints_or_an_oom_is_not_waited_for() {
    let g = gate_for(&wait(600, 30), None, false, decided());
    let none = JobCheckpoints::new([None, None]);
    let Verdict::Go(o) = evaluate(&g, &none, at("2026-11-24T12:00:01Z")) else {
        panic!("nothing to wait for")
    };
    assert_eq!((o.result.as_str(), o.kept.as_ref()), (NOT_WAITED, None));
    assert_eq!(
        describe(&o, None),
        "did not wait for a checkpoint: no rank ever announced a checkpoint; \
         the restart keeps no checkpoint memprof knows of"
    );
    let g = gate_for(&wait(600, 30), None, true, decided());
    let old = JobCheckpoints::new([ckpt("2026-11-24T11:59:00Z", 7)]);
    let Verdict::Go(o) = evaluate(&g, &old, at("2026-11-24T12:00:00Z")) else {
        panic!("an OOM was observed")
    };
    assert_eq!(
        (o.result.as_str(), o.lost_seconds),
        (NOT_WAITED, Some(60.0))
    );
    let text = describe(&o, g.no_wait.as_deref());
    assert!(
        text.starts_with("did not wait for a checkpoint: a GPU OOM"),
        "{text}"
    );
}

#[test]
fn checkpoints_seen_waits_in_few_words() {
    let o = CheckpointOutcome {
        result: CHECKPOINTED.into(),
        waited_seconds: 42.0,
        bound_seconds: 600.0,
        bound: "maxSeconds 600".into(),
        kept: ckpt("2026-11-24T12:00:39Z", 1200),
        lost_seconds: Some(3.0),
        ranks_with_checkpoint: 4,
        ranks: 4,
    };
    assert_eq!(
        describe(&o, None),
        "waited 42 s for a checkpoint; checkpoint step 1200 at 2026-11-24T12:00:39Z kept; \
         lost 3 s since it"
    );
}

#[test]
fn a_trainer_that_exits_during_the_wait_ends_it() {
    let g = gate_for(&wait(600, 30), None, false, decided());
    let mut old = JobCheckpoints::new([
        ckpt("2026-11-24T11:59:00Z", 7),
        ckpt("2026-11-24T11:59:00Z", 7),
    ]);
    let now = at("2026-11-24T12:00:10Z");
    assert!(matches!(evaluate(&g, &old, now), Verdict::Wait(_)));
    old.exited = 1;
    let Verdict::Go(o) = evaluate(&g, &old, now) else {
        panic!("the trainer is gone")
    };
    assert_eq!(
        (o.result.as_str(), o.lost_seconds),
        (TRAINER_EXITED, Some(70.0))
    );
    assert_eq!(
        describe(&o, None),
        "a rank's trainer exited 10 s into the wait for a checkpoint; \
         checkpoint step 7 at 2026-11-24T11:59:00Z kept; lost 70 s since it"
    );
}
