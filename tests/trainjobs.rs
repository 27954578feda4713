//! A TrainJob (Kubeflow Trainer 2.x) through the real operator, against
//! the local control plane: TrainJob → JobSet → child Jobs → pods. The
//! test plays Kubeflow Trainer (it creates the TrainJob's JobSet, named
//! after it, with the controller reference, the
//! `trainer.kubeflow.org/trainjob-name` label and the workload mark Trainer's
//! identity gets) and the JobSet controller (it creates the child Jobs);
//! the real Job controller creates the pods. Neither Trainer nor the JobSet
//! controller runs here, so nothing recreates children after a change:
//! what is checked is what memprof does.
//!
//! - one MemoryProfile, the TrainJob's (its kind, owned by it), over the
//!   ranks of its JobSet's child Jobs, and none for the JobSet or a child;
//! - a Kueue-managed TrainJob is suspended, its trainer's environment
//!   patched and resumed (`spec.trainer.env`), its JobSet and child Jobs
//!   untouched (twin of the JobSet's);
//! - one Kueue does not manage is recreated at the top level, and its old
//!   JobSet, found by the `trainer.kubeflow.org/trainjob-name` label, is
//!   deleted with it, the record saying "TrainJob recreated" (twin of the
//!   JobSet's).

use crate::common;
use crate::remediation_support;
use crate::workload_support;

use common::*;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, DynamicObject};
use kube::{Client, ResourceExt};
use memprof::api::workload::WorkloadKind;
use memprof::api::workload_mark::{sign, Link, ANNOTATION_WORKLOAD_MARK};
use memprof::api::{MemoryProfile, RiskLevel};
use remediation_support::{apply_policy, shrink_policy};
use serde_json::{json, Value};
use workload_support::*;

/// The TrainJob `train` (labels `labels` and `team: ml`, its trainer's
/// `BATCH_SIZE` 32), the JobSet Trainer makes for it, marked as the webhook
/// marks Trainer's, and two marked child Jobs, each rank reporting low, the
/// TrainJob's profile written with both ranks. Returns the TrainJob and
/// its JobSet.
pub(crate) async fn profiled_trainjob(
    admin: &Client,
    ns: &str,
    labels: Value,
) -> (DynamicObject, DynamicObject) {
    let mut labels = labels;
    labels["team"] = json!("ml");
    let env = json!([{"name": "BATCH_SIZE", "value": "32"}]);
    let manifest = json!({"metadata": {"name": "train", "labels": labels},
                          "spec": {"trainer": {"numNodes": 2, "env": env}}});
    let tj = create(admin, ns, WorkloadKind::TrainJob, manifest).await;
    let mut js = jobset(
        "train",
        2,
        json!({"trainer.kubeflow.org/trainjob-name": "train"}),
    );
    js["metadata"]["ownerReferences"] = controller_ref(WorkloadKind::TrainJob, &tj);
    let keys = admission_keys(ns).await;
    let link = Link {
        namespace: ns,
        kind: "JobSet",
        name: "train",
        controller_uid: tj.metadata.uid.as_deref().unwrap(),
        identity: "",
    };
    let mark = sign(keys.current().unwrap(), &link, jiff::Timestamp::now()).unwrap();
    js["metadata"]["annotations"] = json!({ANNOTATION_WORKLOAD_MARK: mark});
    let js = create(admin, ns, WorkloadKind::JobSet, js).await;
    for i in 0..2 {
        marked_child(admin, ns, &js, i).await;
        child_report(admin, ns, &format!("train-workers-{i}"), 0, RiskLevel::Low).await;
    }
    let profiles: Api<MemoryProfile> = Api::namespaced(admin.clone(), ns);
    eventually("the TrainJob's profile with both ranks", || async {
        let p = profiles.get_opt("train").await.map_err(|e| e.to_string())?;
        let ranks = p
            .and_then(|p| p.status)
            .map(|s| s.ranks)
            .unwrap_or_default();
        (ranks == "2/2").then_some(()).ok_or(ranks)
    })
    .await;
    (tj, js)
}

/// The value of the TrainJob trainer's `BATCH_SIZE`.
fn batch(tj: &DynamicObject) -> Option<Value> {
    let env = tj
        .data
        .pointer("/spec/trainer/env")
        .and_then(Value::as_array);
    env.into_iter()
        .flatten()
        .find(|e| e["name"] == "BATCH_SIZE")
        .map(|e| e["value"].clone())
}

#[tokio::test]
async fn a_trainjob_has_one_profile_over_its_jobsets_ranks_and_is_suspended_patched_and_resumed() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let ns = ns.name.as_str();
    let op = start_operator(&admin, ns);
    apply_policy(&admin, ns, "shrink", shrink_policy(false))
        .await
        .unwrap();
    let queued = json!({"kueue.x-k8s.io/queue-name": "team-a"});
    let (tj, js) = profiled_trainjob(&admin, ns, queued).await;
    let profiles = Api::<MemoryProfile>::namespaced(admin.clone(), ns)
        .list(&Default::default())
        .await
        .unwrap()
        .items;
    let names: Vec<String> = profiles.iter().map(|p| p.name_any()).collect();
    assert_eq!(
        names,
        ["train"],
        "one profile: none for the JobSet or a child"
    );
    let owners: Vec<(String, String)> = profiles[0]
        .owner_references()
        .iter()
        .map(|o| (o.kind.clone(), o.uid.clone()))
        .collect();
    assert_eq!(owners, [("TrainJob".to_string(), tj.uid().unwrap())]);
    assert_eq!(
        profiles[0].labels()["memprof.dev/workload-kind"],
        "TrainJob"
    );

    child_report(&admin, ns, "train-workers-1", 100, RiskLevel::Critical).await;
    let rec = record_in(&admin, ns, "Done").await;
    assert_eq!(
        rec.env_change.as_deref(),
        Some("suspend-patch-resume"),
        "{rec:?}"
    );
    assert_eq!(rec.action, "scaleBatch BATCH_SIZE 32->24");
    let after = api(&admin, ns, WorkloadKind::TrainJob)
        .get("train")
        .await
        .unwrap();
    assert_eq!(after.uid(), tj.uid(), "never deleted");
    assert_eq!(batch(&after), Some(json!("24")));
    assert_eq!(
        after.data.pointer("/spec/suspend"),
        Some(&json!(false)),
        "resumed"
    );
    assert_eq!(after.annotations()["memprof.dev/remediation"], rec.id);
    // Its JobSet and child Jobs are Trainer's and the JobSet controller's.
    let js_after = api(&admin, ns, WorkloadKind::JobSet)
        .get("train")
        .await
        .unwrap();
    assert_eq!(
        (js_after.uid(), &js_after.data["spec"]),
        (js.uid(), &js.data["spec"])
    );
    for i in 0..2 {
        let j = Api::<Job>::namespaced(admin.clone(), ns)
            .get(&format!("train-workers-{i}"))
            .await;
        assert!(j.is_ok(), "child {i} left alone");
    }
    op.stop().await;
}

#[tokio::test]
async fn a_trainjob_kueue_does_not_manage_is_recreated_and_its_old_jobset_deleted() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let ns = ns.name.as_str();
    let op = start_operator(&admin, ns);
    apply_policy(&admin, ns, "shrink", shrink_policy(false))
        .await
        .unwrap();
    let (tj, js) = profiled_trainjob(&admin, ns, json!({})).await;
    child_report(&admin, ns, "train-workers-0", 100, RiskLevel::Critical).await;
    let rec = record_in(&admin, ns, "Done").await;
    assert_eq!(rec.env_change.as_deref(), Some("recreate"), "{rec:?}");
    let new = api(&admin, ns, WorkloadKind::TrainJob)
        .get("train")
        .await
        .unwrap();
    assert_ne!(new.uid(), tj.uid(), "a new TrainJob");
    let msg = rec.message.clone().unwrap_or_default();
    let recreated = format!(
        "TrainJob recreated (uid {} -> {})",
        tj.uid().unwrap(),
        new.uid().unwrap()
    );
    assert!(msg.contains(&recreated), "named by its kind: {msg}");
    assert_eq!(batch(&new), Some(json!("24")));
    // The old JobSet, orphaned by the TrainJob's deletion and found by its
    // label, must not train next to the new TrainJob's.
    let jobsets = api(&admin, ns, WorkloadKind::JobSet);
    eventually("the old JobSet deleted", || async {
        let got = jobsets.get_opt("train").await.map_err(|e| e.to_string())?;
        let left = got.filter(|o| o.uid() == js.uid() && o.metadata.deletion_timestamp.is_none());
        left.is_none()
            .then_some(())
            .ok_or("still there".to_string())
    })
    .await;
    op.stop().await;
}

/// A TrainJob's profile carries the TrainJob's own labels (the top-level
/// object read from the API server), so `-l team=ml` selects it, and never
/// a label only its JobSet has (the JobSet is Trainer's, one level down).
#[tokio::test]
async fn a_trainjobs_labels_and_never_its_jobsets_are_on_its_profile() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let ns = ns.name.as_str();
    let op = start_operator(&admin, ns);
    profiled_trainjob(&admin, ns, json!({"stage": "pretrain"})).await;
    let profiles = Api::<MemoryProfile>::namespaced(admin.clone(), ns);
    eventually("the TrainJob's labels on its profile", || async {
        let p = profiles.get("train").await.map_err(|e| e.to_string())?;
        let l = p.labels();
        let has = |k: &str, v: &str| l.get(k).map(String::as_str) == Some(v);
        (has("team", "ml") && has("stage", "pretrain"))
            .then_some(())
            .ok_or(format!("{l:?}"))
    })
    .await;
    let p = profiles.get("train").await.unwrap();
    assert!(
        !p.labels()
            .contains_key("trainer.kubeflow.org/trainjob-name"),
        "the JobSet's own label was copied: {:?}",
        p.labels()
    );
    let selected = crate::workloads::kubectl_names(&["-n", ns, "-l", "team=ml"]).await;
    assert_eq!(selected.unwrap(), ["memoryprofile.memprof.dev/train"]);
    op.stop().await;
}
