//! The workload mark (`memprof_api::workload_mark`) on the links of a
//! workload's chain the webhook sees created: a JobSet's child Job, a
//! TrainJob's JobSet, a PyTorchJob's pod. Like the pod marks (`marks.rs`):
//! given only on the secret path (the API server's word about who creates
//! the object), only when the creator is the identity that creates that
//! link, with the rank labels that creator set; a mark that arrives on any
//! other object is removed.

pub use crate::config::WorkloadIdentities;
use crate::marks::{add_to_metadata_map, Caller, Creation};
use json_patch::jsonptr::PointerBuf;
use json_patch::{PatchOperation, RemoveOperation};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use memprof_api::admission::Keys;
use memprof_api::workload::{
    jobset_identity, pytorch_identity, WorkloadKind, LABEL_JOBSET_JOB_INDEX,
    LABEL_JOBSET_REPLICATED_JOB, LABEL_PYTORCH_REPLICA_INDEX, LABEL_PYTORCH_REPLICA_TYPE,
};
use memprof_api::workload_mark::{sign, Link, ANNOTATION_WORKLOAD_MARK};

/// The kinds of object a workload mark goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Marked {
    /// A pod (of a PyTorchJob).
    Pod,
    /// A Job (of a JobSet).
    Job,
    /// A JobSet (of a TrainJob).
    JobSet,
}

impl Marked {
    fn kind(self) -> &'static str {
        match self {
            Marked::Pod => "Pod",
            Marked::Job => "Job",
            Marked::JobSet => "JobSet",
        }
    }

    /// The controller kind this object's link goes up to, who creates it,
    /// and the rank identity its labels name (`None`: labels missing or
    /// malformed, so no mark: its rank could not be bound).
    fn link<'c>(
        self,
        meta: &ObjectMeta,
        ids: &'c WorkloadIdentities,
    ) -> (WorkloadKind, &'c [String], Option<String>) {
        let label = |k: &str| {
            meta.labels
                .as_ref()
                .and_then(|l| l.get(k))
                .map(String::as_str)
        };
        match self {
            Marked::Pod => (
                WorkloadKind::PyTorchJob,
                &ids.training_operator,
                pytorch_identity(
                    label(LABEL_PYTORCH_REPLICA_TYPE),
                    label(LABEL_PYTORCH_REPLICA_INDEX),
                ),
            ),
            Marked::Job => (
                WorkloadKind::JobSet,
                &ids.jobset,
                jobset_identity(
                    label(LABEL_JOBSET_REPLICATED_JOB),
                    label(LABEL_JOBSET_JOB_INDEX),
                ),
            ),
            Marked::JobSet => (WorkloadKind::TrainJob, &ids.trainer, Some(String::new())),
        }
    }
}

fn controller_uid(meta: &ObjectMeta, kind: WorkloadKind) -> Option<&str> {
    let o = meta
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))?;
    (WorkloadKind::of(&o.api_version, &o.kind) == Some(kind)).then_some(o.uid.as_str())
}

/// Appends to `ops` what gives `meta` (an object of kind `what`, being
/// created) its workload mark, or removes one planted on it.
pub fn mark_link(
    what: Marked,
    meta: &ObjectMeta,
    creation: &Creation<'_>,
    ids: &WorkloadIdentities,
    keys: &Keys,
    ops: &mut Vec<PatchOperation>,
    warnings: &mut Vec<String>,
) {
    if creation.caller == Caller::Unverified {
        return;
    }
    let annotations = meta.annotations.as_ref();
    let planted = annotations.is_some_and(|a| a.contains_key(ANNOTATION_WORKLOAD_MARK));
    let (parent, creators, identity) = what.link(meta, ids);
    let by_creator = creation
        .username
        .is_some_and(|u| creators.iter().any(|c| c == u));
    let mark = by_creator
        .then(|| sign_link(what, meta, creation, parent, identity, keys))
        .flatten();
    match mark {
        Some(mark) => add_to_metadata_map(
            ops,
            annotations.is_some(),
            "annotations",
            ANNOTATION_WORKLOAD_MARK,
            &mark,
        ),
        None if planted => {
            ops.push(PatchOperation::Remove(RemoveOperation {
                path: PointerBuf::from_tokens([
                    "metadata",
                    "annotations",
                    ANNOTATION_WORKLOAD_MARK,
                ]),
            }));
            warnings.push(format!(
                "memprof: removed {ANNOTATION_WORKLOAD_MARK}: only objects their workload's controller creates are marked"
            ));
        }
        None => {}
    }
}

/// The mark of `meta`'s link up to its `parent`-kind controller, when it
/// has one, a rank identity and a name, and the key is loaded.
fn sign_link(
    what: Marked,
    meta: &ObjectMeta,
    creation: &Creation<'_>,
    parent: WorkloadKind,
    identity: Option<String>,
    keys: &Keys,
) -> Option<String> {
    let ring = keys.ring();
    let link = Link {
        namespace: creation.namespace,
        kind: what.kind(),
        name: meta.name.as_deref().filter(|n| !n.is_empty())?,
        controller_uid: controller_uid(meta, parent)?,
        identity: &identity?,
    };
    sign(ring.current()?, &link, creation.now)
}

#[cfg(test)]
mod tests;
