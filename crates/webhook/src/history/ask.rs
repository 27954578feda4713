//! What a Job under admission asks of the history, read from its object:
//! its family, its literal env values (the batch the model needs), its
//! annotated GPU memory and its labels (what a policy selects on). Pure.

use memprof_api::family::{parse_family, FamilyError, ANNOTATION_FAMILY};
use memprof_api::{parse_bytes, ANNOTATION_ENABLED, ANNOTATION_GPU_MEMORY};
use serde_json::Value;
use std::collections::BTreeMap;

/// Env values kept of one Job, at most: the model needs one.
const MAX_ENV: usize = 256;

/// A profiled Job's question to the history.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Ask {
    /// The Job's namespace: the only one whose history is read.
    pub namespace: String,
    /// The Job's family, a valid label value.
    pub family: String,
    /// Literal env values of the Job's containers, first container first.
    pub env: BTreeMap<String, String>,
    /// `memprof.dev/gpu-memory`, when set and readable.
    pub gpu: Option<u64>,
    /// The Job's labels.
    pub labels: BTreeMap<String, String>,
}

/// What a Job's object asks: None unless it is profiled and names a family;
/// `Err` (said as a warning) when the family cannot be a label value.
pub fn ask_of(namespace: &str, job: &Value) -> Option<Result<Ask, FamilyError>> {
    let meta = job.get("metadata")?;
    let template = job.pointer("/spec/template/metadata");
    let annotation = |key: &str| {
        [Some(meta), template]
            .into_iter()
            .flatten()
            .find_map(|m| m.get("annotations")?.get(key)?.as_str())
    };
    // As the injection decides (mutate.rs): the opt-in is the Job's own.
    let enabled = meta
        .get("annotations")
        .and_then(|a| a.get(ANNOTATION_ENABLED));
    if enabled.and_then(Value::as_str) != Some("true") {
        return None;
    }
    let family = annotation(ANNOTATION_FAMILY)?;
    let family = match parse_family(family) {
        Ok(f) => f.to_string(),
        Err(e) => return Some(Err(e)),
    };
    let labels = meta
        .get("labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default();
    Some(Ok(Ask {
        namespace: namespace.to_string(),
        family,
        env: literal_env(job),
        gpu: annotation(ANNOTATION_GPU_MEMORY).and_then(|g| parse_bytes(g).ok()),
        labels,
    }))
}

/// The literal env values of the pod template's containers (the first
/// container that sets a name wins), bounded.
fn literal_env(job: &Value) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    let containers = job
        .pointer("/spec/template/spec/containers")
        .and_then(Value::as_array);
    let vars = containers
        .into_iter()
        .flatten()
        .filter_map(|c| c.get("env")?.as_array())
        .flatten();
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
        let a = ask_of("ns", &j).unwrap().unwrap();
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
            ask_of("ns", &job(json!({ "memprof.dev/enabled": "true" }))),
            None
        );
        assert_eq!(
            ask_of("ns", &job(json!({ "memprof.dev/family": "x" }))),
            None
        );
        let mut on_template = job(json!({ "memprof.dev/family": "x" }));
        on_template["spec"]["template"]["metadata"] =
            json!({ "annotations": { "memprof.dev/enabled": "true" } });
        assert_eq!(
            ask_of("ns", &on_template),
            None,
            "not profiled: not injected either"
        );
        let bad = job(json!({ "memprof.dev/enabled": "true", "memprof.dev/family": "a b" }));
        let e = ask_of("ns", &bad).unwrap().unwrap_err();
        assert!(e.to_string().contains("must be a label value"), "{e}");
    }
}
