//! Kubeflow PyTorchJobs: one profile per profiled PyTorchJob (annotated
//! `memprof.dev/enabled`, labelled `memprof.dev/managed` by the webhook),
//! named after it and owned by it, rolled up over the reports of the pods
//! proven its own (`workload::pods`: its controller reference, as the
//! training operator writes it, and the workload mark the webhook gives
//! only the training operator's pods) by rank (`workload::rank`: the
//! master, then each worker, torchrun's RANK).
//!
//! The kind is optional (`pytorch_watch.rs`: its watches start once the
//! API is served; the operator runs without it). A PyTorchJob and a Job of
//! the same name share the queue key (namespace, name): one reconcile runs
//! this path, then the Job's, never two at once. The profile is the workload's whose uid it
//! already names as owner (`workload::claim`); a namesake of another kind
//! or uid gets none, and a Warning Event that says why.
//!
//! Its roll-up is kept between reconciles, as a JobSet's
//! (`workload_index.rs`): a report event, or a change of one of its pods
//! (`pytorch_watch.rs` names the pod), screens that report again, not
//! every rank. Its remediation is the remediation stage's, in the same
//! reconcile (`remediation_stage.rs`); its risk Events and `memprof.dev/`
//! annotations go on the PyTorchJob, its refused reports' `ReportRejected`
//! Events on its profile (`workload_refresh::submit`).

use super::namesakes::{
    created, deferred, delete_profile, may_create, taken, write_profile, Ensured, Taken, Version,
};
use super::state::Context;
use super::workload_refresh::{drop_rollup, refresh, Turn};
use crate::key::JobKey;
use crate::operator::rbac::ensure_reporter_rbac;
use crate::operator::reconcile::{profile_outdated, profiling_enabled, workload_labels};
use crate::operator::{Error, Result};
use crate::remediation::replaced_by_memprof;
use crate::workload::claim::Claimant;
use crate::workload::rank::PyTorchShape;
use crate::workload::read::api_resource;
use crate::workload::resolve::Workload;
use crate::workload::rollup::Layout;
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::DynamicObject;
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use memprof_api::family::{family_of, LABEL_FAMILY};
use memprof_api::workload::{WorkloadKind, LABEL_WORKLOAD_KIND};
use memprof_api::{MemoryProfile, MemoryProfileSpec, ANNOTATION_ENABLED, LABEL_JOB};
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};

/// Periodic look at a PyTorchJob even without changes (as for a Job).
const RESYNC: Duration = Duration::from_secs(300);

/// The profiled PyTorchJob named by `key`, as cached.
fn cached(ctx: &Context, key: &JobKey) -> Option<Arc<DynamicObject>> {
    let at = ObjectRef::new_with(&key.name, api_resource(WorkloadKind::PyTorchJob))
        .within(&key.namespace);
    ctx.pytorch.jobs.get(&at)
}

fn cached_profile(ctx: &Context, key: &JobKey) -> Option<Arc<MemoryProfile>> {
    ctx.caches
        .profiles
        .get(&ObjectRef::new(&key.name).within(&key.namespace))
}

/// What the PyTorchJob path did in one reconcile.
#[derive(Default)]
pub(super) struct Ran {
    /// When to look again (`None`: no profiled PyTorchJob of this name).
    pub again: Option<Duration>,
    /// The profile it created now, which the watch cache may not hold yet:
    /// a Job of the name is judged on it.
    pub made: Option<Arc<MemoryProfile>>,
}

impl Ran {
    fn again(after: Duration) -> Ran {
        Ran {
            again: Some(after),
            made: None,
        }
    }
}

/// Rolls up the PyTorchJob named by `key`, if one is profiled, and hands
/// its status to the writer.
pub(super) async fn run(ctx: &Context, key: &JobKey) -> Result<Ran> {
    let Some(pt) = cached(ctx, key) else {
        return Ok(Ran::default());
    };
    if pt.metadata.deletion_timestamp.is_some() {
        // The garbage collector removes the profile with it.
        return Ok(Ran::default());
    }
    let uid = pt.uid().unwrap_or_default();
    if pt.annotations().get(ANNOTATION_ENABLED).map(String::as_str) != Some("true") {
        switch_off(ctx, key, &uid).await?;
        return Ok(Ran::default());
    }
    let shape = PyTorchShape::from_spec(&pt.data["spec"])
        .map_err(|e| Error::Workload(format!("PyTorchJob {}: {e}", key)))?;
    if let Some(again) = standing(ctx, key, &pt).await?.look_again(RESYNC) {
        return Ok(Ran::again(again));
    }
    let now = Timestamp::now();
    let recorded = || cached_profile(ctx, key).and_then(|p| p.status.clone());
    let previous = ctx.writer.view(key).or_else(recorded);
    // A cached PyTorchJob memprof is recreating: owned by it again, the
    // profile would go with it.
    let mut made = None;
    if !replaced_by_memprof(previous.as_ref(), &uid) {
        match ensure_profile(ctx, key, &pt, shape.ranks()).await? {
            Ensured::Held => {}
            Ensured::Made(p) => made = Some(p),
            Ensured::Deferred => return Ok(Ran::again(deferred(ctx, key))),
        }
    }
    // Incremental: the reports and pods noted under its name since the
    // last reconcile, not every rank (`workload_refresh.rs`).
    let workload = Workload {
        kind: WorkloadKind::PyTorchJob,
        name: key.name.clone(),
        uid: uid.clone(),
    };
    let turn = Turn {
        claimed: key,
        child: None,
        workload: &workload,
        layout: Layout::PyTorchJob { uid, shape },
        annotations: Some(pt.annotations()),
        injected_from: pt.annotations(),
        wkey: key,
    };
    let out = refresh(ctx, &turn, previous.as_ref(), now);
    let profile = cached_profile(ctx, key);
    let seen = (profile.as_deref(), previous.as_ref());
    super::workload_refresh::submit(ctx, (key, &workload), seen, out.desired);
    Ok(Ran {
        again: Some(look_again(now, out.next)),
        made,
    })
}

/// When to look again: when the roll-up next changes with no event
/// (`next`), within 100 ms and [`RESYNC`].
fn look_again(now: Timestamp, next: Option<Timestamp>) -> Duration {
    let next = next.map(|t| Duration::try_from(now.duration_until(t)).unwrap_or_default());
    next.map_or(RESYNC, |d| d.clamp(Duration::from_millis(100), RESYNC))
}

/// Profiling was switched off: the PyTorchJob's own profile is deleted
/// (never a namesake's, nor one that took the name meanwhile).
async fn switch_off(ctx: &Context, key: &JobKey, uid: &str) -> Result<()> {
    drop_rollup(ctx, key, uid);
    let profile = cached_profile(ctx, key);
    let Some(p) = profile.filter(|p| p.owner_references().iter().any(|o| o.uid == uid)) else {
        return Ok(());
    };
    delete_profile(ctx, &p, Version::Any).await?;
    ctx.writer.forget(key);
    info!(workload = %key, "profiling switched off: deleted the PyTorchJob's MemoryProfile");
    Ok(())
}

/// The PyTorchJob's profile: named after it, owned by it, labelled with its
/// kind, the family it names on itself (`memprof_api::family`), which the
/// admission webhook selects its history on, and its own labels as the
/// cache keeps them (`slim::pytorchjob`), bounded as a Job's profile copies
/// a Job's (`workload_labels`), which `-l` selects on.
fn profile_for(key: &JobKey, pt: &DynamicObject, ranks: u32) -> MemoryProfile {
    let uid = pt.uid().unwrap_or_default();
    let kind = WorkloadKind::PyTorchJob;
    let mut p = MemoryProfile::new(
        &key.name,
        MemoryProfileSpec {
            job_name: key.name.clone(),
            expected_ranks: Some(ranks),
        },
    );
    p.metadata.namespace = Some(key.namespace.clone());
    let mut labels = workload_labels(pt.labels());
    labels.insert(LABEL_JOB.to_string(), key.name.clone());
    labels.insert(LABEL_WORKLOAD_KIND.to_string(), kind.kind().to_string());
    if let Some(family) = family_of(pt.annotations()) {
        labels.insert(LABEL_FAMILY.to_string(), family.to_string());
    }
    p.metadata.labels = Some(labels);
    p.metadata.owner_references = Some(vec![OwnerReference {
        api_version: kind.api_version().into(),
        kind: kind.kind().into(),
        name: key.name.clone(),
        uid,
        controller: Some(false),
        block_owner_deletion: Some(true),
    }]);
    p
}

/// Creates the profile when there is none and no profiled namesake comes
/// first (a create, not an apply: a namesake that made it meanwhile keeps
/// it), or applies it again when ours drifted; and grants each replica's
/// service account leave to write its reports.
async fn ensure_profile(
    ctx: &Context,
    key: &JobKey,
    pt: &DynamicObject,
    ranks: u32,
) -> Result<Ensured> {
    let desired = profile_for(key, pt, ranks);
    let known = cached_profile(ctx, key);
    if known
        .as_deref()
        .is_some_and(|p| !profile_outdated(Some(p), &desired))
    {
        return Ok(Ensured::Held);
    }
    let me = Claimant {
        kind: WorkloadKind::PyTorchJob,
        uid: pt.uid().unwrap_or_default(),
        created: created(&pt.metadata),
    };
    if known.is_none() && !may_create(ctx, key, &me).await? {
        return Ok(Ensured::Deferred);
    }
    for sa in service_accounts(pt) {
        if let Err(e) = ensure_reporter_rbac(&ctx.client, &key.namespace, &sa).await {
            warn!(error = %e, service_account = sa, "cannot grant the sidecars leave to write MemoryReports");
        }
    }
    let missing = known.is_none();
    Ok(match write_profile(ctx, key, &desired, missing).await? {
        Some(p) if missing => Ensured::Made(Arc::new(p)),
        Some(_) => Ensured::Held,
        None => Ensured::Deferred,
    })
}

/// The service accounts the PyTorchJob's replicas run as.
fn service_accounts(pt: &DynamicObject) -> Vec<String> {
    let specs = &pt.data["spec"]["pytorchReplicaSpecs"];
    let mut out: Vec<String> = ["Master", "Worker"]
        .iter()
        .filter(|t| specs.get(**t).is_some())
        .map(|t| {
            specs[*t]["template"]["spec"]["serviceAccountName"]
                .as_str()
                .unwrap_or("default")
                .to_string()
        })
        .collect();
    out.dedup();
    out
}

/// What the profile of `key` is to PyTorchJob `pt` (`namesakes::taken`).
async fn standing(ctx: &Context, key: &JobKey, pt: &DynamicObject) -> Result<Taken> {
    let me = Claimant {
        kind: WorkloadKind::PyTorchJob,
        uid: pt.uid().unwrap_or_default(),
        created: created(&pt.metadata),
    };
    taken(ctx, key, &me, cached_profile(ctx, key).as_deref()).await
}

/// Whether profiled Job `job` must leave its name's `profile` alone
/// (`Taken::No`: it need not): another workload's (a PyTorchJob's, a
/// JobSet's; the Job path neither rolls it up nor acts on it, and the Job
/// is told once), or settling (`namesakes::taken`). (A Job not profiled
/// only ever deletes a profile it owns: left alone.)
pub(super) async fn namesake_job(
    ctx: &Context,
    key: &JobKey,
    job: &Job,
    profile: Option<&MemoryProfile>,
) -> Result<Taken> {
    if !profiling_enabled(job) || job.metadata.deletion_timestamp.is_some() {
        // Being deleted, it claims nothing (the roll-up stage leaves it
        // alone), least of all a profile the collector is parting from it.
        return Ok(Taken::No);
    }
    let me = Claimant {
        kind: WorkloadKind::Job,
        uid: job.uid().unwrap_or_default(),
        created: created(&job.metadata),
    };
    taken(ctx, key, &me, profile).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the admission webhook selects a PyTorchJob's history on: the
    /// family it names on itself, when that is a label value.
    #[test]
    fn a_pytorchjobs_profile_carries_its_own_family() {
        let key = JobKey::new("ml", "train");
        let pt = |family: &str| -> DynamicObject {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                "metadata": {"name": "train", "uid": "pt-uid",
                             "annotations": {"memprof.dev/family": family}},
            }))
            .unwrap()
        };
        let p = profile_for(&key, &pt("llama-8b"), 3);
        assert_eq!(
            p.labels().get(LABEL_FAMILY).map(String::as_str),
            Some("llama-8b")
        );
        assert_eq!(p.owner_references()[0].uid, "pt-uid");
        let bad = profile_for(&key, &pt("not a label"), 3);
        assert!(!bad.labels().contains_key(LABEL_FAMILY));
    }

    /// `kubectl get mprof -l team=ml` selects a PyTorchJob's profile: it
    /// carries the PyTorchJob's labels, bounded as a Job's profile carries
    /// a Job's; memprof's own labels are memprof's whatever it claims.
    #[test]
    fn a_pytorchjobs_profile_carries_its_labels_bounded() {
        use crate::operator::reconcile::MAX_WORKLOAD_LABELS;
        let key = JobKey::new("ml", "train");
        let mut labels: serde_json::Map<String, serde_json::Value> =
            (0..40).map(|i| (format!("k{i:02}"), "v".into())).collect();
        labels.insert("app.kubernetes.io/part-of".into(), "llm".into());
        labels.insert(LABEL_JOB.into(), "forged".into());
        let pt: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": "train", "uid": "pt-uid", "labels": labels},
        }))
        .unwrap();
        let p = profile_for(&key, &pt, 3);
        let got = p.labels();
        assert_eq!(got["app.kubernetes.io/part-of"], "llm");
        assert_eq!(got[LABEL_JOB], "train");
        assert_eq!(got[LABEL_WORKLOAD_KIND], "PyTorchJob");
        assert_eq!(got.len(), MAX_WORKLOAD_LABELS + 2, "{got:?}");
    }
}
