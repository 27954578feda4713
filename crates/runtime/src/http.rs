//! The one HTTP server of the plain-HTTP endpoints: the sidecar's agent
//! socket and metrics port, the operator's `/metrics`, `/healthz`,
//! `/readyz`. hyper 1 through hyper-util, as the webhook's TLS server
//! (which keeps its own accept loop for its limits and certificates): one
//! stack, already under kube's client. Each role routes by method and path
//! itself; there are a handful of routes per server.
//!
//! Connections speak HTTP/1.1, or HTTP/2 without TLS when the client starts
//! with its preface. On shutdown the listener closes at once and the open
//! connections finish their requests in flight.

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::StatusCode;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};

/// A request as the handler receives it (the body not read yet).
pub type Request = hyper::Request<Incoming>;
/// A response with its whole body in memory.
pub type Response = hyper::Response<Full<Bytes>>;

/// `text/plain; charset=utf-8`, the type of the plain answers.
pub const TEXT: &str = "text/plain; charset=utf-8";
/// `application/json`.
pub const JSON: &str = "application/json";
/// The OpenMetrics text format Prometheus scrapes.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A response of `status` with `body` and no content type.
pub fn response(status: StatusCode, body: impl Into<Bytes>) -> Response {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r
}

/// A response of `status` with `body` of `content_type`.
pub fn typed(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Response {
    let mut r = response(status, body);
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

/// A plain-text response (`text/plain; charset=utf-8`).
pub fn text(status: StatusCode, body: impl Into<Bytes>) -> Response {
    typed(status, TEXT, body)
}

/// A listener whose connections serve HTTP: TCP, or a Unix socket.
pub trait Listener: Send + 'static {
    /// One accepted connection.
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    /// The next connection.
    fn accept(&self) -> impl Future<Output = std::io::Result<Self::Io>> + Send;
}

impl Listener for tokio::net::TcpListener {
    type Io = tokio::net::TcpStream;
    async fn accept(&self) -> std::io::Result<Self::Io> {
        tokio::net::TcpListener::accept(self).await.map(|(s, _)| s)
    }
}

impl Listener for tokio::net::UnixListener {
    type Io = tokio::net::UnixStream;
    async fn accept(&self) -> std::io::Result<Self::Io> {
        tokio::net::UnixListener::accept(self).await.map(|(s, _)| s)
    }
}

/// Pause after a failed accept (out of file descriptors and the like), so
/// the loop does not spin while the cause lasts.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// Serves every connection of `listener` with `handle` until `shutdown`
/// completes, then lets the open connections finish their requests.
pub async fn serve<L, H, Fut>(listener: L, handle: H, shutdown: impl Future<Output = ()>)
where
    L: Listener,
    H: Fn(Request) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response> + Send + 'static,
{
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let io = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(io) => io,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed; serving on");
                    tokio::time::sleep(ACCEPT_PAUSE).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let handle = handle.clone();
        let service = hyper::service::service_fn(move |req| {
            let answer = handle(req);
            async move { Ok::<_, Infallible>(answer.await) }
        });
        let conn = auto::Builder::new(TokioExecutor::new())
            .serve_connection(TokioIo::new(io), service)
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "HTTP connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

#[cfg(test)]
mod tests;
