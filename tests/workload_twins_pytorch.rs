//! PyTorchJob twins of Job remediation tests that had a JobSet twin only
//! (tests/workload_remediation_twins.rs), through the real executor and
//! the operator, against the local control plane: the training operator
//! is played as in tests/workload_remediation_pytorch.rs.
//!
//! - a dry run changes nothing and names the action it would take (twin
//!   of `remediation::dry_run_changes_nothing_but_records_what_it_would_do`);
//! - a PyTorchJob without the policy's env var is skipped once, with the
//!   reason (twin of `remediation::job_without_the_env_var_is_skipped_…`);
//! - accumulation keeps the global batch on every replica type (twin of
//!   `remediation_accumulation::accumulation_keeps_the_global_batch_…`).

use crate::common;
use crate::remediation_support;
use crate::workload_remediation_pytorch::profiled_pytorchjob;
use crate::workload_support;

use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kube::{Client, ResourceExt};
use memprof::api::workload::WorkloadKind;
use memprof::api::RiskLevel;
use remediation_support::{apply_policy, records, shrink_policy, stays};
use serde_json::json;
use std::time::Duration;
use workload_support::*;

const QUEUED: &str = "kueue.x-k8s.io/queue-name";

/// Rank `pod` of the PyTorchJob `train` reports critical at `offset`.
async fn critical(admin: &Client, ns: &str, pod: &Pod, offset: u64) {
    let gpus = vec![gpu(0, 79, 79, RiskLevel::Critical, Some(5.0))];
    apply_report(admin, ns, &pod_report(pod, "train", 0, &at(offset), gpus)).await;
}

#[tokio::test]
async fn a_dry_run_on_a_pytorchjob_changes_nothing_and_names_the_action_it_would_take() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let ns = ns.name.as_str();
    let op = start_operator(&admin, ns);
    apply_policy(&admin, ns, "shrink", shrink_policy(true))
        .await
        .unwrap();
    let (pt, pods) = profiled_pytorchjob(&admin, ns, json!({QUEUED: "team-a"})).await;
    critical(&admin, ns, &pods[1], 100).await;
    let rec = record_in(&admin, ns, "DryRun").await;
    assert_eq!(
        rec.env_change.as_deref(),
        Some("suspend-patch-resume"),
        "{rec:?}"
    );
    let after = api(&admin, ns, WorkloadKind::PyTorchJob)
        .get("train")
        .await
        .unwrap();
    assert_eq!(after.uid(), pt.uid());
    assert_eq!(after.data["spec"], pt.data["spec"], "untouched");
    assert!(!after.annotations().contains_key("memprof.dev/remediation"));
    eventually("the RemediationDryRun Event", || async {
        let n = count_events(&admin, ns, "RemediationDryRun", "train").await;
        (n >= 1).then_some(()).ok_or(n.to_string())
    })
    .await;
    op.stop().await;
}

#[tokio::test]
async fn a_pytorchjob_without_the_env_var_is_skipped_once_with_the_reason() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let ns = ns.name.as_str();
    let op = start_operator(&admin, ns);
    apply_policy(&admin, ns, "shrink", shrink_policy(false))
        .await
        .unwrap();
    let (_, pods) = profiled_pytorchjob(&admin, ns, json!({})).await;
    let pts = api(&admin, ns, WorkloadKind::PyTorchJob);
    // A merge patch replaces a list whole: each template's one container, without env.
    let bare =
        json!({"template": {"spec": {"containers": [{"name": "pytorch", "image": "busybox"}]}}});
    let no_env = json!({"spec": {"pytorchReplicaSpecs": {"Master": bare, "Worker": bare}}});
    let pt = pts
        .patch("train", &PatchParams::default(), &Patch::Merge(&no_env))
        .await
        .unwrap();
    critical(&admin, ns, &pods[2], 100).await;
    let rec = record_in(&admin, ns, "Skipped").await;
    let msg = rec.message.clone().unwrap_or_default();
    assert!(msg.starts_with("NoSuchEnv:"), "{msg}");
    // Once, however often the rank stays critical.
    let mut t = 1_000;
    stays("one Skipped record", Duration::from_secs(4), || {
        t += 500;
        let (admin, pod, t) = (admin.clone(), pods[2].clone(), t);
        async move {
            critical(&admin, ns, &pod, t).await;
            let recs = records(&admin, ns, "train").await;
            (recs.len() == 1).then_some(()).ok_or(format!("{recs:?}"))
        }
    })
    .await;
    let after = pts.get("train").await.unwrap();
    assert_eq!(
        (after.uid(), &after.data["spec"]),
        (pt.uid(), &pt.data["spec"]),
        "untouched"
    );
    op.stop().await;
}

#[tokio::test]
async fn accumulation_keeps_the_global_batch_of_a_suspended_patched_pytorchjob() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let ns = ns.name.as_str();
    let op = start_operator(&admin, ns);
    let mut policy = shrink_policy(false);
    policy["actions"][0]["scaleBatch"]["accumulation"] = json!({"env": "GRAD_ACCUM_STEPS"});
    apply_policy(&admin, ns, "shrink", policy).await.unwrap();
    let (_, pods) = profiled_pytorchjob(&admin, ns, json!({QUEUED: "team-a"})).await;
    critical(&admin, ns, &pods[0], 100).await;
    let rec = record_in(&admin, ns, "Done").await;
    assert_eq!(
        rec.action,
        "scaleBatch BATCH_SIZE×GRAD_ACCUM_STEPS 32×1 → 16×2"
    );
    assert_eq!(rec.env_change.as_deref(), Some("suspend-patch-resume"));
    let pt = api(&admin, ns, WorkloadKind::PyTorchJob)
        .get("train")
        .await
        .unwrap();
    // Both replica types, each both variables (the webhook's own variables beside them).
    for t in ["Master", "Worker"] {
        let at = format!("/spec/pytorchReplicaSpecs/{t}/template/spec/containers/0/env");
        let env = pt.data.pointer(&at).and_then(|e| e.as_array()).cloned();
        let value = |name: &str| {
            let found = env.iter().flatten().find(|e| e["name"] == name);
            found.map(|e| e["value"].clone())
        };
        assert_eq!(
            (value("BATCH_SIZE"), value("GRAD_ACCUM_STEPS")),
            (Some(json!("16")), Some(json!("2"))),
            "{t}: {env:?}"
        );
    }
    op.stop().await;
}
