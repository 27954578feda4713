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
use super::triggers::{PHASE_DONE, PHASE_FAILED, PHASE_PENDING, PHASE_SKIPPED};
use super::{Error, PhaseLabels, Result};
use crate::api::{
    truncate_utf8, RemediationPolicy, RemediationRecord, ANNOTATION_REMEDIATION, LABEL_JOB,
    LABEL_REMEDIATION, REMEDIATION_MANAGER,
};
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
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// Environment variable naming a failpoint (tests only).
pub const FAILPOINT_ENV: &str = "MEMPROF_FAILPOINT";
/// Failpoint: abort the process right after the old Job's deletion was accepted.
pub const FAILPOINT_AFTER_DELETE: &str = "remediation-after-delete";
/// How long one reconcile waits for the garbage collector to remove the old Job.
const GC_WAIT: Duration = Duration::from_secs(10);

/// Dies here when `MEMPROF_FAILPOINT` names this point: the crash tests use
/// it to kill the operator between two steps of the protocol.
fn failpoint(name: &str) {
    if std::env::var(FAILPOINT_ENV).is_ok_and(|v| v == name) {
        eprintln!("{FAILPOINT_ENV}={name}: aborting on purpose");
        std::process::abort();
    }
}

fn plan_config_map(id: &str) -> String {
    format!("memprof-remediation-{id}")
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
        if let Some(cm) = cm {
            config_maps.insert(a.config_map.clone(), cm.data.unwrap_or_default());
        }
    }
    Ok(Some(plan::build(&PlanInput {
        policy,
        job: &job,
        config_maps: &config_maps,
        id,
        why,
    })))
}

/// Saves the plan before its first step; if one was saved already (a retry
/// or a restart), that one wins: it was made from the Job before any change.
async fn save_plan(ctx: &Context, plan: Plan) -> Result<Plan> {
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &plan.namespace);
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(plan_config_map(&plan.id));
    cm.metadata.labels = Some(BTreeMap::from([
        (LABEL_REMEDIATION.to_string(), plan.id.clone()),
        (LABEL_JOB.to_string(), plan.job.clone()),
    ]));
    let json = serde_json::to_string(&plan).map_err(|e| Error::Serialize("plan", e))?;
    cm.data = Some(BTreeMap::from([("plan.json".to_string(), json)]));
    let pp = PostParams {
        field_manager: Some(REMEDIATION_MANAGER.into()),
        ..Default::default()
    };
    match api.create(&pp, &cm).await {
        Ok(_) => Ok(plan),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(load_plan(ctx, &plan.namespace, &plan.id)
            .await?
            .unwrap_or(plan)),
        Err(e) => Err(Error::SavePlan(plan.id.clone(), e)),
    }
}

async fn load_plan(ctx: &Context, ns: &str, id: &str) -> Result<Option<Plan>> {
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), ns);
    let Some(cm) = api
        .get_opt(&plan_config_map(id))
        .await
        .map_err(|e| Error::SavePlan(id.into(), e))?
    else {
        return Ok(None);
    };
    let json = cm
        .data
        .as_ref()
        .and_then(|d| d.get("plan.json"))
        .ok_or_else(|| Error::BadPlan(id.into(), "no key plan.json".into()))?;
    serde_json::from_str(json)
        .map(Some)
        .map_err(|e| Error::BadPlan(id.into(), e.to_string()))
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
            .any(|r| r.id == record.id && r.phase == PHASE_PENDING)
            .then_some(())
    })
    .await?;
    if confirm.is_none() {
        return Ok(Action::requeue(Duration::from_millis(200)));
    }
    info!(id = %record.id, action = %record.action, "resuming a pending remediation");
    if let Some(plan) = load_plan(ctx, ns, &record.id).await? {
        return carry_out(ctx, plan).await;
    }
    // No plan saved means no step was taken (the plan is saved first):
    // planning now, from the Job as it is, is the same decision.
    let why = record.message.clone().unwrap_or_default();
    let policy = ctx.policies.get(&ObjectRef::new(&record.policy).within(ns));
    let planned = match &policy {
        Some(p) => plan_for(ctx, p, ns, name, "", &record.id, &why).await?,
        None => None,
    };
    match planned {
        Some(Ok(plan)) => carry_out(ctx, plan).await,
        Some(Err(e)) => {
            let msg = format!("{}: {e}", e.reason());
            finish(ctx, ns, name, &record.id, PHASE_SKIPPED, msg, None).await
        }
        None => {
            let msg =
                "the Job or the policy disappeared before the plan was saved: nothing was done";
            finish(ctx, ns, name, &record.id, PHASE_FAILED, msg.into(), None).await
        }
    }
}

/// Carries out a plan whose `Pending` record is written, then records the outcome.
pub(super) async fn carry_out(ctx: &Context, plan: Plan) -> Result<Action> {
    let plan = save_plan(ctx, plan).await?;
    let (ns, name, id) = (plan.namespace.as_str(), plan.job.as_str(), plan.id.as_str());
    let step_err = |step: String| {
        move |source| Error::Step {
            id: id.to_string(),
            step,
            source,
        }
    };
    let mut done: Vec<String> = Vec::new();
    let mut failed: Vec<String> = Vec::new();
    let mut job_uid = Some(plan.job_uid.clone());
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
                    Ok(_) => done.push(format!("annotated {key}")),
                    Err(kube::Error::Api(s)) if matches!(s.code, 404 | 409 | 422) => {
                        failed.push(format!("annotate {key}: the Job is gone or was replaced"))
                    }
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
                    let regarding = job_ref(ns, name, job_uid.clone());
                    publish(ctx, EventType::Warning, reason, message.clone(), &regarding).await;
                }
            }
            Step::SetConfigMapKey {
                config_map, key, to, ..
            } => {
                let cms: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), ns);
                let body = serde_json::json!({"data": {key: to}});
                match cms.patch(config_map, &merge, &Patch::Merge(&body)).await {
                    Ok(_) => done.push(format!("set {config_map}/{key}={to}")),
                    Err(kube::Error::Api(s)) if s.code == 404 => {
                        failed.push(format!("ConfigMap {config_map} is gone"))
                    }
                    Err(e) => return Err(step_err(format!("writing ConfigMap {ns}/{config_map}"))(e)),
                }
            }
            Step::Suspend => {
                let body = serde_json::json!({"metadata": {"uid": plan.job_uid}, "spec": {"suspend": true}});
                let typed: Api<Job> = Api::namespaced(ctx.client.clone(), ns);
                match typed.patch(name, &merge, &Patch::Merge(&body)).await {
                    // A server without the field drops it silently: read it back.
                    Ok(j) if j.spec.as_ref().and_then(|s| s.suspend) == Some(true) => {
                        done.push("suspended".into())
                    }
                    Ok(_) => failed.push(
                        "Unsupported: the API server ignored Job spec.suspend (Kubernetes 1.21+, \
                         with the JobSuspend feature gate before 1.22); use scaleBatch or annotate instead"
                            .into(),
                    ),
                    Err(kube::Error::Api(s)) if matches!(s.code, 404 | 409 | 422) => {
                        failed.push("suspend: the Job is gone or was replaced".into())
                    }
                    Err(e) => return Err(step_err(format!("suspending Job {ns}/{name}"))(e)),
                }
            }
            Step::Recreate { manifest, .. } => {
                match recreate(ctx, &jobs, &plan, manifest).await? {
                    Recreated::Done { uid } => {
                        done.push(format!("Job recreated (uid {} -> {uid})", plan.job_uid));
                        job_uid = Some(uid);
                    }
                    Recreated::Waiting => {
                        info!(%id, "waiting for the garbage collector to remove the old Job");
                        return Ok(Action::requeue(Duration::from_secs(1)));
                    }
                    Recreated::Foreign { uid } => failed.push(format!(
                        "Job {name} was recreated by someone else (uid {uid}) before memprof could: left alone"
                    )),
                }
            }
        }
    }
    let (phase, mut message) = if failed.is_empty() {
        (PHASE_DONE, format!("{}; {}", plan.why, done.join("; ")))
    } else {
        (PHASE_FAILED, failed.join("; "))
    };
    truncate_utf8(&mut message, 512);
    finish(ctx, ns, name, id, phase, message, job_uid).await
}

/// Marks record `id` with its final phase, then drops the saved plan.
async fn finish(
    ctx: &Context,
    ns: &str,
    name: &str,
    id: &str,
    phase: &str,
    message: String,
    job_uid: Option<String>,
) -> Result<Action> {
    let written = update_status(ctx, ns, name, |st| {
        let r = st
            .remediations
            .iter_mut()
            .find(|r| r.id == id && r.phase == PHASE_PENDING)?;
        r.phase = phase.into();
        r.message = Some(message.clone());
        let action = last_action(r);
        let record = r.clone();
        st.last_action = Some(action);
        Some(record)
    })
    .await?;
    let Some((_, record)) = written else {
        // Finished by an earlier attempt, or the profile is gone.
        return Ok(Action::requeue(Duration::from_millis(200)));
    };
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), ns);
    match api
        .delete(&plan_config_map(id), &DeleteParams::default())
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => return Err(Error::SavePlan(id.into(), e)),
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
    Done { uid: String },
    Waiting,
    Foreign { uid: String },
}

/// Deletes the old Job (orphaning its dependents, the profile among them),
/// deletes its pods, creates the manifest. Idempotent; see the module docs.
async fn recreate(
    ctx: &Context,
    jobs: &Api<DynamicObject>,
    plan: &Plan,
    manifest: &serde_json::Value,
) -> Result<Recreated> {
    let (ns, name, id, old) = (&plan.namespace, &plan.job, &plan.id, &plan.job_uid);
    let err = |step: &str| {
        let step = format!("{step} Job {ns}/{name}");
        move |source| Error::Step {
            id: id.clone(),
            step,
            source,
        }
    };
    let deadline = Instant::now() + GC_WAIT;
    loop {
        let current = jobs.get_opt(name).await.map_err(err("reading"))?;
        match current {
            Some(j) if j.uid().as_deref() == Some(old.as_str()) => {
                if j.metadata.deletion_timestamp.is_none() {
                    let params = DeleteParams {
                        propagation_policy: Some(PropagationPolicy::Orphan),
                        preconditions: Some(Preconditions {
                            uid: Some(old.clone()),
                            resource_version: None,
                        }),
                        ..Default::default()
                    };
                    match jobs.delete(name, &params).await {
                        Ok(_) => {
                            info!(%id, job = %name, "deleted the Job (orphaning its dependents)")
                        }
                        Err(kube::Error::Api(s)) if matches!(s.code, 404 | 409) => {}
                        Err(e) => return Err(err("deleting")(e)),
                    }
                    failpoint(FAILPOINT_AFTER_DELETE);
                }
            }
            Some(j) if j.annotations().get(ANNOTATION_REMEDIATION) == Some(id) => {
                delete_old_pods(ctx, plan).await?;
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
                delete_old_pods(ctx, plan).await?;
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
                    // The Job is gone and its manifest safe in the plan
                    // ConfigMap: retried with backoff, the message says where it is.
                    Err(e) => {
                        let from = format!("creating (from ConfigMap {})", plan_config_map(id));
                        return Err(err(&from)(e));
                    }
                }
            }
        }
        if Instant::now() > deadline {
            return Ok(Recreated::Waiting);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Deletes the old Job's pods, orphaned by the deletion: the trainer must
/// not keep running next to the new Job's.
async fn delete_old_pods(ctx: &Context, plan: &Plan) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &plan.namespace);
    for key in ["controller-uid", "batch.kubernetes.io/controller-uid"] {
        let lp = ListParams::default().labels(&format!("{key}={}", plan.job_uid));
        if let Err(e) = pods
            .delete_collection(&DeleteParams::background(), &lp)
            .await
        {
            return Err(Error::Step {
                id: plan.id.clone(),
                step: format!(
                    "deleting the old pods of Job {}/{}",
                    plan.namespace, plan.job
                ),
                source: e,
            });
        }
    }
    Ok(())
}
