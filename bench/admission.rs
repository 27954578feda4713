//! Admission latency: the pure mutate path and the HTTPS round trip, and
//! what the admission warning (a Job predicted not to fit its GPU) adds.
//!
//!     cargo bench -p memprof --bench admission
//!     eval "$(bash hack/local-cluster.sh env)"; export KUBECONFIG
//!     cargo bench -p memprof --bench admission   # with the history rows
//!
//! Prints p50/p99/max. The API server waits for every mutating webhook in
//! series on each Job and Pod create it sends, so the p99 matters more than
//! the mean. Loopback only; bounded request counts.
//!
//! The warning's rows (`warning.rs`'s part, below `main`) interleave their
//! servers request by request, so drift on a shared machine hits each
//! alike. The measured-history rows need an API server to LIST (with
//! `KUBECONFIG` set: the local control plane); without one they are
//! skipped, saying so.

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use memprof::webhook::{admit_review, certs, serve, InjectionConfig, TlsCert};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn review() -> Vec<u8> {
    review_of("ml", json!({}), None)
}

/// A Job's AdmissionReview in namespace `ns`, with `annotations` besides
/// the opt-in, and `BATCH_SIZE` first in each container's env when `batch`.
fn review_of(ns: &str, annotations: Value, batch: Option<u32>) -> Vec<u8> {
    let mut env: Vec<Value> = (0..20)
        .map(|e| json!({"name": format!("VAR_{e}"), "value": "x".repeat(40)}))
        .collect();
    if let Some(b) = batch {
        env.insert(0, json!({"name": "BATCH_SIZE", "value": b.to_string()}));
    }
    let mut meta_annotations =
        json!({ "memprof.dev/enabled": "true", "memprof.dev/interval": "500ms" });
    for (k, v) in annotations.as_object().into_iter().flatten() {
        meta_annotations[k] = v.clone();
    }
    let containers: Vec<_> = (0..2)
        .map(|i| {
            serde_json::json!({
                "name": format!("trainer-{i}"), "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                "command": ["torchrun", "--nproc-per-node=8", "train.py"],
                "env": env,
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
            "name": "train", "namespace": ns, "operation": "CREATE",
            "userInfo": { "username": "someone", "groups": ["system:authenticated"] },
            "object": {
                "apiVersion": "batch/v1", "kind": "Job",
                "metadata": { "name": "train", "namespace": ns,
                              "annotations": meta_annotations,
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
    warning::run(&bundle).await;
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

/// What the admission warning adds, per Job create: one Job of a family
/// (batch 64, an 80 GiB GPU) answered by a server that reads no history,
/// by one that predicts it from an estimate annotation (no API call), by
/// one that reads the family's measured history from a kept answer, and
/// by one that must LIST for every request (a new family each time: the
/// cache's worst case, bounded by its 1 s timeout).
mod warning {
    use super::*;
    use k8s_openapi::api::core::v1::Namespace;
    use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
    use kube::Client;
    use memprof::api::{BatchFitModel, BatchRecommendation, MemoryProfile, MemoryProfileStatus};
    use memprof::webhook::certs::CertBundle;
    use memprof::webhook::history::History;
    use memprof::webhook::server::serve_with_history;

    const GIB: u64 = 1 << 30;
    const FAMILY: &str = "bench-llama";
    /// Requests per interleaved row, and LISTs in the cold row.
    const ROUNDS: usize = 3_000;
    const COLD: usize = 300;

    /// The bench's namespace, deleted when dropped, a panic included (from
    /// a thread of its own: the bench's runtime may be unwinding).
    struct Scratch(String);

    impl Drop for Scratch {
        fn drop(&mut self) {
            let name = self.0.clone();
            let deleted = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async {
                    let client = Client::try_default().await.ok()?;
                    let api: Api<Namespace> = Api::all(client);
                    api.delete(&name, &DeleteParams::default()).await.ok()
                })
            });
            let _ = deleted.join();
        }
    }

    /// One server on loopback and a kept-alive connection to it.
    struct Served {
        send: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
        stop: tokio::sync::oneshot::Sender<()>,
    }

    async fn start(bundle: &CertBundle, history: Option<Arc<History>>) -> Served {
        let tls = TlsCert::from_pem(bundle.cert_pem.as_bytes(), bundle.key_pem.as_bytes());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let config = Arc::new(InjectionConfig::default());
        let stopped = async {
            let _ = stopped.await;
        };
        let (tls, stopped) = (tls.unwrap(), Box::pin(stopped));
        match history {
            Some(h) => tokio::spawn(serve_with_history(listener, tls, config, h, stopped)),
            None => tokio::spawn(serve(listener, tls, config, stopped)),
        };
        let send = connect(addr, client_config(&bundle.ca_pem)).await;
        Served { send, stop }
    }

    /// The answer's body to `body`, which must carry a warning saying `says`.
    async fn warned(s: &mut Served, body: &Bytes, says: &str) {
        let req = hyper::Request::post("/mutate")
            .header("host", "127.0.0.1")
            .header("content-type", "application/json")
            .body(Full::new(body.clone()))
            .unwrap();
        s.send.ready().await.unwrap();
        let resp = s.send.send_request(req).await.unwrap();
        let out = resp.into_body().collect().await.unwrap().to_bytes();
        let text = String::from_utf8_lossy(&out);
        assert!(text.contains(says), "no warning saying {says:?}: {text}");
    }

    pub async fn run(bundle: &CertBundle) {
        println!("\nThe admission warning, per Job create (kept-alive HTTPS, interleaved):");
        let estimate = json!({"memprof.dev/predicted-peak": "90GiB",
                              "memprof.dev/gpu-memory": "80GiB"});
        let mut plain = start(bundle, None).await;
        let mut annotated = start(bundle, None).await;
        let client = match Client::try_default().await {
            Ok(c) if c.apiserver_version().await.is_ok() => Some(c),
            _ => None,
        };
        let Some(client) = client else {
            let body = Bytes::from(review_of("ml", estimate, Some(64)));
            let (a, b) = interleave2(&mut plain, &mut annotated, &body).await;
            report("no warning (a Job naming no prediction)", a);
            report("estimate annotation (no API call)", b);
            println!("measured-history rows skipped: no API server (set KUBECONFIG)");
            return;
        };
        let scratch = Scratch(format!("memprof-bench-admission-{}", std::process::id()));
        let mut ns = Namespace::default();
        ns.metadata.name = Some(scratch.0.clone());
        let namespaces: Api<Namespace> = Api::all(client.clone());
        namespaces
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
        let ns = ns.metadata.name.unwrap();
        measured(&client, &ns, bundle, (&mut plain, &mut annotated)).await;
        drop(scratch);
        for s in [plain, annotated] {
            let _ = s.stop.send(());
        }
    }

    /// The rows with a history to consult, in namespace `ns` (created by
    /// the caller, deleted after).
    async fn measured(
        client: &Client,
        ns: &str,
        bundle: &CertBundle,
        (plain, annotated): (&mut Served, &mut Served),
    ) {
        earlier_run(client, ns).await;
        let history = Arc::new(History::new(client.clone()));
        let mut read = start(bundle, Some(history.clone())).await;
        let family = json!({"memprof.dev/family": FAMILY, "memprof.dev/gpu-memory": "80GiB"});
        let estimate = json!({"memprof.dev/predicted-peak": "90GiB",
                              "memprof.dev/gpu-memory": "80GiB"});
        let of_family = Bytes::from(review_of(ns, family, Some(64)));
        let by_estimate = Bytes::from(review_of(ns, estimate, Some(64)));
        warned(annotated, &by_estimate, "predicted peak").await;
        warned(&mut read, &of_family, FAMILY).await;
        let servers = [plain, annotated, &mut read];
        let bodies = [&of_family, &by_estimate, &of_family];
        let rows = interleave(servers, bodies).await;
        let names = [
            "no history read (server without one)",
            "estimate annotation (no API call)",
            "measured history, kept answer",
        ];
        for (name, row) in names.into_iter().zip(rows) {
            report(name, row);
        }
        report(
            "measured history, LIST each time",
            cold(&mut read, ns).await,
        );
        let _ = read.stop.send(());
    }

    /// `ROUNDS` requests to each server in turn, after a warm-up of 200.
    async fn interleave(mut servers: [&mut Served; 3], bodies: [&Bytes; 3]) -> Vec<Vec<Duration>> {
        let mut rows: Vec<Vec<Duration>> = (0..3).map(|_| Vec::with_capacity(ROUNDS)).collect();
        for round in 0..ROUNDS + 200 {
            for (i, s) in servers.iter_mut().enumerate() {
                let t = Instant::now();
                post(&mut s.send, bodies[i]).await;
                if round >= 200 {
                    rows[i].push(t.elapsed());
                }
            }
        }
        rows
    }

    async fn interleave2(
        a: &mut Served,
        b: &mut Served,
        body: &Bytes,
    ) -> (Vec<Duration>, Vec<Duration>) {
        let plain = Bytes::from(review());
        let (mut x, mut y) = (Vec::new(), Vec::new());
        for round in 0..ROUNDS + 200 {
            let t = Instant::now();
            post(&mut a.send, &plain).await;
            let d = t.elapsed();
            let t = Instant::now();
            post(&mut b.send, body).await;
            if round >= 200 {
                x.push(d);
                y.push(t.elapsed());
            }
        }
        (x, y)
    }

    /// `COLD` requests, each naming a family never asked before: one LIST
    /// of MemoryProfiles per request (the policies' LIST is made only for
    /// a Job predicted over its GPU, and these have no history).
    async fn cold(read: &mut Served, ns: &str) -> Vec<Duration> {
        let mut out = Vec::with_capacity(COLD);
        for i in 0..COLD {
            let family = json!({"memprof.dev/family": format!("cold-{i}"),
                                "memprof.dev/gpu-memory": "80GiB"});
            let body = Bytes::from(review_of(ns, family, Some(64)));
            let t = Instant::now();
            post(&mut read.send, &body).await;
            out.push(t.elapsed());
        }
        out
    }

    /// A MemoryProfile of an earlier Job of [`FAMILY`], as the operator's
    /// roll-up leaves it: `20 GiB + 1 GiB × batch` fitted on batches 8..32,
    /// so batch 64 is predicted at 84 GiB, over the 80 GiB GPU.
    async fn earlier_run(client: &Client, ns: &str) {
        let api: Api<MemoryProfile> = Api::namespaced(client.clone(), ns);
        let mut p = MemoryProfile::new("earlier", Default::default());
        p.spec.job_name = "earlier".into();
        p.metadata.labels = Some([("memprof.dev/family".to_string(), FAMILY.to_string())].into());
        api.create(&PostParams::default(), &p).await.unwrap();
        let model = BatchFitModel {
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
        };
        let rec = BatchRecommendation {
            env_var: "BATCH_SIZE".into(),
            current: Some(32),
            limit_bytes: Some(80 * GIB),
            method: "agentBreakdown".into(),
            reason: "fitted".into(),
            model: Some(model),
            ..Default::default()
        };
        let status = MemoryProfileStatus {
            batch_recommendation: Some(rec),
            ranks: "1/1".into(),
            peak: "30.0GiB (37%)".into(),
            ..Default::default()
        };
        let patch = json!({ "status": status });
        api.patch_status("earlier", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }
}
