use super::*;
use serde_json::json;

/// ~250 KiB of tenant metadata: many keys, memprof.dev/* among them, long values.
fn hostile_map(prefix: &str) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    for i in 0..1000 {
        m.insert(format!("{prefix}k{i}"), json!("x".repeat(60)));
        m.insert(format!("memprof.dev/k{i}"), json!("y".repeat(60)));
    }
    m.insert("memprof.dev/thresholds".into(), json!("z".repeat(200_000)));
    m.insert("memprof.dev/enabled".into(), json!("true"));
    serde_json::Value::Object(m)
}

fn size<T: serde::Serialize>(v: &T) -> usize {
    serde_json::to_vec(v).unwrap().len()
}

#[test]
fn a_hostile_job_is_cached_in_a_bounded_size() {
    let mut j: Job = serde_json::from_value(json!({
        "metadata": {"name": "train", "namespace": "ml", "uid": "u",
                     "labels": hostile_map("team.example/"),
                     "annotations": hostile_map("note.example/")},
        "spec": {"parallelism": 2, "template": {"spec": {"containers": [
            {"name": "t", "image": "i", "env": [{"name": "BATCH_SIZE", "value": "32"}]}]}}},
    }))
    .unwrap();
    assert!(size(&j) > 250_000);
    job(&mut j);
    assert!(size(&j) < 8 * 1024, "{} bytes kept", size(&j));
    // What memprof reads survives: the opt-in, the batch variable.
    assert!(crate::operator::reconcile::profiling_enabled(&j));
    assert_eq!(j.labels().len(), MAX_LABELS);
    assert_eq!(
        j.annotations()
            .get(ANNOTATION_THRESHOLDS)
            .map(String::as_str),
        Some(memprof_api::thresholds::TOO_LONG),
        "an over-long value is kept as the marker the parser refuses"
    );
}

#[test]
fn a_hostile_pod_is_cached_in_a_bounded_size_with_its_oom_evidence() {
    let statuses: Vec<_> = (0..40)
        .map(|i| {
            json!({"name": format!("c{i}"), "image": "i".repeat(1000), "imageID": "", "ready": false,
                   "restartCount": 1,
                   "state": {"terminated": {"exitCode": 1, "message": format!("{}torch.OutOfMemoryError: CUDA out of memory.", "Traceback line\n".repeat(500))}}})
        })
        .collect();
    let mut labels = hostile_map("team.example/");
    labels["job-name"] = json!("train");
    let mut p: Pod = serde_json::from_value(json!({
        "metadata": {"name": "train-0", "namespace": "ml", "uid": "p",
                     "labels": labels, "annotations": hostile_map("note.example/"),
                     "ownerReferences": (0..100).map(|i| json!({"apiVersion": "v1", "kind": "X",
                         "name": format!("o{i}"), "uid": "o"})).collect::<Vec<_>>()},
        "status": {"containerStatuses": statuses},
    }))
    .unwrap();
    assert!(size(&p) > 250_000);
    pod(&mut p);
    assert!(size(&p) < 8 * 1024, "{} bytes kept", size(&p));
    assert_eq!(
        p.labels().get("job-name").map(String::as_str),
        Some("train")
    );
    let cs = p.status.unwrap().container_statuses.unwrap();
    assert_eq!(cs.len(), MAX_CONTAINERS);
    let t = cs[0].state.clone().unwrap().terminated.unwrap();
    assert_eq!(t.exit_code, 1);
    let message = t.message.unwrap();
    assert!(message.len() <= MAX_MESSAGE);
    assert!(message.ends_with("torch.OutOfMemoryError: CUDA out of memory."));
}

#[test]
fn a_report_is_cached_without_its_timelines_in_either_form() {
    use memprof_api::{GpuReport, MemoryReport, MemoryReportSpec, TimelinePoint};
    let points: Vec<TimelinePoint> = (0..60)
        .map(|t| TimelinePoint {
            t,
            max: 1 << 30,
            min: 1 << 29,
        })
        .collect();
    let gpu = GpuReport {
        peak_bytes: 1 << 30,
        timeline: points.clone(),
        legacy_timeline: points,
        ..Default::default()
    };
    let mut r = MemoryReport::new(
        "r",
        MemoryReportSpec {
            gpus: vec![gpu.clone(), gpu],
            ..Default::default()
        },
    );
    report(&mut r, &memprof_api::admission::KeyRing::default());
    for g in &r.spec.gpus {
        assert!(g.timeline.is_empty() && g.legacy_timeline.is_empty());
        assert_eq!(g.peak_bytes, 1 << 30, "the rest is kept");
    }
}

#[test]
fn a_hostile_policy_is_cached_in_a_bounded_size() {
    let mut p: RemediationPolicy = serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ml", "uid": "u",
                     "labels": hostile_map("team.example/"),
                     "annotations": hostile_map("note.example/")},
        "spec": {"selector": {"matchLabels": {"team": "a"}},
                 "triggers": [{"oomObserved": true}], "actions": [{"event": {"reason": "R"}}]},
    }))
    .unwrap();
    assert!(size(&p) > 250_000);
    let spec = p.spec.clone();
    policy(&mut p);
    assert!(size(&p) < 2 * 1024, "{} bytes kept", size(&p));
    // What memprof reads survives: the whole spec.
    assert_eq!(p.spec, spec);
}

/// The largest report a tenant can write, in 16 GPUs of full timelines and
/// long strings, named after a victim's pod and owned by it.
fn big_report() -> MemoryReport {
    let points: Vec<_> = (0..memprof_api::MAX_TIMELINE_POINTS)
        .map(|i| memprof_api::TimelinePoint {
            t: i as i64,
            max: i as u64,
            min: i as u64,
        })
        .collect();
    let gpu = memprof_api::GpuReport {
        uuid: "G".repeat(96),
        model: "M".repeat(96),
        timeline: points,
        ..Default::default()
    };
    let mut r = MemoryReport::new(
        "victim-0",
        MemoryReportSpec {
            pod_name: "victim-0".into(),
            sampled_at: "2027-01-15T08:00:00Z".into(),
            gpus: vec![gpu; 16],
            ..Default::default()
        },
    );
    r.metadata.namespace = Some("ml".into());
    r.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            kind: "Pod".into(),
            name: "victim-0".into(),
            uid: "victim-uid".into(),
            api_version: "v1".into(),
            ..Default::default()
        },
    ]);
    r.metadata.annotations = Some(
        [
            (ANNOTATION_WRITER.to_string(), "v1.1.forged".to_string()),
            ("note".to_string(), "x".repeat(100_000)),
        ]
        .into(),
    );
    r
}

#[test]
fn a_report_no_pod_vouched_for_is_cached_as_its_name_only() {
    use memprof_api::admission::{Key, KeyRing};
    let key = Key::generate();
    let ring = KeyRing::new(key.clone());
    let mut refused = big_report();
    assert!(size(&refused) > 100_000);
    report(&mut refused, &ring);
    assert!(size(&refused) < 1024, "{} bytes kept", size(&refused));
    assert_eq!(
        refused.spec.pod_name, "victim-0",
        "still named in ReportsValid"
    );
    assert!(refused.spec.gpus.is_empty());

    // The same content, written by its pod: what the roll-up reads is kept.
    let mut genuine = big_report();
    genuine.metadata.annotations = None;
    memprof_api::writer::mark_as_written(&mut genuine, &key, "ml");
    report(&mut genuine, &ring);
    assert_eq!(genuine.spec.gpus.len(), 16);
    assert!(genuine.annotations().contains_key(ANNOTATION_SPEC_DIGEST));

    // Before the key is loaded nothing can be judged: slimmed, judged later.
    let mut early = big_report();
    report(&mut early, &KeyRing::default());
    assert_eq!(early.spec.gpus.len(), 16);
}

#[test]
fn a_jobs_family_survives_the_cache_for_its_profile() {
    let family = memprof_api::family::ANNOTATION_FAMILY;
    let mut j: Job = serde_json::from_value(json!({
        "metadata": {"name": "train", "annotations": {family: "llama", "memprof.dev/other": "x"}},
    }))
    .unwrap();
    job(&mut j);
    assert_eq!(
        j.annotations().get(family).map(String::as_str),
        Some("llama")
    );
    assert!(!j.annotations().contains_key("memprof.dev/other"));
}

/// A workload's family survives the caches the pipelines compare with: a
/// PyTorchJob's own annotation, and a profile's family label (without it
/// every reconcile would see the profile drifted and apply it again).
#[test]
fn a_workloads_family_survives_the_cache_on_the_pytorchjob_and_its_profile() {
    let family = memprof_api::family::ANNOTATION_FAMILY;
    let mut pt: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": "train", "annotations": {family: "llama", "memprof.dev/other": "x"}},
        "spec": {"pytorchReplicaSpecs": {}},
    }))
    .unwrap();
    pytorchjob(&mut pt);
    assert_eq!(
        pt.annotations().get(family).map(String::as_str),
        Some("llama")
    );
    assert!(!pt.annotations().contains_key("memprof.dev/other"));
    let label = memprof_api::family::LABEL_FAMILY;
    let mut p = MemoryProfile::new("train", Default::default());
    p.labels_mut().insert(label.into(), "llama".into());
    p.labels_mut().insert("team".into(), "ml".into());
    profile(&mut p);
    assert_eq!(p.labels().get(label).map(String::as_str), Some("llama"));
    assert!(!p.labels().contains_key("team"));
}

/// `desired` as the API server answers once the operator applied it:
/// an Apply entry of its manager naming the labels it set; and `others`,
/// labels someone else wrote, with their own Update entry.
fn as_applied(desired: &MemoryProfile, others: serde_json::Value) -> MemoryProfile {
    as_written(desired, others, "Apply")
}

/// `desired` as the API server answers once the operator wrote it with
/// `operation` (`Update`: its create), `others` as in [`as_applied`].
fn as_written(
    desired: &MemoryProfile,
    others: serde_json::Value,
    operation: &str,
) -> MemoryProfile {
    let entry = |manager: &str, operation: &str, labels: Vec<&String>| {
        let owned: serde_json::Map<_, _> = labels
            .into_iter()
            .map(|k| (format!("f:{k}"), json!({})))
            .collect();
        json!({"manager": manager, "operation": operation, "apiVersion": "memprof.dev/v1alpha1",
               "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": owned}}})
    };
    let mut v = serde_json::to_value(desired).unwrap();
    let ours = entry(
        OPERATOR_MANAGER,
        operation,
        desired.labels().keys().collect(),
    );
    let theirs = entry(
        "kubectl-label",
        "Update",
        others.as_object().unwrap().keys().collect(),
    );
    v["metadata"]["managedFields"] = json!([ours, theirs]);
    for (k, val) in others.as_object().unwrap() {
        v["metadata"]["labels"][k] = val.clone();
    }
    serde_json::from_value(v).unwrap()
}

/// A Job's profile as the cache keeps it still carries the labels it copied
/// from the Job: `profile_outdated` compares them, and without them a
/// labelled Job's profile was applied again, with the sidecars' RBAC, on
/// every reconcile. Labels others wrote on it are not kept, however many.
#[test]
fn a_jobs_copied_labels_survive_the_cache_for_its_profile_and_only_they() {
    use crate::operator::reconcile::{profile_for_job, profile_outdated};
    let j: Job = serde_json::from_value(json!({"metadata": {"name": "train",
        "labels": {"team": "ml", "app.kubernetes.io/part-of": "llm"},
        "annotations": {memprof_api::family::ANNOTATION_FAMILY: "llama"}}}))
    .unwrap();
    let desired = profile_for_job(&j, "ml", "train", "u");
    assert!(desired.labels().contains_key("team"));
    let mut cached = as_applied(&desired, hostile_map("other.example/"));
    assert!(size(&cached) > 250_000);
    profile(&mut cached);
    assert!(
        !profile_outdated(Some(&cached), &desired),
        "kept {:?}",
        cached.labels()
    );
    assert_eq!(
        cached.labels(),
        desired.labels(),
        "only what the operator applied"
    );
    assert!(size(&cached) < 2 * 1024, "{} bytes kept", size(&cached));
}

/// The managedFields are input: an entry in the operator's name that claims
/// every label of the profile keeps no more than the operator ever copies.
#[test]
fn a_claim_of_more_labels_in_the_operators_name_is_cut() {
    let mut p = MemoryProfile::new("train", Default::default());
    *p.labels_mut() = serde_json::from_value(hostile_map("other.example/")).unwrap();
    p.labels_mut().retain(|_, v| v.len() <= MAX_LABEL_VALUE);
    let mut forged = as_applied(&p, json!({}));
    profile(&mut forged);
    assert_eq!(forged.labels().len(), MAX_WORKLOAD_LABELS);
}

/// The most bytes the labels a profile copies can take: as many as it
/// copies, each of the longest a label can be.
fn copied_labels() -> usize {
    MAX_WORKLOAD_LABELS * (MAX_LABEL_KEY + MAX_LABEL_VALUE + 6)
}

/// A PyTorchJob keeps the labels its profile copies (`-l team=ml` selects
/// the profile by them), bounded as the profile copies them, and no
/// others: of a hostile set, its creator's own first keys, not memprof's.
#[test]
fn a_pytorchjob_keeps_the_labels_its_profile_copies_and_no_more() {
    let mut pt: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": "train", "labels": hostile_map("team.example/")},
    }))
    .unwrap();
    pytorchjob(&mut pt);
    let want: BTreeMap<String, String> = (0..1000)
        .map(|i| (format!("team.example/k{i}"), "x".repeat(60)))
        .collect::<BTreeMap<_, _>>()
        .into_iter()
        .take(MAX_WORKLOAD_LABELS)
        .collect();
    assert_eq!(*pt.labels(), want);
}

/// A PyTorchJob's pod whose creator piled labels, annotations and a huge
/// argument list on it.
fn hostile_pytorch_pod() -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "train-worker-0", "namespace": "ml",
                     "labels": hostile_map("team.example/"),
                     "annotations": hostile_map("note.example/"),
                     "ownerReferences": [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                                          "name": "train", "uid": "u", "controller": true}]},
        "spec": {"containers": [{"name": "pytorch", "image": "i", "args": ["x".repeat(100_000)]}]},
    }))
    .unwrap()
}

#[test]
fn a_hostile_pytorchjob_and_its_pod_are_cached_in_a_bounded_size_with_what_counts_them() {
    let template = json!({"metadata": {"labels": hostile_map("t.example/")},
        "spec": {"serviceAccountName": "trainer",
                 "containers": [{"name": "pytorch", "image": "i", "args": ["x".repeat(100_000)]}]}});
    let mut pt: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": "train", "namespace": "ml", "uid": "u",
                     "labels": hostile_map("team.example/"),
                     "annotations": hostile_map("note.example/")},
        "spec": {"pytorchReplicaSpecs": {
            "Master": {"replicas": 1, "template": template.clone()},
            "Worker": {"replicas": 3, "template": template}},
            "runPolicy": {"note": "y".repeat(100_000)}},
        "status": {"note": "z".repeat(100_000)},
    }))
    .unwrap();
    assert!(size(&pt) > 250_000);
    pytorchjob(&mut pt);
    let kept = size(&pt);
    assert!(kept < 1024 + copied_labels(), "{kept} bytes kept");
    // What the roll-up reads survives: the opt-in, the layout, whom the sidecars run as.
    assert_eq!(
        pt.annotations().get(ANNOTATION_ENABLED).map(String::as_str),
        Some("true")
    );
    let shape = crate::workload::rank::PyTorchShape::from_spec(&pt.data["spec"]).unwrap();
    assert_eq!(shape.ranks(), 4);
    let worker = &pt.data["spec"]["pytorchReplicaSpecs"]["Worker"];
    assert_eq!(worker["template"]["spec"]["serviceAccountName"], "trainer");

    let mut p = hostile_pytorch_pod();
    let labels = p.labels_mut();
    labels.insert(
        memprof_api::workload::LABEL_PYTORCH_REPLICA_TYPE.into(),
        "worker".into(),
    );
    labels.insert(
        memprof_api::workload::LABEL_PYTORCH_REPLICA_INDEX.into(),
        "0".into(),
    );
    let mark = memprof_api::workload_mark::ANNOTATION_WORKLOAD_MARK;
    p.annotations_mut().insert(mark.into(), "v1.1.abc".into());
    pytorch_pod(&mut p);
    assert!(size(&p) < 2 * 1024, "{} bytes kept", size(&p));
    assert_eq!(
        p.labels().len(),
        2,
        "the replica labels only: {:?}",
        p.labels()
    );
    assert!(p.annotations().contains_key(mark));
    assert_eq!(p.owner_references().len(), 1);
}

#[test]
fn a_pytorchjob_pods_terminations_survive_the_cache_bounded_as_a_jobs_pods() {
    // What a checkpoint wait reads to see a trainer exit, and an OOM's evidence.
    let statuses: Vec<_> = (0..40)
        .map(|i| {
            json!({"name": format!("c{i}"), "image": "i".repeat(1000), "imageID": "", "ready": false,
                   "restartCount": 0,
                   "state": {"terminated": {"exitCode": 1, "message": format!("{}CUDA out of memory.", "line\n".repeat(500))}}})
        })
        .collect();
    let mut p: Pod = serde_json::from_value(json!({
        "metadata": {"name": "train-worker-0", "namespace": "ml"},
        "status": {"phase": "Failed", "containerStatuses": statuses},
    }))
    .unwrap();
    pytorch_pod(&mut p);
    assert!(size(&p) < 8 * 1024, "{} bytes kept", size(&p));
    let status = p.status.unwrap();
    assert_eq!(status.phase, None, "only the terminations");
    let cs = status.container_statuses.unwrap();
    assert_eq!(cs.len(), MAX_CONTAINERS);
    let t = cs[0].state.clone().unwrap().terminated.unwrap();
    assert_eq!(t.exit_code, 1);
    assert!(t.message.unwrap().ends_with("CUDA out of memory."));
}

/// What `status.thresholds` shows for `j` once cached, and its Event.
fn thresholds_shown(mut j: Job) -> memprof_api::ThresholdsInEffect {
    job(&mut j);
    crate::operator::thresholds::in_effect(&Default::default(), j.annotations())
}

/// A valid annotation of `len` bytes raising `highTtoSeconds` to 900.
fn padded(len: usize) -> String {
    let text = r#"{"highTtoSeconds": 900}"#;
    format!("{}{}", " ".repeat(len - text.len()), text)
}

fn job_with(own: Option<&str>, template: Option<&str>) -> Job {
    let at = |v: Option<&str>| v.map(|v| json!({ANNOTATION_THRESHOLDS: v}));
    serde_json::from_value(json!({
        "metadata": {"name": "train", "annotations": at(own)},
        "spec": {"template": {"metadata": {"annotations": at(template)},
                              "spec": {"containers": [{"name": "t", "image": "i"}]}}},
    }))
    .unwrap()
}

/// The cache keeps the thresholds annotation the webhook gave the sidecars
/// up to the parser's bound (4096 bytes), not the 512 of other values: a
/// 600-byte valid annotation shows in the status as the sidecars use it.
#[test]
fn a_thresholds_annotation_up_to_the_parsers_bound_shows_as_given() {
    for len in [600, 4096] {
        let shown = thresholds_shown(job_with(Some(&padded(len)), None));
        assert_eq!(shown.source, "annotation", "{len} bytes: {shown:?}");
        assert_eq!(shown.values["highTtoSeconds"], 900.0);
    }
}

/// One over the bound, which the webhook refuses too, is announced as
/// refused (`InvalidThresholds`), never read as no annotation at all.
#[test]
fn a_thresholds_annotation_over_the_bound_is_refused_as_too_long_not_dropped() {
    let shown = thresholds_shown(job_with(Some(&padded(4097)), None));
    assert_eq!(shown.source, "default");
    let message = shown.message.clone().expect("refused, and says so");
    assert!(message.contains("longer than 4096 bytes"), "{message}");
    let webhook = memprof_api::thresholds::resolve(&Default::default(), Some(&padded(4097)));
    assert_eq!(shown, webhook.status(), "as the webhook judged it");
    let event = crate::operator::thresholds::invalid_event(None, &shown).unwrap();
    assert_eq!((event.reason, event.warning), ("InvalidThresholds", true));
}

/// The webhook reads the Job's annotation, else its pod template's
/// (`mutate.rs`, `annotation`): the status reads the same one.
#[test]
fn a_template_only_thresholds_annotation_shows_as_the_sidecars_were_given_it() {
    let template = r#"{"highTtoSeconds": 900}"#;
    let shown = thresholds_shown(job_with(None, Some(template)));
    assert_eq!(shown.source, "annotation");
    assert_eq!(shown.values["highTtoSeconds"], 900.0);
    let own = r#"{"highTtoSeconds": 700}"#;
    let shown = thresholds_shown(job_with(Some(own), Some(template)));
    assert_eq!(shown.values["highTtoSeconds"], 700.0, "the Job's own first");
    let refused = thresholds_shown(job_with(None, Some(&padded(5000))));
    assert!(refused.message.is_some(), "{refused:?}");
}

/// A PyTorchJob's: its own, else its replica templates' (Master's first),
/// bounded as a Job's.
#[test]
fn a_pytorchjobs_thresholds_are_read_where_its_sidecars_were_given_them() {
    let shown = |own: Option<String>, master: Option<&str>, worker: Option<&str>| {
        let at = |v: Option<&str>| json!({"metadata": {"annotations": v.map(|v| json!({ANNOTATION_THRESHOLDS: v}))}});
        let mut pt: kube::api::DynamicObject = serde_json::from_value(json!({
            "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": "train", "annotations": own.map(|v| json!({ANNOTATION_THRESHOLDS: v}))},
            "spec": {"pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "template": at(master)},
                "Worker": {"replicas": 1, "template": at(worker)}}},
        }))
        .unwrap();
        pytorchjob(&mut pt);
        crate::operator::thresholds::in_effect(&Default::default(), pt.annotations())
    };
    let high = |t: memprof_api::ThresholdsInEffect| t.values["highTtoSeconds"];
    assert_eq!(high(shown(Some(padded(600)), None, None)), 900.0);
    let (a, b) = (r#"{"highTtoSeconds": 700}"#, r#"{"highTtoSeconds": 800}"#);
    assert_eq!(high(shown(None, None, Some(b))), 800.0);
    assert_eq!(high(shown(None, Some(a), Some(b))), 700.0);
    assert!(shown(Some(padded(4097)), None, None).message.is_some());
}

/// A profile the operator just made (a create, never an apply, which the
/// API server records as an `Update`) keeps the labels it was made with,
/// so the next reconcile finds it as it would apply it and writes nothing:
/// it applied every new profile again, with the sidecars' RBAC, whenever
/// that reconcile came (a JobSet's, in one of its child Jobs' reconciles
/// after the cache held the profile: a write during `profile_writes`'
/// counted touches under load).
#[test]
fn a_profile_just_created_keeps_its_copied_labels_and_is_not_applied_again() {
    use crate::operator::reconcile::{profile_for_job, profile_outdated};
    let j: Job = serde_json::from_value(json!({"metadata": {"name": "train",
        "labels": {"team": "ml", "app.kubernetes.io/part-of": "llm"}}}))
    .unwrap();
    let desired = profile_for_job(&j, "ml", "train", "u");
    let mut created = as_written(&desired, json!({"other": "x"}), "Update");
    profile(&mut created);
    assert!(
        !profile_outdated(Some(&created), &desired),
        "kept {:?}",
        created.labels()
    );
    assert_eq!(created.labels(), desired.labels(), "not the others' label");
}

/// The create's entry and the apply's name the same labels: each counts
/// once towards the bound, so a label the workload got after the create
/// (owned by the apply only) is kept, not cut by the duplicates before it
/// (then the profile would look outdated, and be applied, on every reconcile).
#[test]
fn labels_owned_by_both_the_create_and_an_apply_count_once() {
    use crate::operator::reconcile::profile_outdated;
    let mut at_create = MemoryProfile::new("train", Default::default());
    for i in 0..MAX_WORKLOAD_LABELS - 1 {
        at_create
            .labels_mut()
            .insert(format!("l{i:02}"), "v".into());
    }
    let mut now = at_create.clone();
    now.labels_mut().insert("z-later".into(), "v".into());
    let created = as_written(&at_create, json!({}), "Update");
    let applied = as_applied(&now, json!({}));
    let mut both = applied.clone();
    let mut fields = created.managed_fields().to_vec();
    fields.extend(applied.managed_fields().iter().cloned());
    *both.managed_fields_mut() = fields;
    profile(&mut both);
    assert!(
        !profile_outdated(Some(&both), &now),
        "kept {:?}",
        both.labels()
    );
}
