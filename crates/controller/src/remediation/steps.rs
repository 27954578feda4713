//! The steps of a plan, each idempotent and decided from what the API
//! server holds now (see `execute.rs` and the protocol in `mod.rs`).

use super::executor::Executor;
use super::request::{failpoint, merge_params, terminal_code, FAILPOINT_AFTER_DELETE};
use super::store::config_map_name;
use super::suspend_step;
use super::workload::kind_of;
use super::{Error, Result};
use crate::key::JobKey;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, Preconditions,
    PropagationPolicy,
};
use kube::runtime::events::EventType;
use kube::ResourceExt;
use memprof_api::workload::WorkloadKind;
use memprof_api::{LABEL_REMEDIABLE, REMEDIATION_MANAGER};
use memprof_policy::plan::{Plan, Step};
use memprof_runtime::backoff;
use std::time::{Duration, Instant};
use tracing::info;

/// What carrying out the steps came to.
pub(super) enum Ran {
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
pub(super) struct Steps {
    pub done: Vec<String>,
    pub failed: Vec<String>,
    pub job_uid: Option<String>,
    pub job_deleted: bool,
    /// The old Job is gone and the new one could not be created (terminal).
    pub lost: Option<String>,
    /// uid of the workload memprof created in place of the old one (its
    /// nonce proves it memprof's: `verify::created_from`).
    pub replacement: Option<String>,
}

/// Runs a verified plan's steps on Job `key`, in order.
pub(super) async fn run_steps(exec: &Executor, key: &JobKey, plan: &Plan) -> Result<Ran> {
    let mut out = Steps {
        job_uid: Some(plan.job_uid.clone()),
        ..Default::default()
    };
    for (i, step) in plan.steps.iter().enumerate() {
        match step {
            Step::Annotate { key: k, value } => {
                annotate(exec, key, plan, k, value, &mut out).await?
            }
            Step::Event { reason, message } => {
                event(exec, key, plan, i, (reason, message), &out).await
            }
            Step::SetConfigMapKey {
                config_map,
                key: k,
                to,
                ..
            } => {
                let cms: Api<ConfigMap> = Api::namespaced(exec.client.clone(), &key.namespace);
                match set_config_map_key(&cms, &merge_params(), config_map, k, to).await {
                    Ok(Ok(())) => out.done.push(format!("set {config_map}/{k}={to}")),
                    Ok(Err(why)) => out.failed.push(why.to_string()),
                    Err(e) => {
                        let step = format!("writing ConfigMap {}/{config_map} for", key.namespace);
                        return Err(step_error(plan, key, &step)(e));
                    }
                }
            }
            Step::Suspend => suspend(exec, key, plan, &mut out).await?,
            Step::SuspendPatchResume {
                changes,
                annotations,
            } => {
                let ran = suspend_step::run(exec, key, plan, (changes, annotations)).await?;
                note(&mut out, ran);
            }
            Step::NotifyTrainer { level, reason } => {
                let d = super::notify::directive(&plan.id, *level, reason);
                let done = super::notify::deliver(exec, key, plan, &d).await?;
                out.done.extend(done);
            }
            Step::Recreate { manifest, .. } => {
                let jobs = exec.objects(&key.namespace, kind_of(plan));
                let recreated = recreate(exec, &jobs, key, plan, manifest).await?;
                if let Some(finalizers) = recorded(recreated, key, plan, &mut out) {
                    return Ok(Ran::Waiting { finalizers });
                }
            }
        }
    }
    Ok(Ran::Finished(out))
}

/// Step `event`: published once per plan step by this process (a retried
/// plan does not repeat it).
async fn event(
    exec: &Executor,
    key: &JobKey,
    plan: &Plan,
    i: usize,
    (reason, message): (&str, &str),
    out: &Steps,
) {
    let first = exec
        .published
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(format!("{}/{i}", plan.id));
    if first {
        let regarding = exec.regarding(key, out.job_uid.clone());
        exec.publish(EventType::Warning, reason, message.to_string(), &regarding)
            .await;
    }
}

/// Notes a step's outcome: what it did, or why it could not.
fn note(out: &mut Steps, ran: std::result::Result<String, String>) {
    match ran {
        Ok(done) => out.done.push(done),
        Err(failed) => out.failed.push(failed),
    }
}

/// Step `annotate`: one annotation on the planned Job (its uid a precondition).
async fn annotate(
    exec: &Executor,
    key: &JobKey,
    plan: &Plan,
    k: &str,
    value: &str,
    out: &mut Steps,
) -> Result<()> {
    // The uid makes the patch fail on any other Job of this name.
    let body = serde_json::json!({"metadata": {"uid": plan.job_uid, "annotations": {k: value}}});
    let jobs = exec.objects(&key.namespace, kind_of(plan));
    match jobs
        .patch(&key.name, &merge_params(), &Patch::Merge(&body))
        .await
    {
        Ok(_) => out.done.push(format!("annotated {k}")),
        Err(kube::Error::Api(s)) if matches!(s.code, 404 | 409 | 422) => out.failed.push(format!(
            "annotate {k}: the {} is gone or was replaced",
            kind_of(plan).kind()
        )),
        Err(e) => return Err(step_error(plan, key, "annotating")(e)),
    }
    Ok(())
}

/// Step `suspend`: `spec.suspend` on the planned Job, read back (a server
/// without the field drops it silently).
async fn suspend(exec: &Executor, key: &JobKey, plan: &Plan, out: &mut Steps) -> Result<()> {
    if kind_of(plan) != WorkloadKind::Job {
        note(out, suspend_step::suspend_only(exec, key, plan).await?);
        return Ok(());
    }
    let body = serde_json::json!({"metadata": {"uid": plan.job_uid}, "spec": {"suspend": true}});
    let typed: Api<Job> = Api::namespaced(exec.client.clone(), &key.namespace);
    match typed
        .patch(&key.name, &merge_params(), &Patch::Merge(&body))
        .await
    {
        Ok(j) if j.spec.as_ref().and_then(|s| s.suspend) == Some(true) => {
            out.done.push("suspended".into())
        }
        Ok(_) => out.failed.push(
            "Unsupported: the API server ignored Job spec.suspend (Kubernetes 1.21+, \
             with the JobSuspend feature gate before 1.22); use scaleBatch or annotate instead"
                .into(),
        ),
        Err(kube::Error::Api(s)) if matches!(s.code, 404 | 409 | 422) => out
            .failed
            .push("suspend: the Job is gone or was replaced".into()),
        Err(e) => return Err(step_error(plan, key, "suspending")(e)),
    }
    Ok(())
}

/// Notes how the recreation ended, naming the planned object by its kind
/// (a JobSet, a PyTorchJob, a Job); `Some(finalizers)` while the old one is held.
fn recorded(r: Recreated, key: &JobKey, plan: &Plan, out: &mut Steps) -> Option<Vec<String>> {
    let kind = kind_of(plan).kind();
    match r {
        Recreated::Done { uid } => {
            out.done
                .push(format!("{kind} recreated (uid {} -> {uid})", plan.job_uid));
            out.job_uid = Some(uid.clone());
            out.replacement = Some(uid);
            out.job_deleted = true;
        }
        Recreated::Waiting { finalizers } => return Some(finalizers),
        Recreated::Foreign { uid } => {
            out.job_deleted = true;
            out.failed.push(format!(
                "{kind} {} was recreated by someone else (uid {uid}) before memprof could: left alone",
                key.name
            ))
        }
        Recreated::Lost { why } => {
            out.job_deleted = true;
            out.job_uid = None;
            out.lost = Some(why);
        }
        Recreated::Refused { why } => out.failed.push(format!(
            "the API server would refuse {kind} {} with the new values: {why}; it was left \
             running, untouched",
            key.name
        )),
    }
    None
}

/// Whether a tenant opted a ConfigMap in to `setConfigMapKey` (label
/// `memprof.dev/remediable: "true"`): the operator writes no other.
pub(super) fn remediable(cm: &ConfigMap) -> bool {
    cm.labels().get(LABEL_REMEDIABLE).map(String::as_str) == Some("true")
}

/// Why a ConfigMap step cannot write, for good: the record says so and the
/// Job's owner opts the ConfigMap in (or recreates it) to have it written.
#[derive(Debug, thiserror::Error)]
enum Unwritable {
    #[error("ConfigMap {0} is gone")]
    Gone(String),
    #[error("ConfigMap {0} is not labelled {label}=true: not written", label = LABEL_REMEDIABLE)]
    NotOptedIn(String),
}

/// Writes one key of an opted-in ConfigMap. `Ok(Err(why))`: a permanent
/// failure for the record; `Err`: retry.
async fn set_config_map_key(
    cms: &Api<ConfigMap>,
    merge: &PatchParams,
    config_map: &str,
    key: &str,
    to: &str,
) -> std::result::Result<std::result::Result<(), Unwritable>, kube::Error> {
    // Read, check the opt-in label, then patch on that resourceVersion: a
    // label removed in between makes the patch fail (409) rather than write.
    let Some(cm) = cms.get_opt(config_map).await? else {
        return Ok(Err(Unwritable::Gone(config_map.to_string())));
    };
    if !remediable(&cm) {
        return Ok(Err(Unwritable::NotOptedIn(config_map.to_string())));
    }
    let body = serde_json::json!({
        "metadata": {"resourceVersion": cm.resource_version()},
        "data": {key: to},
    });
    match cms.patch(config_map, merge, &Patch::Merge(&body)).await {
        Ok(_) => Ok(Ok(())),
        Err(kube::Error::Api(s)) if s.code == 404 => {
            Ok(Err(Unwritable::Gone(config_map.to_string())))
        }
        Err(e) => Err(e),
    }
}

/// Requeue delay while a Job's deletion is held up ([`backoff::DELETION_WAIT`]).
fn wait_delay(waits: u32) -> Duration {
    backoff::DELETION_WAIT.after(waits)
}

/// Waits counted per remediation after which a held deletion is announced
/// (about 15 s in: 3 polls of `GC_WAIT` and two requeues).
const WAITS_BEFORE_EVENT: u32 = 3;

/// Counts one more look at a held deletion; returns when to look again.
pub(super) async fn wait_for_deletion(
    exec: &Executor,
    key: &JobKey,
    id: &str,
    finalizers: &[String],
) -> Duration {
    let waits = {
        let mut w = exec.waits.lock().unwrap_or_else(|e| e.into_inner());
        let n = w.entry(id.to_string()).or_default();
        *n = n.saturating_add(1);
        *n
    };
    let kind = exec.kind_of(key).kind();
    info!(%id, waits, ?finalizers, kind, "waiting for the old object to be deleted");
    if waits == WAITS_BEFORE_EVENT {
        let held = if finalizers.is_empty() {
            "-".to_string()
        } else {
            finalizers.join(", ")
        };
        let note = format!(
            "remediation {id} waits for {kind} {key} to be deleted; finalizers holding it: {held}"
        );
        let regarding = exec.regarding(key, None);
        exec.publish(EventType::Warning, "RemediationWaiting", note, &regarding)
            .await;
    }
    wait_delay(waits)
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
    /// The API server would refuse the new Job (a server-side dry run of
    /// its creation said so): the old one was left running, untouched.
    Refused {
        why: String,
    },
}

/// How long one reconcile polls for the garbage collector to remove the old Job.
const GC_WAIT: Duration = Duration::from_secs(4);

/// One look at the Job under the plan's name, and the step it calls for.
enum Look {
    /// Done with the recreation, one way or another.
    Ended(Recreated),
    /// Look again shortly (the deletion is under way, or a create raced).
    Again,
}

/// Deletes the old Job (orphaning its dependents, the profile among them),
/// deletes its pods, creates the manifest. Idempotent; see the module docs.
/// Polls for the garbage collector up to `GC_WAIT`, more and more slowly.
async fn recreate(
    exec: &Executor,
    jobs: &Api<DynamicObject>,
    key: &JobKey,
    plan: &Plan,
    manifest: &serde_json::Value,
) -> Result<Recreated> {
    let deadline = Instant::now() + GC_WAIT;
    let mut pauses = backoff::RECREATE_POLL.delays();
    loop {
        if let Look::Ended(r) = look(exec, jobs, key, plan, manifest, deadline).await? {
            return Ok(r);
        }
        let pause = pauses.next().unwrap_or(backoff::RECREATE_POLL.max());
        tokio::time::sleep(pause).await;
    }
}

fn step_error<'a>(
    plan: &'a Plan,
    key: &'a JobKey,
    step: &'a str,
) -> impl Fn(kube::Error) -> Error + 'a {
    move |source| Error::Step {
        id: plan.id.clone(),
        step: format!("{step} {} {key}", kind_of(plan).kind()),
        source,
    }
}

async fn look(
    exec: &Executor,
    jobs: &Api<DynamicObject>,
    key: &JobKey,
    plan: &Plan,
    manifest: &serde_json::Value,
    deadline: Instant,
) -> Result<Look> {
    let (id, old, name) = (&plan.id, &plan.job_uid, key.name.as_str());
    let current = jobs
        .get_opt(name)
        .await
        .map_err(step_error(plan, key, "reading"))?;
    match current {
        Some(j) if j.uid().as_deref() == Some(old.as_str()) => {
            if j.metadata.deletion_timestamp.is_none() {
                // Nothing is deleted that could not be created again.
                if let Some(why) = refused_on_dry_run(jobs, key, plan, manifest).await? {
                    return Ok(Look::Ended(Recreated::Refused { why }));
                }
                delete_job(jobs, name, old)
                    .await
                    .map_err(step_error(plan, key, "deleting"))?;
                info!(%id, job = %name, "deleted the Job (orphaning its dependents)");
                failpoint(FAILPOINT_AFTER_DELETE);
            } else if Instant::now() > deadline {
                let finalizers = j.finalizers().to_vec();
                return Ok(Look::Ended(Recreated::Waiting { finalizers }));
            }
            Ok(Look::Again)
        }
        Some(j) if super::verify::created_from(j.annotations(), manifest) => {
            delete_old_pods(exec, key, plan).await?;
            let uid = j.uid().unwrap_or_default();
            Ok(Look::Ended(Recreated::Done { uid }))
        }
        Some(j) => {
            let uid = j.uid().unwrap_or_default();
            Ok(Look::Ended(Recreated::Foreign { uid }))
        }
        None => {
            delete_old_pods(exec, key, plan).await?;
            create(jobs, key, plan, manifest).await
        }
    }
}

/// Whether the API server would refuse the planned Job for good, asked by
/// a server-side dry run of its creation (validation, quota and admission
/// webhooks all run; nothing is stored). The old Job still holds the name,
/// so an acceptable manifest is answered 409 AlreadyExists, which the API
/// server checks last: `None`. A refusal retrying cannot fix: `Some(why)`.
async fn refused_on_dry_run(
    jobs: &Api<DynamicObject>,
    key: &JobKey,
    plan: &Plan,
    manifest: &serde_json::Value,
) -> Result<Option<String>> {
    let obj: DynamicObject = serde_json::from_value(manifest.clone())
        .map_err(|e| Error::Serialize("the Job manifest", e))?;
    let pp = PostParams {
        dry_run: true,
        field_manager: Some(REMEDIATION_MANAGER.into()),
    };
    match jobs.create(&pp, &obj).await {
        Ok(_) => Ok(None),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(None),
        Err(kube::Error::Api(s)) if terminal_code(s.code) => {
            Ok(Some(format!("{} ({})", s.message, s.code)))
        }
        Err(e) => Err(step_error(plan, key, "checking (dry run) the new")(e)),
    }
}

/// Creates the planned Job.
async fn create(
    jobs: &Api<DynamicObject>,
    key: &JobKey,
    plan: &Plan,
    manifest: &serde_json::Value,
) -> Result<Look> {
    let obj: DynamicObject = serde_json::from_value(manifest.clone())
        .map_err(|e| Error::Serialize("the Job manifest", e))?;
    let pp = PostParams {
        field_manager: Some(REMEDIATION_MANAGER.into()),
        ..Default::default()
    };
    match jobs.create(&pp, &obj).await {
        Ok(created) => {
            info!(id = %plan.id, job = %key, "created the Job again with the new values");
            let uid = created.uid().unwrap_or_default();
            Ok(Look::Ended(Recreated::Done { uid }))
        }
        // Created meanwhile (by us, in an earlier attempt, or by someone): look again.
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(Look::Again),
        Err(kube::Error::Api(s)) if terminal_code(s.code) => {
            let why = format!("{} ({})", s.message, s.code);
            Ok(Look::Ended(Recreated::Lost { why }))
        }
        // Transient (429, 5xx, network): retried with backoff; the
        // manifest is safe in the plan ConfigMap meanwhile.
        Err(e) => {
            let from = format!("creating (from ConfigMap {})", config_map_name(&plan.id));
            let error = step_error(plan, key, &from)(e);
            Err(error)
        }
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

/// Deletes the old Job's pods (a workload's: what its controller created),
/// orphaned by the deletion: the trainer must not keep running next to the
/// new one's.
async fn delete_old_pods(exec: &Executor, key: &JobKey, plan: &Plan) -> Result<()> {
    if kind_of(plan) != WorkloadKind::Job {
        return suspend_step::delete_old_children(exec, key, plan).await;
    }
    let pods: Api<Pod> = Api::namespaced(exec.client.clone(), &key.namespace);
    for label in ["controller-uid", "batch.kubernetes.io/controller-uid"] {
        let lp = ListParams::default().labels(&format!("{label}={}", plan.job_uid));
        if let Err(e) = pods
            .delete_collection(&DeleteParams::background(), &lp)
            .await
        {
            return Err(Error::Step {
                id: plan.id.clone(),
                step: format!("deleting the old pods of Job {key}"),
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
    fn a_config_map_that_cannot_be_written_says_why_in_the_record() {
        assert_eq!(
            Unwritable::NotOptedIn("train-cfg".into()).to_string(),
            "ConfigMap train-cfg is not labelled memprof.dev/remediable=true: not written"
        );
        assert_eq!(
            Unwritable::Gone("train-cfg".into()).to_string(),
            "ConfigMap train-cfg is gone"
        );
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
