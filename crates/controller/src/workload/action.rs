//! How a workload's environment is changed (a smaller batch, more
//! accumulation steps), the least disruptive way its kind allows.
//!
//! Where the kind can be suspended and Kueue manages it (the top-level
//! object carries `kueue.x-k8s.io/queue-name`), memprof suspends it,
//! patches the environment of every pod template, and resumes it: the
//! workload keeps its name, uid, queue position semantics and history, and
//! Kueue re-admits it as it admits any resumed workload. Deleting it would
//! throw its admission away. Anywhere else the workload is recreated at the
//! top level with the recorded, crash-safe plan protocol Jobs use today
//! (docs/remediation.md). A JobSet's or PyTorchJob's own controller
//! recreates the pods on resume; memprof never edits a child Job or pod,
//! which that controller would fight.

use memprof_api::workload::{WorkloadKind, LABEL_KUEUE_QUEUE};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// The two ways, as the remediation record names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EnvChange {
    /// Suspend, patch every pod template's environment, resume.
    SuspendPatchResume,
    /// Delete and create again under the same name (the Job protocol).
    Recreate,
}

impl EnvChange {
    /// The word the remediation record keeps.
    pub fn as_str(self) -> &'static str {
        match self {
            EnvChange::SuspendPatchResume => "suspend-patch-resume",
            EnvChange::Recreate => memprof_policy::triggers::ENV_CHANGE_RECREATE,
        }
    }
}

/// Which way for a top-level workload of `kind` whose labels (as read from
/// the API server) are `labels`.
pub fn env_change(kind: WorkloadKind, labels: Option<&BTreeMap<String, String>>) -> EnvChange {
    let queued = labels
        .and_then(|l| l.get(LABEL_KUEUE_QUEUE))
        .is_some_and(|q| !q.is_empty());
    match (kind.suspend_path(), queued) {
        (Some(_), true) => EnvChange::SuspendPatchResume,
        _ => EnvChange::Recreate,
    }
}

/// The merge patch that sets `kind`'s suspend switch to `suspend` (`None`
/// for a kind memprof does not suspend).
pub fn suspend_patch(kind: WorkloadKind, suspend: bool) -> Option<Value> {
    let path = kind.suspend_path()?;
    let mut patch = json!(suspend);
    for key in path.iter().rev() {
        patch = json!({ *key: patch });
    }
    Some(patch)
}

/// JSON pointers of every pod template's containers in a `kind` object.
/// A TrainJob has no pod template of its own: its trainer's `env` is the
/// one place, and Kubeflow Trainer copies it into its JobSet.
fn container_lists(kind: WorkloadKind, object: &Value) -> Vec<String> {
    match kind {
        WorkloadKind::Job => vec!["/spec/template/spec/containers".into()],
        WorkloadKind::JobSet => {
            let n = object
                .pointer("/spec/replicatedJobs")
                .and_then(Value::as_array)
                .map_or(0, Vec::len);
            (0..n.min(super::rank::MAX_REPLICATED_JOBS))
                .map(|i| format!("/spec/replicatedJobs/{i}/template/spec/template/spec/containers"))
                .collect()
        }
        WorkloadKind::PyTorchJob => ["Master", "Worker"]
            .iter()
            .filter(|t| {
                object
                    .pointer(&format!("/spec/pytorchReplicaSpecs/{t}"))
                    .is_some()
            })
            .map(|t| format!("/spec/pytorchReplicaSpecs/{t}/template/spec/containers"))
            .collect(),
        WorkloadKind::TrainJob => vec![],
    }
}

/// Sets each of `vars` in every container of every pod template of
/// `object` (a TrainJob: in `spec.trainer.env`), replacing a variable of
/// that name, adding one otherwise. Returns how many env lists changed.
pub fn set_env(kind: WorkloadKind, object: &mut Value, vars: &[(&str, &str)]) -> usize {
    let mut lists: Vec<String> = Vec::new();
    for at in container_lists(kind, object) {
        let n = object
            .pointer(&at)
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        lists.extend((0..n).map(|i| format!("{at}/{i}/env")));
    }
    if kind == WorkloadKind::TrainJob && object.pointer("/spec/trainer").is_some() {
        lists.push("/spec/trainer/env".into());
    }
    let mut changed = 0;
    for at in lists {
        let Some((parent, _)) = at.rsplit_once('/') else {
            continue;
        };
        let Some(owner) = object.pointer_mut(parent).and_then(Value::as_object_mut) else {
            continue;
        };
        let env = owner.entry("env").or_insert_with(|| json!([]));
        if let Some(list) = env.as_array_mut() {
            changed += usize::from(set_in(list, vars));
        }
    }
    changed
}

/// Sets `vars` in one env list; whether anything changed.
fn set_in(list: &mut Vec<Value>, vars: &[(&str, &str)]) -> bool {
    let mut changed = false;
    for (name, value) in vars {
        let want = json!({"name": name, "value": value});
        match list
            .iter_mut()
            .find(|e| e.get("name").and_then(Value::as_str) == Some(name))
        {
            Some(e) if *e == want => {}
            Some(e) => {
                *e = want;
                changed = true;
            }
            None => {
                list.push(want);
                changed = true;
            }
        }
    }
    changed
}

#[cfg(test)]
mod tests;
