//! Unit tests of `action.rs`.

use super::*;

fn labels(queue: Option<&str>) -> BTreeMap<String, String> {
    queue
        .map(|q| (LABEL_KUEUE_QUEUE.to_string(), q.to_string()))
        .into_iter()
        .collect()
}

#[test]
fn a_kueue_managed_suspendable_workload_is_suspended_never_recreated() {
    for kind in [
        WorkloadKind::JobSet,
        WorkloadKind::TrainJob,
        WorkloadKind::PyTorchJob,
    ] {
        assert_eq!(
            env_change(kind, Some(&labels(Some("team-a")))),
            EnvChange::SuspendPatchResume,
            "{kind:?}"
        );
        // Not queued by Kueue: nothing would re-admit it; recreate as Jobs are.
        assert_eq!(env_change(kind, Some(&labels(None))), EnvChange::Recreate);
        assert_eq!(
            env_change(kind, Some(&labels(Some("")))),
            EnvChange::Recreate
        );
        assert_eq!(env_change(kind, None), EnvChange::Recreate);
    }
    assert_eq!(
        env_change(WorkloadKind::Job, Some(&labels(Some("q")))),
        EnvChange::Recreate
    );
    assert_eq!(
        EnvChange::SuspendPatchResume.as_str(),
        "suspend-patch-resume"
    );
}

#[test]
fn the_suspend_switch_is_where_each_kind_keeps_it() {
    assert_eq!(
        suspend_patch(WorkloadKind::JobSet, true),
        Some(json!({"spec": {"suspend": true}}))
    );
    assert_eq!(
        suspend_patch(WorkloadKind::TrainJob, false),
        Some(json!({"spec": {"suspend": false}}))
    );
    assert_eq!(
        suspend_patch(WorkloadKind::PyTorchJob, true),
        Some(json!({"spec": {"runPolicy": {"suspend": true}}}))
    );
    assert_eq!(suspend_patch(WorkloadKind::Job, true), None);
}

#[test]
fn set_env_reaches_every_pod_template_of_each_kind() {
    let c = |env: Value| json!({"name": "trainer", "image": "x", "env": env});
    let mut js = json!({"spec": {"replicatedJobs": [
        {"name": "driver", "template": {"spec": {"template": {"spec": {"containers": [c(json!([]))]}}}}},
        {"name": "workers", "template": {"spec": {"template": {"spec": {"containers": [
            c(json!([{"name": "BATCH_SIZE", "value": "32"}, {"name": "KEEP", "value": "1"}])),
            {"name": "bare", "image": "y"}]}}}}}]}});
    let vars = [("BATCH_SIZE", "24"), ("GRAD_ACCUM", "2")];
    assert_eq!(set_env(WorkloadKind::JobSet, &mut js, &vars), 3);
    let workers =
        &js["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["spec"]["containers"];
    assert_eq!(
        workers[0]["env"],
        json!([{"name": "BATCH_SIZE", "value": "24"}, {"name": "KEEP", "value": "1"}, {"name": "GRAD_ACCUM", "value": "2"}])
    );
    assert_eq!(
        workers[1]["env"][0],
        json!({"name": "BATCH_SIZE", "value": "24"})
    );
    assert_eq!(
        set_env(WorkloadKind::JobSet, &mut js, &vars),
        0,
        "already set: no change"
    );

    let mut pt = json!({"spec": {"pytorchReplicaSpecs": {
        "Master": {"replicas": 1, "template": {"spec": {"containers": [c(json!([]))]}}},
        "Worker": {"replicas": 3, "template": {"spec": {"containers": [c(json!([]))]}}}}}});
    assert_eq!(set_env(WorkloadKind::PyTorchJob, &mut pt, &vars), 2);
    assert_eq!(
        pt["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["env"][1]
            ["value"],
        "2"
    );

    let mut tj = json!({"spec": {"trainer": {"numNodes": 4}}});
    assert_eq!(set_env(WorkloadKind::TrainJob, &mut tj, &vars), 1);
    assert_eq!(
        tj["spec"]["trainer"]["env"][0],
        json!({"name": "BATCH_SIZE", "value": "24"})
    );
    let mut none = json!({"spec": {}});
    assert_eq!(set_env(WorkloadKind::TrainJob, &mut none, &vars), 0);
}
