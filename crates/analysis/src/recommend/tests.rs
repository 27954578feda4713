use super::*;
use memprof_api::{
    AgentEvent, AllocatorStats, Checkpoint, FragmentationPoint, GpuReport, PhasePeak,
};

const G: u64 = 1 << 30;
const M: u64 = 1 << 20;

/// A rank whose agent reports `reserved` now, `step`, and the given phases.
fn report(reserved: u64, step: u64, phases: &[&str]) -> MemoryReportSpec {
    MemoryReportSpec {
        gpus: vec![GpuReport {
            total_bytes: 80 * G,
            // NVML's figure counts a neighbour's 30 GiB: never the peak.
            used_bytes: reserved + 30 * G,
            peak_bytes: reserved + 30 * G,
            ..Default::default()
        }],
        allocator: Some(AllocatorStats {
            allocated_bytes: reserved / 2,
            reserved_bytes: reserved,
            peak_allocated_bytes: Some(reserved - G),
            step: Some(step),
            phase_peaks: phases
                .iter()
                .map(|p| PhasePeak {
                    phase: p.to_string(),
                    allocated_bytes: G,
                })
                .collect(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn seen(reserved: u64) -> MemoryReportSpec {
    report(reserved, 100, &["forward", "evaluation", "checkpoint"])
}

fn one_role(specs: &[MemoryReportSpec], ranks: u32) -> RoleRecommendation {
    let evs: Vec<_> = specs
        .iter()
        .map(|s| ("worker".to_string(), evidence(s)))
        .collect();
    let phases = Phases::default();
    let mut out = recommend(&evs, JobFacts { ranks, phases });
    assert_eq!(out.len(), 1);
    out.remove(0)
}

#[test]
fn the_request_is_the_trainers_own_peak_plus_context_and_margin_rounded_up() {
    let r = one_role(&[seen(40 * G)], 1);
    assert_eq!(
        r.peak_bytes,
        Some(40 * G),
        "the allocator's, not NVML's 70 GiB"
    );
    assert_eq!(r.context_bytes, CONTEXT_BYTES, "one rank: no NCCL buffers");
    let floor = (40.0 * G as f64 * 0.02).ceil() as u64;
    assert_eq!(r.margin_bytes, floor);
    let exact = 40 * G + CONTEXT_BYTES + floor;
    let request = r.request_bytes.unwrap();
    assert!(
        request >= exact && request - exact < STEP_BYTES,
        "{request}"
    );
    assert_eq!(request % STEP_BYTES, 0);
    assert_eq!(r.basis.source, "allocatorReserved");
    assert_eq!(
        (r.basis.ranks, r.basis.ranks_measured, r.basis.steps),
        (1, 1, 100)
    );
    assert!(r.basis.evaluation_seen && r.basis.checkpoint_seen);
    let two = one_role(&[seen(40 * G), seen(40 * G)], 2);
    assert_eq!(two.context_bytes, CONTEXT_BYTES + NCCL_BYTES);
}

#[test]
fn rounding_is_up_never_down() {
    assert_eq!(round_up(1), STEP_BYTES);
    assert_eq!(round_up(STEP_BYTES), STEP_BYTES);
    assert_eq!(round_up(STEP_BYTES + 1), 2 * STEP_BYTES);
    assert_eq!(round_up(0), 0);
}

#[test]
fn the_peak_is_the_highest_reserved_the_run_showed_and_at_least_peak_allocated() {
    let mut s = seen(20 * G);
    let a = s.allocator.as_mut().unwrap();
    // The cache was larger earlier in the run (empty_cache since).
    a.fragmentation_trend = vec![
        FragmentationPoint {
            reserved_bytes: 30 * G,
            ..Default::default()
        },
        FragmentationPoint {
            reserved_bytes: 20 * G,
            ..Default::default()
        },
    ];
    assert_eq!(evidence(&s).peak, Some(30 * G));
    let a = s.allocator.as_mut().unwrap();
    a.fragmentation_trend.clear();
    a.peak_allocated_bytes = Some(25 * G);
    assert_eq!(evidence(&s).peak, Some(25 * G));
    // A trainer cannot claim more than its card holds.
    s.allocator.as_mut().unwrap().reserved_bytes = 500 * G;
    assert_eq!(evidence(&s).peak, Some(80 * G));
}

#[test]
fn no_request_until_the_steps_and_the_required_phases_were_seen() {
    let early = one_role(
        &[report(40 * G, 2, &["forward", "evaluation", "checkpoint"])],
        1,
    );
    assert_eq!(early.request_bytes, None);
    assert!(
        early.reason.contains("2 of 3 training steps"),
        "{}",
        early.reason
    );
    let no_eval = one_role(&[report(40 * G, 50, &["forward", "checkpoint"])], 1);
    assert_eq!(no_eval.request_bytes, None);
    assert!(
        no_eval.reason.contains("no evaluation phase yet"),
        "{}",
        no_eval.reason
    );
    let mut announced = report(40 * G, 50, &["validate"]);
    assert!(evidence(&announced).evaluation, "valid… is evaluation");
    assert!(!evidence(&announced).checkpoint);
    announced.last_checkpoint = Some(Checkpoint::default());
    assert!(
        evidence(&announced).checkpoint,
        "a checkpoint the agent announced"
    );
    let mut event = report(40 * G, 50, &[]);
    event.allocator.as_mut().unwrap().events = vec![AgentEvent {
        name: CHECKPOINT_EVENT.into(),
        ..Default::default()
    }];
    assert!(evidence(&event).checkpoint);
    assert!(one_role(&[announced], 1).request_bytes.is_some());
    // Checkpoint seen on rank 0 only, evaluation on rank 1: the role saw both.
    let split = one_role(
        &[
            report(40 * G, 50, &["checkpoint"]),
            report(40 * G, 50, &["eval"]),
        ],
        2,
    );
    assert!(split.request_bytes.is_some(), "{}", split.reason);
}

#[test]
fn a_job_without_evaluation_or_checkpoints_says_so_by_annotation() {
    assert_eq!(required_phases(None), Ok(Phases::default()));
    let none = required_phases(Some("none")).unwrap();
    assert!(!none.evaluation && !none.checkpoint);
    let ck = required_phases(Some(" checkpoint ")).unwrap();
    assert!(ck.checkpoint && !ck.evaluation);
    let e = required_phases(Some("evaluation,sleep")).unwrap_err();
    assert!(e.to_string().contains("\"sleep\""), "{e}");
    let evs = vec![("worker".to_string(), evidence(&report(40 * G, 9, &[])))];
    let out = recommend(
        &evs,
        JobFacts {
            ranks: 1,
            phases: none,
        },
    );
    assert!(out[0].request_bytes.is_some(), "{}", out[0].reason);
    assert!(out[0].basis.phases_required.is_empty());
}

#[test]
fn a_rank_without_the_agent_adds_no_peak_and_alone_gives_no_request() {
    let nvml_only = MemoryReportSpec {
        gpus: vec![GpuReport {
            total_bytes: 80 * G,
            peak_bytes: 70 * G,
            ..Default::default()
        }],
        ..Default::default()
    };
    let alone = one_role(std::slice::from_ref(&nvml_only), 1);
    assert_eq!((alone.request_bytes, alone.peak_bytes), (None, None));
    assert_eq!(alone.basis.source, "none");
    assert!(
        alone.reason.contains("memprof.dev/agent"),
        "{}",
        alone.reason
    );
    let mixed = one_role(&[nvml_only, seen(40 * G)], 2);
    assert_eq!(mixed.peak_bytes, Some(40 * G), "NVML's 70 GiB never counts");
    assert_eq!((mixed.basis.ranks, mixed.basis.ranks_measured), (2, 1));
}

#[test]
fn the_margin_covers_the_spread_across_ranks_and_a_peak_still_rising() {
    let r = one_role(&[seen(40 * G), seen(40 * G), seen(46 * G)], 3);
    assert_eq!(r.peak_bytes, Some(46 * G));
    assert_eq!(r.margin_bytes, 6 * G, "highest less the median");
    let mut rising = seen(40 * G);
    let point = |r| FragmentationPoint {
        reserved_bytes: r,
        ..Default::default()
    };
    rising.allocator.as_mut().unwrap().fragmentation_trend =
        vec![point(30 * G), point(32 * G), point(36 * G), point(40 * G)];
    let ev = evidence(&rising);
    assert_eq!((ev.late_growth, ev.samples), (8 * G, 4));
    assert_eq!(one_role(&[rising], 1).margin_bytes, 8 * G);
}

#[test]
fn roles_are_recommended_apart_and_bounded() {
    let evs: Vec<_> = (0..12)
        .map(|i| (format!("role{i:02}"), evidence(&seen((10 + i) * G))))
        .collect();
    let out = recommend(
        &evs,
        JobFacts {
            ranks: 12,
            phases: Phases::default(),
        },
    );
    assert_eq!(out.len(), MAX_RECOMMENDED_ROLES);
    assert_eq!(out[0].role, "role00");
    assert_eq!(out[1].peak_bytes, Some(11 * G));
}

/// Each role of a workload waits for its own phases: a driver that never
/// evaluates gets its request from training steps while the workers still
/// wait for their evaluation; NCCL's buffers count for the whole workload.
#[test]
fn each_role_waits_for_the_phases_it_requires() {
    let evs = vec![
        (
            "driver".to_string(),
            evidence(&report(2 * G, 10, &["forward"])),
        ),
        (
            "workers".to_string(),
            evidence(&report(20 * G, 10, &["forward"])),
        ),
    ];
    let none = Phases {
        evaluation: false,
        checkpoint: false,
    };
    let phases_of = |role: &str| match role {
        "driver" => none,
        _ => Phases::default(),
    };
    let out = recommend_roles(&evs, 3, phases_of);
    assert_eq!(out.len(), 2);
    let (driver, workers) = (&out[0], &out[1]);
    assert_eq!(driver.role, "driver");
    assert!(driver.request_bytes.is_some(), "{driver:?}");
    assert!(driver.basis.phases_required.is_empty());
    assert_eq!(workers.request_bytes, None, "{workers:?}");
    assert!(workers.reason.contains("no evaluation phase yet"));
    assert_eq!(workers.basis.phases_required.len(), 2);
    assert_eq!(driver.context_bytes, CONTEXT_BYTES + NCCL_BYTES, "3 ranks");
}

/// A peak that creeps up by 1 MiB per report over 1,000 reports, and then
/// wobbles at a step's edge, changes what is written a bounded number of
/// times: once per 128 MiB step risen, never on a wobble.
#[test]
fn the_recommendation_is_rewritten_only_when_it_moves_by_a_step() {
    let mut written: Vec<RoleRecommendation> = vec![];
    let writes = std::cell::Cell::new(0);
    let mut step = |reserved: u64| {
        let next = settle(&written, vec![one_role(&[seen(reserved)], 1)]);
        if next != written {
            writes.set(writes.get() + 1);
            written = next;
        }
        written[0].request_bytes.unwrap()
    };
    let start = 40 * G;
    for i in 0..1000 {
        step(start + i * M);
    }
    // 1,000 MiB of growth (the 2 % floor grows with it): at most 9 steps of 128 MiB, plus the first.
    assert!(writes.get() <= 10, "{} writes", writes.get());
    let before = writes.get();
    let top = step(start + 1000 * M);
    for i in 0..200 {
        // ±100 MiB around the top: falls within a step are held.
        let r = step(start + 1000 * M - (i % 2) * 100 * M);
        assert!(r >= top);
    }
    let wobbling = writes.get() - before;
    assert!(wobbling <= 1, "{wobbling} writes while wobbling");
    // A fall of more than a step is written.
    let low = step(start);
    assert!(low < top);
    // A rise is written at once, however small past the step.
    let held = vec![one_role(&[seen(start)], 1)];
    let up = settle(&held, vec![one_role(&[seen(start + 200 * M)], 1)]);
    assert!(up[0].request_bytes > held[0].request_bytes);
}

#[test]
fn phases_newly_seen_are_written_even_at_the_same_request() {
    let before = vec![one_role(&[report(40 * G, 50, &["forward"])], 1)];
    assert_eq!(before[0].request_bytes, None);
    let same = settle(
        &before,
        vec![one_role(&[report(40 * G, 51, &["forward"])], 1)],
    );
    assert_eq!(same, before, "only the step count moved: nothing to write");
    let after = settle(
        &before,
        vec![one_role(&[report(40 * G, 52, &["forward", "eval"])], 1)],
    );
    assert!(after[0].basis.evaluation_seen);
}

/// The constants are the measured ones (bench/estimate/calibration.json).
#[test]
fn the_context_constants_are_the_calibrated_ones() {
    let cal: serde_json::Value =
        serde_json::from_str(include_str!("../../../../bench/estimate/calibration.json")).unwrap();
    assert_eq!(cal["constants"]["contextBytes"], CONTEXT_BYTES);
    assert_eq!(cal["constants"]["ncclBytes"], NCCL_BYTES);
}

/// The report of a GPU check's uncapped run `m` (bench/gpu/recommend_cap.py's
/// measure): its reserved and allocated peaks, the reserved after each of
/// its steps as the fragmentation trend, both phases seen.
fn measured_spec(m: &serde_json::Value) -> MemoryReportSpec {
    let n = |v: &serde_json::Value| v.as_u64().unwrap();
    let trend = m["reservedAfterStep"].as_array().unwrap();
    let mut spec = report(
        n(&m["reserved"]),
        trend.len() as u64,
        &["evaluation", "checkpoint"],
    );
    let a = spec.allocator.as_mut().unwrap();
    a.peak_allocated_bytes = Some(n(&m["allocated"]));
    a.fragmentation_trend = trend
        .iter()
        .map(|r| FragmentationPoint {
            reserved_bytes: n(r),
            ..Default::default()
        })
        .collect();
    spec.gpus[0].total_bytes = n(&m["deviceTotal"]);
    spec
}

/// The GPU check (bench/gpu/recommend_cap.py, docs/gpu/recommend-cap-h200.json)
/// computed each request with a copy of this formula in Python: the same
/// evidence, given to `recommend`, gives the same request, so the runs
/// capped there were capped at what the operator would recommend.
#[test]
fn the_gpu_checks_requests_are_what_recommend_gives() {
    let doc: serde_json::Value =
        serde_json::from_str(include_str!("../../../../docs/gpu/recommend-cap-h200.json")).unwrap();
    let rows = doc["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 4);
    for row in rows {
        let n = |v: &serde_json::Value| v.as_u64().unwrap();
        let r = one_role(&[measured_spec(&row["measured"])], 1);
        assert_eq!(
            r.request_bytes,
            Some(n(&row["requestBytes"])),
            "{}",
            row["name"]
        );
        assert_eq!(r.margin_bytes, n(&row["marginBytes"]), "{}", row["name"]);
    }
}

/// A cache the trainer holds beyond its live segments is not needed: a
/// capped allocator gives it back and retries. The need is the smaller of
/// the reserved peak and the allocated + inactive split peaks.
#[test]
fn a_cache_beyond_the_live_segments_is_not_needed() {
    let with_split = |split: Option<u64>| {
        let mut spec = seen(20 * G);
        let a = spec.allocator.as_mut().unwrap();
        a.peak_allocated_bytes = Some(10 * G);
        a.peak_inactive_split_bytes = split;
        one_role(&[spec], 1)
    };
    let cnn = with_split(Some(G));
    assert_eq!(cnn.peak_bytes, Some(11 * G), "allocated 10 + split 1");
    assert_eq!(cnn.basis.source, "allocatorHeld");
    let old_agent = with_split(None);
    assert_eq!(old_agent.peak_bytes, Some(20 * G), "no split peak told");
    assert_eq!(old_agent.basis.source, "allocatorReserved");
    let lm = with_split(Some(12 * G));
    assert_eq!(
        lm.peak_bytes,
        Some(20 * G),
        "the reserved peak is the smaller"
    );
    assert_eq!(lm.basis.source, "allocatorHeld");
    assert!(cnn.request_bytes.unwrap() < old_agent.request_bytes.unwrap());
}

/// A role is `allocatorHeld` only when every measured rank told its split
/// peak: one rank judged by its reserved peak alone says so.
#[test]
fn one_rank_without_a_split_peak_makes_the_role_reserved_based() {
    let mut told = seen(20 * G);
    told.allocator.as_mut().unwrap().peak_inactive_split_bytes = Some(G);
    let r = one_role(&[told.clone(), seen(20 * G)], 2);
    assert_eq!(r.basis.source, "allocatorReserved");
    assert_eq!(one_role(&[told], 1).basis.source, "allocatorHeld");
}

/// The GPU check of the need (bench/gpu/recommend_need.py,
/// docs/gpu/recommend-need-h200.json) computed each `least-of` request with
/// a copy of this formula in Python: the same evidence, given to
/// `recommend`, gives the same request, so the runs capped there were
/// capped at what the operator recommends.
#[test]
fn the_need_checks_requests_are_what_recommend_gives() {
    let doc: serde_json::Value = serde_json::from_str(include_str!(
        "../../../../docs/gpu/recommend-need-h200.json"
    ))
    .unwrap();
    let rows = doc["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 14);
    let n = |v: &serde_json::Value| v.as_u64().unwrap();
    for row in rows {
        let m = &row["measured"];
        let mut spec = measured_spec(m);
        let a = spec.allocator.as_mut().unwrap();
        a.peak_inactive_split_bytes = Some(n(&m["inactiveSplitPeak"]));
        let r = one_role(&[spec], 1);
        let checked = &row["least-of"];
        assert_eq!(
            r.request_bytes,
            Some(n(&checked["requestBytes"])),
            "{}",
            row["name"]
        );
        assert_eq!(
            r.peak_bytes,
            Some(n(&checked["needBytes"])),
            "{}",
            row["name"]
        );
        assert_eq!(
            checked["at"], 0,
            "{}: capped at the request, it completed",
            row["name"]
        );
    }
}

/// The multi-rank need check (bench/gpu/recommend_need_ranks.py) computes
/// the request of one role of several ranks with a copy of this formula
/// (each rank's need the smaller of its two bounds, the highest of them,
/// NCCL's buffers beside the context, the spread across the ranks and the
/// late growth in the margin). Checked on its fixture of evidence no GPU
/// measured, one row per term (regenerated with the command it names).
#[test]
fn the_rank_need_checks_formula_is_what_recommend_gives() {
    let doc: serde_json::Value = serde_json::from_str(include_str!(
        "../../../../bench/gpu/recommend_need_ranks.mirror.json"
    ))
    .unwrap();
    assert_eq!(role_requests_mirrored(&doc), 5);
}

/// The need check on DDP and FSDP2 ranks (bench/gpu/recommend_need_ranks.py,
/// docs/gpu/recommend-need-ranks-h200.json: 2 ranks on 2 H200s) capped
/// every rank at its role's request as `recommend` gives it from both
/// ranks' evidence, and every rank completed there.
#[test]
fn the_rank_need_checks_requests_are_what_recommend_gives() {
    let doc: serde_json::Value = serde_json::from_str(include_str!(
        "../../../../docs/gpu/recommend-need-ranks-h200.json"
    ))
    .unwrap();
    assert_eq!(role_requests_mirrored(&doc), 5);
    for row in doc["rows"].as_array().unwrap() {
        let Some(at) = row.get("at") else { continue };
        let ranks = at["ranks"].as_array().unwrap();
        assert_eq!(ranks.len(), 2, "{}", row["name"]);
        for (i, rank) in ranks.iter().enumerate() {
            assert!(
                rank.get("allocated").is_some(),
                "{} rank {i}: capped at the request, it completed",
                row["name"]
            );
        }
    }
}

/// Every row of a multi-rank need check (`rows[].measured.ranks[]`, each
/// rank's measured evidence, and the role's request): `recommend`, given
/// every rank's report as one role of the Job's ranks, gives the row's
/// request, need, margin and context. Returns the rows checked.
fn role_requests_mirrored(doc: &serde_json::Value) -> usize {
    let n = |v: &serde_json::Value| v.as_u64().unwrap();
    let rows: Vec<_> = doc["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|row| row.get("requestBytes").is_some())
        .collect();
    for row in &rows {
        let specs: Vec<_> = row["measured"]["ranks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                let mut spec = measured_spec(m);
                let a = spec.allocator.as_mut().unwrap();
                a.peak_inactive_split_bytes = Some(n(&m["inactiveSplitPeak"]));
                spec
            })
            .collect();
        let r = one_role(&specs, specs.len() as u32);
        let name = &row["name"];
        assert_eq!(r.request_bytes, Some(n(&row["requestBytes"])), "{name}");
        assert_eq!(r.peak_bytes, Some(n(&row["needBytes"])), "{name}");
        assert_eq!(r.margin_bytes, n(&row["marginBytes"]), "{name}");
        assert_eq!(r.context_bytes, n(&row["contextBytes"]), "{name}");
    }
    rows.len()
}

/// Through the real parts (bench/gpu/recommend_through.py,
/// docs/gpu/recommend-through-h200/): each workload trained with the agent
/// pushing to a real `memprof-sidecar`, whose final report is kept. The
/// request the script capped at (its copy of this formula, on the report)
/// is what `recommend` gives for that report, and the run capped there
/// completed.
#[test]
fn the_reports_requests_are_what_recommend_gives() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../docs/gpu/recommend-through-h200");
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&read("through.json")).unwrap();
    let rows = doc["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 10);
    for row in rows {
        let name = row["name"].as_str().unwrap();
        let spec: MemoryReportSpec =
            serde_json::from_str(&read(&format!("{name}.report.json"))).unwrap();
        assert!(
            spec.allocator
                .as_ref()
                .unwrap()
                .peak_inactive_split_bytes
                .is_some(),
            "{name}: the agent pushed its split peak through the sidecar"
        );
        let facts = JobFacts {
            ranks: 1,
            phases: required_phases(Some("none")).unwrap(),
        };
        let r = recommend(&[("worker".to_string(), evidence(&spec))], facts).remove(0);
        assert_eq!(r.basis.source, "allocatorHeld", "{name}");
        assert_eq!(r.request_bytes, row["requestBytes"].as_u64(), "{name}");
        assert_eq!(row["at"], 0, "{name}: capped at the request, it completed");
    }
}

/// A waiting recommendation written while one rank of the role had
/// reported is written again once the other has: the basis names the ranks
/// that count, not those that had when it was first written.
#[test]
fn a_waiting_recommendation_is_written_again_when_a_rank_reports() {
    let first = report(20 * G, 10, &["forward"]);
    let written = settle(&[], vec![one_role(std::slice::from_ref(&first), 2)]);
    assert_eq!(written[0].request_bytes, None);
    assert_eq!(written[0].basis.ranks, 1);
    let both = vec![one_role(&[first, report(22 * G, 10, &["forward"])], 2)];
    let next = settle(&written, both);
    assert_eq!(next[0].basis.ranks, 2, "{next:?}");
    assert_eq!(next[0].peak_bytes, Some(22 * G));
}
