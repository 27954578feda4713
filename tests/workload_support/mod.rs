//! What the workload tests share: the stand-in CRDs of JobSet, TrainJob and
//! PyTorchJob (tests/fixtures/workloads/crds.yaml), objects of those kinds
//! created as their controllers would, the workloads webhook registered on
//! the secret path, and the identities that play the upper controllers
//! (the local control plane runs none of them).
#![allow(dead_code)]

use crate::common::{
    admission_keys, admission_keys_in, apply_report, at, cluster, eventually, eventually_within,
    gpu, job_pods, pod_report, TestNamespace, GC_TIMEOUT,
};
use crate::tenant_support::{as_user, user_with};
use crate::webhook_support::{
    label_namespace, register, start_server_with, test_config, wait_until_active, Registration,
    Server, NS_LABEL,
};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::rbac::v1::Role;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use memprof::api::admission::Keys;
use memprof::api::workload::WorkloadKind;
use memprof::api::workload_mark::{sign, Link, ANNOTATION_WORKLOAD_MARK};
use memprof::api::RiskLevel;
use memprof::webhook::{InjectionConfig, MarkConfig, WorkloadIdentities};
use memprof::workload::read::api_resource;
use serde_json::{json, Value};

/// Who plays the JobSet controller (creates child Jobs).
pub const JOBSET_CONTROLLER: &str = "jobset-controller-test";
/// Who plays the training operator (creates a PyTorchJob's pods).
pub const TRAINING_OPERATOR: &str = "training-operator-test";
/// Who plays Kubeflow Trainer (creates a TrainJob's JobSet).
pub const TRAINER: &str = "trainer-test";

/// The cluster with the stand-in CRDs installed and a namespace of the
/// test's own; `None` where no cluster is configured (the test is skipped).
pub async fn workload_cluster() -> Option<(Client, TestNamespace)> {
    let admin = cluster().await?;
    install_workload_crds(&admin).await;
    let ns = TestNamespace::create(&admin).await;
    Some((admin, ns))
}

/// Installs the stand-in CRDs (server-side apply: idempotent, shared by
/// every test; left installed like memprof's own) and waits until served.
pub async fn install_workload_crds(client: &Client) {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/workloads/crds.yaml"
    ))
    .expect("the stand-in CRDs");
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let pp = PatchParams::apply("memprof-tests").force();
    for doc in text.split("\n---\n") {
        let crd: CustomResourceDefinition = serde_yaml::from_str(doc).expect("a CRD");
        let name = crd.metadata.name.clone().unwrap();
        api.patch(&name, &pp, &Patch::Apply(&crd))
            .await
            .expect("apply a stand-in CRD");
        eventually(&format!("CRD {name} established"), || async {
            let c = api.get(&name).await.map_err(|e| e.to_string())?;
            let ok = c
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            ok.then_some(()).ok_or("not yet".to_string())
        })
        .await;
    }
}

/// The namespaced API of `kind`.
pub fn api(client: &Client, ns: &str, kind: WorkloadKind) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &api_resource(kind))
}

/// Creates an object of `kind` from `manifest` (apiVersion and kind filled in).
pub async fn create(
    client: &Client,
    ns: &str,
    kind: WorkloadKind,
    mut manifest: Value,
) -> DynamicObject {
    manifest["apiVersion"] = json!(kind.api_version());
    manifest["kind"] = json!(kind.kind());
    let obj: DynamicObject = serde_json::from_value(manifest).unwrap();
    api(client, ns, kind)
        .create(&PostParams::default(), &obj)
        .await
        .unwrap_or_else(|e| panic!("create a {}: {e}", kind.kind()))
}

/// A controller owner reference to `owner` (of `kind`), as its controller sets it.
pub fn controller_ref(kind: WorkloadKind, owner: &DynamicObject) -> Value {
    json!([{"apiVersion": kind.api_version(), "kind": kind.kind(),
            "name": owner.metadata.name, "uid": owner.metadata.uid,
            "controller": true, "blockOwnerDeletion": true}])
}

/// A JobSet of one replicated job `workers` of `replicas` Jobs of one pod.
pub fn jobset(name: &str, replicas: u32, labels: Value) -> Value {
    json!({"metadata": {"name": name, "labels": labels},
           "spec": {"replicatedJobs": [{"name": "workers", "replicas": replicas,
               "template": {"spec": {"parallelism": 1, "completions": 1,
                   "template": {"spec": {"restartPolicy": "Never",
                       "containers": [{"name": "trainer", "image": "busybox",
                                       "env": [{"name": "BATCH_SIZE", "value": "32"}]}]}}}}}]}})
}

/// A PyTorchJob of one master and `workers` workers.
pub fn pytorchjob(name: &str, workers: u32, labels: Value) -> Value {
    let template = json!({"spec": {"containers": [{"name": "pytorch", "image": "busybox",
        "env": [{"name": "BATCH_SIZE", "value": "32"}]}]}});
    json!({"metadata": {"name": name, "labels": labels},
           "spec": {"pytorchReplicaSpecs": {
               "Master": {"replicas": 1, "template": template.clone()},
               "Worker": {"replicas": workers, "template": template}}}})
}

/// The child Job `<jobset>-workers-<index>` as the JobSet controller
/// writes it: controller reference, the JobSet's labels, one pod.
pub fn child_job(js: &DynamicObject, index: u32) -> Value {
    let name = js.metadata.name.clone().unwrap();
    json!({"metadata": {"name": format!("{name}-workers-{index}"),
            "labels": {"jobset.sigs.k8s.io/jobset-name": name,
                       "jobset.sigs.k8s.io/replicatedjob-name": "workers",
                       "jobset.sigs.k8s.io/job-index": index.to_string()},
            "ownerReferences": controller_ref(WorkloadKind::JobSet, js)},
           "spec": {"parallelism": 1, "completions": 1, "backoffLimit": 0,
               "template": {"spec": {"restartPolicy": "Never",
                   "containers": [{"name": "trainer", "image": "busybox"}]}}}})
}

/// The pod `<pytorchjob>-<type>-<index>` as the training operator writes it.
pub fn pytorch_pod(pt: &DynamicObject, rtype: &str, index: u32) -> Value {
    let name = pt.metadata.name.clone().unwrap();
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": format!("{name}-{rtype}-{index}"),
            "labels": {"training.kubeflow.org/job-name": name,
                       "training.kubeflow.org/replica-type": rtype,
                       "training.kubeflow.org/replica-index": index.to_string(),
                       // The webhook's marks selector (a filter, not proof).
                       "memprof.dev/managed": "true"},
            "ownerReferences": controller_ref(WorkloadKind::PyTorchJob, pt)},
           "spec": {"restartPolicy": "Never", "containers": [{"name": "pytorch", "image": "busybox"}]}})
}

/// Registers the workloads webhook (Job, JobSet and PyTorchJob creations) on `url`,
/// the secret path, for namespace `ns` only, as the chart does; deleted
/// when the returned guard drops.
pub async fn register_workloads(
    client: &Client,
    ns: &str,
    url: &str,
    ca_pem: &str,
) -> Registration {
    use base64::Engine as _;
    let name = format!("{ns}-workloads");
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let rule = |group: &str, version: &str, resource: &str| {
        json!({"apiGroups": [group], "apiVersions": [version], "operations": ["CREATE"],
               "resources": [resource], "scope": "Namespaced"})
    };
    let mwc: MutatingWebhookConfiguration = serde_json::from_value(json!({
        "metadata": {"name": name},
        "webhooks": [{
            "name": memprof::webhook::paths::WORKLOADS_WEBHOOK,
            "clientConfig": {"url": url, "caBundle": ca},
            "rules": [rule("batch", "v1", "jobs"), rule("jobset.x-k8s.io", "v1alpha2", "jobsets"),
                      rule("kubeflow.org", "v1", "pytorchjobs")],
            "failurePolicy": "Ignore", "sideEffects": "None",
            "admissionReviewVersions": ["v1"], "timeoutSeconds": 2,
            "namespaceSelector": {"matchLabels": {NS_LABEL: ns}},
        }]
    }))
    .unwrap();
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &mwc)
        .await
        .expect("register the workloads webhook");
    Registration(name)
}

/// The workload mark the webhook gives child Job `name` of `js`, at
/// `identity` in it (`<replicated job>/<index>`), under `ns`'s key on
/// `admin`'s cluster (tests/faults.rs runs control planes of its own).
pub async fn child_mark(
    admin: &Client,
    ns: &str,
    js: &DynamicObject,
    name: &str,
    identity: &str,
) -> String {
    let keys = admission_keys_in(admin, ns).await;
    let link = Link {
        namespace: ns,
        kind: "Job",
        name,
        controller_uid: js.metadata.uid.as_deref().unwrap(),
        identity,
    };
    sign(keys.current().unwrap(), &link, jiff::Timestamp::now()).unwrap()
}

/// Child Job `index` of `js` as the JobSet controller creates it, with
/// `annotations` (its replicated job template's) and the managed labels the
/// webhook stamps; with the workload mark it gives at creation when
/// `marked` ([`child_mark`]).
pub async fn create_child(
    admin: &Client,
    ns: &str,
    js: &DynamicObject,
    index: u32,
    mut annotations: Value,
    marked: bool,
) -> Job {
    let mut manifest = child_job(js, index);
    if marked {
        let name = format!("{}-workers-{index}", js.name_any());
        let mark = child_mark(admin, ns, js, &name, &format!("workers/{index}")).await;
        annotations[ANNOTATION_WORKLOAD_MARK] = json!(mark);
    }
    manifest["metadata"]["annotations"] = annotations;
    manifest["metadata"]["labels"]["memprof.dev/managed"] = json!("true");
    manifest["spec"]["template"]["metadata"] = json!({"labels": {"memprof.dev/managed": "true"}});
    let job: Job = serde_json::from_value(manifest).unwrap();
    Api::<Job>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &job)
        .await
        .unwrap()
}

/// Child Job `index` of `js` as the JobSet controller creates it, profiled
/// and marked as the webhook marks it ([`create_child`]).
pub async fn marked_child(admin: &Client, ns: &str, js: &DynamicObject, index: u32) -> Job {
    let profiled = json!({"memprof.dev/enabled": "true"});
    create_child(admin, ns, js, index, profiled, true).await
}

/// The webhook, told that [`TRAINING_OPERATOR`] creates PyTorchJobs' pods,
/// registered (the chart's hooks and the workloads hook, with its
/// PyTorchJob rule) for `ns` only, under the key the operator verifies with.
pub struct PytorchAdmission {
    pub server: Server,
    pub workloads: Registration,
    pub hooks: Registration,
}

impl PytorchAdmission {
    /// Takes the hooks down: both registrations, then the server.
    pub async fn stop(self) {
        drop((self.workloads, self.hooks));
        self.server.stop().await;
    }
}

/// Starts and registers [`PytorchAdmission`] for `ns`, labelled for it,
/// and waits until the API server calls it.
pub async fn pytorch_admission(admin: &Client, ns: &str) -> PytorchAdmission {
    label_namespace(admin, ns).await;
    let config = InjectionConfig {
        marks: MarkConfig {
            keys: Keys::of(admission_keys(ns).await),
            ..Default::default()
        },
        workloads: WorkloadIdentities {
            training_operator: vec![TRAINING_OPERATOR.into()],
            ..Default::default()
        },
        ..test_config(admin).await
    };
    let server = start_server_with(config).await;
    register(admin, ns, &server.url, &server.ca_pem).await;
    let hooks = Registration(ns.to_string());
    let workloads = register_workloads(admin, ns, &server.url, &server.ca_pem).await;
    wait_until_active(admin, ns).await;
    PytorchAdmission {
        server,
        workloads,
        hooks,
    }
}

/// What the training operator's identity may do here: create and read
/// pods, and list Jobs (what `tenant_support::user_with` checks its Role by).
pub fn pod_creator_rules() -> Value {
    json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "watch"]},
           {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "watch"]}])
}

/// The pods of `pt`, its master and two workers, created as `operator`
/// (the training operator's identity) creates them.
pub async fn pytorch_pods(operator: &Client, ns: &str, pt: &DynamicObject) -> Vec<Pod> {
    let api = Api::<Pod>::namespaced(operator.clone(), ns);
    let mut pods = Vec::new();
    for (rtype, index) in [("master", 0), ("worker", 0), ("worker", 1)] {
        let pod: Pod = serde_json::from_value(pytorch_pod(pt, rtype, index)).unwrap();
        pods.push(api.create(&PostParams::default(), &pod).await.unwrap());
    }
    pods
}

/// PyTorchJob `train` (`labels` and `team: ml`, profiled; a master and two
/// workers) and its pods as the training operator makes them (marked by the
/// webhook, [`pytorch_admission`], taken down before the reports are
/// written), each rank reporting low. Waits for no profile: no operator
/// need run.
pub async fn pytorchjob_reporting_low(
    admin: &Client,
    ns: &str,
    mut labels: Value,
) -> (DynamicObject, Vec<Pod>) {
    let hooks = pytorch_admission(admin, ns).await;
    let operator = user_with(admin, ns, TRAINING_OPERATOR, pod_creator_rules()).await;
    labels["team"] = json!("ml");
    labels["memprof.dev/managed"] = json!("true");
    let mut manifest = pytorchjob("train", 2, labels);
    manifest["metadata"]["annotations"] = json!({"memprof.dev/enabled": "true"});
    let pt = create(admin, ns, WorkloadKind::PyTorchJob, manifest).await;
    let pods = pytorch_pods(&operator, ns, &pt).await;
    hooks.stop().await;
    for pod in &pods {
        let gpus = vec![gpu(0, 30, 30, RiskLevel::Low, None)];
        apply_report(admin, ns, &pod_report(pod, "train", 0, &at(0), gpus)).await;
    }
    (pt, pods)
}

/// The report of child Job `job`'s one pod.
pub async fn child_report(admin: &Client, ns: &str, job: &str, offset: u64, risk: RiskLevel) {
    let pod = job_pods(admin, ns, job, 1).await.remove(0);
    let peak = if risk == RiskLevel::Critical { 79 } else { 30 };
    let gpus = vec![gpu(
        0,
        peak,
        peak,
        risk,
        (risk == RiskLevel::Critical).then_some(5.0),
    )];
    apply_report(admin, ns, &pod_report(&pod, job, 0, &at(offset), gpus)).await;
}

/// The one remediation record of profile `train` once it is `phase`.
pub async fn record_in(admin: &Client, ns: &str, phase: &str) -> memprof::api::RemediationRecord {
    eventually(&format!("the record {phase}"), || async {
        let recs = crate::remediation_support::records(admin, ns, "train").await;
        match recs.as_slice() {
            [r] if r.phase == phase => Ok(r.clone()),
            _ => Err(format!("{recs:?}")),
        }
    })
    .await
}

/// The kinds of the objects Events with `reason` about `name` regard.
pub async fn event_kinds(admin: &Client, ns: &str, reason: &str, name: &str) -> Vec<String> {
    Api::<k8s_openapi::api::events::v1::Event>::namespaced(admin.clone(), ns)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter_map(|e| e.regarding)
        .filter(|r| r.name.as_deref() == Some(name))
        .filter_map(|r| r.kind)
        .collect()
}

/// The workload mark on an object's metadata, if any.
pub fn workload_mark(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Option<String> {
    meta.annotations
        .as_ref()?
        .get(memprof::api::workload_mark::ANNOTATION_WORKLOAD_MARK)
        .cloned()
}

/// The names of what the controller of workload `name` of `kind` makes
/// here: a JobSet's two child Jobs ([`child_job`]), a PyTorchJob's master
/// and two workers' pods ([`pytorch_pods`]).
pub fn controller_part_names(kind: WorkloadKind, name: &str) -> Vec<String> {
    let parts: &[&str] = match kind {
        WorkloadKind::JobSet => &["workers-0", "workers-1"],
        _ => &["master-0", "worker-0", "worker-1"],
    };
    parts.iter().map(|part| format!("{name}-{part}")).collect()
}

/// The API of what `kind`'s controller makes: Jobs of a JobSet, pods of a PyTorchJob.
fn controller_part_api(admin: &Client, ns: &str, kind: WorkloadKind) -> Api<DynamicObject> {
    let resource = match kind {
        WorkloadKind::JobSet => ApiResource::erase::<Job>(&()),
        _ => ApiResource::erase::<Pod>(&()),
    };
    Api::namespaced_with(admin.clone(), ns, &resource)
}

/// The training operator's identity in `ns`, its Role
/// ([`pod_creator_rules`]) granted unless it was already (as
/// [`pytorchjob_reporting_low`] grants it).
pub async fn training_operator(admin: &Client, ns: &str) -> Client {
    let roles = Api::<Role>::namespaced(admin.clone(), ns);
    let granted = roles.get_opt(TRAINING_OPERATOR).await.unwrap();
    match granted {
        Some(_) => as_user(TRAINING_OPERATOR, &["system:authenticated"]).await,
        None => user_with(admin, ns, TRAINING_OPERATOR, pod_creator_rules()).await,
    }
}

/// What the upper controller makes for `top` of `kind`, as it makes it: a
/// JobSet's two child Jobs, profiled and marked ([`marked_child`]); a
/// PyTorchJob's pods, created as the training operator's identity
/// ([`training_operator`]) while the webhook marks them
/// ([`pytorch_admission`], taken down after).
pub async fn controller_part(admin: &Client, ns: &str, kind: WorkloadKind, top: &DynamicObject) {
    match kind {
        WorkloadKind::JobSet => {
            for index in 0..2 {
                marked_child(admin, ns, top, index).await;
            }
        }
        _ => {
            let hooks = pytorch_admission(admin, ns).await;
            let operator = training_operator(admin, ns).await;
            pytorch_pods(&operator, ns, top).await;
            hooks.stop().await;
        }
    }
}

/// Waits until nothing is left of what the controller of workload `name`
/// of `kind` made ([`controller_part_names`]): deleted by memprof, or by
/// the garbage collector (within [`GC_TIMEOUT`]).
pub async fn controller_part_gone(admin: &Client, ns: &str, kind: WorkloadKind, name: &str) {
    let made = controller_part_api(admin, ns, kind);
    let what = format!("what the {} controller made for {name} gone", kind.kind());
    eventually_within(GC_TIMEOUT, &what, || async {
        let mut left = Vec::new();
        for part in controller_part_names(kind, name) {
            if made
                .get_opt(&part)
                .await
                .map_err(|e| e.to_string())?
                .is_some()
            {
                left.push(part);
            }
        }
        left.is_empty().then_some(()).ok_or(format!("{left:?}"))
    })
    .await;
}

/// Deletes whatever is there of what the controller of workload `name` of
/// `kind` made (what `kubectl delete --cascade=orphan` left with no
/// owner, as its team clears it before the controller makes a namesake's
/// parts of the same names), and waits until it is gone.
pub async fn clear_controller_part(admin: &Client, ns: &str, kind: WorkloadKind, name: &str) {
    let made = controller_part_api(admin, ns, kind);
    for part in controller_part_names(kind, name) {
        match made.delete(&part, &DeleteParams::background()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => panic!("deleting {part}, left by {} {name}: {e}", kind.kind()),
        }
    }
    controller_part_gone(admin, ns, kind, name).await;
}
