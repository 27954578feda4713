//! The legitimate client beside the attack: the API server's kept-alive
//! HTTP/2 connection sending an AdmissionReview every 50 ms, and a client
//! that connects afresh during the attack.

use crate::target::Target;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The legitimate client's record.
#[derive(Default)]
pub struct Legit {
    pub latencies: Vec<Duration>,
    /// Failures by kind: no connection (refused at the cap), timed out
    /// (the API server's 5 s), other (error status, reset).
    pub refused: u64,
    pub timed_out: u64,
    pub other: u64,
}

/// An HTTP/2 connection for the legitimate client.
async fn h2_client(t: &Target) -> Option<hyper::client::conn::http2::SendRequest<Full<Bytes>>> {
    let tls = t.connect(true).await?;
    let (send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .ok()?;
    tokio::spawn(conn);
    Some(send)
}

/// The API server's part: an HTTP/2 connection opened before the attack and
/// kept alive, a review every 50 ms; reconnects on failure.
pub async fn legitimate(t: Arc<Target>, review: Bytes) -> Legit {
    let mut out = Legit::default();
    let mut send = h2_client(&t).await;
    while t.running() {
        if send.is_none() {
            send = h2_client(&t).await;
        }
        let started = Instant::now();
        let Some(s) = send.as_mut() else {
            out.refused += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let req = hyper::Request::post("https://127.0.0.1/mutate")
            .body(Full::new(review.clone()))
            .unwrap();
        // The API server's own webhook timeout (chart: 5 s).
        let exchange = async {
            let resp = s.send_request(req).await.ok()?;
            let ok = resp.status() == 200;
            (resp.into_body().collect().await.is_ok() && ok).then_some(())
        };
        match tokio::time::timeout(Duration::from_secs(5), exchange).await {
            Ok(Some(())) => out.latencies.push(started.elapsed()),
            Err(_) => {
                out.timed_out += 1;
                send = None;
            }
            Ok(None) => {
                out.other += 1;
                send = None;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    out
}

/// What happens to a client that connects during the attack (an API server
/// replica that has just started, or whose idle connection was closed):
/// (attempts, served).
pub async fn fresh_connections(t: Arc<Target>) -> (u64, u64) {
    let (mut tried, mut served) = (0, 0);
    while t.running() {
        tried += 1;
        if let Some(mut send) = h2_client(&t).await {
            let req = hyper::Request::get("https://127.0.0.1/healthz")
                .body(Full::default())
                .unwrap();
            let ok = tokio::time::timeout(Duration::from_secs(5), send.send_request(req)).await;
            served += u64::from(matches!(ok, Ok(Ok(r)) if r.status() == 200));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    (tried, served)
}

pub fn review() -> Bytes {
    let containers: Vec<_> = (0..2)
        .map(|i| {
            serde_json::json!({
                "name": format!("trainer-{i}"), "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                "env": (0..20).map(|e| serde_json::json!({"name": format!("VAR_{e}"), "value": "x".repeat(40)})).collect::<Vec<_>>(),
                "resources": { "limits": { "nvidia.com/gpu": "8" } }
            })
        })
        .collect();
    Bytes::from(
        serde_json::to_vec(&serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "0c9a8d74-9cb7-44dd-b98e-09fd62def2f4",
                "kind": { "group": "batch", "version": "v1", "kind": "Job" },
                "resource": { "group": "batch", "version": "v1", "resource": "jobs" },
                "name": "train", "namespace": "ml", "operation": "CREATE",
                "object": {
                    "apiVersion": "batch/v1", "kind": "Job",
                    "metadata": { "name": "train", "namespace": "ml",
                                  "annotations": { "memprof.dev/enabled": "true" } },
                    "spec": { "parallelism": 16, "template": { "spec": {
                        "restartPolicy": "Never", "containers": containers } } }
                }
            }
        }))
        .unwrap(),
    )
}
