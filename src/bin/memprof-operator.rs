//! `memprof-operator`: flags and wiring only; the operator lives in `memprof::operator`.

use anyhow::Context as _;
use clap::Parser;
use futures::FutureExt;
use memprof::operator::{self, leader, Elector, LeaderOptions, Metrics, Options};
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Rolls MemoryReports up into one MemoryProfile per annotated Job.
#[derive(Debug, Parser)]
#[command(
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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    if cli.log_json {
        logs.json().init();
    } else {
        logs.init();
    }

    let client = kube::Client::try_default()
        .await
        .context("cannot configure a Kubernetes client: set KUBECONFIG or run in a pod")?;
    let mut registry = Registry::with_prefix("memprof");
    let metrics = Metrics::register(&mut registry);
    let remediation_metrics = memprof::remediation::Metrics::register(&mut registry);
    let listener = tokio::net::TcpListener::bind(cli.metrics_addr)
        .await
        .with_context(|| format!("cannot listen on --metrics-addr {}", cli.metrics_addr))?;
    tracing::info!(addr = %cli.metrics_addr, "serving /metrics and /healthz");

    let shutdown = shutdown_signal().boxed().shared();
    let server = tokio::spawn(operator::serve(
        listener,
        Arc::new(registry),
        shutdown.clone(),
    ));
    // The webhook serves on every replica (admission must not wait for an
    // election); remediation has its own Lease, so it acts from one replica.
    let webhook = {
        let (client, opts, shutdown) = (client.clone(), cli.webhook.clone(), shutdown.clone());
        tokio::spawn(async move {
            let res = memprof::webhook::run(client, opts, shutdown).await;
            if let Err(e) = &res {
                // Injection is best effort (failurePolicy Ignore): say so now, keep profiling.
                tracing::error!(error = %e, "the admission webhook stopped; pods are no longer injected");
            }
            res
        })
    };
    let remediation = tokio::spawn(memprof::remediation::run(
        client.clone(),
        cli.operator.namespace.clone(),
        cli.remediation.clone(),
        remediation_metrics,
        shutdown.clone(),
    ));
    if cli.leader.leader_elect {
        let identity = cli
            .operator
            .instance
            .clone()
            .unwrap_or_else(leader::default_identity);
        let elector = Elector::new(
            client.clone(),
            &cli.leader.leader_election_namespace,
            &cli.leader.leader_election_lease,
            &identity,
            Duration::from_secs(cli.leader.lease_duration_seconds.into()),
        );
        let opts = &cli.operator;
        leader::run_elected(elector, shutdown, |stop| {
            operator::run(client, opts, metrics, stop)
        })
        .await?;
    } else {
        operator::run(client, &cli.operator, metrics, shutdown).await?;
    }
    // On lost leadership the `?` above exits at once; the server dies with the process.
    remediation
        .await
        .context("the remediation controller panicked")??;
    webhook.await.context("the webhook task panicked")??;
    server.await.context("the metrics server panicked")?;
    Ok(())
}
