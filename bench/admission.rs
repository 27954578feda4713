//! Admission latency: the pure mutate path and the HTTPS round trip.
//!
//!     cargo bench -p memprof --bench admission
//!
//! Prints p50/p99/max. The API server waits for every mutating webhook in
//! series on each Job and Pod create it sends, so the p99 matters more than
//! the mean. Loopback only; bounded request counts.

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use memprof::webhook::{admit_review, certs, serve, InjectionConfig, TlsCert};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn review() -> Vec<u8> {
    let containers: Vec<_> = (0..2)
        .map(|i| {
            serde_json::json!({
                "name": format!("trainer-{i}"), "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                "command": ["torchrun", "--nproc-per-node=8", "train.py"],
                "env": (0..20).map(|e| serde_json::json!({"name": format!("VAR_{e}"), "value": "x".repeat(40)})).collect::<Vec<_>>(),
                "resources": { "limits": { "nvidia.com/gpu": "8" } },
                "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent",
                "volumeMounts": [{ "name": "data", "mountPath": "/data" }]
            })
        })
        .collect();
    serde_json::to_vec(&serde_json::json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "0c9a8d74-9cb7-44dd-b98e-09fd62def2f4",
            "kind": { "group": "batch", "version": "v1", "kind": "Job" },
            "resource": { "group": "batch", "version": "v1", "resource": "jobs" },
            "name": "train", "namespace": "ml", "operation": "CREATE",
            "userInfo": { "username": "someone", "groups": ["system:authenticated"] },
            "object": {
                "apiVersion": "batch/v1", "kind": "Job",
                "metadata": { "name": "train", "namespace": "ml",
                              "annotations": { "memprof.dev/enabled": "true", "memprof.dev/interval": "500ms" },
                              "labels": { "team": "ml" } },
                "spec": {
                    "parallelism": 16, "completions": 16, "completionMode": "Indexed", "backoffLimit": 0,
                    "template": {
                        "metadata": { "labels": { "team": "ml" } },
                        "spec": { "restartPolicy": "Never", "containers": containers,
                                  "volumes": [{ "name": "data", "persistentVolumeClaim": { "claimName": "data" } }] }
                    }
                }
            }
        }
    }))
    .unwrap()
}

fn report(what: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let pct = |p: f64| samples[((samples.len() as f64 * p) as usize).min(samples.len() - 1)];
    println!(
        "{what:<40} n={:<6} p50={:>9.1?} p99={:>9.1?} max={:>9.1?}",
        samples.len(),
        pct(0.50),
        pct(0.99),
        samples[samples.len() - 1]
    );
}

async fn connect(
    addr: std::net::SocketAddr,
    tls: Arc<rustls::ClientConfig>,
) -> hyper::client::conn::http1::SendRequest<Full<Bytes>> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
        .unwrap();
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    send
}

async fn post(send: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>, body: &Bytes) {
    let req = hyper::Request::post("/mutate")
        .header("host", "127.0.0.1")
        .header("content-type", "application/json")
        .body(Full::new(body.clone()))
        .unwrap();
    // HTTP/1.1 keep-alive: wait until the previous exchange has finished.
    send.ready().await.unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let out = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(out.len() > 100);
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let body = review();
    let config = InjectionConfig::default();
    println!(
        "AdmissionReview: {} bytes (Job, 2 containers x 20 env)",
        body.len()
    );
    report("mutate (parse+patch+encode)", pure_path(&body, &config));

    // HTTPS round trips on loopback.
    let names = vec!["127.0.0.1".to_string()];
    let bundle = certs::generate(
        &names,
        jiff::Timestamp::now(),
        jiff::SignedDuration::from_hours(1),
    )
    .unwrap();
    let tls = TlsCert::from_pem(bundle.cert_pem.as_bytes(), bundle.key_pem.as_bytes()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(listener, tls, Arc::new(config), async {
        let _ = stopped.await;
    }));
    let client = client_config(&bundle.ca_pem);
    let body = Bytes::from(body);
    let (kept, fresh) = round_trips(addr, client, &body).await;
    report("HTTPS round trip (kept-alive)", kept);
    report("HTTPS round trip (new TLS connection)", fresh);

    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}

/// The pure path: parse, decide, build the patch, encode the response
/// (after a warm-up).
fn pure_path(body: &[u8], config: &InjectionConfig) -> Vec<Duration> {
    for _ in 0..1_000 {
        std::hint::black_box(
            serde_json::to_vec(&admit_review(
                body,
                config,
                memprof::webhook::Caller::ApiServer,
            ))
            .unwrap(),
        );
    }
    (0..20_000)
        .map(|_| {
            let t = Instant::now();
            let review = admit_review(
                std::hint::black_box(body),
                config,
                memprof::webhook::Caller::ApiServer,
            );
            std::hint::black_box(serde_json::to_vec(&review).unwrap());
            t.elapsed()
        })
        .collect()
}

/// A TLS client that trusts only `ca_pem`.
fn client_config(ca_pem: &str) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
        .unwrap();
    Arc::new(
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth(),
    )
}

/// Round trips on one kept-alive connection (what the API server's webhook
/// client does, after a warm-up), then on a new connection each time (TLS
/// handshake included: the worst case).
async fn round_trips(
    addr: std::net::SocketAddr,
    client: Arc<rustls::ClientConfig>,
    body: &Bytes,
) -> (Vec<Duration>, Vec<Duration>) {
    let mut send = connect(addr, client.clone()).await;
    for _ in 0..200 {
        post(&mut send, body).await;
    }
    let mut kept = Vec::with_capacity(5_000);
    for _ in 0..5_000 {
        let t = Instant::now();
        post(&mut send, body).await;
        kept.push(t.elapsed());
    }
    let mut fresh = Vec::with_capacity(500);
    for _ in 0..500 {
        let t = Instant::now();
        let mut send = connect(addr, client.clone()).await;
        post(&mut send, body).await;
        fresh.push(t.elapsed());
    }
    (kept, fresh)
}
