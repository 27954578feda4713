//! `memprof doctor` on the real local control plane, with the failure the
//! issue saw: the operator's image cannot be pulled, so the webhook Service
//! has no endpoint, the webhook fails open and an annotated Job runs
//! uninjected. No kubelet or endpoints controller here: pod status and the
//! Service's Endpoints are written through the API, as they would write them.

use crate::cli_support;
use crate::common;

use cli_support::*;
use common::*;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Endpoints, Namespace, Pod, Secret, Service};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

const LABEL: &str = "memprof.dev/doctor-test";

async fn create<K>(api: &Api<K>, v: serde_json::Value)
where
    K: kube::Resource
        + Clone
        + for<'de> k8s_openapi::serde::Deserialize<'de>
        + k8s_openapi::serde::Serialize
        + std::fmt::Debug,
{
    let obj: K = serde_json::from_value(v).unwrap();
    // A pod of a fresh namespace is refused until its default service
    // account has a token (ServiceAccount admission in 1.20): retry that.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        match api.create(&PostParams::default(), &obj).await {
            Ok(_) => return,
            Err(e) if e.to_string().contains("No API token found") => {
                assert!(std::time::Instant::now() < deadline, "create: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            Err(e) => panic!("create: {e}"),
        }
    }
}

/// Pod status as a kubelet would write it.
async fn pod_status(pods: &Api<Pod>, name: &str, status: serde_json::Value) {
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": status })),
    )
    .await
    .expect("patch pod status");
}

#[tokio::test]
async fn doctor_names_the_image_that_cannot_be_pulled_and_the_jobs_that_ran_unprofiled() {
    let Some(client) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&client).await;
    let n = ns.name.as_str();
    Api::<Namespace>::all(client.clone())
        .patch(
            n,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {LABEL: n}}})),
        )
        .await
        .unwrap();
    // The chart's objects, as a release named after the namespace would have them.
    let svc = "memprof-webhook";
    create(&Api::<Service>::namespaced(client.clone(), n), json!({
        "metadata": {"name": svc},
        "spec": {"selector": {"app": "memprof-op"}, "ports": [{"port": 443, "targetPort": 9443}]}
    })).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), n);
    let image = "ghcr.io/memprof/memprof:0.1.0";
    create(
        &pods,
        json!({
            "metadata": {"name": "memprof-op-1", "labels": {"app": "memprof-op"}},
            "spec": {"containers": [{"name": "operator", "image": image}]}
        }),
    )
    .await;
    pod_status(&pods, "memprof-op-1", json!({
        "phase": "Pending",
        "containerStatuses": [{"name": "operator", "image": image, "imageID": "", "ready": false,
            "restartCount": 0, "state": {"waiting": {"reason": "ImagePullBackOff",
            "message": "Back-off pulling image \"ghcr.io/memprof/memprof:0.1.0\""}}}]
    })).await;
    // The endpoints controller lists a pod that is not ready as not ready.
    let endpoints: Api<Endpoints> = Api::namespaced(client.clone(), n);
    let subset =
        |key: &str| json!({"subsets": [{key: [{"ip": "10.0.0.7"}], "ports": [{"port": 9443}]}]});
    let mut ep = subset("notReadyAddresses");
    ep["metadata"] = json!({"name": svc});
    create(&endpoints, ep).await;
    let names = vec![format!("{svc}.{n}.svc")];
    let bundle = memprof::webhook::certs::generate(
        &names,
        jiff::Timestamp::now(),
        jiff::SignedDuration::from_hours(24),
    )
    .unwrap();
    create(&Api::<Secret>::namespaced(client.clone(), n), json!({
        "metadata": {"name": format!("{svc}-tls")},
        "type": "kubernetes.io/tls",
        "stringData": {"tls.crt": bundle.cert_pem, "tls.key": bundle.key_pem, "ca.crt": bundle.ca_pem}
    })).await;
    use base64::Engine as _;
    let ca = base64::engine::general_purpose::STANDARD.encode(&bundle.ca_pem);
    let mwcs: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    create(&mwcs, json!({
        "metadata": {"name": n},
        "webhooks": [{
            "name": "jobs.memprof.dev",
            "clientConfig": {"service": {"namespace": n, "name": svc, "path": "/mutate"}, "caBundle": ca},
            "rules": [{"apiGroups": ["batch"], "apiVersions": ["v1"], "operations": ["CREATE"],
                       "resources": ["jobs"], "scope": "Namespaced"}],
            "failurePolicy": "Ignore", "sideEffects": "None", "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 2,
            "namespaceSelector": {"matchLabels": {LABEL: n}}
        }]
    })).await;
    // The webhook has no endpoint and fails open: the Job is created as sent.
    create_job_with_batch(&client, n, "missed", 1, "8").await;
    let job = Api::<Job>::namespaced(client.clone(), n)
        .get("missed")
        .await
        .unwrap();
    let containers = &job.spec.unwrap().template.spec.unwrap().containers;
    assert!(
        containers.iter().all(|c| c.name != "memprof-sidecar"),
        "the webhook was not reachable"
    );

    let out = memprof(&["doctor", "-n", n, "--webhook", n], &[]).await;
    let (stdout, stderr) = texts(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    // Shown with --nocapture: the example in docs/cli.md.
    println!("{stdout}");
    for want in [
        "OK    CRD memoryprofiles.memprof.dev is served",
        &format!("OK    webhook jobs.memprof.dev of {n} calls service {n}/{svc}"),
        "WARN  webhook jobs.memprof.dev fails open (failurePolicy Ignore)",
        &format!("FAIL  webhook Service {n}/{svc} has no ready endpoint"),
        &format!("FAIL  operator pod memprof-op-1 cannot pull image {image} (ImagePullBackOff: Back-off pulling image"),
        "--set image.repository=REGISTRY/memprof",
        &format!("OK    serving certificate in {n}/{svc}-tls is valid for {svc}.{n}.svc and signed by the caBundle"),
        &format!("WARN  1 annotated Job(s) were never injected and run unprofiled: {n}/missed"),
    ] {
        assert!(stdout.contains(want), "{want:?} not in:\n{stdout}");
    }

    // The image is pulled, the pod runs and is ready: only the missed Job remains.
    pod_status(&pods, "memprof-op-1", json!({
        "phase": "Running", "podIP": "10.0.0.7", "podIPs": [{"ip": "10.0.0.7"}],
        "conditions": [{"type": "Ready", "status": "True"}],
        "containerStatuses": [{"name": "operator", "image": image, "imageID": "x", "ready": true,
            "restartCount": 0, "state": {"running": {}}}]
    })).await;
    endpoints
        .replace(svc, &PostParams::default(), &{
            let mut ep: Endpoints = serde_json::from_value(subset("addresses")).unwrap();
            ep.metadata = endpoints.get(svc).await.unwrap().metadata;
            ep
        })
        .await
        .unwrap();
    let out = memprof(&["doctor", "-n", n, "--webhook", n], &[]).await;
    let (stdout, _) = texts(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains("OK    operator pod memprof-op-1 is ready"),
        "{stdout}"
    );
    assert!(stdout.contains("ready endpoint(s)"), "{stdout}");
    assert!(stdout.contains("run unprofiled"), "{stdout}");
    // A serving certificate for another name is refused as the API server would.
    let other = memprof::webhook::certs::generate(
        &["elsewhere.svc".to_string()],
        jiff::Timestamp::now(),
        jiff::SignedDuration::from_hours(24),
    )
    .unwrap();
    Api::<Secret>::namespaced(client.clone(), n)
        .patch(
            &format!("{svc}-tls"),
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"tls.crt": other.cert_pem}})),
        )
        .await
        .unwrap();
    let out = memprof(&["doctor", "-n", n, "--webhook", n], &[]).await;
    let (stdout, _) = texts(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("would be refused by the API server"),
        "{stdout}"
    );
    mwcs.delete(n, &DeleteParams::default()).await.unwrap();
}
