//! Everything the sidecar's loop needs before its first sample: checked
//! flags and identity ([`Setup`]), the endpoints ([`Endpoints`]) and the
//! report writer ([`start_writer`]). None of it fails the sidecar once the
//! flags are valid: an endpoint that cannot listen or an API server that
//! cannot be reached is logged, counted and reported.

use crate::budget::Reason;
use crate::metrics::Metrics;
use crate::monitor::Identity;
use crate::{identity, server, socket, writer, Args};
use anyhow::Context;
use backon::Retryable;
use memprof_api::thresholds::Thresholds;
use memprof_api::{Condition, MemoryReportSpec};
use memprof_runtime::backoff::REPORT_WRITE;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Condition a report carries when `/healthz` and `/metrics` could not listen.
pub const ENDPOINTS_CONDITION: &str = "EndpointsServing";
/// Condition a report carries when the agent socket could not be served.
pub const AGENT_SOCKET_CONDITION: &str = "AgentSocketServing";

/// The checked flags and who the sidecar reports for.
#[derive(Clone, Debug)]
pub struct Setup {
    /// Analysis thresholds.
    pub thresholds: Thresholds,
    /// The pod's rank, when known.
    pub rank: Option<u32>,
    /// Pod, node, Job, rank.
    pub id: Identity,
}

impl Setup {
    /// Checks the flags that can be wrong (thresholds, speed, pod name) and
    /// works out the rank.
    pub fn from_args(args: &Args) -> anyhow::Result<Setup> {
        let thresholds: Thresholds = match &args.thresholds {
            Some(json) => serde_json::from_str(json)
                .context("--thresholds is not valid JSON of analysis thresholds")?,
            None => Thresholds::default(),
        };
        thresholds.validate()?;
        if !(args.speed > 0.0 && args.speed.is_finite()) {
            anyhow::bail!("--speed must be a positive number");
        }
        let pod_name = match (&args.pod_name, args.standalone) {
            (Some(p), _) => p.clone(),
            (None, true) => std::env::var("HOSTNAME").unwrap_or_else(|_| "standalone".into()),
            (None, false) => anyhow::bail!("POD_NAME is not set: pass --pod-name or set it through the downward API (or use --standalone)"),
        };
        let rank = args.rank.or_else(|| {
            identity::rank_from(
                std::env::var("JOB_COMPLETION_INDEX").ok().as_deref(),
                std::env::var("RANK").ok().as_deref(),
                &pod_name,
            )
        });
        let id = identity::identity(
            &pod_name,
            args.node_name.clone(),
            args.job_name.clone(),
            rank,
        );
        Ok(Setup {
            thresholds,
            rank,
            id,
        })
    }
}

/// Where `/healthz` and `/metrics` listen: `--port` on every interface, so
/// Prometheus can scrape the pod IP, else `--listen` (loopback by default).
/// IPv4 only, as before the agent moved to its socket.
pub fn listen_addr(args: &Args) -> SocketAddr {
    match args.port {
        Some(port) => SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)),
        None => args.listen,
    }
}

/// Binds the TCP listener. A failure is logged, counted and returned as a
/// condition for the report, never fatal: the port may be the trainer's
/// (9464 is also OpenTelemetry's Prometheus exporter's), and a sidecar that
/// exits non-zero fails a legacy sidecar's training pod. Not retried: a
/// retry could take the port in the moment a restarting trainer lets go of
/// it, and fail the trainer instead.
pub async fn bind_tcp(addr: SocketAddr, metrics: &Metrics) -> Result<TcpListener, Condition> {
    TcpListener::bind(addr).await.map_err(|e| {
        metrics.listen_errors.inc();
        let message = format!(
            "cannot listen on {addr}: {e}; /healthz and /metrics are not served, sampling, \
             reports and the agent socket go on. Give the sidecar a free port with the \
             annotation memprof.dev/port (or --port / MEMPROF_PORT)"
        );
        tracing::error!("{message}");
        Condition::new(ENDPOINTS_CONDITION, false, "ListenFailed", message)
    })
}

/// The running endpoints; [`Endpoints::stop`] ends them.
pub struct Endpoints {
    tasks: Vec<JoinHandle<()>>,
    stop: watch::Sender<bool>,
    /// Removes the socket file when dropped.
    _socket: Option<socket::SocketFile>,
}

impl Endpoints {
    /// Starts `/healthz` + `/metrics` on TCP and the agent's endpoints on
    /// the agent socket (when one is configured); the conditions say what
    /// could not be served.
    pub async fn start(args: &Args, shared: server::Shared) -> (Endpoints, Vec<Condition>) {
        let (stop, _) = watch::channel(false);
        let stopped = |stop: &watch::Sender<bool>| {
            let mut rx = stop.subscribe();
            async move {
                let _ = rx.wait_for(|s| *s).await;
            }
        };
        let (mut tasks, mut conditions, mut socket_file) = (vec![], vec![], None);
        match bind_tcp(listen_addr(args), &shared.metrics).await {
            Ok(listener) => {
                if let Ok(addr) = listener.local_addr() {
                    tracing::info!(%addr, "serving /healthz and /metrics");
                }
                let serve = server::serve_tcp(listener, shared.clone(), stopped(&stop));
                tasks.push(tokio::spawn(serve));
            }
            Err(c) => conditions.push(c),
        }
        match open_socket(args, &shared.metrics) {
            Ok(Some((listener, file))) => {
                let serve = server::serve_socket(listener, shared, stopped(&stop));
                tasks.push(tokio::spawn(serve));
                socket_file = Some(file);
            }
            Ok(None) => {}
            Err(c) => conditions.push(c),
        }
        let endpoints = Endpoints {
            tasks,
            stop,
            _socket: socket_file,
        };
        (endpoints, conditions)
    }

    /// Stops serving (waits up to 5 s per listener) and removes the socket.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
    }
}

type OpenSocket = Option<(tokio::net::UnixListener, socket::SocketFile)>;

fn open_socket(args: &Args, metrics: &Metrics) -> Result<OpenSocket, Condition> {
    let Some(path) = &args.agent_socket else {
        tracing::info!(
            "no agent socket (MEMPROF_AGENT_SOCKET / --agent-socket not set): agent pushes are \
             not taken and GET /v1/report is not served"
        );
        return Ok(None);
    };
    match socket::bind(path) {
        Ok((listener, file)) => {
            tracing::info!(socket = %path.display(), "serving POST /v1/agent, GET /v1/report");
            Ok(Some((listener, file)))
        }
        Err(e) => {
            metrics.listen_errors.inc();
            tracing::error!("{e}");
            Err(Condition::new(
                AGENT_SOCKET_CONDITION,
                false,
                "SocketFailed",
                format!("{e}; the in-process agent's pushes are not taken"),
            ))
        }
    }
}

/// The report writer's task: a Kubernetes client (retried with backoff,
/// 1 s to 60 s: a missing kubeconfig must not make the pod unhealthy), then
/// [`writer::run`] until `rx` closes.
pub fn start_writer(
    args: &Args,
    pod_name: &str,
    rx: watch::Receiver<Option<(Reason, MemoryReportSpec)>>,
    metrics: Metrics,
) -> JoinHandle<()> {
    let target = writer::Target {
        namespace: args.namespace.clone(),
        name: pod_name.to_string(),
        pod_uid: args.pod_uid.clone(),
    };
    tokio::spawn(async move {
        let m = metrics.clone();
        let client = (|| kube::Client::try_default())
            .retry(REPORT_WRITE.builder())
            .notify(move |e, _| {
                tracing::error!(error = %e, "no Kubernetes client; reports are kept locally (GET /v1/report on the agent socket) until one works");
                m.write_failed("no_client");
            })
            .await;
        match client {
            Ok(client) => writer::run(client, target, rx, metrics).await,
            Err(e) => tracing::error!(error = %e, "no Kubernetes client; giving up"),
        }
    })
}

/// Starts relaying the operator's directives from this pod's report
/// (`status.directives`) to the answer; none until a client works.
pub fn start_directives(
    args: &Args,
    pod_name: &str,
) -> watch::Receiver<Vec<memprof_api::agent::Directive>> {
    let (tx, rx) = watch::channel(Vec::new());
    let (namespace, name) = (args.namespace.clone(), pod_name.to_string());
    tokio::spawn(async move {
        // The writer says it when there is no client; here it only waits.
        let client = (|| kube::Client::try_default())
            .retry(REPORT_WRITE.builder())
            .await;
        if let Ok(client) = client {
            crate::directives::run(client, namespace, name, tx).await;
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use prometheus_client::registry::Registry;

    fn args(argv: &[&str]) -> Args {
        Args::try_parse_from(["memprof-sidecar"].iter().chain(argv)).expect("valid flags")
    }

    #[test]
    fn port_means_every_interface_and_wins_over_listen() {
        let a = args(&["--listen", "127.0.0.1:9000"]);
        assert_eq!(listen_addr(&a), "127.0.0.1:9000".parse().unwrap());
        let a = args(&["--listen", "127.0.0.1:9000", "--port", "9500"]);
        assert_eq!(listen_addr(&a), "0.0.0.0:9500".parse().unwrap());
    }

    #[tokio::test]
    async fn a_taken_port_is_counted_and_reported_not_fatal() {
        let taken = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = taken.local_addr().unwrap();
        let metrics = Metrics::new(&mut Registry::default());
        let c = bind_tcp(addr, &metrics).await.unwrap_err();
        assert_eq!(metrics.listen_errors.get(), 1);
        assert_eq!(
            (c.type_.as_str(), c.is_true(), c.reason.as_str()),
            (ENDPOINTS_CONDITION, false, "ListenFailed")
        );
        assert!(c.message.contains("memprof.dev/port"), "{}", c.message);
    }

    #[test]
    fn a_socket_that_cannot_be_served_is_a_condition_not_a_failure() {
        let metrics = Metrics::new(&mut Registry::default());
        let a = args(&["--agent-socket", "/nonexistent/memprof/agent.sock"]);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let c = rt
            .block_on(async { open_socket(&a, &metrics) })
            .map(|_| ())
            .unwrap_err();
        assert_eq!(
            (c.type_.as_str(), c.is_true(), c.reason.as_str()),
            (AGENT_SOCKET_CONDITION, false, "SocketFailed")
        );
        assert_eq!(metrics.listen_errors.get(), 1);
        assert!(rt
            .block_on(async { open_socket(&args(&[]), &metrics) })
            .unwrap()
            .is_none());
    }
}
