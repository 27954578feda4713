//! The JobSet and PyTorchJob twins of Job tests that had none (the table:
//! docs/security.md and docs/remediation.md, "Twins per kind"): a policy
//! of one namespace never acts on another's workload; accumulation takes
//! the nearest global batch above; a recreated JobSet asks KAI for its
//! recommended request; and a planted pod's CUDA OOM. For the last: a
//! tenant who may create pods in the namespace plants a pod that claims
//! another team's JobSet (through its child Job) or PyTorchJob, with the
//! workload's labels and controller reference, and makes it exit with a
//! CUDA OOM. The twin of
//! `pod_trust::pod_with_only_the_jobs_label_and_a_cuda_oom_exit_never_fires_a_policy`:
//! no OOM is recorded and the `oomObserved` policy never fires for the
//! workload; the same exit of the workload's own rank does. The upper
//! controllers are played as `workload_support` does.
//!
//! Run them:
//!
//!     eval "$(bash hack/local-cluster.sh env)"
//!     MEMPROF_REQUIRE_CLUSTER=1 cargo test --test integration workload_twins_more::
//!
//! Without `KUBECONFIG` every test is skipped with a message.

use crate::common;
use crate::remediation_namespaces::share_admission_key;
use crate::remediation_support;
use crate::tenant_support;
use crate::workload_remediation_pytorch::profiled_pytorchjob;
use crate::workload_remediation_twins::profiled_jobset;
use crate::workload_support;

use common::*;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::{Client, ResourceExt};
use memprof::api::workload::WorkloadKind;
use memprof::api::{AllocatorStats, RemediationRecord};
use memprof::api::{MemoryProfile, RiskLevel};
use memprof::pipeline::Setup;
use remediation_support::{apply_policy, records, shrink_policy, stays, terminate_container};
use serde_json::{json, Value};
use std::time::Duration;
use tenant_support::pod_creator;
use workload_support::*;

/// What a trainer prints when PyTorch runs out of GPU memory.
const CUDA_OOM: &str =
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB";

/// On an observed OOM of a `team: ml` workload, annotate it.
async fn oom_policy(admin: &Client, ns: &str) {
    let spec = json!({
        "selector": {"matchLabels": {"team": "ml"}},
        "triggers": [{"oomObserved": true}],
        "actions": [{"annotate": {"key": "example.com/gpu-oom", "value": "seen"}}],
    });
    apply_policy(admin, ns, "on-oom", spec).await.unwrap();
}

/// The tenant creates `manifest`; a report for it, as its own sidecar
/// would write one, names it rank 0 of `job`; its container `container`
/// exits with a CUDA OOM (written as the kubelet would). Returns once
/// `train`'s profile names the pod among the reports it refused: the
/// roll-up has read it, so the OOM scan has had its chance.
async fn planted_oom(admin: &Client, ns: &str, manifest: Value, job: &str, container: &str) {
    let tenant = pod_creator(admin, ns).await;
    let pod: Pod = serde_json::from_value(manifest).unwrap();
    let pod = Api::<Pod>::namespaced(tenant, ns)
        .create(&PostParams::default(), &pod)
        .await
        .expect("the tenant may create pods");
    let name = pod.name_any();
    let low = vec![gpu(0, 30, 30, RiskLevel::Low, None)];
    apply_report(admin, ns, &pod_report(&pod, job, 0, &at(1), low)).await;
    terminate_container(admin, ns, &name, container, 1, CUDA_OOM).await;
    let profiles = Api::<MemoryProfile>::namespaced(admin.clone(), ns);
    eventually("the planted pod's report refused", || async {
        let p = profiles.get("train").await.map_err(|e| e.to_string())?;
        let st = p.status.unwrap_or_default();
        let valid = st.conditions.iter().find(|c| c.type_ == "ReportsValid");
        let message = valid.map(|c| c.message.clone()).unwrap_or_default();
        message.contains(&name).then_some(()).ok_or(message)
    })
    .await;
}

/// No OOM recorded and no remediation on `train`'s profile, and the
/// workload never annotated by the policy.
async fn untouched(admin: &Client, ns: &str, kind: WorkloadKind) {
    let profiles = Api::<MemoryProfile>::namespaced(admin.clone(), ns);
    stays(
        "no OOM recorded, no policy fired",
        Duration::from_secs(5),
        || async {
            let p = profiles.get("train").await.map_err(|e| e.to_string())?;
            let st = p.status.unwrap_or_default();
            let top = api(admin, ns, kind)
                .get("train")
                .await
                .map_err(|e| e.to_string())?;
            let seen = top.annotations().get("example.com/gpu-oom").cloned();
            (st.ooms.is_empty() && st.remediations.is_empty() && seen.is_none())
                .then_some(())
                .ok_or(format!("{:?} {:?} {seen:?}", st.ooms, st.remediations))
        },
    )
    .await;
}

/// The genuine rank `pod`'s same exit is recorded on the workload (uid
/// `uid`) and fires the policy.
async fn genuine_fires(
    admin: &Client,
    ns: &str,
    kind: WorkloadKind,
    uid: &str,
    pod: &str,
    c: &str,
) {
    terminate_container(admin, ns, pod, c, 1, CUDA_OOM).await;
    let profiles = Api::<MemoryProfile>::namespaced(admin.clone(), ns);
    let oom = eventually("the genuine rank's OOM recorded", || async {
        let st = profiles
            .get("train")
            .await
            .map_err(|e| e.to_string())?
            .status;
        let ooms = st.map(|s| s.ooms).unwrap_or_default();
        ooms.into_iter().next().ok_or("none".to_string())
    })
    .await;
    assert_eq!(oom.pod, pod);
    assert_eq!(oom.job_uid.as_deref(), Some(uid), "the workload's");
    eventually("the workload annotated by the policy", || async {
        let top = api(admin, ns, kind)
            .get("train")
            .await
            .map_err(|e| e.to_string())?;
        let seen = top.annotations().get("example.com/gpu-oom").cloned();
        (seen.as_deref() == Some("seen"))
            .then_some(())
            .ok_or(format!("{seen:?}"))
    })
    .await;
}

/// A pod with `job`'s labels and its JobSet's, created by the tenant. No
/// controller reference and no `controller-uid`: the Job controller would
/// adopt such a pod and delete it as one too many for its parallelism, so
/// the labels are all a tenant's pod can keep of the claim.
fn pod_claiming_child(job: &Job, name: &str) -> Value {
    let mut labels = job.labels().clone();
    labels.insert("job-name".into(), job.name_any());
    labels.insert("batch.kubernetes.io/job-name".into(), job.name_any());
    json!({"metadata": {"name": name, "labels": labels},
           "spec": {"restartPolicy": "Never",
                    "containers": [{"name": "trainer", "image": "busybox"}]}})
}

#[tokio::test]
async fn a_tenant_s_pod_claiming_a_jobset_s_child_with_a_cuda_oom_never_fires_a_policy() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let ns = ns.name.as_str();
    let op = start_operator(&admin, ns);
    oom_policy(&admin, ns).await;
    let js = profiled_jobset(&admin, ns, json!({})).await;
    let child = Api::<Job>::namespaced(admin.clone(), ns)
        .get("train-workers-1")
        .await
        .unwrap();
    let planted = pod_claiming_child(&child, "train-workers-1-planted");
    planted_oom(&admin, ns, planted, "train-workers-1", "trainer").await;
    untouched(&admin, ns, WorkloadKind::JobSet).await;

    let genuine = job_pods(&admin, ns, "train-workers-1", 1).await;
    let genuine = genuine[0].name_any();
    let uid = js.uid().unwrap();
    genuine_fires(&admin, ns, WorkloadKind::JobSet, &uid, &genuine, "trainer").await;
    op.stop().await;
}

#[tokio::test]
async fn a_tenant_s_pod_claiming_a_pytorchjob_with_a_cuda_oom_never_fires_a_policy() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let ns = ns.name.as_str();
    let op = start_operator(&admin, ns);
    oom_policy(&admin, ns).await;
    let (pt, pods) = profiled_pytorchjob(&admin, ns, json!({})).await;
    // The PyTorchJob's labels and controller reference, named as a worker
    // the operator has not made (the webhook is down: it is not marked).
    let mut planted = pytorch_pod(&pt, "worker", 2);
    planted["metadata"]["name"] = json!("train-worker-9");
    planted_oom(&admin, ns, planted, "train", "pytorch").await;
    untouched(&admin, ns, WorkloadKind::PyTorchJob).await;

    let uid = pt.uid().unwrap();
    let worker = pods[2].name_any();
    genuine_fires(
        &admin,
        ns,
        WorkloadKind::PyTorchJob,
        &uid,
        &worker,
        "pytorch",
    )
    .await;
    op.stop().await;
}

/// Workload `train` of `kind` in `ns`, profiled, one of its ranks then
/// critical. Returns its uid.
pub(crate) async fn critical_workload(admin: &Client, ns: &str, kind: WorkloadKind) -> String {
    let critical = vec![gpu(0, 79, 79, RiskLevel::Critical, Some(5.0))];
    match kind {
        WorkloadKind::JobSet => {
            let js = profiled_jobset(admin, ns, json!({})).await;
            child_report(admin, ns, "train-workers-1", 100, RiskLevel::Critical).await;
            js.uid().unwrap()
        }
        _ => {
            let (pt, pods) = profiled_pytorchjob(admin, ns, json!({})).await;
            let report = pod_report(&pods[2], "train", 0, &at(100), critical);
            apply_report(admin, ns, &report).await;
            pt.uid().unwrap()
        }
    }
}

/// Whether workload `train` of `kind` in `ns` carries the policy's annotation.
async fn acted_on(admin: &Client, ns: &str, kind: WorkloadKind) -> Result<(String, bool), String> {
    let top = api(admin, ns, kind).get("train").await;
    let top = top.map_err(|e| e.to_string())?;
    let seen = top.annotations().get("example.com/acted").is_some();
    Ok((top.uid().unwrap_or_default(), seen))
}

/// The twin of `remediation_namespaces::a_policy_never_acts_on_a_job_of_another_namespace`
/// for `kind`: a tenant's policy selecting everything in its namespace
/// never acts on another team's workload, critical and counted under the
/// same all-namespaces operator; the tenant's own workload is acted on.
async fn a_policy_never_acts_across_namespaces(kind: WorkloadKind) {
    let Some((admin, tenant)) = workload_cluster().await else {
        return;
    };
    let _alone = common::alone::alone().await;
    let victim = TestNamespace::create(&admin).await;
    let (tenant, victim) = (tenant.name.as_str(), victim.name.as_str());
    share_admission_key(&admin, tenant).await;
    share_admission_key(&admin, victim).await;
    let operator = start_controller(&admin, Setup::for_namespace(""));
    let spec = json!({
        "selector": {},
        "triggers": [{"riskAtLeast": {"level": "critical"}}],
        "actions": [{"annotate": {"key": "example.com/acted", "value": "yes"}}],
    });
    apply_policy(&admin, tenant, "annotate-all", spec)
        .await
        .unwrap();

    let victim_uid = critical_workload(&admin, victim, kind).await;
    critical_workload(&admin, tenant, kind).await;
    // The positive control: the tenant's own workload is acted on.
    eventually("the tenant's own workload annotated", || async {
        let (_, seen) = acted_on(&admin, tenant, kind).await?;
        seen.then_some(()).ok_or("not yet".to_string())
    })
    .await;
    let profiles = Api::<MemoryProfile>::namespaced(admin.clone(), victim);
    eventually("the victim's workload critical", || async {
        let st = profiles
            .get("train")
            .await
            .map_err(|e| e.to_string())?
            .status;
        let risk = st.map(|s| s.risk).unwrap_or_default();
        (risk == RiskLevel::Critical)
            .then_some(())
            .ok_or(format!("{risk:?}"))
    })
    .await;
    stays(
        "the victim's workload untouched",
        Duration::from_secs(5),
        || async {
            let (uid, seen) = acted_on(&admin, victim, kind).await?;
            let recs = records(&admin, victim, "train").await;
            (uid == victim_uid && !seen && recs.is_empty())
                .then_some(())
                .ok_or(format!("{uid} {seen} {recs:?}"))
        },
    )
    .await;
    operator.stop().await;
}

#[tokio::test]
async fn a_policy_never_acts_on_a_jobset_of_another_namespace() {
    a_policy_never_acts_across_namespaces(WorkloadKind::JobSet).await;
}

#[tokio::test]
async fn a_policy_never_acts_on_a_pytorchjob_of_another_namespace() {
    a_policy_never_acts_across_namespaces(WorkloadKind::PyTorchJob).await;
}

/// The trainer's variables of the Job test: 7 × 2 = 14 per rank; the
/// factor 0.75 allows 5, and no micro-batch in [3, 5] divides 14.
fn seven_by_two(env: &mut Value) {
    let vars = env.as_array_mut().expect("an env list");
    vars.retain(|v| v["name"] != "BATCH_SIZE" && v["name"] != "GRAD_ACCUM_STEPS");
    vars.push(json!({"name": "BATCH_SIZE", "value": "7"}));
    vars.push(json!({"name": "GRAD_ACCUM_STEPS", "value": "2"}));
}

/// The env lists of a workload's pod templates, by kind.
fn env_pointers(kind: WorkloadKind) -> Vec<&'static str> {
    match kind {
        WorkloadKind::JobSet => {
            vec!["/spec/replicatedJobs/0/template/spec/template/spec/containers/0/env"]
        }
        _ => vec![
            "/spec/pytorchReplicaSpecs/Master/template/spec/containers/0/env",
            "/spec/pytorchReplicaSpecs/Worker/template/spec/containers/0/env",
        ],
    }
}

/// `keep_global_policy` of the Job test, on a Kueue-managed workload of
/// `kind` whose every template runs 7 × 2 before its rank goes critical.
/// Returns the Done record and the workload after it.
async fn accumulated(kind: WorkloadKind) -> Option<(RemediationRecord, DynamicObject)> {
    let (admin, ns) = workload_cluster().await?;
    let ns = ns.name.as_str();
    let op = start_operator(&admin, ns);
    let mut policy = shrink_policy(false);
    policy["actions"][0]["scaleBatch"]["accumulation"] = json!({"env": "GRAD_ACCUM_STEPS"});
    policy["actions"][0]["scaleBatch"]["minimum"] = json!(1);
    apply_policy(&admin, ns, "keep", policy).await.unwrap();
    let queued = json!({"kueue.x-k8s.io/queue-name": "team-a"});
    let critical_pod = match kind {
        WorkloadKind::JobSet => {
            profiled_jobset(&admin, ns, queued).await;
            None
        }
        _ => Some(profiled_pytorchjob(&admin, ns, queued).await.1.remove(0)),
    };
    // Before any rank is critical: the plan is made on the spec as it is then.
    // Read, change and replace again while the operator's own writes to the
    // workload (its annotations) make the replace a conflict (409).
    let objects = api(&admin, ns, kind);
    eventually("the templates at 7 x 2", || async {
        let mut top = objects.get("train").await.map_err(|e| e.to_string())?;
        for at in env_pointers(kind) {
            seven_by_two(top.data.pointer_mut(at).expect("the template's env"));
        }
        objects
            .replace("train", &PostParams::default(), &top)
            .await
            .map_err(|e| e.to_string())
    })
    .await;
    match critical_pod {
        None => child_report(&admin, ns, "train-workers-0", 100, RiskLevel::Critical).await,
        Some(pod) => {
            let gpus = vec![gpu(0, 79, 79, RiskLevel::Critical, Some(5.0))];
            apply_report(&admin, ns, &pod_report(&pod, "train", 0, &at(100), gpus)).await;
        }
    }
    let rec = record_in(&admin, ns, "Done").await;
    let after = objects.get("train").await.unwrap();
    op.stop().await;
    Some((rec, after))
}

/// The twin of `remediation_accumulation::accumulation_takes_the_nearest_global_batch_above_and_says_so`
/// for `kind`: every template gets 5 × 3, and the record says the batch
/// per rank went 14 → 15.
async fn nearest_above(kind: WorkloadKind) {
    let Some((rec, top)) = accumulated(kind).await else {
        return;
    };
    assert_eq!(
        rec.action,
        "scaleBatch BATCH_SIZE×GRAD_ACCUM_STEPS 7×2 → 5×3 (batch per rank 14 → 15, nearest not below)"
    );
    for at in env_pointers(kind) {
        let env = top.data.pointer(at).and_then(|e| e.as_array()).cloned();
        let value = |name: &str| {
            let found = env.iter().flatten().find(|e| e["name"] == name);
            found.map(|e| e["value"].clone())
        };
        assert_eq!(
            (value("BATCH_SIZE"), value("GRAD_ACCUM_STEPS")),
            (Some(json!("5")), Some(json!("3"))),
            "{at}: {env:?}"
        );
    }
}

#[tokio::test]
async fn accumulation_takes_the_nearest_global_batch_above_for_a_jobset() {
    nearest_above(WorkloadKind::JobSet).await;
}

#[tokio::test]
async fn accumulation_takes_the_nearest_global_batch_above_for_a_pytorchjob() {
    nearest_above(WorkloadKind::PyTorchJob).await;
}

/// The report of child Job `job`'s pod whose trainer's allocator is at
/// `reserved` bytes after 10 training steps, its GPU at `risk`.
async fn measured_child(admin: &Client, ns: &str, job: &str, reserved: u64, risk: RiskLevel) {
    const GB: u64 = 1_000_000_000;
    let pod = job_pods(admin, ns, job, 1).await.remove(0);
    let peak = if risk == RiskLevel::Critical { 79 } else { 60 };
    let tto = (risk == RiskLevel::Critical).then_some(5.0);
    let gpus = vec![gpu(0, peak, peak, risk, tto)];
    let t = if risk == RiskLevel::Critical { 100 } else { 50 };
    let mut report = pod_report(&pod, job, 0, &at(t), gpus);
    report.spec.allocator = Some(AllocatorStats {
        allocated_bytes: reserved / 2,
        reserved_bytes: reserved,
        peak_allocated_bytes: Some(reserved - GB),
        step: Some(10),
        ..Default::default()
    });
    apply_report(admin, ns, &report).await;
}

/// The request `train`'s profile recommends for its first role, MiB,
/// once there is one.
async fn recommended_mib(admin: &Client, ns: &str) -> u64 {
    let profiles: Api<MemoryProfile> = Api::namespaced(admin.clone(), ns);
    let rec = eventually("a request recommended", || async {
        let p = profiles.get("train").await.map_err(|e| e.to_string())?;
        let recs = p.status.map(|s| s.recommendation).unwrap_or_default();
        let first = recs.first().and_then(|r| r.request_bytes);
        first.ok_or(format!("{recs:?}"))
    })
    .await;
    rec.div_ceil(1 << 20)
}

/// The twin of `recommend_remediation::a_recreated_job_asks_kai_for_the_recommended_gpu_memory`
/// for a JobSet Kueue does not manage: recreated at the top level, its
/// pod template asks KAI-Scheduler for the profile's recommended request
/// (the `gpu-memory` annotation, MiB), and the new JobSet says so.
#[tokio::test]
async fn a_recreated_jobset_asks_kai_for_the_recommended_gpu_memory() {
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
    let js = profiled_jobset(&admin, ns, json!({})).await;
    let objects = api(&admin, ns, WorkloadKind::JobSet);
    // It waits for no evaluation or checkpoint: a JobSet's phases are its
    // replicated job's template's, which the JobSet controller copies onto
    // each of its Jobs (played here on the child Jobs).
    let phases = json!({"metadata": {"annotations": {"memprof.dev/recommend-phases": "none"}}});
    for job in ["train-workers-0", "train-workers-1"] {
        Api::<Job>::namespaced(admin.clone(), ns)
            .patch(job, &PatchParams::default(), &Patch::Merge(&phases))
            .await
            .unwrap();
    }
    for job in ["train-workers-0", "train-workers-1"] {
        measured_child(&admin, ns, job, 20_000_000_000, RiskLevel::Low).await;
    }
    let mib = recommended_mib(&admin, ns).await;

    measured_child(
        &admin,
        ns,
        "train-workers-1",
        20_000_000_000,
        RiskLevel::Critical,
    )
    .await;
    let done = record_in(&admin, ns, "Done").await;
    assert_eq!(done.env_change.as_deref(), Some("recreate"), "{done:?}");
    let new = eventually("the new JobSet", || async {
        let top = objects.get("train").await.map_err(|e| e.to_string())?;
        (top.uid() != js.uid())
            .then_some(top)
            .ok_or("the old one".to_string())
    })
    .await;
    let at = "/spec/replicatedJobs/0/template/spec/template/metadata/annotations/gpu-memory";
    let asked: Option<u64> = new.data.pointer(at).and_then(|v| v.as_str()?.parse().ok());
    assert!(asked.is_some_and(|a| a >= mib), "{asked:?} < {mib}");
    let note = new
        .annotations()
        .get("memprof.dev/gpu-memory-request")
        .cloned();
    assert!(
        note.as_deref()
            .is_some_and(|n| n.contains("KaiScheduler annotation gpu-memory=")),
        "{note:?}"
    );
    op.stop().await;
}
