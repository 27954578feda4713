//! The least disruptive change of a workload's environment, against the
//! real local control plane (stand-in CRDs: no JobSet controller or
//! training operator runs here, so nothing recreates pods on resume; what
//! is checked is what memprof does to the top-level object): a
//! Kueue-managed JobSet or PyTorchJob is suspended, its pod templates'
//! environment patched and resumed, never deleted; one Kueue does not
//! manage is recreated as Jobs are (the decision; the recreation itself is
//! the Job protocol's).

use crate::workload_support;

use futures::StreamExt;
use kube::api::{DynamicObject, WatchEvent, WatchParams};
use kube::Client;
use memprof::api::workload::WorkloadKind;
use memprof::workload::action::{env_change, EnvChange};
use memprof::workload::suspend::suspend_patch_resume;
use serde_json::{json, Value};
use std::time::Duration;
use workload_support::*;

const VARS: [(&str, &str); 2] = [("BATCH_SIZE", "24"), ("GRAD_ACCUM_STEPS", "2")];

/// The suspend switch of each version of `name` the API server stored
/// from `rv` on, in order, until it has seen `until` versions (or 10 s).
async fn suspend_history(
    client: &Client,
    ns: &str,
    kind: WorkloadKind,
    name: &str,
    rv: &str,
    until: usize,
) -> Vec<Option<bool>> {
    let pointer = match kind {
        WorkloadKind::PyTorchJob => "/spec/runPolicy/suspend",
        _ => "/spec/suspend",
    };
    let wp = WatchParams::default()
        .fields(&format!("metadata.name={name}"))
        .timeout(10);
    let mut events = api(client, ns, kind).watch(&wp, rv).await.unwrap().boxed();
    let mut seen = Vec::new();
    while seen.len() < until {
        let next = tokio::time::timeout(Duration::from_secs(10), events.next()).await;
        let Ok(Some(Ok(WatchEvent::Modified(o)))) = next else {
            break;
        };
        seen.push(o.data.pointer(pointer).and_then(Value::as_bool));
    }
    seen
}

/// Every env list of the object's pod templates.
fn env_lists(kind: WorkloadKind, obj: &DynamicObject) -> Vec<Value> {
    let at = |p: &str| obj.data.pointer(p).cloned().unwrap_or(Value::Null);
    match kind {
        WorkloadKind::JobSet => vec![at(
            "/spec/replicatedJobs/0/template/spec/template/spec/containers/0/env",
        )],
        _ => ["Master", "Worker"]
            .iter()
            .map(|t| {
                at(&format!(
                    "/spec/pytorchReplicaSpecs/{t}/template/spec/containers/0/env"
                ))
            })
            .collect(),
    }
}

async fn suspended_patched_resumed(kind: WorkloadKind, manifest: Value) {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let before = create(&admin, &ns.name, kind, manifest).await;
    let name = before.metadata.name.clone().unwrap();
    assert_eq!(
        env_change(kind, before.metadata.labels.as_ref()),
        EnvChange::SuspendPatchResume
    );
    let rv = before.metadata.resource_version.clone().unwrap();
    let done = suspend_patch_resume(&admin, &ns.name, kind, &name, &VARS)
        .await
        .unwrap();
    assert_eq!(
        done.uid,
        before.metadata.uid.clone().unwrap(),
        "never deleted"
    );
    let after = api(&admin, &ns.name, kind).get(&name).await.unwrap();
    assert_eq!(after.metadata.uid, before.metadata.uid);
    assert_eq!(
        after.metadata.labels, before.metadata.labels,
        "its Kueue queue kept"
    );
    for env in env_lists(kind, &after) {
        assert_eq!(
            env,
            json!([{"name": "BATCH_SIZE", "value": "24"}, {"name": "GRAD_ACCUM_STEPS", "value": "2"}]),
            "{kind:?}"
        );
    }
    // Stored in order: suspended, then the environment changed while
    // suspended, then resumed.
    let history = suspend_history(&admin, &ns.name, kind, &name, &rv, 3).await;
    assert_eq!(
        history,
        vec![Some(true), Some(true), Some(false)],
        "{kind:?}"
    );
    // Already as asked: suspended and resumed, nothing rewritten.
    let again = suspend_patch_resume(&admin, &ns.name, kind, &name, &VARS)
        .await
        .unwrap();
    assert_eq!(again.env_lists, 0);
}

#[tokio::test]
async fn a_kueue_managed_jobset_is_suspended_patched_and_resumed_never_deleted() {
    let queued = json!({"kueue.x-k8s.io/queue-name": "team-a"});
    suspended_patched_resumed(WorkloadKind::JobSet, jobset("train", 2, queued)).await;
}

#[tokio::test]
async fn a_kueue_managed_pytorchjob_is_suspended_patched_and_resumed_never_deleted() {
    let queued = json!({"kueue.x-k8s.io/queue-name": "team-a"});
    suspended_patched_resumed(WorkloadKind::PyTorchJob, pytorchjob("train", 2, queued)).await;
}

/// Without Kueue nothing would re-admit a suspended workload on its terms:
/// recreated, as Jobs are; and a Job is never suspended by memprof.
#[tokio::test]
async fn a_workload_kueue_does_not_manage_is_recreated() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    for (kind, manifest) in [
        (WorkloadKind::JobSet, jobset("plain", 1, json!({}))),
        (WorkloadKind::PyTorchJob, pytorchjob("plain", 1, json!({}))),
    ] {
        let obj = create(&admin, &ns.name, kind, manifest).await;
        assert_eq!(
            env_change(kind, obj.metadata.labels.as_ref()),
            EnvChange::Recreate,
            "{kind:?}"
        );
    }
    let queued = std::collections::BTreeMap::from([(
        "kueue.x-k8s.io/queue-name".to_string(),
        "q".to_string(),
    )]);
    assert_eq!(
        env_change(WorkloadKind::Job, Some(&queued)),
        EnvChange::Recreate
    );
}
