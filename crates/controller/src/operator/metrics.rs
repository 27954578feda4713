//! Prometheus metrics (prefix `memprof_`) and the `/metrics`, `/healthz`
//! and `/readyz` server. The server takes a bound listener and a shutdown
//! future so tests bind `127.0.0.1:0` and stop it deterministically.
//!
//! `/healthz` (liveness) is 200 while the process serves: restarting it
//! would not help a task that cannot start. `/readyz` is 503, naming the
//! tasks and their errors, while a supervised task is starting or failed
//! (see `tasks.rs`).

pub use super::job_gauges::{JobGauges, JobLabels, Published};
use super::tasks::{Health, TaskLabels};
use hyper::{Method, StatusCode};
use memprof_runtime::http::{self, Request, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::future::Future;
use std::sync::Arc;

/// Label of `memprof_reconcile_errors_total`: the step that failed.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StepLabels {
    /// [`crate::operator::Error::step`].
    pub step: &'static str,
}

/// Label of `memprof_events_total`: the Event's reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// `RiskHigh`, `RiskLoweredToLow`, `ReportRejected` (`operator/reconcile/events.rs`).
    pub reason: &'static str,
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
    /// Status writes put off because only `lastReportTime` moved (written within 30 s).
    pub status_deferred: Counter,
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
    /// Per-Job gauges, read from the profile cache at scrape time.
    pub jobs: Arc<JobGauges>,
    /// Bytes (approx.) held by the per-Job roll-ups (`pipeline/rollups.rs`).
    pub rollup_bytes: Gauge,
}

impl Metrics {
    /// Creates the metrics and registers them in `registry` (whose prefix,
    /// if any, is prepended; the binary uses `memprof`).
    pub fn register(registry: &mut Registry) -> Arc<Self> {
        let m = Metrics {
            reconciles: Counter::default(),
            reconcile_errors: Family::default(),
            // 1 ms to ~4 s: a reconcile is an in-memory roll-up and hands its writes over.
            reconcile_duration: Histogram::new(exponential_buckets(0.001, 2.0, 13)),
            status_writes: Counter::default(),
            status_conflicts: Counter::default(),
            status_deferred: Counter::default(),
            annotation_patches: Counter::default(),
            events: Family::default(),
            event_errors: Counter::default(),
            reports_seen: Counter::default(),
            leader: Gauge::default(),
            task_failures: Family::default(),
            jobs: Arc::default(),
            rollup_bytes: Gauge::default(),
        };
        m.register_reconciles(registry);
        m.register_writes(registry);
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
        registry.register_collector(Box::new(m.jobs.clone()));
        registry.register(
            "operator_rollup_bytes",
            "Memory held by the per-Job roll-ups (approx.; bounded by the Jobs' report counts)",
            m.rollup_bytes.clone(),
        );
        Arc::new(m)
    }

    fn register_reconciles(&self, registry: &mut Registry) {
        registry.register("reconciles", "Reconciles started", self.reconciles.clone());
        let errors = "Reconciles that failed, by step";
        registry.register("reconcile_errors", errors, self.reconcile_errors.clone());
        let duration = self.reconcile_duration.clone();
        registry.register(
            "reconcile_duration_seconds",
            "Reconcile wall time",
            duration,
        );
        let seen = self.reports_seen.clone();
        registry.register("reports_seen", "MemoryReport watch events", seen);
    }

    fn register_writes(&self, registry: &mut Registry) {
        let writes = self.status_writes.clone();
        registry.register("status_writes", "MemoryProfile status writes", writes);
        registry.register(
            "status_conflicts",
            "Status writes refused because the profile changed meanwhile (retried)",
            self.status_conflicts.clone(),
        );
        registry.register(
            "status_deferred",
            "Status writes put off because only cosmetic fields moved (lastReportTime and the like: written at most every 30 s)",
            self.status_deferred.clone(),
        );
        let patches = self.annotation_patches.clone();
        registry.register(
            "annotation_patches",
            "Patches of memprof.dev annotations on Jobs",
            patches,
        );
        registry.register("events", "Kubernetes Events published", self.events.clone());
        let errors = self.event_errors.clone();
        registry.register(
            "event_errors",
            "Kubernetes Events that could not be published",
            errors,
        );
    }

    /// Gives every labelled family a child so that an encoding names it
    /// (a family without children is not encoded): for [`descriptors`].
    pub fn touch_families(&self) {
        let _ = self
            .reconcile_errors
            .get_or_create(&StepLabels { step: "" });
        let _ = self.events.get_or_create(&ReasonLabels { reason: "" });
        let _ = self.task_failures.get_or_create(&TaskLabels { task: "" });
        self.jobs
            .described
            .store(true, std::sync::atomic::Ordering::Relaxed);
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

/// The `# HELP` and `# TYPE` lines of an encoding, and for each family
/// whose first sample has labels (other than a histogram's `le`) a line
/// `# LABELS <family> <name>,<name>`: the metric families a binary
/// registers and their label names, for `memprof-operator --print-metrics`
/// (the chart's dashboard and alert tests check their queries against it).
/// No samples.
pub fn descriptors(encoded: &str) -> String {
    let mut out = String::new();
    // The family whose labels are not named yet: its first sample names them.
    let mut pending: Option<&str> = None;
    for line in encoded.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            pending = rest.split(' ').next();
        }
        if line.starts_with("# HELP ") || line.starts_with("# TYPE ") {
            out.push_str(line);
            out.push('\n');
        } else if !line.starts_with('#') {
            let names = label_names(line);
            match pending.take() {
                Some(family) if !names.is_empty() => {
                    out.push_str(&format!("# LABELS {family} {}\n", names.join(",")));
                }
                _ => {}
            }
        }
    }
    out
}

/// Label names of one sample line (`name{a="x",b="y"} 1`), without `le`.
fn label_names(sample: &str) -> Vec<&str> {
    let Some((_, mut rest)) = sample.split_once('{') else {
        return Vec::new();
    };
    let mut names = Vec::new();
    // Each label is `name="value"`; a value escapes `"` and `\` with `\`.
    while let Some((name, after)) = rest.split_once("=\"") {
        let name = name.trim_start_matches(',');
        if name != "le" {
            names.push(name);
        }
        let mut escaped = false;
        let end = after.char_indices().find(|&(_, c)| {
            let closes = c == '"' && !escaped;
            escaped = c == '\\' && !escaped;
            closes
        });
        let Some((end, _)) = end else { break };
        rest = &after[end + 1..];
        if rest.starts_with('}') {
            break;
        }
    }
    names
}

/// `GET /metrics`, `GET /healthz`, `GET /readyz`; 405 for another method
/// on them, 404 (no body) elsewhere.
fn route<B>(registry: &Registry, health: &Health, req: &hyper::Request<B>) -> Response {
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => {
            http::typed(StatusCode::OK, http::OPENMETRICS, encode(registry))
        }
        (&Method::GET, "/healthz") => http::response(StatusCode::OK, "ok"),
        (&Method::GET, "/readyz") => match health.readiness() {
            Ok(()) => http::response(StatusCode::OK, "ok"),
            Err(not_ready) => {
                http::response(StatusCode::SERVICE_UNAVAILABLE, format!("{not_ready}\n"))
            }
        },
        (_, "/metrics" | "/healthz" | "/readyz") => {
            http::text(StatusCode::METHOD_NOT_ALLOWED, "HTTP method not allowed")
        }
        _ => http::response(StatusCode::NOT_FOUND, ""),
    }
}

/// Serves `GET /metrics`, `GET /healthz` and `GET /readyz` (from `health`)
/// on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    registry: Arc<Registry>,
    health: Arc<Health>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let handle = move |req: Request| {
        let answer = route(&registry, &health, &req);
        async move { answer }
    };
    http::serve(listener, handle, shutdown).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_api::{MemoryProfile, MemoryProfileStatus};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: std::net::SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    fn profile(ns: &str, name: &str, risk: memprof_api::RiskLevel) -> MemoryProfile {
        let mut p = MemoryProfile::new(name, Default::default());
        p.metadata.namespace = Some(ns.into());
        p.metadata.uid = Some(format!("{ns}-{name}"));
        p.status = Some(MemoryProfileStatus {
            risk,
            time_to_oom_seconds: Some(90.5),
            peak_used_bytes: 1 << 30,
            ooms: vec![memprof_api::OomRecord {
                time: "2026-11-22T10:00:00Z".into(),
                ..Default::default()
            }],
            remediations: vec![memprof_api::RemediationRecord {
                phase: "Failed".into(),
                ..Default::default()
            }],
            remediation_totals: vec![memprof_api::RemediationTotal {
                count: 2,
                ..Default::default()
            }],
            ..Default::default()
        });
        p
    }

    #[test]
    fn another_method_is_405_and_another_path_404() {
        let (registry, health) = (Registry::default(), Health::new());
        let req = |method: &str, path: &str| {
            let req = hyper::Request::builder().method(method).uri(path);
            route(&registry, &health, &req.body(()).unwrap())
        };
        assert_eq!(req("GET", "/readyz").status(), StatusCode::OK);
        assert_eq!(
            req("POST", "/metrics").status(),
            StatusCode::METHOD_NOT_ALLOWED
        );
        assert_eq!(
            req("DELETE", "/healthz").status(),
            StatusCode::METHOD_NOT_ALLOWED
        );
        assert_eq!(req("GET", "/metrics/x").status(), StatusCode::NOT_FOUND);
        assert_eq!(req("GET", "/").status(), StatusCode::NOT_FOUND);
    }

    #[test]
    fn job_gauges_follow_the_profile_cache_and_leave_no_stale_series() {
        use kube::runtime::watcher::Event;
        let mut registry = Registry::with_prefix("memprof");
        let m = Metrics::register(&mut registry);
        let (store, mut writer) = kube::runtime::reflector::store::<MemoryProfile>();
        let train = profile("team-a", "train", memprof_api::RiskLevel::High);
        writer.apply_watcher_event(&Event::Apply(train.clone()));
        writer.apply_watcher_event(&Event::Apply(profile(
            "team-b",
            "eval",
            memprof_api::RiskLevel::Low,
        )));
        let published = m.jobs.publish(store);
        let body = encode(&registry);
        for want in [
            "memprof_job_risk_level{namespace=\"team-a\",job_name=\"train\"} 3.0",
            "memprof_job_risk_level{namespace=\"team-b\",job_name=\"eval\"} 1.0",
            "memprof_job_time_to_oom_seconds{namespace=\"team-a\",job_name=\"train\"} 90.5",
            "memprof_job_peak_used_bytes{namespace=\"team-a\",job_name=\"train\"} 1073741824.0",
            "memprof_job_last_gpu_oom_timestamp_seconds{namespace=\"team-a\",job_name=\"train\"} 1795341600.0",
            "memprof_job_remediations{namespace=\"team-a\",job_name=\"train\"} 2.0",
            "memprof_job_remediations_failed{namespace=\"team-a\",job_name=\"train\"} 1.0",
        ] {
            assert!(body.contains(want), "{want} in {body}");
        }
        assert!(
            !body.contains("memprof_job_imbalance_ratio{"),
            "absent when None"
        );

        // The profile is deleted: its series go with it at the next scrape.
        writer.apply_watcher_event(&Event::Delete(train));
        let body = encode(&registry);
        assert!(!body.contains("job_name=\"train\""), "{body}");
        assert!(body.contains("job_name=\"eval\""), "{body}");

        // Leadership lost (the controller stops): no per-Job series at all,
        // but the families are still described.
        drop(published);
        let body = encode(&registry);
        assert!(!body.contains("job_name=\""), "{body}");
        assert!(
            body.contains("# TYPE memprof_job_risk_level gauge"),
            "{body}"
        );
    }

    #[test]
    fn descriptors_name_the_families_and_their_labels_without_samples() {
        let mut registry = Registry::with_prefix("memprof");
        let m = Metrics::register(&mut registry);
        m.touch_families();
        let text = descriptors(&encode(&registry));
        for want in [
            "# TYPE memprof_job_risk_level gauge\n",
            // `job_name`, never `job`: Prometheus's own `job` label stays the scrape job's.
            "# LABELS memprof_job_risk_level namespace,job_name\n",
            "# LABELS memprof_job_remediations_failed namespace,job_name\n",
            "# LABELS memprof_events reason\n",
        ] {
            assert!(text.contains(want), "{want} in {text}");
        }
        assert!(
            !text.contains("memprof_reconcile_duration_seconds le"),
            "{text}"
        );
        assert!(
            text.lines().all(|l| l.starts_with('#')),
            "no samples: {text}"
        );
        assert_eq!(label_names(r#"x{a="q\"},b=\\",b="",le="1"} 1"#), ["a", "b"]);
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
