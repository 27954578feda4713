//! As attacks against the real local control plane: a tenant who may
//! create pods or Jobs in a namespace tries to get counted in, or to steer,
//! another team's JobSet or PyTorchJob (docs/security.md, "Workloads").
//! The local control plane runs no JobSet controller and no training
//! operator: the tests play them, as the identities the webhook is told
//! create those links (impersonated), and the stand-in CRDs of
//! tests/fixtures/workloads are installed. What decides is real: the API
//! server's admission (the webhook on its secret path), and the workload
//! resolved from objects read back from the API server.

use crate::common;
use crate::tenant_support;
use crate::webhook_support;
use crate::workload_support;

use common::*;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use memprof::api::admission::Keys;
use memprof::api::workload::WorkloadKind;
use memprof::api::workload_mark::LinkError;
use memprof::webhook::{InjectionConfig, MarkConfig, WorkloadIdentities};
use memprof::workload::pods::{pytorch_pod as admit_pytorch_pod, PodRefused};
use memprof::workload::rank::{JobSetShape, PyTorchShape};
use memprof::workload::read::resolve_live;
use memprof::workload::resolve::{Unproven, Workload};
use serde_json::json;
use tenant_support::*;
use webhook_support::{
    label_namespace, register, start_server_with, test_config, wait_until_active,
};
use workload_support::*;

/// A webhook told that the test identities create the workloads' links,
/// registered (the chart's hooks and the workloads hook) for `ns` only.
struct Admission {
    server: webhook_support::Server,
    keys: Keys,
    _workloads: webhook_support::Registration,
    _hooks: webhook_support::Registration,
}

async fn admission(admin: &Client, ns: &str) -> Admission {
    label_namespace(admin, ns).await;
    let keys = Keys::of(admission_keys(ns).await);
    let config = InjectionConfig {
        marks: MarkConfig {
            keys: keys.clone(),
            ..Default::default()
        },
        workloads: WorkloadIdentities {
            jobset: vec![JOBSET_CONTROLLER.into()],
            trainer: vec![TRAINER.into()],
            training_operator: vec![TRAINING_OPERATOR.into()],
        },
        ..test_config(admin).await
    };
    let server = start_server_with(config).await;
    register(admin, ns, &server.url, &server.ca_pem).await;
    let hooks = webhook_support::Registration(ns.to_string());
    let workloads = register_workloads(admin, ns, &server.url, &server.ca_pem).await;
    wait_until_active(admin, ns).await;
    Admission {
        server,
        keys,
        _workloads: workloads,
        _hooks: hooks,
    }
}

fn start(
    kind: WorkloadKind,
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Workload {
    Workload {
        kind,
        name: meta.name.clone().unwrap(),
        uid: meta.uid.clone().unwrap(),
    }
}

async fn create_job(client: &Client, ns: &str, manifest: serde_json::Value) -> Job {
    let job: Job = serde_json::from_value(manifest).unwrap();
    Api::<Job>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &job)
        .await
        .expect("create the Job")
}

/// The JobSet controller's child Job rolls up under its JobSet; a tenant's
/// Job claiming the same JobSet (forged controller reference, the JobSet's
/// labels, a mark copied from the genuine child) is its own workload, never
/// the JobSet's; the genuine child relabelled to move its rank loses its link.
#[tokio::test]
async fn a_tenant_s_job_claiming_another_team_s_jobset_does_not_roll_up_under_it() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let hooks = admission(&admin, &ns.name).await;
    let jobs_rules = json!([{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create", "get", "list", "watch"]}]);
    let controller = user_with(&admin, &ns.name, JOBSET_CONTROLLER, jobs_rules.clone()).await;
    let tenant = user_with(&admin, &ns.name, &format!("tenant-{}", ns.name), jobs_rules).await;

    let js = create(
        &admin,
        &ns.name,
        WorkloadKind::JobSet,
        jobset("victim", 2, json!({})),
    )
    .await;
    let genuine = create_job(&controller, &ns.name, child_job(&js, 0)).await;
    let mark =
        workload_mark(&genuine.metadata).expect("the JobSet controller's child Job is marked");
    let keys = hooks.keys.ring();
    let r = resolve_live(
        &admin,
        &ns.name,
        start(WorkloadKind::Job, &genuine.metadata),
        &keys,
    )
    .await
    .unwrap();
    assert_eq!(
        (r.top.kind, r.top.name.as_str(), r.unproven.clone()),
        (WorkloadKind::JobSet, "victim", None)
    );
    // Its rank, from the JobSet's shape read back and the labels the mark binds.
    let spec = api(&admin, &ns.name, WorkloadKind::JobSet)
        .get("victim")
        .await
        .unwrap()
        .data["spec"]
        .clone();
    assert_eq!(
        JobSetShape::from_spec(&spec).unwrap().rank("workers/0", 0),
        Some(0)
    );

    // The tenant's Job: forged controller reference, labels, and the genuine mark copied.
    let mut forged = child_job(&js, 1);
    forged["metadata"]["annotations"] =
        json!({memprof::api::workload_mark::ANNOTATION_WORKLOAD_MARK: mark});
    let forged = create_job(&tenant, &ns.name, forged).await;
    assert_eq!(
        workload_mark(&forged.metadata),
        None,
        "the planted mark is removed at admission"
    );
    let r = resolve_live(
        &admin,
        &ns.name,
        start(WorkloadKind::Job, &forged.metadata),
        &keys,
    )
    .await
    .unwrap();
    assert_eq!(
        r.top.kind,
        WorkloadKind::Job,
        "the tenant's Job is its own workload: {r:?}"
    );
    assert!(
        matches!(
            r.unproven,
            Some(Unproven::Unmarked(LinkError::Missing { .. }))
        ),
        "{r:?}"
    );

    // The genuine child relabelled (anyone who may patch Jobs can): its link fails.
    let relabel = json!({"metadata": {"labels": {"jobset.sigs.k8s.io/job-index": "1"}}});
    Api::<Job>::namespaced(admin.clone(), &ns.name)
        .patch(
            &genuine.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&relabel),
        )
        .await
        .unwrap();
    let r = resolve_live(
        &admin,
        &ns.name,
        start(WorkloadKind::Job, &genuine.metadata),
        &keys,
    )
    .await
    .unwrap();
    assert!(
        matches!(
            r.unproven,
            Some(Unproven::Unmarked(LinkError::Forged { .. }))
        ),
        "{r:?}"
    );
    hooks.server.stop().await;
}

/// A JobSet the tenant made under another team's TrainJob is not marked
/// (only Kubeflow Trainer's identity creates a TrainJob's JobSet), so its
/// Jobs roll up under the tenant's JobSet at most, never the TrainJob; the
/// trainer's own JobSet and its child Job roll up under the TrainJob.
#[tokio::test]
async fn a_jobset_the_tenant_made_under_another_team_s_trainjob_stays_the_tenant_s() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let hooks = admission(&admin, &ns.name).await;
    let js_rules = json!([{"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"], "verbs": ["create", "get", "list", "watch"]},
                          {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "watch"]}]);
    let trainer = user_with(&admin, &ns.name, TRAINER, js_rules.clone()).await;
    let tenant = user_with(&admin, &ns.name, &format!("tenant-{}", ns.name), js_rules).await;
    let jobs_rules = json!([{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create", "get", "list", "watch"]}]);
    let controller = user_with(&admin, &ns.name, JOBSET_CONTROLLER, jobs_rules).await;

    let tj = create(
        &admin,
        &ns.name,
        WorkloadKind::TrainJob,
        json!({"metadata": {"name": "llm"}, "spec": {"trainer": {"numNodes": 2}}}),
    )
    .await;
    let under = |name: &str| {
        let mut m = jobset(name, 1, json!({}));
        m["metadata"]["ownerReferences"] = controller_ref(WorkloadKind::TrainJob, &tj);
        m
    };
    let theirs = create(&trainer, &ns.name, WorkloadKind::JobSet, under("llm")).await;
    let forged = create(&tenant, &ns.name, WorkloadKind::JobSet, under("llm-forged")).await;
    assert!(
        workload_mark(&theirs.metadata).is_some(),
        "Trainer's JobSet is marked"
    );
    assert_eq!(
        workload_mark(&forged.metadata),
        None,
        "the tenant's JobSet is not"
    );
    let keys = hooks.keys.ring();
    for (js, top) in [
        (&theirs, (WorkloadKind::TrainJob, "llm")),
        (&forged, (WorkloadKind::JobSet, "llm-forged")),
    ] {
        let child = create_job(&controller, &ns.name, child_job(js, 0)).await;
        let r = resolve_live(
            &admin,
            &ns.name,
            start(WorkloadKind::Job, &child.metadata),
            &keys,
        )
        .await
        .unwrap();
        assert_eq!((r.top.kind, r.top.name.as_str()), top, "{r:?}");
    }
    hooks.server.stop().await;
}

/// Only pods the training operator's identity created, with the replica
/// labels it set, count for a PyTorchJob: a tenant's pod claiming the
/// PyTorchJob (controller reference, labels, a planted mark) is not marked,
/// and the genuine pod relabelled to another rank no longer counts.
#[tokio::test]
async fn a_tenant_s_pod_claiming_another_team_s_pytorchjob_does_not_count() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let hooks = admission(&admin, &ns.name).await;
    let operator = user_with(&admin, &ns.name, TRAINING_OPERATOR, pod_rules()).await;
    let tenant = user_with(
        &admin,
        &ns.name,
        &format!("tenant-{}", ns.name),
        pod_rules(),
    )
    .await;

    let pt = create(
        &admin,
        &ns.name,
        WorkloadKind::PyTorchJob,
        pytorchjob("victim", 2, json!({})),
    )
    .await;
    let uid = pt.metadata.uid.clone().unwrap();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &ns.name);
    let create_pod = |client: &Client, manifest: serde_json::Value| {
        let pod: Pod = serde_json::from_value(manifest).unwrap();
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
        async move {
            api.create(&PostParams::default(), &pod)
                .await
                .expect("create the pod")
        }
    };
    let genuine = create_pod(&operator, pytorch_pod(&pt, "worker", 0)).await;
    let keys = hooks.keys.ring();
    let now = jiff::Timestamp::now();
    let identity =
        admit_pytorch_pod(&genuine.metadata, &uid, &keys, now).expect("the operator's pod counts");
    let spec = api(&admin, &ns.name, WorkloadKind::PyTorchJob)
        .get("victim")
        .await
        .unwrap()
        .data["spec"]
        .clone();
    assert_eq!(
        PyTorchShape::from_spec(&spec).unwrap().rank(&identity),
        Some(1),
        "worker 0 after the master"
    );

    let mut planted = pytorch_pod(&pt, "worker", 1);
    planted["metadata"]["annotations"] = json!({memprof::api::workload_mark::ANNOTATION_WORKLOAD_MARK:
        workload_mark(&genuine.metadata).unwrap()});
    let forged = create_pod(&tenant, planted).await;
    assert_eq!(
        workload_mark(&forged.metadata),
        None,
        "the planted mark is removed at admission"
    );
    assert!(matches!(
        admit_pytorch_pod(&forged.metadata, &uid, &keys, now),
        Err(PodRefused::Unmarked(LinkError::Missing { .. }))
    ));

    let relabel = json!({"metadata": {"labels": {"training.kubeflow.org/replica-index": "1"}}});
    let moved = pods
        .patch(
            &genuine.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&relabel),
        )
        .await
        .unwrap();
    assert!(matches!(
        admit_pytorch_pod(&moved.metadata, &uid, &keys, now),
        Err(PodRefused::Unmarked(LinkError::Forged { .. }))
    ));
    hooks.server.stop().await;
}

fn pod_rules() -> serde_json::Value {
    json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "watch"]},
           {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "watch"]}])
}
