//! Jobs that are a JobSet's children (a TrainJob's, through its JobSet):
//! no profile of their own; one profile for the top-level workload, rolled
//! up over every proven child Job's reports by workload rank
//! (`crate::workload`).
//!
//! Whether a Job is a child is resolved from objects read from the API
//! server (`workload::read`, at most 3 gets, and one more for the JobSet's
//! rank layout), once per Job and again every [`RESOLVE_AGAIN`]: a JobSet
//! deleted, replaced under its name or resized is seen within that. A Job whose link does not prove
//! (`workload::resolve`) keeps its own profile, as any Job.
//!
//! Each reconcile of a child Job brings the workload's one roll-up up to
//! date with what changed under that child (`workload_refresh.rs`:
//! O(changed reports), as for a Job), and hands the status to the writer
//! under the workload's key (its name): concurrent children take turns on
//! the roll-up. Remediation acts on the top-level
//! workload ([`remediate`]: the same stage whichever kind); its risk Events
//! and `memprof.dev/` annotations go on the top-level object, through the
//! status writer as a Job's do (`workload_refresh::submit`), and so do the
//! `ReportRejected` Events of its refused reports, on its profile.

use super::namesakes::{deferred, may_create, taken, write_profile, Ensured, Taken};
use super::state::Context;
use super::workload_refresh::{refresh, Refreshed, Turn};
use crate::key::JobKey;
use crate::operator::rbac::ensure_reporter_rbac;
use crate::operator::reconcile::profile_outdated;
use crate::operator::{Error, Result};
use crate::remediation::{replaced_by_memprof, Executor, Ranks, Target};
use crate::workload::claim::Claimant;
use crate::workload::rank::JobSetShape;
use crate::workload::read::{api_resource, resolve_live, Membership};
use crate::workload::resolve::{Resolved, Workload};
use crate::workload::rollup::Layout;
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DynamicObject};
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use memprof_api::family::LABEL_FAMILY;
use memprof_api::workload::{WorkloadKind, LABEL_WORKLOAD_KIND};
use memprof_api::{MemoryProfile, MemoryProfileSpec, LABEL_JOB};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a Job's resolved workload is trusted before it is read again.
pub(super) const RESOLVE_AGAIN: Duration = Duration::from_secs(60);
/// Periodic look at a workload even without changes (as for a Job).
const RESYNC: Duration = Duration::from_secs(300);

/// The workload `job` rolls up under when it is not itself (a proven
/// JobSet child); `None` for a Job that is its own workload. Reads the API
/// server only for a Job claiming a JobSet, at most every [`RESOLVE_AGAIN`].
pub(super) async fn member_of(
    ctx: &Context,
    key: &JobKey,
    job: &Job,
) -> Result<Option<(Resolved, JobSetShape)>> {
    let claims = job.owner_references().iter().any(|o| {
        o.controller == Some(true)
            && WorkloadKind::of(&o.api_version, &o.kind) == Some(WorkloadKind::JobSet)
    });
    if !claims {
        return Ok(None);
    }
    let uid = job.uid().unwrap_or_default();
    let cached = ctx.with_state(key, |s| s.workload.clone());
    if let Some(m) = cached.filter(|m| m.job_uid == uid && m.read.elapsed() < RESOLVE_AGAIN) {
        return Ok(m.resolved);
    }
    let start = Workload {
        kind: WorkloadKind::Job,
        name: key.name.clone(),
        uid: uid.clone(),
    };
    let keys = ctx.setup.options.admission.ring();
    if keys.current().is_none() {
        // No mark verifies yet: "not a child" would be a guess, and the Job
        // would get a profile of its own. Look again once the key is loaded.
        return Err(Error::Workload(
            "the admission key is not loaded yet".into(),
        ));
    }
    let resolved = resolve_live(&ctx.client, &key.namespace, start, &keys)
        .await
        .map_err(|e| Error::Workload(e.to_string()))?;
    let jobset = resolved
        .chain
        .iter()
        .find(|w| w.kind == WorkloadKind::JobSet);
    let resolved = match jobset.filter(|_| resolved.top.kind != WorkloadKind::Job) {
        // The layout is read with the link: a JobSet's replicas change
        // rarely, and reading it on every report event would cost a request each.
        Some(js) => read_shape(ctx, &key.namespace, js)
            .await?
            .map(|s| (resolved, s)),
        None => None,
    };
    let m = Membership {
        job_uid: uid,
        read: Instant::now(),
        resolved: resolved.clone(),
    };
    ctx.with_state(key, |s| s.workload = Some(m));
    Ok(resolved)
}

/// What the profile of `wkey` is to the top-level workload `top`
/// (`namesakes::taken`). Its creation stamp is read only to make a missing
/// profile: without it, memprof's records alone decide an ownerless
/// profile's heir.
async fn standing(ctx: &Context, wkey: &JobKey, top: &Workload) -> Result<Taken> {
    let me = Claimant {
        kind: top.kind,
        uid: top.uid.clone(),
        created: None,
    };
    taken(ctx, wkey, &me, cached_profile(ctx, wkey).as_deref()).await
}

/// Rolls `resolved`'s workload up and hands its status to the writer;
/// returns when to look again.
pub(super) async fn run(
    ctx: &Arc<Context>,
    key: &JobKey,
    job: &Job,
    (resolved, shape): (Resolved, JobSetShape),
) -> Result<Option<Duration>> {
    let Some(jobset) = resolved
        .chain
        .iter()
        .find(|w| w.kind == WorkloadKind::JobSet)
    else {
        return Ok(None);
    };
    let ns = key.namespace.as_str();
    let now = Timestamp::now();
    let wkey = JobKey::new(ns, &resolved.top.name);
    let top = &resolved.top;
    if let Some(again) = standing(ctx, &wkey, top).await?.look_again(RESYNC) {
        return Ok(Some(again));
    }
    let recorded = || cached_profile(ctx, &wkey).and_then(|p| p.status.clone());
    let previous = ctx.writer.view(&wkey).or_else(recorded);
    // A child's membership, cached, may still name a JobSet memprof is
    // recreating: owned by it again, the profile would go with it.
    if !replaced_by_memprof(previous.as_ref(), &top.uid) {
        let ensured = ensure_profile(ctx, &wkey, &resolved, shape.ranks(), job).await?;
        if matches!(ensured, Ensured::Deferred) {
            return Ok(Some(deferred(ctx, key)));
        }
    }
    // Incremental: the reports noted under this child since its last
    // reconcile, not the whole JobSet (`workload_refresh.rs`).
    let turn = Turn {
        claimed: key,
        child: Some(job),
        workload: jobset,
        layout: Layout::JobSet {
            shape,
            members: BTreeMap::new(),
        },
        annotations: None,
        injected_from: job.annotations(),
        wkey: &wkey,
    };
    let Refreshed {
        desired,
        next: next_change,
        ranks,
    } = refresh(ctx, &turn, previous.as_ref(), now);
    let profile = cached_profile(ctx, &wkey);
    let seen = (profile.as_deref(), previous.as_ref());
    super::workload_refresh::submit(ctx, (&wkey, top), seen, desired);
    let decided = remediate(ctx, &wkey, top, ranks).await?;
    let next = next_change.map(|t| Duration::try_from(now.duration_until(t)).unwrap_or_default());
    let next = next.map_or(RESYNC, |d| d.clamp(Duration::from_millis(100), RESYNC));
    Ok(Some(decided.map_or(next, |d| d.min(next))))
}

/// Remediation of workload `top` (kind, name, uid), whose profile is
/// `wkey` and whose ranks are `ranks` (as its roll-up proves them: the
/// names their reports claim and the layout): says so to the executor, with
/// the workload's labels as the API server holds them (read again at most
/// every [`RESOLVE_AGAIN`], or when its uid changed), and runs the
/// workload's remediation stage.
///
/// The target is built and handed to the executor only when something in
/// it changed (the ranks' `Arc`, the uid, the labels' age); otherwise the
/// one kept in the workload's state is used. A JobSet's ranks hold every
/// child Job: copying them on each child's reconcile (three copies each)
/// cost ~0.7 µs per child Job per report event, 1.84× a Job's CPU at
/// 2,048 child Jobs of one pod (docs/benchmarks.md).
pub(super) async fn remediate(
    ctx: &Arc<Context>,
    wkey: &JobKey,
    top: &Workload,
    ranks: Arc<Ranks>,
) -> Result<Option<Duration>> {
    let Some(exec) = ctx.executor.clone() else {
        return Ok(None);
    };
    let kept = ctx.with_state(wkey, |s| s.workload_target.clone());
    let current = kept.filter(|(from, t)| {
        Arc::ptr_eq(from, &ranks)
            && t.uid == top.uid
            && t.kind == top.kind
            && t.read.elapsed() < RESOLVE_AGAIN
    });
    let target = match current {
        Some((_, t)) => t,
        None => {
            let target = Arc::new(target_for(ctx, &exec, wkey, top, &ranks).await?);
            exec.set_target(wkey, Target::clone(&target));
            ctx.with_state(wkey, |s| s.workload_target = Some((ranks, target.clone())));
            target
        }
    };
    Ok(super::remediation_stage::run_workload(ctx, wkey, &target))
}

/// The executor's target for workload `top` with `ranks`: its labels as
/// the executor last held them when fresh, else read again.
async fn target_for(
    ctx: &Context,
    exec: &Executor,
    wkey: &JobKey,
    top: &Workload,
    ranks: &Ranks,
) -> Result<Target> {
    let known = exec
        .target(wkey)
        .filter(|t| t.uid == top.uid && t.kind == top.kind && t.read.elapsed() < RESOLVE_AGAIN);
    let (labels, read) = match known {
        Some(t) => (t.labels, t.read),
        None => (top_labels(ctx, &wkey.namespace, top).await?, Instant::now()),
    };
    Ok(Target {
        kind: top.kind,
        uid: top.uid.clone(),
        labels,
        ranks: ranks.clone(),
        read,
    })
}

/// The labels of workload `top` as the API server holds them now (a policy
/// selects on them; Kueue's queue label decides how it is changed).
async fn top_labels(ctx: &Context, ns: &str, top: &Workload) -> Result<BTreeMap<String, String>> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), ns, &api_resource(top.kind));
    let got = api
        .get_opt(&top.name)
        .await
        .map_err(|e| Error::Workload(e.to_string()))?;
    Ok(got
        .filter(|o| o.metadata.uid.as_deref() == Some(top.uid.as_str()))
        .and_then(|o| o.metadata.labels)
        .unwrap_or_default())
}

/// The JobSet's rank layout, from its spec as the API server holds it now.
async fn read_shape(ctx: &Context, ns: &str, jobset: &Workload) -> Result<Option<JobSetShape>> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), ns, &api_resource(WorkloadKind::JobSet));
    let got = api
        .get_opt(&jobset.name)
        .await
        .map_err(|e| Error::Workload(e.to_string()))?;
    let Some(js) = got.filter(|o| o.metadata.uid.as_deref() == Some(jobset.uid.as_str())) else {
        return Ok(None);
    };
    JobSetShape::from_spec(&js.data["spec"])
        .map(Some)
        .map_err(|e| Error::Workload(format!("JobSet {}: {e}", jobset.name)))
}

fn cached_profile(ctx: &Context, key: &JobKey) -> Option<Arc<MemoryProfile>> {
    ctx.caches
        .profiles
        .get(&ObjectRef::new(&key.name).within(&key.namespace))
}

/// The workload's profile: named after it, owned by it, labelled with its
/// kind, the family its top-level object names (read with it:
/// `Resolved::family`), which the admission webhook selects its history on,
/// and that object's own labels as read with it (`Resolved::labels`,
/// bounded as a Job's profile copies a Job's), which `-l` selects on.
fn profile_for(key: &JobKey, resolved: &Resolved, ranks: u32) -> MemoryProfile {
    let top = &resolved.top;
    let mut p = MemoryProfile::new(
        &key.name,
        MemoryProfileSpec {
            job_name: key.name.clone(),
            expected_ranks: Some(ranks),
        },
    );
    p.metadata.namespace = Some(key.namespace.clone());
    let mut labels = BTreeMap::clone(&resolved.labels);
    labels.insert(LABEL_JOB.to_string(), key.name.clone());
    labels.insert(LABEL_WORKLOAD_KIND.to_string(), top.kind.kind().to_string());
    if let Some(family) = resolved.family.as_deref() {
        labels.insert(LABEL_FAMILY.to_string(), family.to_string());
    }
    p.metadata.labels = Some(labels);
    p.metadata.owner_references = Some(vec![OwnerReference {
        api_version: top.kind.api_version().into(),
        kind: top.kind.kind().into(),
        name: top.name.clone(),
        uid: top.uid.clone(),
        controller: Some(false),
        block_owner_deletion: Some(true),
    }]);
    p
}

/// Creates the workload's profile when missing and no profiled namesake
/// comes first (a create, never an apply, which would take over one a
/// namesake made meanwhile), applies it again when ours drifted (and
/// grants the child Job's sidecars leave to write their reports, as for
/// any Job).
async fn ensure_profile(
    ctx: &Context,
    wkey: &JobKey,
    resolved: &Resolved,
    ranks: u32,
    job: &Job,
) -> Result<Ensured> {
    let desired = profile_for(wkey, resolved, ranks);
    let known = cached_profile(ctx, wkey);
    if known
        .as_deref()
        .is_some_and(|p| !profile_outdated(Some(p), &desired))
    {
        return Ok(Ensured::Held);
    }
    if known.is_none() && !comes_first(ctx, wkey, resolved).await? {
        return Ok(Ensured::Deferred);
    }
    let sa = job
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.service_account_name.as_deref())
        .unwrap_or("default");
    if let Err(e) = ensure_reporter_rbac(&ctx.client, &wkey.namespace, sa).await {
        tracing::warn!(error = %e, service_account = sa, "cannot grant the sidecars leave to write MemoryReports");
    }
    let missing = known.is_none();
    Ok(match write_profile(ctx, wkey, &desired, missing).await? {
        Some(p) if missing => Ensured::Made(Arc::new(p)),
        Some(_) => Ensured::Held,
        None => Ensured::Deferred,
    })
}

/// Whether `resolved`'s workload (a JobSet, or the TrainJob above it) may
/// create the missing profile `wkey`: no profiled Job or PyTorchJob of its
/// name was created before its JobSet (`namesakes::may_create`).
async fn comes_first(ctx: &Context, wkey: &JobKey, resolved: &Resolved) -> Result<bool> {
    let top = &resolved.top;
    let jobset = resolved
        .chain
        .iter()
        .find(|w| w.kind == WorkloadKind::JobSet);
    let name = jobset.map_or(top.name.as_str(), |js| js.name.as_str());
    // Read as a namesake reads it; not read (gone, its children named
    // otherwise): not stamped, after any namesake.
    let read = super::namesakes::jobset(ctx, &wkey.namespace, name).await?;
    let me = Claimant {
        kind: top.kind,
        uid: top.uid.clone(),
        created: read.and_then(|js| js.created),
    };
    may_create(ctx, wkey, &me).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chain resolved to JobSet `train`, whose own metadata was `top`.
    fn resolved_to(top: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Resolved {
        let jobset = Workload {
            kind: WorkloadKind::JobSet,
            name: "train".into(),
            uid: "js-uid".into(),
        };
        crate::workload::resolve::resolved(vec![jobset], None, top)
    }

    /// What the admission webhook selects a JobSet's or TrainJob's history
    /// on: the family its top-level object named when it was read.
    #[test]
    fn a_workloads_profile_carries_the_family_its_top_names() {
        let key = JobKey::new("ml", "train");
        let mut meta = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta::default();
        let family = memprof_api::family::ANNOTATION_FAMILY;
        meta.annotations = Some(BTreeMap::from([(family.into(), "llama-8b".into())]));
        let p = profile_for(&key, &resolved_to(&meta), 2);
        assert_eq!(
            p.labels().get(LABEL_FAMILY).map(String::as_str),
            Some("llama-8b")
        );
        assert_eq!(p.labels()[LABEL_WORKLOAD_KIND], "JobSet");
        meta.annotations = None;
        let none = profile_for(&key, &resolved_to(&meta), 2);
        assert!(!none.labels().contains_key(LABEL_FAMILY));
    }

    /// `kubectl get mprof -l team=ml` selects a JobSet's profile: it
    /// carries its top-level object's labels, bounded as a Job's profile
    /// carries a Job's, and memprof's own labels are memprof's whatever the
    /// workload claims.
    #[test]
    fn a_workloads_profile_carries_its_tops_labels_bounded() {
        use crate::operator::reconcile::MAX_WORKLOAD_LABELS;
        let key = JobKey::new("ml", "train");
        let mut labels: BTreeMap<String, String> = (0..40)
            .map(|i| (format!("k{i:02}"), "v".to_string()))
            .collect();
        labels.insert("app.kubernetes.io/part-of".into(), "llm".into());
        labels.insert(LABEL_JOB.into(), "forged".into());
        labels.insert(LABEL_WORKLOAD_KIND.into(), "Job".into());
        let meta = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            labels: Some(labels),
            ..Default::default()
        };
        let p = profile_for(&key, &resolved_to(&meta), 2);
        let got = p.labels();
        assert_eq!(got["app.kubernetes.io/part-of"], "llm");
        assert_eq!(got[LABEL_JOB], "train");
        assert_eq!(got[LABEL_WORKLOAD_KIND], "JobSet");
        assert_eq!(got.len(), MAX_WORKLOAD_LABELS + 2, "{got:?}");
    }
}
