//! The admission marks as the webhook gives them (`marks.rs`), driven
//! end to end through `admit_review`: here, under `mutate`, so that `marks`
//! never imports the module that calls it.

use super::admit_review;
use crate::config::{InjectionConfig, MarkConfig};
use crate::marks::*;
use jiff::Timestamp;
use memprof_api::admission::{verify, Key, KeyRing, Keys, Subject};
use serde_json::{json, Value};

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

/// The pod after `user` created it through the webhook, the review sent by
/// the API server, and the warnings.
fn admitted(pod: &Value, user: &str, cfg: &InjectionConfig) -> (Value, Vec<String>) {
    admitted_from(Caller::ApiServer, pod, user, cfg)
}

/// As [`admitted`], the review sent by `caller`.
fn admitted_from(
    caller: Caller,
    pod: &Value,
    user: &str,
    cfg: &InjectionConfig,
) -> (Value, Vec<String>) {
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
    let response = admit_review(&body, cfg, caller)["response"].clone();
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

/// Anyone who reaches the webhook's port can POST a review that claims the
/// Job controller created a pod of their naming for a victim Job: off the
/// API server's secret path, that review gets no mark (and a planted mark
/// is removed on the marks path only), so there is no mark to put on a pod.
#[test]
fn a_review_claiming_the_job_controller_off_the_api_servers_path_is_not_marked() {
    let key = Key::generate();
    let c = cfg(&key);
    let (out, _) = admitted_from(
        Caller::Unverified,
        &job_pod(Value::Null),
        JOB_CONTROLLER,
        &c,
    );
    assert_eq!(mark_of(&out), None);
    // Nor is a mark taken off there: the marks webhook's path alone gives
    // and takes them, whatever order the webhooks run in.
    let planted = json!({"memprof.dev/admission": "v1.1800000000.AAAA"});
    let (out, _) = admitted_from(
        Caller::Unverified,
        &job_pod(planted.clone()),
        JOB_CONTROLLER,
        &c,
    );
    assert_eq!(mark_of(&out), Some("v1.1800000000.AAAA"));
    let (out, warnings) = admitted_from(Caller::ApiServer, &job_pod(planted), "tenant", &c);
    assert_eq!(mark_of(&out), None);
    assert!(
        warnings.iter().any(|w| w.contains("removed")),
        "{warnings:?}"
    );
    // The token decides the caller: the current key's, and nothing else.
    let token = memprof_api::admission::path_token(&key);
    assert_eq!(c.marks.caller(&token), Caller::ApiServer);
    assert_eq!(c.marks.caller(""), Caller::Unverified);
    assert_eq!(
        c.marks
            .caller(&memprof_api::admission::path_token(&Key::generate())),
        Caller::Unverified
    );
    assert_eq!(
        cfg(&Key::generate()).marks.caller(&token),
        Caller::Unverified
    );
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
