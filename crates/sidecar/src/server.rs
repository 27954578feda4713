//! The sidecar's local HTTP endpoints, on two listeners:
//!
//! - the agent socket (a Unix socket, [`crate::socket`]): `POST /v1/agent`
//!   (pushes of the in-process agent, format in docs/agent-wire.md and
//!   `memprof_api::agent`, answered with the sidecar's verdict, contract B),
//!   `GET /v1/report` (the latest report as JSON) and `/healthz`;
//! - TCP: `/healthz` and `/metrics` only, on loopback unless Prometheus
//!   scrapes the pod (`--port`).
//!
//! Pushes feed the analysis and answers steer the trainer; the report names
//! the pod's GPUs. Only the pod's own processes can reach the socket; a TCP
//! peer, whatever its address (a mesh relay's connection comes from
//! loopback), never reaches either.

use http_body_util::BodyExt;
use hyper::{Method, StatusCode};
use memprof_api::agent::{Push, PushReply};
use memprof_api::MemoryReportSpec;
use memprof_runtime::http::{self, Request, Response};
use prometheus_client::registry::Registry;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

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
    /// The answer to a push, as of the last analysis (contract B).
    pub answer: watch::Receiver<PushReply>,
    /// Counts agent pushes.
    pub metrics: crate::metrics::Metrics,
}

/// Handles one agent push: parses the body, hands it over, answers with the
/// current verdict. Only ever called for a connection on the agent socket.
pub fn agent_push(shared: &Shared, body: &[u8]) -> Response {
    match memprof_api::agent::parse(body) {
        Ok(push) => {
            shared.metrics.agent_pushes.inc();
            shared.agent.put(push);
            let answer = shared.answer.borrow().clone();
            http::typed(
                StatusCode::OK,
                http::JSON,
                serde_json::to_string(&answer).unwrap_or_default(),
            )
        }
        Err(e) => http::text(
            StatusCode::BAD_REQUEST,
            format!("invalid agent payload: {e}\n"),
        ),
    }
}

fn healthz() -> Response {
    http::text(StatusCode::OK, "ok\n")
}

fn metrics(shared: &Shared) -> Response {
    let body = crate::metrics::render(&shared.registry.lock().expect("metrics registry poisoned"));
    http::typed(StatusCode::OK, http::OPENMETRICS, body)
}

fn report(shared: &Shared) -> Response {
    match &*shared.report.borrow() {
        Some(r) => http::typed(
            StatusCode::OK,
            http::JSON,
            serde_json::to_string_pretty(r).unwrap_or_default(),
        ),
        None => http::text(StatusCode::SERVICE_UNAVAILABLE, "no report yet\n"),
    }
}

/// `POST /v1/agent`: refused on its Content-Length before a byte of the
/// body is read, so a push over the limit costs the sidecar nothing.
async fn agent(shared: &Shared, req: Request) -> Response {
    let length = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let Some(length) = length else {
        return http::text(
            StatusCode::LENGTH_REQUIRED,
            "agent payload needs a Content-Length\n",
        );
    };
    if length > MAX_AGENT_BODY {
        return http::text(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("agent payload over {MAX_AGENT_BODY} bytes\n"),
        );
    }
    match req.into_body().collect().await {
        Ok(body) => agent_push(shared, &body.to_bytes()),
        Err(e) => http::text(
            StatusCode::BAD_REQUEST,
            format!("cannot read the agent payload: {e}\n"),
        ),
    }
}

/// What no route took: 404 saying where things are, or 405 for a path
/// served here under another method.
fn unrouted(req: &Request, paths: &[&str], here: &str) -> Response {
    if paths.contains(&req.uri().path()) {
        let msg = format!("method {} not allowed: {here}\n", req.method());
        http::text(StatusCode::METHOD_NOT_ALLOWED, msg)
    } else {
        http::text(StatusCode::NOT_FOUND, format!("not found: {here}\n"))
    }
}

const TCP_HERE: &str = "this port serves /healthz and /metrics; POST /v1/agent and GET \
    /v1/report are served only on the sidecar's Unix socket (MEMPROF_AGENT_SOCKET, \
    docs/agent-wire.md)";
const SOCKET_HERE: &str = "this socket serves POST /v1/agent, GET /v1/report and /healthz";

/// `/healthz` and `/metrics`: what TCP serves, whoever the peer is.
async fn tcp_routes(shared: Shared, req: Request) -> Response {
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/healthz") => healthz(),
        (&Method::GET, "/metrics") => metrics(&shared),
        _ => unrouted(&req, &["/healthz", "/metrics"], TCP_HERE),
    }
}

/// `POST /v1/agent`, `GET /v1/report`, `/healthz`: what the agent socket serves.
async fn socket_routes(shared: Shared, req: Request) -> Response {
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/healthz") => healthz(),
        (&Method::GET, "/v1/report") => report(&shared),
        (&Method::POST, "/v1/agent") => agent(&shared, req).await,
        _ => unrouted(&req, &["/healthz", "/v1/report", "/v1/agent"], SOCKET_HERE),
    }
}

/// Serves `/healthz` and `/metrics` on `listener` until `shutdown` resolves.
pub async fn serve_tcp(
    listener: tokio::net::TcpListener,
    shared: Shared,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let handle = move |req| tcp_routes(shared.clone(), req);
    http::serve(listener, handle, shutdown).await;
}

/// Serves the agent's endpoints on the agent socket until `shutdown` resolves.
pub async fn serve_socket(
    listener: tokio::net::UnixListener,
    shared: Shared,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let handle = move |req| socket_routes(shared.clone(), req);
    http::serve(listener, handle, shutdown).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_api::agent::Verdict;
    use memprof_api::{DataSource, RiskLevel};
    use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

    struct Fixture {
        shared: Shared,
        inbox: AgentInbox,
        report_tx: watch::Sender<Option<MemoryReportSpec>>,
        answer_tx: watch::Sender<PushReply>,
    }

    fn fixture() -> Fixture {
        let mut registry = Registry::default();
        let metrics = crate::metrics::Metrics::new(&mut registry);
        let (report_tx, report) = watch::channel(None);
        let (answer_tx, answer) = watch::channel(PushReply {
            accepted: true,
            ..Default::default()
        });
        let inbox = AgentInbox::default();
        let shared = Shared {
            registry: Arc::new(Mutex::new(registry)),
            report,
            agent: inbox.clone(),
            answer,
            metrics,
        };
        Fixture {
            shared,
            inbox,
            report_tx,
            answer_tx,
        }
    }

    fn stopper() -> (watch::Sender<bool>, impl std::future::Future<Output = ()>) {
        let (stop, mut stopped) = watch::channel(false);
        (stop, async move {
            let _ = stopped.wait_for(|s| *s).await;
        })
    }

    /// One HTTP/1.1 request on `s`; the status and the whole response.
    async fn request<S: AsyncRead + AsyncWrite + Unpin>(
        mut s: S,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> (u16, String) {
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
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

    fn body_of(response: &str) -> &str {
        response.split_once("\r\n\r\n").map_or("", |(_, b)| b)
    }

    const PUSH: &[u8] = br#"{"version": 1, "time": 1795000000.5, "step": 7, "phase": "forward",
        "devices": [{"index": 0, "allocatedBytes": 30, "reservedBytes": 40, "numOoms": 1}],
        "acks": [{"id": "job/critical-1", "action": "split 16x1 -> 8x2", "ok": true}]}"#;

    #[tokio::test]
    async fn pushes_on_the_socket_reach_the_loop_and_are_answered_with_the_verdict() {
        let f = fixture();
        let dir = std::env::temp_dir().join(format!("memprof-srv-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (listener, file) = crate::socket::bind(&dir.join("agent.sock")).unwrap();
        let path = file.path().to_path_buf();
        let (stop, stopped) = stopper();
        tokio::spawn(serve_socket(listener, f.shared.clone(), stopped));
        let conn = || async { tokio::net::UnixStream::connect(&path).await.unwrap() };

        // Before the first analysis: accepted, no verdict yet.
        let (code, out) = request(conn().await, "POST", "/v1/agent", PUSH).await;
        assert_eq!(code, 200, "{out}");
        let answer: serde_json::Value = serde_json::from_str(body_of(&out)).unwrap();
        assert_eq!(answer["accepted"], true);
        assert_eq!(answer["verdict"], serde_json::Value::Null);

        f.answer_tx.send_replace(PushReply {
            accepted: true,
            verdict: Some(Verdict {
                risk: RiskLevel::High,
                tto_seconds: Some(140.5),
                leak: true,
                source: DataSource::Agent,
                at: 1_795_000_001.0,
            }),
            directives: vec![],
            history: true,
        });
        let (code, out) = request(conn().await, "POST", "/v1/agent", PUSH).await;
        assert_eq!(code, 200, "{out}");
        assert!(out.contains("content-type: application/json"), "{out}");
        let answer: serde_json::Value = serde_json::from_str(body_of(&out)).unwrap();
        assert_eq!(answer["verdict"]["risk"], "high");
        assert_eq!(answer["verdict"]["ttoSeconds"], 140.5);
        assert_eq!(answer["history"], true);
        assert_eq!(answer["directives"], serde_json::json!([]));

        let got = f.inbox.drain();
        assert_eq!(got.len(), 2, "every push is kept, not only the newest");
        let d = &got[0].devices[0];
        assert_eq!(
            (d.allocated_bytes, d.reserved_bytes, d.num_ooms, got[0].step),
            (30, 40, 1, Some(7))
        );
        assert_eq!(got[0].acks[0].id, "job/critical-1");

        let (code, body) = request(conn().await, "POST", "/v1/agent", b"{not json").await;
        assert_eq!(code, 400);
        assert!(body.contains("invalid agent payload"), "{body}");
        let inconsistent = br#"{"version": 1, "time": 1795000000.5,
            "devices": [{"index": 0, "allocatedBytes": 50, "reservedBytes": 40}]}"#;
        let (code, body) = request(conn().await, "POST", "/v1/agent", inconsistent).await;
        assert_eq!(code, 400, "{body}");
        assert!(
            body.contains("device 0: allocatedBytes exceeds reservedBytes"),
            "{body}"
        );
        // Refused on its Content-Length, before a byte of the body is read
        // (a sender that wrote it all would find the socket closed).
        let mut s = conn().await;
        let head = format!(
            "POST /v1/agent HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n\r\n",
            MAX_AGENT_BODY + 1
        );
        s.write_all(head.as_bytes()).await.unwrap();
        let mut out = vec![0; 512];
        let n = s.read(&mut out).await.unwrap();
        let out = String::from_utf8_lossy(&out[..n]);
        assert!(out.starts_with("HTTP/1.1 413"), "{out}");
        assert!(f.inbox.drain().is_empty(), "refused pushes change nothing");

        let (code, _) = request(conn().await, "GET", "/v1/report", b"").await;
        assert_eq!(code, 503, "no report yet");
        f.report_tx.send_replace(Some(MemoryReportSpec {
            pod_name: "train-0".into(),
            ..Default::default()
        }));
        let (code, out) = request(conn().await, "GET", "/v1/report", b"").await;
        assert_eq!(code, 200);
        assert!(body_of(&out).contains("\"podName\": \"train-0\""), "{out}");
        assert_eq!(request(conn().await, "GET", "/healthz", b"").await.0, 200);
        assert_eq!(request(conn().await, "GET", "/metrics", b"").await.0, 404);
        let _ = stop.send(true);
        drop(file);
        let _ = std::fs::remove_dir(&dir);
    }

    /// A mesh relay (Istio hands inbound traffic to the app
    /// from 127.0.0.6, Linkerd and `kubectl port-forward` from 127.0.0.1)
    /// makes an outside connection look local. A TCP peer on loopback can
    /// neither push nor read the report: those are only on the socket.
    #[tokio::test]
    async fn a_push_relayed_from_loopback_is_refused() {
        let f = fixture();
        f.report_tx.send_replace(Some(MemoryReportSpec {
            pod_name: "victim-0".into(),
            ..Default::default()
        }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = stopper();
        tokio::spawn(serve_tcp(listener, f.shared.clone(), stopped));
        let conn = || async { tokio::net::TcpStream::connect(addr).await.unwrap() };

        let (code, out) = request(conn().await, "POST", "/v1/agent", PUSH).await;
        assert_eq!(code, 404, "{out}");
        assert!(out.contains("MEMPROF_AGENT_SOCKET"), "says where: {out}");
        let (code, out) = request(conn().await, "GET", "/v1/report", b"").await;
        assert_eq!(code, 404, "{out}");
        assert!(!out.contains("victim-0"), "{out}");
        assert!(f.inbox.drain().is_empty(), "nothing reached the analysis");

        assert_eq!(request(conn().await, "GET", "/healthz", b"").await.0, 200);
        let (code, metrics) = request(conn().await, "GET", "/metrics", b"").await;
        assert_eq!(code, 200);
        assert!(
            metrics.contains("memprof_sidecar_agent_pushes_total 0"),
            "{metrics}"
        );
        let _ = stop.send(true);
    }

    /// A path served under another method is 405; a push without a
    /// Content-Length (chunked) is 411, before its body is read.
    #[tokio::test]
    async fn the_wrong_method_and_a_push_without_a_length_are_refused() {
        let f = fixture();
        let dir = std::env::temp_dir().join(format!("memprof-srv-m-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (listener, file) = crate::socket::bind(&dir.join("agent.sock")).unwrap();
        let path = file.path().to_path_buf();
        let (stop, stopped) = stopper();
        tokio::spawn(serve_socket(listener, f.shared.clone(), stopped));
        let conn = || async { tokio::net::UnixStream::connect(&path).await.unwrap() };

        let (code, out) = request(conn().await, "GET", "/v1/agent", b"").await;
        assert_eq!(code, 405, "{out}");
        assert_eq!(request(conn().await, "POST", "/healthz", b"").await.0, 405);
        let mut s = conn().await;
        let head = "POST /v1/agent HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\
                    Connection: close\r\n\r\n2\r\n{}\r\n0\r\n\r\n";
        s.write_all(head.as_bytes()).await.unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out).await;
        assert!(out.starts_with("HTTP/1.1 411"), "{out}");
        assert!(f.inbox.drain().is_empty(), "refused pushes change nothing");
        let _ = stop.send(true);
        drop(file);
        let _ = std::fs::remove_dir(&dir);
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
}
