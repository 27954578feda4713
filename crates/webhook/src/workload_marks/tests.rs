//! Unit tests of `workload_marks.rs`: each link marked only for the
//! identity that creates it, with the rank labels it set.

use super::*;
use jiff::Timestamp;
use memprof_api::admission::{Key, KeyRing};
use memprof_api::workload::DEFAULT_TRAINER_IDENTITIES;
use memprof_api::workload_mark::verify;
use serde_json::json;

const JOBSET_CONTROLLER: &str = "system:serviceaccount:jobset-system:jobset-controller-manager";
const TRAINING_OPERATOR: &str = "system:serviceaccount:kubeflow:training-operator";
const TENANT: &str = "alice";

fn now() -> Timestamp {
    Timestamp::from_second(1_800_000_000).unwrap()
}

fn creation(user: &str, caller: Caller) -> Creation<'_> {
    Creation {
        namespace: "ml",
        username: Some(user),
        now: now(),
        caller,
    }
}

fn meta(
    name: &str,
    kind: WorkloadKind,
    labels: serde_json::Value,
    annotations: serde_json::Value,
) -> ObjectMeta {
    serde_json::from_value(json!({
        "name": name, "namespace": "ml", "labels": labels, "annotations": annotations,
        "ownerReferences": [{"apiVersion": kind.api_version(), "kind": kind.kind(),
                             "name": "victim", "uid": "owner-uid", "controller": true}],
    }))
    .unwrap()
}

fn child_job(annotations: serde_json::Value) -> ObjectMeta {
    let labels = json!({LABEL_JOBSET_REPLICATED_JOB: "workers", LABEL_JOBSET_JOB_INDEX: "2"});
    meta(
        "victim-workers-2",
        WorkloadKind::JobSet,
        labels,
        annotations,
    )
}

fn pytorch_pod(annotations: serde_json::Value) -> ObjectMeta {
    let labels = json!({LABEL_PYTORCH_REPLICA_TYPE: "worker", LABEL_PYTORCH_REPLICA_INDEX: "0"});
    meta(
        "victim-worker-0",
        WorkloadKind::PyTorchJob,
        labels,
        annotations,
    )
}

/// The mark `ops` add (the value of the one add operation), if any.
fn added(ops: &[PatchOperation]) -> Option<String> {
    ops.iter().find_map(|op| match op {
        PatchOperation::Add(a) => a
            .value
            .get(ANNOTATION_WORKLOAD_MARK)
            .or(Some(&a.value))
            .and_then(|v| v.as_str())
            .map(str::to_string),
        _ => None,
    })
}

fn run(
    what: Marked,
    m: &ObjectMeta,
    c: &Creation<'_>,
    key: &Key,
) -> (Vec<PatchOperation>, Vec<String>) {
    let (mut ops, mut warnings) = (vec![], vec![]);
    let keys = Keys::of(KeyRing::new(key.clone()));
    mark_link(
        what,
        m,
        c,
        &WorkloadIdentities::default(),
        &keys,
        &mut ops,
        &mut warnings,
    );
    (ops, warnings)
}

#[test]
fn the_jobset_controller_s_child_job_is_marked_with_its_rank_labels() {
    let key = Key::generate();
    let m = child_job(json!({}));
    let (ops, _) = run(
        Marked::Job,
        &m,
        &creation(JOBSET_CONTROLLER, Caller::ApiServer),
        &key,
    );
    let mark = added(&ops).expect("marked");
    let link = Link {
        namespace: "ml",
        kind: "Job",
        name: "victim-workers-2",
        controller_uid: "owner-uid",
        identity: "workers/2",
    };
    assert_eq!(
        verify(&KeyRing::new(key), Some(&mark), &link, now(), now()),
        Ok(())
    );
}

#[test]
fn a_tenant_s_job_or_pod_claiming_a_workload_is_not_marked_and_a_planted_mark_is_removed() {
    let key = Key::generate();
    // A tenant creates a Job under the victim's JobSet, or a pod under its PyTorchJob.
    for (what, m) in [
        (Marked::Job, child_job(json!({}))),
        (Marked::Pod, pytorch_pod(json!({}))),
    ] {
        let (ops, _) = run(what, &m, &creation(TENANT, Caller::ApiServer), &key);
        assert!(ops.is_empty(), "{what:?}: {ops:?}");
    }
    let planted = json!({ANNOTATION_WORKLOAD_MARK: "v1.1800000000.copied"});
    for (what, m) in [
        (Marked::Job, child_job(planted.clone())),
        (Marked::Pod, pytorch_pod(planted)),
    ] {
        let (ops, warnings) = run(what, &m, &creation(TENANT, Caller::ApiServer), &key);
        assert!(
            matches!(ops.as_slice(), [PatchOperation::Remove(_)]),
            "{what:?}: {ops:?}"
        );
        assert_eq!(warnings.len(), 1);
    }
    // The right identity for another link: the training operator does not make JobSet children.
    let (ops, _) = run(
        Marked::Job,
        &child_job(json!({})),
        &creation(TRAINING_OPERATOR, Caller::ApiServer),
        &key,
    );
    assert!(ops.is_empty());
    // A review not on the secret path claims any identity: nothing given or taken.
    let (ops, _) = run(
        Marked::Job,
        &child_job(json!({})),
        &creation(JOBSET_CONTROLLER, Caller::Unverified),
        &key,
    );
    assert!(ops.is_empty());
}

#[test]
fn the_training_operator_s_pod_is_marked_only_with_well_formed_rank_labels() {
    let key = Key::generate();
    let c = creation(TRAINING_OPERATOR, Caller::ApiServer);
    let (ops, _) = run(Marked::Pod, &pytorch_pod(json!(null)), &c, &key);
    let mark = added(&ops).expect("marked");
    let link = Link {
        namespace: "ml",
        kind: "Pod",
        name: "victim-worker-0",
        controller_uid: "owner-uid",
        identity: "worker/0",
    };
    assert_eq!(
        verify(&KeyRing::new(key.clone()), Some(&mark), &link, now(), now()),
        Ok(())
    );
    // No replica index: no rank could be bound, no mark.
    let unlabelled = meta(
        "victim-worker-0",
        WorkloadKind::PyTorchJob,
        json!({LABEL_PYTORCH_REPLICA_TYPE: "worker"}),
        json!({}),
    );
    assert!(run(Marked::Pod, &unlabelled, &c, &key).0.is_empty());
    // A pod of a Job (not a PyTorchJob) gets no workload mark, whoever creates it.
    let job_pod = meta("train-x", WorkloadKind::Job, json!({}), json!({}));
    assert!(run(Marked::Pod, &job_pod, &c, &key).0.is_empty());
}

#[test]
fn a_trainjob_s_jobset_is_marked_for_the_trainer_only() {
    let key = Key::generate();
    let m = meta("llm", WorkloadKind::TrainJob, json!({}), json!({}));
    let trainer = DEFAULT_TRAINER_IDENTITIES[0];
    assert!(added(
        &run(
            Marked::JobSet,
            &m,
            &creation(trainer, Caller::ApiServer),
            &key
        )
        .0
    )
    .is_some());
    assert!(run(
        Marked::JobSet,
        &m,
        &creation(TENANT, Caller::ApiServer),
        &key
    )
    .0
    .is_empty());
}

/// Through `admit_review`, as the API server sends the reviews: a JobSet's
/// child Job (not annotated for injection) and a TrainJob's JobSet get
/// their marks; the same Job from a tenant does not.
#[test]
fn reviews_of_child_jobs_and_jobsets_carry_their_marks() {
    let key = Key::generate();
    let cfg = crate::InjectionConfig {
        image: "memprof:test".into(),
        marks: crate::MarkConfig {
            keys: Keys::of(KeyRing::new(key)),
            ..Default::default()
        },
        ..Default::default()
    };
    let review = |kind: serde_json::Value, user: &str, object: serde_json::Value| {
        let body = serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u", "kind": kind, "namespace": "ml", "operation": "CREATE",
                        "resource": {"group": "", "version": "v1", "resource": "x"},
                        "userInfo": {"username": user}, "object": object}}))
        .unwrap();
        let response = crate::admit_review(&body, &cfg, Caller::ApiServer)["response"].clone();
        assert_eq!(response["allowed"], true);
        response["patch"].as_str().map(|p| {
            use base64::Engine as _;
            String::from_utf8(base64::engine::general_purpose::STANDARD.decode(p).unwrap()).unwrap()
        })
    };
    let job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": child_job(json!({})),
                     "spec": {"template": {"spec": {"containers": [{"name": "t", "image": "x"}]}}}});
    let job_kind = json!({"group": "batch", "version": "v1", "kind": "Job"});
    let patch = review(job_kind.clone(), JOBSET_CONTROLLER, job.clone()).expect("a patch");
    assert!(patch.contains("workload-mark"), "{patch}");
    assert_eq!(review(job_kind, TENANT, job), None);
    let js = json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                    "metadata": meta("llm", WorkloadKind::TrainJob, json!({}), json!({})), "spec": {}});
    let js_kind = json!({"group": "jobset.x-k8s.io", "version": "v1alpha2", "kind": "JobSet"});
    let patch = review(js_kind, DEFAULT_TRAINER_IDENTITIES[0], js).expect("a patch");
    assert!(patch.contains("workload-mark"), "{patch}");
}
