//! A plain-HTTP proxy on loopback in front of the API server that notes
//! the method, path and answer of every request it forwards: an operator
//! given [`Wire::client`] has its writes counted on the wire, not by its
//! own metrics (which count only what it meant to write).

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use kube::client::Body;
use kube::{Client, Config};
use std::sync::{Arc, Mutex};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

type Seen = Arc<Mutex<Vec<(Method, String, StatusCode)>>>;

/// The proxy; it stops (every connection with it) when dropped.
pub struct Wire {
    /// A client whose requests go through the proxy (as the test's own
    /// client: the proxy forwards with its credentials).
    pub client: Client,
    seen: Seen,
    task: JoinHandle<()>,
}

impl Wire {
    /// A proxy forwarding through `upstream`, with a client of namespace `ns`.
    pub async fn start(upstream: &Client, ns: &str) -> Wire {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Seen::default();
        let task = tokio::spawn(serve(listener, upstream.clone(), seen.clone()));
        let mut config = Config::new(format!("http://127.0.0.1:{port}").parse().unwrap());
        config.default_namespace = ns.to_string();
        let client = Client::try_from(config).expect("a client of the proxy");
        Wire { client, seen, task }
    }

    /// The writes (any method but GET, HEAD or OPTIONS) answered so far
    /// whose path starts with one of `prefixes`, as `METHOD path`: those
    /// the API server accepted. A refused one wrote nothing: a create
    /// answered 409 because the profile exists (a reconcile that ran
    /// before the operator's watch showed it its own create) is not a write.
    pub fn writes(&self, prefixes: &[String]) -> Vec<String> {
        let reads = [Method::GET, Method::HEAD, Method::OPTIONS];
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.iter()
            .filter(|(_, _, status)| status.is_success())
            .filter(|(m, p, _)| !reads.contains(m) && prefixes.iter().any(|x| p.starts_with(x)))
            .map(|(m, p, _)| format!("{m} {p}"))
            .collect()
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(listener: TcpListener, upstream: Client, seen: Seen) {
    // Dropped with the accept loop: aborting it closes every connection.
    let mut conns = tokio::task::JoinSet::new();
    while let Ok((stream, _)) = listener.accept().await {
        let (upstream, seen) = (upstream.clone(), seen.clone());
        let service =
            hyper::service::service_fn(move |req| forward(upstream.clone(), seen.clone(), req));
        conns.spawn(async move {
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service);
            let _ = conn.await;
        });
    }
}

/// Sends `req` on, then notes it with the answer: only its path and
/// query (the upstream client sets the server and the credentials), its
/// body read whole.
async fn forward(
    upstream: Client,
    seen: Seen,
    req: Request<Incoming>,
) -> Result<Response<Body>, std::convert::Infallible> {
    let (parts, body) = req.into_parts();
    let (method, path) = (parts.method.clone(), parts.uri.path().to_string());
    let answer = send(upstream, parts, body).await;
    seen.lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((method, path, answer.status()));
    Ok(answer)
}

/// `parts` and `body` sent through `upstream`; a 502 when they cannot be.
async fn send(
    upstream: Client,
    mut parts: hyper::http::request::Parts,
    body: Incoming,
) -> Response<Body> {
    let bytes = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return bad_gateway(&e.to_string()),
    };
    let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    parts.uri = target.parse().expect("a path and query is a URI");
    parts.headers.remove(hyper::header::HOST);
    let out = Request::from_parts(parts, Body::from(bytes.to_vec()));
    upstream
        .send(out)
        .await
        .unwrap_or_else(|e| bad_gateway(&e.to_string()))
}

fn bad_gateway(why: &str) -> Response<Body> {
    let mut r = Response::new(Body::from(why.as_bytes().to_vec()));
    *r.status_mut() = StatusCode::BAD_GATEWAY;
    r
}
