//! Carrying out a plan, at most once, without ever losing the Job.
//!
//! Every step is idempotent and decided from what the API server holds now,
//! so `carry_out` can run again from the top after a crash or an error:
//! annotations and ConfigMap keys get absolute values; the recreation looks
//! at the Job under the plan's name — still the old uid: delete it; gone:
//! create the manifest; carrying this plan's id: already created; anything
//! else: someone else recreated it, leave it alone (`steps.rs`). See
//! `mod.rs` for the protocol and why the deletion orphans. Every change of
//! the record goes through the status writer and is awaited here, never
//! in a reconcile.

use super::checkpoint::{self, Hold};
use super::executor::Executor;
use super::nonce::nonce;
use super::records::{last_action, pending_mut};
use super::steps::{remediable, run_steps, wait_for_deletion, Ran, Steps};
use super::store::{config_map_name, PlanStore, Saved};
use super::verify::verify;
use super::workload;
use super::{Error, JobCheckpoints, PhaseLabels, Result};
use crate::key::JobKey;
use crate::workload::action::env_change;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use memprof_api::workload::WorkloadKind;
use memprof_api::{truncate_utf8, RemediationPolicy, RemediationRecord};
use memprof_policy::plan::{self, Plan, PlanError, PlanInput};
use memprof_policy::triggers::{
    add_to_totals, MAX_POLICY_TOTALS, PHASE_DONE, PHASE_FAILED, PHASE_SKIPPED,
};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use tracing::{info, warn};

/// Look again soon: the record or the Job moved.
const AGAIN: Duration = Duration::from_millis(200);

/// Plans `policy`'s actions on Job `key` as it is now. `Ok(None)` when the
/// Job is gone or is not the one decided on (`expected_uid`).
pub(super) async fn plan_for(
    exec: &Executor,
    policy: &RemediationPolicy,
    key: &JobKey,
    expected_uid: &str,
    id: &str,
    why: &str,
) -> Result<Option<Result<Plan, PlanError>>> {
    let (ns, name) = (key.namespace.as_str(), key.name.as_str());
    let kind = exec.kind_of(key);
    let object = exec
        .objects(ns, kind)
        .get_opt(name)
        .await
        .map_err(|source| Error::Read {
            what: format!("{} {key}", kind.kind()),
            source,
        })?;
    let Some(object) =
        object.filter(|j| expected_uid.is_empty() || j.uid().as_deref() == Some(expected_uid))
    else {
        return Ok(None);
    };
    // The Kueue queue is read from the object as the API server holds it now.
    let how = env_change(kind, object.metadata.labels.as_ref());
    let object = serde_json::to_value(&object).map_err(|e| Error::Serialize("Job", e))?;
    let job = workload::job_view(kind, &object);
    let (config_maps, not_opted_in) = config_maps_of(exec, policy, ns).await?;
    // `scaleBatch` `mode: fit` reads the roll-up's recommendation (status: only the operator writes it).
    let status = exec.view(key);
    let batch_fit = status
        .as_ref()
        .and_then(|s| s.batch_recommendation.as_ref());
    let mut planned = plan::build(&PlanInput {
        policy,
        job: &job,
        config_maps: &config_maps,
        not_opted_in: &not_opted_in,
        id,
        why,
        batch_fit,
        nonce: &nonce(),
    });
    // `scaleBatch`'s `gpuMemoryRequest` reads the roll-up's recommendation
    // too: a workload's per pod template, by role (`workload::gpu`).
    let recommendation = status.as_ref().map(|s| s.recommendation.as_slice());
    let recommendation = recommendation.unwrap_or_default();
    if let Ok(p) = planned.as_mut() {
        plan::with_gpu_request(p, policy, recommendation);
    }
    if kind != WorkloadKind::Job {
        planned = planned.map(|p| {
            let mut p = workload::for_workload(p, kind, &object, how);
            workload::with_gpu_requests(&mut p, policy, recommendation);
            p
        });
    }
    Ok(Some(planned))
}

type ConfigMapData = BTreeMap<String, BTreeMap<String, String>>;

/// The data of the opted-in ConfigMaps `policy` writes to, and the names of
/// those that exist but are not opted in.
async fn config_maps_of(
    exec: &Executor,
    policy: &RemediationPolicy,
    ns: &str,
) -> Result<(ConfigMapData, BTreeSet<String>)> {
    let cms: Api<ConfigMap> = Api::namespaced(exec.client.clone(), ns);
    let mut data = BTreeMap::new();
    let mut not_opted_in = BTreeSet::new();
    let actions = policy.spec.actions.iter();
    for a in actions.filter_map(|a| a.set_config_map_key.as_ref()) {
        let cm = cms
            .get_opt(&a.config_map)
            .await
            .map_err(|source| Error::Read {
                what: format!("ConfigMap {ns}/{}", a.config_map),
                source,
            })?;
        match cm {
            Some(cm) if remediable(&cm) => {
                data.insert(a.config_map.clone(), cm.data.unwrap_or_default());
            }
            Some(_) => {
                not_opted_in.insert(a.config_map.clone());
            }
            None => {}
        }
    }
    Ok((data, not_opted_in))
}

/// Where this controller keeps its plans.
pub(super) fn plans(exec: &Executor) -> PlanStore {
    PlanStore::new(exec.client.clone(), &exec.plan_namespace)
}

/// Finishes the `Pending` record `record` of Job `key`.
pub(super) async fn resume(
    exec: &Executor,
    key: &JobKey,
    record: &RemediationRecord,
    ranks: Option<&JobCheckpoints>,
) -> Result<Option<Duration>> {
    // Only the writer's newest status may say the remediation is still pending.
    let id = record.id.clone();
    let confirm = exec
        .edit(key, move |st| pending_mut(st, &id).map(|r| r.clone()))
        .await?;
    let Some((_, record)) = confirm else {
        return Ok(Some(AGAIN));
    };
    info!(id = %record.id, action = %record.action, "resuming a pending remediation");
    if let Some(saved) = plans(exec).load(&record.id).await? {
        return carry_out(exec, key, saved, &record, ranks).await;
    }
    // No plan saved means no step was taken (the plan is saved first):
    // planning now, from the same Job as it is, is the same decision.
    let why = record.message.clone().unwrap_or_default();
    let ns = key.namespace.as_str();
    let policy = exec
        .policies
        .get(&ObjectRef::new(&record.policy).within(ns));
    let expected_uid = record.job_uid.clone().unwrap_or_default();
    let planned = match &policy {
        Some(p) => plan_for(exec, p, key, &expected_uid, &record.id, &why).await?,
        None => None,
    };
    let outcome = Outcome::default();
    match planned {
        Some(Ok(mut plan)) => {
            if let Some(p) = &policy {
                checkpoint::attach_recorded(&mut plan, p, exec.view(key).as_ref(), &record);
            }
            let saved = Saved::new(plan)?;
            match record_digest(exec, key, &record.id, &saved).await? {
                Some(record) => carry_out(exec, key, saved, &record, ranks).await,
                None => Ok(Some(AGAIN)),
            }
        }
        Some(Err(e)) => {
            let msg = format!("{}: {e}", e.reason());
            finish(exec, key, &record.id, (PHASE_SKIPPED, msg), None, outcome).await
        }
        None => {
            let msg = format!(
                "the {} or the policy disappeared before the plan was saved: nothing was done",
                exec.kind_of(key).kind()
            );
            let end = (PHASE_FAILED, msg);
            finish(exec, key, &record.id, end, None, outcome).await
        }
    }
}

/// Writes a new plan's digest (and Job uid) into its `Pending` record, so
/// that the plan saved next is the one the record authenticates.
async fn record_digest(
    exec: &Executor,
    key: &JobKey,
    id: &str,
    saved: &Saved,
) -> Result<Option<RemediationRecord>> {
    let (id, digest, job_uid) = (id.to_string(), saved.digest(), saved.plan.job_uid.clone());
    let how = workload::env_change_of(&saved.plan).map(|c| c.as_str().to_string());
    let written = exec
        .edit(key, move |st| {
            let r = pending_mut(st, &id)?;
            r.plan_digest = Some(digest.clone());
            r.job_uid = Some(job_uid.clone());
            r.env_change.clone_from(&how);
            Some(r.clone())
        })
        .await?;
    Ok(written.map(|(_, r)| r))
}

/// How a finished remediation is to be remembered.
#[derive(Clone, Debug, Default)]
pub(super) struct Outcome {
    /// The old Job was deleted: the record counts toward `maxRemediations`
    /// and the cooldown, whatever happened next.
    pub job_deleted: bool,
    /// Keep the plan's ConfigMap: it holds the only copy of a Job that could
    /// not be created again, or a refused plan worth a look.
    pub keep_plan: bool,
    /// uid of the workload the plan created in place of the deleted one:
    /// recorded as the one heir of the profile (`replacementUid`).
    pub replacement: Option<String>,
}

/// Carries out the plan of the `Pending` record `record` of Job `key`,
/// then records the outcome. The plan is saved (or the one saved earlier
/// loaded) and checked against the record before any step: a plan that is
/// not the recorded one is refused, and nothing is done.
pub(super) async fn carry_out(
    exec: &Executor,
    key: &JobKey,
    saved: Saved,
    record: &RemediationRecord,
    ranks: Option<&JobCheckpoints>,
) -> Result<Option<Duration>> {
    let store = plans(exec);
    let id = record.id.as_str();
    if let Some(why) = store.refuses(&saved).await? {
        let end = (PHASE_FAILED, why);
        return finish(exec, key, id, end, None, Outcome::default()).await;
    }
    let saved = store.save(&saved).await?;
    if let Err(refused) = verify(&saved.plan, &saved.json, record, &key.namespace, &key.name) {
        exec.metrics.plans_refused.inc();
        warn!(%id, error = %refused, "refusing a remediation plan that is not the recorded one");
        let msg = format!(
            "refused the saved plan (ConfigMap {}/{}): {refused}; nothing was done",
            store.namespace(),
            config_map_name(id)
        );
        let keep = Outcome {
            keep_plan: true,
            ..Outcome::default()
        };
        return finish(exec, key, id, (PHASE_FAILED, msg), None, keep).await;
    }
    let plan = &saved.plan;
    let kept = match checkpoint::hold(exec, key, plan, record, ranks).await? {
        Hold::Again(delay) => return Ok(Some(delay)),
        Hold::Go(kept) => kept,
    };
    let ran = match run_steps(exec, key, plan).await? {
        Ran::Finished(ran) => ran,
        Ran::Waiting { finalizers } => {
            return Ok(Some(wait_for_deletion(exec, key, id, &finalizers).await));
        }
    };
    exec.waits
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(id);
    let lost = (workload::kind_of(plan).kind(), store.restore_command(id));
    let (phase, message) = ending(&ran, &plan.why, &kept, (lost.0, &lost.1));
    let outcome = Outcome {
        job_deleted: ran.job_deleted,
        keep_plan: ran.lost.is_some(),
        replacement: ran.replacement.clone(),
    };
    finish(exec, key, id, (phase, message), ran.job_uid, outcome).await
}

/// The record's final phase and message for steps that ran: `restore` is
/// the command that brings back the object of `kind` (a Job, a JobSet, …)
/// lost on the way.
fn ending(
    ran: &Steps,
    why: &str,
    kept: &str,
    (kind, restore): (&str, &str),
) -> (&'static str, String) {
    let done = ran.done.join("; ");
    let (phase, mut message) = match (&ran.lost, ran.failed.is_empty()) {
        (Some(lost), _) => (
            PHASE_FAILED,
            format!(
                "the old {kind} was deleted but the new one cannot be created; restore it with: \
                 {restore}; the API server said: {lost}"
            ),
        ),
        (None, true) => (PHASE_DONE, format!("{why}; {kept}{done}")),
        (None, false) => (PHASE_FAILED, ran.failed.join("; ")),
    };
    truncate_utf8(&mut message, 512);
    (phase, message)
}

/// Marks record `id` with its final phase and message, counts it when it
/// changed the workload, then drops the saved plan (unless `outcome` keeps it).
async fn finish(
    exec: &Executor,
    key: &JobKey,
    id: &str,
    (phase, message): (&str, String),
    job_uid: Option<String>,
    outcome: Outcome,
) -> Result<Option<Duration>> {
    let (rid, end, text) = (id.to_string(), phase.to_string(), message.clone());
    let written = exec
        .edit(key, move |st| {
            let r = pending_mut(st, &rid)?;
            r.phase = end.clone();
            r.message = Some(text.clone());
            r.job_deleted = outcome.job_deleted;
            r.replacement_uid = outcome.replacement.clone();
            let record = r.clone();
            st.last_action = Some(last_action(&record));
            add_to_totals(st, &record, MAX_POLICY_TOTALS);
            Some(record)
        })
        .await?;
    let Some((_, record)) = written else {
        // Finished by an earlier attempt, or the profile is gone.
        return Ok(Some(AGAIN));
    };
    if !outcome.keep_plan {
        plans(exec).delete(id).await?;
    }
    let labels = PhaseLabels {
        phase: phase.into(),
    };
    exec.metrics.records.get_or_create(&labels).inc();
    exec.policy_status.notify_one();
    let regarding = exec.regarding(key, job_uid);
    let note = format!(
        "RemediationPolicy {}: {}: {message}",
        record.policy, record.action
    );
    if phase == PHASE_DONE {
        info!(%id, action = %record.action, "remediation done");
        exec.publish(EventType::Normal, "Remediated", note, &regarding)
            .await;
    } else {
        warn!(%id, %message, "remediation did not complete");
        let reason = if phase == PHASE_SKIPPED {
            "RemediationSkipped"
        } else {
            "RemediationFailed"
        };
        exec.publish(EventType::Warning, reason, note, &regarding)
            .await;
    }
    Ok(Some(Duration::from_secs(1)))
}
