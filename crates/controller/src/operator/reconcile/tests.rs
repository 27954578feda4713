//! The pure reconcile decisions on plain values: profiles, slim Jobs, the
//! desired status (roll-up, conditions, carried-over fields) and its Events.

use super::*;
use k8s_openapi::api::batch::v1::JobSpec;
use memprof_api::{
    DataSource, GpuReport, RiskLevel, ANNOTATION_BOTTLENECK, ANNOTATION_IMBALANCE,
    ANNOTATION_OOM_RISK, ANNOTATION_TIME_TO_OOM,
};
use std::collections::BTreeSet;

/// The newest report of `four_ranks` was sampled then.
const NOW: &str = "2026-11-22T10:00:03Z";

#[test]
fn reports_left_out_by_screening_are_named_and_counted_in_conditions() {
    let screening = Screening {
        refused: vec![Rejected {
            name: "forged".into(),
            why: "pod forged does not exist".into(),
        }],
        superseded: 2,
        over_limit: 0,
    };
    let st = desired_status(&[], Some(4), None, NOW, &screening).status;
    let cond = |t: &str| st.conditions.iter().find(|c| c.type_ == t).unwrap().clone();
    let valid = cond(CONDITION_REPORTS_VALID);
    assert!(!valid.is_true() && valid.message.contains("forged (pod forged does not exist)"));
    let counted = cond(CONDITION_REPORTS_COUNTED);
    assert_eq!(
        (counted.status.as_str(), counted.reason.as_str()),
        ("False", "Superseded")
    );
    assert!(
        counted.message.starts_with("2 report(s)"),
        "{}",
        counted.message
    );
    let all = desired_status(&[], Some(4), None, NOW, &Screening::default()).status;
    assert!(all
        .conditions
        .iter()
        .all(|c| c.type_ != CONDITION_REPORTS_COUNTED || c.is_true()));
}

#[test]
fn the_cached_job_keeps_only_what_the_operator_reads() {
    let mut job: Job = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "train", "uid": "u1", "labels": {"team": "ml"},
            "annotations": {
                "memprof.dev/enabled": "true",
                "kubectl.kubernetes.io/last-applied-configuration": "x".repeat(100_000),
            },
            "managedFields": [{"manager": "kubectl"}]},
        "spec": {"parallelism": 4, "template": {"spec": {
            "serviceAccountName": "trainer",
            "containers": [
                {"name": "t", "image": "busybox", "args": ["y".repeat(100_000)],
                 "env": [{"name": "SECRET", "value": "z".repeat(100_000)},
                         {"name": "BATCH_SIZE", "value": "64"}]},
                {"name": "u", "image": "busybox",
                 "env": [{"name": "BATCH_SIZE", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]},
                {"name": "sidecar", "image": "busybox"},
            ]}}},
        "status": {"active": 4},
    }))
    .unwrap();
    slim_job(&mut job);
    assert!(profiling_enabled(&job));
    assert_eq!(expected_ranks(&job), 4);
    assert_eq!(job.labels()["team"], "ml");
    assert_eq!(job.annotations().len(), 1, "only memprof.dev/* annotations");
    let spec = job.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    assert_eq!(spec.service_account_name.as_deref(), Some("trainer"));
    // Of the containers, only the batch env var's literal value (the batch fit reads it).
    let kept = serde_json::to_value(&spec.containers).unwrap();
    assert_eq!(
        kept,
        serde_json::json!([{"name": "t", "env": [{"name": "BATCH_SIZE", "value": "64"}]}])
    );
    assert_eq!(batch_of(&job), Some(64));
    assert!(job.metadata.managed_fields.is_none() && job.status.is_none());
    assert!(serde_json::to_string(&job).unwrap().len() < 1024);
}

#[test]
fn the_batch_env_is_named_by_annotation_and_peaks_survive_a_new_batch() {
    use memprof_analysis::batchfit;
    let mut j = job(&[(batchfit::ANNOTATION_BATCH_ENV, "MICRO_BATCH")], Some(1));
    j.spec.as_mut().unwrap().template.spec = Some(
        serde_json::from_value(serde_json::json!({
            "containers": [{"name": "t", "env": [
                {"name": "BATCH_SIZE", "value": "8"}, {"name": "MICRO_BATCH", "value": "48"}]}]
        }))
        .unwrap(),
    );
    slim_job(&mut j);
    assert_eq!(
        (batch_env(&j).as_str(), batch_of(&j)),
        ("MICRO_BATCH", Some(48))
    );

    // The profile remembers batch 64's peak from before memprof recreated the Job at 48.
    let previous = MemoryProfileStatus {
        batch_recommendation: Some(memprof_api::BatchRecommendation {
            observations: batchfit::observe(&[], Some(64), 79 * G, 80 * G),
            ..Default::default()
        }),
        ..Default::default()
    };
    let specs = vec![("r0".to_string(), report(0, 76, RiskLevel::High, None))];
    let mut st = desired_status(
        &named(&specs),
        Some(1),
        Some(&previous),
        "t",
        &Screening::default(),
    )
    .status;
    with_batch_fit(&mut st, &j, Some(&previous));
    let rec = st.batch_recommendation.unwrap();
    assert_eq!(
        rec.observations
            .iter()
            .map(|o| (o.batch, o.peak_bytes / G))
            .collect::<Vec<_>>(),
        vec![(64, 79), (48, 76)]
    );
    assert_eq!(
        rec.method,
        batchfit::METHOD_TWO_BATCH_SIZES,
        "{}",
        rec.reason
    );
    assert_eq!(
        (rec.env_var.as_str(), rec.current),
        ("MICRO_BATCH", Some(48))
    );
    // 3 GiB over 16 samples: 0.1875 GiB/sample, static 76 - 48 × 0.1875 = 67 GiB;
    // (72 - 67) / 0.1875 = 26.67, but two batches back only 48..64.
    assert_eq!(rec.recommended, None, "{}", rec.reason);
    assert!(rec.unbacked.is_some_and(|u| u <= 26), "{}", rec.reason);
    // Without the earlier peak there is one batch size only: too little evidence.
    let mut alone =
        desired_status(&named(&specs), Some(1), None, NOW, &Screening::default()).status;
    with_batch_fit(&mut alone, &j, None);
    assert_eq!(
        alone.batch_recommendation.unwrap().method,
        batchfit::METHOD_INSUFFICIENT
    );
}

/// A rank with two GPUs: GPU 0 on a slow trend at 60 % (medium, listed in
/// `topRanks` as the riskiest), GPU 1 flat at 85 % (low). The batch
/// observation is the fullest GPU's peak, 68 GiB, not the riskiest's 48.
#[test]
fn the_batch_observation_is_the_fullest_gpus_peak_not_the_riskiest() {
    let mut spec = report(0, 48, RiskLevel::Medium, Some(3000.0));
    let mut flat = spec.gpus[0].clone();
    flat.index = 1;
    flat.uuid = "GPU-flat".into();
    flat.peak_bytes = 68 * G;
    flat.used_bytes = 68 * G;
    flat.risk = RiskLevel::Low;
    flat.time_to_oom_seconds = None;
    spec.gpus.push(flat);
    let j: Job = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "train", "namespace": "ml", "uid": "u"},
        "spec": {"template": {"spec": {"containers": [
            {"name": "t", "image": "i", "env": [{"name": "BATCH_SIZE", "value": "32"}]}]}}}}))
    .unwrap();
    let specs = vec![("r0".to_string(), spec)];
    let mut st = desired_status(&named(&specs), Some(1), None, NOW, &Screening::default()).status;
    assert_eq!(
        st.top_ranks[0].peak_bytes,
        48 * G,
        "the line is the riskiest GPU's"
    );
    with_batch_fit(&mut st, &j, None);
    let rec = st.batch_recommendation.unwrap();
    assert_eq!(
        rec.observations
            .iter()
            .map(|o| (o.batch, o.peak_bytes / G))
            .collect::<Vec<_>>(),
        vec![(32, 68)]
    );
}

const G: u64 = 1 << 30;

fn report(rank: u32, peak_gib: u64, risk: RiskLevel, tto: Option<f64>) -> MemoryReportSpec {
    MemoryReportSpec {
        pod_name: format!("train-{rank}"),
        node_name: Some(format!("node-{rank}")),
        rank: Some(rank),
        sampled_at: format!("2026-11-22T10:00:0{rank}Z"),
        interval_ms: 1000,
        gpus: vec![GpuReport {
            uuid: format!("GPU-{rank}"),
            total_bytes: 80 * G,
            used_bytes: peak_gib * G,
            peak_bytes: peak_gib * G,
            risk,
            time_to_oom_seconds: tto,
            confidence: 0.9,
            source: DataSource::Sim,
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn four_ranks() -> Vec<(String, MemoryReportSpec)> {
    vec![
        ("r0".into(), report(0, 40, RiskLevel::Low, None)),
        ("r1".into(), report(1, 40, RiskLevel::Low, None)),
        ("r2".into(), report(2, 60, RiskLevel::Low, None)),
        ("r3".into(), report(3, 50, RiskLevel::High, Some(260.0))),
    ]
}

fn named(specs: &[(String, MemoryReportSpec)]) -> Vec<NamedReport<'_>> {
    specs
        .iter()
        .map(|(name, spec)| NamedReport { name, spec })
        .collect()
}

fn job(annotations: &[(&str, &str)], parallelism: Option<i32>) -> Job {
    let mut job = Job {
        spec: Some(JobSpec {
            parallelism,
            ..Default::default()
        }),
        ..Default::default()
    };
    job.metadata.annotations = Some(
        annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    job
}

#[test]
fn only_jobs_annotated_true_are_profiled() {
    assert!(profiling_enabled(&job(
        &[(ANNOTATION_ENABLED, "true")],
        None
    )));
    assert!(!profiling_enabled(&job(
        &[(ANNOTATION_ENABLED, "yes")],
        None
    )));
    assert!(!profiling_enabled(&job(&[], None)));
    assert_eq!(expected_ranks(&job(&[], Some(256))), 256);
    assert_eq!(expected_ranks(&job(&[], None)), 1);
}

#[test]
fn profile_is_owned_by_its_job_and_adopts_nothing_stale() {
    let j = job(&[(ANNOTATION_ENABLED, "true")], Some(4));
    let p = profile_for_job(&j, "ns", "train", "uid-1");
    let owner = &p.owner_references()[0];
    assert_eq!((owner.kind.as_str(), owner.uid.as_str()), ("Job", "uid-1"));
    assert_eq!(owner.block_owner_deletion, Some(true));
    assert_eq!(p.spec.expected_ranks, Some(4));
    assert!(profile_outdated(None, &p));
    assert!(!profile_outdated(Some(&p), &p));
    let mut scaled = p.clone();
    scaled.spec.expected_ranks = Some(8);
    assert!(profile_outdated(Some(&scaled), &p));
    assert_eq!(earlier_jobs_profile(&p, "train", "uid-1", None), None);
    assert_eq!(
        earlier_jobs_profile(&p, "train", "uid-2", None),
        Some(Succession::Stranger)
    );
}

/// An earlier Job's profile passes to the new Job only where memprof's own
/// record names the new Job's uid as the one it created; nothing a tenant
/// writes on the new Job (an annotation with a record's id, its nonce)
/// enters the decision.
#[test]
fn only_memprof_s_record_of_the_replacement_keeps_an_earlier_job_s_profile() {
    let j = job(&[(ANNOTATION_ENABLED, "true")], Some(1));
    let mut p = profile_for_job(&j, "ns", "train", "uid-1");
    let record = |old: &str, new: &str| memprof_api::RemediationRecord {
        phase: "Done".into(),
        job_uid: Some(old.into()),
        job_deleted: true,
        env_change: Some("recreate".into()),
        replacement_uid: Some(new.into()),
        ..Default::default()
    };
    let history = MemoryProfileStatus {
        remediations: vec![record("uid-0", "uid-1"), record("uid-1", "uid-2")],
        ..Default::default()
    };
    p.status = Some(history.clone());
    let heir = Some(Succession::Heir);
    assert_eq!(earlier_jobs_profile(&p, "train", "uid-2", None), heir);
    let stranger = Some(Succession::Stranger);
    assert_eq!(earlier_jobs_profile(&p, "train", "uid-3", None), stranger);
    p.status = None;
    assert_eq!(earlier_jobs_profile(&p, "train", "uid-2", None), stranger);
    // The record written, the cache not caught up yet: the writer's status.
    assert_eq!(
        earlier_jobs_profile(&p, "train", "uid-2", Some(&history)),
        heir
    );
    // Under way in either: wait.
    let mut pending = record("uid-1", "");
    pending.phase = "Pending".into();
    pending.replacement_uid = None;
    let under_way = MemoryProfileStatus {
        remediations: vec![pending],
        ..Default::default()
    };
    assert_eq!(
        earlier_jobs_profile(&p, "train", "uid-2", Some(&under_way)),
        Some(Succession::Pending)
    );
}

/// `kubectl get mprof -l team=ml` selects the profiles of Jobs labelled
/// so: a profile carries its Job's labels, bounded, without memprof's or
/// the Job controller's, and a label the Job gains makes the profile
/// outdated (so it is applied again).
#[test]
fn a_profile_carries_its_jobs_labels_bounded() {
    let mut j = job(&[(ANNOTATION_ENABLED, "true")], Some(2));
    let mut labels: BTreeMap<String, String> = (0..40)
        .map(|i| (format!("k{i:02}"), format!("v{i}")))
        .collect();
    labels.insert("team".into(), "ml".into());
    labels.insert("job-name".into(), "train".into());
    labels.insert("controller-uid".into(), "uid-1".into());
    labels.insert("memprof.dev/job".into(), "forged".into());
    j.metadata.labels = Some(labels);
    let p = profile_for_job(&j, "ns", "train", "uid-1");
    let got = p.labels();
    assert_eq!(
        got.get("memprof.dev/job").map(String::as_str),
        Some("train")
    );
    assert!(!got.contains_key("job-name") && !got.contains_key("controller-uid"));
    // The Job's labels, bounded, then memprof's two: the Job and the KIND column's.
    assert_eq!(
        got.get("memprof.dev/workload-kind").map(String::as_str),
        Some("Job")
    );
    assert_eq!(got.len(), MAX_WORKLOAD_LABELS + 2, "{got:?}");
    let mut few = job(&[(ANNOTATION_ENABLED, "true")], Some(2));
    few.metadata.labels = Some(BTreeMap::from([("team".to_string(), "ml".to_string())]));
    let before = profile_for_job(&few, "ns", "train", "uid-1");
    assert_eq!(before.labels().get("team").map(String::as_str), Some("ml"));
    few.labels_mut().insert("stage".into(), "pretrain".into());
    let after = profile_for_job(&few, "ns", "train", "uid-1");
    assert!(profile_outdated(Some(&before), &after));
}

#[test]
fn status_rolls_up_and_carries_over_what_others_wrote() {
    let specs = four_ranks();
    let previous = MemoryProfileStatus {
        last_action: Some("scaleBatch BATCH_SIZE 32->24".into()),
        oom_count: Some(3),
        ..Default::default()
    };
    let d = desired_status(
        &named(&specs),
        Some(4),
        Some(&previous),
        NOW,
        &Screening::default(),
    );
    let st = &d.status;
    assert_eq!((st.ranks.as_str(), st.risk), ("4/4", RiskLevel::High));
    assert_eq!(st.time_to_oom.as_deref(), Some("4m20s"));
    assert_eq!(st.imbalance_display.as_deref(), Some("1.26"));
    assert_eq!(st.last_action, previous.last_action);
    assert_eq!(st.oom_count, Some(3), "the remediation stage's count");
    assert!(d.rejected.is_empty());
    let ready = &st.conditions[0];
    assert_eq!((ready.type_.as_str(), ready.is_true()), ("Ready", true));

    let ann = job_annotations(st, &BTreeMap::new());
    assert_eq!(ann[ANNOTATION_OOM_RISK], "high");
    assert_eq!(ann[ANNOTATION_TIME_TO_OOM], "4m");
    assert_eq!(ann[ANNOTATION_IMBALANCE], "1.3");
    assert_eq!(
        ann[ANNOTATION_BOTTLENECK],
        "rank=3 pod=train-3 node=node-3 gpu=0"
    );
}

#[test]
fn same_reports_in_any_order_give_the_same_status() {
    let specs = four_ranks();
    let first = desired_status(&named(&specs), Some(4), None, NOW, &Screening::default()).status;
    let mut reversed = named(&specs);
    reversed.reverse();
    let again = desired_status(&reversed, Some(4), Some(&first), NOW, &Screening::default()).status;
    // Unchanged conditions keep their transition time: nothing to write.
    assert_eq!(first, again);
}

#[test]
fn impossible_report_is_named_and_changes_nothing_else() {
    let mut specs = four_ranks();
    let before = desired_status(&named(&specs), Some(4), None, NOW, &Screening::default()).status;
    let mut bad = report(4, 10, RiskLevel::Critical, Some(1.0));
    bad.gpus[0].used_bytes = 90 * G;
    specs.push(("train-4-report".into(), bad));
    let d = desired_status(
        &named(&specs),
        Some(4),
        Some(&before),
        NOW,
        &Screening::default(),
    );
    assert_eq!(d.rejected.len(), 1);
    let cond = d
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == CONDITION_REPORTS_VALID)
        .unwrap();
    assert!(!cond.is_true());
    assert!(cond.message.contains("train-4-report (gpu 0: usedBytes"));
    let strip = |s: &MemoryProfileStatus| MemoryProfileStatus {
        conditions: vec![],
        ..s.clone()
    };
    assert_eq!(strip(&d.status), strip(&before));
    assert_eq!(
        rejected_in(Some(&d.status)),
        BTreeSet::from(["train-4-report".to_string()])
    );
}

#[test]
fn rejected_names_survive_a_restart_and_stay_bounded() {
    let rejected: Vec<_> = (0..40)
        .map(|i| Rejected {
            name: format!("job-with-a-rather-long-name-{i}-report"),
            why: format!("gpu 0: usedBytes {i}; exceeds totalBytes 0"),
        })
        .collect();
    let cond = conditions::reports_valid(&rejected);
    assert!(cond.message.len() <= 1024);
    assert!(cond.message.ends_with("more"));
    let status = MemoryProfileStatus {
        conditions: vec![cond],
        ..Default::default()
    };
    let announced = rejected_in(Some(&status));
    assert!(announced.len() >= 4 && announced.len() <= conditions::MAX_NAMED_REJECTIONS);
    assert!(announced.contains("job-with-a-rather-long-name-0-report"));
    let fresh = newly_rejected(&rejected, &announced);
    assert_eq!(fresh.len(), rejected.len() - announced.len());
}

#[test]
fn risk_events_only_on_transitions() {
    let specs = four_ranks();
    let st = desired_status(&named(&specs), Some(4), None, NOW, &Screening::default()).status;
    let raised = risk_event(RiskLevel::None, &st).unwrap();
    assert_eq!((raised.reason, raised.warning), ("RiskHigh", true));
    assert!(raised.note.contains("time to OOM 4m20s"));
    assert!(raised.note.contains("bottleneck rank=3 pod=train-3"));
    assert_eq!(risk_event(RiskLevel::High, &st), None);
    let lowered = risk_event(RiskLevel::Critical, &st).unwrap();
    assert_eq!(
        (lowered.reason, lowered.warning),
        ("RiskLoweredToHigh", false)
    );
}

fn at(s: i64) -> jiff::Timestamp {
    jiff::Timestamp::from_second(1_800_000_000 + s).unwrap()
}

fn sampled(rank: u32, risk: RiskLevel, tto: Option<f64>, t: i64) -> MemoryReportSpec {
    MemoryReportSpec {
        sampled_at: at(t).to_string(),
        ..report(rank, 40, risk, tto)
    }
}

fn condition<'a>(st: &'a MemoryProfileStatus, t: &str) -> &'a memprof_api::Condition {
    st.conditions.iter().find(|c| c.type_ == t).unwrap()
}

#[test]
fn a_dead_sidecar_goes_stale_and_its_critical_verdict_stays() {
    // Two ranks; rank 0's sidecar dies at 0 s carrying a
    // critical verdict, rank 1 keeps its 60 s heartbeat.
    let mut r = JobRollup::new(Some(2), RollupLimits::default());
    r.upsert("train-0", &sampled(0, RiskLevel::Critical, Some(300.0), 0));
    for t in [0, 60, 120, 180] {
        r.upsert("train-1", &sampled(1, RiskLevel::Low, None, t));
    }
    // Two heartbeats plus 30 s: fresh at 150 s, stale just after.
    let fresh = desired_status_from(&r, &[], None, at(150)).status;
    assert_eq!((fresh.ranks.as_str(), fresh.ranks_stale), ("2/2", 0));
    assert!(condition(&fresh, CONDITION_READY).is_true());
    assert_eq!(
        r.next_change(at(100)),
        Some(at(150) + jiff::SignedDuration::from_nanos(1))
    );

    let st = desired_status_from(&r, &[], Some(&fresh), at(181)).status;
    assert_eq!(
        (st.ranks.as_str(), st.ranks_reporting, st.ranks_stale),
        ("1/2 (1 stale)", 1, 1)
    );
    assert_eq!(st.stale_ranks.len(), 1);
    let dead = &st.stale_ranks[0];
    assert_eq!(
        (dead.rank, dead.pod.as_str(), dead.risk),
        (Some(0), "train-0", RiskLevel::Critical)
    );
    assert_eq!(dead.last_report_time, at(0).to_string());
    // Its critical verdict still counts, marked stale, its time to OOM aged.
    assert_eq!(st.risk, RiskLevel::Critical);
    assert!(st.top_ranks[0].stale && !st.top_ranks[1].stale);
    assert_eq!(st.time_to_oom_seconds, Some(119.0));
    let ready = condition(&st, CONDITION_READY);
    assert_eq!(
        (ready.is_true(), ready.reason.as_str()),
        (false, "RanksStale")
    );
    let stale = condition(&st, CONDITION_RANKS_STALE);
    assert!(
        stale.is_true() && stale.message.contains("rank 0 (pod train-0"),
        "{}",
        stale.message
    );
    // Nothing to announce as a risk change; the status write is significant.
    assert_eq!(risk_event(fresh.risk, &st), None);
    let why = status_write_needed(&fresh, &st, Some(std::time::Duration::from_secs(1)));
    assert!(matches!(why, Why::Changed(_)), "{why:?}");
}

#[test]
fn the_time_to_oom_is_the_reports_less_its_age_never_below_zero() {
    // The profile's time to OOM aged between reports.
    let mut r = JobRollup::new(Some(1), RollupLimits::default());
    r.upsert("train-0", &sampled(0, RiskLevel::High, Some(300.0), 0));
    let tto = |t| desired_status_from(&r, &[], None, at(t)).status;
    assert_eq!(tto(0).time_to_oom_seconds, Some(300.0));
    let later = tto(45);
    assert_eq!(later.time_to_oom_seconds, Some(255.0));
    assert_eq!(later.time_to_oom.as_deref(), Some("4m15s"));
    assert_eq!(later.top_ranks[0].time_to_oom_seconds, Some(255.0));
    assert_eq!(tto(400).time_to_oom_seconds, Some(0.0));
}

#[test]
fn a_held_level_survives_a_roll_up_built_afresh() {
    // The compatibility path rolls up from scratch at every reconcile: the
    // hold travels in the status (`riskHeldUntil`).
    let critical = vec![(
        "r0".to_string(),
        MemoryReportSpec {
            sampled_at: "2026-11-22T10:00:00Z".into(),
            ..report(0, 70, RiskLevel::Critical, Some(100.0))
        },
    )];
    let first = desired_status(
        &named(&critical),
        Some(1),
        None,
        "2026-11-22T10:00:00Z",
        &Screening::default(),
    )
    .status;
    assert_eq!(
        (first.risk, first.risk_held_until.as_ref()),
        (RiskLevel::Critical, None)
    );
    // 15 s later its sidecar says high (the dip seen in the issue).
    let high = vec![(
        "r0".to_string(),
        MemoryReportSpec {
            sampled_at: "2026-11-22T10:00:15Z".into(),
            ..report(0, 70, RiskLevel::High, Some(100.0))
        },
    )];
    let held = desired_status(
        &named(&high),
        Some(1),
        Some(&first),
        "2026-11-22T10:00:15Z",
        &Screening::default(),
    )
    .status;
    assert_eq!(held.risk, RiskLevel::Critical);
    assert_eq!(
        held.risk_held_until.as_deref(),
        Some("2026-11-22T10:01:15Z")
    );
    assert_eq!(risk_event(first.risk, &held), None, "no Event while held");
    let still = desired_status(
        &named(&high),
        Some(1),
        Some(&held),
        "2026-11-22T10:01:14Z",
        &Screening::default(),
    )
    .status;
    assert_eq!(still.risk, RiskLevel::Critical);
    let lowered = desired_status(
        &named(&high),
        Some(1),
        Some(&still),
        "2026-11-22T10:01:15Z",
        &Screening::default(),
    )
    .status;
    assert_eq!(
        (lowered.risk, lowered.risk_held_until.as_ref()),
        (RiskLevel::High, None)
    );
    assert_eq!(
        risk_event(still.risk, &lowered).unwrap().reason,
        "RiskLoweredToHigh"
    );
}

#[test]
fn a_profile_carries_its_jobs_family_for_the_admission_webhook() {
    use memprof_api::family::{ANNOTATION_FAMILY, LABEL_FAMILY};
    let j = job(
        &[(ANNOTATION_ENABLED, "true"), (ANNOTATION_FAMILY, "llama")],
        None,
    );
    let p = profile_for_job(&j, "ns", "train", "uid-1");
    assert_eq!(
        p.labels().get(LABEL_FAMILY).map(String::as_str),
        Some("llama")
    );
    let bad = job(
        &[(ANNOTATION_ENABLED, "true"), (ANNOTATION_FAMILY, "a b")],
        None,
    );
    let p = profile_for_job(&bad, "ns", "train", "uid-1");
    assert_eq!(p.labels().get(LABEL_FAMILY), None, "not a label value");
}
