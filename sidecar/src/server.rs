//! The sidecar's local HTTP endpoints: `/healthz`, `/metrics`, `/v1/report`
//! (the latest report as JSON) and `POST /v1/agent` (allocator statistics from
//! the in-process agent). The agent endpoint only takes loopback peers: it
//! feeds the analysis, and nothing outside the pod has business writing there.

use memprof::api::{AllocatorStats, MemoryReportSpec};
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;
use warp::http::StatusCode;
use warp::Filter;

/// Largest agent push accepted, bytes.
pub const MAX_AGENT_BODY: u64 = 64 * 1024;

/// What the endpoints read and write.
#[derive(Clone)]
pub struct Shared {
    /// The metrics registry.
    pub registry: Arc<Mutex<Registry>>,
    /// The latest report.
    pub report: watch::Receiver<Option<MemoryReportSpec>>,
    /// Where agent pushes go; the sampling loop reads the newest without waiting.
    pub agent: watch::Sender<Option<AllocatorStats>>,
    /// Counts agent pushes.
    pub metrics: crate::metrics::Metrics,
}

fn reply(status: StatusCode, body: String) -> warp::reply::Response {
    warp::Reply::into_response(warp::reply::with_status(body, status))
}

/// Handles one agent push: checks the peer, parses the body, hands it over.
pub fn agent_push(shared: &Shared, peer: Option<SocketAddr>, body: &[u8]) -> (StatusCode, String) {
    if !peer.is_some_and(|p| p.ip().is_loopback()) {
        return (
            StatusCode::FORBIDDEN,
            "the agent endpoint only accepts loopback peers\n".into(),
        );
    }
    match serde_json::from_slice::<AllocatorStats>(body) {
        Ok(stats) => {
            shared.metrics.agent_pushes.inc();
            shared.agent.send_replace(Some(stats));
            (StatusCode::NO_CONTENT, String::new())
        }
        Err(e) => (
            StatusCode::BAD_REQUEST,
            format!("invalid agent payload: {e}\n"),
        ),
    }
}

/// Serves the endpoints on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    shared: Shared,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let healthz = warp::path!("healthz")
        .and(warp::get())
        .map(|| reply(StatusCode::OK, "ok\n".into()));
    let s = shared.clone();
    let metrics = warp::path!("metrics").and(warp::get()).map(move || {
        let body = crate::metrics::render(&s.registry.lock().expect("metrics registry poisoned"));
        let mut resp = reply(StatusCode::OK, body);
        resp.headers_mut().insert(
            "content-type",
            warp::http::HeaderValue::from_static(
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            ),
        );
        resp
    });
    let s = shared.clone();
    let report =
        warp::path!("v1" / "report")
            .and(warp::get())
            .map(move || match &*s.report.borrow() {
                Some(r) => reply(
                    StatusCode::OK,
                    serde_json::to_string_pretty(r).unwrap_or_default(),
                ),
                None => reply(StatusCode::SERVICE_UNAVAILABLE, "no report yet\n".into()),
            });
    let s = shared.clone();
    let agent = warp::path!("v1" / "agent")
        .and(warp::post())
        .and(warp::addr::remote())
        .and(warp::body::content_length_limit(MAX_AGENT_BODY))
        .and(warp::body::bytes())
        .map(
            move |peer: Option<SocketAddr>, body: warp::hyper::body::Bytes| {
                let (status, msg) = agent_push(&s, peer, &body);
                reply(status, msg)
            },
        );
    let routes = healthz
        .or(metrics)
        .unify()
        .or(report)
        .unify()
        .or(agent)
        .unify()
        .recover(|rej: warp::Rejection| async move {
            let (status, msg) = if rej.find::<warp::reject::PayloadTooLarge>().is_some() {
                (
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("agent payload over {MAX_AGENT_BODY} bytes\n"),
                )
            } else if rej.find::<warp::reject::LengthRequired>().is_some() {
                (
                    StatusCode::LENGTH_REQUIRED,
                    "agent payload needs a Content-Length\n".to_string(),
                )
            } else if rej.is_not_found() {
                (
                    StatusCode::NOT_FOUND,
                    "not found: try /healthz, /metrics, /v1/report, POST /v1/agent\n".to_string(),
                )
            } else {
                (StatusCode::METHOD_NOT_ALLOWED, format!("{rej:?}\n"))
            };
            Ok::<_, std::convert::Infallible>(reply(status, msg))
        });
    warp::serve(routes)
        .incoming(listener)
        .graceful(shutdown)
        .run()
        .await;
}
