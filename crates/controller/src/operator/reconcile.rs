//! The pure half of the reconcile pipeline: from a Job, its MemoryReports and
//! the profile's previous status to what should be written. No client, no
//! clock (the time for condition transitions comes in as a string), so every
//! decision is unit-tested on plain values; `controller.rs` only fetches from
//! the watch caches and applies what this module returns.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use memprof_analysis::{rollup, validate_report, RollupInput};
use memprof_api::{
    set_condition, truncate_utf8, Condition, GpuLocation, MemoryProfile, MemoryProfileSpec,
    MemoryProfileStatus, MemoryReportSpec, RiskLevel, ANNOTATION_BOTTLENECK, ANNOTATION_ENABLED,
    ANNOTATION_IMBALANCE, ANNOTATION_OOM_RISK, ANNOTATION_TIME_TO_OOM, LABEL_JOB,
};
use std::collections::{BTreeMap, BTreeSet};

/// Condition type: at least one rank has a valid report.
pub const CONDITION_READY: &str = "Ready";
/// Condition type: every report of the job passed validation.
pub const CONDITION_REPORTS_VALID: &str = "ReportsValid";
/// Condition type: every genuine report counted (none superseded by a newer
/// pod of its rank, none beyond what the Job can have).
pub const CONDITION_REPORTS_COUNTED: &str = "ReportsCounted";
/// The annotations the operator writes on a Job, in a stable order.
pub const JOB_ANNOTATIONS: [&str; 4] = [
    ANNOTATION_OOM_RISK,
    ANNOTATION_TIME_TO_OOM,
    ANNOTATION_IMBALANCE,
    ANNOTATION_BOTTLENECK,
];
/// At most this many rejected reports are named in the `ReportsValid` message.
const MAX_NAMED_REJECTIONS: usize = 8;
/// Prefix of the list of rejected reports in the `ReportsValid` message; what
/// follows it is parsed back after a restart (see [`rejected_in`]).
const REJECTED_PREFIX: &str = "fix the sidecar or agent that wrote them: ";

#[path = "reconcile_batch.rs"]
mod batch;
use batch::slim_containers;
pub use batch::{batch_env, batch_of, with_batch_fit};

/// Whether a Job asked to be profiled (`memprof.dev/enabled: "true"`).
pub fn profiling_enabled(job: &Job) -> bool {
    job.annotations()
        .get(ANNOTATION_ENABLED)
        .is_some_and(|v| v == "true")
}

/// What the operator reads of a Job, and nothing more: its memprof
/// annotations, parallelism, the pod template's service account and the
/// literal values of the batch-size env var (for the batch fit: see
/// [`batch_env`]). A tenant's Job can carry up to 1.5 MiB (a huge template, a
/// last-applied-configuration annotation); the cache keeps none of it.
pub fn slim_job(job: &mut Job) {
    job.metadata.managed_fields = None;
    if let Some(a) = job.metadata.annotations.as_mut() {
        a.retain(|k, _| k.starts_with("memprof.dev/"));
    }
    let env = batch_env(job);
    if let Some(spec) = job.spec.as_mut() {
        let pod = spec.template.spec.take().unwrap_or_default();
        spec.template = Default::default();
        let containers = slim_containers(pod.containers, &env);
        if pod.service_account_name.is_some() || !containers.is_empty() {
            spec.template.spec = Some(k8s_openapi::api::core::v1::PodSpec {
                service_account_name: pod.service_account_name,
                containers,
                ..Default::default()
            });
        }
        spec.selector = None;
    }
    job.status = None;
}

/// Ranks a Job expects to report: its parallelism (the API server defaults it to 1).
pub fn expected_ranks(job: &Job) -> u32 {
    let parallelism = job.spec.as_ref().and_then(|s| s.parallelism).unwrap_or(1);
    u32::try_from(parallelism).unwrap_or(0)
}

/// The MemoryProfile a profiled Job should have: same name, owned by the Job
/// so the garbage collector deletes it with the Job. `controller: false`
/// because the Job controller does not manage it; `blockOwnerDeletion` so a
/// foreground deletion of the Job waits for the profile.
pub fn profile_for_job(job: &Job, namespace: &str, name: &str, uid: &str) -> MemoryProfile {
    let mut profile = MemoryProfile::new(
        name,
        MemoryProfileSpec {
            job_name: name.to_string(),
            expected_ranks: Some(expected_ranks(job)),
        },
    );
    profile.metadata.namespace = Some(namespace.to_string());
    profile.metadata.labels = Some(BTreeMap::from([(LABEL_JOB.to_string(), name.to_string())]));
    profile.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "batch/v1".into(),
        kind: "Job".into(),
        name: name.to_string(),
        uid: uid.to_string(),
        controller: Some(false),
        block_owner_deletion: Some(true),
    }]);
    profile
}

/// Whether `existing` lacks something of `desired` (spec, the job label, the
/// owner reference). Fields other writers added are not a difference.
pub fn profile_outdated(existing: Option<&MemoryProfile>, desired: &MemoryProfile) -> bool {
    let Some(existing) = existing else {
        return true;
    };
    let labelled = desired
        .labels()
        .iter()
        .all(|(k, v)| existing.labels().get(k) == Some(v));
    let owned = desired.owner_references().iter().all(|want| {
        existing
            .owner_references()
            .iter()
            .any(|o| o.uid == want.uid)
    });
    existing.spec != desired.spec || !labelled || !owned
}

/// Whether `existing` belongs to an earlier Job of the same name (deleted and
/// recreated before the garbage collector removed its profile): its status
/// describes another run, so it must go rather than be adopted — unless
/// memprof itself recreated the Job (a remediation, annotated
/// `memprof.dev/remediation`): then it is the same workload, and the profile's
/// history (OOMs, remediations) must survive the recreation.
pub fn profile_is_stale(
    existing: &MemoryProfile,
    job_name: &str,
    job_uid: &str,
    recreated_by_memprof: bool,
) -> bool {
    if recreated_by_memprof {
        return false;
    }
    let jobs: Vec<_> = existing
        .owner_references()
        .iter()
        .filter(|o| o.kind == "Job" && o.name == job_name)
        .collect();
    !jobs.is_empty() && jobs.iter().all(|o| o.uid != job_uid)
}

/// A report as the reconcile sees it: its object name and spec.
#[derive(Clone, Copy, Debug)]
pub struct NamedReport<'a> {
    /// `metadata.name` of the MemoryReport.
    pub name: &'a str,
    /// Its spec.
    pub spec: &'a MemoryReportSpec,
}

/// A report the operator ignores, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejected {
    /// `metadata.name` of the MemoryReport.
    pub name: String,
    /// What `validate_report` found.
    pub why: String,
}

/// What screening (`trust.rs`) left out before validation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Screening {
    /// Reports that are not what they claim, by name.
    pub refused: Vec<Rejected>,
    /// Genuine reports of earlier pods of a rank that has a newer pod.
    pub superseded: usize,
    /// Genuine reports beyond what the Job can have.
    pub over_limit: usize,
}

impl Screening {
    /// The screening of `screened`, for the status.
    pub fn of(screened: &super::trust::Screened<'_>) -> Self {
        Screening {
            refused: screened
                .refused
                .iter()
                .map(|r| Rejected {
                    name: r.name.clone(),
                    why: r.why.clone(),
                })
                .collect(),
            superseded: screened.superseded,
            over_limit: screened.over_limit,
        }
    }
}

/// What the profile's status should be.
#[derive(Clone, Debug, PartialEq)]
pub struct DesiredStatus {
    /// The full status, carried-over fields included.
    pub status: MemoryProfileStatus,
    /// Every currently rejected report, by name.
    pub rejected: Vec<Rejected>,
}

/// Builds the status from the job's reports: invalid reports are left out of
/// the roll-up and named in `ReportsValid`; OOMs, remediations, the last
/// action and other writers' conditions are carried over from `previous`.
/// `now` is only used when a condition changes status.
pub fn desired_status(
    reports: &[NamedReport<'_>],
    expected_ranks: Option<u32>,
    previous: Option<&MemoryProfileStatus>,
    now: &str,
    screening: &Screening,
) -> DesiredStatus {
    // Watch caches iterate in hash order; sorting makes ties (equal severity,
    // equal peaks) resolve the same way every time, so an unchanged job never
    // produces a "changed" status.
    let mut sorted: Vec<NamedReport<'_>> = reports.to_vec();
    sorted.sort_by(|a, b| (a.spec.rank, a.name).cmp(&(b.spec.rank, b.name)));

    let mut valid = Vec::with_capacity(sorted.len());
    let mut rejected = screening.refused.clone();
    for r in &sorted {
        match validate_report(r.spec) {
            Ok(()) => valid.push(RollupInput { spec: r.spec }),
            Err(why) => rejected.push(Rejected {
                name: r.name.to_string(),
                why,
            }),
        }
    }

    let mut status = rollup(&valid, expected_ranks);
    if status.peak.is_empty() {
        // A 1.20 API server rejects "" in a required string field (it reports
        // it as null), so "no GPU yet" must be spelled out.
        status.peak = "-".into();
    }
    if let Some(prev) = previous {
        status.ooms = prev.ooms.clone();
        status.remediations = prev.remediations.clone();
        status.remediation_totals = prev.remediation_totals.clone();
        status.last_action = prev.last_action.clone();
        status.conditions = prev.conditions.clone();
    }

    let ready = if valid.is_empty() {
        Condition::new(
            CONDITION_READY,
            false,
            "NoReports",
            "no valid MemoryReport yet: check that the job's pods run and that the \
             memprof sidecar was injected (kubectl get mrep -l memprof.dev/job=<job>)",
        )
    } else {
        Condition::new(
            CONDITION_READY,
            true,
            "Reporting",
            "ranks are reporting GPU memory",
        )
    };
    set_condition(&mut status.conditions, ready, now);
    set_condition(&mut status.conditions, reports_valid(&rejected), now);
    set_condition(&mut status.conditions, reports_counted(screening), now);
    DesiredStatus { status, rejected }
}

fn reports_counted(s: &Screening) -> Condition {
    if s.superseded == 0 && s.over_limit == 0 {
        return Condition::new(
            CONDITION_REPORTS_COUNTED,
            true,
            "OnePerRank",
            "one report per rank, within what the Job can have",
        );
    }
    Condition::new(
        CONDITION_REPORTS_COUNTED,
        false,
        if s.over_limit > 0 {
            "OverLimit"
        } else {
            "Superseded"
        },
        format!(
            "{} report(s) of earlier pods of a rank that has a newer pod and {} beyond \
             twice the Job's parallelism (plus 4) were not counted",
            s.superseded, s.over_limit
        ),
    )
}

fn reports_valid(rejected: &[Rejected]) -> Condition {
    if rejected.is_empty() {
        return Condition::new(
            CONDITION_REPORTS_VALID,
            true,
            "AllValid",
            "every MemoryReport passed validation",
        );
    }
    let mut message = format!(
        "{} MemoryReport(s) ignored; {REJECTED_PREFIX}",
        rejected.len()
    );
    let mut named = 0;
    for r in rejected.iter().take(MAX_NAMED_REJECTIONS) {
        // `;` separates entries; a reason must not fake one.
        let mut why = r.why.replace(';', ",");
        truncate_utf8(&mut why, 96);
        let entry = format!("{}{} ({why})", if named > 0 { "; " } else { "" }, r.name);
        if message.len() + entry.len() > 980 {
            break;
        }
        message.push_str(&entry);
        named += 1;
    }
    if named < rejected.len() {
        message.push_str(&format!("; and {} more", rejected.len() - named));
    }
    Condition::new(CONDITION_REPORTS_VALID, false, "InvalidReports", message)
}

/// Names of the reports a status's `ReportsValid` condition says were
/// rejected: what was already announced with an Event before a restart.
pub fn rejected_in(status: Option<&MemoryProfileStatus>) -> BTreeSet<String> {
    let Some(cond) = status.and_then(|s| {
        s.conditions
            .iter()
            .find(|c| c.type_ == CONDITION_REPORTS_VALID && !c.is_true())
    }) else {
        return BTreeSet::new();
    };
    let Some((_, list)) = cond.message.split_once(REJECTED_PREFIX) else {
        return BTreeSet::new();
    };
    list.split("; ")
        .filter_map(|entry| entry.split_once(" (").map(|(name, _)| name))
        // Object names never contain spaces: "and 3 more" is not a name.
        .filter(|name| !name.is_empty() && !name.contains(char::is_whitespace))
        .map(str::to_string)
        .collect()
}

/// Where a GPU is, for annotations and events: `rank=3 pod=x node=y gpu=0`.
pub fn format_location(loc: &GpuLocation) -> String {
    let rank = loc.rank.map_or_else(|| "-".to_string(), |r| r.to_string());
    let node = loc.node.as_deref().unwrap_or("-");
    format!(
        "rank={rank} pod={} node={node} gpu={}",
        loc.pod, loc.gpu_index
    )
}

/// The annotations the Job should carry for this status.
pub fn job_annotations(status: &MemoryProfileStatus) -> BTreeMap<String, String> {
    let dash = || "-".to_string();
    BTreeMap::from([
        (ANNOTATION_OOM_RISK.into(), status.risk.as_str().into()),
        (
            ANNOTATION_TIME_TO_OOM.into(),
            status.time_to_oom.clone().unwrap_or_else(dash),
        ),
        (
            ANNOTATION_IMBALANCE.into(),
            status.imbalance_display.clone().unwrap_or_else(dash),
        ),
        (
            ANNOTATION_BOTTLENECK.into(),
            status
                .bottleneck
                .as_ref()
                .map_or_else(dash, format_location),
        ),
    ])
}

/// Whether any desired annotation is missing or different on the Job.
pub fn annotations_outdated(
    current: &BTreeMap<String, String>,
    desired: &BTreeMap<String, String>,
) -> bool {
    desired.iter().any(|(k, v)| current.get(k) != Some(v))
}

/// An Event to publish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventPlan {
    /// CamelCase reason: `RiskRaised`, `RiskLowered`, `ReportRejected`.
    pub reason: &'static str,
    /// Warning rather than Normal.
    pub warning: bool,
    /// The sentence shown by `kubectl describe` (at most 1 KiB).
    pub note: String,
}

/// The Event for a change of the job's risk level, if it changed.
pub fn risk_event(previous: RiskLevel, status: &MemoryProfileStatus) -> Option<EventPlan> {
    let reason = match status.risk.cmp(&previous) {
        std::cmp::Ordering::Greater => "RiskRaised",
        std::cmp::Ordering::Less => "RiskLowered",
        std::cmp::Ordering::Equal => return None,
    };
    let mut note = format!(
        "GPU OOM risk {} (was {previous}); time to OOM {}; imbalance {}; bottleneck {}",
        status.risk,
        status.time_to_oom.as_deref().unwrap_or("-"),
        status.imbalance_display.as_deref().unwrap_or("-"),
        status
            .bottleneck
            .as_ref()
            .map_or_else(|| "-".to_string(), format_location),
    );
    truncate_utf8(&mut note, 1024);
    Some(EventPlan {
        reason,
        warning: status.risk >= RiskLevel::High && reason == "RiskRaised",
        note,
    })
}

/// The Event for one newly rejected report.
pub fn rejection_event(rejected: &Rejected) -> EventPlan {
    let mut note = format!(
        "MemoryReport {} ignored: {}; fix the sidecar or agent that wrote it",
        rejected.name, rejected.why
    );
    truncate_utf8(&mut note, 1024);
    EventPlan {
        reason: "ReportRejected",
        warning: true,
        note,
    }
}

/// Rejected reports not yet announced with an Event.
pub fn newly_rejected<'a>(
    rejected: &'a [Rejected],
    announced: &BTreeSet<String>,
) -> Vec<&'a Rejected> {
    rejected
        .iter()
        .filter(|r| !announced.contains(&r.name))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::batch::v1::JobSpec;
    use memprof_api::{DataSource, GpuReport};

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
        let st = desired_status(&[], Some(4), None, "t", &screening).status;
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
        let all = desired_status(&[], Some(4), None, "t", &Screening::default()).status;
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
            desired_status(&named(&specs), Some(1), None, "t", &Screening::default()).status;
        with_batch_fit(&mut alone, &j, None);
        assert_eq!(
            alone.batch_recommendation.unwrap().method,
            batchfit::METHOD_INSUFFICIENT
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
        assert!(!profile_is_stale(&p, "train", "uid-1", false));
        assert!(profile_is_stale(&p, "train", "uid-2", false));
        assert!(
            !profile_is_stale(&p, "train", "uid-2", true),
            "a remediation keeps the history"
        );
    }

    #[test]
    fn status_rolls_up_and_carries_over_what_others_wrote() {
        let specs = four_ranks();
        let previous = MemoryProfileStatus {
            last_action: Some("scaleBatch BATCH_SIZE 32->24".into()),
            ..Default::default()
        };
        let d = desired_status(
            &named(&specs),
            Some(4),
            Some(&previous),
            "t1",
            &Screening::default(),
        );
        let st = &d.status;
        assert_eq!((st.ranks.as_str(), st.risk), ("4/4", RiskLevel::High));
        assert_eq!(st.time_to_oom.as_deref(), Some("4m20s"));
        assert_eq!(st.imbalance_display.as_deref(), Some("1.26"));
        assert_eq!(st.last_action, previous.last_action);
        assert!(d.rejected.is_empty());
        let ready = &st.conditions[0];
        assert_eq!((ready.type_.as_str(), ready.is_true()), ("Ready", true));

        let ann = job_annotations(st);
        assert_eq!(ann[ANNOTATION_OOM_RISK], "high");
        assert_eq!(ann[ANNOTATION_TIME_TO_OOM], "4m20s");
        assert_eq!(ann[ANNOTATION_IMBALANCE], "1.26");
        assert_eq!(
            ann[ANNOTATION_BOTTLENECK],
            "rank=3 pod=train-3 node=node-3 gpu=0"
        );
    }

    #[test]
    fn same_reports_in_any_order_give_the_same_status() {
        let specs = four_ranks();
        let first =
            desired_status(&named(&specs), Some(4), None, "t1", &Screening::default()).status;
        let mut reversed = named(&specs);
        reversed.reverse();
        let again = desired_status(
            &reversed,
            Some(4),
            Some(&first),
            "t2",
            &Screening::default(),
        )
        .status;
        // Unchanged conditions keep their transition time: nothing to write.
        assert_eq!(first, again);
    }

    #[test]
    fn impossible_report_is_named_and_changes_nothing_else() {
        let mut specs = four_ranks();
        let before =
            desired_status(&named(&specs), Some(4), None, "t1", &Screening::default()).status;
        let mut bad = report(4, 10, RiskLevel::Critical, Some(1.0));
        bad.gpus[0].used_bytes = 90 * G;
        specs.push(("train-4-report".into(), bad));
        let d = desired_status(
            &named(&specs),
            Some(4),
            Some(&before),
            "t2",
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
        let cond = reports_valid(&rejected);
        assert!(cond.message.len() <= 1024);
        assert!(cond.message.ends_with("more"));
        let status = MemoryProfileStatus {
            conditions: vec![cond],
            ..Default::default()
        };
        let announced = rejected_in(Some(&status));
        assert!(announced.len() >= 4 && announced.len() <= MAX_NAMED_REJECTIONS);
        assert!(announced.contains("job-with-a-rather-long-name-0-report"));
        let fresh = newly_rejected(&rejected, &announced);
        assert_eq!(fresh.len(), rejected.len() - announced.len());
    }

    #[test]
    fn risk_events_only_on_transitions() {
        let specs = four_ranks();
        let st = desired_status(&named(&specs), Some(4), None, "t", &Screening::default()).status;
        let raised = risk_event(RiskLevel::None, &st).unwrap();
        assert_eq!((raised.reason, raised.warning), ("RiskRaised", true));
        assert!(raised.note.contains("time to OOM 4m20s"));
        assert!(raised.note.contains("bottleneck rank=3 pod=train-3"));
        assert_eq!(risk_event(RiskLevel::High, &st), None);
        let lowered = risk_event(RiskLevel::Critical, &st).unwrap();
        assert_eq!((lowered.reason, lowered.warning), ("RiskLowered", false));
    }

    #[test]
    fn annotations_are_patched_only_when_a_value_differs() {
        let st = MemoryProfileStatus::default();
        let desired = job_annotations(&st);
        assert_eq!(desired[ANNOTATION_TIME_TO_OOM], "-");
        let mut current = desired.clone();
        current.insert("user/other".into(), "x".into());
        assert!(!annotations_outdated(&current, &desired));
        current.insert(ANNOTATION_OOM_RISK.into(), "high".into());
        assert!(annotations_outdated(&current, &desired));
        assert!(annotations_outdated(&BTreeMap::new(), &desired));
    }
}
