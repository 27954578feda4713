//! The workloads that claim one name's profile (`workload::claim`): a
//! profiled Job, a profiled PyTorchJob and a profiled JobSet (or the
//! TrainJob above it) of that name, as known when a path is about to
//! create the missing profile; and what a claimant left without one is
//! told.
//!
//! A Job and a PyTorchJob of one name share the queue key, a JobSet's
//! profile is made in its child Jobs' reconciles: whichever runs first,
//! each asks [`may_create`] the same question on the same objects, so the
//! one created first makes the profile, whether or not the operator ran
//! when they were made.

use super::state::Context;
use crate::key::JobKey;
use crate::operator::reconcile::profiling_enabled;
use crate::operator::{Error, Result};
use crate::workload::claim::{claim, comes_first, taken_message, Claim, Claimant};
use crate::workload::rank::PyTorchShape;
use crate::workload::read::api_resource;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use memprof_api::workload::WorkloadKind;
use memprof_api::{MemoryProfile, ANNOTATION_ENABLED, OPERATOR_MANAGER};
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};

/// How soon the path of `key` that left the missing profile to a namesake
/// (or lost the create to one) looks again (`namesake_wait::NamesakeWait`).
pub(super) fn deferred(ctx: &Context, key: &JobKey) -> Duration {
    ctx.with_state(key, |s| s.namesake_wait.waits())
}

/// What a path's ensuring of its profile came to.
pub(super) enum Ensured {
    /// The profile is the workload's (as it was, or applied again).
    Held,
    /// Created now (the watch cache may not hold it yet).
    Made(Arc<MemoryProfile>),
    /// Not made: a namesake comes first, or made it meanwhile.
    Deferred,
}

/// When the API server created `meta`'s object.
pub(super) fn created(meta: &ObjectMeta) -> Option<jiff::Timestamp> {
    meta.creation_timestamp.as_ref().map(|t| t.0)
}

/// Whether `me` may create the missing profile of `key`: no profiled
/// namesake comes before it (`workload::claim::comes_first`). Reads the
/// JobSet of the name from the API server (JobSets are not cached), so
/// only when a profile is missing.
pub(super) async fn may_create(ctx: &Context, key: &JobKey, me: &Claimant) -> Result<bool> {
    let mut others: Vec<Claimant> = [job(ctx, key), pytorchjob(ctx, key)]
        .into_iter()
        .flatten()
        .collect();
    if !matches!(me.kind, WorkloadKind::JobSet | WorkloadKind::TrainJob) {
        others.extend(jobset(ctx, &key.namespace, &key.name).await?);
    }
    Ok(comes_first(me, &others))
}

/// The profiled Job `key` names, as cached, unless it is being deleted or
/// is a proven JobSet child (its reports are its workload's).
fn job(ctx: &Context, key: &JobKey) -> Option<Claimant> {
    let job = ctx
        .caches
        .jobs
        .get(&ObjectRef::new(&key.name).within(&key.namespace))?;
    if job.metadata.deletion_timestamp.is_some() || !profiling_enabled(&job) {
        return None;
    }
    let uid = job.uid()?;
    let child = ctx.with_state(key, |s| {
        let m = s.workload.as_ref();
        m.is_some_and(|m| m.job_uid == uid && m.resolved.is_some())
    });
    (!child).then(|| Claimant {
        kind: WorkloadKind::Job,
        uid,
        created: created(&job.metadata),
    })
}

/// The profiled PyTorchJob `key` names, as cached (a malformed spec gets
/// no profile: it claims none).
fn pytorchjob(ctx: &Context, key: &JobKey) -> Option<Claimant> {
    let at = ObjectRef::new_with(&key.name, api_resource(WorkloadKind::PyTorchJob))
        .within(&key.namespace);
    let pt = ctx.pytorch.jobs.get(&at)?;
    let enabled = pt.annotations().get(ANNOTATION_ENABLED).map(String::as_str) == Some("true");
    if pt.metadata.deletion_timestamp.is_some() || !enabled {
        return None;
    }
    PyTorchShape::from_spec(&pt.data["spec"]).ok()?;
    Some(Claimant {
        kind: WorkloadKind::PyTorchJob,
        uid: pt.uid()?,
        created: created(&pt.metadata),
    })
}

/// JobSet `name` of namespace `ns`, read from the API server, when one of
/// its child Jobs (as cached) is profiled: then its path makes the
/// profile, the TrainJob's that controls it when there is one (created
/// with it, named alike).
pub(super) async fn jobset(ctx: &Context, ns: &str, name: &str) -> Result<Option<Claimant>> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), ns, &api_resource(WorkloadKind::JobSet));
    let got = match api.get_opt(name).await {
        Ok(got) => got,
        // Not served (no JobSet CRD: a plain-text 404 that `get_opt` does
        // not read as "none"), or not the operator's to read: then it
        // profiles no JobSet either (its links are read the same way), and
        // none claims the name. Read as an error, no Job on a cluster
        // without JobSets got a profile (the fault tests' control planes).
        Err(kube::Error::Api(e)) if e.code == 403 || e.code == 404 => None,
        Err(e) => {
            return Err(Error::Workload(format!(
                "reading JobSet {ns}/{name} to know whose the profile of its name is: {e}"
            )))
        }
    };
    let Some(js) = got.filter(|o| o.metadata.deletion_timestamp.is_none()) else {
        return Ok(None);
    };
    let uid = js.uid().unwrap_or_default();
    if !children(&js, name).any(|child| profiled_child(ctx, ns, &child, &uid)) {
        return Ok(None);
    }
    let trainjob = js.owner_references().iter().find(|o| {
        o.controller == Some(true)
            && WorkloadKind::of(&o.api_version, &o.kind) == Some(WorkloadKind::TrainJob)
    });
    let (kind, uid) = match trainjob {
        Some(o) => (WorkloadKind::TrainJob, o.uid.clone()),
        None => (WorkloadKind::JobSet, uid),
    };
    Ok(Some(Claimant {
        kind,
        uid,
        created: created(&js.metadata),
    }))
}

/// The names of JobSet `js`'s child Jobs, as the JobSet controller names
/// them (`<jobset>-<replicatedJob>-<index>`).
fn children<'a>(js: &'a DynamicObject, name: &'a str) -> impl Iterator<Item = String> + 'a {
    let specs = js.data["spec"]["replicatedJobs"].as_array();
    specs.into_iter().flatten().flat_map(move |rj| {
        let rjob = rj["name"].as_str().unwrap_or_default().to_string();
        let replicas = rj["replicas"].as_u64().unwrap_or(1);
        (0..replicas).map(move |i| format!("{name}-{rjob}-{i}"))
    })
}

/// Whether cached Job `name` is JobSet `uid`'s child and profiled.
fn profiled_child(ctx: &Context, ns: &str, name: &str, uid: &str) -> bool {
    let at = ObjectRef::new(name).within(ns);
    ctx.caches.jobs.get(&at).is_some_and(|j| {
        let controlled = j
            .owner_references()
            .iter()
            .any(|o| o.controller == Some(true) && o.uid == uid);
        controlled && profiling_enabled(&j)
    })
}

/// A reference to workload `kind` named by `key`, for Events.
pub(super) fn reference(kind: WorkloadKind, key: &JobKey, uid: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some(kind.api_version().into()),
        kind: Some(kind.kind().into()),
        name: Some(key.name.clone()),
        namespace: Some(key.namespace.clone()),
        uid: Some(uid.into()),
        ..Default::default()
    }
}

/// Says once per claimant (by uid) that the profile of its name is
/// another workload's: a Warning Event on the claimant, and the log.
pub(super) async fn announce_taken(
    ctx: &Context,
    key: &JobKey,
    uid: &str,
    regarding: ObjectReference,
    note: String,
) {
    let first = ctx.with_state(key, |s| s.name_taken.insert(uid.to_string()));
    if !first {
        return;
    }
    warn!(workload = %key, "{note}");
    let reporter = Reporter {
        controller: OPERATOR_MANAGER.into(),
        instance: None,
    };
    let event = Event {
        type_: EventType::Warning,
        reason: "ProfileNameTaken".into(),
        note: Some(note),
        action: "Profile".into(),
        secondary: None,
    };
    let recorder = Recorder::new(ctx.client.clone(), reporter);
    if let Err(error) = recorder.publish(&event, &regarding).await {
        let advice = crate::status::advice(&error, "events.k8s.io events: create, patch");
        warn!(%error, "cannot publish Event: {advice}; not retried");
    }
}

/// How soon a claimant looks again at an ownerless profile that memprof
/// is settling: a recreation it has not recorded the end of, or a stale
/// profile deleted just now.
pub(super) const SETTLING: Duration = Duration::from_secs(1);

/// What a claimant may do with its name's profile now (`workload::claim`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Taken {
    /// Nothing stands in the way: roll it up, or make it.
    No,
    /// A namesake's: nothing of the claimant is rolled up or acted on
    /// under the name (it is told once).
    Theirs,
    /// Being settled (memprof's recreation under way, or a stale profile
    /// deleted now): look again in [`SETTLING`].
    Settling,
}

impl Taken {
    /// When to look again, `theirs` for a namesake's profile; `None`: go on.
    pub(super) fn look_again(self, theirs: Duration) -> Option<Duration> {
        match self {
            Taken::No => None,
            Taken::Theirs => Some(theirs),
            Taken::Settling => Some(SETTLING),
        }
    }
}

/// What `profile` (the name's, as the caller knows it) is to workload
/// `me` (`workload::claim`): a namesake's (the claimant is
/// told once, and nothing of it is rolled up or acted on under the name);
/// memprof's own recreation under way; stale (its workload gone, and the
/// claimant not the replacement memprof recorded: deleted now, so that the
/// claimant gets a fresh one and no stranger inherits a history).
pub(super) async fn taken(
    ctx: &Context,
    key: &JobKey,
    me: &Claimant,
    profile: Option<&MemoryProfile>,
) -> Result<Taken> {
    let (kind, uid) = (me.kind, me.uid.as_str());
    match claim(profile, me) {
        Claim::Free | Claim::Ours => Ok(Taken::No),
        Claim::Settling => Ok(Taken::Settling),
        Claim::Stale => {
            if let Some(stale) = profile {
                drop_stale(ctx, key, stale).await?;
            }
            Ok(Taken::Settling)
        }
        Claim::Theirs(owner) => {
            let regarding = reference(kind, key, uid);
            let note = taken_message(kind, &key.name, &owner);
            announce_taken(ctx, key, uid, regarding, note).await;
            Ok(Taken::Theirs)
        }
    }
}

/// Deletes `stale`, the ownerless profile of `key` judged so, as judged:
/// its uid and resourceVersion are preconditions, so a record memprof
/// wrote since (which may name a successor) keeps it for the next look.
async fn drop_stale(ctx: &Context, key: &JobKey, stale: &MemoryProfile) -> Result<()> {
    if !delete_profile(ctx, stale, Version::Judged).await? {
        return Ok(());
    }
    ctx.writer.forget(key);
    ctx.with_state(key, |s| s.profile = None);
    info!(profile = %key, "deleted a MemoryProfile whose workload is gone: memprof did not create its namesake");
    Ok(())
}

/// Which copy of a profile a delete may remove.
#[derive(Clone, Copy, Debug)]
pub(super) enum Version {
    /// Any version of this very profile (its uid): never a newer profile
    /// that took the name meanwhile.
    Any,
    /// Only the version that was judged: a write since then is judged again.
    Judged,
}

/// Deletes `profile` under the preconditions `version` names; `false` when
/// it was already gone or the preconditions no longer held (nothing to do).
/// Every delete of a profile goes through here.
pub(super) async fn delete_profile(
    ctx: &Context,
    profile: &MemoryProfile,
    version: Version,
) -> Result<bool> {
    let (namespace, name) = (profile.namespace().unwrap_or_default(), profile.name_any());
    let resource_version = match version {
        Version::Any => None,
        Version::Judged => profile.resource_version(),
    };
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: profile.uid(),
            resource_version,
        }),
        ..Default::default()
    };
    let api: Api<MemoryProfile> = Api::namespaced(ctx.client.clone(), &namespace);
    match api.delete(&name, &params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.is_not_found() || s.is_conflict() => Ok(false),
        Err(source) => Err(Error::DeleteProfile {
            namespace,
            name,
            source,
        }),
    }
}

/// Writes the profile `desired` of `key`: created when `missing` (a
/// create, never an apply, which would take over one a namesake made
/// meanwhile: `None` then), else applied again (ours, drifted).
pub(super) async fn write_profile(
    ctx: &Context,
    key: &JobKey,
    desired: &MemoryProfile,
    missing: bool,
) -> Result<Option<MemoryProfile>> {
    let api: Api<MemoryProfile> = Api::namespaced(ctx.client.clone(), &key.namespace);
    let failed = |source| Error::ApplyProfile {
        namespace: key.namespace.clone(),
        name: key.name.clone(),
        source,
    };
    let written = if missing {
        let params = PostParams {
            field_manager: Some(OPERATOR_MANAGER.into()),
            ..Default::default()
        };
        match api.create(&params, desired).await {
            Ok(p) => p,
            // A namesake's, made since the cache was read: the next
            // reconcile (its watch event) judges whose it is.
            Err(kube::Error::Api(e)) if e.code == 409 => return Ok(None),
            Err(source) => return Err(failed(source)),
        }
    } else {
        let params = PatchParams::apply(OPERATOR_MANAGER).force();
        api.patch(&key.name, &params, &Patch::Apply(desired))
            .await
            .map_err(failed)?
    };
    ctx.writer.observe(key, &written);
    Ok(Some(written))
}
