//! The I/O half: watch caches, the kube-runtime Controller, and the writes
//! that `reconcile.rs` decided on. See the module docs in `mod.rs` for why
//! it is wired this way.

use super::metrics::{ReasonLabels, StepLabels};
use super::reconcile::slim_job;
use super::reconcile::{
    annotations_outdated, desired_status, expected_ranks, job_annotations, newly_rejected,
    profile_for_job, profile_is_stale, profile_outdated, profiling_enabled, rejected_in,
    rejection_event, risk_event, with_batch_fit, EventPlan, NamedReport, Screening,
    JOB_ANNOTATIONS,
};
use super::thresholds;
use super::trust::{screen, PodFacts};
use super::{Error, Metrics, Options, Result};
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::NamespaceResourceScope;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{
    Action, Config as ControllerConfig, Controller, Error as ControllerError,
};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Resource, ResourceExt};
use memprof_api::thresholds::{resolve as resolve_thresholds, ANNOTATION_THRESHOLDS};
use memprof_api::{MemoryProfile, MemoryReport, LABEL_JOB, OPERATOR_MANAGER};
use serde::de::DeserializeOwned;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Debug;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// Periodic re-check of a Job even without triggers (safety net, not the
/// mechanism: watches drive reconciles).
const RESYNC: Duration = Duration::from_secs(300);
/// First retry delay after a failed reconcile; doubles per failure up to `MAX_BACKOFF`.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(300);
const PROFILE_CRD: &str = "memoryprofiles.memprof.dev";
const REPORT_CRD: &str = "memoryreports.memprof.dev";

/// Checks that both memprof CRDs are served, in the scope the operator watches.
pub async fn check_crds(client: &Client, namespace: &str) -> Result<()> {
    check_crd::<MemoryProfile>(client, namespace, PROFILE_CRD).await?;
    check_crd::<MemoryReport>(client, namespace, REPORT_CRD).await
}

async fn check_crd<K>(client: &Client, namespace: &str, crd: &'static str) -> Result<()>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Debug,
{
    // A LIST needs no more RBAC than the watch does, unlike reading the CRD object.
    match scoped::<K>(client, namespace)
        .list_metadata(&ListParams::default().limit(1))
        .await
    {
        Ok(_) => Ok(()),
        // An unknown resource is a bare "404 page not found", not a NotFound Status.
        Err(kube::Error::Api(status)) if status.code == 404 => Err(Error::CrdMissing { crd }),
        Err(source) => Err(Error::CrdCheck { crd, source }),
    }
}

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

/// What one Job's reconciles remember between runs (lost on restart, by design:
/// everything that must survive a restart lives in the profile's status).
#[derive(Clone, Debug, Default)]
struct JobState {
    /// The profile as our last write returned it: fresher than the cache right after a write.
    profile: Option<Arc<MemoryProfile>>,
    /// Annotations we applied, with the Job's resourceVersion afterwards.
    annotations: Option<(u64, BTreeMap<String, String>)>,
    last_write: Option<Instant>,
    /// Rejected reports already announced with an Event.
    announced: BTreeSet<String>,
    /// Our annotations were removed after profiling was switched off.
    cleared: bool,
    failures: u32,
}

struct Context {
    client: Client,
    jobs: Store<Job>,
    profiles: Store<MemoryProfile>,
    reports: Store<MemoryReport>,
    /// Metadata of the Jobs' pods: whose reports are genuine (trust.rs).
    pods: Store<PartialObjectMeta<Pod>>,
    recorder: Recorder,
    metrics: Arc<Metrics>,
    min_write_interval: Duration,
    /// `--allowed-namespaces` (namespaced install).
    opts: Options,
    state: Mutex<HashMap<String, JobState>>,
    /// `Some(true)` once the profile and report caches hold a full list,
    /// `Some(false)` if they shut down first. Reconciles wait on this rather
    /// than on `Store::wait_until_ready`, which in kube-runtime 5.0 wakes only
    /// the last of several concurrent waiters (one oneshot waker): with two
    /// Jobs reconciled at startup, the other one hung forever.
    caches_ready: tokio::sync::watch::Receiver<Option<bool>>,
}

impl Context {
    fn load(&self, uid: &str) -> JobState {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.get(uid).cloned().unwrap_or_default()
    }

    fn save(&self, uid: &str, st: JobState) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.profile.is_none() && st.annotations.is_none() && !st.cleared && st.failures == 0 {
            state.remove(uid);
        } else {
            state.insert(uid.to_string(), st);
        }
        // Deleted Jobs trigger no reconcile; forget them once they pile up.
        if state.len() > 2 * self.jobs.len() + 64 {
            let live: BTreeSet<String> = self.jobs.state().iter().filter_map(|j| j.uid()).collect();
            state.retain(|uid, _| live.contains(uid));
        }
    }
}

/// Label the Job controller puts on a Job's pods (1.20 and later).
const LABEL_JOB_NAME: &str = "job-name";

fn resource_version(meta: &ObjectMeta) -> u64 {
    meta.resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn newest(cached: Arc<MemoryProfile>, written: Option<Arc<MemoryProfile>>) -> Arc<MemoryProfile> {
    match written {
        Some(w)
            if w.uid() == cached.uid()
                && resource_version(&w.metadata) > resource_version(&cached.metadata) =>
        {
            w
        }
        _ => cached,
    }
}

fn reference<K: Resource<DynamicType = ()>>(obj: &K) -> ObjectReference {
    ObjectReference {
        // The Recorder de-duplicates by reference: the version must not split a series.
        resource_version: None,
        ..obj.object_ref(&())
    }
}

/// Runs the operator until `shutdown` resolves: checks the CRDs, then
/// reconciles every Job in `opts.namespace` (all namespaces when empty).
pub async fn run(
    client: Client,
    opts: &Options,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<()> {
    check_crds(&client, &opts.namespace).await?;
    let ns = opts.namespace.as_str();

    // Initial lists are consistent reads (the default), not `any_semantic()`:
    // a list served from a lagging API-server cache at startup would roll up
    // stale reports and could announce a risk change that did not happen.
    let (jobs, jobs_writer) = reflector::store();
    let job_stream = watcher(scoped::<Job>(&client, ns), watcher::Config::default())
        .default_backoff()
        .modify(slim_job)
        .reflect(jobs_writer)
        .applied_objects();

    let (profiles, profiles_writer) = reflector::store();
    let profile_stream = watcher(
        scoped::<MemoryProfile>(&client, ns),
        watcher::Config::default().labels(LABEL_JOB),
    )
    .default_backoff()
    .modify(|p| {
        p.managed_fields_mut().clear();
        p.annotations_mut().clear();
    })
    .reflect(profiles_writer)
    .touched_objects();

    let (reports, reports_writer) = reflector::store();
    let report_stream = watcher(
        scoped::<MemoryReport>(&client, ns),
        watcher::Config::default().labels(LABEL_JOB),
    )
    .default_backoff()
    .modify(|r| {
        r.managed_fields_mut().clear();
        r.annotations_mut().clear();
        for gpu in &mut r.spec.gpus {
            gpu.timeline = Vec::new();
        }
    })
    .reflect(reports_writer)
    .touched_objects();

    // Only the pods' metadata (owner references, uid, creation time), and only
    // of pods a Job controller labelled: whose reports are genuine.
    let (pods, pods_writer) = reflector::store();
    let pod_api: Api<PartialObjectMeta<Pod>> = if ns.is_empty() {
        Api::all(client.clone())
    } else {
        Api::namespaced(client.clone(), ns)
    };
    let pod_stream = watcher(pod_api, watcher::Config::default().labels(LABEL_JOB_NAME))
        .default_backoff()
        .modify(|p| super::trust::slim_pod_annotations(&mut p.metadata))
        .reflect(pods_writer)
        .touched_objects();
    let pod_to_job = |pod: PartialObjectMeta<Pod>| {
        let namespace = pod.namespace().unwrap_or_default();
        pod.labels()
            .get(LABEL_JOB_NAME)
            .map(|job| ObjectRef::<Job>::new(job).within(&namespace))
    };
    let seen = metrics.clone();
    let report_to_job = move |report: MemoryReport| {
        seen.reports_seen.inc();
        let namespace = report.namespace().unwrap_or_default();
        report
            .labels()
            .get(LABEL_JOB)
            .map(|job| ObjectRef::<Job>::new(job).within(&namespace))
    };

    let reporter = Reporter {
        controller: OPERATOR_MANAGER.into(),
        instance: opts
            .instance
            .clone()
            .or_else(|| Reporter::from(OPERATOR_MANAGER).instance),
    };
    let (ready_tx, caches_ready) = tokio::sync::watch::channel(None);
    let (p, r, q) = (profiles.clone(), reports.clone(), pods.clone());
    // The only waiter on the stores' readiness (see `Context::caches_ready`);
    // ends when the caches are ready or torn down.
    tokio::spawn(async move {
        let ok = p.wait_until_ready().await.is_ok()
            && r.wait_until_ready().await.is_ok()
            && q.wait_until_ready().await.is_ok();
        let _ = ready_tx.send(Some(ok));
    });
    let ctx = Arc::new(Context {
        recorder: Recorder::new(client.clone(), reporter),
        client,
        jobs: jobs.clone(),
        profiles,
        reports,
        pods,
        metrics,
        min_write_interval: Duration::from_millis(opts.min_write_interval_ms),
        opts: opts.clone(),
        state: Mutex::default(),
        caches_ready,
    });
    // Per-Job gauges (memprof_job_*) from this cache, while this run lasts.
    let _job_gauges = ctx.metrics.jobs.publish(ctx.profiles.clone());
    info!(namespace = %if ns.is_empty() { "*" } else { ns }, "memprof operator started");
    Controller::for_stream(job_stream, jobs)
        .owns_stream(profile_stream)
        .watches_stream(report_stream, report_to_job)
        .watches_stream(pod_stream, pod_to_job)
        .with_config(ControllerConfig::default().concurrency(opts.concurrency))
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            match res {
                Ok((obj, _)) => debug!(job = %obj, "reconciled"),
                // error_policy already logged the reconciler's own errors.
                Err(ControllerError::ReconcilerFailed(..)) => {}
                // A report or profile of a Job that is gone: expected after a deletion.
                Err(ControllerError::ObjectNotFound(obj)) => debug!(job = %obj, "Job is gone"),
                Err(e) => warn!(error = %e, "controller: watch or queue error, retrying"),
            }
        })
        .await;
    info!("memprof operator stopped");
    Ok(())
}

#[tracing::instrument(skip_all, fields(job = %job.name_any(), namespace = job.namespace().unwrap_or_default()))]
async fn reconcile(job: Arc<Job>, ctx: Arc<Context>) -> Result<Action> {
    let started = Instant::now();
    ctx.metrics.reconciles.inc();
    let uid = job.uid().ok_or(Error::MalformedJob {
        field: "metadata.uid",
    })?;
    let mut st = ctx.load(&uid);
    let res = reconcile_job(&job, &ctx, &mut st).await;
    if res.is_ok() {
        st.failures = 0;
    }
    ctx.save(&uid, st);
    ctx.metrics
        .reconcile_duration
        .observe(started.elapsed().as_secs_f64());
    res
}

fn error_policy(job: Arc<Job>, err: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics
        .reconcile_errors
        .get_or_create(&StepLabels { step: err.step() })
        .inc();
    let failures = match job.uid() {
        Some(uid) => {
            let mut st = ctx.load(&uid);
            st.failures = st.failures.saturating_add(1);
            let n = st.failures;
            ctx.save(&uid, st);
            n
        }
        None => 1,
    };
    let delay = FIRST_BACKOFF
        .saturating_mul(1 << failures.saturating_sub(1).min(16))
        .min(MAX_BACKOFF);
    warn!(job = %job.name_any(), error = %err, failures, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

async fn reconcile_job(job: &Job, ctx: &Context, st: &mut JobState) -> Result<Action> {
    let namespace = job.namespace().ok_or(Error::MalformedJob {
        field: "metadata.namespace",
    })?;
    let name = job.metadata.name.clone().ok_or(Error::MalformedJob {
        field: "metadata.name",
    })?;
    let uid = job.uid().unwrap_or_default();
    // Until both caches hold a full list, "no profile" or "no reports" would
    // be a lie, and a restarted operator would announce risk changes again.
    let mut ready = ctx.caches_ready.clone();
    match ready.wait_for(Option::is_some).await.map(|r| *r) {
        Ok(Some(true)) => {}
        _ => return Err(Error::CacheClosed),
    }

    let profiles: Api<MemoryProfile> = Api::namespaced(ctx.client.clone(), &namespace);
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &namespace);
    let cached = ctx.profiles.get(&ObjectRef::new(&name).within(&namespace));
    let apply = PatchParams::apply(OPERATOR_MANAGER).force();

    if !ctx.opts.allows(&namespace) {
        // Namespaced install: no write verbs here, so nothing to do either.
        return Ok(Action::await_change());
    }
    if job.metadata.deletion_timestamp.is_some() {
        // The garbage collector is removing the profile with the Job: recreating
        // it now would only give the collector another dependent to wait for.
        return Ok(Action::await_change());
    }
    if !profiling_enabled(job) {
        return switch_off(job, ctx, st, &profiles, &jobs, cached).await;
    }
    st.cleared = false;

    let recreated = job
        .annotations()
        .contains_key(memprof_api::ANNOTATION_REMEDIATION);
    if let Some(stale) = cached
        .as_deref()
        .filter(|p| profile_is_stale(p, &name, &uid, recreated))
    {
        delete_profile(&profiles, stale).await?;
        info!("deleted the MemoryProfile of an earlier Job with this name");
        st.profile = None;
        return Ok(Action::requeue(Duration::from_secs(1)));
    }

    // 1. The profile exists, with our spec and owner reference.
    let desired = profile_for_job(job, &namespace, &name, &uid);
    let profile = match cached.map(|c| newest(c, st.profile.take())) {
        Some(p) if !profile_outdated(Some(&p), &desired) => p,
        _ => {
            // First sight of this Job (or its profile drifted): its sidecars
            // run under the pod template's service account and need leave to
            // write their MemoryReports. Idempotent; failing it must not stop
            // profiling (the sidecars then say they are forbidden).
            let sa = job
                .spec
                .as_ref()
                .and_then(|s| s.template.spec.as_ref())
                .and_then(|p| p.service_account_name.as_deref())
                .unwrap_or("default");
            if let Err(e) = super::rbac::ensure_reporter_rbac(&ctx.client, &namespace, sa).await {
                warn!(error = %e, service_account = sa, "cannot grant the sidecars leave to write MemoryReports");
            }
            profiles
                .patch(&name, &apply, &Patch::Apply(&desired))
                .await
                .map(Arc::new)
                .map_err(|source| Error::ApplyProfile {
                    namespace: namespace.clone(),
                    name: name.clone(),
                    source,
                })?
        }
    };
    st.profile = Some(profile.clone());

    // Writes for a Job are spaced (see "rate-limited, not debounced" in
    // mod.rs): while the next write may not happen yet, rolling up is wasted
    // work (at 2,048 ranks, ~18 ms of CPU each, most reconciles of a busy
    // Job), so wait first and roll up once, from the newest reports.
    if let Some(wait) = st
        .last_write
        .and_then(|t| ctx.min_write_interval.checked_sub(t.elapsed()))
    {
        return Ok(Action::requeue(wait));
    }

    // 2. Which reports count (trust.rs), then what status and annotations they call for.
    let reports = ctx.reports.state_filter(|r| {
        r.metadata.namespace.as_deref() == Some(namespace.as_str())
            && r.labels().get(LABEL_JOB) == Some(&name)
    });
    let pods = ctx.pods.state_filter(|p| {
        p.metadata.namespace.as_deref() == Some(namespace.as_str())
            && p.labels().get(LABEL_JOB_NAME) == Some(&name)
    });
    let facts: HashMap<&str, PodFacts<'_>> = pods
        .iter()
        .filter_map(|p| PodFacts::of(&p.metadata))
        .collect();
    let claimed: Vec<&MemoryReport> = reports.iter().map(|r| r.as_ref()).collect();
    let screened = screen(
        &claimed,
        &facts,
        &uid,
        expected_ranks(job),
        &ctx.opts.admission.ring(),
        jiff::Timestamp::now(),
    );
    let named: Vec<NamedReport<'_>> = screened
        .counted
        .iter()
        .map(|r| NamedReport {
            name: r.metadata.name.as_deref().unwrap_or_default(),
            spec: &r.spec,
        })
        .collect();
    let previous = profile.status.as_ref();
    let mut desired = desired_status(
        &named,
        Some(expected_ranks(job)),
        previous,
        &now(),
        &Screening::of(&screened),
    );
    with_batch_fit(&mut desired.status, job, previous);
    let annotated = job.annotations().get(ANNOTATION_THRESHOLDS);
    let in_effect = resolve_thresholds(&ctx.opts.default_thresholds, annotated.map(String::as_str));
    desired.status.thresholds = Some(in_effect.status());
    let current = match &st.annotations {
        Some((rv, applied)) if *rv > resource_version(&job.metadata) => applied,
        _ => job.annotations(),
    };
    let annotations = job_annotations(&desired.status, current);
    let status_changed = previous != Some(&desired.status);
    let annotate = annotations_outdated(current, &annotations);
    if !status_changed && !annotate {
        return Ok(Action::requeue(RESYNC));
    }

    // 3. Writes, spaced per Job (checked before the roll-up, above).
    st.last_write = Some(Instant::now());

    if status_changed {
        let body = serde_json::json!({
            "apiVersion": MemoryProfile::api_version(&()),
            "kind": MemoryProfile::kind(&()),
            // A precondition: if the cache was stale we get 409, not a lost write.
            "metadata": { "name": name, "resourceVersion": profile.resource_version() },
            "status": desired.status,
        });
        match profiles
            .patch_status(&name, &apply, &Patch::Apply(&body))
            .await
        {
            Ok(written) => st.profile = Some(Arc::new(written)),
            Err(kube::Error::Api(s)) if s.is_conflict() => {
                ctx.metrics.status_conflicts.inc();
                debug!("profile changed since it was cached; retrying from the watch");
                st.profile = None;
                return Ok(Action::requeue(Duration::from_millis(100)));
            }
            Err(source) => {
                return Err(Error::WriteStatus {
                    namespace,
                    name,
                    source,
                })
            }
        }
        ctx.metrics.status_writes.inc();

        let previous_risk = previous.map(|s| s.risk).unwrap_or_default();
        if let Some(plan) = risk_event(previous_risk, &desired.status) {
            info!(risk = %desired.status.risk, was = %previous_risk, "risk changed");
            publish(
                ctx,
                &plan,
                &reference(job),
                Some(reference(profile.as_ref())),
            )
            .await;
        }
        let was = previous.and_then(|s| s.thresholds.as_ref());
        if let Some(plan) = desired
            .status
            .thresholds
            .as_ref()
            .and_then(|t| thresholds::invalid_event(was, t))
        {
            warn!(note = %plan.note, "invalid memprof.dev/thresholds");
            publish(
                ctx,
                &plan,
                &reference(job),
                Some(reference(profile.as_ref())),
            )
            .await;
        }
        let mut announced = rejected_in(previous);
        announced.extend(st.announced.iter().cloned());
        for rejected in newly_rejected(&desired.rejected, &announced) {
            let report = reports
                .iter()
                .find(|r| r.metadata.name.as_deref() == Some(rejected.name.as_str()));
            warn!(report = %rejected.name, why = %rejected.why, "MemoryReport rejected");
            let plan = rejection_event(rejected);
            let related = report.map(|r| reference(r.as_ref()));
            publish(ctx, &plan, &reference(profile.as_ref()), related).await;
        }
        st.announced = desired.rejected.iter().map(|r| r.name.clone()).collect();
    }

    if annotate {
        let body = serde_json::json!({
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": { "name": name, "annotations": annotations },
        });
        let annotated = jobs
            .patch(&name, &apply, &Patch::Apply(&body))
            .await
            .map_err(|source| Error::AnnotateJob {
                namespace,
                name,
                source,
            })?;
        st.annotations = Some((resource_version(&annotated.metadata), annotations));
        ctx.metrics.annotation_patches.inc();
    }
    Ok(Action::requeue(RESYNC))
}

/// Profiling was switched off (or never on): remove what we made, if anything.
async fn switch_off(
    job: &Job,
    ctx: &Context,
    st: &mut JobState,
    profiles: &Api<MemoryProfile>,
    jobs: &Api<Job>,
    cached: Option<Arc<MemoryProfile>>,
) -> Result<Action> {
    let uid = job.uid().unwrap_or_default();
    if let Some(p) = cached.filter(|p| p.owner_references().iter().any(|o| o.uid == uid)) {
        delete_profile(profiles, &p).await?;
        info!("profiling switched off: deleted the MemoryProfile");
    }
    st.profile = None;
    st.announced.clear();
    let ours = JOB_ANNOTATIONS
        .iter()
        .any(|k| job.annotations().contains_key(*k));
    if ours && !st.cleared {
        // Applying no annotations drops the keys this field manager owns, and only those.
        let name = job.name_any();
        let body = serde_json::json!({
            "apiVersion": "batch/v1", "kind": "Job", "metadata": { "name": name },
        });
        let apply = PatchParams::apply(OPERATOR_MANAGER).force();
        jobs.patch(&name, &apply, &Patch::Apply(&body))
            .await
            .map_err(|source| Error::AnnotateJob {
                namespace: job.namespace().unwrap_or_default(),
                name,
                source,
            })?;
        ctx.metrics.annotation_patches.inc();
        st.cleared = true;
        st.annotations = None;
    }
    Ok(Action::await_change())
}

async fn delete_profile(profiles: &Api<MemoryProfile>, profile: &MemoryProfile) -> Result<()> {
    let name = profile.name_any();
    let params = DeleteParams {
        // Never delete a newer profile that took the name meanwhile.
        preconditions: Some(Preconditions {
            uid: profile.uid(),
            resource_version: None,
        }),
        ..Default::default()
    };
    match profiles.delete(&name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.is_not_found() || s.is_conflict() => Ok(()),
        Err(source) => Err(Error::DeleteProfile {
            namespace: profile.namespace().unwrap_or_default(),
            name,
            source,
        }),
    }
}

/// Publishes an Event; a failure is logged and counted, never retried: the
/// status that motivated it is already written, and a retry loop on Events
/// would be worse than a missing one.
async fn publish(
    ctx: &Context,
    plan: &EventPlan,
    regarding: &ObjectReference,
    related: Option<ObjectReference>,
) {
    let event = Event {
        type_: if plan.warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: plan.reason.into(),
        note: Some(plan.note.clone()),
        action: "Rollup".into(),
        secondary: related,
    };
    match ctx.recorder.publish(&event, regarding).await {
        Ok(()) => {
            let reason = ReasonLabels {
                reason: plan.reason,
            };
            ctx.metrics.events.get_or_create(&reason).inc();
        }
        Err(error) => {
            ctx.metrics.event_errors.inc();
            warn!(%error, reason = plan.reason, "cannot publish Event: check RBAC (events.k8s.io events: create, patch)");
        }
    }
}

/// Now, to the second (conditions' transition times).
fn now() -> String {
    let now = jiff::Timestamp::now();
    now.round(jiff::Unit::Second).unwrap_or(now).to_string()
}
