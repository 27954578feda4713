//! What a workload under admission asks of the history, read from its
//! object: its family, its literal env values (the batch the model needs),
//! its annotated GPU memory and its labels (what a policy selects on). Pure.
//!
//! Every kind memprof profiles as one workload asks the same way, each read
//! where that kind keeps it ([`Shape`]): a Job, a JobSet (over its
//! replicated jobs' pod templates), a TrainJob (its trainer's env) and a
//! PyTorchJob (its Master's then Worker's template). The family is the one
//! the object names on itself, never on a pod template
//! (`memprof_api::family::named_family`), where the operator reads it for
//! the workload's profile. A JobSet's child Job asks nothing:
//! it is predicted with its JobSet, and a refusal would fail the JobSet
//! controller's creation of it, not tell its creator.

use memprof_api::family::{named_family, FamilyError};
use memprof_api::workload::WorkloadKind;
use memprof_api::{parse_bytes, ANNOTATION_ENABLED, ANNOTATION_GPU_MEMORY};
use serde_json::Value;
use std::collections::BTreeMap;

/// Env values kept of one workload, at most: the model needs one.
const MAX_ENV: usize = 256;
/// Pod templates read of one workload, at most (a JobSet's replicated jobs).
const MAX_TEMPLATES: usize = 64;

/// A profiled workload's question to the history.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Ask {
    /// Its kind, as the warning names it (`Job`, `JobSet`, …).
    pub kind: &'static str,
    /// Its namespace: the only one whose history is read.
    pub namespace: String,
    /// Its family, a valid label value.
    pub family: String,
    /// Literal env values of its containers, first container first.
    pub env: BTreeMap<String, String>,
    /// `memprof.dev/gpu-memory`, when set and readable.
    pub gpu: Option<u64>,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
}

/// Where a kind keeps what the ask reads.
struct Shape<'a> {
    /// The metadata whose `memprof.dev/enabled: "true"` profiles it (where
    /// its injection reads the opt-in); None: its opt-in is not in the object.
    opt_in: Option<Vec<&'a Value>>,
    /// The metadata read for the GPU's memory, first that names it wins.
    gpu: Vec<&'a Value>,
    /// Its env lists, in rank order (the first that sets a name wins).
    env: Vec<&'a Value>,
}

/// The ask of `obj`, a `kind` being created in `namespace`: None unless it
/// is profiled and names a family; `Err` (said as a warning) when the
/// family cannot be a label value.
pub fn ask_of(
    kind: WorkloadKind,
    namespace: &str,
    obj: &Value,
) -> Option<Result<Ask, FamilyError>> {
    let meta = obj.get("metadata")?;
    let shape = shape_of(kind, obj, meta)?;
    let annotation = |from: &[&Value], key: &str| {
        from.iter()
            .find_map(|m| m.get("annotations")?.get(key)?.as_str())
            .map(str::to_string)
    };
    let enabled = |m: &&Value| annotation(&[*m], ANNOTATION_ENABLED).as_deref() == Some("true");
    if shape.opt_in.is_some_and(|o| !o.iter().any(enabled)) {
        return None;
    }
    let family = match named_family(&string_map(meta, "annotations"))? {
        Ok(f) => f.to_string(),
        Err(e) => return Some(Err(e)),
    };
    let gpu = annotation(&shape.gpu, ANNOTATION_GPU_MEMORY);
    Some(Ok(Ask {
        kind: kind.kind(),
        namespace: namespace.to_string(),
        family,
        env: literal_env(&shape.env),
        gpu: gpu.and_then(|g| parse_bytes(&g).ok()),
        labels: string_map(meta, "labels"),
    }))
}

/// Where `kind` keeps its opt-in, GPU annotation and env; None for
/// a JobSet's child Job (asked with its JobSet).
fn shape_of<'a>(kind: WorkloadKind, obj: &'a Value, meta: &'a Value) -> Option<Shape<'a>> {
    if kind == WorkloadKind::Job && controlled_by_a_jobset(meta) {
        return None;
    }
    let templates = pod_templates(kind, obj);
    let template_meta = templates.iter().filter_map(|t| t.get("metadata"));
    let own_then_templates: Vec<&Value> = std::iter::once(meta).chain(template_meta).collect();
    let env = match kind {
        WorkloadKind::TrainJob => obj.pointer("/spec/trainer/env").into_iter().collect(),
        _ => templates
            .iter()
            .filter_map(|t| t.pointer("/spec/containers")?.as_array())
            .flatten()
            .filter_map(|c| c.get("env"))
            .collect(),
    };
    let opt_in = match kind {
        // As the injection decides (mutate.rs): the opt-in is the object's own.
        WorkloadKind::Job | WorkloadKind::PyTorchJob => Some(vec![meta]),
        // Its child Jobs' opt-in is their template's (the JobSet controller
        // copies it onto them), or said on the JobSet itself.
        WorkloadKind::JobSet => {
            let jobs = replicated_jobs(obj).filter_map(|rj| rj.pointer("/template/metadata"));
            Some(std::iter::once(meta).chain(jobs).collect())
        }
        // Its opt-in is in its runtime, which is not read here: naming a
        // family asks.
        WorkloadKind::TrainJob => None,
    };
    Some(Shape {
        opt_in,
        gpu: own_then_templates,
        env,
    })
}

/// The pod templates of `kind`'s object, in rank order, bounded.
fn pod_templates(kind: WorkloadKind, obj: &Value) -> Vec<&Value> {
    match kind {
        WorkloadKind::Job => obj.pointer("/spec/template").into_iter().collect(),
        WorkloadKind::JobSet => replicated_jobs(obj)
            .filter_map(|rj| rj.pointer("/template/spec/template"))
            .collect(),
        WorkloadKind::PyTorchJob => ["Master", "Worker"]
            .iter()
            .filter_map(|r| obj.pointer(&format!("/spec/pytorchReplicaSpecs/{r}/template")))
            .collect(),
        WorkloadKind::TrainJob => Vec::new(),
    }
}

/// A JobSet's replicated jobs, bounded.
fn replicated_jobs(obj: &Value) -> impl Iterator<Item = &Value> {
    let jobs = obj
        .pointer("/spec/replicatedJobs")
        .and_then(Value::as_array);
    jobs.into_iter().flatten().take(MAX_TEMPLATES)
}

/// Whether a Job's controller owner reference names a JobSet (its word:
/// it only decides that the Job asks nothing of its own).
fn controlled_by_a_jobset(meta: &Value) -> bool {
    let owners = meta.get("ownerReferences").and_then(Value::as_array);
    owners.into_iter().flatten().any(|o| {
        let field = |k: &str| o.get(k).and_then(Value::as_str).unwrap_or_default();
        o.get("controller").and_then(Value::as_bool) == Some(true)
            && WorkloadKind::of(field("apiVersion"), field("kind")) == Some(WorkloadKind::JobSet)
    })
}

/// `meta`'s labels or annotations (`key`), string values only.
fn string_map(meta: &Value, key: &str) -> BTreeMap<String, String> {
    meta.get(key)
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

/// The literal values of `lists` (env arrays, in order; the first that
/// sets a name wins), bounded.
fn literal_env(lists: &[&Value]) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    let vars = lists.iter().filter_map(|l| l.as_array()).flatten();
    for var in vars.take(MAX_ENV) {
        if let (Some(name), Some(value)) = (
            var.get("name").and_then(Value::as_str),
            var.get("value").and_then(Value::as_str),
        ) {
            env.entry(name.to_string())
                .or_insert_with(|| value.to_string());
        }
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn job(annotations: Value) -> Value {
        json!({
            "metadata": { "annotations": annotations, "labels": { "team": "ml" } },
            "spec": { "template": { "spec": { "containers": [
                { "name": "a", "env": [{ "name": "BATCH_SIZE", "value": "64" },
                                       { "name": "FROM", "valueFrom": {} }] },
                { "name": "b", "env": [{ "name": "BATCH_SIZE", "value": "8" }] }
            ]}}}
        })
    }

    #[test]
    fn a_profiled_job_with_a_family_asks() {
        let j = job(json!({
            "memprof.dev/enabled": "true",
            "memprof.dev/family": "llama",
            "memprof.dev/gpu-memory": "80GiB"
        }));
        let a = ask_of(WorkloadKind::Job, "ns", &j).unwrap().unwrap();
        assert_eq!((a.namespace.as_str(), a.family.as_str()), ("ns", "llama"));
        assert_eq!(
            a.env.get("BATCH_SIZE").map(String::as_str),
            Some("64"),
            "first wins"
        );
        assert!(!a.env.contains_key("FROM"), "only literal values");
        assert_eq!(a.gpu, Some(80 << 30));
        assert_eq!(a.labels.get("team").map(String::as_str), Some("ml"));
    }

    #[test]
    fn no_family_or_not_profiled_asks_nothing_and_a_bad_family_is_said() {
        assert_eq!(
            ask_of(
                WorkloadKind::Job,
                "ns",
                &job(json!({ "memprof.dev/enabled": "true" }))
            ),
            None
        );
        assert_eq!(
            ask_of(
                WorkloadKind::Job,
                "ns",
                &job(json!({ "memprof.dev/family": "x" }))
            ),
            None
        );
        let mut on_template = job(json!({ "memprof.dev/family": "x" }));
        on_template["spec"]["template"]["metadata"] =
            json!({ "annotations": { "memprof.dev/enabled": "true" } });
        assert_eq!(
            ask_of(WorkloadKind::Job, "ns", &on_template),
            None,
            "not profiled: not injected either"
        );
        let bad = job(json!({ "memprof.dev/enabled": "true", "memprof.dev/family": "a b" }));
        let e = ask_of(WorkloadKind::Job, "ns", &bad).unwrap().unwrap_err();
        assert!(e.to_string().contains("must be a label value"), "{e}");
    }

    /// One rule with the operator (`memprof_api::family::named_family`): a
    /// Job's family is its own annotation. One only on its pod template is
    /// not read: the operator never labels the Job's profile with it, so the
    /// Job would be predicted from a history it never joins.
    #[test]
    fn a_family_only_on_a_jobs_pod_template_asks_nothing() {
        let mut j = job(json!({ "memprof.dev/enabled": "true" }));
        j["spec"]["template"]["metadata"] =
            json!({ "annotations": { "memprof.dev/family": "llama" } });
        assert_eq!(ask_of(WorkloadKind::Job, "ns", &j), None);
        j["metadata"]["annotations"]["memprof.dev/family"] = json!("own");
        let a = ask_of(WorkloadKind::Job, "ns", &j).unwrap().unwrap();
        assert_eq!(a.family, "own", "its own, not its template's");
    }

    /// A JobSet of two replicated jobs, the first's template profiled
    /// (as its child Jobs will be), `annotations` its own.
    fn jobset(annotations: Value) -> Value {
        let rj = |name: &str, batch: &str, job_annotations: Value| {
            json!({ "name": name, "replicas": 2, "template": {
                "metadata": { "annotations": job_annotations },
                "spec": { "template": {
                    "metadata": { "annotations": { "memprof.dev/gpu-memory": "40GiB" } },
                    "spec": { "containers": [
                        { "name": "t", "env": [{ "name": "BATCH_SIZE", "value": batch }] }]}}}}})
        };
        json!({
            "metadata": { "annotations": annotations, "labels": { "team": "ml" } },
            "spec": { "replicatedJobs": [
                rj("driver", "16", json!({ "memprof.dev/enabled": "true" })),
                rj("workers", "8", json!({ "memprof.dev/family": "child-says" }))
            ]}
        })
    }

    #[test]
    fn a_jobset_asks_with_its_own_family_and_its_templates_env() {
        let js = jobset(json!({ "memprof.dev/family": "llama" }));
        let a = ask_of(WorkloadKind::JobSet, "ns", &js).unwrap().unwrap();
        assert_eq!((a.kind, a.family.as_str()), ("JobSet", "llama"));
        assert_eq!(a.env["BATCH_SIZE"], "16", "the first replicated job's");
        assert_eq!(a.gpu, Some(40 << 30), "from a pod template");
        assert_eq!(a.labels["team"], "ml");
        // A family only in a replicated job's template is not the JobSet's:
        // the operator labels the JobSet's profile with the JobSet's own.
        assert_eq!(ask_of(WorkloadKind::JobSet, "ns", &jobset(json!({}))), None);
        let mut unprofiled = jobset(json!({ "memprof.dev/family": "llama" }));
        unprofiled["spec"]["replicatedJobs"][0]["template"]["metadata"] = json!({});
        assert_eq!(
            ask_of(WorkloadKind::JobSet, "ns", &unprofiled),
            None,
            "no replicated job profiled"
        );
        unprofiled["metadata"]["annotations"]["memprof.dev/enabled"] = json!("true");
        assert!(ask_of(WorkloadKind::JobSet, "ns", &unprofiled).is_some());
    }

    #[test]
    fn a_pytorchjob_asks_from_its_master_then_its_workers() {
        let template = |batch: &str| {
            json!({ "spec": { "containers": [
                { "name": "pytorch", "env": [{ "name": "BATCH_SIZE", "value": batch },
                                             { "name": "SEQ", "value": "2048" }] }]}})
        };
        let mut pt = json!({
            "metadata": { "annotations": { "memprof.dev/family": "llama" } },
            "spec": { "pytorchReplicaSpecs": {
                "Worker": { "replicas": 3, "template": template("8") },
                "Master": { "replicas": 1, "template": template("32") }}}
        });
        assert_eq!(
            ask_of(WorkloadKind::PyTorchJob, "ns", &pt),
            None,
            "not profiled"
        );
        pt["metadata"]["annotations"]["memprof.dev/enabled"] = json!("true");
        let a = ask_of(WorkloadKind::PyTorchJob, "ns", &pt)
            .unwrap()
            .unwrap();
        assert_eq!((a.kind, a.family.as_str()), ("PyTorchJob", "llama"));
        assert_eq!(a.env["BATCH_SIZE"], "32", "the master's first");
        assert_eq!(a.env["SEQ"], "2048");
        pt["metadata"]["annotations"]["memprof.dev/family"] = json!("a/b");
        let bad = ask_of(WorkloadKind::PyTorchJob, "ns", &pt).unwrap();
        assert!(bad.is_err(), "said as a warning");
    }

    #[test]
    fn a_trainjob_asks_with_its_trainers_env_and_a_jobsets_child_job_asks_nothing() {
        let tj = json!({
            "metadata": { "annotations": { "memprof.dev/family": "llama",
                                           "memprof.dev/gpu-memory": "80GiB" } },
            "spec": { "trainer": { "env": [{ "name": "BATCH_SIZE", "value": "64" }] } }
        });
        let a = ask_of(WorkloadKind::TrainJob, "ns", &tj).unwrap().unwrap();
        assert_eq!((a.kind, a.family.as_str()), ("TrainJob", "llama"));
        assert_eq!(a.env["BATCH_SIZE"], "64");
        assert_eq!(a.gpu, Some(80 << 30));
        let mut child = job(json!({ "memprof.dev/enabled": "true", "memprof.dev/family": "x" }));
        assert!(ask_of(WorkloadKind::Job, "ns", &child).is_some());
        child["metadata"]["ownerReferences"] = json!([{ "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet", "name": "js", "uid": "u", "controller": true }]);
        assert_eq!(
            ask_of(WorkloadKind::Job, "ns", &child),
            None,
            "predicted with its JobSet"
        );
    }
}
