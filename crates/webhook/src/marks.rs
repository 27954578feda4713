//! The admission mark on pods (contract D, `memprof_api::admission`): the
//! webhook sees every profiled pod's creation, and the request names who
//! creates it. A pod the Job controller's identity creates, with a Job as
//! its controller, gets the mark; any other pod that arrives with one has it
//! removed (a copy of a genuine pod's mark is worthless on another pod, and
//! this also closes most of the window in which a copy onto a new pod of the
//! same name would verify).
//!
//! The mark binds the pod's name, so a pod created with `generateName` (the
//! Job controller's always are) gets its name here rather than from the API
//! server, which generates one only when `metadata.name` is empty: 5
//! characters of the API server's own alphabet after the prefix. A clash is
//! answered as the API server answers its own (a retryable error, and the
//! Job controller retries).

use crate::config::MarkConfig;
use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, PatchOperation, RemoveOperation};
use k8s_openapi::api::core::v1::Pod;
use memprof_api::admission::{sign, Subject, ANNOTATION_ADMISSION};
use serde_json::{json, Value};

/// The API server's name generator: its alphabet (no vowels, no look-alikes),
/// its suffix length, and the longest prefix it keeps.
const NAME_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
const NAME_SUFFIX: usize = 5;
const MAX_PREFIX: usize = 63 - NAME_SUFFIX;

/// Who asks for the pod, from the AdmissionRequest.
#[derive(Clone, Copy, Debug)]
pub struct Creation<'a> {
    /// `request.namespace`.
    pub namespace: &'a str,
    /// `request.userInfo.username` (`None`: not given).
    pub username: Option<&'a str>,
    /// When the request is admitted.
    pub now: jiff::Timestamp,
}

/// `generateName` plus a random suffix, as the API server makes names.
pub fn generate_name(prefix: &str) -> String {
    use ring::rand::SecureRandom as _;
    let mut prefix = prefix.to_string();
    if prefix.len() > MAX_PREFIX {
        let mut end = MAX_PREFIX;
        while !prefix.is_char_boundary(end) {
            end -= 1;
        }
        prefix.truncate(end);
    }
    let rng = ring::rand::SystemRandom::new();
    let mut name = prefix;
    let mut added = 0;
    while added < NAME_SUFFIX {
        let mut b = [0u8; 1];
        rng.fill(&mut b)
            .expect("the operating system's random generator works");
        // Rejection sampling: 243 = 9 × 27, so every letter is equally likely.
        if b[0] < 243 {
            name.push(char::from(
                NAME_ALPHABET[usize::from(b[0]) % NAME_ALPHABET.len()],
            ));
            added += 1;
        }
    }
    name
}

fn ptr(tokens: &[&str]) -> PointerBuf {
    PointerBuf::from_tokens(tokens.iter().copied())
}

/// Adds `key: value` to the map at `/metadata/<map>`, creating the map when
/// neither the object nor an earlier operation in `ops` has it.
fn add_to_metadata_map(
    ops: &mut Vec<PatchOperation>,
    had: bool,
    map: &str,
    key: &str,
    value: &str,
) {
    let whole = ptr(&["metadata", map]);
    let created = ops
        .iter()
        .any(|op| matches!(op, PatchOperation::Add(a) if a.path == whole));
    let (path, value) = if had || created {
        (ptr(&["metadata", map, key]), json!(value))
    } else {
        (whole, json!({ key: value }))
    };
    ops.push(PatchOperation::Add(AddOperation { path, value }));
}

/// The uid of the Job named as the pod's controller.
fn controller_job(pod: &Pod) -> Option<&str> {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true) && o.kind == "Job" && o.api_version == "batch/v1")
        .map(|o| o.uid.as_str())
}

/// The pod's name: its own, or one made from `generateName` here (added to
/// `ops`), so that the mark can bind it.
fn bound_name(pod: &Pod, ops: &mut Vec<PatchOperation>) -> Option<String> {
    if let Some(n) = pod.metadata.name.as_deref().filter(|n| !n.is_empty()) {
        return Some(n.to_string());
    }
    let prefix = pod
        .metadata
        .generate_name
        .as_deref()
        .filter(|g| !g.is_empty())?;
    let name = generate_name(prefix);
    ops.push(PatchOperation::Add(AddOperation {
        path: ptr(&["metadata", "name"]),
        value: Value::String(name.clone()),
    }));
    Some(name)
}

/// Appends to `ops` what marks `pod` (see the module docs), after the
/// injection's operations (which may have created the annotation map).
pub fn mark_pod(
    pod: &Pod,
    creation: &Creation<'_>,
    cfg: &MarkConfig,
    ops: &mut Vec<PatchOperation>,
    warnings: &mut Vec<String>,
) {
    let annotations = pod.metadata.annotations.as_ref();
    let planted = annotations.is_some_and(|a| a.contains_key(ANNOTATION_ADMISSION));
    let by_controller = creation
        .username
        .is_some_and(|u| cfg.controllers.iter().any(|c| c == u));
    let job_uid = controller_job(pod).filter(|_| by_controller);
    let ring = cfg.keys.ring();
    let (Some(job_uid), Some(key)) = (job_uid, ring.current()) else {
        if planted {
            ops.push(PatchOperation::Remove(RemoveOperation {
                path: ptr(&["metadata", "annotations", ANNOTATION_ADMISSION]),
            }));
            warnings.push(format!(
                "memprof: removed {ANNOTATION_ADMISSION}: only the Job controller's pods are marked"
            ));
        }
        if job_uid.is_some() {
            tracing::warn!(
                namespace = creation.namespace,
                "admission-mark key not loaded yet: this pod is not marked and will not count"
            );
        }
        return;
    };
    let Some(name) = bound_name(pod, ops) else {
        return; // The API server refuses a pod with neither name nor generateName.
    };
    let subject = Subject {
        namespace: creation.namespace,
        pod: &name,
        job_uid,
    };
    let mark = sign(key, &subject, creation.now);
    add_to_metadata_map(
        ops,
        annotations.is_some(),
        "annotations",
        ANNOTATION_ADMISSION,
        &mark,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::InjectionConfig;
    use crate::mutate::admit_review;
    use jiff::Timestamp;
    use memprof_api::admission::{verify, Key, KeyRing, Keys};

    const JOB_CONTROLLER: &str = "system:serviceaccount:kube-system:job-controller";

    fn cfg(key: &Key) -> InjectionConfig {
        InjectionConfig {
            image: "memprof:test".into(),
            marks: MarkConfig {
                keys: Keys::of(KeyRing::new(key.clone())),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// A pod as the Job controller sends it: generateName, controller ref,
    /// the template's labels and annotations.
    fn job_pod(annotations: Value) -> Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "generateName": "train-",
                "namespace": "ml",
                "labels": {"job-name": "train", "memprof.dev/managed": "true"},
                "annotations": annotations,
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "train",
                                     "uid": "job-uid", "controller": true}],
            },
            "spec": {"containers": [{"name": "trainer", "image": "pytorch:2"},
                                    {"name": "memprof-sidecar", "image": "memprof:test"}]},
        })
    }

    /// The pod after `user` created it through the webhook, and the warnings.
    fn admitted(pod: &Value, user: &str, cfg: &InjectionConfig) -> (Value, Vec<String>) {
        let body = serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": "ml", "operation": "CREATE",
                "userInfo": {"username": user, "groups": ["system:authenticated"]},
                "object": pod,
            }
        }))
        .unwrap();
        let response = admit_review(&body, cfg)["response"].clone();
        assert_eq!(response["allowed"], true);
        let mut out = pod.clone();
        if let Some(p) = response["patch"].as_str() {
            use base64::Engine as _;
            let bytes = base64::engine::general_purpose::STANDARD.decode(p).unwrap();
            let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
            json_patch::patch(&mut out, &patch).unwrap();
        }
        let warnings = response["warnings"]
            .as_array()
            .map(|w| w.iter().map(|s| s.as_str().unwrap().to_string()).collect())
            .unwrap_or_default();
        (out, warnings)
    }

    fn mark_of(pod: &Value) -> Option<&str> {
        pod.pointer("/metadata/annotations/memprof.dev~1admission")?
            .as_str()
    }

    #[test]
    fn the_job_controllers_pod_is_named_and_marked_for_itself() {
        let key = Key::generate();
        for annotations in [Value::Null, json!({"memprof.dev/injected": "true"})] {
            let (out, warnings) = admitted(&job_pod(annotations), JOB_CONTROLLER, &cfg(&key));
            assert!(warnings.is_empty(), "{warnings:?}");
            let name = out["metadata"]["name"].as_str().expect("a name");
            let suffix = name.strip_prefix("train-").unwrap();
            assert_eq!(suffix.len(), 5);
            assert!(suffix.bytes().all(|b| NAME_ALPHABET.contains(&b)), "{name}");
            let subject = Subject {
                namespace: "ml",
                pod: name,
                job_uid: "job-uid",
            };
            let now = Timestamp::now();
            let ring = KeyRing::new(key.clone());
            assert_eq!(verify(&ring, mark_of(&out), &subject, now, now), Ok(()));
        }
        // kube-controller-manager's own identity (no per-controller credentials) too.
        let (out, _) = admitted(
            &job_pod(Value::Null),
            "system:kube-controller-manager",
            &cfg(&key),
        );
        assert!(mark_of(&out).is_some());
        // A name the creator chose is kept and bound.
        let mut named = job_pod(Value::Null);
        named["metadata"]["name"] = json!("train-fixed");
        let (out, _) = admitted(&named, JOB_CONTROLLER, &cfg(&key));
        assert_eq!(out["metadata"]["name"], "train-fixed");
        assert!(mark_of(&out).unwrap().starts_with("v1."));
    }

    #[test]
    fn a_pod_anyone_else_creates_is_not_marked_and_a_planted_mark_is_removed() {
        let key = Key::generate();
        let (out, warnings) = admitted(&job_pod(Value::Null), "tenant", &cfg(&key));
        assert_eq!(mark_of(&out), None);
        assert!(
            out["metadata"].get("name").is_none(),
            "left to the API server"
        );
        assert!(warnings.is_empty());
        let copied = json!({"memprof.dev/admission": "v1.1800000000.AAAA"});
        let (out, warnings) = admitted(&job_pod(copied), "tenant", &cfg(&key));
        assert_eq!(mark_of(&out), None);
        assert!(
            warnings[0].contains("removed memprof.dev/admission"),
            "{warnings:?}"
        );
        // Not a Job's pod: nothing to bind, no mark, even from the controller.
        let mut bare = job_pod(Value::Null);
        bare["metadata"]["ownerReferences"] = json!([]);
        let (out, _) = admitted(&bare, JOB_CONTROLLER, &cfg(&key));
        assert_eq!(mark_of(&out), None);
    }

    #[test]
    fn nothing_is_marked_before_the_key_is_loaded() {
        let unloaded = InjectionConfig {
            image: "memprof:test".into(),
            ..Default::default()
        };
        let (out, _) = admitted(&job_pod(Value::Null), JOB_CONTROLLER, &unloaded);
        assert_eq!(mark_of(&out), None);
    }

    #[test]
    fn profiled_jobs_their_templates_and_injected_pods_are_labelled_managed() {
        let key = Key::generate();
        let job = json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "train", "annotations": {"memprof.dev/enabled": "true"}},
            "spec": {"template": {"spec": {"restartPolicy": "Never",
                     "containers": [{"name": "trainer", "image": "pytorch:2"}]}}},
        });
        let inj = crate::injection_patch(crate::Target::Job, &job, &cfg(&key)).unwrap();
        let mut out = job.clone();
        json_patch::patch(&mut out, &inj.patch.unwrap()).unwrap();
        assert_eq!(out["metadata"]["labels"]["memprof.dev/managed"], "true");
        let template = &out["spec"]["template"]["metadata"]["labels"];
        assert_eq!(template["memprof.dev/managed"], "true");
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "labels": {"memprof.dev/inject": "true"}},
            "spec": {"containers": [{"name": "trainer", "image": "pytorch:2"}]},
        });
        let (out, _) = admitted(&pod, "someone", &cfg(&key));
        assert_eq!(out["metadata"]["labels"]["memprof.dev/managed"], "true");
        assert_eq!(mark_of(&out), None, "a bare pod has no Job to bind");
    }

    #[test]
    fn generated_names_keep_the_api_servers_length_limit() {
        let long = "x".repeat(70);
        let name = generate_name(&long);
        assert_eq!(name.len(), 63);
        assert!(name.starts_with(&"x".repeat(58)));
    }
}
