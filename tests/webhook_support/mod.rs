//! The admission webhook in-process for integration tests: the real server
//! on 127.0.0.1 with a certificate of its own, registered by URL the way the
//! chart registers it (jobs; pods asking for injection; pods of profiled Jobs,
//! for the admission mark), scoped to one labelled test namespace.
#![allow(dead_code)]

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use memprof::webhook::{self, certs, InjectionConfig, SidecarMode, TlsCert, SIDECAR_CONTAINER};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Label on the test namespace that the webhook's namespaceSelector matches.
pub const NS_LABEL: &str = "memprof.dev/test-namespace";

/// Labels `ns` so that only its own webhook configuration sees it.
pub async fn label_namespace(client: &Client, ns: &str) {
    let patch = json!({"metadata": {"labels": {NS_LABEL: ns}}});
    Api::<Namespace>::all(client.clone())
        .patch(ns, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("label the test namespace");
}

/// The injection settings of the tests: a test image, native sidecars as the
/// server supports them.
pub async fn test_config(client: &Client) -> InjectionConfig {
    let version = client.apiserver_version().await.unwrap();
    InjectionConfig {
        image: "memprof:test".into(),
        native_sidecar: SidecarMode::Auto.resolve(&version.major, &version.minor),
        ..Default::default()
    }
}

/// A running webhook server on 127.0.0.1 with its CA; dropping `stop` ends it.
pub struct Server {
    /// Where the API server is sent: the secret path of the config's key
    /// (`memprof_webhook::paths`), or `/mutate` without a key.
    pub url: String,
    /// `/mutate`: reviews there are injected, never marked.
    pub plain_url: String,
    pub ca_pem: String,
    pub stop: oneshot::Sender<()>,
    pub done: tokio::task::JoinHandle<Result<(), webhook::ServerError>>,
}

impl Server {
    /// Stops the server and waits for it.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        self.done.await.unwrap().unwrap();
    }
}

/// The webhook with [`test_config`].
pub async fn start_server(client: &Client) -> Server {
    start_server_with(test_config(client).await).await
}

/// The webhook with `config`.
pub async fn start_server_with(config: InjectionConfig) -> Server {
    let token = config
        .marks
        .keys
        .ring()
        .current()
        .map(memprof::api::admission::path_token);
    let names = vec!["127.0.0.1".to_string()];
    let bundle = certs::generate(
        &names,
        jiff::Timestamp::now(),
        jiff::SignedDuration::from_hours(1),
    )
    .unwrap();
    let tls = TlsCert::from_pem(bundle.cert_pem.as_bytes(), bundle.key_pem.as_bytes()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (stop, stopped) = oneshot::channel::<()>();
    let done = tokio::spawn(webhook::serve(listener, tls, Arc::new(config), async {
        let _ = stopped.await;
    }));
    let plain_url = format!("https://127.0.0.1:{port}/mutate");
    Server {
        url: match token {
            Some(t) => format!("{plain_url}/{t}"),
            None => plain_url.clone(),
        },
        plain_url,
        ca_pem: bundle.ca_pem,
        stop,
        done,
    }
}

/// Deletes the webhook configuration named `0` when dropped (panics included).
pub struct Registration(pub String);

impl Drop for Registration {
    fn drop(&mut self) {
        let name = self.0.clone();
        let _ = crate::common::from_drop(move |client| async move {
            let api = Api::<MutatingWebhookConfiguration>::all(client);
            let _ = api.delete(&name, &Default::default()).await;
            Ok(())
        });
    }
}

/// Registers the chart's webhooks (jobs, labelled pods, profiled Jobs'
/// pods, report writes) by URL, scoped to the test namespace, named after it.
pub async fn register(client: &Client, ns: &str, url: &str, ca_pem: &str) {
    use base64::Engine as _;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    // As the operator keeps it: only the marks and writers webhooks on the secret path.
    let plain = match url.split_once("/mutate/") {
        Some((base, _)) => format!("{base}/mutate"),
        None => url.to_string(),
    };
    let hook = |name: &str, group: &str, resource: &str, object_selector: serde_json::Value| {
        let url = if memprof::webhook::paths::SECRET_PATH_WEBHOOKS.contains(&name) {
            url
        } else {
            plain.as_str()
        };
        let (versions, operations) = match group {
            "memprof.dev" => (json!(["v1alpha1"]), json!(["CREATE", "UPDATE"])),
            _ => (json!(["v1"]), json!(["CREATE"])),
        };
        json!({
            "name": name,
            "clientConfig": { "url": url, "caBundle": ca },
            "rules": [{ "apiGroups": [group], "apiVersions": versions, "operations": operations,
                        "resources": [resource], "scope": "Namespaced" }],
            "failurePolicy": "Ignore",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 2,
            "namespaceSelector": { "matchLabels": { NS_LABEL: ns } },
            "objectSelector": object_selector,
        })
    };
    let mwc = serde_json::from_value(json!({
        "metadata": { "name": ns },
        "webhooks": [
            hook("jobs.memprof.dev", "batch", "jobs", json!({})),
            hook("pods.memprof.dev", "", "pods",
                 json!({ "matchLabels": { "memprof.dev/inject": "true" } })),
            hook("marks.memprof.dev", "", "pods",
                 json!({ "matchLabels": { "memprof.dev/managed": "true" } })),
            hook("writers.memprof.dev", "memprof.dev", "memoryreports", json!({})),
        ]
    }))
    .unwrap();
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &mwc)
        .await
        .expect("register the webhook");
}

pub fn job(name: &str, annotated: bool) -> Job {
    let annotations = if annotated {
        json!({ "memprof.dev/enabled": "true" })
    } else {
        json!({})
    };
    serde_json::from_value(json!({
        "metadata": { "name": name, "annotations": annotations },
        "spec": {
            "parallelism": 2,
            "completions": 2,
            "backoffLimit": 0,
            "template": { "spec": {
                "restartPolicy": "Never",
                "containers": [{ "name": "trainer", "image": "python:3", "command": ["true"] }]
            }}
        }
    }))
    .unwrap()
}

pub fn container_names(spec: &k8s_openapi::api::core::v1::PodSpec) -> Vec<String> {
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .map(|c| c.name.clone())
        .collect()
}

pub fn template_containers(job: &Job) -> Vec<String> {
    container_names(job.spec.as_ref().unwrap().template.spec.as_ref().unwrap())
}

/// The API server picks up a new webhook configuration asynchronously: probe
/// with dry-run Jobs until one comes back injected.
pub async fn wait_until_active(client: &Client, ns: &str) {
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let probe = jobs
            .create(&dry, &job("probe", true))
            .await
            .expect("dry-run Job");
        if template_containers(&probe).contains(&SIDECAR_CONTAINER.to_string()) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "webhook configuration never became active"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The Job controller cannot create pods before the namespace's default
/// service account has its token (ServiceAccount admission in 1.20).
pub async fn wait_for_default_token(client: &Client, ns: &str) {
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let sa = sas.get_opt("default").await.unwrap();
        if sa.and_then(|sa| sa.secrets).is_some_and(|s| !s.is_empty()) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "default service account never got a token"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The real webhook for `ns`, registered for MemoryReport writes only (as
/// the chart's `writers.memprof.dev`), under `ring` (`ns`'s admission key is
/// the one the tests' operators verify with), on its secret path: it marks the
/// reports their pods' own bound tokens write. Jobs and pods are left to
/// the test (no injection). Both halves stop when dropped.
pub struct Writers {
    pub server: Server,
    _registration: Registration,
}

pub async fn serve_writers(
    admin: &Client,
    ns: &str,
    ring: memprof::api::admission::KeyRing,
) -> Writers {
    use base64::Engine as _;
    label_namespace(admin, ns).await;
    let mut config = test_config(admin).await;
    config.marks.keys = memprof::api::admission::Keys::of(ring);
    let server = start_server_with(config).await;
    let ca = base64::engine::general_purpose::STANDARD.encode(&server.ca_pem);
    let mwc = serde_json::from_value(json!({
        "metadata": { "name": ns },
        "webhooks": [{
            "name": "writers.memprof.dev",
            "clientConfig": { "url": server.url, "caBundle": ca },
            "rules": [{ "apiGroups": ["memprof.dev"], "apiVersions": ["v1alpha1"],
                        "operations": ["CREATE", "UPDATE"], "resources": ["memoryreports"],
                        "scope": "Namespaced" }],
            "failurePolicy": "Ignore",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 5,
            "namespaceSelector": { "matchLabels": { NS_LABEL: ns } },
        }]
    }))
    .unwrap();
    Api::<MutatingWebhookConfiguration>::all(admin.clone())
        .create(&PostParams::default(), &mwc)
        .await
        .expect("register the writers webhook");
    Writers {
        server,
        _registration: Registration(ns.to_string()),
    }
}
