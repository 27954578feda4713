//! A JobSet of `replicas` child Jobs of `per_job` pods each, made as the
//! JobSet controller and the Job controller would make them (the local
//! control plane runs no JobSet controller: the stand-in CRD of
//! `tests/fixtures/workloads/crds.yaml`, left installed like memprof's
//! own, as the tests leave it).
//!
//! What makes the operator prove a child Job, as `tests/workloads.rs` does
//! it: a controlling ownerReference to the JobSet, the JobSet's labels
//! (`jobset.sigs.k8s.io/jobset-name`, `…/replicatedjob-name`,
//! `…/job-index`) and the workload mark the webhook gives a Job created by
//! the JobSet controller's identity (`memprof.dev/workload-mark`, signed
//! here under the namespace's admission key, just before the create: the
//! mark binds the Job's name, the JobSet's uid and the rank identity
//! `workers/<index>`, within the Job's creation window). The pods are made
//! as `setup.rs` makes a Job's (marked as the Job controller's, owned by
//! the child Job), plus the completion index the Job controller writes on
//! an Indexed Job's pods: the pod's rank in the JobSet is
//! `index × per_job + completion`.

use super::setup::{
    admission_key, job_name, rank_pod, set_writer_key, trainer, wait_active, RankPod,
    MISSING_SERVICE_ACCOUNT,
};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{Pod, PodSpec, PodTemplateSpec};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, ResourceExt};
use memprof::api::admission::{Key, LABEL_MANAGED};
use memprof::api::workload::{
    WorkloadKind, COMPLETION_INDEX, LABEL_JOBSET_JOB_INDEX, LABEL_JOBSET_NAME,
    LABEL_JOBSET_REPLICATED_JOB,
};
use memprof::api::workload_mark::{sign, Link, ANNOTATION_WORKLOAD_MARK};
use memprof::api::ANNOTATION_ENABLED;
use memprof::workload::read::api_resource;
use serde_json::json;
use std::collections::BTreeMap;

/// The one replicated job of the benchmark's JobSets.
const REPLICATED_JOB: &str = "workers";
/// Requests in flight while setting up (as `setup.rs`).
const SETUP_CONCURRENCY: usize = 16;

/// Applies the stand-in CRDs of JobSet, TrainJob and PyTorchJob and waits until served.
pub async fn install_workload_crds(client: &Client) -> anyhow::Result<()> {
    let text = include_str!("../../tests/fixtures/workloads/crds.yaml");
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply("memprof-bench").force();
    for doc in text.split("\n---\n") {
        let crd: CustomResourceDefinition = serde_yaml::from_str(doc)?;
        let name = crd.name_any();
        api.patch(&name, &params, &Patch::Apply(&crd)).await?;
        await_condition(api.clone(), &name, conditions::is_crd_established()).await?;
    }
    Ok(())
}

/// The name of child Job `index` of JobSet `jobset`.
pub fn child_name(jobset: &str, index: u32) -> String {
    format!("{jobset}-{REPLICATED_JOB}-{index}")
}

/// Creates JobSet [`job_name`]`(0)` of `replicas` child Jobs of `per_job`
/// pods each and every pod; returns the pods, rank by rank, once the Job
/// controller counts every pod of every child as active.
pub async fn create_jobset(
    client: &Client,
    ns: &str,
    replicas: u32,
    per_job: u32,
) -> anyhow::Result<Vec<RankPod>> {
    install_workload_crds(client).await?;
    let name = job_name(0);
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), ns, &api_resource(WorkloadKind::JobSet));
    let manifest: DynamicObject = serde_json::from_value(jobset(&name, replicas, per_job))?;
    let js = api.create(&PostParams::default(), &manifest).await?;
    let js_uid = js.uid().unwrap_or_default();
    let key = admission_key(client, ns)
        .await?
        .current()
        .expect("ensure_keys returns a key")
        .clone();
    set_writer_key(&key, ns);
    let job_api: Api<Job> = Api::namespaced(client.clone(), ns);
    let uids: Vec<String> = futures::stream::iter(0..replicas)
        .map(|index| {
            let (api, key, name, js_uid) = (job_api.clone(), &key, &name, &js_uid);
            async move {
                let job = child_job(ns, name, js_uid, index, per_job, key);
                let created = api.create(&PostParams::default(), &job).await?;
                anyhow::Ok(created.uid().unwrap_or_default())
            }
        })
        .buffered(SETUP_CONCURRENCY)
        .try_collect()
        .await?;
    let pods = create_pods(client, ns, &name, &uids, per_job, &key).await?;
    wait_active(&job_api, replicas as usize, per_job).await?;
    Ok(pods)
}

/// Every child's pods, job index-major: rank `index × per_job + completion`.
async fn create_pods(
    client: &Client,
    ns: &str,
    jobset: &str,
    uids: &[String],
    per_job: u32,
    key: &Key,
) -> anyhow::Result<Vec<RankPod>> {
    let pod_api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let wanted = (0..uids.len() as u32).flat_map(|j| (0..per_job).map(move |c| (j, c)));
    futures::stream::iter(wanted)
        .map(|(index, completion)| {
            let (api, owner) = (pod_api.clone(), child_name(jobset, index));
            let job_uid = uids[index as usize].clone();
            async move {
                let name = format!("{owner}-{completion}");
                let mut pod = rank_pod(ns, &name, &owner, &job_uid, key);
                pod.metadata
                    .annotations
                    .get_or_insert_with(BTreeMap::new)
                    .insert(COMPLETION_INDEX.into(), completion.to_string());
                let created = api.create(&PostParams::default(), &pod).await?;
                anyhow::Ok(RankPod {
                    job: 0,
                    rank: index * per_job + completion,
                    owner,
                    name,
                    uid: created.uid().unwrap_or_default(),
                })
            }
        })
        .buffered(SETUP_CONCURRENCY)
        .try_collect()
        .await
}

/// The JobSet: one replicated job of `replicas` Jobs of `per_job` pods.
fn jobset(name: &str, replicas: u32, per_job: u32) -> serde_json::Value {
    let kind = WorkloadKind::JobSet;
    json!({"apiVersion": kind.api_version(), "kind": kind.kind(),
           "metadata": {"name": name},
           "spec": {"replicatedJobs": [{"name": REPLICATED_JOB, "replicas": replicas,
               "template": {"spec": {"parallelism": per_job, "completions": per_job,
                   "completionMode": "Indexed",
                   "template": {"spec": {"restartPolicy": "Never",
                       "containers": [{"name": "trainer", "image": "busybox"}]}}}}}]}})
}

/// Child Job `index` of JobSet `jobset` (uid `js_uid`), as the JobSet
/// controller writes it, profiled as the webhook stamps a profiled Job,
/// with the workload mark the webhook gives the JobSet controller's Jobs.
fn child_job(ns: &str, jobset: &str, js_uid: &str, index: u32, per_job: u32, key: &Key) -> Job {
    let name = child_name(jobset, index);
    let identity = format!("{REPLICATED_JOB}/{index}");
    let link = Link {
        namespace: ns,
        kind: "Job",
        name: &name,
        controller_uid: js_uid,
        identity: &identity,
    };
    let mark = sign(key, &link, jiff::Timestamp::now()).expect("an identity without a newline");
    let mut job = Job {
        spec: Some(JobSpec {
            parallelism: Some(per_job as i32),
            completions: Some(per_job as i32),
            template: PodTemplateSpec {
                spec: Some(PodSpec {
                    // As setup.rs: the Job controller makes no pods of its own.
                    service_account_name: Some(MISSING_SERVICE_ACCOUNT.into()),
                    restart_policy: Some("Never".into()),
                    containers: vec![trainer()],
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        }),
        ..Default::default()
    };
    job.metadata.name = Some(name);
    job.metadata.labels = Some(BTreeMap::from([
        (LABEL_JOBSET_NAME.to_string(), jobset.to_string()),
        (LABEL_JOBSET_REPLICATED_JOB.into(), REPLICATED_JOB.into()),
        (LABEL_JOBSET_JOB_INDEX.into(), index.to_string()),
        (LABEL_MANAGED.into(), "true".into()),
    ]));
    job.metadata.annotations = Some(BTreeMap::from([
        (ANNOTATION_ENABLED.to_string(), "true".to_string()),
        (ANNOTATION_WORKLOAD_MARK.to_string(), mark),
    ]));
    job.metadata.owner_references = Some(vec![OwnerReference {
        api_version: WorkloadKind::JobSet.api_version().into(),
        kind: WorkloadKind::JobSet.kind().into(),
        name: jobset.into(),
        uid: js_uid.into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }]);
    job
}
