//! Whether a pod is its PyTorchJob's own, and its rank identity: the pod
//! rule of `operator/trust.rs` for the kind whose controller creates pods
//! without a Job between. (A Job's pods keep the admission mark.)
//!
//! A pod counts for PyTorchJob `uid` only if its controller owner reference
//! is that PyTorchJob and its workload mark verifies for (namespace, pod,
//! that uid, the replica type and index its labels name now): the training
//! operator's identity created it with those labels. A tenant's pod naming
//! the PyTorchJob has no mark; a genuine pod relabelled to move its rank
//! fails its mark.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use memprof_api::admission::KeyRing;
use memprof_api::workload::{
    pytorch_identity, WorkloadKind, LABEL_PYTORCH_REPLICA_INDEX, LABEL_PYTORCH_REPLICA_TYPE,
};
use memprof_api::workload_mark::{self, Link, LinkError, ANNOTATION_WORKLOAD_MARK};

/// Why a pod is not its PyTorchJob's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PodRefused {
    /// Its controller is not this PyTorchJob (or none).
    #[error("pod {0} is not controlled by this PyTorchJob")]
    NotControlled(String),
    /// Its replica labels are missing or malformed: no rank.
    #[error(
        "pod {0} has no well-formed training.kubeflow.org/replica-type and replica-index labels"
    )]
    NoRank(String),
    /// Its workload mark does not verify.
    #[error(transparent)]
    Unmarked(#[from] LinkError),
}

/// The rank identity (`master/0`, `worker/3`) of `pod` when it is
/// PyTorchJob `uid`'s own (module docs). O(1): at most two HMACs.
pub fn pytorch_pod(
    pod: &ObjectMeta,
    uid: &str,
    keys: &KeyRing,
    now: Timestamp,
) -> Result<String, PodRefused> {
    let name = pod.name.clone().unwrap_or_default();
    let controlled = pod.owner_references.iter().flatten().any(|o| {
        o.controller == Some(true)
            && o.uid == uid
            && WorkloadKind::of(&o.api_version, &o.kind) == Some(WorkloadKind::PyTorchJob)
    });
    if !controlled {
        return Err(PodRefused::NotControlled(name));
    }
    let label = |k: &str| {
        pod.labels
            .as_ref()
            .and_then(|l| l.get(k))
            .map(String::as_str)
    };
    let identity = pytorch_identity(
        label(LABEL_PYTORCH_REPLICA_TYPE),
        label(LABEL_PYTORCH_REPLICA_INDEX),
    )
    .ok_or_else(|| PodRefused::NoRank(name.clone()))?;
    let link = Link {
        namespace: pod.namespace.as_deref().unwrap_or_default(),
        kind: "Pod",
        name: &name,
        controller_uid: uid,
        identity: &identity,
    };
    let mark = pod
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_WORKLOAD_MARK));
    let created = pod
        .creation_timestamp
        .as_ref()
        .map_or(Timestamp::MIN, |t| t.0);
    workload_mark::verify(keys, mark.map(String::as_str), &link, created, now)?;
    Ok(identity)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
    use memprof_api::admission::Key;
    use std::collections::BTreeMap;

    fn pod(key: Option<&Key>, index: &str, owner_uid: &str) -> ObjectMeta {
        let created = Timestamp::from_second(1_800_000_000).unwrap();
        let mut m = ObjectMeta {
            name: Some("pt-worker-0".into()),
            namespace: Some("ml".into()),
            creation_timestamp: Some(Time(created)),
            labels: Some(BTreeMap::from([
                (LABEL_PYTORCH_REPLICA_TYPE.to_string(), "worker".to_string()),
                (LABEL_PYTORCH_REPLICA_INDEX.to_string(), index.to_string()),
            ])),
            owner_references: Some(vec![OwnerReference {
                api_version: "kubeflow.org/v1".into(),
                kind: "PyTorchJob".into(),
                name: "pt".into(),
                uid: owner_uid.into(),
                controller: Some(true),
                ..Default::default()
            }]),
            ..Default::default()
        };
        if let Some(key) = key {
            let link = Link {
                namespace: "ml",
                kind: "Pod",
                name: "pt-worker-0",
                controller_uid: owner_uid,
                identity: "worker/0",
            };
            let mark = workload_mark::sign(key, &link, created).unwrap();
            m.annotations = Some(BTreeMap::from([(
                ANNOTATION_WORKLOAD_MARK.to_string(),
                mark,
            )]));
        }
        m
    }

    #[test]
    fn only_the_training_operator_s_pod_with_its_own_labels_counts() {
        let key = Key::generate();
        let keys = KeyRing::new(key.clone());
        let now = Timestamp::from_second(1_800_000_100).unwrap();
        assert_eq!(
            pytorch_pod(&pod(Some(&key), "0", "pt-uid"), "pt-uid", &keys, now).as_deref(),
            Ok("worker/0")
        );
        // A tenant's pod naming the PyTorchJob: no mark.
        assert!(matches!(
            pytorch_pod(&pod(None, "0", "pt-uid"), "pt-uid", &keys, now),
            Err(PodRefused::Unmarked(LinkError::Missing { .. }))
        ));
        // The genuine pod relabelled to another rank: its mark fails.
        let mut moved = pod(Some(&key), "0", "pt-uid");
        moved
            .labels
            .as_mut()
            .unwrap()
            .insert(LABEL_PYTORCH_REPLICA_INDEX.into(), "1".into());
        assert!(matches!(
            pytorch_pod(&moved, "pt-uid", &keys, now),
            Err(PodRefused::Unmarked(LinkError::Forged { .. }))
        ));
        // Another PyTorchJob's pod, or one with no rank labels.
        assert!(matches!(
            pytorch_pod(&pod(Some(&key), "0", "pt-uid"), "other-uid", &keys, now),
            Err(PodRefused::NotControlled(_))
        ));
        assert!(matches!(
            pytorch_pod(&pod(Some(&key), "x", "pt-uid"), "pt-uid", &keys, now),
            Err(PodRefused::NoRank(_))
        ));
    }
}
