//! The Job a `scaleBatch` recreation creates: the old Job's manifest with
//! what the API server set for the old one stripped, the env changes
//! applied, and the remediation recorded in its annotations (first
//! original values kept across remediations).

use super::accum::set_env;
use super::EnvChange;
use memprof_api::{
    ANNOTATION_BOTTLENECK, ANNOTATION_GPU_OOM, ANNOTATION_IMBALANCE, ANNOTATION_OOM_RISK,
    ANNOTATION_ORIGINAL_PREFIX, ANNOTATION_REMEDIATION, ANNOTATION_TIME_TO_OOM,
};
use serde_json::Value;
use std::collections::BTreeMap;

/// Labels the API server and the Job controller derive from a Job's uid and
/// name; a recreated Job gets fresh ones.
const SERVER_LABELS: [&str; 4] = [
    "controller-uid",
    "batch.kubernetes.io/controller-uid",
    "job-name",
    "batch.kubernetes.io/job-name",
];
/// Metadata the API server sets; creating an object with them fails or lies.
const SERVER_METADATA: [&str; 8] = [
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
    "managedFields",
    "selfLink",
];

/// The annotation keeping an env var's value from before the first remediation.
pub fn original_annotation(env: &str) -> String {
    let mut name: String = env
        .to_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    // The name part of a key is at most 63 characters and ends alphanumeric.
    name.truncate(63 - "original-".len());
    while name.ends_with(|c: char| !c.is_ascii_alphanumeric()) {
        name.pop();
    }
    format!("{ANNOTATION_ORIGINAL_PREFIX}{name}")
}

/// The Job to create in place of `job`: same spec with the env changes,
/// server-set fields stripped, the remediation recorded in annotations.
pub fn recreated_job(
    job: &Value,
    changes: &[EnvChange],
    id: &str,
    extra_annotations: &BTreeMap<String, String>,
    suspend: bool,
) -> Value {
    let mut new = job.clone();
    if let Some(obj) = new.as_object_mut() {
        obj.remove("status");
    }
    let old_uid = job["metadata"]["uid"].as_str().unwrap_or_default();
    strip_server_metadata(&mut new["metadata"], old_uid);
    record_in_annotations(&mut new["metadata"], changes, id, extra_annotations);
    let spec = &mut new["spec"];
    if spec["manualSelector"] != Value::Bool(true) {
        // The API server generates selector and template labels from the new uid.
        if let Some(s) = spec.as_object_mut() {
            s.remove("selector");
        }
        if let Some(labels) = spec["template"]["metadata"]["labels"].as_object_mut() {
            labels.retain(|k, _| !SERVER_LABELS.contains(&k.as_str()));
        }
    }
    if suspend {
        spec["suspend"] = Value::Bool(true);
    }
    apply_env_changes(spec, changes);
    new
}

/// Removes from `meta` what the API server set for the old Job (uid
/// `old_uid`): its identity, its deletion's finalizers, its controller-uid label.
fn strip_server_metadata(meta: &mut Value, old_uid: &str) {
    if let Some(m) = meta.as_object_mut() {
        for f in SERVER_METADATA {
            m.remove(f);
        }
    }
    if let Some(fins) = meta["finalizers"].as_array_mut() {
        // Deletion finalizers belong to the old Job's deletion, not the new Job.
        fins.retain(|f| f != "orphan" && f != "foregroundDeletion");
    }
    if let Some(labels) = meta["labels"].as_object_mut() {
        labels.retain(|k, v| !(k.ends_with("controller-uid") && v == old_uid));
    }
}

/// The remediation's id, the first original value of every changed env var
/// and the policy's annotations, in `meta`'s annotations; the operator's
/// verdict annotations, which describe the old run, removed.
fn record_in_annotations(
    meta: &mut Value,
    changes: &[EnvChange],
    id: &str,
    extra: &BTreeMap<String, String>,
) {
    let annotations = meta.as_object_mut().map(|m| {
        m.entry("annotations")
            .or_insert_with(|| Value::Object(Default::default()))
    });
    let Some(Value::Object(a)) = annotations else {
        return;
    };
    for k in [
        ANNOTATION_OOM_RISK,
        ANNOTATION_TIME_TO_OOM,
        ANNOTATION_IMBALANCE,
        ANNOTATION_BOTTLENECK,
        ANNOTATION_GPU_OOM,
    ] {
        a.remove(k);
    }
    a.insert(ANNOTATION_REMEDIATION.into(), id.into());
    for c in changes {
        // Keep the first original across repeated remediations.
        a.entry(original_annotation(&c.env))
            .or_insert_with(|| c.from.to_string().into());
        if let Some(acc) = &c.accumulation {
            a.entry(original_annotation(&acc.env))
                .or_insert_with(|| acc.from.to_string().into());
        }
    }
    for (k, v) in extra {
        a.insert(k.clone(), v.clone().into());
    }
}

/// Sets each change's new value (and its accumulation's) in its container.
fn apply_env_changes(spec: &mut Value, changes: &[EnvChange]) {
    let Some(containers) = spec["template"]["spec"]["containers"].as_array_mut() else {
        return;
    };
    for c in containers {
        let name = c["name"].as_str().unwrap_or_default().to_string();
        for change in changes.iter().filter(|ch| ch.container == name) {
            set_env(c, &change.env, change.to);
            if let Some(acc) = &change.accumulation {
                set_env(c, &acc.env, acc.to);
            }
        }
    }
}
