//! The pure half of the reconcile pipeline: from a Job, its MemoryReports and
//! the profile's previous status to what should be written. No client, no
//! clock (the time for condition transitions comes in as a string), so every
//! decision is unit-tested on plain values; `controller.rs` only fetches from
//! the watch caches and applies what this module returns.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use memprof_analysis::{JobRollup, ReportMeta, RollupLimits};
use memprof_api::family::{family_of, LABEL_FAMILY};
use memprof_api::{
    set_condition, MemoryProfile, MemoryProfileSpec, MemoryProfileStatus, MemoryReportSpec,
    ANNOTATION_ENABLED, LABEL_JOB,
};
use memprof_policy::triggers::{succession, Succession};
use std::collections::BTreeMap;

mod annotations;
mod conditions;
mod events;
mod write;
pub use annotations::{annotations_outdated, gpu_oom_annotation, job_annotations, JOB_ANNOTATIONS};
pub use conditions::{
    rejected_in, CONDITION_RANKS_STALE, CONDITION_READY, CONDITION_REPORTS_COUNTED,
    CONDITION_REPORTS_VALID,
};
pub use events::{
    format_location, newly_rejected, rejection_event, risk_event, risk_reason, EventPlan,
    REPORT_REJECTED,
};
pub use write::{status_write_needed, Why, COSMETIC_INTERVAL};

mod batch;
mod recommend;
use batch::slim_containers;
pub use batch::{batch_env, batch_of, with_batch_fit};
pub use recommend::{rank_role, with_recommendation, WorkloadEvidence};

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
    let mut labels = workload_labels(job.labels());
    labels.insert(LABEL_JOB.to_string(), name.to_string());
    // The KIND column (a JobSet's profile says JobSet: pipeline/workloads.rs).
    let kind = memprof_api::workload::LABEL_WORKLOAD_KIND;
    labels.insert(kind.to_string(), "Job".to_string());
    // What the admission webhook selects a new Job's history on
    // (memprof_api::family); an invalid family is left out, the webhook
    // says why when that Job is created.
    if let Some(family) = family_of(job.annotations()) {
        labels.insert(LABEL_FAMILY.to_string(), family.to_string());
    }
    profile.metadata.labels = Some(labels);
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

/// Labels of a workload a profile carries, so that `kubectl get mprof -l
/// team=ml` and `memprof top -l team=ml` select what users labelled: the
/// top-level workload's own `labels` (a Job's, a JobSet's, a TrainJob's, a
/// PyTorchJob's, as memprof read that object; never a child's or a pod's),
/// bounded (they are the workload creator's input, and the profile is
/// written on every change): at most [`MAX_WORKLOAD_LABELS`], in key order,
/// without memprof's own (`memprof.dev/`, which only memprof sets) or the
/// Job controller's (`controller-uid`, `job-name`, `batch.kubernetes.io/…`,
/// which name one run, not the workload). Every kind's profile copies
/// through this one function, so one rule and one bound hold for all.
pub fn workload_labels(labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let ours = |k: &str| {
        k.starts_with("memprof.dev/")
            || k.starts_with("batch.kubernetes.io/")
            || k == "controller-uid"
            || k == "job-name"
    };
    labels
        .iter()
        .filter(|(k, _)| !ours(k))
        .take(MAX_WORKLOAD_LABELS)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Labels a profile copies from its workload, at most.
pub const MAX_WORKLOAD_LABELS: usize = 16;

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

/// Whether `existing` belongs to an earlier Job of the same name (deleted
/// and recreated before the garbage collector removed its profile), and if
/// so whether the Job of uid `job_uid` succeeds it: `None` when the profile
/// names no earlier Job of this name (ours, or ownerless: `workload::claim`
/// judges those). A stranger's profile describes another run, so it must
/// go rather than be adopted; memprof's own recreation keeps it, and the
/// history (OOMs, remediations) survives. Decided by memprof's records
/// alone (`memprof_policy::triggers::succession`), in the status as cached
/// or as the status writer last wrote it (`written`: a record may be newer
/// than the cache); an annotation on the new Job is anyone's to write and
/// proves nothing.
pub fn earlier_jobs_profile(
    existing: &MemoryProfile,
    job_name: &str,
    job_uid: &str,
    written: Option<&MemoryProfileStatus>,
) -> Option<Succession> {
    let jobs: Vec<&str> = existing
        .owner_references()
        .iter()
        .filter(|o| o.kind == "Job" && o.name == job_name)
        .map(|o| o.uid.as_str())
        .collect();
    if jobs.is_empty() || jobs.contains(&job_uid) {
        return None;
    }
    Some(succession_in(
        [existing.status.as_ref(), written],
        &jobs,
        job_uid,
    ))
}

/// The succession of `uid` as the most recent of `statuses` tells it: a
/// record in either makes it `Heir` (or `Pending`), as the newer of the
/// two would say.
pub fn succession_in(
    statuses: [Option<&MemoryProfileStatus>; 2],
    replaced: &[&str],
    uid: &str,
) -> Succession {
    let each = statuses.map(|st| succession(st, replaced, uid));
    [Succession::Heir, Succession::Pending]
        .into_iter()
        .find(|s| each.contains(s))
        .unwrap_or(Succession::Stranger)
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

/// Builds the status from the Job's incremental roll-up at `now`: the
/// analysis part from `rollup`, reports refused by screening (`refused`)
/// and counted reports that failed validation named in `ReportsValid`,
/// superseded and excess ones counted in `ReportsCounted`, stale ranks named
/// in `RanksStale` (and `Ready` False while there are any); OOMs,
/// remediations, the last action and other writers' conditions are carried
/// over from `previous`. O(top-K + stale + rejected).
pub fn desired_status_from(
    rollup: &JobRollup,
    refused: &[Rejected],
    previous: Option<&MemoryProfileStatus>,
    now: jiff::Timestamp,
) -> DesiredStatus {
    let mut rejected = refused.to_vec();
    rejected.extend(rollup.rejected().map(|(name, why)| Rejected {
        name: name.to_string(),
        why: why.to_string(),
    }));
    let counts = (rollup.superseded(), rollup.over_limit());
    finish(rollup.status(now), rejected, counts, previous, now)
}

/// [`desired_status_from`] for a list of screened reports, through a
/// roll-up built afresh (what a reconcile without a kept `JobRollup` does:
/// O(ranks)). The risk level's hold is carried over from `previous`
/// (`riskHeldUntil`). `now` is an RFC 3339 time; if it does not parse, the
/// newest report's time stands in.
pub fn desired_status(
    reports: &[NamedReport<'_>],
    expected_ranks: Option<u32>,
    previous: Option<&MemoryProfileStatus>,
    now: &str,
    screening: &Screening,
) -> DesiredStatus {
    let mut rollup = JobRollup::new(expected_ranks, RollupLimits::default());
    for r in reports {
        rollup.upsert_with(r.name, r.spec, ReportMeta::default());
    }
    let now = now.parse().unwrap_or_else(|_| newest(reports));
    if let Some(prev) = previous {
        rollup.resume_from(prev, now);
    }
    let mut rejected = screening.refused.clone();
    rejected.extend(rollup.rejected().map(|(name, why)| Rejected {
        name: name.to_string(),
        why: why.to_string(),
    }));
    let counts = (
        screening.superseded + rollup.superseded(),
        screening.over_limit + rollup.over_limit(),
    );
    finish(rollup.status(now), rejected, counts, previous, now)
}

fn newest(reports: &[NamedReport<'_>]) -> jiff::Timestamp {
    reports
        .iter()
        .filter_map(|r| r.spec.sampled_at.parse().ok())
        .max()
        .unwrap_or(jiff::Timestamp::UNIX_EPOCH)
}

fn finish(
    mut status: MemoryProfileStatus,
    rejected: Vec<Rejected>,
    (superseded, over_limit): (usize, usize),
    previous: Option<&MemoryProfileStatus>,
    now: jiff::Timestamp,
) -> DesiredStatus {
    if let Some(prev) = previous {
        status.ooms = prev.ooms.clone();
        status.oom_count = prev.oom_count;
        status.remediations = prev.remediations.clone();
        status.remediation_totals = prev.remediation_totals.clone();
        status.last_action = prev.last_action.clone();
        status.conditions = prev.conditions.clone();
    }
    // Condition transitions to the second, as the API server stores them.
    let now = now.round(jiff::Unit::Second).unwrap_or(now).to_string();
    let counted = status.ranks_reporting + status.ranks_stale;
    let mut set = |c| set_condition(&mut status.conditions, c, &now);
    set(conditions::ready(counted, status.ranks_stale));
    set(conditions::reports_valid(&rejected));
    set(conditions::reports_counted(superseded, over_limit));
    set(conditions::ranks_stale(
        status.ranks_stale,
        &status.stale_ranks,
    ));
    DesiredStatus { status, rejected }
}

#[cfg(test)]
mod tests;
