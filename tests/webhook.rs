//! The admission webhook against a real control plane (kube-apiserver and
//! kube-controller-manager 1.20 from `hack/local-cluster.sh up`).
//!
//! Every test runs in its own namespace, labelled so that only its own
//! `MutatingWebhookConfiguration` (registered by URL on 127.0.0.1) sees it;
//! namespace and configuration are deleted afterwards, also when the test
//! fails. Without `KUBECONFIG` the tests are skipped with a message, unless
//! `MEMPROF_REQUIRE_CLUSTER=1`, which turns "no cluster" into a failure.
//!
//!     eval "$(bash hack/local-cluster.sh env)"
//!     MEMPROF_REQUIRE_CLUSTER=1 cargo test -p memprof --test integration webhook::

use crate::webhook_support;

use futures::FutureExt as _;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use memprof::webhook::{certs, SIDECAR_CONTAINER};
use serde_json::json;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, Instant};
use webhook_support::*;

/// Says why a test is skipped, visibly: libtest captures `eprintln!` of
/// passing tests, but not direct writes to stderr.
fn skip(why: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "SKIPPED: {why}");
}

/// A client for the local control plane, or `None` (skip) when there is none
/// and none is required.
async fn cluster() -> Option<Client> {
    let required =
        std::env::var("MEMPROF_REQUIRE_CLUSTER").is_ok_and(|v| !v.is_empty() && v != "0");
    if std::env::var_os("KUBECONFIG").is_none() && !required {
        skip(
            "KUBECONFIG is not set; run `eval \"$(bash hack/local-cluster.sh up)\"` \
             (set MEMPROF_REQUIRE_CLUSTER=1 to fail instead)",
        );
        return None;
    }
    let connect = async {
        let client = Client::try_default().await.map_err(|e| e.to_string())?;
        client
            .apiserver_version()
            .await
            .map_err(|e| e.to_string())?;
        Ok::<_, String>(client)
    };
    match tokio::time::timeout(Duration::from_secs(15), connect).await {
        Ok(Ok(client)) => {
            // Apart from a test that has the cluster alone, as common::cluster() is.
            crate::common::alone::CLUSTER.share().await;
            Some(client)
        }
        Ok(Err(e)) if !required => {
            skip(&format!("cannot reach the cluster in KUBECONFIG: {e}"));
            None
        }
        Ok(Err(e)) => panic!("MEMPROF_REQUIRE_CLUSTER is set but the cluster is unreachable: {e}"),
        Err(_) if !required => {
            skip("the cluster in KUBECONFIG did not answer within 15 s");
            None
        }
        Err(_) => {
            panic!("MEMPROF_REQUIRE_CLUSTER is set but the cluster did not answer within 15 s")
        }
    }
}

fn random_suffix() -> String {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(Instant::now().elapsed().as_nanos());
    format!("{:08x}", h.finish() as u32)
}

/// Runs `test` in a fresh namespace, then deletes the namespace and any
/// webhook configuration the test registered for it, even when it panicked.
async fn with_temp_ns<F, Fut>(test: F)
where
    F: FnOnce(Client, String) -> Fut,
    Fut: Future<Output = ()>,
{
    let Some(client) = cluster().await else {
        return;
    };
    let ns = format!("memprof-test-{}", random_suffix());
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let body = serde_json::from_value(json!({
        "metadata": { "name": ns, "labels": { NS_LABEL: ns } }
    }))
    .unwrap();
    namespaces
        .create(&PostParams::default(), &body)
        .await
        .expect("create test namespace");

    let outcome = std::panic::AssertUnwindSafe(test(client.clone(), ns.clone()))
        .catch_unwind()
        .await;

    let mwcs: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let _ = mwcs.delete(&ns, &DeleteParams::default()).await;
    let _ = namespaces.delete(&ns, &DeleteParams::background()).await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

#[tokio::test]
async fn annotated_job_and_its_pods_get_the_sidecar() {
    with_temp_ns(|client, ns| async move {
        let server = start_server(&client).await;
        register(&client, &ns, &server.url, &server.ca_pem).await;
        wait_until_active(&client, &ns).await;
        wait_for_default_token(&client, &ns).await;

        let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
        let created = jobs
            .create(&PostParams::default(), &job("train", true))
            .await
            .unwrap();
        let template = created.spec.as_ref().unwrap().template.clone();
        let spec = template.spec.as_ref().unwrap();
        // 1.20 has no native sidecars: a regular container that exits when alone.
        assert!(
            spec.init_containers.is_none(),
            "legacy sidecar expected on 1.20"
        );
        let sidecar = spec
            .containers
            .iter()
            .find(|c| c.name == SIDECAR_CONTAINER)
            .expect("sidecar injected");
        let env = sidecar.env.as_ref().unwrap();
        let value = |n: &str| {
            env.iter()
                .find(|e| e.name == n)
                .and_then(|e| e.value.clone())
        };
        assert_eq!(value("MEMPROF_EXIT_WHEN_ALONE").as_deref(), Some("true"));
        assert_eq!(value("MEMPROF_JOB_NAME").as_deref(), Some("train"));
        assert_eq!(value("MEMPROF_EXPECTED_RANKS").as_deref(), Some("2"));
        assert_eq!(
            spec.containers[0].termination_message_policy.as_deref(),
            Some("FallbackToLogsOnError")
        );
        let annotations = template.metadata.unwrap().annotations.unwrap();
        assert_eq!(
            annotations.get("memprof.dev/injected").map(String::as_str),
            Some("true")
        );

        // The Job controller's pods come from the mutated template.
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let deadline = Instant::now() + Duration::from_secs(60);
        let pod = loop {
            let list = pods
                .list(&ListParams::default().labels("job-name=train"))
                .await
                .unwrap();
            if let Some(p) = list.items.into_iter().next() {
                break p;
            }
            assert!(
                Instant::now() < deadline,
                "the Job controller created no pod"
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        };
        assert!(
            container_names(pod.spec.as_ref().unwrap()).contains(&SIDECAR_CONTAINER.to_string())
        );

        // A Job without the annotation is left alone.
        let plain = jobs
            .create(&PostParams::default(), &job("plain", false))
            .await
            .unwrap();
        assert_eq!(template_containers(&plain), ["trainer"]);
        assert!(plain
            .spec
            .unwrap()
            .template
            .metadata
            .and_then(|m| m.annotations)
            .is_none());

        // A labelled bare pod is injected too.
        let pod: Pod = serde_json::from_value(json!({
            "metadata": { "name": "bare", "labels": { "memprof.dev/inject": "true" } },
            "spec": { "automountServiceAccountToken": false,
                      "containers": [{ "name": "trainer", "image": "python:3" }] }
        }))
        .unwrap();
        let pod = pods.create(&PostParams::default(), &pod).await.unwrap();
        assert_eq!(
            container_names(pod.spec.as_ref().unwrap()),
            ["trainer", SIDECAR_CONTAINER]
        );

        let _ = server.stop.send(());
        server.done.await.unwrap().unwrap();
    })
    .await;
}

/// `kubectl create -f JOB` with the Job on stdin, in `ns`; (success, stderr).
async fn kubectl_create(ns: &str, job: &Job) -> (bool, String) {
    use tokio::io::AsyncWriteExt as _;
    let mut child = tokio::process::Command::new("kubectl")
        .args(["create", "-n", ns, "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("running kubectl");
    let body = serde_json::to_vec(job).unwrap();
    child.stdin.take().unwrap().write_all(&body).await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("kubectl finished")
        .expect("kubectl's output");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// A Job predicted (by annotation) to exceed its GPU is admitted with a
/// warning that `kubectl create` prints; one predicted to fit is not.
#[tokio::test]
async fn kubectl_create_warns_of_a_job_predicted_not_to_fit_its_gpu() {
    with_temp_ns(|client, ns| async move {
        let server = start_server(&client).await;
        register(&client, &ns, &server.url, &server.ca_pem).await;
        wait_until_active(&client, &ns).await;
        let predicted = |name: &str, peak: &str| {
            let mut j = job(name, true);
            j.metadata.annotations.as_mut().unwrap().extend([
                ("memprof.dev/predicted-peak".to_string(), peak.to_string()),
                ("memprof.dev/gpu-memory".to_string(), "80GiB".to_string()),
                ("memprof.dev/predicted-by".to_string(), "memprof estimate".to_string()),
            ]);
            j
        };
        let (ok, stderr) = kubectl_create(&ns, &predicted("too-big", "85.3GiB")).await;
        assert!(ok, "{stderr}");
        assert!(
            stderr.contains(
                "Warning: memprof: predicted peak 85.3GiB per rank exceeds the GPU's 80.0GiB by 5.3GiB (memprof estimate)"
            ),
            "{stderr}"
        );
        let (ok, stderr) = kubectl_create(&ns, &predicted("fits", "41GiB")).await;
        assert!(ok, "{stderr}");
        assert!(!stderr.contains("memprof"), "{stderr}");
        let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
        let created = jobs.get("too-big").await.unwrap();
        assert!(template_containers(&created).contains(&SIDECAR_CONTAINER.to_string()));
        let _ = server.stop.send(());
        server.done.await.unwrap().unwrap();
    })
    .await;
}

#[tokio::test]
async fn jobs_are_admitted_when_the_webhook_is_down() {
    with_temp_ns(|client, ns| async move {
        let server = start_server(&client).await;
        register(&client, &ns, &server.url, &server.ca_pem).await;
        wait_until_active(&client, &ns).await;
        let _ = server.stop.send(());
        server.done.await.unwrap().unwrap();

        let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
        let started = Instant::now();
        let created = jobs
            .create(&PostParams::default(), &job("train", true))
            .await
            .expect("failurePolicy Ignore admits the Job");
        assert_eq!(template_containers(&created), ["trainer"]);
        // Refused connection or 2 s webhook timeout, never the 10 s default
        // (under 9 s: the margin a loaded 2-core machine needs).
        assert!(
            started.elapsed() < Duration::from_secs(9),
            "took {:?}",
            started.elapsed()
        );
    })
    .await;
}

#[tokio::test]
async fn serving_cert_secret_and_ca_bundle() {
    with_temp_ns(|client, ns| async move {
        // Register with some other CA: patch_ca_bundle must replace it.
        let names = ["127.0.0.1".to_string()];
        let other = certs::generate(
            &names,
            jiff::Timestamp::now(),
            jiff::SignedDuration::from_hours(1),
        )
        .unwrap();
        register(&client, &ns, "https://127.0.0.1:1/mutate", &other.ca_pem).await;
        let cfg = certs::CertConfig {
            namespace: ns.clone(),
            webhook_config_name: Some(ns.clone()),
            extra_names: vec!["127.0.0.1".into()],
            ..Default::default()
        };
        // Two replicas starting together end up with the same certificate.
        let (a, b) = tokio::join!(
            certs::ensure_serving_cert(&client, &cfg),
            certs::ensure_serving_cert(&client, &cfg)
        );
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!(a, b);
        let again = certs::ensure_serving_cert(&client, &cfg).await.unwrap();
        assert_eq!(again, a);
        let secret = Api::<Secret>::namespaced(client.clone(), &ns)
            .get(&cfg.secret_name)
            .await
            .unwrap();
        assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));

        assert!(certs::patch_ca_bundle(&client, &ns, &a.ca_pem)
            .await
            .unwrap());
        assert!(
            !certs::patch_ca_bundle(&client, &ns, &a.ca_pem)
                .await
                .unwrap(),
            "second patch is a no-op"
        );
        let mwc = Api::<MutatingWebhookConfiguration>::all(client.clone())
            .get(&ns)
            .await
            .unwrap();
        for hook in mwc.webhooks.unwrap() {
            assert_eq!(hook.client_config.ca_bundle.unwrap().0, a.ca_pem.as_bytes());
            // Nothing else was touched.
            assert_eq!(hook.timeout_seconds, Some(2));
        }
    })
    .await;
}

/// The API server returns a `failurePolicy: Fail` webhook's URL in the
/// error a creator sees when the call fails: the secret path goes only to
/// the marks webhook, and only while it fails open.
#[tokio::test]
async fn the_secret_path_goes_only_to_a_marks_webhook_that_fails_open() {
    use memprof::webhook::paths::{sync_paths, PathError};
    with_temp_ns(|client, ns| async move {
        let names = ["127.0.0.1".to_string()];
        let ca = certs::generate(
            &names,
            jiff::Timestamp::now(),
            jiff::SignedDuration::from_hours(1),
        )
        .unwrap()
        .ca_pem;
        register(&client, &ns, "https://127.0.0.1:1/mutate", &ca).await;
        assert!(sync_paths(&client, &ns, "tok").await.unwrap());
        assert!(
            !sync_paths(&client, &ns, "tok").await.unwrap(),
            "a second pass is a no-op"
        );
        wait_for_url(&client, &ns, "https://127.0.0.1:1/mutate/tok").await;
        let fail = json!({"webhooks": [{"name": "marks.memprof.dev", "failurePolicy": "Fail"}]});
        let api = Api::<MutatingWebhookConfiguration>::all(client.clone());
        api.patch(&ns, &PatchParams::default(), &Patch::Strategic(&fail))
            .await
            .unwrap();
        let refused = sync_paths(&client, &ns, "new").await.unwrap_err();
        assert!(
            matches!(refused, PathError::FailsClosed { .. }),
            "{refused}"
        );
        wait_for_url(&client, &ns, "https://127.0.0.1:1/mutate/tok").await;
    })
    .await;
}

#[tokio::test]
async fn reporter_rbac_is_applied_idempotently() {
    with_temp_ns(|client, ns| async move {
        for _ in 0..2 {
            memprof::operator::ensure_reporter_rbac(&client, &ns, "")
                .await
                .unwrap();
            memprof::operator::ensure_reporter_rbac(&client, &ns, "trainer")
                .await
                .unwrap();
        }
        let role = Api::<Role>::namespaced(client.clone(), &ns)
            .get("memprof-reporter")
            .await
            .unwrap();
        let rules = role.rules.unwrap();
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].verbs, ["create", "get", "patch"]);
        let bindings = Api::<RoleBinding>::namespaced(client.clone(), &ns)
            .list(&ListParams::default())
            .await
            .unwrap();
        let mut subjects: Vec<String> = bindings
            .items
            .iter()
            .flat_map(|b| b.subjects.iter().flatten().map(|s| s.name.clone()))
            .collect();
        subjects.sort();
        assert_eq!(subjects, ["default", "trainer"]);
    })
    .await;
}

/// The identity the local kube-controller-manager (so its Job controller)
/// creates pods as: it runs with the admin's kubeconfig.
const LOCAL_JOB_CONTROLLER: &str = "memprof-admin";

/// Waits until the marks webhook of configuration `name` calls `url`
/// (the others stay on `/mutate`: their URLs may reach tenants in errors).
async fn wait_for_url(client: &Client, name: &str, url: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mwc = Api::<MutatingWebhookConfiguration>::all(client.clone())
            .get(name)
            .await
            .unwrap();
        let urls: Vec<_> = mwc
            .webhooks
            .iter()
            .flatten()
            .map(|w| {
                (
                    w.name.clone(),
                    w.client_config.url.clone().unwrap_or_default(),
                )
            })
            .collect();
        let plain = url
            .split_once("/mutate/")
            .map(|(b, _)| format!("{b}/mutate"));
        let secret = memprof::webhook::paths::SECRET_PATH_WEBHOOKS;
        let placed = urls
            .iter()
            .all(|(n, u)| match secret.contains(&n.as_str()) {
                true => u == url,
                false => Some(u) == plain.as_ref(),
            });
        if placed {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "webhooks not moved to the secret path: {urls:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A review as anyone can write one: `user` creates pod `evil-0` for Job `job_uid`.
fn forged_review(ns: &str, job_uid: &str, user: &str) -> serde_json::Value {
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": { "uid": "forged", "operation": "CREATE", "name": "evil-0", "namespace": ns,
            "kind": { "group": "", "version": "v1", "kind": "Pod" },
            "userInfo": { "username": user },
            "object": { "apiVersion": "v1", "kind": "Pod",
                "metadata": { "name": "evil-0", "labels": { "memprof.dev/managed": "true" },
                    "ownerReferences": [{ "apiVersion": "batch/v1", "kind": "Job", "name": "train",
                        "uid": job_uid, "controller": true }] },
                "spec": { "containers": [{ "name": "trainer", "image": "busybox" }] } } }
    })
}

/// POSTs `review` to `url` (`https://127.0.0.1:PORT/PATH`) over TLS
/// trusting `ca_pem`: the answer, with its patch decoded.
async fn post_review(url: &str, ca_pem: &str, review: &serde_json::Value) -> String {
    use base64::Engine as _;
    use http_body_util::{BodyExt as _, Full};
    let rest = url.strip_prefix("https://").unwrap();
    let (authority, path) = rest.split_at(rest.find('/').unwrap());
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::pem::PemObject::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let tls = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(authority).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let stream = tokio_rustls::TlsConnector::from(std::sync::Arc::new(tls))
        .connect(name, tcp)
        .await
        .unwrap();
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = hyper::Request::post(path)
        .header("host", "127.0.0.1")
        .header("content-type", "application/json")
        .body(Full::new(bytes::Bytes::from(review.to_string())))
        .unwrap();
    let body = send
        .send_request(req)
        .await
        .unwrap()
        .into_body()
        .collect()
        .await
        .unwrap();
    let out: serde_json::Value = serde_json::from_slice(&body.to_bytes()).unwrap();
    let patch = out["response"]["patch"].as_str().unwrap_or_default();
    let patch = base64::engine::general_purpose::STANDARD
        .decode(patch)
        .unwrap();
    format!("{out} {}", String::from_utf8_lossy(&patch))
}

#[tokio::test]
async fn the_job_controllers_pods_are_named_and_marked_by_the_webhook_and_no_one_elses() {
    use memprof::api::admission::{
        verify, Key, KeyRing, Keys, Subject, ANNOTATION_ADMISSION, MARK_LATE,
    };
    use memprof::webhook::MarkConfig;
    with_temp_ns(|client, ns| async move {
        let key = Key::generate();
        let ring = KeyRing::new(key.clone());
        let config = memprof::webhook::InjectionConfig {
            marks: MarkConfig {
                controllers: vec![LOCAL_JOB_CONTROLLER.into()],
                keys: Keys::of(ring.clone()),
            },
            ..test_config(&client).await
        };
        let server = start_server_with(config).await;
        // Registered as the chart does, on `/mutate`; the operator's path
        // keeper moves every webhook to the key's secret path.
        register(&client, &ns, &server.plain_url, &server.ca_pem).await;
        let keeper = tokio::spawn(memprof::webhook::paths::keep_paths(
            client.clone(),
            ns.clone(),
            Keys::of(ring.clone()),
            std::future::pending(),
        ));
        wait_for_url(&client, &ns, &server.url).await;
        keeper.abort();
        wait_until_active(&client, &ns).await;
        wait_for_default_token(&client, &ns).await;

        let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
        let created = jobs
            .create(&PostParams::default(), &job("train", true))
            .await
            .unwrap();
        let labels = created.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels.get("memprof.dev/managed").map(String::as_str), Some("true"));
        // The API server (1.20) accepts the name a mutating webhook gives a
        // pod created with generateName, and keeps it.
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let deadline = Instant::now() + Duration::from_secs(60);
        let marked = loop {
            let list = pods
                .list(&ListParams::default().labels("job-name=train"))
                .await
                .unwrap();
            if list.items.len() >= 2 {
                break list.items;
            }
            assert!(Instant::now() < deadline, "the Job controller created no pods");
            tokio::time::sleep(Duration::from_millis(300)).await;
        };
        let job_uid = created.metadata.uid.clone().unwrap();
        for pod in &marked {
            let meta = &pod.metadata;
            let name = meta.name.as_deref().unwrap();
            assert_eq!(meta.generate_name.as_deref(), Some("train-"));
            let suffix = name.strip_prefix("train-").unwrap();
            assert_eq!(suffix.len(), 5, "{name}");
            let mark = meta.annotations.as_ref().and_then(|a| a.get(ANNOTATION_ADMISSION));
            let subject = Subject {
                namespace: &ns,
                pod: name,
                job_uid: &job_uid,
            };
            let created = meta.creation_timestamp.as_ref().unwrap().0;
            let now = jiff::Timestamp::now();
            assert_eq!(
                verify(&ring, mark.map(String::as_str), &subject, created, now),
                Ok(()),
                "{name}: {mark:?}"
            );
            // Issued at admission, just before the API server stamped the pod.
            let issued: i64 = mark.unwrap().split('.').nth(1).unwrap().parse().unwrap();
            assert!((created.as_second() - issued).abs() <= MARK_LATE.as_secs());
        }

        // Anyone else's pod, though it claims the Job and carries a genuine
        // mark and the `managed` label, is admitted without a mark.
        let tenant = format!("tenant-{ns}");
        let mut impersonated = kube::Config::infer().await.unwrap();
        impersonated.auth_info.impersonate = Some(tenant.clone());
        impersonated.auth_info.impersonate_groups = Some(vec!["system:masters".into()]);
        let as_tenant = Client::try_from(impersonated).unwrap();
        let mut copy: Pod = serde_json::from_value(json!({
            "metadata": {"name": "copied", "labels": {"job-name": "train", "memprof.dev/managed": "true"},
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "train",
                                              "uid": job_uid, "controller": true}]},
            "spec": {"containers": [{"name": "trainer", "image": "busybox"}]},
        }))
        .unwrap();
        let genuine = marked[0].metadata.annotations.clone();
        copy.metadata.annotations = genuine;
        let admitted = Api::<Pod>::namespaced(as_tenant, &ns)
            .create(&PostParams::default(), &copy)
            .await
            .unwrap();
        let kept = admitted.metadata.annotations.unwrap_or_default();
        assert!(!kept.contains_key(ANNOTATION_ADMISSION), "{kept:?}");

        // The same tenant, able to reach the webhook's port, sends it a
        // review of its own claiming the Job controller: no mark comes back
        // to plant (the API server's path is not one it knows).
        let forged = forged_review(&ns, &job_uid, LOCAL_JOB_CONTROLLER);
        let answer = post_review(&server.plain_url, &server.ca_pem, &forged).await;
        assert!(!answer.contains(ANNOTATION_ADMISSION), "{answer}");
        server.stop().await;
    })
    .await;
}

#[tokio::test]
async fn admission_key_secret_is_created_once_shared_and_rotated_on_request() {
    use memprof::api::admission::ANNOTATION_ROTATE;
    use memprof::webhook::keys::{ensure_keys, KeyConfig};
    with_temp_ns(|client, ns| async move {
        let cfg = KeyConfig {
            namespace: ns.clone(),
            secret_name: "memprof-admission-key".into(),
            grace: jiff::SignedDuration::from_hours(1),
        };
        // Two replicas starting together end up with the same key.
        let (a, b) = tokio::join!(ensure_keys(&client, &cfg), ensure_keys(&client, &cfg));
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!(a, b);
        assert_eq!(ensure_keys(&client, &cfg).await.unwrap(), a);
        // An administrator asks for a new key: the old one stays valid for the grace.
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
        let ask = json!({"metadata": {"annotations": {ANNOTATION_ROTATE: "now"}}});
        secrets
            .patch(
                &cfg.secret_name,
                &Default::default(),
                &kube::api::Patch::Merge(&ask),
            )
            .await
            .unwrap();
        let rotated = ensure_keys(&client, &cfg).await.unwrap();
        assert_ne!(rotated.current(), a.current());
        assert_eq!(rotated.previous().map(|p| &p.0), a.current());
        assert_eq!(
            ensure_keys(&client, &cfg).await.unwrap(),
            rotated,
            "once per request"
        );
    })
    .await;
}

#[test]
fn the_operator_refuses_to_serve_the_webhook_without_a_sidecar_image() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_memprof-operator"))
        .args(["--metrics-addr", "127.0.0.1:0"])
        .env_remove("MEMPROF_SIDECAR_IMAGE")
        .env_remove("MEMPROF_WEBHOOK_PORT")
        .output()
        .expect("running memprof-operator");
    assert!(!out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--sidecar-image"), "{stderr}");
}
