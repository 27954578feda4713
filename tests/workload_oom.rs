//! A CUDA OOM of a workload's rank (a JobSet's child Job's pod, a
//! TrainJob's through its JobSet, a PyTorchJob's worker) against the local
//! control plane: the JobSet, TrainJob and PyTorchJob twins of
//! `remediation::cuda_oom_exit_is_recorded_once_and_…` and
//! `gpu_oom_visibility::a_cuda_oom_is_annotated_announced_once_…`.
//! The OOM is recorded once in the workload's profile (its rank the rank
//! in the workload), the `oomObserved` policy fires for the workload, and
//! `memprof.dev/gpu-oom` and the Events go on the top-level object, never
//! on a child Job or a pod; nothing is repeated when the pod is reported
//! again or the operator restarts. The test writes the pod's termination
//! as a kubelet would, and plays the upper controllers as
//! `workload_support` does.
//!
//! Run them:
//!
//!     eval "$(bash hack/local-cluster.sh env)"
//!     MEMPROF_REQUIRE_CLUSTER=1 cargo test --test integration workload_oom::
//!
//! Without `KUBECONFIG` every test is skipped with a message.

use crate::common;
use crate::remediation_support;
use crate::trainjobs::profiled_trainjob;
use crate::workload_remediation_pytorch::profiled_pytorchjob;
use crate::workload_remediation_twins::profiled_jobset;
use crate::workload_support;

use common::*;
use k8s_openapi::api::batch::v1::Job;
use kube::api::Api;
use kube::{Client, ResourceExt};
use memprof::api::workload::WorkloadKind;
use memprof::api::REASON_GPU_OUT_OF_MEMORY;
use memprof::api::{MemoryProfile, MemoryProfileStatus, ANNOTATION_GPU_OOM};
use remediation_support::{apply_policy, stays, terminate_container};
use serde_json::json;
use std::time::Duration;
use workload_support::*;

/// What a trainer prints when PyTorch runs out of GPU memory (the Job tests').
const CUDA_OOM: &str = "Traceback (most recent call last):\n  ...\ntorch.cuda.OutOfMemoryError: \
     CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity)";

/// The policy of the Job test: on an observed OOM, annotate and tell.
async fn oom_policy(admin: &Client, ns: &str) {
    let spec = json!({
        "selector": {"matchLabels": {"team": "ml"}},
        "triggers": [{"oomObserved": true}],
        "actions": [
            {"annotate": {"key": "example.com/gpu-oom", "value": "seen"}},
            {"event": {"reason": "TrainerOom"}},
        ],
    });
    apply_policy(admin, ns, "on-oom", spec).await.unwrap();
}

/// The rank whose trainer runs out of memory: its pod, its container, its
/// rank in the workload.
struct Rank {
    pod: String,
    container: &'static str,
    rank: u32,
}

/// The profile's status once the OOM is recorded, counted and the policy done.
async fn recorded(admin: &Client, ns: &str) -> MemoryProfileStatus {
    let profiles = Api::<MemoryProfile>::namespaced(admin.clone(), ns);
    eventually("the OOM recorded, counted and the policy done", || async {
        let p = profiles.get("train").await.map_err(|e| e.to_string())?;
        let st = p.status.unwrap_or_default();
        let done = st.remediations.iter().any(|r| r.phase == "Done");
        (st.ooms.len() == 1 && st.oom_count == Some(1) && done)
            .then_some(st.clone())
            .ok_or(format!(
                "{:?} {:?} {:?}",
                st.oom_count, st.ooms, st.remediations
            ))
    })
    .await
}

/// The kinds of the objects the Events with `reason` about `train`
/// regard, once there is one.
async fn events_about(admin: &Client, ns: &str, reason: &str) -> Vec<String> {
    eventually(&format!("a {reason} Event"), || async {
        let kinds = event_kinds(admin, ns, reason, "train").await;
        (!kinds.is_empty())
            .then_some(kinds)
            .ok_or("none".to_string())
    })
    .await
}

/// One OOM, one remediation, one Event of each reason, the annotation kept.
async fn once(admin: &Client, ns: &str, kind: WorkloadKind, want: &str) -> Result<(), String> {
    let profiles = Api::<MemoryProfile>::namespaced(admin.clone(), ns);
    let p = profiles.get("train").await.map_err(|e| e.to_string())?;
    let st = p.status.unwrap_or_default();
    let ooms = event_kinds(admin, ns, REASON_GPU_OUT_OF_MEMORY, "train").await;
    let told = event_kinds(admin, ns, "TrainerOom", "train").await;
    let top = api(admin, ns, kind)
        .get("train")
        .await
        .map_err(|e| e.to_string())?;
    let v = top.annotations().get(ANNOTATION_GPU_OOM).cloned();
    let ok = st.ooms.len() == 1
        && st.oom_count == Some(1)
        && st.remediations.len() == 1
        && (ooms.len(), told.len()) == (1, 1)
        && v.as_deref() == Some(want);
    ok.then_some(()).ok_or(format!(
        "{:?} {:?} {} records, Events {ooms:?} {told:?}, {v:?}",
        st.oom_count,
        st.ooms,
        st.remediations.len()
    ))
}

/// The rank's trainer exits with a CUDA OOM; everything the Job tests
/// check of it, on the top-level workload of `kind` (uid `uid`). Returns
/// the operator, restarted once on the way.
async fn a_cuda_oom_of(
    admin: &Client,
    ns: &str,
    (kind, uid): (WorkloadKind, String),
    r: &Rank,
    op: RunningOperator,
) -> RunningOperator {
    terminate_container(admin, ns, &r.pod, r.container, 1, CUDA_OOM).await;
    let st = recorded(admin, ns).await;
    let oom = &st.ooms[0];
    assert_eq!((oom.pod.as_str(), oom.rank), (r.pod.as_str(), Some(r.rank)));
    assert_eq!(oom.job_uid.as_deref(), Some(uid.as_str()), "the workload's");
    let evidence = format!(
        "terminationMessage {}#0: exit 1, \"CUDA out of memory\"",
        r.container
    );
    assert!(oom.evidence.starts_with(&evidence), "{}", oom.evidence);
    let want = format!("{} rank {}", oom.time, r.rank);
    let objects = api(admin, ns, kind);
    // Within seconds, not at the roll-up's next look (a JobSet's: a minute on).
    let within = Duration::from_secs(30);
    eventually_within(
        within,
        "the workload annotated memprof.dev/gpu-oom",
        || async {
            let top = objects.get("train").await.map_err(|e| e.to_string())?;
            let a = top.annotations();
            let got = (a.get(ANNOTATION_GPU_OOM), a.get("example.com/gpu-oom"));
            (got.0.map(String::as_str) == Some(want.as_str())
                && got.1.map(String::as_str) == Some("seen"))
            .then_some(())
            .ok_or(format!("{got:?}"))
        },
    )
    .await;
    assert_eq!(
        objects.get("train").await.unwrap().uid(),
        Some(uid),
        "annotate does not recreate"
    );
    for reason in [REASON_GPU_OUT_OF_MEMORY, "TrainerOom"] {
        let kinds = events_about(admin, ns, reason).await;
        assert_eq!(kinds, [kind.kind()], "{reason}");
    }
    // The kubelet reports the pod again; then the operator restarts: the
    // records in the status say this OOM was seen, so nothing is repeated.
    terminate_container(admin, ns, &r.pod, r.container, 1, CUDA_OOM).await;
    stays("one OOM, announced once", Duration::from_secs(3), || {
        once(admin, ns, kind, &want)
    })
    .await;
    op.stop().await;
    let op = start_operator(admin, ns);
    stays("one OOM across the restart", Duration::from_secs(5), || {
        once(admin, ns, kind, &want)
    })
    .await;
    op
}

#[tokio::test]
async fn a_cuda_oom_of_a_jobset_rank_is_recorded_once_fires_the_policy_and_lands_on_the_jobset() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let ns = ns.name.as_str();
    let op = start_operator(&admin, ns);
    oom_policy(&admin, ns).await;
    let js = profiled_jobset(&admin, ns, json!({})).await;
    let pod = job_pods(&admin, ns, "train-workers-1", 1).await.remove(0);
    let rank = Rank {
        pod: pod.name_any(),
        container: "trainer",
        rank: 1,
    };
    let top = (WorkloadKind::JobSet, js.uid().unwrap());
    let op = a_cuda_oom_of(&admin, ns, top, &rank, op).await;
    // Its child Jobs carry none: the JobSet's profile holds their ranks.
    for i in 0..2 {
        let j = Api::<Job>::namespaced(admin.clone(), ns)
            .get(&format!("train-workers-{i}"))
            .await
            .unwrap();
        assert!(
            !j.annotations().contains_key(ANNOTATION_GPU_OOM),
            "child {i}"
        );
    }
    op.stop().await;
}

#[tokio::test]
async fn a_cuda_oom_of_a_pytorchjob_worker_is_recorded_once_fires_the_policy_and_lands_on_it() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let ns = ns.name.as_str();
    let op = start_operator(&admin, ns);
    oom_policy(&admin, ns).await;
    let (pt, pods) = profiled_pytorchjob(&admin, ns, json!({})).await;
    // Worker 1: rank 2 in the PyTorchJob (the master is 0).
    let rank = Rank {
        pod: pods[2].name_any(),
        container: "pytorch",
        rank: 2,
    };
    let top = (WorkloadKind::PyTorchJob, pt.uid().unwrap());
    let op = a_cuda_oom_of(&admin, ns, top, &rank, op).await;
    for pod in &pods {
        let p = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(admin.clone(), ns)
            .get(&pod.name_any())
            .await
            .unwrap();
        assert!(
            !p.annotations().contains_key(ANNOTATION_GPU_OOM),
            "{}",
            p.name_any()
        );
    }
    op.stop().await;
}

#[tokio::test]
async fn a_cuda_oom_of_a_trainjob_rank_is_recorded_once_fires_the_policy_and_lands_on_the_trainjob()
{
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let ns = ns.name.as_str();
    let op = start_operator(&admin, ns);
    oom_policy(&admin, ns).await;
    let (tj, _) = profiled_trainjob(&admin, ns, json!({})).await;
    let pod = job_pods(&admin, ns, "train-workers-0", 1).await.remove(0);
    let rank = Rank {
        pod: pod.name_any(),
        container: "trainer",
        rank: 0,
    };
    let top = (WorkloadKind::TrainJob, tj.uid().unwrap());
    let op = a_cuda_oom_of(&admin, ns, top, &rank, op).await;
    // Neither its JobSet nor a child Job carries it.
    let js = api(&admin, ns, WorkloadKind::JobSet)
        .get("train")
        .await
        .unwrap();
    assert!(!js.annotations().contains_key(ANNOTATION_GPU_OOM));
    op.stop().await;
}
