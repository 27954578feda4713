//! `scaleBatch`'s `gpuMemoryRequest` end to end against the local control
//! plane: an agent-only pod reports a trainer that evaluated (the Job
//! waits for no checkpoint: `memprof.dev/recommend-phases: evaluation`),
//! then a leak takes its risk to high; the policy recreates the Job with
//! a smaller batch and, in KAI-Scheduler's terms, the GPU memory the
//! profile recommended (the pod template's `gpu-memory` annotation, MiB).

use crate::agent_common;
use crate::common;
use crate::remediation_support;

use agent_common::push;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, Patch, PatchParams};
use kube::ResourceExt;
use memprof::api::MemoryProfile;
use remediation_support::*;
use serde_json::json;

/// One push: `allocated` (reserved 2 GB above it) of an 80 GB GPU, at `step`, in `phase`.
fn at(t: f64, step: u64, phase: &str, allocated: u64) -> serde_json::Value {
    json!({
        "version": 1, "time": t, "pid": 4242, "rank": 0, "step": step, "phase": phase,
        "devices": [{"index": 0, "uuid": "GPU-recommend-rem", "allocatedBytes": allocated,
                     "reservedBytes": allocated + 2_000_000_000u64, "peakAllocatedBytes": allocated,
                     "freeBytes": 80_000_000_000u64 - allocated - 2_500_000_000u64,
                     "totalBytes": 80_000_000_000u64}],
    })
}

#[tokio::test]
async fn a_recreated_job_asks_kai_for_the_recommended_gpu_memory() {
    let Some(client) = common::cluster().await else {
        return;
    };
    let ns = common::TestNamespace::create(&client).await;
    let ns = ns.name.as_str();
    let operator = common::start_operator(&client, ns);
    let policy = json!({
        "selector": {"matchLabels": {"team": "ml"}},
        "triggers": [{"riskAtLeast": {"level": "high"}}],
        "actions": [{"scaleBatch": {"env": "BATCH_SIZE", "factor": 0.75, "minimum": 4,
                                    "gpuMemoryRequest": "kaiScheduler"}}],
        "cooldownSeconds": 0,
        "maxRemediations": 1,
    });
    apply_policy(&client, ns, "kai", policy).await.unwrap();
    let first = training_job(&client, ns, "train", Some("64")).await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    let phases =
        json!({"metadata": {"annotations": {"memprof.dev/recommend-phases": "evaluation"}}});
    jobs.patch("train", &PatchParams::default(), &Patch::Merge(&phases))
        .await
        .unwrap();
    let pod = first_pod(&client, ns, "train").await;
    let sidecar = agent_common::start(&client, &pod.name_any(), &pod.uid().unwrap(), ns).await;

    // Steady steps and an evaluation at 30 GB: a recommendation with a request.
    let t0 = jiff::Timestamp::now().as_second() as f64 - 230.0;
    for i in 0..10u64 {
        let phase = if i == 5 { "eval" } else { "train" };
        assert_eq!(
            push(&sidecar, &at(t0 + i as f64, i + 1, phase, 30_000_000_000))
                .await
                .0,
            200
        );
    }
    let profiles: Api<MemoryProfile> = Api::namespaced(client.clone(), ns);
    let request = common::eventually("a recommendation with a request", || async {
        let p = profiles.get("train").await.map_err(|e| e.to_string())?;
        let recs = p.status.map(|s| s.recommendation).unwrap_or_default();
        recs.first()
            .and_then(|r| r.request_bytes)
            .ok_or(format!("{recs:?}"))
    })
    .await;

    // Then a 100 MB/s leak for 200 s: high risk, the policy recreates.
    for i in 0..=200u64 {
        let allocated = 30_000_000_000u64 + 100_000_000 * i;
        let body = at(t0 + 20.0 + i as f64, 11 + i, "train", allocated);
        assert_eq!(push(&sidecar, &body).await.0, 200, "push {i}");
    }
    let old_uid = first.uid().unwrap();
    let second = common::eventually("the Job recreated", || async {
        match job(&client, ns, "train").await {
            Some(j) if j.uid().as_deref() != Some(old_uid.as_str()) => Ok(j),
            other => Err(format!("{:?}", other.map(|j| j.uid()))),
        }
    })
    .await;
    drop(sidecar);
    assert_eq!(env_of(&second, "BATCH_SIZE").as_deref(), Some("48"));
    let template = second.spec.as_ref().unwrap().template.metadata.as_ref();
    let asked = template
        .and_then(|m| m.annotations.as_ref())
        .and_then(|a| a.get("gpu-memory"))
        .and_then(|v| v.parse::<u64>().ok())
        .expect("the pod template's gpu-memory annotation");
    // At least what was recommended before the leak (it only rose since), in MiB rounded up.
    assert!(
        asked >= request.div_ceil(1 << 20),
        "{asked} MiB < {request} B"
    );
    let note = second
        .annotations()
        .get("memprof.dev/gpu-memory-request")
        .cloned();
    assert_eq!(
        note,
        Some(format!("KaiScheduler annotation gpu-memory={asked}")),
        "{:?}",
        second.annotations()
    );
    operator.stop().await;
}
