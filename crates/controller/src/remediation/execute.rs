//! Carrying out a plan, at most once, without ever losing the Job.
//!
//! Every step is idempotent and decided from what the API server holds now,
//! so `carry_out` can run again from the top after a crash or an error:
//! annotations and ConfigMap keys get absolute values; the recreation looks
//! at the Job under the plan's name — still the old uid: delete it; gone:
//! create the manifest; carrying this plan's id: already created; anything
//! else: someone else recreated it, leave it alone. See `mod.rs` for the
//! protocol and why the deletion orphans.

use super::controller::{last_action, update_status, Context};
use super::plan::{self, Plan, PlanError, PlanInput, Step};
use super::store::{config_map_name, PlanStore, Saved};
use super::triggers::{
    add_to_totals, MAX_POLICY_TOTALS, PHASE_DONE, PHASE_FAILED, PHASE_PENDING, PHASE_SKIPPED,
};
use super::verify::verify;
use super::{Error, PhaseLabels, Result};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference, Pod};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
    Preconditions, PropagationPolicy,
};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use memprof_api::{
    truncate_utf8, RemediationPolicy, RemediationRecord, LABEL_REMEDIABLE, REMEDIATION_MANAGER,
};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// Environment variable naming a failpoint (tests only).
pub const FAILPOINT_ENV: &str = "MEMPROF_FAILPOINT";
/// Failpoint: abort the process right after the old Job's deletion was accepted.
pub const FAILPOINT_AFTER_DELETE: &str = "remediation-after-delete";

/// Dies here when `MEMPROF_FAILPOINT` names this point: the crash tests use
/// it to kill the operator between two steps of the protocol.
fn failpoint(name: &str) {
    if std::env::var(FAILPOINT_ENV).is_ok_and(|v| v == name) {
        eprintln!("{FAILPOINT_ENV}={name}: aborting on purpose");
        std::process::abort();
    }
}

fn jobs_api(ctx: &Context, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(ctx.client.clone(), ns, &ApiResource::erase::<Job>(&()))
}

/// A reference to a Job for Events (by uid when known).
pub(super) fn job_ref(ns: &str, name: &str, uid: Option<String>) -> ObjectReference {
    ObjectReference {
        api_version: Some("batch/v1".into()),
        kind: Some("Job".into()),
        name: Some(name.into()),
        namespace: Some(ns.into()),
        uid,
        ..Default::default()
    }
}

/// A reference to any object for Events.
pub(super) fn object_ref<K: Resource<DynamicType = ()>>(obj: &K) -> ObjectReference {
    ObjectReference {
        resource_version: None,
        ..obj.object_ref(&())
    }
}

/// Publishes an Event; failures are logged, never retried (the record in
/// the profile is what counts; an Event is a courtesy).
pub(super) async fn publish(
    ctx: &Context,
    type_: EventType,
    reason: &str,
    mut note: String,
    regarding: &ObjectReference,
) {
    truncate_utf8(&mut note, 1024);
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: "Remediate".into(),
        secondary: None,
    };
    if let Err(error) = ctx.recorder.publish(&event, regarding).await {
        warn!(%error, reason, "cannot publish Event: check RBAC (events.k8s.io events: create, patch)");
    }
}

/// Plans `policy`'s actions on the Job `ns/name` as it is now. `Ok(None)`
/// when the Job is gone or is not the one decided on (`expected_uid`).
pub(super) async fn plan_for(
    ctx: &Context,
    policy: &RemediationPolicy,
    ns: &str,
    name: &str,
    expected_uid: &str,
    id: &str,
    why: &str,
) -> Result<Option<Result<Plan, PlanError>>> {
    let job = jobs_api(ctx, ns)
        .get_opt(name)
        .await
        .map_err(|source| Error::Read {
            what: format!("Job {ns}/{name}"),
            source,
        })?;
    let Some(job) =
        job.filter(|j| expected_uid.is_empty() || j.uid().as_deref() == Some(expected_uid))
    else {
        return Ok(None);
    };
    let job = serde_json::to_value(&job).map_err(|e| Error::Serialize("Job", e))?;
    let cms: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), ns);
    let mut config_maps = BTreeMap::new();
    let mut not_opted_in = BTreeSet::new();
    for a in policy
        .spec
        .actions
        .iter()
        .filter_map(|a| a.set_config_map_key.as_ref())
    {
        let cm = cms
            .get_opt(&a.config_map)
            .await
            .map_err(|source| Error::Read {
                what: format!("ConfigMap {ns}/{}", a.config_map),
                source,
            })?;
        match cm {
            Some(cm) if remediable(&cm) => {
                config_maps.insert(a.config_map.clone(), cm.data.unwrap_or_default());
            }
            Some(_) => {
                not_opted_in.insert(a.config_map.clone());
            }
            None => {}
        }
    }
    // `scaleBatch` `mode: fit` reads the roll-up's recommendation (status: only the operator writes it).
    let profile = ctx.profiles.get(&ObjectRef::new(name).within(ns));
    let batch_fit = profile
        .as_ref()
        .and_then(|p| p.status.as_ref()?.batch_recommendation.as_ref());
    Ok(Some(plan::build(&PlanInput {
        policy,
        job: &job,
        config_maps: &config_maps,
        not_opted_in: &not_opted_in,
        id,
        why,
        batch_fit,
    })))
}

/// Where this controller keeps its plans.
fn plans(ctx: &Context) -> PlanStore {
    PlanStore::new(ctx.client.clone(), &ctx.plan_namespace)
}

/// Finishes the `Pending` record `record` of profile `ns/name`.
pub(super) async fn resume(
    ctx: &Context,
    ns: &str,
    name: &str,
    record: &RemediationRecord,
) -> Result<Action> {
    // The cache may lag behind our own last write: only a fresh read may
    // say the remediation is still pending.
    let confirm = update_status(ctx, ns, name, |st| {
        st.remediations
            .iter()
            .find(|r| r.id == record.id && r.phase == PHASE_PENDING)
            .cloned()
    })
    .await?;
    let Some((_, record)) = confirm else {
        return Ok(Action::requeue(Duration::from_millis(200)));
    };
    info!(id = %record.id, action = %record.action, "resuming a pending remediation");
    if let Some(saved) = plans(ctx).load(&record.id).await? {
        return carry_out(ctx, ns, name, saved, &record).await;
    }
    // No plan saved means no step was taken (the plan is saved first):
    // planning now, from the same Job as it is, is the same decision.
    let why = record.message.clone().unwrap_or_default();
    let policy = ctx.policies.get(&ObjectRef::new(&record.policy).within(ns));
    let expected_uid = record.job_uid.clone().unwrap_or_default();
    let planned = match &policy {
        Some(p) => plan_for(ctx, p, ns, name, &expected_uid, &record.id, &why).await?,
        None => None,
    };
    let outcome = Outcome::default();
    match planned {
        Some(Ok(plan)) => {
            let saved = Saved::new(plan)?;
            match record_digest(ctx, ns, name, &record.id, &saved).await? {
                Some(record) => carry_out(ctx, ns, name, saved, &record).await,
                None => Ok(Action::requeue(Duration::from_millis(200))),
            }
        }
        Some(Err(e)) => {
            let msg = format!("{}: {e}", e.reason());
            finish(ctx, ns, name, &record.id, PHASE_SKIPPED, msg, None, outcome).await
        }
        None => {
            let msg =
                "the Job or the policy disappeared before the plan was saved: nothing was done";
            finish(
                ctx,
                ns,
                name,
                &record.id,
                PHASE_FAILED,
                msg.into(),
                None,
                outcome,
            )
            .await
        }
    }
}

/// Writes a new plan's digest (and Job uid) into its `Pending` record, so
/// that the plan saved next is the one the record authenticates.
async fn record_digest(
    ctx: &Context,
    ns: &str,
    name: &str,
    id: &str,
    saved: &Saved,
) -> Result<Option<RemediationRecord>> {
    let digest = saved.digest();
    let written = update_status(ctx, ns, name, |st| {
        let r = st
            .remediations
            .iter_mut()
            .find(|r| r.id == id && r.phase == PHASE_PENDING)?;
        r.plan_digest = Some(digest.clone());
        r.job_uid = Some(saved.plan.job_uid.clone());
        Some(r.clone())
    })
    .await?;
    Ok(written.map(|(_, r)| r))
}

/// How a finished remediation is to be remembered.
#[derive(Clone, Copy, Debug, Default)]
struct Outcome {
    /// The old Job was deleted: the record counts toward `maxRemediations`
    /// and the cooldown, whatever happened next.
    job_deleted: bool,
    /// Keep the plan's ConfigMap: it holds the only copy of a Job that could
    /// not be created again, or a refused plan worth a look.
    keep_plan: bool,
}

/// Carries out the plan of the `Pending` record `record` of profile
/// `ns/name`, then records the outcome. The plan is saved (or the one saved
/// earlier loaded) and checked against the record before any step: a plan
/// that is not the recorded one is refused, and nothing is done.
pub(super) async fn carry_out(
    ctx: &Context,
    ns: &str,
    name: &str,
    saved: Saved,
    record: &RemediationRecord,
) -> Result<Action> {
    let store = plans(ctx);
    let saved = store.save(&saved).await?;
    let id = record.id.as_str();
    if let Err(refused) = verify(&saved.plan, &saved.json, record, ns, name) {
        ctx.metrics.plans_refused.inc();
        warn!(%id, error = %refused, "refusing a remediation plan that is not the recorded one");
        let msg = format!(
            "refused the saved plan (ConfigMap {}/{}): {refused}; nothing was done",
            store.namespace(),
            config_map_name(id)
        );
        let outcome = Outcome {
            job_deleted: false,
            keep_plan: true,
        };
        return finish(ctx, ns, name, id, PHASE_FAILED, msg, None, outcome).await;
    }
    let plan = &saved.plan;
    let ran = match run_steps(ctx, ns, name, plan).await? {
        Ran::Finished(ran) => ran,
        Ran::Waiting { finalizers } => {
            return Ok(wait_for_deletion(ctx, ns, name, id, &finalizers).await)
        }
    };
    forget_wait(ctx, id);
    let (phase, mut message) = match (&ran.lost, ran.failed.is_empty()) {
        (Some(lost), _) => (
            PHASE_FAILED,
            format!(
                "the old Job was deleted but the new one cannot be created; restore it with: {}; \
                 the API server said: {lost}",
                store.restore_command(id)
            ),
        ),
        (None, true) => (PHASE_DONE, format!("{}; {}", plan.why, ran.done.join("; "))),
        (None, false) => (PHASE_FAILED, ran.failed.join("; ")),
    };
    truncate_utf8(&mut message, 512);
    let outcome = Outcome {
        job_deleted: ran.job_deleted,
        keep_plan: ran.lost.is_some(),
    };
    finish(ctx, ns, name, id, phase, message, ran.job_uid, outcome).await
}

/// What carrying out the steps came to.
enum Ran {
    /// Every step ran (or failed for good).
    Finished(Steps),
    /// The old Job is still being deleted (finalizers): come back later.
    Waiting {
        /// The finalizers holding it.
        finalizers: Vec<String>,
    },
}

/// The steps' results, for the record.
#[derive(Default)]
struct Steps {
    done: Vec<String>,
    failed: Vec<String>,
    job_uid: Option<String>,
    job_deleted: bool,
    /// The old Job is gone and the new one could not be created (terminal).
    lost: Option<String>,
}

/// Runs a verified plan's steps on Job `ns/name`, in order.
async fn run_steps(ctx: &Context, ns: &str, name: &str, plan: &Plan) -> Result<Ran> {
    let id = plan.id.as_str();
    let step_err = |step: String| {
        move |source| Error::Step {
            id: id.to_string(),
            step,
            source,
        }
    };
    let mut out = Steps {
        job_uid: Some(plan.job_uid.clone()),
        ..Default::default()
    };
    let merge = PatchParams {
        field_manager: Some(REMEDIATION_MANAGER.into()),
        ..Default::default()
    };
    let jobs = jobs_api(ctx, ns);
    for (i, step) in plan.steps.iter().enumerate() {
        match step {
            Step::Annotate { key, value } => {
                // The uid makes the patch fail on any other Job of this name.
                let body = serde_json::json!({"metadata": {"uid": plan.job_uid, "annotations": {key: value}}});
                match jobs.patch(name, &merge, &Patch::Merge(&body)).await {
                    Ok(_) => out.done.push(format!("annotated {key}")),
                    Err(kube::Error::Api(s)) if matches!(s.code, 404 | 409 | 422) => out
                        .failed
                        .push(format!("annotate {key}: the Job is gone or was replaced")),
                    Err(e) => return Err(step_err(format!("annotating Job {ns}/{name}"))(e)),
                }
            }
            Step::Event { reason, message } => {
                let key = format!("{id}/{i}");
                let first = ctx
                    .published
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(key);
                if first {
                    let regarding = job_ref(ns, name, out.job_uid.clone());
                    publish(ctx, EventType::Warning, reason, message.clone(), &regarding).await;
                }
            }
            Step::SetConfigMapKey {
                config_map,
                key,
                to,
                ..
            } => {
                let cms: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), ns);
                match set_config_map_key(&cms, &merge, config_map, key, to).await {
                    Ok(Ok(())) => out.done.push(format!("set {config_map}/{key}={to}")),
                    Ok(Err(why)) => out.failed.push(why),
                    Err(e) => {
                        return Err(step_err(format!("writing ConfigMap {ns}/{config_map}"))(e))
                    }
                }
            }
            Step::Suspend => {
                let body = serde_json::json!({"metadata": {"uid": plan.job_uid}, "spec": {"suspend": true}});
                let typed: Api<Job> = Api::namespaced(ctx.client.clone(), ns);
                match typed.patch(name, &merge, &Patch::Merge(&body)).await {
                    // A server without the field drops it silently: read it back.
                    Ok(j) if j.spec.as_ref().and_then(|s| s.suspend) == Some(true) => {
                        out.done.push("suspended".into())
                    }
                    Ok(_) => out.failed.push(
                        "Unsupported: the API server ignored Job spec.suspend (Kubernetes 1.21+, \
                         with the JobSuspend feature gate before 1.22); use scaleBatch or annotate instead"
                            .into(),
                    ),
                    Err(kube::Error::Api(s)) if matches!(s.code, 404 | 409 | 422) => {
                        out.failed.push("suspend: the Job is gone or was replaced".into())
                    }
                    Err(e) => return Err(step_err(format!("suspending Job {ns}/{name}"))(e)),
                }
            }
            Step::Recreate { manifest, .. } => {
                match recreate(ctx, &jobs, ns, name, plan, manifest).await? {
                    Recreated::Done { uid } => {
                        out.done
                            .push(format!("Job recreated (uid {} -> {uid})", plan.job_uid));
                        out.job_uid = Some(uid);
                        out.job_deleted = true;
                    }
                    Recreated::Waiting { finalizers } => return Ok(Ran::Waiting { finalizers }),
                    Recreated::Foreign { uid } => {
                        out.job_deleted = true;
                        out.failed.push(format!(
                            "Job {name} was recreated by someone else (uid {uid}) before memprof could: left alone"
                        ))
                    }
                    Recreated::Lost { why } => {
                        out.job_deleted = true;
                        out.job_uid = None;
                        out.lost = Some(why);
                    }
                }
            }
        }
    }
    Ok(Ran::Finished(out))
}

/// Whether a tenant opted a ConfigMap in to `setConfigMapKey` (label
/// `memprof.dev/remediable: "true"`): the operator writes no other.
pub(super) fn remediable(cm: &ConfigMap) -> bool {
    cm.labels().get(LABEL_REMEDIABLE).map(String::as_str) == Some("true")
}

/// Writes one key of an opted-in ConfigMap. `Ok(Err(why))`: a permanent
/// failure for the record; `Err`: retry.
async fn set_config_map_key(
    cms: &Api<ConfigMap>,
    merge: &PatchParams,
    config_map: &str,
    key: &str,
    to: &str,
) -> std::result::Result<std::result::Result<(), String>, kube::Error> {
    // Read, check the opt-in label, then patch on that resourceVersion: a
    // label removed in between makes the patch fail (409) rather than write.
    let Some(cm) = cms.get_opt(config_map).await? else {
        return Ok(Err(format!("ConfigMap {config_map} is gone")));
    };
    if !remediable(&cm) {
        return Ok(Err(format!(
            "ConfigMap {config_map} is not labelled {LABEL_REMEDIABLE}=true: not written"
        )));
    }
    let body = serde_json::json!({
        "metadata": {"resourceVersion": cm.resource_version()},
        "data": {key: to},
    });
    match cms.patch(config_map, merge, &Patch::Merge(&body)).await {
        Ok(_) => Ok(Ok(())),
        Err(kube::Error::Api(s)) if s.code == 404 => {
            Ok(Err(format!("ConfigMap {config_map} is gone")))
        }
        Err(e) => Err(e),
    }
}

/// Requeue delays while a Job's deletion is held up: doubling from 1 s to
/// 5 min. The Job watch wakes the reconcile as soon as the Job goes, so a
/// long delay costs no latency, only the polling.
fn wait_delay(waits: u32) -> Duration {
    Duration::from_secs(1)
        .saturating_mul(1 << waits.saturating_sub(1).min(9))
        .min(Duration::from_secs(300))
}

/// Waits counted per remediation after which a held deletion is announced
/// (about 15 s in: 3 polls of `GC_WAIT` and two requeues).
const WAITS_BEFORE_EVENT: u32 = 3;

async fn wait_for_deletion(
    ctx: &Context,
    ns: &str,
    name: &str,
    id: &str,
    finalizers: &[String],
) -> Action {
    let waits = {
        let mut w = ctx.waits.lock().unwrap_or_else(|e| e.into_inner());
        let n = w.entry(id.to_string()).or_default();
        *n = n.saturating_add(1);
        *n
    };
    info!(%id, waits, ?finalizers, "waiting for the old Job to be deleted");
    if waits == WAITS_BEFORE_EVENT {
        let note =
            format!(
            "remediation {id} waits for Job {ns}/{name} to be deleted; finalizers holding it: {}",
            if finalizers.is_empty() { "-".into() } else { finalizers.join(", ") }
        );
        publish(
            ctx,
            EventType::Warning,
            "RemediationWaiting",
            note,
            &job_ref(ns, name, None),
        )
        .await;
    }
    Action::requeue(wait_delay(waits))
}

fn forget_wait(ctx: &Context, id: &str) {
    ctx.waits
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(id);
}

/// Marks record `id` with its final phase, counts it when it changed the
/// workload, then drops the saved plan (unless `outcome` keeps it).
#[allow(clippy::too_many_arguments)]
async fn finish(
    ctx: &Context,
    ns: &str,
    name: &str,
    id: &str,
    phase: &str,
    message: String,
    job_uid: Option<String>,
    outcome: Outcome,
) -> Result<Action> {
    let written = update_status(ctx, ns, name, |st| {
        let r = st
            .remediations
            .iter_mut()
            .find(|r| r.id == id && r.phase == PHASE_PENDING)?;
        r.phase = phase.into();
        r.message = Some(message.clone());
        r.job_deleted = outcome.job_deleted;
        let record = r.clone();
        st.last_action = Some(last_action(&record));
        add_to_totals(st, &record, MAX_POLICY_TOTALS);
        Some(record)
    })
    .await?;
    let Some((_, record)) = written else {
        // Finished by an earlier attempt, or the profile is gone.
        return Ok(Action::requeue(Duration::from_millis(200)));
    };
    if !outcome.keep_plan {
        plans(ctx).delete(id).await?;
    }
    ctx.metrics
        .records
        .get_or_create(&PhaseLabels {
            phase: phase.into(),
        })
        .inc();
    ctx.policy_status.notify_one();
    let regarding = job_ref(ns, name, job_uid);
    let note = format!(
        "RemediationPolicy {}: {}: {message}",
        record.policy, record.action
    );
    if phase == PHASE_DONE {
        info!(%id, action = %record.action, "remediation done");
        publish(ctx, EventType::Normal, "Remediated", note, &regarding).await;
    } else {
        warn!(%id, %message, "remediation did not complete");
        let reason = if phase == PHASE_SKIPPED {
            "RemediationSkipped"
        } else {
            "RemediationFailed"
        };
        publish(ctx, EventType::Warning, reason, note, &regarding).await;
    }
    Ok(Action::requeue(Duration::from_secs(1)))
}

enum Recreated {
    Done {
        uid: String,
    },
    Waiting {
        finalizers: Vec<String>,
    },
    Foreign {
        uid: String,
    },
    /// The old Job is gone and the API server refuses the new one for good.
    Lost {
        why: String,
    },
}

/// How long one reconcile polls for the garbage collector to remove the old Job.
const GC_WAIT: Duration = Duration::from_secs(4);

/// An API error that retrying cannot fix: the manifest is invalid (400, 422),
/// the operator may not create it (403), or the namespace is gone (404).
fn terminal_code(code: u16) -> bool {
    matches!(code, 400 | 403 | 404 | 422)
}

/// Deletes the old Job (orphaning its dependents, the profile among them),
/// deletes its pods, creates the manifest. Idempotent; see the module docs.
async fn recreate(
    ctx: &Context,
    jobs: &Api<DynamicObject>,
    ns: &str,
    name: &str,
    plan: &Plan,
    manifest: &serde_json::Value,
) -> Result<Recreated> {
    let (id, old) = (&plan.id, &plan.job_uid);
    let err = |step: &str| {
        let step = format!("{step} Job {ns}/{name}");
        move |source| Error::Step {
            id: id.clone(),
            step,
            source,
        }
    };
    let deadline = Instant::now() + GC_WAIT;
    let mut pause = Duration::from_millis(50);
    loop {
        let current = jobs.get_opt(name).await.map_err(err("reading"))?;
        match current {
            Some(j) if j.uid().as_deref() == Some(old.as_str()) => {
                if j.metadata.deletion_timestamp.is_none() {
                    delete_job(jobs, name, old).await.map_err(err("deleting"))?;
                    info!(%id, job = %name, "deleted the Job (orphaning its dependents)");
                    failpoint(FAILPOINT_AFTER_DELETE);
                } else if Instant::now() > deadline {
                    let finalizers = j.finalizers().to_vec();
                    return Ok(Recreated::Waiting { finalizers });
                }
            }
            Some(j) if super::verify::created_from(j.annotations(), manifest) => {
                delete_old_pods(ctx, ns, name, plan).await?;
                return Ok(Recreated::Done {
                    uid: j.uid().unwrap_or_default(),
                });
            }
            Some(j) => {
                return Ok(Recreated::Foreign {
                    uid: j.uid().unwrap_or_default(),
                })
            }
            None => {
                delete_old_pods(ctx, ns, name, plan).await?;
                let obj: DynamicObject = serde_json::from_value(manifest.clone())
                    .map_err(|e| Error::Serialize("the Job manifest", e))?;
                let pp = PostParams {
                    field_manager: Some(REMEDIATION_MANAGER.into()),
                    ..Default::default()
                };
                match jobs.create(&pp, &obj).await {
                    Ok(created) => {
                        info!(%id, job = %name, "created the Job again with the new values");
                        return Ok(Recreated::Done {
                            uid: created.uid().unwrap_or_default(),
                        });
                    }
                    // Created meanwhile (by us, in an earlier attempt, or by someone): look again.
                    Err(kube::Error::Api(s)) if s.code == 409 => continue,
                    Err(kube::Error::Api(s)) if terminal_code(s.code) => {
                        let why = format!("{} ({})", s.message, s.code);
                        return Ok(Recreated::Lost { why });
                    }
                    // Transient (429, 5xx, network): retried with backoff; the
                    // manifest is safe in the plan ConfigMap meanwhile.
                    Err(e) => {
                        let from = format!("creating (from ConfigMap {})", config_map_name(id));
                        return Err(err(&from)(e));
                    }
                }
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(1));
    }
}

/// Deletes Job `name` if it still has uid `old`, orphaning its dependents.
async fn delete_job(jobs: &Api<DynamicObject>, name: &str, old: &str) -> kube::Result<()> {
    let params = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Orphan),
        preconditions: Some(Preconditions {
            uid: Some(old.to_string()),
            resource_version: None,
        }),
        ..Default::default()
    };
    match jobs.delete(name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if matches!(s.code, 404 | 409) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Deletes the old Job's pods, orphaned by the deletion: the trainer must
/// not keep running next to the new Job's.
async fn delete_old_pods(ctx: &Context, ns: &str, name: &str, plan: &Plan) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    for key in ["controller-uid", "batch.kubernetes.io/controller-uid"] {
        let lp = ListParams::default().labels(&format!("{key}={}", plan.job_uid));
        if let Err(e) = pods
            .delete_collection(&DeleteParams::background(), &lp)
            .await
        {
            return Err(Error::Step {
                id: plan.id.clone(),
                step: format!("deleting the old pods of Job {ns}/{name}"),
                source: e,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_deletion_is_polled_ever_less_often() {
        let delays: Vec<u64> = (1..=12).map(|n| wait_delay(n).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]);
    }

    #[test]
    fn only_errors_retrying_cannot_fix_are_terminal() {
        for code in [400, 403, 404, 422] {
            assert!(terminal_code(code), "{code}");
        }
        for code in [409, 429, 500, 503] {
            assert!(!terminal_code(code), "{code}");
        }
    }
}
