//! Helpers of the remediation integration tests (on top of `tests/common`):
//! the remediation controller in-process, training Jobs with a batch-size
//! env var, policies from JSON (so that invalid ones can be sent), pod
//! terminations through the status subresource, and the operator as a child
//! process that can be killed.
#![allow(dead_code)]

use crate::common::{
    apply_report, at, eventually, gpu, rank_report, start_operator, RunningOperator, TestNamespace,
};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use memprof::api::{
    MemoryProfile, RemediationPolicy, RemediationRecord, RiskLevel, ANNOTATION_ENABLED,
    ANNOTATION_REMEDIATION, ANNOTATION_REMEDIATION_NONCE,
};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Logs of the in-process controllers, shown for failing tests (`RUST_LOG` filters).
pub fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,kube=warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}

/// Creates a profiled Job labelled `team=ml` whose trainer has `BATCH_SIZE` (when given).
pub async fn training_job(client: &Client, ns: &str, name: &str, batch: Option<&str>) -> Job {
    let env: Vec<Value> = batch
        .map(|b| json!({"name": "BATCH_SIZE", "value": b}))
        .into_iter()
        .chain([json!({"name": "LR", "value": "0.001"})])
        .collect();
    training_job_with_env(client, ns, name, json!(env)).await
}

/// [`training_job`] whose trainer container has exactly `env` (a JSON list).
pub async fn training_job_with_env(client: &Client, ns: &str, name: &str, env: Value) -> Job {
    let job = job_manifest(name, env);
    Api::<Job>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &job)
        .await
        .unwrap_or_else(|e| panic!("creating Job {name}: {e}"))
}

/// The manifest [`training_job`] creates, with `BATCH_SIZE` `batch`.
pub fn training_job_manifest(name: &str, batch: &str) -> Job {
    job_manifest(
        name,
        json!([{"name": "BATCH_SIZE", "value": batch}, {"name": "LR", "value": "0.001"}]),
    )
}

fn job_manifest(name: &str, env: Value) -> Job {
    serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {
            "name": name,
            // `memprof.dev/managed` as the webhook stamps it (contract D).
            "labels": {"team": "ml", "memprof.dev/managed": "true"},
            "annotations": {ANNOTATION_ENABLED: "true"},
        },
        "spec": {
            "parallelism": 1, "completions": 1, "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {"app": name, "memprof.dev/managed": "true"}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "trainer", "image": "busybox", "env": env}],
                },
            },
        },
    }))
    .unwrap()
}

/// Applies a policy given as JSON (`spec` only), returning the API server's answer.
pub async fn apply_policy(
    client: &Client,
    ns: &str,
    name: &str,
    spec: Value,
) -> Result<RemediationPolicy, kube::Error> {
    let body = json!({
        "apiVersion": "memprof.dev/v1alpha1", "kind": "RemediationPolicy",
        "metadata": {"name": name},
        "spec": spec,
    });
    Api::<RemediationPolicy>::namespaced(client.clone(), ns)
        .patch(
            name,
            &PatchParams::apply("memprof-tests"),
            &Patch::Apply(&body),
        )
        .await
}

/// The Job's env value `env` of container `trainer`.
pub fn env_of(job: &Job, env: &str) -> Option<String> {
    job.spec
        .as_ref()?
        .template
        .spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == "trainer")?
        .env
        .as_ref()?
        .iter()
        .find(|e| e.name == env)?
        .value
        .clone()
}

/// The profile's remediation records (empty while there is no status).
pub async fn records(client: &Client, ns: &str, name: &str) -> Vec<RemediationRecord> {
    Api::<MemoryProfile>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .unwrap()
        .and_then(|p| p.status)
        .map(|s| s.remediations)
        .unwrap_or_default()
}

/// Waits until the operator wrote the profile's first status.
pub async fn profile_with_status(client: &Client, ns: &str, name: &str) -> MemoryProfile {
    let api = Api::<MemoryProfile>::namespaced(client.clone(), ns);
    eventually("the MemoryProfile with a status", || {
        let api = api.clone();
        async move {
            match api.get_opt(name).await.map_err(|e| e.to_string())? {
                Some(p) if p.status.is_some() => Ok(p),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await
}

/// Waits for the first pod the Job controller creates for `job`.
/// (marked as admitted, `common::mark_as_admitted`).
pub async fn first_pod(client: &Client, ns: &str, job: &str) -> Pod {
    let api = Api::<Pod>::namespaced(client.clone(), ns);
    let pod = eventually("the Job's pod", || {
        let api = api.clone();
        async move {
            let lp = ListParams::default().labels(&format!("job-name={job}"));
            let pods = api.list(&lp).await.map_err(|e| e.to_string())?;
            pods.items
                .into_iter()
                .next()
                .ok_or("no pod yet".to_string())
        }
    })
    .await;
    crate::common::mark_as_admitted_in(client, &pod).await
}

/// Makes `container` of `pod` terminated with `exit_code` and `message`,
/// through the status subresource (what a kubelet would report).
pub async fn terminate_container(
    client: &Client,
    ns: &str,
    pod: &str,
    container: &str,
    exit_code: i32,
    message: &str,
) {
    let now = jiff::Timestamp::now()
        .round(jiff::Unit::Second)
        .unwrap()
        .to_string();
    let body = json!({"status": {
        "phase": "Failed",
        "containerStatuses": [{
            "name": container, "ready": false, "restartCount": 0,
            "image": "busybox", "imageID": "docker-pullable://busybox@sha256:0",
            "containerID": "containerd://0123456789",
            "state": {"terminated": {
                "exitCode": exit_code, "reason": "Error", "message": message,
                "startedAt": now, "finishedAt": now,
            }},
        }],
    }});
    Api::<Pod>::namespaced(client.clone(), ns)
        .patch_status(pod, &PatchParams::default(), &Patch::Merge(&body))
        .await
        .unwrap_or_else(|e| panic!("setting the status of pod {pod}: {e}"));
}

/// Polls `check` until it holds for the whole of `period` (fails at once otherwise).
pub async fn stays<F, Fut>(what: &str, period: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let end = Instant::now() + period;
    while Instant::now() < end {
        if let Err(seen) = check().await {
            panic!("expected {what} to hold for {period:?}, but: {seen}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The operator (roll-up and remediation) as a child process, killed when dropped.
pub struct OperatorProcess {
    pub child: Child,
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The operator binary: `MEMPROF_OPERATOR_BIN` (e.g. a release build), else this package's.
pub fn operator_binary() -> String {
    std::env::var("MEMPROF_OPERATOR_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_memprof-operator").to_string())
}

/// Whether the operator binary already runs the remediation controller.
pub fn operator_binary_remediates() -> bool {
    Command::new(operator_binary())
        .arg("--help")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("--remediation"))
        .unwrap_or(false)
}

/// Starts the operator on `ns`: the operator binary when it runs
/// the remediation controller, else this test binary's `child_operator`
/// entry (the same library calls the binary makes). `failpoint` is passed
/// as `MEMPROF_FAILPOINT`.
pub fn spawn_operator(ns: &str, failpoint: Option<&str>) -> OperatorProcess {
    let mut cmd = if operator_binary_remediates() {
        let mut c = Command::new(operator_binary());
        c.args(["--namespace", ns, "--metrics-addr", "127.0.0.1:0"]);
        c.args(["--remediation-plan-namespace", ns]);
        // No webhook; the admission key is the namespace's (common::admission_keys).
        c.args(["--webhook-port", "0", "--webhook-namespace", ns]);
        c
    } else {
        let mut c = Command::new(std::env::current_exe().unwrap());
        c.args([
            "remediation::child_operator",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ]);
        c.env("MEMPROF_CHILD_NAMESPACE", ns);
        c
    };
    cmd.env_remove("MEMPROF_FAILPOINT");
    if let Some(f) = failpoint {
        cmd.env("MEMPROF_FAILPOINT", f);
    }
    cmd.env("RUST_LOG", "info,kube=warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    OperatorProcess {
        child: cmd.spawn().expect("spawning the operator"),
    }
}

/// What the child process runs: the controller (roll-up and remediation)
/// on one namespace, as `memprof-operator` wires it.
pub fn run_child_operator(ns: &str) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = Client::try_default().await.unwrap();
        let mut setup = memprof::pipeline::Setup::for_namespace(ns);
        setup.options.admission =
            memprof::api::admission::Keys::of(crate::common::admission_keys(ns).await);
        memprof::pipeline::run(client, setup, std::future::pending())
            .await
            .unwrap();
    });
}

/// The Jobs named `name` that exist (0 or 1) and their uids.
pub async fn job_uids(client: &Client, ns: &str, name: &str) -> Vec<String> {
    Api::<Job>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|j| j.name_any() == name)
        .filter_map(|j| j.uid())
        .collect()
}

/// The policy of most tests: `team=ml` Jobs, critical risk or an OOM, batch × 0.75.
pub fn shrink_policy(dry_run: bool) -> serde_json::Value {
    json!({
        "selector": {"matchLabels": {"team": "ml"}},
        "triggers": [{"riskAtLeast": {"level": "critical"}}, {"oomObserved": true}],
        "actions": [{"scaleBatch": {"env": "BATCH_SIZE", "factor": 0.75, "minimum": 4}}],
        "cooldownSeconds": 600,
        "maxRemediations": 3,
        "dryRun": dry_run,
    })
}

/// Applies [`shrink_policy`] (`dry_run` as given) in `ns`, as policy `shrink`.
pub async fn apply_shrink(client: &Client, ns: &str, dry_run: bool) {
    apply_policy(client, ns, "shrink", shrink_policy(dry_run))
        .await
        .unwrap_or_else(|e| panic!("applying the shrink policy in {ns}: {e}"));
}

/// The remediation tests' start: the operator watching `ns`, then the
/// shrink policy applied there ([`apply_shrink`]).
pub async fn operator_shrinking(client: &Client, ns: &str, dry_run: bool) -> RunningOperator {
    let operator = start_operator(client, ns);
    apply_shrink(client, ns, dry_run).await;
    operator
}

/// The workload tests' cluster and namespace
/// ([`workload_cluster`](crate::workload_support::workload_cluster)) with
/// the shrink policy applied there, no operator running yet; `None` where
/// no cluster is configured (the test is skipped).
pub async fn shrinking_workload_cluster() -> Option<(Client, TestNamespace)> {
    let (admin, ns) = crate::workload_support::workload_cluster().await?;
    apply_shrink(&admin, &ns.name, false).await;
    Some((admin, ns))
}

/// What the sim sidecar of rank 0 writes when its GPU is about to run out.
pub async fn critical_report(client: &Client, ns: &str, job: &str, offset_ms: u64) {
    let gpus = vec![gpu(0, 79, 79, RiskLevel::Critical, Some(5.0))];
    let r = rank_report(client, ns, job, 0, &at(offset_ms), gpus).await;
    apply_report(client, ns, &r).await;
}

/// A healthy rank: the operator writes the profile's first status from it.
pub async fn low_report(client: &Client, ns: &str, job: &str) {
    let gpus = vec![gpu(0, 30, 31, RiskLevel::Low, None)];
    let r = rank_report(client, ns, job, 0, &at(0), gpus).await;
    apply_report(client, ns, &r).await;
}

pub async fn job(client: &Client, ns: &str, name: &str) -> Option<Job> {
    Api::<Job>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .unwrap()
}

/// The annotations memprof stamped on a workload it recreated (id and
/// nonce), as a tenant would copy them onto a workload of its own.
pub fn stamped(made: &impl ResourceExt) -> BTreeMap<String, String> {
    let a = made.annotations();
    [ANNOTATION_REMEDIATION, ANNOTATION_REMEDIATION_NONCE]
        .into_iter()
        .map(|k| (k.to_string(), a[k].clone()))
        .collect()
}

/// Waits for a fresh profile `name`, owned by `owner` alone, without
/// history, after a workload memprof did not create (`newcomer` says which)
/// took the name of one whose profile, of uid `earlier`, was left with no
/// owner. Fails at once if the earlier profile ever names `owner`: it
/// passed, with its history, to a workload its records do not name.
pub async fn fresh_profile(
    client: &Client,
    ns: &str,
    name: &str,
    earlier: &str,
    owner: &str,
    newcomer: &str,
) {
    let profiles = Api::<MemoryProfile>::namespaced(client.clone(), ns);
    eventually(
        &format!("a fresh profile of {newcomer}, without history"),
        || async {
            let p = profiles.get_opt(name).await.map_err(|e| e.to_string())?;
            let p = p.ok_or("no profile yet")?;
            let owners: Vec<_> = p.owner_references().iter().map(|o| o.uid.clone()).collect();
            let history = p.status.as_ref().map_or(0, |s| s.remediations.len());
            let is_earlier = p.uid().as_deref() == Some(earlier);
            if is_earlier && owners.iter().any(|o| o == owner) {
                panic!("the ownerless profile ({history} records) adopted by {newcomer}");
            }
            (!is_earlier && owners == [owner] && history == 0)
                .then_some(())
                .ok_or(format!(
                    "earlier: {is_earlier}, owners {owners:?}, {history} records"
                ))
        },
    )
    .await;
}
