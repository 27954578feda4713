//! The I/O half of the pipeline: watch caches, the kube-runtime Controller
//! keyed on MemoryProfiles (the one object that survives a Job's
//! recreation), and the status writes. Deciding is left to `oom.rs`,
//! `triggers.rs` and `plan.rs`; acting to `execute.rs`.

use super::execute::{self, job_ref, publish};
use super::oom;
use super::store::Saved;
use super::triggers::{self, push_record, RiskClock, PHASE_DRY_RUN, PHASE_PENDING, PHASE_SKIPPED};
use super::{status, Error, Metrics, PhaseLabels, Result, StepLabels};
use crate::operator::reconcile::{profiling_enabled, slim_job};
use crate::operator::trust::{self, screen, PodFacts};
use futures::future::{BoxFuture, Shared};
use futures::{FutureExt, StreamExt};
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::NamespaceResourceScope;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Resource, ResourceExt};
use memprof_api::admission::Keys;
use memprof_api::{
    truncate_utf8, MemoryProfile, MemoryProfileStatus, MemoryReport, RemediationPolicy,
    RemediationRecord, LABEL_JOB, MAX_HISTORY, REMEDIATION_MANAGER,
};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{watch, Notify};
use tracing::{debug, info, warn};

/// Re-evaluation of every profile without triggers: cooldowns end and
/// `forSeconds` elapse without any watch event.
const RESYNC: Duration = Duration::from_secs(60);
/// Label the Job controller puts on a Job's pods (1.20 and later).
pub(super) const LABEL_JOB_NAME: &str = "job-name";
/// Status writes retried on conflict before the reconcile gives up and requeues.
const WRITE_ATTEMPTS: usize = 8;

pub(super) type Shutdown = Shared<BoxFuture<'static, ()>>;

/// Shared state of the reconciles.
pub(super) struct Context {
    pub client: Client,
    /// Where plans are kept: the operator's own namespace, which no tenant can write.
    pub plan_namespace: String,
    pub profiles: Store<MemoryProfile>,
    pub jobs: Store<Job>,
    pub pods: Store<Pod>,
    pub reports: Store<MemoryReport>,
    pub policies: Store<RemediationPolicy>,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    /// The admission key ring: which pods are the Jobs' own (`operator::trust`).
    pub admission: Keys,
    /// Since when each profile's risk has been at each level (by profile uid).
    clocks: Mutex<HashMap<String, RiskClock>>,
    /// Events already published by this process (`id/step`): a retried plan does not repeat them.
    pub published: Mutex<HashSet<String>>,
    failures: Mutex<HashMap<String, u32>>,
    /// Reconciles so far that found a remediation's old Job still being deleted (by id).
    pub waits: Mutex<HashMap<String, u32>>,
    /// Wakes the policy status writer after a record was written.
    pub policy_status: Notify,
    /// One per watch cache: true once its first list is in.
    ready: Vec<watch::Receiver<bool>>,
}

impl Context {
    /// Waits until every watch cache holds a full list: until then "no such
    /// pod" or "no such policy" would be a lie.
    ///
    /// Why not `Store::wait_until_ready`: it keeps one waker, so of several
    /// tasks waiting at once (concurrent reconciles, the status writer) only
    /// the last is woken and the others hang. A `watch` channel wakes all.
    pub async fn caches_ready(&self) -> Result<()> {
        for rx in &self.ready {
            let mut rx = rx.clone();
            rx.wait_for(|r| *r)
                .await
                .map_err(|_| Error::CacheClosed("watch"))?;
        }
        Ok(())
    }
}

/// Marks a cache ready when its watch stream says the first list is in.
fn init_done<K>(
    tx: Option<watch::Sender<bool>>,
) -> impl FnMut(&std::result::Result<watcher::Event<K>, watcher::Error>) {
    move |ev| {
        if let (Ok(watcher::Event::InitDone), Some(tx)) = (ev, &tx) {
            tx.send_replace(true);
        }
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

/// Checks that the RemediationPolicy CRD is served.
pub(super) async fn check_crd(client: &Client, namespace: &str) -> Result<()> {
    match scoped::<RemediationPolicy>(client, namespace)
        .list_metadata(&ListParams::default().limit(1))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Err(Error::CrdMissing),
        Err(e) => Err(Error::CrdCheck(e)),
    }
}

/// Runs the remediation controller (no leader election: see [`super::run`])
/// on `namespace` (empty: all) until `shutdown` resolves.
pub async fn run_controller(
    client: Client,
    namespace: &str,
    plan_namespace: &str,
    admission: Keys,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let shutdown: Shutdown = shutdown.boxed().shared();
    let ns = namespace;
    let (ready, ready_rx): (Vec<_>, Vec<_>) = (0..5).map(|_| watch::channel(false)).unzip();
    let mut ready = ready.into_iter();

    let (profiles, w) = reflector::store();
    let profile_stream = watcher(
        scoped::<MemoryProfile>(&client, ns),
        watcher::Config::default().labels(LABEL_JOB).any_semantic(),
    )
    .default_backoff()
    .modify(|p| p.managed_fields_mut().clear())
    .reflect(w)
    .inspect(init_done(ready.next()))
    .touched_objects();

    // Labels and annotations are all a reconcile reads from a cached Job:
    // plans are made from a fresh GET, so the template is not kept.
    let (jobs, w) = reflector::store();
    let job_stream = watcher(
        scoped::<Job>(&client, ns),
        watcher::Config::default().any_semantic(),
    )
    .default_backoff()
    .modify(slim_job)
    .reflect(w)
    .inspect(init_done(ready.next()))
    .touched_objects();

    let (pods, w) = reflector::store();
    let pod_stream = watcher(
        scoped::<Pod>(&client, ns),
        watcher::Config::default()
            .labels(LABEL_JOB_NAME)
            .any_semantic(),
    )
    .default_backoff()
    .modify(|p| {
        trust::slim_pod_annotations(&mut p.metadata);
        p.spec = None;
    })
    .reflect(w)
    .inspect(init_done(ready.next()))
    .touched_objects();

    let (reports, w) = reflector::store();
    let report_stream = watcher(
        scoped::<MemoryReport>(&client, ns),
        watcher::Config::default().labels(LABEL_JOB).any_semantic(),
    )
    .default_backoff()
    .modify(|r| {
        r.managed_fields_mut().clear();
        for g in &mut r.spec.gpus {
            g.timeline = Vec::new();
        }
    })
    .reflect(w)
    .inspect(init_done(ready.next()))
    .touched_objects();

    let (policies, w) = reflector::store();
    let policy_stream = watcher(
        scoped::<RemediationPolicy>(&client, ns),
        watcher::Config::default().any_semantic(),
    )
    .default_backoff()
    .modify(|p| p.managed_fields_mut().clear())
    .reflect(w)
    .inspect(init_done(ready.next()))
    .touched_objects();

    let reporter = Reporter {
        controller: REMEDIATION_MANAGER.into(),
        instance: Reporter::from(REMEDIATION_MANAGER).instance,
    };
    let ctx = Arc::new(Context {
        recorder: Recorder::new(client.clone(), reporter),
        client,
        plan_namespace: plan_namespace.to_string(),
        profiles: profiles.clone(),
        jobs,
        pods,
        reports,
        policies,
        metrics,
        admission,
        clocks: Mutex::default(),
        published: Mutex::default(),
        failures: Mutex::default(),
        waits: Mutex::default(),
        policy_status: Notify::new(),
        ready: ready_rx,
    });

    let all_profiles = profiles.clone();
    let status_writer = tokio::spawn(status::run(ctx.clone(), shutdown.clone()));
    info!(namespace = %if ns.is_empty() { "*" } else { ns }, %plan_namespace, "remediation controller started");
    Controller::for_stream(profile_stream, profiles)
        .watches_stream(job_stream, |job: Job| {
            let ns = job.namespace().unwrap_or_default();
            Some(ObjectRef::new(&job.name_any()).within(&ns))
        })
        .watches_stream(pod_stream, |pod: Pod| {
            profile_by_label(&pod, LABEL_JOB_NAME)
        })
        .watches_stream(report_stream, |r: MemoryReport| {
            profile_by_label(&r, LABEL_JOB)
        })
        .watches_stream(policy_stream, move |policy: RemediationPolicy| {
            let ns = policy.namespace();
            all_profiles
                .state()
                .iter()
                .filter(|p| p.namespace() == ns)
                .map(|p| ObjectRef::from_obj(p.as_ref()))
                .collect::<Vec<_>>()
        })
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            match res {
                Ok((obj, _)) => debug!(profile = %obj, "remediation reconciled"),
                Err(kube::runtime::controller::Error::ReconcilerFailed(..)) => {}
                // A Job, pod or report whose profile is not (yet) cached: nothing to do.
                Err(kube::runtime::controller::Error::ObjectNotFound(obj)) => {
                    debug!(profile = %obj, "no such profile (yet)")
                }
                Err(e) => {
                    warn!(error = %e, "remediation controller: watch or queue error, retrying")
                }
            }
        })
        .await;
    let _ = status_writer.await;
    info!("remediation controller stopped");
    Ok(())
}

/// The profile named by an object's `label` (profiles are named after their Job).
fn profile_by_label<K: Resource>(obj: &K, label: &str) -> Option<ObjectRef<MemoryProfile>> {
    let ns = obj.meta().namespace.clone().unwrap_or_default();
    let name = obj.meta().labels.as_ref()?.get(label)?;
    Some(ObjectRef::new(name).within(&ns))
}

fn error_policy(profile: Arc<MemoryProfile>, err: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics
        .reconcile_errors
        .get_or_create(&StepLabels { step: err.step() })
        .inc();
    let key = profile.uid().unwrap_or_default();
    let n = {
        let mut f = ctx.failures.lock().unwrap_or_else(|e| e.into_inner());
        let n = f.entry(key).or_default();
        *n = n.saturating_add(1);
        *n
    };
    let delay = Duration::from_millis(500)
        .saturating_mul(1 << n.saturating_sub(1).min(10))
        .min(Duration::from_secs(120));
    warn!(profile = %profile.name_any(), error = %err, retry_in = ?delay, "remediation reconcile failed");
    Action::requeue(delay)
}

#[tracing::instrument(skip_all, fields(profile = %profile.name_any(), namespace = profile.namespace().unwrap_or_default()))]
async fn reconcile(profile: Arc<MemoryProfile>, ctx: Arc<Context>) -> Result<Action> {
    ctx.caches_ready().await?;
    let res = reconcile_profile(&profile, &ctx).await;
    if res.is_ok() {
        let mut f = ctx.failures.lock().unwrap_or_else(|e| e.into_inner());
        f.remove(&profile.uid().unwrap_or_default());
    }
    res
}

async fn reconcile_profile(profile: &MemoryProfile, ctx: &Context) -> Result<Action> {
    let ns = profile.namespace().unwrap_or_default();
    let name = profile.name_any();
    // The operator writes the first status (its required fields included);
    // ours is merged into it and cannot stand alone.
    let Some(st) = profile.status.clone() else {
        return Ok(Action::requeue(Duration::from_secs(2)));
    };
    let now = Timestamp::now();

    if let Some(pending) = st.remediations.iter().find(|r| r.phase == PHASE_PENDING) {
        return execute::resume(ctx, &ns, &name, pending).await;
    }

    let job = ctx.jobs.get(&ObjectRef::new(&name).within(&ns));
    let pods = ctx.pods.state_filter(|p| {
        p.namespace().as_deref() == Some(ns.as_str())
            && p.labels().get(LABEL_JOB_NAME) == Some(&name)
    });
    let reports = ctx.reports.state_filter(|r| {
        r.namespace().as_deref() == Some(ns.as_str()) && r.labels().get(LABEL_JOB) == Some(&name)
    });
    let pod_refs: Vec<&Pod> = pods.iter().map(|p| p.as_ref()).collect();
    // Only the reports the roll-up would count (trust.rs): a forged report
    // must not record an OOM, and so fire a policy, on someone else's Job.
    let facts: HashMap<&str, PodFacts<'_>> = pods
        .iter()
        .filter_map(|p| PodFacts::of(&p.metadata))
        .collect();
    let claimed: Vec<&MemoryReport> = reports.iter().map(|r| r.as_ref()).collect();
    let keys = ctx.admission.ring();
    let job_uid = job.as_ref().and_then(|j| j.uid()).unwrap_or_default();
    let counted = match &job {
        Some(j) => {
            let parallelism = crate::operator::reconcile::expected_ranks(j);
            screen(&claimed, &facts, &job_uid, parallelism, &keys, now).counted
        }
        None => Vec::new(),
    };
    let report_specs: Vec<_> = counted.iter().map(|r| &r.spec).collect();
    // OOM evidence only from the Job's own pods, screened like reports (issue 15 item 2).
    let admitted = trust::admitted(pod_refs.iter().copied(), &job_uid, &keys, now);
    let new_ooms = oom::detect(&admitted, &report_specs, &st.ooms, now);
    let mut with_ooms = st.clone();
    with_ooms.ooms = oom::merge(&st.ooms, &new_ooms, MAX_HISTORY);

    // Which policy, if any, acts now.
    let mut requeue = RESYNC;
    let mut decision = None;
    let live_job = job
        .as_ref()
        .filter(|j| j.metadata.deletion_timestamp.is_none() && profiling_enabled(j));
    if let Some(job) = live_job {
        let clock = {
            let mut clocks = ctx.clocks.lock().unwrap_or_else(|e| e.into_inner());
            let c = clocks.entry(profile.uid().unwrap_or_default()).or_default();
            c.observe(st.risk, now);
            c.clone()
        };
        let mut policies = ctx
            .policies
            .state_filter(|p| p.namespace().as_deref() == Some(ns.as_str()));
        policies.sort_by_key(|p| p.name_any());
        for policy in policies {
            let uid = job.uid();
            let v = triggers::verdict(
                &policy,
                job.labels(),
                uid.as_deref(),
                &with_ooms,
                &clock,
                now,
            );
            if let Some(s) = v.recheck_after() {
                requeue = requeue.min(Duration::from_secs_f64(s.clamp(0.1, 3600.0)));
            }
            let Some(fired) = v.fired().filter(|_| v.acts()) else {
                continue;
            };
            let id = triggers::record_id(
                &policy.uid().unwrap_or_default(),
                policy.metadata.generation.unwrap_or_default(),
                &job.uid().unwrap_or_default(),
                &fired.name,
                v.history.count,
            );
            // Dry runs and skips are recorded once per decision, not per reconcile.
            if with_ooms.remediations.iter().any(|r| r.id == id) {
                continue;
            }
            decision = Some((policy, fired.clone(), id, v.history.count));
            break;
        }
    }

    if new_ooms.is_empty() && decision.is_none() {
        return Ok(Action::requeue(requeue));
    }

    // Plan before writing: the record says what will be done.
    let mut planned = None;
    let mut record = None;
    if let Some((policy, fired, id, count)) = &decision {
        let job_uid = job.as_ref().and_then(|j| j.uid()).unwrap_or_default();
        let why = format!("{}: {}", fired.name, fired.why);
        let Some(outcome) = execute::plan_for(ctx, policy, &ns, &name, &job_uid, id, &why).await?
        else {
            // The Job changed under us (deleted or recreated): decide again.
            return Ok(Action::requeue(Duration::from_millis(200)));
        };
        let rec = match outcome {
            Ok(plan) if policy.spec.dry_run => new_record(
                id,
                policy,
                &plan.summary(),
                PHASE_DRY_RUN,
                now,
                format!("dry run: would act because {why}"),
            ),
            Ok(plan) => {
                // The record names the plan's hash before the plan is saved:
                // only the plan recorded here will ever be carried out.
                let saved = Saved::new(plan)?;
                let mut rec =
                    new_record(id, policy, &saved.plan.summary(), PHASE_PENDING, now, why);
                rec.job_uid = Some(job_uid.clone());
                rec.plan_digest = Some(saved.digest());
                planned = Some(saved);
                rec
            }
            Err(e) => new_record(
                id,
                policy,
                &status::describe_actions(policy),
                PHASE_SKIPPED,
                now,
                format!("{}: {e}", e.reason()),
            ),
        };
        record = Some((rec, *count));
    }

    // One conditional write for OOMs and the decision.
    let policy_name = decision.as_ref().map(|d| d.0.name_any());
    let write = update_status(ctx, &ns, &name, |fresh| {
        let added: Vec<_> = new_ooms
            .iter()
            .filter(|o| {
                !fresh
                    .ooms
                    .iter()
                    .any(|k| oom::record_key(k) == oom::record_key(o))
            })
            .cloned()
            .collect();
        fresh.ooms = oom::merge(&fresh.ooms, &added, MAX_HISTORY);
        if let (Some((rec, count)), Some(policy)) = (&record, &policy_name) {
            // Decided on stale data if the history moved meanwhile: skip, decide again.
            if fresh.remediations.iter().any(|r| r.id == rec.id)
                || triggers::history(fresh, policy).count != *count
                || fresh.remediations.iter().any(|r| r.phase == PHASE_PENDING)
            {
                return Some((added, false));
            }
            push_record(&mut fresh.remediations, rec.clone(), MAX_HISTORY);
            fresh.last_action = Some(last_action(rec));
            return Some((added, true));
        }
        Some((added, false))
    })
    .await?;
    let Some((written, (added, record_added))) = write else {
        return Ok(Action::requeue(Duration::from_millis(200)));
    };
    let job_or_profile = match &job {
        Some(j) => job_ref(&ns, &name, j.uid()),
        None => execute::object_ref(&written),
    };
    for o in &added {
        ctx.metrics.ooms.inc();
        let rank = o.rank.map_or("-".into(), |r| r.to_string());
        let gpu = o.gpu_index.map_or("-".into(), |g| g.to_string());
        warn!(pod = %o.pod, evidence = %o.evidence, "GPU OOM observed");
        let note = format!(
            "GPU OOM in pod {} (rank {rank}, GPU {gpu}): {}",
            o.pod, o.evidence
        );
        publish(
            ctx,
            EventType::Warning,
            "GpuOomObserved",
            note,
            &job_or_profile,
        )
        .await;
    }
    let Some((rec, _)) = record else {
        return Ok(Action::requeue(requeue));
    };
    // Only the write that added the record announces it: a reconcile that
    // decided again on a stale cache finds the record there already and must
    // neither publish its Event twice nor act twice.
    if !record_added {
        return Ok(Action::requeue(Duration::from_millis(200)));
    }
    ctx.metrics
        .records
        .get_or_create(&PhaseLabels {
            phase: rec.phase.clone(),
        })
        .inc();
    ctx.policy_status.notify_one();
    let message = rec.message.clone().unwrap_or_default();
    match rec.phase.as_str() {
        PHASE_DRY_RUN => {
            info!(id = %rec.id, action = %rec.action, "dry run recorded");
            let note = format!(
                "RemediationPolicy {}: {}: {message}",
                rec.policy, rec.action
            );
            publish(
                ctx,
                EventType::Normal,
                "RemediationDryRun",
                note,
                &job_or_profile,
            )
            .await;
        }
        PHASE_SKIPPED => {
            warn!(id = %rec.id, %message, "remediation cannot apply to this Job");
            let note = format!("RemediationPolicy {} not applied: {message}", rec.policy);
            publish(
                ctx,
                EventType::Warning,
                "RemediationSkipped",
                note,
                &job_or_profile,
            )
            .await;
        }
        _ => {
            info!(id = %rec.id, action = %rec.action, "remediation recorded as pending; acting");
            if let Some(saved) = planned {
                return execute::carry_out(ctx, &ns, &name, saved, &rec).await;
            }
        }
    }
    Ok(Action::requeue(requeue))
}

/// A new remediation record.
pub(super) fn new_record(
    id: &str,
    policy: &RemediationPolicy,
    action: &str,
    phase: &str,
    now: Timestamp,
    mut message: String,
) -> RemediationRecord {
    truncate_utf8(&mut message, 512);
    let mut action = action.to_string();
    truncate_utf8(&mut action, 256);
    RemediationRecord {
        id: id.into(),
        policy: policy.name_any(),
        action,
        phase: phase.into(),
        time: now.round(jiff::Unit::Second).unwrap_or(now).to_string(),
        message: Some(message),
        ..Default::default()
    }
}

/// The profile's `lastAction` for a record (at most 128 bytes).
pub(super) fn last_action(r: &RemediationRecord) -> String {
    let mut s = match r.phase.as_str() {
        PHASE_PENDING => format!("{} (pending)", r.action),
        PHASE_DRY_RUN => format!("dry run: {}", r.action),
        PHASE_SKIPPED => format!(
            "skipped: {}",
            r.message
                .as_deref()
                .and_then(|m| m.split(':').next())
                .unwrap_or("")
        ),
        super::triggers::PHASE_FAILED => format!("failed: {}", r.action),
        _ => r.action.clone(),
    };
    truncate_utf8(&mut s, 128);
    s
}

/// Reads the profile fresh, lets `change` edit our fields of its status,
/// and applies them conditioned on the resourceVersion read (retrying on
/// conflict). `change` returns `None` to write nothing. Returns the written
/// profile and `change`'s value, or `None` when the profile or its status is gone.
pub(super) async fn update_status<T>(
    ctx: &Context,
    ns: &str,
    name: &str,
    mut change: impl FnMut(&mut MemoryProfileStatus) -> Option<T>,
) -> Result<Option<(MemoryProfile, T)>> {
    let api: Api<MemoryProfile> = Api::namespaced(ctx.client.clone(), ns);
    let params = PatchParams::apply(REMEDIATION_MANAGER).force();
    for _ in 0..WRITE_ATTEMPTS {
        let fresh = api.get_opt(name).await.map_err(|source| Error::Read {
            what: format!("MemoryProfile {ns}/{name}"),
            source,
        })?;
        let Some(mut fresh) = fresh else {
            return Ok(None);
        };
        let rv = fresh.resource_version();
        let Some(st) = fresh.status.as_mut() else {
            return Ok(None);
        };
        let before = st.clone();
        let Some(value) = change(st) else {
            return Ok(None);
        };
        if *st == before {
            return Ok(Some((fresh, value)));
        }
        // Only the fields this manager owns: the operator's stay its own.
        let body = serde_json::json!({
            "apiVersion": MemoryProfile::api_version(&()),
            "kind": MemoryProfile::kind(&()),
            "metadata": { "name": name, "resourceVersion": rv },
            "status": {
                "ooms": st.ooms,
                "remediations": st.remediations,
                "remediationTotals": st.remediation_totals,
                "lastAction": st.last_action,
            },
        });
        match api.patch_status(name, &params, &Patch::Apply(&body)).await {
            Ok(written) => return Ok(Some((written, value))),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                debug!("profile changed while writing remediation status; retrying");
            }
            Err(e) => return Err(Error::WriteStatus(format!("{ns}/{name}"), e)),
        }
    }
    Ok(None)
}
