//! The top-level workload of a pod's controller.
//!
//! Why not the pod's word: a pod's owner references, like a Job's, are
//! written by whoever creates it. Each link is read from the API server
//! (the caller's `read`, by kind and name, never a cached copy a tenant
//! wrote into), its uid checked against the reference, and trusted only
//! under its workload mark (`memprof_api::workload_mark`): the Job → JobSet
//! link when the JobSet controller's identity created the Job, JobSet →
//! TrainJob when Kubeflow Trainer's created the JobSet. A link that is not
//! proven ends the chain below it: the object under it is its own workload
//! (a tenant's Job claiming another team's JobSet is profiled as the
//! tenant's Job, never counted in the JobSet), and the reason is kept for
//! the profile's conditions.

use crate::operator::reconcile::workload_labels;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use memprof_api::admission::KeyRing;
use memprof_api::family::family_of;
use memprof_api::workload::{
    jobset_identity, WorkloadKind, LABEL_JOBSET_JOB_INDEX, LABEL_JOBSET_REPLICATED_JOB, MAX_CHAIN,
};
use memprof_api::workload_mark::{self, Link, LinkError, ANNOTATION_WORKLOAD_MARK};
use std::collections::BTreeMap;
use std::sync::Arc;

/// One object of a chain: its kind, name and uid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    /// Its kind.
    pub kind: WorkloadKind,
    /// Its name (the profile's, for the top).
    pub name: String,
    /// Its uid.
    pub uid: String,
}

/// Why the chain stopped below where an owner reference pointed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unproven {
    /// The link's workload mark does not verify.
    #[error(transparent)]
    Unmarked(#[from] LinkError),
    /// The named controller is not in the API server (or not by that uid).
    #[error("{kind} {name} (uid {uid}) named as controller does not exist")]
    Gone {
        /// Kind named.
        kind: &'static str,
        /// Name named.
        name: String,
        /// uid named.
        uid: String,
    },
}

/// Why no workload could be resolved at all.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// The pod's own controller is not in the API server by that uid.
    #[error("{kind} {name} (uid {uid}) does not exist: the pod's controller is gone")]
    NoController {
        /// Kind named.
        kind: &'static str,
        /// Name named.
        name: String,
        /// uid named.
        uid: String,
    },
}

/// The resolved workload: the top, every object below it (the start
/// first), and why the chain stopped short of a claimed controller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    /// The top-level workload: the profile is its.
    pub top: Workload,
    /// From the pod's controller up to `top`, at most `MAX_CHAIN` objects.
    pub chain: Vec<Workload>,
    /// Set when an owner reference above `top` was not followed.
    pub unproven: Option<Unproven>,
    /// The family `top` names on itself, as read with it
    /// (`memprof_api::family::family_of`: a label value, at most 63 bytes):
    /// its profile's family label, what the admission webhook predicts from.
    pub family: Option<String>,
    /// The labels `top` carries, as read with it, bounded as every
    /// workload's profile copies them (`workload_labels`: at most
    /// `MAX_WORKLOAD_LABELS`): the profile's, so that `-l team=ml` selects
    /// it. Shared: a JobSet child's membership is cloned on each reconcile.
    pub labels: Arc<BTreeMap<String, String>>,
}

/// What the caller read from the API server: the object's metadata, or
/// `None` when there is no such object.
pub type Read<'a> = dyn FnMut(WorkloadKind, &str) -> Option<ObjectMeta> + 'a;

/// Resolves the workload above `start` (the pod's controller, kind, name
/// and uid from its owner reference), reading each object with `read`.
/// At most `MAX_CHAIN` reads; a cycle cannot form (each kind's parent is a
/// kind above it) and would be cut by the bound anyway. (`read.rs` runs the
/// same steps with reads from the API server.)
pub fn resolve(
    namespace: &str,
    start: Workload,
    read: &mut Read<'_>,
    keys: &KeyRing,
    now: Timestamp,
) -> Result<Resolved, ResolveError> {
    let mut meta = first(&start, read(start.kind, &start.name))?;
    let mut chain = vec![start];
    loop {
        let here = chain.last().expect("the chain starts with one object");
        match step(namespace, here, &meta, chain.len(), keys, now) {
            Step::Top => return Ok(resolved(chain, None, &meta)),
            Step::Unproven(why) => return Ok(resolved(chain, Some(why), &meta)),
            Step::Up(parent) => match accept(&parent, read(parent.kind, &parent.name)) {
                Ok(up) => {
                    chain.push(parent);
                    meta = up;
                }
                Err(why) => return Ok(resolved(chain, Some(why), &meta)),
            },
        }
    }
}

/// What comes after an object of the chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// It is the top: no controller memprof rolls up under, or the bound.
    Top,
    /// Its link up is claimed but not proven: it is the top, for this reason.
    Unproven(Unproven),
    /// Its link up to this controller is proven: read it next.
    Up(Workload),
}

/// The step after `here` (whose metadata, as read, is `meta`), the chain
/// holding `links` objects so far.
pub fn step(
    namespace: &str,
    here: &Workload,
    meta: &ObjectMeta,
    links: usize,
    keys: &KeyRing,
    now: Timestamp,
) -> Step {
    if links >= MAX_CHAIN {
        return Step::Top;
    }
    let Some(parent) = controller_above(here.kind, meta) else {
        return Step::Top;
    };
    match proven(namespace, here, meta, &parent, keys, now) {
        Ok(()) => Step::Up(parent),
        Err(e) => Step::Unproven(e.into()),
    }
}

/// The pod's own controller as read (`read`): it must exist by that uid.
pub fn first(start: &Workload, read: Option<ObjectMeta>) -> Result<ObjectMeta, ResolveError> {
    read.filter(|m| m.uid.as_deref() == Some(start.uid.as_str()))
        .ok_or_else(|| ResolveError::NoController {
            kind: start.kind.kind(),
            name: start.name.clone(),
            uid: start.uid.clone(),
        })
}

/// A controller as read (`read`): it must exist by the uid its child names.
pub fn accept(parent: &Workload, read: Option<ObjectMeta>) -> Result<ObjectMeta, Unproven> {
    read.filter(|m| m.uid.as_deref() == Some(parent.uid.as_str()))
        .ok_or_else(|| Unproven::Gone {
            kind: parent.kind.kind(),
            name: parent.name.clone(),
            uid: parent.uid.clone(),
        })
}

/// The outcome for `chain` (never empty), whose top's metadata is
/// `top_meta`: what the profile takes of the top (its family, its labels)
/// is read from the top alone, never from an object below it.
pub fn resolved(
    chain: Vec<Workload>,
    unproven: Option<Unproven>,
    top_meta: &ObjectMeta,
) -> Resolved {
    let top = chain
        .last()
        .expect("the chain starts with one object")
        .clone();
    let annotations = top_meta.annotations.as_ref();
    let family = annotations.and_then(|a| family_of(a)).map(str::to_string);
    let labels = top_meta.labels.as_ref().map(workload_labels);
    Resolved {
        top,
        chain,
        unproven,
        family,
        labels: Arc::new(labels.unwrap_or_default()),
    }
}

/// The controller owner reference of `meta` when it names the kind that
/// may control `kind` in a chain (`WorkloadKind::parent`); `None` ends the
/// chain (no controller, or one memprof does not roll up under).
pub fn controller_above(kind: WorkloadKind, meta: &ObjectMeta) -> Option<Workload> {
    let want = kind.parent()?;
    let owner = meta
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))?;
    (WorkloadKind::of(&owner.api_version, &owner.kind) == Some(want)).then(|| Workload {
        kind: want,
        name: owner.name.clone(),
        uid: owner.uid.clone(),
    })
}

/// The rank identity a link's mark binds: a JobSet's child Job's replicated
/// job and index (empty when it has none: a JobSet's own link to its TrainJob).
pub fn link_identity(kind: WorkloadKind, meta: &ObjectMeta) -> String {
    if kind != WorkloadKind::Job {
        return String::new();
    }
    let label = |k: &str| {
        meta.labels
            .as_ref()
            .and_then(|l| l.get(k))
            .map(String::as_str)
    };
    jobset_identity(
        label(LABEL_JOBSET_REPLICATED_JOB),
        label(LABEL_JOBSET_JOB_INDEX),
    )
    .unwrap_or_default()
}

/// Whether the link from `here` (whose metadata is `meta`) up to `parent`
/// carries a workload mark that verifies.
fn proven(
    namespace: &str,
    here: &Workload,
    meta: &ObjectMeta,
    parent: &Workload,
    keys: &KeyRing,
    now: Timestamp,
) -> Result<(), LinkError> {
    let identity = link_identity(here.kind, meta);
    let link = Link {
        namespace,
        kind: here.kind.kind(),
        name: &here.name,
        controller_uid: &parent.uid,
        identity: &identity,
    };
    let mark = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_WORKLOAD_MARK))
        .map(String::as_str);
    let created = meta
        .creation_timestamp
        .as_ref()
        .map_or(Timestamp::MIN, |t| t.0);
    workload_mark::verify(keys, mark, &link, created, now)
}

#[cfg(test)]
mod tests;
