//! What the webhook server lets one client hold, and the metrics that count
//! what it refused.
//!
//! Any pod that can reach the operator's webhook port can open connections,
//! and the operator also runs roll-up and remediation: a client that makes it
//! run out of memory stops all three. So every buffer a client can make the
//! server hold is capped, every wait has a deadline, and
//! [`ServerLimits::buffered_bytes_bound`] states the sum.

use super::ServerError;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::time::Duration;

const KIB: u32 = 1024;
const MIB: u32 = 1024 * KIB;

/// rustls's buffers per connection: one incoming record (≤ 16 KiB + header),
/// received plaintext not yet read (rustls stops decrypting at 16 KiB), and
/// outgoing records of our small responses. An estimate, not a setting.
pub const TLS_BUFFER_ESTIMATE: u64 = 64 * 1024;

/// hyper refuses an HTTP/1 read buffer smaller than this.
const H1_MIN_BUF: u32 = 8 * KIB;

/// The server's caps and deadlines. [`Default`] is what the operator serves
/// with; tests set small values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerLimits {
    /// A client that has not finished the TLS handshake by then is dropped.
    pub handshake_timeout: Duration,
    /// HTTP/1: the request head must arrive within this, counted from when
    /// the server starts reading it, so it also closes idle keep-alive
    /// connections (hyper's `header_read_timeout`).
    pub header_read_timeout: Duration,
    /// Whole request, from its head to the response: reading the body,
    /// waiting for the body budget and a review slot, mutating.
    pub request_timeout: Duration,
    /// A connection with no request in flight for this long is shut down
    /// gracefully (HTTP/2 GOAWAY). The API server reconnects when it needs to.
    pub idle_timeout: Duration,
    /// HTTP/2 PING interval; a peer that does not answer within the same
    /// time is dropped (a vanished API server must not hold a slot).
    pub keep_alive_interval: Duration,
    /// Open connections (including ones still in the TLS handshake); the
    /// next one is closed at once.
    pub max_connections: usize,
    /// HTTP/2 `SETTINGS_MAX_CONCURRENT_STREAMS`: streams beyond it are
    /// refused (`RST_STREAM REFUSED_STREAM`).
    pub max_streams: u32,
    /// HTTP/1 read buffer (so the largest request head) and HTTP/2
    /// `SETTINGS_MAX_HEADER_LIST_SIZE`.
    pub max_header_bytes: u32,
    /// Largest request body; larger ones get 413, checked as the body
    /// arrives (a chunked body without `Content-Length` too).
    pub max_body_bytes: u32,
    /// The first bytes of every body, read without waiting for the body
    /// budget or a review slot. Every request can hold this much at once
    /// (connections × streams is bounded), so no client can make the API
    /// server's ordinary reviews (a few KiB) wait behind large ones.
    pub small_body_bytes: u32,
    /// Body bytes beyond [`Self::small_body_bytes`] buffered by all requests
    /// together. A request that would exceed it stops reading (flow control
    /// pushes back on the client) until others finish, or its deadline.
    pub body_budget_bytes: u32,
    /// Reviews larger than [`Self::small_body_bytes`] parsed at the same
    /// time. Parsing builds a JSON tree many times the size of the body
    /// (docs/security.md measures it), so this bounds that amplification.
    pub max_concurrent_reviews: u32,
    /// HTTP/2 per-stream flow-control window: DATA a client may send ahead.
    pub h2_stream_window: u32,
    /// HTTP/2 per-connection window: DATA buffered per connection before
    /// the server has read it.
    pub h2_connection_window: u32,
    /// On shutdown, how long open connections may take to finish.
    pub shutdown_grace: Duration,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            handshake_timeout: Duration::from_secs(10),
            // The API server sends a whole request at once; 10 s is more
            // than its own webhook timeout (chart: 5 s, at most 30 s).
            header_read_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(30),
            keep_alive_interval: Duration::from_secs(10),
            // The API server speaks HTTP/2: one connection per API server
            // replica, another only while one has all its streams busy.
            max_connections: 64,
            max_streams: 8,
            max_header_bytes: 16 * KIB,
            // This webhook only sees CREATE (no oldObject), and the API
            // server refuses request bodies over 3 MiB (--max-request-bytes'
            // default), so no object it admits needs a larger review.
            max_body_bytes: 3 * MIB,
            // A 16-rank Job with two 20-variable containers is a 4 KiB review.
            small_body_bytes: 32 * KIB,
            // Five of the largest reviews at once.
            body_budget_bytes: 16 * MIB,
            max_concurrent_reviews: 1,
            h2_stream_window: 64 * KIB,
            h2_connection_window: 256 * KIB,
            shutdown_grace: Duration::from_secs(30),
        }
    }
}

impl ServerLimits {
    /// Refuses settings that would make the server unable to serve.
    pub fn validate(&self) -> Result<(), ServerError> {
        let invalid = |what: &'static str| Err(ServerError::Limits(what));
        if self.max_connections == 0 {
            return invalid("max_connections must be at least 1");
        }
        if self.max_streams == 0 || self.max_concurrent_reviews == 0 {
            return invalid("max_streams and max_concurrent_reviews must be at least 1");
        }
        if self.body_budget_bytes < self.max_body_bytes.saturating_sub(self.small_body_bytes) {
            return invalid("body_budget_bytes must hold one body of max_body_bytes");
        }
        // RFC 9113 6.5.2: windows may not exceed 2^31-1; frames are >= 16 KiB.
        if self.h2_stream_window >= 1 << 31 || self.h2_connection_window >= 1 << 31 {
            return invalid("HTTP/2 windows must be below 2^31");
        }
        Ok(())
    }

    /// Bytes one connection can make the server buffer outside the body
    /// budget: TLS, and either the HTTP/1 read buffer and one request's
    /// small body, or the HTTP/2 connection window and, per stream, a header
    /// list and a small body.
    pub fn connection_buffer_bound(&self) -> u64 {
        let per_request = u64::from(self.max_header_bytes) + u64::from(self.small_body_bytes);
        let h1 =
            u64::from(self.max_header_bytes.max(H1_MIN_BUF)) + u64::from(self.small_body_bytes);
        let h2 = u64::from(self.h2_connection_window) + u64::from(self.max_streams) * per_request;
        TLS_BUFFER_ESTIMATE + h1.max(h2)
    }

    /// All bytes clients can make the server buffer at once: every
    /// connection's buffers plus the body budget. Parsing adds a transient
    /// tree for at most [`Self::max_concurrent_reviews`] bodies
    /// (docs/security.md gives the measured factor).
    pub fn buffered_bytes_bound(&self) -> u64 {
        self.max_connections as u64 * self.connection_buffer_bound()
            + u64::from(self.body_budget_bytes)
    }

    /// The hyper connection builder with these limits applied.
    pub(super) fn builder(&self) -> auto::Builder<TokioExecutor> {
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(self.header_read_timeout)
            .max_buf_size(self.max_header_bytes.max(H1_MIN_BUF) as usize);
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(self.max_streams)
            .max_header_list_size(self.max_header_bytes)
            // 16 KiB is the protocol's minimum and hyper's default; pinned
            // so a change of default cannot grow the per-frame buffer.
            .max_frame_size(16 * KIB)
            .initial_stream_window_size(self.h2_stream_window)
            .initial_connection_window_size(self.h2_connection_window)
            .max_send_buf_size(64 * KIB as usize)
            .keep_alive_interval(self.keep_alive_interval)
            .keep_alive_timeout(self.keep_alive_interval);
        builder
    }
}

/// Label of `memprof_webhook_requests_rejected_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RejectLabels {
    /// `body_too_large` (413) or `timeout` (408).
    pub reason: &'static str,
}

/// Label of `memprof_webhook_connections_closed_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CloseLabels {
    /// `handshake_timeout`, `idle` or `shutdown_grace` (closed by the server).
    pub reason: &'static str,
}

/// The webhook server's metrics (prefix added by the registry; the operator
/// uses `memprof`).
#[derive(Debug)]
pub struct ServerMetrics {
    /// Connections open now (TLS handshake included).
    pub connections_open: Gauge,
    /// Connections closed at once because `max_connections` were open.
    pub connections_rejected: Counter,
    /// Connections the server closed on a deadline, by reason.
    pub connections_closed: Family<CloseLabels, Counter>,
    /// Requests answered with an error status because of a limit, by reason.
    pub requests_rejected: Family<RejectLabels, Counter>,
}

impl ServerMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &mut Registry) -> Arc<Self> {
        let m = ServerMetrics {
            connections_open: Gauge::default(),
            connections_rejected: Counter::default(),
            connections_closed: Family::default(),
            requests_rejected: Family::default(),
        };
        registry.register(
            "webhook_connections_open",
            "Admission webhook connections open now",
            m.connections_open.clone(),
        );
        registry.register(
            "webhook_connections_rejected",
            "Admission webhook connections closed at once: the connection cap was reached",
            m.connections_rejected.clone(),
        );
        registry.register(
            "webhook_connections_closed",
            "Admission webhook connections closed by the server on a deadline, by reason",
            m.connections_closed.clone(),
        );
        registry.register(
            "webhook_requests_rejected",
            "Admission webhook requests refused by a limit (413 body too large, 408 timeout)",
            m.requests_rejected.clone(),
        );
        Arc::new(m)
    }

    /// Metrics registered nowhere: for callers that do not export them.
    pub fn unregistered() -> Arc<Self> {
        Self::register(&mut Registry::default())
    }

    pub(super) fn closed(&self, reason: &'static str) {
        self.connections_closed
            .get_or_create(&CloseLabels { reason })
            .inc();
    }

    pub(super) fn rejected(&self, reason: &'static str) {
        self.requests_rejected
            .get_or_create(&RejectLabels { reason })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bound_buffers_to_60_mib() {
        let limits = ServerLimits::default();
        limits.validate().unwrap();
        // 64 connections x (64 KiB TLS + 256 KiB window + 8 x (16 KiB
        // headers + 32 KiB small body)) + 16 MiB budget.
        assert_eq!(limits.connection_buffer_bound(), 704 * 1024);
        assert_eq!(limits.buffered_bytes_bound(), 60 * 1024 * 1024);
    }

    #[test]
    fn rejects_limits_that_cannot_serve() {
        let bad = [
            ServerLimits {
                max_connections: 0,
                ..Default::default()
            },
            ServerLimits {
                body_budget_bytes: 1024 * 1024,
                ..Default::default()
            },
            ServerLimits {
                max_streams: 0,
                ..Default::default()
            },
        ];
        for limits in bad {
            assert!(limits.validate().is_err(), "{limits:?}");
        }
    }
}
