use super::*;
use memprof_api::RemediationPolicy;
use memprof_policy::plan::{build, PlanInput};
use std::collections::BTreeSet;

fn jobset() -> Value {
    let template = |env: Value| {
        json!({"spec": {"template": {"spec": {"containers": [
            {"name": "trainer", "image": "busybox", "env": env}]}}}})
    };
    json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "train", "namespace": "ml", "uid": "js-1",
            "resourceVersion": "7", "labels": {"team": "ml"},
            "annotations": {"keep": "me"}},
        "spec": {"replicatedJobs": [
            {"name": "workers", "replicas": 2,
             "template": template(json!([{"name": "BATCH_SIZE", "value": "32"}, {"name": "LR", "value": "0.1"}]))},
            {"name": "eval", "replicas": 1,
             "template": template(json!([{"name": "BATCH_SIZE", "value": "32"}]))}]},
        "status": {"restarts": 0},
    })
}

fn planned(object: &Value) -> Plan {
    let policy = RemediationPolicy::test("shrink", "ml", 0, 4);
    let view = job_view(WorkloadKind::JobSet, object);
    build(&PlanInput {
        policy: &policy,
        job: &view,
        config_maps: &BTreeMap::new(),
        not_opted_in: &BTreeSet::new(),
        id: "r1",
        why: "risk critical",
        batch_fit: None,
        nonce: "n0",
    })
    .unwrap()
}

#[test]
fn a_jobset_is_planned_on_its_first_template_and_names_its_kind() {
    let js = jobset();
    let plan = for_workload(planned(&js), WorkloadKind::JobSet, &js, EnvChange::Recreate);
    assert_eq!(plan.kind.as_deref(), Some("JobSet"));
    assert_eq!(
        (plan.job.as_str(), plan.job_uid.as_str()),
        ("train", "js-1")
    );
    assert_eq!(plan.summary(), "scaleBatch BATCH_SIZE 32->24");
    assert_eq!(kind_of(&plan), WorkloadKind::JobSet);
    assert_eq!(env_change_of(&plan), Some(EnvChange::Recreate));
}

#[test]
fn a_recreated_jobset_is_the_users_with_every_template_changed_and_nothing_server_set() {
    let js = jobset();
    let plan = for_workload(planned(&js), WorkloadKind::JobSet, &js, EnvChange::Recreate);
    let (_, manifest) = plan.recreate().expect("a recreation");
    assert_eq!(manifest["kind"], "JobSet");
    assert_eq!(manifest["metadata"]["name"], "train");
    assert!(manifest["metadata"].get("uid").is_none());
    assert!(manifest["metadata"].get("resourceVersion").is_none());
    assert!(manifest.get("status").is_none());
    assert_eq!(manifest["metadata"]["labels"]["team"], "ml");
    let ann = &manifest["metadata"]["annotations"];
    assert_eq!(
        (
            ann["keep"].as_str(),
            ann["memprof.dev/remediation"].as_str()
        ),
        (Some("me"), Some("r1"))
    );
    assert_eq!(ann["memprof.dev/remediation-nonce"], "n0");
    for i in 0..2 {
        let env = &manifest["spec"]["replicatedJobs"][i]["template"]["spec"]["template"]["spec"]
            ["containers"][0]["env"];
        assert_eq!(env[0], json!({"name": "BATCH_SIZE", "value": "24"}), "{i}");
    }
    let env = &manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        ["containers"][0]["env"];
    assert_eq!(
        env[1],
        json!({"name": "LR", "value": "0.1"}),
        "the rest is kept"
    );
}

#[test]
fn a_kueue_managed_jobset_is_planned_as_suspend_patch_resume_with_the_plans_annotations() {
    let js = jobset();
    let plan = for_workload(
        planned(&js),
        WorkloadKind::JobSet,
        &js,
        EnvChange::SuspendPatchResume,
    );
    assert!(plan.recreate().is_none(), "never deleted");
    let Some(Step::SuspendPatchResume {
        changes,
        annotations,
    }) = plan.steps.last()
    else {
        panic!("{:?}", plan.steps);
    };
    assert_eq!(
        vars(changes),
        vec![("BATCH_SIZE".to_string(), "24".to_string())]
    );
    assert_eq!(
        annotations
            .get("memprof.dev/remediation")
            .map(String::as_str),
        Some("r1")
    );
    assert!(!annotations.contains_key("keep"), "only what the plan adds");
    assert_eq!(env_change_of(&plan), Some(EnvChange::SuspendPatchResume));
    assert_eq!(plan.summary(), "scaleBatch BATCH_SIZE 32->24");
}

#[test]
fn a_trainjob_is_planned_on_its_trainers_env() {
    let tj = json!({"metadata": {"name": "t", "namespace": "ml", "uid": "u"},
        "spec": {"trainer": {"env": [{"name": "BATCH_SIZE", "value": "8"}]}}});
    let view = job_view(WorkloadKind::TrainJob, &tj);
    assert_eq!(
        view.pointer("/spec/template/spec/containers/0/env/0/value"),
        Some(&json!("8"))
    );
    let pt = json!({"metadata": {"name": "p"}, "spec": {"pytorchReplicaSpecs": {
        "Worker": {"template": {"spec": {"containers": [{"name": "w"}]}}}}}});
    let view = job_view(WorkloadKind::PyTorchJob, &pt);
    assert_eq!(
        view.pointer("/spec/template/spec/containers/0/name"),
        Some(&json!("w"))
    );
}

#[test]
fn vars_name_the_accumulation_that_keeps_the_global_batch_once() {
    let change = |env: &str, to| memprof_policy::plan::EnvChange {
        container: "c".into(),
        env: env.into(),
        from: 32,
        to,
        note: None,
        accumulation: None,
    };
    let mut a = change("BATCH_SIZE", 16);
    a.accumulation = Some(memprof_policy::plan::AccumulationChange {
        env: "GRAD_ACCUM".into(),
        from: 1,
        to: 2,
        added: false,
    });
    let got = vars(&[a, change("BATCH_SIZE", 16)]);
    assert_eq!(
        got,
        vec![
            ("BATCH_SIZE".to_string(), "16".to_string()),
            ("GRAD_ACCUM".to_string(), "2".to_string())
        ]
    );
}

#[test]
fn a_pytorchjob_is_planned_on_its_master_and_recreated_with_every_replica_changed() {
    let template = json!({"spec": {"containers": [{"name": "pytorch", "image": "busybox",
        "env": [{"name": "BATCH_SIZE", "value": "32"}]}]}});
    let pt = json!({
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": "train", "namespace": "ml", "uid": "pt-1", "labels": {"team": "ml"}},
        "spec": {"runPolicy": {}, "pytorchReplicaSpecs": {
            "Master": {"replicas": 1, "template": template.clone()},
            "Worker": {"replicas": 3, "template": template}}},
    });
    let policy = RemediationPolicy::test("shrink", "ml", 0, 4);
    let view = job_view(WorkloadKind::PyTorchJob, &pt);
    let input = PlanInput {
        policy: &policy,
        job: &view,
        config_maps: &BTreeMap::new(),
        not_opted_in: &BTreeSet::new(),
        id: "r1",
        why: "risk critical",
        batch_fit: None,
        nonce: "n0",
    };
    let how = EnvChange::Recreate;
    let plan = for_workload(build(&input).unwrap(), WorkloadKind::PyTorchJob, &pt, how);
    assert_eq!(plan.kind.as_deref(), Some("PyTorchJob"));
    let (_, manifest) = plan.recreate().expect("a recreation");
    assert_eq!(manifest["apiVersion"], "kubeflow.org/v1");
    for t in ["Master", "Worker"] {
        let at = format!("/spec/pytorchReplicaSpecs/{t}/template/spec/containers/0/env/0/value");
        assert_eq!(manifest.pointer(&at), Some(&json!("24")), "{t}");
    }
    let how = EnvChange::SuspendPatchResume;
    let plan = for_workload(build(&input).unwrap(), WorkloadKind::PyTorchJob, &pt, how);
    assert_eq!(env_change_of(&plan), Some(EnvChange::SuspendPatchResume));
}
