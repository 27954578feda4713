//! The workload mark (`memprof_api::workload_mark`) on the links of a
//! workload's chain the webhook sees created: a JobSet's child Job, a
//! TrainJob's JobSet, a PyTorchJob's pod. Like the pod marks (`marks.rs`):
//! given only on the secret path (the API server's word about who creates
//! the object), only when the creator is the identity that creates that
//! link, with the rank labels that creator set; a mark that arrives on any
//! other object is removed.

use crate::marks::{add_to_metadata_map, Caller, Creation};
use json_patch::jsonptr::PointerBuf;
use json_patch::{PatchOperation, RemoveOperation};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use memprof_api::admission::Keys;
use memprof_api::workload::{
    jobset_identity, pytorch_identity, WorkloadKind, DEFAULT_JOBSET_IDENTITIES,
    DEFAULT_TRAINER_IDENTITIES, DEFAULT_TRAINING_OPERATOR_IDENTITIES, LABEL_JOBSET_JOB_INDEX,
    LABEL_JOBSET_REPLICATED_JOB, LABEL_PYTORCH_REPLICA_INDEX, LABEL_PYTORCH_REPLICA_TYPE,
};
use memprof_api::workload_mark::{sign, Link, ANNOTATION_WORKLOAD_MARK};

/// Who creates each link (`--jobset-identities`, `--trainer-identities`,
/// `--training-operator-identities`; the chart's `workloads` values).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadIdentities {
    /// Create a JobSet's child Jobs.
    pub jobset: Vec<String>,
    /// Create a TrainJob's JobSet.
    pub trainer: Vec<String>,
    /// Create a PyTorchJob's pods.
    pub training_operator: Vec<String>,
}

impl Default for WorkloadIdentities {
    fn default() -> Self {
        let own = |ids: &[&str]| ids.iter().map(|s| s.to_string()).collect();
        WorkloadIdentities {
            jobset: own(&DEFAULT_JOBSET_IDENTITIES),
            trainer: own(&DEFAULT_TRAINER_IDENTITIES),
            training_operator: own(&DEFAULT_TRAINING_OPERATOR_IDENTITIES),
        }
    }
}

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
    let ring = keys.ring();
    let name = meta.name.as_deref().filter(|n| !n.is_empty());
    let mark = match (
        controller_uid(meta, parent),
        by_creator,
        identity,
        name,
        ring.current(),
    ) {
        (Some(uid), true, Some(identity), Some(name), Some(key)) => {
            let link = Link {
                namespace: creation.namespace,
                kind: what.kind(),
                name,
                controller_uid: uid,
                identity: &identity,
            };
            sign(key, &link, creation.now)
        }
        _ => None,
    };
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

#[cfg(test)]
mod tests;
