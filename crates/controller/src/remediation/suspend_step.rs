//! The steps of a workload's plan that a Job's does not have: suspend,
//! patch the environment and resume (a Kueue-managed JobSet, TrainJob or
//! PyTorchJob, `workload.rs` decides), and the old workload's children
//! deleted after a top-level recreation.
//!
//! Suspend, patch, resume is one step of the saved plan, idempotent as a
//! whole: a restarted operator finds the record `Pending` and the plan
//! saved, and runs the step again from the top (suspending a suspended
//! object and setting a value it holds change nothing), so a workload it
//! suspended is always resumed. Every request names the planned uid, so a
//! workload replaced under its name is never touched. Nothing is deleted.

use super::executor::Executor;
use super::request::{failpoint, merge_params, terminal_code, FAILPOINT_AFTER_SUSPEND};
use super::workload::{kind_of, vars};
use super::{Error, Result};
use crate::key::JobKey;
use crate::workload::action::{set_env, suspend_patch};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PostParams};
use kube::ResourceExt;
use memprof_api::workload::{WorkloadKind, LABEL_JOBSET_NAME};
use memprof_policy::plan::{EnvChange, Plan};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use tracing::info;

/// How the step ended when it could not change the workload.
const GONE: &str = "is gone or was replaced: left alone";

/// What a step did (`Ok`) or why it could not, for good (`Err`): the
/// record says either.
type Ran = std::result::Result<String, String>;

/// Step `suspendPatchResume`: suspends the planned workload, sets the
/// plan's environment in every pod template and its annotations, resumes.
pub(super) async fn run(
    exec: &Executor,
    key: &JobKey,
    plan: &Plan,
    (changes, annotations): (&[EnvChange], &BTreeMap<String, String>),
) -> Result<Ran> {
    let kind = kind_of(plan);
    if let Err(why) = switch(exec, key, plan, true).await? {
        return Ok(Err(why));
    }
    failpoint(FAILPOINT_AFTER_SUSPEND);
    let vars = vars(changes);
    let patched = patch_env(exec, key, plan, &vars, annotations).await;
    // Resumed whatever the patch came to: a workload memprof suspended is
    // never left suspended by it.
    let resumed = switch(exec, key, plan, false).await?;
    let lists = match patched {
        Ok(Some(n)) => n,
        Ok(None) => return Ok(Err(format!("{} {} {GONE}", kind.kind(), key.name))),
        Err(Refused::Retry(e)) => return Err(e),
        Err(Refused::Terminal(why)) => {
            return Ok(Err(format!(
                "the API server refused the new environment of {} {}: {why}; it was resumed \
                 unchanged",
                kind.kind(),
                key.name
            )))
        }
    };
    if let Err(why) = resumed {
        return Ok(Err(why));
    }
    let set: Vec<String> = vars.iter().map(|(n, v)| format!("{n}={v}")).collect();
    info!(id = %plan.id, kind = kind.kind(), name = %key.name, "suspended, patched, resumed");
    Ok(Ok(format!(
        "{} suspended, {} set in {lists} env lists, resumed (uid {} kept: never deleted)",
        kind.kind(),
        set.join(" "),
        plan.job_uid
    )))
}

/// Step `suspend` of a workload: its kind's suspend switch (never resumed
/// by memprof: the policy asked for a suspension).
pub(super) async fn suspend_only(exec: &Executor, key: &JobKey, plan: &Plan) -> Result<Ran> {
    Ok(switch(exec, key, plan, true)
        .await?
        .map(|()| "suspended".to_string()))
}

/// Sets the planned workload's suspend switch to `on`; `Err(why)` when the
/// workload is gone, replaced or cannot be suspended.
async fn switch(
    exec: &Executor,
    key: &JobKey,
    plan: &Plan,
    on: bool,
) -> Result<std::result::Result<(), String>> {
    let kind = kind_of(plan);
    let Some(mut body) = suspend_patch(kind, on) else {
        let why = format!(
            "{} has no suspend switch memprof uses: not suspended",
            kind.kind()
        );
        return Ok(Err(why));
    };
    // The uid makes the patch fail on any other object of this name.
    body["metadata"] = json!({"uid": plan.job_uid});
    let api = exec.objects(&key.namespace, kind);
    match api
        .patch(&key.name, &merge_params(), &Patch::Merge(&body))
        .await
    {
        Ok(_) => Ok(Ok(())),
        Err(kube::Error::Api(s)) if matches!(s.code, 404 | 409 | 422) => {
            Ok(Err(format!("{} {} {GONE}", kind.kind(), key.name)))
        }
        Err(e) => Err(step_error(
            plan,
            key,
            if on { "suspending" } else { "resuming" },
        )(e)),
    }
}

/// Why the environment could not be patched.
enum Refused {
    /// Retry the step (the plan stays pending).
    Retry(Error),
    /// For good: the record says why.
    Terminal(String),
}

/// Sets `vars` and `annotations` on the planned workload, replacing it at
/// the resourceVersion just read (a concurrent edit is a conflict to retry,
/// never overwritten). `Ok(None)`: gone or replaced; `Ok(Some(n))`: n env
/// lists changed (0: already as planned).
async fn patch_env(
    exec: &Executor,
    key: &JobKey,
    plan: &Plan,
    vars: &[(String, String)],
    annotations: &BTreeMap<String, String>,
) -> std::result::Result<Option<usize>, Refused> {
    let kind = kind_of(plan);
    let api = exec.objects(&key.namespace, kind);
    let read = api.get_opt(&key.name).await;
    let obj = match read {
        Ok(Some(o)) if o.uid().as_deref() == Some(plan.job_uid.as_str()) => o,
        Ok(_) => return Ok(None),
        Err(e) => return Err(Refused::Retry(step_error(plan, key, "reading")(e))),
    };
    let mut data =
        serde_json::to_value(&obj).map_err(|e| Refused::Retry(Error::Serialize(kind.kind(), e)))?;
    let refs: Vec<(&str, &str)> = vars.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
    let lists = set_env(kind, &mut data, &refs);
    let ann = &mut data["metadata"]["annotations"];
    if !ann.is_object() {
        *ann = json!({});
    }
    let mut annotated = false;
    for (k, v) in annotations {
        annotated |= ann[k.as_str()] != Value::String(v.clone());
        ann[k.as_str()] = json!(v);
    }
    if lists == 0 && !annotated {
        return Ok(Some(0));
    }
    let obj: DynamicObject = serde_json::from_value(data)
        .map_err(|e| Refused::Retry(Error::Serialize(kind.kind(), e)))?;
    match api.replace(&key.name, &PostParams::default(), &obj).await {
        Ok(_) => Ok(Some(lists)),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(kube::Error::Api(s)) if terminal_code(s.code) => {
            Err(Refused::Terminal(s.message.clone()))
        }
        Err(e) => Err(Refused::Retry(step_error(
            plan,
            key,
            "patching the environment of",
        )(e))),
    }
}

/// What a workload's controller creates, and the label naming the workload
/// on each: the children a top-level recreation leaves orphaned.
fn children(kind: WorkloadKind) -> Option<(ApiResource, &'static str)> {
    match kind {
        WorkloadKind::JobSet => Some((ApiResource::erase::<Job>(&()), LABEL_JOBSET_NAME)),
        WorkloadKind::PyTorchJob => Some((
            ApiResource::erase::<Pod>(&()),
            "training.kubeflow.org/job-name",
        )),
        WorkloadKind::TrainJob => Some((
            crate::workload::read::api_resource(WorkloadKind::JobSet),
            "trainer.kubeflow.org/trainjob-name",
        )),
        WorkloadKind::Job => None,
    }
}

/// Deletes the old workload's children (with theirs, in the background):
/// orphaned by its deletion, they would go on training next to the new
/// one's. Children are those labelled with the workload's name whose
/// controller is the old workload or, once the garbage collector orphaned
/// them, none; the new workload's are never touched.
pub(super) async fn delete_old_children(exec: &Executor, key: &JobKey, plan: &Plan) -> Result<()> {
    let Some((resource, label)) = children(kind_of(plan)) else {
        return Ok(());
    };
    let api: Api<DynamicObject> =
        Api::namespaced_with(exec.client.clone(), &key.namespace, &resource);
    let lp = ListParams::default().labels(&format!("{label}={}", key.name));
    let listed =
        api.list_metadata(&lp)
            .await
            .map_err(step_error(plan, key, "listing the children of"))?;
    for child in listed.items {
        let controller = child
            .owner_references()
            .iter()
            .find(|o| o.controller == Some(true));
        if controller.is_some_and(|o| o.uid != plan.job_uid) {
            continue;
        }
        let mut dp = DeleteParams::background();
        dp.preconditions = child.uid().map(|uid| kube::api::Preconditions {
            uid: Some(uid),
            resource_version: None,
        });
        match api.delete(&child.name_any(), &dp).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if matches!(s.code, 404 | 409) => {}
            Err(e) => return Err(step_error(plan, key, "deleting the old children of")(e)),
        }
    }
    Ok(())
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
