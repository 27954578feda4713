//! One accepted connection: TLS handshake under its deadline, HTTP/1 or
//! HTTP/2 with the server's limits, and a graceful close when it has been
//! idle too long or the server stops.

use super::handler::{self, Shared};
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::{watch, Notify, OwnedSemaphorePermit};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

/// Requests in flight on a connection and when the last one ended, so an
/// HTTP/2 connection that only sends PINGs (or nothing) is still idle.
pub(super) struct Activity {
    /// (requests in flight, when the count last dropped to zero or the connection began)
    state: Mutex<(usize, Instant)>,
    changed: Notify,
}

/// A request in flight; dropping it ends the request.
pub(super) struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.update(|state| {
            state.0 -= 1;
            state.1 = Instant::now();
        });
    }
}

impl Activity {
    pub fn new() -> Arc<Self> {
        Arc::new(Activity {
            state: Mutex::new((0, Instant::now())),
            changed: Notify::new(),
        })
    }

    fn update(&self, f: impl FnOnce(&mut (usize, Instant))) {
        f(&mut self.state.lock().unwrap_or_else(|e| e.into_inner()));
        self.changed.notify_waiters();
    }

    /// Marks a request as started until the returned guard is dropped.
    pub fn begin(self: &Arc<Self>) -> Busy {
        self.update(|state| state.0 += 1);
        Busy(self.clone())
    }

    /// Completes once no request has been in flight for `after`.
    pub async fn idle(&self, after: Duration) {
        loop {
            // Created before reading the state: `notify_waiters` reaches it
            // even before it is polled, so no change is missed.
            let changed = self.changed.notified();
            let (in_flight, since) = *self.state.lock().unwrap_or_else(|e| e.into_inner());
            if in_flight > 0 {
                changed.await;
                continue;
            }
            let deadline = since + after;
            if Instant::now() >= deadline {
                return;
            }
            tokio::select! {
                () = changed => {}
                () = tokio::time::sleep_until(deadline) => {}
            }
        }
    }
}

/// Counts the connection in `connections_open` while it lives.
struct Open(Arc<Shared>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.metrics.connections_open.dec();
    }
}

/// The TLS handshake under its deadline; None (logged, and counted when it
/// timed out) when it did not complete.
async fn handshake(
    tcp: TcpStream,
    peer: SocketAddr,
    acceptor: &TlsAcceptor,
    shared: &Shared,
) -> Option<tokio_rustls::server::TlsStream<TcpStream>> {
    let deadline = shared.limits.handshake_timeout;
    match tokio::time::timeout(deadline, acceptor.accept(tcp)).await {
        Ok(Ok(tls)) => Some(tls),
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "TLS handshake failed");
            None
        }
        Err(_) => {
            shared.metrics.closed("handshake_timeout");
            tracing::debug!(%peer, "TLS handshake timed out");
            None
        }
    }
}

/// Serves one connection. `slot` is its place under `max_connections`,
/// given back when this returns.
pub(super) async fn serve_connection(
    tcp: TcpStream,
    peer: SocketAddr,
    acceptor: TlsAcceptor,
    shared: Arc<Shared>,
    slot: OwnedSemaphorePermit,
    mut stop: watch::Receiver<bool>,
) {
    let _slot = slot;
    shared.metrics.connections_open.inc();
    let _open = Open(shared.clone());
    let limits = &shared.limits;
    let Some(tls) = handshake(tcp, peer, &acceptor, &shared).await else {
        return;
    };
    let activity = Activity::new();
    let service = {
        let (shared, activity) = (shared.clone(), activity.clone());
        hyper::service::service_fn(move |req| {
            let busy = activity.begin();
            let shared = shared.clone();
            async move {
                let reply = handler::handle(req, shared).await;
                drop(busy);
                reply
            }
        })
    };
    let conn = shared.builder.serve_connection(TokioIo::new(tls), service);
    let mut conn = std::pin::pin!(conn);
    let closing = tokio::select! {
        ended = conn.as_mut() => {
            if let Err(e) = ended {
                tracing::debug!(%peer, error = %e, "webhook connection ended with an error");
            }
            return;
        }
        _ = stop.wait_for(|stopped| *stopped) => "shutdown",
        () = activity.idle(limits.idle_timeout) => "idle",
    };
    // HTTP/2: GOAWAY, then let streams in flight finish; HTTP/1: close after
    // the current response. Bounded by the request deadline either way.
    conn.as_mut().graceful_shutdown();
    if closing == "idle" {
        shared.metrics.closed("idle");
    }
    if tokio::time::timeout(limits.request_timeout, conn)
        .await
        .is_err()
    {
        shared.metrics.closed("shutdown_grace");
        tracing::debug!(%peer, closing, "webhook connection dropped after its grace period");
    }
}
