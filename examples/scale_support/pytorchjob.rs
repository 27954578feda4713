//! A PyTorchJob of one master and `ranks - 1` workers and its pods, made
//! as the training operator would make them (the local control plane runs
//! no training operator: the stand-in CRD of
//! `tests/fixtures/workloads/crds.yaml`, installed by `jobset.rs`).
//!
//! What makes the operator count a pod, as `tests/pytorchjobs.rs` does it:
//! a controlling ownerReference to the PyTorchJob, its labels
//! (`training.kubeflow.org/job-name`, `…/replica-type`, `…/replica-index`)
//! and the workload mark the webhook gives pods that the training
//! operator's identity creates (`memprof.dev/workload-mark`, signed here
//! under the namespace's admission key just before the create: the mark
//! binds the pod's name, the PyTorchJob's uid and the rank identity
//! `master/0` or `worker/<i>`, within the pod's creation window). The rank
//! is torchrun's: the master 0, worker `i` is `i + 1`.

use super::jobset::install_workload_crds;
use super::setup::{admission_key, job_name, set_writer_key, trainer, RankPod};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DynamicObject, PostParams};
use kube::{Client, ResourceExt};
use memprof::api::admission::{Key, LABEL_MANAGED};
use memprof::api::workload::{
    WorkloadKind, LABEL_PYTORCH_REPLICA_INDEX, LABEL_PYTORCH_REPLICA_TYPE, LABEL_TRAINING_JOB_NAME,
};
use memprof::api::workload_mark::{sign, Link, ANNOTATION_WORKLOAD_MARK};
use memprof::api::ANNOTATION_ENABLED;
use memprof::workload::read::api_resource;
use serde_json::json;
use std::collections::BTreeMap;

/// Requests in flight while setting up (as `setup.rs`).
const SETUP_CONCURRENCY: usize = 16;

/// Creates PyTorchJob [`job_name`]`(0)` of one master and `ranks - 1`
/// workers, profiled as the webhook stamps one, and every pod; returns the
/// pods, rank by rank.
pub async fn create_pytorchjob(
    client: &Client,
    ns: &str,
    ranks: u32,
) -> anyhow::Result<Vec<RankPod>> {
    anyhow::ensure!(ranks > 0, "a PyTorchJob has a master: --ranks 1 or more");
    install_workload_crds(client).await?;
    let name = job_name(0);
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), ns, &api_resource(WorkloadKind::PyTorchJob));
    let manifest: DynamicObject = serde_json::from_value(pytorchjob(&name, ranks - 1))?;
    let pt = api.create(&PostParams::default(), &manifest).await?;
    let pt_uid = pt.uid().unwrap_or_default();
    let key = admission_key(client, ns)
        .await?
        .current()
        .expect("ensure_keys returns a key")
        .clone();
    set_writer_key(&key, ns);
    let pod_api: Api<Pod> = Api::namespaced(client.clone(), ns);
    futures::stream::iter(0..ranks)
        .map(|rank| {
            let (api, key, name, pt_uid) = (pod_api.clone(), &key, &name, &pt_uid);
            async move {
                let pod = rank_pod(ns, name, pt_uid, rank, key);
                let pod_name = pod.name_any();
                let created = api.create(&PostParams::default(), &pod).await?;
                anyhow::Ok(RankPod {
                    job: 0,
                    rank,
                    owner: name.clone(),
                    name: pod_name,
                    uid: created.uid().unwrap_or_default(),
                })
            }
        })
        .buffered(SETUP_CONCURRENCY)
        .try_collect()
        .await
}

/// The PyTorchJob: one master and `workers` workers, annotated and
/// labelled as the webhook leaves a profiled one.
fn pytorchjob(name: &str, workers: u32) -> serde_json::Value {
    let kind = WorkloadKind::PyTorchJob;
    let template = json!({"spec": {"restartPolicy": "Never",
        "containers": [{"name": "pytorch", "image": "busybox"}]}});
    json!({"apiVersion": kind.api_version(), "kind": kind.kind(),
           "metadata": {"name": name,
               "labels": {LABEL_MANAGED: "true"},
               "annotations": {ANNOTATION_ENABLED: "true"}},
           "spec": {"pytorchReplicaSpecs": {
               "Master": {"replicas": 1, "template": template.clone()},
               "Worker": {"replicas": workers, "template": template}}}})
}

/// The pod of `rank` of PyTorchJob `pt` (uid `pt_uid`) as the training
/// operator writes it, with the workload mark the webhook gives its pods.
fn rank_pod(ns: &str, pt: &str, pt_uid: &str, rank: u32, key: &Key) -> Pod {
    let (rtype, index) = match rank {
        0 => ("master", 0),
        r => ("worker", r - 1),
    };
    let name = format!("{pt}-{rtype}-{index}");
    let identity = format!("{rtype}/{index}");
    let link = Link {
        namespace: ns,
        kind: "Pod",
        name: &name,
        controller_uid: pt_uid,
        identity: &identity,
    };
    let mark = sign(key, &link, jiff::Timestamp::now()).expect("an identity without a newline");
    let mut pod = Pod {
        spec: Some(PodSpec {
            restart_policy: Some("Never".into()),
            containers: vec![trainer()],
            // As setup.rs: no kubelet runs it.
            automount_service_account_token: Some(false),
            ..Default::default()
        }),
        ..Default::default()
    };
    pod.metadata.name = Some(name);
    pod.metadata.labels = Some(BTreeMap::from([
        (LABEL_TRAINING_JOB_NAME.to_string(), pt.to_string()),
        (LABEL_PYTORCH_REPLICA_TYPE.to_string(), rtype.to_string()),
        (LABEL_PYTORCH_REPLICA_INDEX.to_string(), index.to_string()),
        (LABEL_MANAGED.to_string(), "true".to_string()),
    ]));
    pod.metadata.annotations = Some(BTreeMap::from([(
        ANNOTATION_WORKLOAD_MARK.to_string(),
        mark,
    )]));
    pod.metadata.owner_references = Some(vec![OwnerReference {
        api_version: WorkloadKind::PyTorchJob.api_version().into(),
        kind: WorkloadKind::PyTorchJob.kind().into(),
        name: pt.into(),
        uid: pt_uid.into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }]);
    pod
}
