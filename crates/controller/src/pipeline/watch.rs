//! The watches: one per kind, each reflected into a cache that keeps only
//! what the pipeline reads (`slim.rs`), and one stream of changes that the
//! dispatcher turns into queued Job keys.

use super::slim;
use super::Setup;
use crate::key::JobKey;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::NamespaceResourceScope;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Resource};
use memprof_api::admission::LABEL_MANAGED;
use memprof_api::{MemoryProfile, MemoryReport, RemediationPolicy, LABEL_JOB};
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::sync::Arc;
use tokio::sync::watch;
use tracing::warn;

pub(super) use super::slim::LABEL_JOB_NAME;

/// Reports per page of the reports' list: what a relist holds at once
/// before slimming is this many of the largest report the CRD admits.
const REPORT_PAGE: u32 = 50;

/// The caches the pipeline reads.
pub(super) struct Caches {
    pub jobs: Store<Job>,
    pub profiles: Store<MemoryProfile>,
    pub reports: Store<MemoryReport>,
    pub pods: Store<Pod>,
    pub policies: Store<RemediationPolicy>,
    /// One per cache: true once its first full list is in.
    pub ready: Vec<watch::Receiver<bool>>,
}

/// What changed, as far as queueing is concerned.
pub(super) enum Change {
    /// The Job itself changed.
    Job(JobKey),
    /// A pod labelled with the Job's name changed (by name), or a
    /// PyTorchJob's pod (`pytorch_watch.rs`: the key is the PyTorchJob's).
    Pod(JobKey, String),
    /// The profile as the API server now holds it, or gone.
    Profile(JobKey, Option<Arc<MemoryProfile>>),
    /// A policy of this namespace changed: every Job there is evaluated again.
    Policies(String),
    /// A report claiming the Job changed or went (by name).
    Report(JobKey, String),
    /// A workload above Jobs (a PyTorchJob) changed: its key (`pytorch_watch.rs`).
    Workload(JobKey),
}

impl Change {
    /// The namespace it happened in.
    pub(super) fn namespace(&self) -> &str {
        match self {
            Change::Job(k)
            | Change::Pod(k, _)
            | Change::Profile(k, _)
            | Change::Report(k, _)
            | Change::Workload(k) => &k.namespace,
            Change::Policies(ns) => ns,
        }
    }
}

/// Every watch's changes, merged.
pub(super) type Changes = BoxStream<'static, Change>;

fn scoped<K>(client: &Client, namespace: &str) -> Api<K>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>,
{
    if namespace.is_empty() {
        Api::all(client.clone())
    } else {
        Api::namespaced(client.clone(), namespace)
    }
}

/// One watch: listed with a consistent read (a list served from a lagging
/// API-server cache at startup would roll up stale reports and announce
/// changes that did not happen), slimmed by `slim`, reflected into a store,
/// marking `ready` once the first list is in.
fn reflected<K>(
    api: Api<K>,
    config: watcher::Config,
    slim: impl FnMut(&mut K) + Send + 'static,
    ready: watch::Sender<bool>,
) -> (
    Store<K>,
    impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send,
)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let (store, writer) = reflector::store();
    let stream = watcher(api, config)
        .default_backoff()
        .modify(slim)
        .reflect(writer)
        .inspect(move |ev| {
            if let Ok(watcher::Event::InitDone) = ev {
                ready.send_replace(true);
            }
        });
    (store, stream)
}

/// The objects an event is about (applied, listed or deleted), errors logged.
fn objects<K: Send + 'static>(
    events: impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static,
    kind: &'static str,
) -> BoxStream<'static, (K, bool)> {
    events
        .filter_map(move |ev| async move {
            match ev {
                Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => Some((o, true)),
                Ok(watcher::Event::Delete(o)) => Some((o, false)),
                Ok(_) => None,
                Err(error) => {
                    warn!(kind, %error, "watch error; the watch retries with backoff");
                    None
                }
            }
        })
        .boxed()
}

/// The reports' watch: small pages (a report is up to ~100 KiB as listed,
/// before slimming), each report judged by its writer mark as it enters the
/// cache, listed only once the key is loaded so that one no pod vouched for
/// is never kept whole.
fn reports(
    client: &Client,
    setup: &Setup,
    ready: watch::Sender<bool>,
) -> (
    Store<MemoryReport>,
    impl Stream<Item = watcher::Result<watcher::Event<MemoryReport>>> + Send,
) {
    let ns = setup.options.namespace.as_str();
    let config = watcher::Config::default()
        .labels(LABEL_JOB)
        .page_size(REPORT_PAGE);
    let keys = setup.options.admission.clone();
    let slim_report = move |r: &mut MemoryReport| slim::report(r, &keys.ring());
    let (store, events) = reflected(scoped(client, ns), config, slim_report, ready);
    let gate = setup.options.admission.clone();
    let events = futures::stream::once(async move {
        gate.loaded().await;
        events
    })
    .flatten();
    (store, events)
}

/// Starts the watches of `setup`'s namespace (all when empty).
pub(super) fn start(client: &Client, setup: &Setup) -> (Caches, Changes) {
    let ns = setup.options.namespace.as_str();
    let (ready, ready_rx): (Vec<_>, Vec<_>) = (0..5).map(|_| watch::channel(false)).unzip();
    let mut ready = ready.into_iter();
    let mut next_ready = || ready.next().expect("one readiness channel per watch");
    let cfg = watcher::Config::default;
    // Only what memprof manages (contract D: the webhook stamps the label on
    // profiled Jobs, their templates and the pods it admits). A filter for
    // cost, never proof: trust.rs decides what counts.
    let managed = format!("{LABEL_MANAGED}=true");
    let job_cfg = cfg().labels(&managed);
    let (jobs, job_events) = reflected(scoped(client, ns), job_cfg, slim::job, next_ready());
    let profile_cfg = cfg().labels(LABEL_JOB);
    let (profiles, profile_events) =
        reflected(scoped(client, ns), profile_cfg, slim::profile, next_ready());
    let (reports, report_events) = reports(client, setup, next_ready());
    let pod_cfg = cfg().labels(&format!("{LABEL_JOB_NAME},{managed}"));
    let (pods, pod_events) = reflected(scoped(client, ns), pod_cfg, slim::pod, next_ready());
    let (policies, policy_events) =
        reflected(scoped(client, ns), cfg(), slim::policy, next_ready());
    let changes = futures::stream::select_all([
        objects(job_events, "Job")
            .filter_map(|(j, _)| async move { JobKey::of(&j).map(Change::Job) })
            .boxed(),
        objects(profile_events, "MemoryProfile")
            .filter_map(|(p, live)| async move {
                let key = JobKey::of(&p)?;
                Some(Change::Profile(key, live.then(|| Arc::new(p))))
            })
            .boxed(),
        objects(report_events, "MemoryReport")
            .filter_map(|(r, _)| async move {
                let key = JobKey::from_label(&r, LABEL_JOB)?;
                Some(Change::Report(key, r.metadata.name?))
            })
            .boxed(),
        objects(pod_events, "Pod")
            .filter_map(|(p, _)| async move {
                let key = JobKey::from_label(&p, LABEL_JOB_NAME)?;
                Some(Change::Pod(key, p.metadata.name?))
            })
            .boxed(),
        objects(policy_events, "RemediationPolicy")
            .filter_map(|(p, _)| async move { p.metadata.namespace.map(Change::Policies) })
            .boxed(),
    ])
    .boxed();
    let caches = Caches {
        jobs,
        profiles,
        reports,
        pods,
        policies,
        ready: ready_rx,
    };
    (caches, changes)
}
