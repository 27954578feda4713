//! Pure: a remediation plan for a top-level workload (JobSet, TrainJob,
//! PyTorchJob) rather than a batch/v1 Job.
//!
//! The policy's planning (`memprof_policy::plan`) reads a Job. A workload
//! is planned on a Job *view* of it (its metadata, its first pod template),
//! so every value is computed as for a Job (`BATCH_SIZE 32 -> 24`, the
//! accumulation keeping the global batch); the environment change is then
//! turned into the one the workload's kind allows, the least disruptive
//! way (`crate::workload::action::env_change`): suspend, patch every pod
//! template, resume for a Kueue-managed suspendable kind, else the whole
//! top-level object recreated (never a child Job: its controller would
//! fight it). Both are saved in the plan before anything is changed, so a
//! restarted operator finishes the same change.

use crate::workload::action::{set_env, suspend_patch, EnvChange};
use memprof_api::workload::WorkloadKind;
use memprof_policy::plan::{Plan, Step};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

/// The Job the policy's planning reads for workload `object` of `kind`:
/// its metadata, and its first pod template as the Job's. A TrainJob has
/// no pod template: its trainer's `env` is the one container's.
pub fn job_view(kind: WorkloadKind, object: &Value) -> Value {
    let template = match kind {
        WorkloadKind::Job => return object.clone(),
        WorkloadKind::JobSet => object
            .pointer("/spec/replicatedJobs/0/template/spec/template")
            .cloned(),
        WorkloadKind::PyTorchJob => ["Master", "Worker"].iter().find_map(|t| {
            object
                .pointer(&format!("/spec/pytorchReplicaSpecs/{t}/template"))
                .cloned()
        }),
        WorkloadKind::TrainJob => {
            let env = object
                .pointer("/spec/trainer/env")
                .cloned()
                .unwrap_or(json!([]));
            Some(json!({"spec": {"containers": [{"name": "trainer", "env": env}]}}))
        }
    };
    json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": object["metadata"].clone(),
        "spec": {"template": template.unwrap_or(json!({}))},
    })
}

/// Each variable a plan's env changes set, with its new value (the batch,
/// and the accumulation that keeps the global batch), once each.
pub fn vars(changes: &[memprof_policy::plan::EnvChange]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut push = |name: &str, to: u64| {
        if !out.iter().any(|(n, _)| n == name) {
            out.push((name.to_string(), to.to_string()));
        }
    };
    for c in changes {
        push(&c.env, c.to);
        if let Some(a) = &c.accumulation {
            push(&a.env, a.to);
        }
    }
    out
}

/// `plan`, made on [`job_view`] of `object`, turned into the plan for the
/// workload itself: its kind named, its environment changed `how`.
pub fn for_workload(mut plan: Plan, kind: WorkloadKind, object: &Value, how: EnvChange) -> Plan {
    plan.kind = Some(kind.kind().to_string());
    let own = annotations(object);
    for step in &mut plan.steps {
        let Step::Recreate { changes, manifest } = step else {
            continue;
        };
        // What the planning added to the view's annotations (the
        // remediation id, its nonce, the original values) goes on the workload.
        let added: BTreeMap<String, String> = annotations(manifest)
            .into_iter()
            .filter(|(k, v)| own.get(k) != Some(v))
            .collect();
        let suspend = manifest.pointer("/spec/suspend") == Some(&json!(true));
        let changes = std::mem::take(changes);
        *step = match how {
            EnvChange::SuspendPatchResume => Step::SuspendPatchResume {
                changes,
                annotations: added,
            },
            EnvChange::Recreate => {
                let manifest = recreated(kind, object, &changes, &added, suspend);
                Step::Recreate { changes, manifest }
            }
        };
    }
    plan
}

/// How `plan` changes the environment, as the record names it.
pub fn env_change_of(plan: &Plan) -> Option<EnvChange> {
    plan.steps.iter().find_map(|s| match s {
        Step::SuspendPatchResume { .. } => Some(EnvChange::SuspendPatchResume),
        Step::Recreate { .. } => Some(EnvChange::Recreate),
        _ => None,
    })
}

/// The kind a plan acts on (a Job unless it names another).
pub fn kind_of(plan: &Plan) -> WorkloadKind {
    plan.kind
        .as_deref()
        .and_then(|k| {
            memprof_api::workload::WORKLOAD_KINDS
                .into_iter()
                .find(|w| w.kind() == k)
        })
        .unwrap_or(WorkloadKind::Job)
}

fn annotations(object: &Value) -> BTreeMap<String, String> {
    object["metadata"]["annotations"]
        .as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

/// The workload to create in place of `object`: the user's object with the
/// new environment in every pod template and the plan's annotations,
/// server-set fields stripped.
fn recreated(
    kind: WorkloadKind,
    object: &Value,
    changes: &[memprof_policy::plan::EnvChange],
    added: &BTreeMap<String, String>,
    suspend: bool,
) -> Value {
    let meta = &object["metadata"];
    let mut annotations: Map<String, Value> =
        meta["annotations"].as_object().cloned().unwrap_or_default();
    for (k, v) in added {
        annotations.insert(k.clone(), json!(v));
    }
    let mut manifest = json!({
        "apiVersion": kind.api_version(),
        "kind": kind.kind(),
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "labels": meta.get("labels").cloned().unwrap_or(json!({})),
            "annotations": annotations,
        },
        "spec": object["spec"].clone(),
    });
    let vars = vars(changes);
    let refs: Vec<(&str, &str)> = vars.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
    set_env(kind, &mut manifest, &refs);
    if let Some(patch) = suspend.then(|| suspend_patch(kind, true)).flatten() {
        merge(&mut manifest, &patch);
    }
    manifest
}

/// JSON merge patch (RFC 7386) of `patch` into `target`.
fn merge(target: &mut Value, patch: &Value) {
    match (target.as_object_mut(), patch.as_object()) {
        (Some(t), Some(p)) => {
            for (k, v) in p {
                merge(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        _ => *target = patch.clone(),
    }
}

mod gpu;
pub use gpu::with_gpu_requests;

#[cfg(test)]
mod tests;
