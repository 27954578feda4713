//! Prometheus metrics (prefix `memprof_`) and the `/metrics`, `/healthz`
//! and `/readyz` server. The server takes a bound listener and a shutdown
//! future so tests bind `127.0.0.1:0` and stop it deterministically.
//!
//! `/healthz` (liveness) is 200 while the process serves: restarting it
//! would not help a task that cannot start. `/readyz` is 503, naming the
//! tasks and their errors, while a supervised task is starting or failed
//! (see `tasks.rs`).

use super::tasks::Health;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::future::Future;
use std::sync::Arc;
use warp::Filter;

/// Label of `memprof_reconcile_errors_total`: the step that failed.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StepLabels {
    /// [`crate::operator::Error::step`].
    pub step: &'static str,
}

/// Label of `memprof_events_total`: the Event's reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// `RiskRaised`, `RiskLowered`, `ReportRejected`.
    pub reason: &'static str,
}

/// Label of `memprof_operator_task_failures_total`: the task that ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TaskLabels {
    /// `operator`, `remediation`, `webhook`, `metrics`.
    pub task: &'static str,
}

/// The operator's counters and histograms.
#[derive(Debug)]
pub struct Metrics {
    /// Reconciles started.
    pub reconciles: Counter,
    /// Reconciles that failed, by step.
    pub reconcile_errors: Family<StepLabels, Counter>,
    /// Reconcile wall time, seconds.
    pub reconcile_duration: Histogram,
    /// MemoryProfile status writes (server-side applies of the status subresource).
    pub status_writes: Counter,
    /// Status writes the API server refused because the profile changed meanwhile.
    pub status_conflicts: Counter,
    /// Patches of the `memprof.dev/*` annotations on Jobs.
    pub annotation_patches: Counter,
    /// Kubernetes Events published, by reason.
    pub events: Family<ReasonLabels, Counter>,
    /// Events that could not be published.
    pub event_errors: Counter,
    /// MemoryReport watch events (created, updated or deleted reports).
    pub reports_seen: Counter,
    /// 1 while this replica holds the operator's Lease and reconciles (always
    /// 1 while reconciling without leader election).
    pub leader: Gauge,
    /// Long-lived tasks of the operator that ended (failed or returned), by task.
    pub task_failures: Family<TaskLabels, Counter>,
}

impl Metrics {
    /// Creates the metrics and registers them in `registry` (whose prefix,
    /// if any, is prepended; the binary uses `memprof`).
    pub fn register(registry: &mut Registry) -> Arc<Self> {
        let m = Metrics {
            reconciles: Counter::default(),
            reconcile_errors: Family::default(),
            // 1 ms to ~4 s: a reconcile is an in-memory roll-up plus at most three writes.
            reconcile_duration: Histogram::new(exponential_buckets(0.001, 2.0, 13)),
            status_writes: Counter::default(),
            status_conflicts: Counter::default(),
            annotation_patches: Counter::default(),
            events: Family::default(),
            event_errors: Counter::default(),
            reports_seen: Counter::default(),
            leader: Gauge::default(),
            task_failures: Family::default(),
        };
        registry.register("reconciles", "Reconciles started", m.reconciles.clone());
        registry.register(
            "reconcile_errors",
            "Reconciles that failed, by step",
            m.reconcile_errors.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Reconcile wall time",
            m.reconcile_duration.clone(),
        );
        registry.register(
            "status_writes",
            "MemoryProfile status writes",
            m.status_writes.clone(),
        );
        registry.register(
            "status_conflicts",
            "Status writes refused because the profile changed meanwhile (retried)",
            m.status_conflicts.clone(),
        );
        registry.register(
            "annotation_patches",
            "Patches of memprof.dev annotations on Jobs",
            m.annotation_patches.clone(),
        );
        registry.register("events", "Kubernetes Events published", m.events.clone());
        registry.register(
            "event_errors",
            "Kubernetes Events that could not be published",
            m.event_errors.clone(),
        );
        registry.register(
            "reports_seen",
            "MemoryReport watch events",
            m.reports_seen.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica holds the operator Lease and reconciles",
            m.leader.clone(),
        );
        registry.register(
            "operator_task_failures",
            "Long-lived operator tasks that ended (each is retried with backoff), by task",
            m.task_failures.clone(),
        );
        Arc::new(m)
    }

    /// Metrics registered nowhere: for tests and embedders that do not export them.
    pub fn unregistered() -> Arc<Self> {
        Self::register(&mut Registry::default())
    }
}

/// The registry as Prometheus text (OpenMetrics).
pub fn encode(registry: &Registry) -> String {
    let mut body = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut body, registry);
    body
}

/// Serves `GET /metrics`, `GET /healthz` and `GET /readyz` (from `health`)
/// on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    registry: Arc<Registry>,
    health: Arc<Health>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let metrics = warp::path("metrics")
        .and(warp::path::end())
        .and(warp::get())
        .map(move || {
            // Owned values only: a reply borrowing `&str` makes the server
            // future not `Send` for every lifetime, so it could not be spawned.
            let mut reply = warp::reply::Response::new(encode(&registry).into());
            reply.headers_mut().insert(
                warp::http::header::CONTENT_TYPE,
                warp::http::HeaderValue::from_static(
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                ),
            );
            reply
        });
    let healthz = warp::path("healthz")
        .and(warp::path::end())
        .and(warp::get())
        .map(|| warp::reply::Response::new("ok".into()));
    let readyz = warp::path("readyz")
        .and(warp::path::end())
        .and(warp::get())
        .map(move || match health.readiness() {
            Ok(()) => warp::reply::Response::new("ok".into()),
            Err(not_ready) => {
                let mut reply = warp::reply::Response::new(format!("{not_ready}\n").into());
                *reply.status_mut() = warp::http::StatusCode::SERVICE_UNAVAILABLE;
                reply
            }
        });
    // Boxed: erases the `&'static str` path types, which otherwise make the
    // server future fail the `Send` check of `tokio::spawn` (a rustc HRTB limitation).
    let routes = metrics.or(healthz).unify().or(readyz).unify().boxed();
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

    async fn get(addr: std::net::SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn serves_prefixed_metrics_and_healthz() {
        let mut registry = Registry::with_prefix("memprof");
        let m = Metrics::register(&mut registry);
        m.status_writes.inc();
        m.events
            .get_or_create(&ReasonLabels {
                reason: "RiskRaised",
            })
            .inc();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let health = Health::new();
        let server = tokio::spawn(serve(listener, Arc::new(registry), health.clone(), async {
            let _ = rx.await;
        }));
        let body = get(addr, "/metrics").await;
        assert!(body.contains("memprof_status_writes_total 1"), "{body}");
        assert!(body.contains("memprof_events_total{reason=\"RiskRaised\"} 1"));
        assert!(body.contains("memprof_reconcile_duration_seconds_bucket"));
        assert!(get(addr, "/healthz").await.ends_with("ok"));
        assert!(get(addr, "/readyz").await.ends_with("ok"), "no task yet");
        let ready = health.clone();
        tokio::spawn(super::super::tasks::supervise(
            "remediation",
            health.clone(),
            m.task_failures.clone(),
            futures::FutureExt::shared(futures::FutureExt::boxed(std::future::pending())),
            |_ready| async { Err::<(), _>("CRD remediationpolicies.memprof.dev not installed") },
        ));
        while ready.readiness().is_ok() {
            tokio::task::yield_now().await;
        }
        let body = get(addr, "/readyz").await;
        assert!(body.starts_with("HTTP/1.1 503"), "{body}");
        assert!(
            body.contains("remediation: failed, retrying in 1s: CRD"),
            "{body}"
        );
        assert!(get(addr, "/healthz").await.ends_with("ok"), "still alive");
        let body = get(addr, "/metrics").await;
        assert!(
            body.contains("memprof_operator_task_failures_total{task=\"remediation\"} 1"),
            "{body}"
        );
        tx.send(()).unwrap();
        server.await.unwrap();
    }
}
