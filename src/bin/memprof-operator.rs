//! `memprof-operator`: flags and wiring only; the operator lives in `memprof::operator`.

use anyhow::Context as _;
use clap::Parser;
use futures::FutureExt;
use memprof::operator::leader::{self, Stop};
use memprof::operator::{self, supervise, Elector, Health, LeaderOptions, Metrics, Options};
use memprof::pipeline::{self, Setup};
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Rolls MemoryReports up into one MemoryProfile per annotated Job and carries out RemediationPolicies.
#[derive(Debug, Parser)]
#[command(
    name = "memprof-operator",
    version,
    about = "Rolls MemoryReports up into one MemoryProfile per annotated Job"
)]
struct Cli {
    /// Address of the `/metrics` and `/healthz` endpoints.
    #[arg(long, env = "MEMPROF_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    metrics_addr: SocketAddr,

    /// Log as JSON lines (for log collectors) instead of text.
    #[arg(long, env = "MEMPROF_LOG_JSON", default_value_t = false)]
    log_json: bool,

    /// Print the metric families this binary registers (no samples) and exit:
    /// what the chart's dashboard and alert tests check their queries against.
    #[arg(long, hide = true)]
    print_metrics: bool,

    #[command(flatten)]
    operator: Options,

    #[command(flatten)]
    leader: LeaderOptions,

    #[command(flatten)]
    webhook: memprof::webhook::WebhookOptions,

    #[command(flatten)]
    remediation: memprof::remediation::Options,
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing a SIGTERM handler cannot fail on Unix");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term.recv() => {},
    }
    tracing::info!("shutdown requested");
}

/// How long the tasks get to stop after SIGTERM (the pod's default grace period is 30 s).
const STOP_GRACE: Duration = Duration::from_secs(25);

fn init_logs(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    if json {
        logs.json().init();
    } else {
        logs.init();
    }
}

/// The families `main` registers, each labelled one given a child (a family
/// without children is not encoded), as `# HELP`/`# TYPE` lines.
fn describe_metrics() -> String {
    let mut registry = Registry::with_prefix("memprof");
    let metrics = Metrics::register(&mut registry);
    let remediation = memprof::remediation::Metrics::register(&mut registry);
    let webhook = memprof::webhook::server::ServerMetrics::register(&mut registry);
    metrics.touch_families();
    let _ = remediation
        .records
        .get_or_create(&memprof::remediation::PhaseLabels {
            phase: String::new(),
        });
    let _ = remediation
        .reconcile_errors
        .get_or_create(&memprof::remediation::StepLabels { step: "" });
    let _ = webhook
        .connections_closed
        .get_or_create(&memprof::webhook::server::CloseLabels { reason: "" });
    let _ = webhook
        .requests_rejected
        .get_or_create(&memprof::webhook::server::RejectLabels { reason: "" });
    operator::metrics::descriptors(&operator::metrics::encode(&registry))
}

/// Every long-lived task runs under `operator::supervise`: one that ends
/// before shutdown is logged, counted
/// (`memprof_operator_task_failures_total{task}`), makes `/readyz` answer
/// 503 and is started again with backoff. Nothing ends the process but a
/// signal (or a bad flag at start).
#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut cli = Cli::parse();
    let keys = configure(&mut cli)?;
    if cli.print_metrics {
        print!("{}", describe_metrics());
        return Ok(());
    }
    init_logs(cli.log_json);
    // A webhook without an image it can inject would break every profiled pod.
    cli.webhook.check()?;

    let client = connect().await?;
    let mut registry = Registry::with_prefix("memprof");
    let metrics = Metrics::register(&mut registry);
    let remediation_metrics = memprof::remediation::Metrics::register(&mut registry);
    let webhook_metrics = memprof::webhook::server::ServerMetrics::register(&mut registry);
    // Bound here, not in the task: a wrong --metrics-addr is a mistake to exit on.
    let listener = tokio::net::TcpListener::bind(cli.metrics_addr)
        .await
        .with_context(|| format!("cannot listen on --metrics-addr {}", cli.metrics_addr))?;
    tracing::info!(addr = %cli.metrics_addr, "serving /metrics, /healthz and /readyz");

    let shutdown: Stop = shutdown_signal().boxed().shared();
    let health = Health::new();
    let spawn = |task: &'static str, start| {
        let failures = metrics.task_failures.clone();
        let (health, shutdown) = (health.clone(), shutdown.clone());
        tokio::spawn(supervise(task, health, failures, shutdown, start))
    };
    let registry = Arc::new(registry);
    let tasks = vec![
        spawn(
            "metrics",
            metrics_task(listener, cli.metrics_addr, registry, &health, &shutdown),
        ),
        // Every replica keeps the key fresh: the webhook signs on all of them.
        spawn("admission-keys", keys_task(&client, &cli, &keys, &shutdown)),
        // The webhook serves on every replica: admission must not wait for an election.
        spawn(
            "webhook",
            webhook_task(&client, &cli, webhook_metrics, &shutdown),
        ),
        // The one controller (roll-up and remediation), while this replica leads.
        spawn(
            "operator",
            operator_task(&client, &cli, &metrics, remediation_metrics, &shutdown),
        ),
    ];

    shutdown.clone().await;
    let stopped = futures::future::join_all(tasks);
    if tokio::time::timeout(STOP_GRACE, stopped).await.is_err() {
        tracing::warn!(grace = ?STOP_GRACE, "some tasks did not stop in time; exiting anyway");
    }
    Ok(())
}

/// What the flags imply beyond themselves: the cluster's default
/// thresholds parsed for the roll-up, and one key ring shared by the webhook
/// (signs admission marks) and the controller (verifies them), loaded by the
/// admission-keys task.
fn configure(cli: &mut Cli) -> anyhow::Result<memprof::api::admission::Keys> {
    // Checked by the flag's parser; the roll-up shows them in each status.
    cli.operator.default_thresholds =
        memprof::api::thresholds::parse_cluster(&cli.webhook.default_thresholds)?;
    let keys = memprof::api::admission::Keys::default();
    cli.operator.admission = keys.clone();
    Ok(keys)
}

/// The Kubernetes client. No client-wide read timeout: kube's client reads
/// watch streams through the same connections, and a quiet watch sends
/// nothing for minutes (the watcher has its own idle timeout of 290 s plus a
/// margin). Requests that must not hang bound themselves instead: every
/// Lease request ends by the renew deadline (`leader.rs`), and work that is
/// stuck in a request when leadership ends is dropped before a standby may
/// take over.
async fn connect() -> anyhow::Result<kube::Client> {
    kube::Client::try_default()
        .await
        .context("cannot configure a Kubernetes client: set KUBECONFIG or run in a pod")
}

/// A boxed start of a supervised task (one type for all tasks).
type Start = Box<
    dyn FnMut(operator::Ready) -> futures::future::BoxFuture<'static, anyhow::Result<()>> + Send,
>;

fn metrics_task(
    listener: tokio::net::TcpListener,
    addr: SocketAddr,
    registry: Arc<Registry>,
    health: &Arc<Health>,
    shutdown: &Stop,
) -> Start {
    let (health, shutdown) = (health.clone(), shutdown.clone());
    let mut first = Some(listener);
    Box::new(move |ready| {
        let (listener, registry, health, shutdown) = (
            first.take(),
            registry.clone(),
            health.clone(),
            shutdown.clone(),
        );
        serve_metrics(listener, addr, registry, health, shutdown, ready).boxed()
    })
}

async fn serve_metrics(
    listener: Option<tokio::net::TcpListener>,
    addr: SocketAddr,
    registry: Arc<Registry>,
    health: Arc<Health>,
    shutdown: Stop,
    ready: operator::Ready,
) -> anyhow::Result<()> {
    let listener = match listener {
        Some(l) => l,
        None => tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on --metrics-addr {addr}: {e}"))?,
    };
    ready.set();
    // Spawned, not awaited in place: a panic in the server is an error of
    // this task, not of the operator's process.
    tokio::spawn(operator::serve(listener, registry, health, shutdown))
        .await
        .map_err(|e| anyhow::anyhow!("the metrics server panicked: {e}"))
}

/// Loads the admission-mark key from its Secret and keeps it fresh; ready
/// once loaded.
fn keys_task(
    client: &kube::Client,
    cli: &Cli,
    keys: &memprof::api::admission::Keys,
    shutdown: &Stop,
) -> Start {
    let (client, cfg, keys) = (client.clone(), cli.webhook.key_config(), keys.clone());
    let shutdown = shutdown.clone();
    Box::new(move |ready| {
        let (client, cfg, keys) = (client.clone(), cfg.clone(), keys.clone());
        let run = memprof::webhook::keys::maintain(client, cfg, keys.clone(), shutdown.clone());
        async move {
            let loaded = async {
                keys.loaded().await;
                ready.set();
                std::future::pending::<()>().await
            };
            tokio::select! {
                () = run => Ok(()),
                () = loaded => Ok(()),
            }
        }
        .boxed()
    })
}

fn webhook_task(
    client: &kube::Client,
    cli: &Cli,
    metrics: Arc<memprof::webhook::server::ServerMetrics>,
    shutdown: &Stop,
) -> Start {
    let (client, opts, shutdown) = (client.clone(), cli.webhook.clone(), shutdown.clone());
    let keys = cli.operator.admission.clone();
    Box::new(move |ready| {
        let (client, opts, shutdown) = (client.clone(), opts.clone(), shutdown.clone());
        let (metrics, keys) = (metrics.clone(), keys.clone());
        async move {
            // Its start (certificate, API server version) retries by itself.
            ready.set();
            memprof::webhook::run(client, opts, keys, metrics, shutdown)
                .await
                .map_err(|e| {
                    anyhow::anyhow!("admission webhook (pods are not injected meanwhile): {e}")
                })
        }
        .boxed()
    })
}

/// The controller, while this replica leads when `--leader-elect`.
fn operator_task(
    client: &kube::Client,
    cli: &Cli,
    metrics: &Arc<Metrics>,
    remediation_metrics: Arc<memprof::remediation::Metrics>,
    shutdown: &Stop,
) -> Start {
    let setup = Setup {
        options: cli.operator.clone(),
        remediation: cli.remediation.clone(),
        metrics: metrics.clone(),
        remediation_metrics,
    };
    let (client, shutdown) = (client.clone(), shutdown.clone());
    let election = cli.leader.leader_elect.then(|| {
        let identity = setup
            .options
            .instance
            .clone()
            .unwrap_or_else(leader::default_identity);
        (cli.leader.clone(), identity)
    });
    Box::new(move |ready| {
        let (client, setup, shutdown) = (client.clone(), setup.clone(), shutdown.clone());
        control(client, setup, election.clone(), shutdown, ready).boxed()
    })
}

async fn control(
    client: kube::Client,
    setup: Setup,
    election: Option<(LeaderOptions, String)>,
    shutdown: Stop,
    ready: operator::Ready,
) -> anyhow::Result<()> {
    pipeline::check(&client, &setup).await?;
    // Until the key is loaded no pod verifies: rolling up would refuse
    // every report (and announce it).
    setup.options.admission.loaded().await;
    ready.set();
    let gauge = setup.metrics.leader.clone();
    let Some((flags, identity)) = election else {
        gauge.set(1);
        let ran = pipeline::run(client, setup, shutdown).await;
        gauge.set(0);
        return Ok(ran?);
    };
    let elector = Elector::new(
        client.clone(),
        &flags.leader_election_namespace,
        &flags.leader_election_lease,
        &identity,
        Duration::from_secs(flags.lease_duration_seconds.into()),
    );
    leader::lead(elector, shutdown, gauge, move |stop| {
        let (client, setup) = (client.clone(), setup.clone());
        async move { pipeline::run(client, setup, stop).await }
    })
    .await?;
    Ok(())
}

#[cfg(test)]
mod name_tests {
    use clap::CommandFactory;

    /// `memprof-operator --version` names this binary, not the package.
    #[test]
    fn version_names_the_operator_binary() {
        assert_eq!(super::Cli::command().get_name(), "memprof-operator");
    }
}
