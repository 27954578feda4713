//! The roll-up stage: the profile exists; the screened reports give the
//! analysis part of its status, the Events that announce a change, and the
//! Job's annotations, all handed to the status writer. Deciding is
//! `operator/reconcile.rs`'s (pure); this file only fetches and hands over.

use super::namesakes::{created, deferred, delete_profile, may_create, write_profile, Version};
use super::reconcile::Fetched;
use super::rollups;
use super::state::Context;
use crate::operator::rbac::ensure_reporter_rbac;
use crate::operator::reconcile::{
    annotations_outdated, earlier_jobs_profile, gpu_oom_annotation, job_annotations,
    profile_for_job, profile_outdated, profiling_enabled, risk_event, with_batch_fit,
    with_recommendation, DesiredStatus, JOB_ANNOTATIONS,
};
use crate::operator::thresholds;
use crate::operator::Result;
use crate::remediation::replaced_by_memprof;
use crate::status::{announce_refused, object_reference, Analysis, Notice};
use crate::workload::claim::Claimant;
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;
use memprof_api::workload::WorkloadKind;
use memprof_api::{MemoryProfile, MemoryProfileStatus, ANNOTATION_GPU_OOM};
use memprof_policy::triggers::Succession;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};

/// Periodic look at a Job even without changes (a safety net: watches drive reconciles).
pub(super) const RESYNC: Duration = Duration::from_secs(300);

/// Deletes the profile of a Job now proven its JobSet's child, when it has
/// one of its own: made while its link did not prove yet (the JobSet or the
/// admission key not read yet), it is the child's no more.
async fn drop_own_profile(ctx: &Arc<Context>, f: &Fetched, job: &Job) -> Result<()> {
    if let Some(own) = f.profile.as_deref().filter(|p| owned_by(p, job)) {
        delete_profile(ctx, own, Version::Any).await?;
        ctx.writer.forget(&f.key);
        ctx.with_state(&f.key, |s| s.profile = None);
        info!(job = %f.key, "deleted the MemoryProfile of a Job now proven its JobSet's child");
    }
    Ok(())
}

/// Whether `profile` names `job` (by uid) as its owner.
fn owned_by(profile: &MemoryProfile, job: &Job) -> bool {
    let uid = job.uid();
    profile
        .owner_references()
        .iter()
        .any(|o| Some(&o.uid) == uid.as_ref())
}

/// What the fetched profile, when it is an earlier Job's of this name, is
/// to this Job (`earlier_jobs_profile`, against the status as `written`
/// last): a stranger's is deleted (`true`: look again), one memprof is
/// replacing is left alone until its record names the new Job (`true`).
async fn drop_stale(
    ctx: &Arc<Context>,
    f: &Fetched,
    job: &Job,
    written: Option<&MemoryProfileStatus>,
) -> Result<bool> {
    let uid = job.uid().unwrap_or_default();
    let name = f.key.name.as_str();
    let Some(profile) = f.profile.as_deref() else {
        return Ok(false);
    };
    match earlier_jobs_profile(profile, name, &uid, written) {
        None | Some(Succession::Heir) => Ok(false),
        Some(Succession::Pending) => Ok(true),
        Some(Succession::Stranger) => {
            delete_profile(ctx, profile, Version::Any).await?;
            ctx.writer.forget(&f.key);
            ctx.with_state(&f.key, |s| s.profile = None);
            info!(job = %f.key, "deleted the MemoryProfile of an earlier Job with this name");
            Ok(true)
        }
    }
}

/// Runs the roll-up stage for the fetched Job; returns when to look again.
pub(super) async fn run(ctx: &Arc<Context>, f: &Fetched) -> Result<Option<Duration>> {
    let Some(job) = f.job.as_deref() else {
        return Ok(None);
    };
    if job.metadata.deletion_timestamp.is_some() {
        // The garbage collector is removing the profile with the Job: recreating
        // it now would only give the collector another dependent to wait for.
        return Ok(None);
    }
    if !profiling_enabled(job) {
        switch_off(ctx, f, job).await?;
        return Ok(None);
    }
    if let Some(workload) = super::workloads::member_of(ctx, &f.key, job).await? {
        // A JobSet's child: its reports are its workload's (workloads.rs).
        drop_own_profile(ctx, f, job).await?;
        return super::workloads::run(ctx, &f.key, job, workload).await;
    }
    let uid = job.uid().unwrap_or_default();
    let written = ctx.writer.view(&f.key);
    if drop_stale(ctx, f, job, written.as_ref()).await? {
        return Ok(Some(Duration::from_secs(1)));
    }
    let recorded = f.profile.as_ref().and_then(|p| p.status.clone());
    let previous = written.or(recorded);
    if replaced_by_memprof(previous.as_ref(), &uid) {
        // The watch has not shown this Job's deletion yet: adopting the
        // profile again would give it an owner that is (about to be) gone,
        // and the garbage collector would delete it with its history.
        return Ok(None);
    }
    let Some(profile) = ensure_profile(ctx, f, job).await? else {
        // Left to a namesake that comes first, or made by one meanwhile.
        return Ok(Some(deferred(ctx, &f.key)));
    };
    let now = Timestamp::now();
    rollups::refresh(ctx, &f.key, job, previous.as_ref(), now);
    let Some((desired, next_change)) = build(ctx, f, job, previous.as_ref(), now) else {
        return Ok(Some(Duration::from_secs(1)));
    };
    let notices = notices(ctx, f, job, &profile, previous.as_ref(), &desired);
    annotate(ctx, f, job, &desired.status);
    let analysis = Analysis {
        status: desired.status,
        notices,
    };
    ctx.writer.submit(&f.key, &uid, analysis);
    // A rank going stale or a held risk level ending changes the status
    // with no event: look again then (JobRollup::next_change).
    let until_change = next_change
        .map(|t| Duration::try_from(now.duration_until(t)).unwrap_or_default())
        .map(|d| d.max(Duration::from_millis(100)));
    Ok(Some(until_change.map_or(RESYNC, |d| d.min(RESYNC))))
}

/// Build: the status the Job's roll-up calls for now (`rollups.rs`), with
/// the batch fit and the thresholds in effect, and when it next changes
/// with no event. `None`: the roll-up is gone (the Job was forgotten meanwhile).
fn build(
    ctx: &Context,
    f: &Fetched,
    job: &Job,
    previous: Option<&MemoryProfileStatus>,
    now: Timestamp,
) -> Option<(DesiredStatus, Option<Timestamp>)> {
    let (mut desired, next) = ctx.with_state(&f.key, |s| {
        s.rollup.as_ref().map(|t| t.desired(previous, now))
    })?;
    with_batch_fit(&mut desired.status, job, previous);
    let reports = counted_reports(ctx, f);
    if let Err(e) = with_recommendation(&mut desired.status, job, reports.iter().map(|r| &r.spec)) {
        warn!(job = %f.key, error = %e, "memprof.dev/recommend-phases ignored");
    }
    let defaults = &ctx.setup.options.default_thresholds;
    desired.status.thresholds = Some(thresholds::in_effect(defaults, job.annotations()));
    Some((desired, next))
}

/// The Job's reports the roll-up counts (screened, not refused), from the
/// watch cache: O(ranks) per roll-up, for the recommendation's evidence.
fn counted_reports(ctx: &Context, f: &Fetched) -> Vec<Arc<memprof_api::MemoryReport>> {
    let names: Vec<String> = ctx.with_state(&f.key, |s| {
        s.rollup.as_ref().map_or_else(Vec::new, |t| {
            // Trusted (not refused) and valid: an impossible report is in
            // the roll-up's rejected list and must not size a request.
            let counted =
                |n: &&String| !t.refused.contains_key(n.as_str()) && t.rollup.is_valid(n.as_str());
            t.known.iter().filter(counted).cloned().collect()
        })
    });
    names
        .iter()
        .filter_map(|n| rollups::report_of(&ctx.caches, &f.key, n))
        .collect()
}

/// The profile with our spec, labels and owner reference: the cached one,
/// or the one our last apply returned (fresher while the cache lags), or
/// applied now (ours, drifted), or created now when there is none and no
/// profiled namesake comes first (`namesakes::may_create`; a create, never
/// an apply, which would take over one a namesake made meanwhile).
/// `None`: not made.
async fn ensure_profile(
    ctx: &Context,
    f: &Fetched,
    job: &Job,
) -> Result<Option<Arc<MemoryProfile>>> {
    let (ns, name) = (&f.key.namespace, &f.key.name);
    let desired = profile_for_job(job, ns, name, &job.uid().unwrap_or_default());
    let applied = ctx.with_state(&f.key, |s| s.profile.clone());
    let known = match (f.profile.clone(), applied) {
        (Some(c), Some(a)) if a.uid() == c.uid() && rv(&a) > rv(&c) => Some(a),
        (cached, _) => cached,
    };
    if let Some(p) = known
        .as_ref()
        .filter(|p| !profile_outdated(Some(p), &desired))
    {
        return Ok(Some(p.clone()));
    }
    let me = Claimant {
        kind: WorkloadKind::Job,
        uid: job.uid().unwrap_or_default(),
        created: created(&job.metadata),
    };
    if known.is_none() && !may_create(ctx, &f.key, &me).await? {
        return Ok(None);
    }
    // First sight of this Job (or its profile drifted): its sidecars run
    // under the pod template's service account and need leave to write
    // their MemoryReports. Idempotent; failing it must not stop profiling
    // (the sidecars then say they are forbidden).
    let sa = job
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.service_account_name.as_deref())
        .unwrap_or("default");
    if let Err(e) = ensure_reporter_rbac(&ctx.client, ns, sa).await {
        warn!(error = %e, service_account = sa, "cannot grant the sidecars leave to write MemoryReports");
    }
    let Some(profile) = write_profile(ctx, &f.key, &desired, known.is_none()).await? else {
        return Ok(None);
    };
    let profile = kept(profile);
    ctx.with_state(&f.key, |s| s.profile = Some(profile.clone()));
    Ok(Some(profile))
}

/// What the Job's state keeps of the operator's own apply response: what
/// the watch cache keeps of a profile (`slim::profile`), no more. The
/// response carries whatever anyone else wrote on the profile (labels,
/// annotations, their managedFields entries), unbounded; it is kept per
/// profiled Job until the next apply, and compared as the cached copy is.
fn kept(mut applied: MemoryProfile) -> Arc<MemoryProfile> {
    super::slim::profile(&mut applied);
    Arc::new(applied)
}

fn rv(p: &MemoryProfile) -> u64 {
    p.resource_version()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The Events this status calls for against the one before it: a risk
/// transition, invalid thresholds, reports rejected for the first time.
/// Published by the status writer once the status is written, so a
/// restarted operator finds nothing to announce again.
fn notices(
    ctx: &Context,
    f: &Fetched,
    job: &Job,
    profile: &MemoryProfile,
    previous: Option<&MemoryProfileStatus>,
    desired: &DesiredStatus,
) -> Vec<Notice> {
    let (job_ref, profile_ref) = (object_reference(job), object_reference(profile));
    let about_job = |plan| Notice {
        plan,
        regarding: job_ref.clone(),
        related: Some(profile_ref.clone()),
    };
    let mut out = Vec::new();
    let previous_risk = previous.map(|s| s.risk).unwrap_or_default();
    if let Some(plan) = risk_event(previous_risk, &desired.status) {
        info!(job = %f.key, risk = %desired.status.risk, was = %previous_risk, "risk changed");
        out.push(about_job(plan));
    }
    let was = previous.and_then(|s| s.thresholds.as_ref());
    let now = desired.status.thresholds.as_ref();
    if let Some(plan) = now.and_then(|t| thresholds::invalid_event(was, t)) {
        warn!(job = %f.key, note = %plan.note, "invalid memprof.dev/thresholds");
        out.push(about_job(plan));
    }
    let report =
        |name: &str| rollups::report_of(&ctx.caches, &f.key, name).map(|r| object_reference(&*r));
    let rejected = &desired.rejected;
    out.extend(ctx.with_state(&f.key, |s| {
        announce_refused(rejected, previous, &mut s.announced, &profile_ref, report)
    }));
    out
}

/// Hands the Job's annotations to the writer when a value differs from what
/// the Job carries (or what the writer is about to apply).
fn annotate(ctx: &Context, f: &Fetched, job: &Job, status: &MemoryProfileStatus) {
    let job_rv = job
        .resource_version()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let current = ctx
        .writer
        .annotations(&f.key, job_rv)
        .unwrap_or_else(|| job.annotations().clone());
    // Hysteresis: a value moves only when its rounded value does (`reconcile/annotations.rs`).
    let mut desired = job_annotations(status, &current);
    let uid = job.uid().unwrap_or_default();
    // The OOMs the remediation stage recorded (carried in `status`): the
    // newest, once recorded, tells any reader this exit 1 was a GPU OOM.
    if let Some(oom) = gpu_oom_annotation(status, &uid) {
        desired.insert(ANNOTATION_GPU_OOM.into(), oom);
    }
    if annotations_outdated(&current, &desired) {
        ctx.writer.annotate(&f.key, &uid, desired);
    }
}

/// Profiling was switched off (or never on): remove what we made, if anything.
async fn switch_off(ctx: &Context, f: &Fetched, job: &Job) -> Result<()> {
    let uid = job.uid().unwrap_or_default();
    let ours = |p: &&MemoryProfile| p.owner_references().iter().any(|o| o.uid == uid);
    if let Some(p) = f.profile.as_deref().filter(ours) {
        delete_profile(ctx, p, Version::Any).await?;
        ctx.writer.forget(&f.key);
        info!(job = %f.key, "profiling switched off: deleted the MemoryProfile");
    }
    let annotated = JOB_ANNOTATIONS
        .iter()
        .any(|k| job.annotations().contains_key(*k));
    let cleared = ctx.with_state(&f.key, |s| {
        s.announced.clear();
        s.profile = None;
        ctx.drop_rollup(s);
        std::mem::replace(&mut s.cleared, true)
    });
    if annotated && !cleared {
        // Applying no annotations drops the keys this field manager owns, and only those.
        ctx.writer.annotate(&f.key, &uid, BTreeMap::new());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::reconcile::profile_for_job;
    use serde_json::json;

    fn size(p: &MemoryProfile) -> usize {
        serde_json::to_vec(p).unwrap().len()
    }

    /// ~250 KiB of metadata others wrote on the profile: `n` keys of
    /// 60-byte values under `prefix`.
    fn foreign(prefix: &str, n: usize) -> serde_json::Map<String, serde_json::Value> {
        (0..n)
            .map(|i| (format!("{prefix}k{i}"), json!("x".repeat(60))))
            .collect()
    }

    /// `desired` as the API server answers the operator's apply once others
    /// labelled and annotated the profile at length: their labels and
    /// annotations, and the managedFields entries naming them.
    fn answered(desired: &MemoryProfile) -> MemoryProfile {
        let owned = |keys: Vec<&String>| -> serde_json::Map<String, serde_json::Value> {
            keys.into_iter()
                .map(|k| (format!("f:{k}"), json!({})))
                .collect()
        };
        let (labels, notes) = (
            foreign("other.example/", 2000),
            foreign("note.example/", 2000),
        );
        let ours = owned(desired.labels().keys().collect());
        let mut v = serde_json::to_value(desired).unwrap();
        v["metadata"]["uid"] = json!("profile-uid");
        v["metadata"]["resourceVersion"] = json!("42");
        v["metadata"]["managedFields"] = json!([
            {"manager": memprof_api::OPERATOR_MANAGER, "operation": "Apply", "apiVersion": "memprof.dev/v1alpha1",
             "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": ours}}},
            {"manager": "kubectl-label", "operation": "Update", "apiVersion": "memprof.dev/v1alpha1",
             "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {
                 "f:labels": owned(labels.keys().collect()),
                 "f:annotations": owned(notes.keys().collect())}}},
        ]);
        for (k, val) in labels {
            v["metadata"]["labels"][k] = val;
        }
        v["metadata"]["annotations"] = serde_json::Value::Object(notes);
        serde_json::from_value(v).unwrap()
    }

    /// The apply response the Job's state keeps is bounded as the cache's
    /// copy is, whatever others wrote on the profile, and still says what
    /// the next reconcile compares: our labels, its uid and version.
    #[test]
    fn the_kept_apply_response_is_bounded_whatever_others_wrote_on_the_profile() {
        let job: Job = serde_json::from_value(json!({"metadata": {"name": "train",
            "labels": {"team": "ml"}}}))
        .unwrap();
        let desired = profile_for_job(&job, "ml", "train", "job-uid");
        let response = answered(&desired);
        assert!(size(&response) > 250_000, "{} bytes", size(&response));
        let kept = kept(response);
        assert!(size(&kept) < 2 * 1024, "{} bytes kept", size(&kept));
        assert_eq!(
            kept.labels(),
            desired.labels(),
            "only what the operator applied"
        );
        assert!(!profile_outdated(Some(&kept), &desired));
        assert_eq!(kept.resource_version().as_deref(), Some("42"));
        assert_eq!(kept.uid().as_deref(), Some("profile-uid"));
    }
}
