//! The admission warning from measured history for the workloads memprof
//! profiles as one each (JobSet, TrainJob, PyTorchJob), twins of
//! tests/admission_history.rs's Job: real `kubectl create` on the local
//! control plane, the webhook in-process registered for those kinds as the
//! chart's `workloads.memprof.dev` is, the kinds' stand-in CRDs of
//! tests/fixtures/workloads. No JobSet controller, Trainer or training
//! operator runs: nothing is created below the workload, and what is
//! checked is what its creator is told. Then the other half of the loop:
//! the operator labels a JobSet's and a PyTorchJob's profile with the
//! family the object names.
//!
//!     eval "$(bash hack/local-cluster.sh env)"
//!     MEMPROF_REQUIRE_CLUSTER=1 cargo test --test integration admission_history_workloads::

use crate::admission_history::{history, hook, kubectl_create, Hook, FAMILY};
use crate::common;
use crate::webhook_support::{Registration, NS_LABEL};
use crate::workload_support;

use common::{eventually, start_operator};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::PodSpec;
use kube::api::{Api, PostParams};
use kube::Client;
use memprof::api::workload::WorkloadKind;
use memprof::api::MemoryProfile;
use memprof::webhook::SIDECAR_CONTAINER;
use serde_json::{json, Value};
use workload_support::{api, create, marked_child, workload_cluster};

/// The history webhook for `ns`, also registered for JobSet, TrainJob and
/// PyTorchJob creations (the chart's `workloads.memprof.dev` rules), and
/// active for them.
async fn workloads_hook(admin: &Client, ns: &str) -> (Hook, Registration) {
    let hook = hook(admin, admin.clone(), ns).await;
    let registration = register_workload_kinds(admin, ns, &hook.url, &hook.ca_pem).await;
    wait_until_pytorchjobs_injected(admin, ns).await;
    (hook, registration)
}

async fn register_workload_kinds(admin: &Client, ns: &str, url: &str, ca: &str) -> Registration {
    use base64::Engine as _;
    let name = format!("{ns}-workloads");
    let rule = |kind: WorkloadKind| {
        let (group, version) = kind.api_version().rsplit_once('/').unwrap();
        json!({"apiGroups": [group], "apiVersions": [version], "operations": ["CREATE"],
               "resources": [kind.plural()], "scope": "Namespaced"})
    };
    let kinds = [
        WorkloadKind::JobSet,
        WorkloadKind::TrainJob,
        WorkloadKind::PyTorchJob,
    ];
    let mwc: MutatingWebhookConfiguration = serde_json::from_value(json!({
        "metadata": {"name": name},
        "webhooks": [{
            "name": memprof::webhook::paths::WORKLOADS_WEBHOOK,
            "clientConfig": {"url": url,
                             "caBundle": base64::engine::general_purpose::STANDARD.encode(ca)},
            "rules": kinds.map(rule),
            "failurePolicy": "Ignore", "sideEffects": "None",
            "admissionReviewVersions": ["v1"], "timeoutSeconds": 5,
            "namespaceSelector": {"matchLabels": {NS_LABEL: ns}},
        }]
    }))
    .unwrap();
    Api::<MutatingWebhookConfiguration>::all(admin.clone())
        .create(&PostParams::default(), &mwc)
        .await
        .expect("register the workloads webhook");
    Registration(name)
}

/// The API server picks up the registration asynchronously: dry-run
/// profiled PyTorchJobs until one comes back with the sidecar (what the
/// webhook did for them before any history was read).
async fn wait_until_pytorchjobs_injected(admin: &Client, ns: &str) {
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let probe = pytorchjob_at("probe", 8, json!({"memprof.dev/enabled": "true"}));
    let probe: kube::api::DynamicObject = serde_json::from_value(probe).unwrap();
    let pytorchjobs = api(admin, ns, WorkloadKind::PyTorchJob);
    eventually(
        "the workloads webhook to answer for PyTorchJobs",
        || async {
            let got = pytorchjobs
                .create(&dry, &probe)
                .await
                .map_err(|e| e.to_string())?;
            let master = &got.data["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"];
            let spec: PodSpec =
                serde_json::from_value(master.clone()).map_err(|e| e.to_string())?;
            let names = crate::webhook_support::container_names(&spec);
            match names.iter().any(|n| n == SIDECAR_CONTAINER) {
                true => Ok(()),
                false => Err(format!("containers {names:?}")),
            }
        },
    )
    .await;
}

/// The annotations of a profiled workload of `FAMILY` (and `more`).
fn of_family(more: Value) -> Value {
    let mut a = json!({"memprof.dev/enabled": "true", "memprof.dev/family": FAMILY});
    a.as_object_mut()
        .unwrap()
        .extend(more.as_object().cloned().unwrap_or_default());
    a
}

/// The env of a trainer at `batch`.
fn env_at(batch: u32) -> Value {
    json!([{"name": "BATCH_SIZE", "value": batch.to_string()}])
}

/// A JobSet of `FAMILY` (named on the JobSet) whose one replicated job is
/// profiled (its template annotated, as its child Jobs will be) at `batch`.
fn jobset_at(name: &str, batch: u32) -> Value {
    let pod = json!({"spec": {"restartPolicy": "Never",
        "containers": [{"name": "trainer", "image": "busybox", "env": env_at(batch)}]}});
    json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
           "metadata": {"name": name, "annotations": {"memprof.dev/family": FAMILY}},
           "spec": {"replicatedJobs": [{"name": "workers", "replicas": 2, "template": {
               "metadata": {"annotations": {"memprof.dev/enabled": "true"}},
               "spec": {"parallelism": 1, "completions": 1, "template": pod}}}]}})
}

/// A PyTorchJob with `annotations`, one master and two workers at `batch`.
fn pytorchjob_at(name: &str, batch: u32, annotations: Value) -> Value {
    let template = json!({"spec": {"containers": [
        {"name": "pytorch", "image": "busybox", "env": env_at(batch)}]}});
    json!({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
           "metadata": {"name": name, "annotations": annotations},
           "spec": {"pytorchReplicaSpecs": {
               "Master": {"replicas": 1, "template": template.clone()},
               "Worker": {"replicas": 2, "template": template}}}})
}

/// A TrainJob of `FAMILY`, its trainer at `batch`.
fn trainjob_at(name: &str, batch: u32) -> Value {
    json!({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
           "metadata": {"name": name, "annotations": {"memprof.dev/family": FAMILY}},
           "spec": {"trainer": {"numNodes": 2, "env": env_at(batch)}}})
}

/// Creates `too_big` (batch 64) and `fits` (batch 16) of `kind` in a
/// namespace whose family history fits 20 GiB + 1 GiB × batch on an 80 GiB
/// GPU: the first is warned about with the basis and admitted, the second
/// is admitted with nothing said.
async fn warned_with_the_basis(kind: &str, too_big: Value, fits: Value) {
    let Some((client, ns)) = workload_cluster().await else {
        return;
    };
    history(&client, &ns.name, "earlier-run", FAMILY).await;
    let _hook = workloads_hook(&client, &ns.name).await;

    let (ok, stderr) = kubectl_create(&ns.name, &too_big).await;
    assert!(ok, "a warning, never a denial by default: {stderr}");
    let verdict = format!("this {kind} is expected to run out of GPU memory");
    for part in [
        "Warning: memprof: predicted peak 84.0GiB per rank at BATCH_SIZE=64",
        "against the GPU's 80.0GiB",
        "measured history of family llama-8b in this namespace: MemoryProfile earlier-run",
        "a linear fit of 3 measured points at batches 8..32",
        &verdict,
        "lower BATCH_SIZE (MemoryProfile earlier-run recommends at most 52)",
    ] {
        assert!(stderr.contains(part), "{part:?} in {stderr}");
    }
    let (ok, stderr) = kubectl_create(&ns.name, &fits).await;
    assert!(ok, "{stderr}");
    assert!(!stderr.contains("memprof"), "{stderr}");
}

#[tokio::test]
async fn a_jobset_whose_familys_history_predicts_an_oom_is_warned_with_the_basis() {
    warned_with_the_basis("JobSet", jobset_at("too-big", 64), jobset_at("fits", 16)).await;
}

#[tokio::test]
async fn a_pytorchjob_whose_familys_history_predicts_an_oom_is_warned_with_the_basis() {
    let (big, fits) = (
        pytorchjob_at("too-big", 64, of_family(json!({}))),
        pytorchjob_at("fits", 16, of_family(json!({}))),
    );
    warned_with_the_basis("PyTorchJob", big, fits).await;
}

#[tokio::test]
async fn a_trainjob_whose_familys_history_predicts_an_oom_is_warned_with_the_basis() {
    warned_with_the_basis(
        "TrainJob",
        trainjob_at("too-big", 64),
        trainjob_at("fits", 16),
    )
    .await;
}

/// The label the webhook selects on, on profile `name`, eventually.
async fn family_label_of(client: &Client, ns: &str, name: &str) {
    let profiles: Api<MemoryProfile> = Api::namespaced(client.clone(), ns);
    eventually(&format!("profile {name} to carry its family"), || async {
        let p = profiles.get_opt(name).await.map_err(|e| e.to_string())?;
        let labels = p.map(|p| p.metadata.labels.unwrap_or_default());
        match labels.as_ref().and_then(|l| l.get("memprof.dev/family")) {
            Some(f) if f == FAMILY => Ok(()),
            _ => Err(format!("labels {labels:?}")),
        }
    })
    .await;
}

/// The other half of the loop for workloads: the operator labels a
/// JobSet's profile (made when its marked child Job is reconciled) and a
/// PyTorchJob's with the family each names on itself.
#[tokio::test]
async fn the_operator_labels_a_jobsets_and_a_pytorchjobs_profile_with_their_family() {
    let Some((client, ns)) = workload_cluster().await else {
        return;
    };
    let ns = ns.name.as_str();
    let _op = start_operator(&client, ns);
    let js = create(&client, ns, WorkloadKind::JobSet, jobset_at("js", 8)).await;
    marked_child(&client, ns, &js, 0).await;
    let mut pt = pytorchjob_at("pt", 8, of_family(json!({})));
    // As the webhook leaves a profiled PyTorchJob (none runs here).
    pt["metadata"]["labels"] = json!({"memprof.dev/managed": "true"});
    create(&client, ns, WorkloadKind::PyTorchJob, pt).await;
    family_label_of(&client, ns, "js").await;
    family_label_of(&client, ns, "pt").await;
}
