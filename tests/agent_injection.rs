//! Zero-code-change activation of the Python agent against the real control
//! plane (`hack/local-cluster.sh up`): a Job annotated
//! `memprof.dev/agent: "python"` gets, through the admission webhook served
//! by this crate, the init container that copies the agent, the shared
//! volume, the trainers' mounts, `PYTHONPATH` (the startup hook) and the
//! sidecar's socket (`MEMPROF_AGENT_SOCKET` on the pod's private emptyDir,
//! mounted in the sidecar and every trainer); so do the pods the Job
//! controller makes from it, and
//! a Job recreated from it (as remediation does) is not injected twice.
//!
//!     eval "$(bash hack/local-cluster.sh env)"
//!     MEMPROF_REQUIRE_CLUSTER=1 cargo test -p memprof --test integration agent_injection::

use crate::common;

use common::{eventually, TestNamespace};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Container, Namespace, Pod, PodSpec, ServiceAccount};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use memprof::webhook::agent::{
    AGENT_SOCKET, BOOTSTRAP_DIR, INSTALL_CONTAINER, LIB_DIR, MOUNT_PATH, PYTHONPATH, VOLUME,
};
use memprof::webhook::sidecar::SOCKET_VOLUME;
use memprof::webhook::{self, certs, InjectionConfig, SidecarMode, TlsCert, SIDECAR_CONTAINER};
use serde_json::json;
use std::sync::Arc;
use tokio::sync::oneshot;

/// A client for the local control plane, or `None` (after saying so) when
/// there is none and none is required. Not `common::cluster()`: that one
/// also installs the CRDs, which this test does not need.
async fn cluster() -> Option<Client> {
    let required = std::env::var("MEMPROF_REQUIRE_CLUSTER").is_ok_and(|v| v == "1");
    let found = match std::env::var_os("KUBECONFIG") {
        None => Err("KUBECONFIG is not set".to_string()),
        Some(_) => match Client::try_default().await {
            Err(e) => Err(format!("no Kubernetes client could be configured: {e}")),
            Ok(c) => match c.apiserver_version().await {
                Err(e) => Err(format!("the API server does not answer: {e}")),
                Ok(_) => Ok(c),
            },
        },
    };
    match found {
        Ok(c) => {
            // Apart from a test that has the cluster alone, as common::cluster() is.
            crate::common::alone::CLUSTER.share().await;
            Some(c)
        }
        Err(why) => {
            assert!(!required, "MEMPROF_REQUIRE_CLUSTER=1 but {why}");
            eprintln!("SKIPPED: {why}. To run: eval \"$(bash hack/local-cluster.sh env)\" && MEMPROF_REQUIRE_CLUSTER=1 cargo test --test integration agent_injection::");
            None
        }
    }
}

/// Namespace label the test's webhook configuration selects.
const NS_LABEL: &str = "memprof.dev/test-namespace";

/// The webhook served on 127.0.0.1 and registered by URL for one namespace;
/// dropping it stops the server and deletes the registration.
struct Webhook {
    name: String,
    stop: Option<oneshot::Sender<()>>,
}

impl Webhook {
    async fn start(client: &Client, ns: &str) -> Webhook {
        let version = client.apiserver_version().await.unwrap();
        let config = InjectionConfig {
            image: "memprof:test".into(),
            native_sidecar: SidecarMode::Auto.resolve(&version.major, &version.minor),
            ..Default::default()
        };
        let names = ["127.0.0.1".to_string()];
        let hour = jiff::SignedDuration::from_hours(1);
        let bundle = certs::generate(&names, jiff::Timestamp::now(), hour).unwrap();
        let tls = TlsCert::from_pem(bundle.cert_pem.as_bytes(), bundle.key_pem.as_bytes()).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!(
            "https://127.0.0.1:{}/mutate",
            listener.local_addr().unwrap().port()
        );
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(webhook::serve(listener, tls, Arc::new(config), async {
            let _ = stopped.await;
        }));

        // Only this namespace is sent to this server.
        let label = json!({ "metadata": { "labels": { NS_LABEL: ns } } });
        Api::<Namespace>::all(client.clone())
            .patch(ns, &PatchParams::default(), &Patch::Merge(&label))
            .await
            .expect("label the test namespace");
        use base64::Engine as _;
        let ca = base64::engine::general_purpose::STANDARD.encode(&bundle.ca_pem);
        let mwc = serde_json::from_value(json!({
            "metadata": { "name": ns },
            "webhooks": [{
                "name": "jobs.memprof.dev",
                "clientConfig": { "url": url, "caBundle": ca },
                "rules": [{ "apiGroups": ["batch"], "apiVersions": ["v1"], "operations": ["CREATE"],
                            "resources": ["jobs"], "scope": "Namespaced" }],
                "failurePolicy": "Ignore",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 5,
                "namespaceSelector": { "matchLabels": { NS_LABEL: ns } },
            }]
        }))
        .unwrap();
        Api::<MutatingWebhookConfiguration>::all(client.clone())
            .create(&PostParams::default(), &mwc)
            .await
            .expect("register the webhook");
        Webhook {
            name: ns.into(),
            stop: Some(stop),
        }
    }
}

impl Drop for Webhook {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let name = self.name.clone();
        let _ = common::from_drop(move |client| async move {
            let api = Api::<MutatingWebhookConfiguration>::all(client);
            let _ = api.delete(&name, &DeleteParams::default()).await;
            Ok(())
        });
    }
}

/// A profiled Job asking for the agent: a trainer with its own PYTHONPATH,
/// and an evaluator whose PYTHONPATH comes from the downward API (a value the
/// webhook cannot know).
fn job(name: &str, agent: &str) -> Job {
    serde_json::from_value(json!({
        "metadata": { "name": name,
                      "annotations": { "memprof.dev/enabled": "true", "memprof.dev/agent": agent } },
        "spec": {
            "parallelism": 1,
            "completions": 1,
            "backoffLimit": 0,
            "template": { "spec": {
                "restartPolicy": "Never",
                "containers": [
                    { "name": "trainer", "image": "pytorch:2", "command": ["python", "train.py"],
                      "env": [{ "name": "PYTHONPATH", "value": "/app" }] },
                    { "name": "eval", "image": "pytorch:2", "command": ["python", "eval.py"],
                      "env": [{ "name": "PYTHONPATH",
                                "valueFrom": { "fieldRef": { "fieldPath": "metadata.namespace" } } }] }
                ]
            }}
        }
    }))
    .unwrap()
}

fn template(job: &Job) -> &PodSpec {
    job.spec.as_ref().unwrap().template.spec.as_ref().unwrap()
}

fn all_containers(spec: &PodSpec) -> impl Iterator<Item = &Container> {
    spec.init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
}

fn env_values(c: &Container, name: &str) -> Vec<String> {
    let env = c.env.iter().flatten().filter(|e| e.name == name);
    env.map(|e| e.value.clone().unwrap_or_else(|| "<valueFrom>".into()))
        .collect()
}

/// Everything the agent injection adds, checked on a pod spec (a Job's
/// template or a pod).
fn assert_agent_injected(spec: &PodSpec) {
    let names: Vec<&str> = all_containers(spec).map(|c| c.name.as_str()).collect();
    assert_eq!(
        names.iter().filter(|n| **n == INSTALL_CONTAINER).count(),
        1,
        "one installer in {names:?}"
    );
    assert!(names.contains(&SIDECAR_CONTAINER), "{names:?}");

    let volume = spec.volumes.iter().flatten().find(|v| v.name == VOLUME);
    assert!(
        volume.and_then(|v| v.empty_dir.as_ref()).is_some(),
        "emptyDir {VOLUME}"
    );

    let installer = all_containers(spec)
        .find(|c| c.name == INSTALL_CONTAINER)
        .unwrap();
    assert_eq!(installer.image.as_deref(), Some("memprof:test"));
    let command = installer.command.clone().unwrap();
    assert_eq!(
        command[..3],
        ["/usr/local/bin/memprof", "install-agent", "--best-effort"]
    );
    assert_eq!(command.last().map(String::as_str), Some(MOUNT_PATH));
    let mount = &installer.volume_mounts.as_ref().unwrap()[0];
    assert_eq!(
        (mount.name.as_str(), mount.mount_path.as_str()),
        (VOLUME, MOUNT_PATH)
    );

    let hook_first = format!("{BOOTSTRAP_DIR}:/app:{LIB_DIR}");
    let later = format!("{BOOTSTRAP_DIR}:$(PYTHONPATH):{LIB_DIR}");
    for (name, pythonpath) in [
        ("trainer", vec![hook_first.as_str()]),
        // The downward-API value stays; a later entry expands it.
        ("eval", vec!["<valueFrom>", later.as_str()]),
    ] {
        let c = spec.containers.iter().find(|c| c.name == name).unwrap();
        assert_eq!(env_values(c, PYTHONPATH), pythonpath, "{name}");
        assert_eq!(
            env_values(c, AGENT_SOCKET),
            ["/var/run/memprof/agent.sock"],
            "{name}"
        );
        assert!(env_values(c, "MEMPROF_AGENT_URL").is_empty(), "{name}");
        let mounts = c.volume_mounts.iter().flatten();
        let ours: Vec<_> = mounts.filter(|m| m.name == VOLUME).collect();
        assert_eq!(ours.len(), 1, "{name}");
        assert_eq!(ours[0].mount_path, MOUNT_PATH);
        assert_eq!(ours[0].read_only, Some(true));
        let socket: Vec<_> = c
            .volume_mounts
            .iter()
            .flatten()
            .filter(|m| m.name == SOCKET_VOLUME)
            .collect();
        assert_eq!(socket.len(), 1, "{name}");
        assert_eq!(
            (socket[0].mount_path.as_str(), socket[0].read_only),
            ("/var/run/memprof", Some(true))
        );
    }
    let volume = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == SOCKET_VOLUME)
        .expect("the socket's volume");
    assert!(volume.empty_dir.is_some(), "private to the pod: {volume:?}");
    let sidecar = all_containers(spec)
        .find(|c| c.name == SIDECAR_CONTAINER)
        .unwrap();
    assert!(env_values(sidecar, PYTHONPATH).is_empty());
    assert_eq!(
        env_values(sidecar, AGENT_SOCKET),
        ["/var/run/memprof/agent.sock"]
    );
    assert!(
        env_values(sidecar, "MEMPROF_PORT").is_empty(),
        "no scraping here"
    );
}

/// The API server picks up a new webhook configuration asynchronously.
async fn wait_until_active(jobs: &Api<Job>) {
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    eventually("the webhook configuration to become active", || async {
        let probe = jobs.create(&dry, &job("probe", "python")).await;
        let probe = probe.map_err(|e| e.to_string())?;
        let names: Vec<String> = all_containers(template(&probe))
            .map(|c| c.name.clone())
            .collect();
        names
            .contains(&SIDECAR_CONTAINER.to_string())
            .then_some(())
            .ok_or(format!("{names:?}"))
    })
    .await
}

/// The Job controller cannot create pods before the namespace's default
/// service account has its token (ServiceAccount admission in 1.20).
async fn wait_for_default_token(client: &Client, ns: &str) {
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    eventually("the default service account's token", || async {
        let sa = sas.get_opt("default").await.map_err(|e| e.to_string())?;
        sa.and_then(|sa| sa.secrets)
            .is_some_and(|s| !s.is_empty())
            .then_some(())
            .ok_or("no token yet".to_string())
    })
    .await
}

#[tokio::test]
async fn annotated_job_and_its_pods_get_the_agent() {
    let Some(client) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&client).await;
    let _webhook = Webhook::start(&client, &ns.name).await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns.name);
    wait_until_active(&jobs).await;
    wait_for_default_token(&client, &ns.name).await;

    let created = jobs
        .create(&PostParams::default(), &job("train", "python"))
        .await
        .expect("the API server admits the injected Job");
    assert_agent_injected(template(&created));

    // The Job controller's pod is made from the injected template.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let pod = eventually("the Job controller's pod", || async {
        let list = pods
            .list(&ListParams::default().labels("job-name=train"))
            .await;
        let list = list.map_err(|e| e.to_string())?;
        list.items
            .into_iter()
            .next()
            .ok_or("no pod yet".to_string())
    })
    .await;
    assert_agent_injected(pod.spec.as_ref().unwrap());

    // Recreated as remediation recreates a Job: not injected twice.
    let old = serde_json::to_value(&created).unwrap();
    let mut again =
        memprof::policy::plan::recreated_job(&old, &[], "test-1", &Default::default(), false);
    again["metadata"]["name"] = json!("train-again");
    let again: Job = serde_json::from_value(again).unwrap();
    let again = jobs.create(&PostParams::default(), &again).await.unwrap();
    assert_agent_injected(template(&again));

    // Another value: the sidecar only.
    let other = jobs
        .create(&PostParams::default(), &job("java", "java"))
        .await
        .unwrap();
    let names: Vec<&str> = all_containers(template(&other))
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(names, ["trainer", "eval", SIDECAR_CONTAINER]);
    let trainer = &template(&other).containers[0];
    assert_eq!(env_values(trainer, PYTHONPATH), ["/app"]);
}
