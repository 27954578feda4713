//! The agent's memory breakdown end to end against the real local control
//! plane: pushes with a `breakdown` reach a real `memprof-sidecar`, which
//! refuses an impossible one with the field named, keeps the newest of each
//! trainer process and writes the heaviest into the pod's MemoryReport; the
//! operator rolls it up into the Job's MemoryProfile with the pod and rank.

mod agent_common;
mod common;
mod webhook_support;

use agent_common::push;
use kube::api::Api;
use kube::ResourceExt;
use memprof::api::{FlagKind, MemoryProfile, MemoryReport, ModuleType};

const MIB: u64 = 1 << 20;

/// A LoRA fine-tune's breakdown as `memprof_agent.breakdown` pushes it.
fn breakdown(activations_mib: u64) -> serde_json::Value {
    serde_json::json!({
        "step": 3, "totalParameters": 124_440_000u64, "trainableParameters": 811_000,
        "parametersBytes": 500 * MIB, "gradientsBytes": 3 * MIB, "optimizerBytes": 6 * MIB,
        "perSampleGradientsBytes": null, "staticBytes": 509 * MIB,
        "activationsPeakBytes": activations_mib * MIB, "batchSize": 16,
        "byModuleType": [
            {"type": "attention", "parameters": 28_000_000, "parametersBytes": 112 * MIB,
             "gradientsBytes": 0, "optimizerBytes": 0},
            {"type": "lora", "parameters": 811_000, "parametersBytes": 3 * MIB,
             "gradientsBytes": 3 * MIB, "optimizerBytes": 6 * MIB}],
        "flags": [{"kind": "nan", "parameter": "h.3.mlp.c_fc.weight", "note": "2 NaN"}],
        "phases": [{"module": "transformer", "forwardBytes": 1200 * MIB, "backwardBytes": 300 * MIB}],
        "optimizerStepPeakBytes": 12 * MIB
    })
}

/// One push of process `pid` (rank `rank`) at `t`, one device, flat memory.
fn body(t: f64, pid: u32, rank: u32, breakdown: Option<serde_json::Value>) -> serde_json::Value {
    let mut b = serde_json::json!({
        "version": 1, "time": t, "pid": pid, "rank": rank, "step": 3,
        "devices": [{"index": 0, "uuid": format!("GPU-breakdown-{rank}"),
                     "allocatedBytes": 2_000_000_000u64, "reservedBytes": 3_000_000_000u64,
                     "freeBytes": 70_000_000_000u64, "totalBytes": 80_000_000_000u64}],
    });
    if let Some(bd) = breakdown {
        b["breakdown"] = bd;
    }
    b
}

#[tokio::test]
async fn a_pushed_breakdown_ends_in_the_report_and_the_profile() {
    let Some(client) = common::cluster().await else {
        return;
    };
    let ns = common::TestNamespace::create(&client).await;
    let operator = common::start_operator(&client, &ns.name);
    common::create_job(&client, &ns.name, "train", 1, true).await;
    let pod = common::job_pods(&client, &ns.name, "train", 1)
        .await
        .remove(0);

    let sidecar =
        agent_common::start(&client, &pod.name_any(), &pod.uid().unwrap(), &ns.name).await;

    // An impossible breakdown is refused with the field named.
    let t0 = jiff::Timestamp::now().as_second() as f64 - 30.0;
    let mut bad = breakdown(100);
    bad["staticBytes"] = serde_json::json!(MIB);
    let (code, text) = push(&sidecar, &body(t0, 11, 0, Some(bad))).await;
    assert_eq!(code, 400, "{text}");
    assert!(
        text.contains("breakdown: staticBytes 1048576 is less than"),
        "{text}"
    );

    // Two trainer processes of the pod: rank 1's activations are larger,
    // and its newest breakdown is the one that counts.
    for i in 0..10 {
        let t = t0 + i as f64;
        let first = (i == 0).then(|| breakdown(1000));
        assert_eq!(push(&sidecar, &body(t, 11, 0, first)).await.0, 200);
        let second = match i {
            0 => Some(breakdown(500)),
            5 => Some(breakdown(1491)),
            _ => None,
        };
        assert_eq!(push(&sidecar, &body(t, 22, 1, second)).await.0, 200);
    }

    let reports: Api<MemoryReport> = Api::namespaced(client.clone(), &ns.name);
    let b = common::eventually("the report's breakdown", || async {
        let r = reports
            .get_opt(&pod.name_any())
            .await
            .map_err(|e| e.to_string())?;
        match r.and_then(|r| r.spec.breakdown) {
            Some(b) if b.activations_peak_bytes == Some(1491 * MIB) => Ok(b),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!((b.pid, b.rank, b.pod.as_deref()), (Some(22), Some(1), None));
    assert_eq!((b.static_bytes, b.batch_size), (509 * MIB, Some(16)));
    assert_eq!(b.by_module_type[1].type_, ModuleType::Lora);
    assert_eq!(b.flags[0].kind, FlagKind::Nan);
    assert_eq!(b.phases[0].module, "transformer");
    assert!(b.time.is_some());

    let profiles: Api<MemoryProfile> = Api::namespaced(client.clone(), &ns.name);
    let pb = common::eventually("the profile's breakdown", || async {
        let p = profiles.get("train").await.map_err(|e| e.to_string())?;
        match p.status.and_then(|s| s.breakdown) {
            Some(b) => Ok(b),
            None => Err("no breakdown in the status yet".to_string()),
        }
    })
    .await;
    // The pod's rank (RANK=0), as the rest of the profile names ranks.
    assert_eq!(
        (pb.pod.as_deref(), pb.rank),
        (Some(pod.name_any().as_str()), Some(0))
    );
    assert_eq!(
        (pb.static_bytes, pb.activations_peak_bytes, pb.batch_size),
        (509 * MIB, Some(1491 * MIB), Some(16))
    );
    operator.stop().await;
}
