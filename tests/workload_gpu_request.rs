//! `scaleBatch`'s `gpuMemoryRequest` on a workload, against the local
//! control plane: the workload twin of
//! `recommend_remediation::a_recreated_job_asks_kai_for_the_recommended_gpu_memory`.
//! A PyTorchJob Kueue does not manage, whose profile recommends a request
//! per replica type, is recreated at the top level with each pod template
//! asking KAI-Scheduler for its own role's request (the `gpu-memory` pod
//! annotation, MiB), and says so on the new PyTorchJob. The test plays the
//! training operator as `workload_remediation_pytorch` does.
//!
//! Run it:
//!
//!     eval "$(bash hack/local-cluster.sh env)"
//!     MEMPROF_REQUIRE_CLUSTER=1 cargo test --test integration workload_gpu_request::
//!
//! Without `KUBECONFIG` it is skipped with a message.

use crate::common;
use crate::remediation_support;
use crate::workload_remediation_pytorch::{batches, profiled_pytorchjob, stored};
use crate::workload_support;

use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use memprof::api::workload::WorkloadKind;
use memprof::api::{AllocatorStats, MemoryProfile, RiskLevel, RoleRecommendation};
use remediation_support::apply_policy;
use serde_json::json;
use workload_support::*;

const GB: u64 = 1_000_000_000;

/// The report of `pod` whose trainer's allocator is at `reserved` bytes
/// after 10 training steps, its GPU at `risk`, sampled at offset `t`.
async fn measured(admin: &Client, ns: &str, pod: &Pod, reserved: u64, risk: RiskLevel, t: u64) {
    let peak = if risk == RiskLevel::Critical { 79 } else { 60 };
    let tto = (risk == RiskLevel::Critical).then_some(5.0);
    let gpus = vec![gpu(0, peak, peak, risk, tto)];
    let mut report = pod_report(pod, "train", 0, &at(t), gpus);
    report.spec.allocator = Some(AllocatorStats {
        allocated_bytes: reserved / 2,
        reserved_bytes: reserved,
        peak_allocated_bytes: Some(reserved - GB),
        step: Some(10),
        ..Default::default()
    });
    apply_report(admin, ns, &report).await;
}

/// The profile's Master and Worker recommendations, once both have a request.
async fn requests(admin: &Client, ns: &str) -> Vec<RoleRecommendation> {
    let profiles: Api<MemoryProfile> = Api::namespaced(admin.clone(), ns);
    eventually("Master and Worker requests", || async {
        let p = profiles.get("train").await.map_err(|e| e.to_string())?;
        let recs = p.status.map(|s| s.recommendation).unwrap_or_default();
        let both = recs.len() == 2 && recs.iter().all(|r| r.request_bytes.is_some());
        both.then_some(recs.clone()).ok_or(format!("{recs:?}"))
    })
    .await
}

/// What replica type `rtype`'s pod template asks KAI-Scheduler for, MiB.
fn asked(pt: &kube::api::DynamicObject, rtype: &str) -> Option<u64> {
    let at = format!("/spec/pytorchReplicaSpecs/{rtype}/template/metadata/annotations/gpu-memory");
    pt.data.pointer(&at)?.as_str()?.parse().ok()
}

#[tokio::test]
async fn a_recreated_pytorchjob_asks_kai_for_each_roles_recommended_gpu_memory() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let ns = ns.name.as_str();
    let op = start_operator(&admin, ns);
    let policy = json!({
        "selector": {"matchLabels": {"team": "ml"}},
        "triggers": [{"riskAtLeast": {"level": "critical"}}],
        "actions": [{"scaleBatch": {"env": "BATCH_SIZE", "factor": 0.75, "minimum": 4,
                                    "gpuMemoryRequest": "kaiScheduler"}}],
        "cooldownSeconds": 0,
        "maxRemediations": 1,
    });
    apply_policy(&admin, ns, "kai", policy).await.unwrap();
    let (pt, pods) = profiled_pytorchjob(&admin, ns, json!({})).await;
    // It waits for no evaluation or checkpoint: a request from training steps.
    let phases = json!({"metadata": {"annotations": {"memprof.dev/recommend-phases": "none"}}});
    api(&admin, ns, WorkloadKind::PyTorchJob)
        .patch("train", &PatchParams::default(), &Patch::Merge(&phases))
        .await
        .unwrap();
    let reserved = [6 * GB, 20 * GB, 24 * GB];
    for (pod, r) in pods.iter().zip(reserved) {
        measured(&admin, ns, pod, r, RiskLevel::Low, 50).await;
    }
    let recs = requests(&admin, ns).await;
    let roles: Vec<&str> = recs.iter().map(|r| r.role.as_str()).collect();
    assert_eq!(roles, ["Master", "Worker"]);
    let mib = |r: &RoleRecommendation| r.request_bytes.unwrap().div_ceil(1 << 20);
    let (master, worker) = (mib(&recs[0]), mib(&recs[1]));
    assert!(master < worker, "{recs:?}");

    // Worker 1 goes critical: the policy recreates the PyTorchJob.
    measured(&admin, ns, &pods[2], 24 * GB, RiskLevel::Critical, 100).await;
    let rec = record_in(&admin, ns, "Done").await;
    assert_eq!(rec.env_change.as_deref(), Some("recreate"), "{rec:?}");
    let new = stored(&admin, ns).await;
    assert_ne!(new.uid(), pt.uid(), "a new PyTorchJob");
    assert_eq!(batches(&new), vec![Some(json!("24")), Some(json!("24"))]);
    // Each pod template its own role's request: the master does not ask
    // for the workers' (nor is its request lost with the Job view's).
    let (m, w) = (asked(&new, "Master"), asked(&new, "Worker"));
    assert!(
        m.is_some_and(|m| m >= master && m < worker),
        "{m:?} {recs:?}"
    );
    assert!(w.is_some_and(|w| w >= worker), "{w:?} {recs:?}");
    let note = new
        .annotations()
        .get("memprof.dev/gpu-memory-request")
        .cloned();
    let want = format!(
        "Master: KaiScheduler annotation gpu-memory={}; Worker: KaiScheduler annotation gpu-memory={}",
        m.unwrap(),
        w.unwrap()
    );
    assert_eq!(note.as_deref(), Some(want.as_str()));
    op.stop().await;
}
