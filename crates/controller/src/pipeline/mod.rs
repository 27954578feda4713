//! The memprof operator's one controller: one set of watches, one work
//! queue keyed by Job (namespace and name), one pipeline per Job, one status
//! writer. Where a report goes, in order:
//!
//! 1. **watch** (`watch.rs`): the sidecar's MemoryReport arrives on the one
//!    report watch, slimmed on the way into the cache (timeline and
//!    managedFields dropped); its label names the Job, whose key is queued
//!    (`crate::queue`: first in, first out, at most once, never two
//!    reconciles of one Job at a time).
//! 2. **fetch** (`reconcile.rs`): a worker takes the key; the Job, its
//!    profile, pods and reports come from the caches (no API call).
//! 3. **screen** (`operator/trust.rs`): only a report of a pod the Job's
//!    controller made counts; the others are named in `ReportsValid`.
//! 4. **build** (`rollup_stage.rs`): the roll-up (`memprof_analysis`,
//!    `operator/reconcile.rs`) gives the analysis part of the status, the
//!    Events that announce it and the Job's annotations; all are handed to
//!    the status writer (`crate::status`), which writes them, spaced, in
//!    its own time. The profile itself is created here when missing.
//! 5. **decide** (`remediation_stage.rs`): GPU OOMs are detected and the
//!    RemediationPolicies evaluated on the same fetched data; a decision is
//!    handed to a remediation task (`remediation/execute.rs`), which records
//!    it through the status writer, waits until it is written, then acts.
//! 6. **apply**: the status writer's workers write the status and the
//!    annotations; nothing in a reconcile waits on them.
//!
//! A JobSet's child Jobs roll up under their JobSet (`workloads.rs`); a
//! profiled PyTorchJob has watches of its own, when the kind is served
//! (`pytorch_watch.rs`), and rolls up under its name's key (`pytorchjobs.rs`).
//!
//! Only the leader runs this (one Lease, `operator/leader.rs`, when
//! `--leader-elect`). Everything that must survive a restart is in the
//! profile's status; what this process keeps per Job (`state.rs`) is a
//! cache of decisions already announced.

mod dispatch;
mod namesake_wait;
mod namesakes;
mod pytorch_watch;
mod pytorchjobs;
mod reconcile;
mod remediation_stage;
mod rollup_stage;
mod rollups;
mod slim;
mod state;
mod tracked;
mod watch;
mod workload_index;
mod workload_ooms;
mod workload_ranks;
mod workload_refresh;
mod workloads;

use crate::key::JobKey;
use crate::operator::{self, Metrics};
use crate::remediation::{self, Executor};
use crate::status::{StatusWriter, WriterOptions};
use futures::future::{BoxFuture, Shared};
use futures::{FutureExt, StreamExt};
use kube::runtime::events::{Recorder, Reporter};
use kube::Client;
use memprof_api::OPERATOR_MANAGER;
use state::Context;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tracing::info;

/// What the controller runs with: the flags and the metrics.
#[derive(Clone)]
pub struct Setup {
    /// The operator's flags.
    pub options: operator::Options,
    /// Remediation's flags.
    pub remediation: remediation::Options,
    /// The operator's metrics.
    pub metrics: Arc<Metrics>,
    /// Remediation's metrics.
    pub remediation_metrics: Arc<remediation::Metrics>,
}

impl Setup {
    /// Defaults for one namespace, metrics registered nowhere (tests, examples).
    pub fn for_namespace(namespace: &str) -> Self {
        Setup {
            options: operator::Options::for_namespace(namespace),
            remediation: remediation::Options::default(),
            metrics: Metrics::unregistered(),
            remediation_metrics: remediation::Metrics::unregistered(),
        }
    }
}

/// A shutdown signal every task can wait on.
type Stop = Shared<BoxFuture<'static, ()>>;

/// A CRD this controller watches is not served; each error says which and
/// how to install it.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// MemoryProfile or MemoryReport.
    #[error(transparent)]
    Profiles(#[from] operator::Error),
    /// RemediationPolicy, with remediation on.
    #[error(transparent)]
    Remediation(#[from] remediation::Error),
}

/// Checks that the CRDs this controller watches are served.
pub async fn check(client: &Client, setup: &Setup) -> Result<(), CheckError> {
    let ns = &setup.options.namespace;
    operator::check_crds(client, ns).await?;
    if setup.remediation.enabled {
        remediation::check(client, ns).await?;
    }
    Ok(())
}

/// Runs the controller until `shutdown` resolves.
pub async fn run(
    client: Client,
    setup: Setup,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> operator::Result<()> {
    operator::check_crds(&client, &setup.options.namespace).await?;
    let stop: Stop = shutdown.boxed().shared();
    let opts = &setup.options;
    let (caches, changes) = watch::start(&client, &setup);
    let (pytorch, pytorch_changes) = pytorch_watch::start(&client, &opts.namespace);
    let changes = futures::stream::select(changes, pytorch_changes).boxed();
    let recorder = Recorder::new(client.clone(), reporter(opts));
    let writer = StatusWriter::new(
        client.clone(),
        recorder,
        setup.metrics.clone(),
        WriterOptions {
            min_interval: Duration::from_millis(opts.min_write_interval_ms),
            workers: usize::from(opts.concurrency.max(1)),
            mode: opts.status_write,
        },
    );
    let executor = setup.remediation.enabled.then(|| {
        let plans = setup.remediation.plan_namespace(&opts.namespace);
        Arc::new(Executor::new(
            client.clone(),
            &plans,
            writer.clone(),
            caches.policies.clone(),
            setup.remediation_metrics.clone(),
        ))
    });
    let ctx = Arc::new(Context::new(
        client,
        setup.clone(),
        (caches, pytorch),
        writer.clone(),
        executor,
        Arc::new(JobKey::fair_queue()),
    ));
    if let Some(exec) = &ctx.executor {
        // Weak: the context holds the executor.
        let counted: Arc<dyn crate::remediation::CountedReports> = ctx.clone();
        exec.set_counted(Arc::downgrade(&counted));
    }
    let _job_gauges = setup.metrics.jobs.publish(ctx.caches.profiles.clone());
    info!(namespace = %if opts.namespace.is_empty() { "*" } else { &opts.namespace }, "memprof controller started");
    serve(ctx, writer, changes, stop).await;
    info!("memprof controller stopped");
    Ok(())
}

fn reporter(opts: &operator::Options) -> Reporter {
    Reporter {
        controller: OPERATOR_MANAGER.into(),
        instance: opts
            .instance
            .clone()
            .or_else(|| Reporter::from(OPERATOR_MANAGER).instance),
    }
}

/// Runs the dispatcher, the workers, the status writer and the policy
/// status until `stop`, then winds them down in the order that lets
/// running work finish: no new work, running remediations finish (their
/// edits still get written), then the writer stops.
async fn serve(ctx: Arc<Context>, writer: StatusWriter, changes: watch::Changes, stop: Stop) {
    let (writer_stop, writer_stopped) = tokio::sync::oneshot::channel::<()>();
    let writing = tokio::spawn(writer.run(writer_stopped.map(|_| ())));
    let dispatching = tokio::spawn(dispatch::dispatch(ctx.clone(), changes, stop.clone()));
    let workers: Vec<_> = (0..ctx.setup.options.concurrency.max(1))
        .map(|_| tokio::spawn(reconcile::worker(ctx.clone())))
        .collect();
    let policy_status = ctx.executor.clone().map(|exec| {
        let ready = ctx.clone();
        tokio::spawn(remediation::policy_status_task(
            exec,
            ctx.caches.jobs.clone(),
            async move { ready.caches_ready().await.is_ok() },
            stop.clone(),
        ))
    });
    stop.await;
    ctx.queue.close();
    let _ = dispatching.await;
    for w in workers {
        let _ = w.await;
    }
    ctx.wait_for_remediations().await;
    let _ = writer_stop.send(());
    let _ = writing.await;
    if let Some(p) = policy_status {
        let _ = p.await;
    }
}

/// The keys of every profiled Job in `namespace` that the caches know (a
/// policy changed there: each is evaluated again).
fn jobs_in(ctx: &Context, namespace: &str) -> Vec<JobKey> {
    ctx.caches
        .jobs
        .state()
        .iter()
        .filter(|j| j.metadata.namespace.as_deref() == Some(namespace))
        .filter_map(|j| JobKey::of(j.as_ref()))
        .collect()
}
