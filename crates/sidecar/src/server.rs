//! The sidecar's local HTTP endpoints: `/healthz`, `/metrics`, `/v1/report`
//! (the latest report as JSON) and `POST /v1/agent` (pushes of the in-process
//! agent, format in docs/agent.md and `memprof_api::agent`). The agent endpoint
//! only takes loopback peers: it feeds the analysis, and nothing outside the
//! pod has business writing there.

use memprof_api::agent::Push;
use memprof_api::MemoryReportSpec;
use prometheus_client::registry::Registry;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;
use warp::http::StatusCode;
use warp::Filter;

/// Largest agent push accepted, bytes.
pub const MAX_AGENT_BODY: u64 = memprof_api::agent::MAX_BODY_BYTES;

/// Agent pushes not yet taken by the sampling loop. A queue, not a latest
/// value: every push is a sample of the agent's series (and an OOM push must
/// not be overwritten by the final one). Bounded: when the loop stalls, the
/// oldest pushes go.
#[derive(Clone, Default)]
pub struct AgentInbox(Arc<Mutex<VecDeque<Push>>>);

/// Pushes kept for the sampling loop (a minute at the agent's default 1 s).
pub const AGENT_INBOX_CAPACITY: usize = 64;

impl AgentInbox {
    /// Queues a push, dropping the oldest when full.
    pub fn put(&self, push: Push) {
        let mut q = self.0.lock().expect("agent inbox poisoned");
        if q.len() >= AGENT_INBOX_CAPACITY {
            q.pop_front();
        }
        q.push_back(push);
    }

    /// Takes every queued push, oldest first.
    pub fn drain(&self) -> Vec<Push> {
        self.0
            .lock()
            .expect("agent inbox poisoned")
            .drain(..)
            .collect()
    }
}

/// What the endpoints read and write.
#[derive(Clone)]
pub struct Shared {
    /// The metrics registry.
    pub registry: Arc<Mutex<Registry>>,
    /// The latest report.
    pub report: watch::Receiver<Option<MemoryReportSpec>>,
    /// Where agent pushes go; the sampling loop drains it without waiting.
    pub agent: AgentInbox,
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
    match memprof_api::agent::parse(body) {
        Ok(push) => {
            shared.metrics.agent_pushes.inc();
            shared.agent.put(push);
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

    /// What the endpoints share, with the agent's inbox and the report's sending end.
    fn shared() -> (Shared, AgentInbox, watch::Sender<Option<MemoryReportSpec>>) {
        let mut registry = Registry::default();
        let metrics = crate::metrics::Metrics::new(&mut registry);
        let (report_tx, report) = watch::channel(None);
        let agent = AgentInbox::default();
        let shared = Shared {
            registry: Arc::new(Mutex::new(registry)),
            report,
            agent: agent.clone(),
            metrics,
        };
        (shared, agent, report_tx)
    }

    async fn start() -> (
        std::net::SocketAddr,
        AgentInbox,
        watch::Sender<bool>,
        watch::Sender<Option<MemoryReportSpec>>,
    ) {
        let (shared, inbox, report_tx) = shared();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, mut stopped) = watch::channel(false);
        tokio::spawn(serve(listener, shared, async move {
            let _ = stopped.wait_for(|s| *s).await;
        }));
        (addr, inbox, stop, report_tx)
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

    const PUSH: &[u8] = br#"{"version": 1, "time": 1795000000.5, "step": 7, "phase": "forward",
        "devices": [{"index": 0, "allocatedBytes": 30, "reservedBytes": 40, "numOoms": 1}]}"#;

    #[tokio::test]
    async fn agent_pushes_reach_the_sampling_loop_and_bad_ones_are_refused_with_the_reason() {
        let (addr, inbox, stop, _report_tx) = start().await;
        assert_eq!(request(addr, "POST", "/v1/agent", PUSH).await.0, 204);
        assert_eq!(request(addr, "POST", "/v1/agent", PUSH).await.0, 204);
        let got = inbox.drain();
        assert_eq!(got.len(), 2, "every push is kept, not only the newest");
        let d = &got[0].devices[0];
        assert_eq!(
            (d.allocated_bytes, d.reserved_bytes, d.num_ooms, got[0].step),
            (30, 40, 1, Some(7))
        );

        let (code, body) = request(addr, "POST", "/v1/agent", b"{not json").await;
        assert_eq!(code, 400);
        assert!(body.contains("invalid agent payload"), "{body}");
        let inconsistent = br#"{"version": 1, "time": 1795000000.5,
            "devices": [{"index": 0, "allocatedBytes": 50, "reservedBytes": 40}]}"#;
        let (code, body) = request(addr, "POST", "/v1/agent", inconsistent).await;
        assert_eq!(code, 400, "{body}");
        assert!(
            body.contains("device 0: allocatedBytes exceeds reservedBytes"),
            "{body}"
        );
        let (code, body) =
            request(addr, "POST", "/v1/agent", b"{\"version\": 9, \"time\": 1}").await;
        assert_eq!(code, 400, "{body}");
        assert!(body.contains("speaks version 1"), "{body}");

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
            metrics.contains("memprof_sidecar_agent_pushes_total 2"),
            "{metrics}"
        );
        assert!(inbox.drain().is_empty(), "refused pushes change nothing");
        let _ = stop.send(true);
    }

    #[test]
    fn the_inbox_is_bounded_and_keeps_the_newest() {
        let inbox = AgentInbox::default();
        for step in 0..(AGENT_INBOX_CAPACITY as u64 + 10) {
            inbox.put(Push {
                step: Some(step),
                ..Default::default()
            });
        }
        let got = inbox.drain();
        assert_eq!(got.len(), AGENT_INBOX_CAPACITY);
        assert_eq!(got[0].step, Some(10));
    }

    #[test]
    fn only_loopback_peers_may_push() {
        let (shared, inbox, _report_tx) = shared();
        // The unspecified address stands for any peer that is not loopback.
        let remote = std::net::SocketAddr::from(([0, 0, 0, 0], 40000));
        assert_eq!(
            agent_push(&shared, Some(remote), PUSH).0,
            StatusCode::FORBIDDEN
        );
        assert_eq!(agent_push(&shared, None, PUSH).0, StatusCode::FORBIDDEN);
        assert!(inbox.drain().is_empty());
        let local = std::net::SocketAddr::from(([127, 0, 0, 1], 40000));
        assert_eq!(
            agent_push(&shared, Some(local), PUSH).0,
            StatusCode::NO_CONTENT
        );
    }
}
