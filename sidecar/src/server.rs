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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// What the endpoints share, with the agent's receiving end and the report's sending end.
    fn shared() -> (
        Shared,
        watch::Receiver<Option<AllocatorStats>>,
        watch::Sender<Option<MemoryReportSpec>>,
    ) {
        let mut registry = Registry::default();
        let metrics = crate::metrics::Metrics::new(&mut registry);
        let (report_tx, report) = watch::channel(None);
        let (agent, agent_rx) = watch::channel(None);
        let shared = Shared {
            registry: Arc::new(Mutex::new(registry)),
            report,
            agent,
            metrics,
        };
        (shared, agent_rx, report_tx)
    }

    async fn start() -> (
        std::net::SocketAddr,
        watch::Receiver<Option<AllocatorStats>>,
        watch::Sender<bool>,
        watch::Sender<Option<MemoryReportSpec>>,
    ) {
        let (shared, agent_rx, report_tx) = shared();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, mut stopped) = watch::channel(false);
        tokio::spawn(serve(listener, shared, async move {
            let _ = stopped.wait_for(|s| *s).await;
        }));
        (addr, agent_rx, stop, report_tx)
    }

    async fn request(
        addr: std::net::SocketAddr,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> (u16, String) {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        s.write_all(head.as_bytes()).await.unwrap();
        let _ = s.write_all(body).await;
        let mut out = String::new();
        let _ = s.read_to_string(&mut out).await;
        let code = out
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        (code, out)
    }

    #[tokio::test]
    async fn agent_pushes_reach_the_sampling_loop_and_bad_ones_are_refused_with_the_reason() {
        let (addr, mut agent_rx, stop, _report_tx) = start().await;
        let ok = br#"{"allocatedBytes": 30, "reservedBytes": 40, "numOoms": 1, "step": 7, "phase": "forward"}"#;
        assert_eq!(request(addr, "POST", "/v1/agent", ok).await.0, 204);
        assert!(agent_rx.has_changed().unwrap());
        let got = agent_rx.borrow_and_update().clone().unwrap();
        assert_eq!(
            (
                got.allocated_bytes,
                got.reserved_bytes,
                got.num_ooms,
                got.step
            ),
            (30, 40, 1, Some(7))
        );

        let (code, body) = request(addr, "POST", "/v1/agent", b"{not json").await;
        assert_eq!(code, 400);
        assert!(body.contains("invalid agent payload"), "{body}");
        let (code, body) = request(
            addr,
            "POST",
            "/v1/agent",
            br#"{"allocatedBytes": -5, "reservedBytes": 1}"#,
        )
        .await;
        assert_eq!(code, 400, "{body}");

        let big = vec![b' '; (MAX_AGENT_BODY + 1) as usize];
        assert_eq!(request(addr, "POST", "/v1/agent", &big).await.0, 413);

        assert_eq!(
            request(addr, "GET", "/v1/report", b"").await.0,
            503,
            "no report yet"
        );
        assert_eq!(request(addr, "GET", "/healthz", b"").await.0, 200);
        let (code, metrics) = request(addr, "GET", "/metrics", b"").await;
        assert_eq!(code, 200);
        assert!(
            metrics.contains("memprof_sidecar_agent_pushes_total 1"),
            "{metrics}"
        );
        assert!(
            !agent_rx.has_changed().unwrap(),
            "refused pushes change nothing"
        );
        let _ = stop.send(true);
    }

    #[test]
    fn only_loopback_peers_may_push() {
        let (shared, agent_rx, _report_tx) = shared();
        let body = br#"{"allocatedBytes": 1, "reservedBytes": 2}"#;
        // The unspecified address stands for any peer that is not loopback.
        let remote = std::net::SocketAddr::from(([0, 0, 0, 0], 40000));
        assert_eq!(
            agent_push(&shared, Some(remote), body).0,
            StatusCode::FORBIDDEN
        );
        assert_eq!(agent_push(&shared, None, body).0, StatusCode::FORBIDDEN);
        assert!(!agent_rx.has_changed().unwrap());
        let local = std::net::SocketAddr::from(([127, 0, 0, 1], 40000));
        assert_eq!(
            agent_push(&shared, Some(local), body).0,
            StatusCode::NO_CONTENT
        );
    }
}
