//! The admission warning from measured history, through real `kubectl
//! create` on the local control plane: the webhook in-process (as
//! tests/webhook.rs runs it) reading the MemoryProfiles of the Job's own
//! namespace labelled with its family (`memprof.dev/family`), here written
//! by the test as the operator's roll-up would.
//!
//!     eval "$(bash hack/local-cluster.sh env)"
//!     MEMPROF_REQUIRE_CLUSTER=1 cargo test -p memprof --test integration admission_history::

use crate::common;
use crate::webhook_support;

use common::{cluster, TestNamespace, GIB};
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, Config};
use memprof::api::{BatchFitModel, BatchRecommendation, MemoryProfile, MemoryProfileStatus};
use memprof::webhook::history::History;
use memprof::webhook::{certs, TlsCert};
use serde_json::json;
use std::sync::Arc;
use tokio::sync::oneshot;
use webhook_support::*;

pub(crate) const FAMILY: &str = "llama-8b";

/// A webhook on 127.0.0.1 that reads the history through `reader`,
/// registered for `ns` only; stopped and unregistered when dropped.
pub(crate) struct Hook {
    /// Where it is served (`/mutate`), for more registrations.
    pub url: String,
    /// Its CA.
    pub ca_pem: String,
    stop: Option<oneshot::Sender<()>>,
    _registration: Registration,
}

impl Drop for Hook {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

pub(crate) async fn hook(admin: &Client, reader: Client, ns: &str) -> Hook {
    let config = test_config(admin).await;
    let bundle = certs::generate(
        &["127.0.0.1".to_string()],
        jiff::Timestamp::now(),
        jiff::SignedDuration::from_hours(1),
    )
    .unwrap();
    let tls = TlsCert::from_pem(bundle.cert_pem.as_bytes(), bundle.key_pem.as_bytes()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "https://127.0.0.1:{}/mutate",
        listener.local_addr().unwrap().port()
    );
    let (stop, stopped) = oneshot::channel::<()>();
    let history = Arc::new(History::new(reader));
    tokio::spawn(memprof::webhook::server::serve_with_history(
        listener,
        tls,
        Arc::new(config),
        history,
        async {
            let _ = stopped.await;
        },
    ));
    label_namespace(admin, ns).await;
    register(admin, ns, &url, &bundle.ca_pem).await;
    let registration = Registration(ns.to_string());
    wait_until_active(admin, ns).await;
    Hook {
        url,
        ca_pem: bundle.ca_pem,
        stop: Some(stop),
        _registration: registration,
    }
}

/// A MemoryProfile of an earlier Job of `family` whose roll-up fitted
/// `20 GiB + 1 GiB × batch` on three batches (8..32) on an 80 GiB GPU.
pub(crate) async fn history(client: &Client, ns: &str, name: &str, family: &str) {
    let api: Api<MemoryProfile> = Api::namespaced(client.clone(), ns);
    let mut p = MemoryProfile::new(name, Default::default());
    p.spec.job_name = name.into();
    p.metadata.labels = Some([("memprof.dev/family".to_string(), family.to_string())].into());
    api.create(&PostParams::default(), &p).await.unwrap();
    let rec = BatchRecommendation {
        env_var: "BATCH_SIZE".into(),
        current: Some(32),
        recommended: Some(52),
        limit_bytes: Some(80 * GIB),
        headroom_fraction: 0.1,
        method: "agentBreakdown".into(),
        reason: "fitted".into(),
        model: Some(BatchFitModel {
            family: "linear".into(),
            static_bytes: 20 * GIB as i64,
            per_sample_bytes: GIB as f64,
            margin_bytes: GIB,
            points: 3,
            measured_min: 8,
            measured_max: 32,
            backed_min: 8,
            backed_max: 48,
            ..Default::default()
        }),
        ..Default::default()
    };
    let status = MemoryProfileStatus {
        batch_recommendation: Some(rec),
        ranks: "1/1".into(),
        peak: "30.0GiB (37%)".into(),
        ..Default::default()
    };
    let patch = json!({ "status": status });
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// A profiled Job of `FAMILY` at `batch`, with `labels`.
fn job_at(name: &str, batch: u32, labels: serde_json::Value) -> Job {
    let mut j = job(name, true);
    j.metadata.labels = Some(serde_json::from_value(labels).unwrap());
    j.metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert("memprof.dev/family".into(), FAMILY.into());
    let env = json!([{ "name": "BATCH_SIZE", "value": batch.to_string() }]);
    let c = &mut j
        .spec
        .as_mut()
        .unwrap()
        .template
        .spec
        .as_mut()
        .unwrap()
        .containers[0];
    c.env = Some(serde_json::from_value(env).unwrap());
    j
}

/// `kubectl create -f -` with `object` (a Job, or any kind's manifest) on
/// stdin, in `ns`; (success, stderr).
pub(crate) async fn kubectl_create(
    ns: &str,
    object: &impl k8s_openapi::serde::Serialize,
) -> (bool, String) {
    use tokio::io::AsyncWriteExt as _;
    let mut child = tokio::process::Command::new("kubectl")
        .args(["create", "-n", ns, "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("running kubectl");
    let body = serde_json::to_vec(object).unwrap();
    child.stdin.take().unwrap().write_all(&body).await.unwrap();
    let out = tokio::time::timeout(common::TIMEOUT, child.wait_with_output())
        .await
        .expect("kubectl finished")
        .expect("kubectl's output");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[tokio::test]
async fn a_job_whose_familys_history_predicts_an_oom_is_warned_with_the_basis() {
    let Some(client) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&client).await;
    history(&client, &ns.name, "earlier-run", FAMILY).await;
    let _hook = hook(&client, client.clone(), &ns.name).await;

    // 20 + 64 = 84 GiB on the 80 GiB the earlier run measured.
    let (ok, stderr) = kubectl_create(&ns.name, &job_at("too-big", 64, json!({}))).await;
    assert!(ok, "a warning, never a denial by default: {stderr}");
    for part in [
        "Warning: memprof: predicted peak 84.0GiB per rank at BATCH_SIZE=64",
        "against the GPU's 80.0GiB",
        "measured history of family llama-8b in this namespace: MemoryProfile earlier-run",
        "a linear fit of 3 measured points at batches 8..32",
        "is expected to run out of GPU memory",
        "lower BATCH_SIZE (MemoryProfile earlier-run recommends at most 52)",
    ] {
        assert!(stderr.contains(part), "{part:?} in {stderr}");
    }
    // 20 + 16 = 36 GiB: fits, nothing said.
    let (ok, stderr) = kubectl_create(&ns.name, &job_at("fits", 16, json!({}))).await;
    assert!(ok, "{stderr}");
    assert!(!stderr.contains("memprof"), "{stderr}");
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns.name);
    let created = jobs.get("too-big").await.unwrap();
    assert!(template_containers(&created).contains(&"memprof-sidecar".to_string()));
}

#[tokio::test]
async fn another_namespaces_history_is_never_used() {
    let Some(client) = cluster().await else {
        return;
    };
    let (theirs, ours) = (
        TestNamespace::create(&client).await,
        TestNamespace::create(&client).await,
    );
    history(&client, &theirs.name, "their-run", FAMILY).await;
    let _hook = hook(&client, client.clone(), &ours.name).await;
    let (ok, stderr) = kubectl_create(&ours.name, &job_at("big", 64, json!({}))).await;
    assert!(ok, "{stderr}");
    assert!(!stderr.contains("memprof"), "{stderr}");
}

#[tokio::test]
async fn an_opted_in_policy_denies_what_it_selects_saying_what_to_do() {
    let Some(client) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&client).await;
    history(&client, &ns.name, "earlier-run", FAMILY).await;
    let policy = json!({
        "apiVersion": "memprof.dev/v1alpha1", "kind": "RemediationPolicy",
        "metadata": { "name": "no-predicted-oom" },
        "spec": {
            "selector": { "matchLabels": { "team": "ml" } },
            "triggers": [{ "oomObserved": true }],
            "actions": [{ "event": { "reason": "MemprofOom" } }],
            "denyPredictedOom": true
        }
    });
    let policies: Api<memprof::api::RemediationPolicy> = Api::namespaced(client.clone(), &ns.name);
    let policy = serde_json::from_value(policy).unwrap();
    policies
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
    let _hook = hook(&client, client.clone(), &ns.name).await;

    let (ok, stderr) = kubectl_create(&ns.name, &job_at("big", 64, json!({"team": "ml"}))).await;
    assert!(!ok, "denied: {stderr}");
    for part in [
        "RemediationPolicy no-predicted-oom (denyPredictedOom) refuses this Job",
        "predicted peak 84.0GiB per rank at BATCH_SIZE=64 exceeds the GPU's 80.0GiB",
        "To create it: lower BATCH_SIZE (MemoryProfile earlier-run recommends at most 52)",
    ] {
        assert!(stderr.contains(part), "{part:?} in {stderr}");
    }
    // What the policy does not select is only warned about; what fits passes.
    let (ok, stderr) = kubectl_create(&ns.name, &job_at("other", 64, json!({"team": "cv"}))).await;
    assert!(ok && stderr.contains("expected to run out"), "{stderr}");
    let (ok, stderr) = kubectl_create(&ns.name, &job_at("fits", 16, json!({"team": "ml"}))).await;
    assert!(ok && !stderr.contains("memprof"), "{stderr}");
}

/// The history read as a ServiceAccount with no rights: every LIST is
/// forbidden, and the Job is admitted with a warning saying so.
#[tokio::test]
async fn api_errors_fail_open_with_a_warning() {
    let Some(client) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&client).await;
    history(&client, &ns.name, "earlier-run", FAMILY).await;
    let mut config = Config::infer().await.unwrap();
    config.auth_info.impersonate = Some(format!("system:serviceaccount:{}:nobody", ns.name));
    let nobody = Client::try_from(config).unwrap();
    let _hook = hook(&client, nobody, &ns.name).await;
    let (ok, stderr) = kubectl_create(&ns.name, &job_at("big", 64, json!({}))).await;
    assert!(ok, "fails open: {stderr}");
    assert!(
        stderr.contains("memprof: the measured history of family llama-8b could not be read"),
        "{stderr}"
    );
    assert!(stderr.contains("no prediction from it"), "{stderr}");
}

/// The other half of the loop: the operator copies a Job's family onto the
/// Job's MemoryProfile as the label the webhook selects on.
#[tokio::test]
async fn the_operator_labels_a_jobs_profile_with_its_family() {
    let Some(client) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&client).await;
    let _op = common::start_operator(&client, &ns.name);
    let mut j = job_at("train", 8, json!({}));
    common::mark_managed(&mut j);
    Api::<Job>::namespaced(client.clone(), &ns.name)
        .create(&PostParams::default(), &j)
        .await
        .unwrap();
    let profiles: Api<MemoryProfile> = Api::namespaced(client.clone(), &ns.name);
    common::eventually("the profile to carry the Job's family", || async {
        let p = profiles.get_opt("train").await.map_err(|e| e.to_string())?;
        let labels = p.map(|p| p.metadata.labels.unwrap_or_default());
        match labels.as_ref().and_then(|l| l.get("memprof.dev/family")) {
            Some(f) if f == FAMILY => Ok(()),
            _ => Err(format!("labels {labels:?}")),
        }
    })
    .await;
}
