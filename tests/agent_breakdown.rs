//! The agent's memory breakdown end to end against the real local control
//! plane: pushes with a `breakdown` reach a real `memprof-sidecar`, which
//! refuses an impossible one with the field named, keeps the newest of each
//! trainer process and writes the heaviest into the pod's MemoryReport; the
//! operator rolls it up into the Job's MemoryProfile with the pod and rank.

use crate::agent_common;
use crate::common;

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
        "optimizerStepPeakBytes": 12 * MIB,
        "parameterRows": [{"name": "lm_head.weight", "shape": [50257, 768], "dtype": "bfloat16",
                           "bytes": 77_194_752, "trainable": false}],
        "parametersLeftOut": {"rows": 290, "parameters": 85_000_000, "bytes": 170_000_000},
        "layerRows": [{"name": "transformer.h.0", "parameters": 7_087_872,
                       "trainableParameters": 67_584, "bytes": 14_175_744}],
        "layersLeftOut": {"rows": 14, "parameters": 110_000_000, "bytes": 220_000_000},
        "dpSgd": {"samples": 16, "parameters": 148, "normsBytes": 9472, "normsSource": "measured",
                  "tempMatricesBytes": 268_435_456, "sequenceLength": 1024}
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
    let agent_common::OneRank {
        pod,
        sidecar,
        operator,
        ns,
    } = agent_common::one_rank(&client).await;

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

    // A layer with more trainable parameters than parameters cannot be.
    let mut bad = breakdown(100);
    bad["layerRows"][0]["trainableParameters"] = serde_json::json!(7_087_873);
    let (code, text) = push(&sidecar, &body(t0, 11, 0, Some(bad))).await;
    assert_eq!(code, 400, "{text}");
    assert!(
        text.contains("layerRows[0].trainableParameters 7087873 exceeds its parameters"),
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
    // The rows, what they leave out and DP-SGD's part, as pushed.
    assert_eq!(b.parameter_rows[0].shape, vec![50257, 768]);
    assert_eq!(b.parameter_rows[0].dtype, "bfloat16");
    assert_eq!(b.parameters_left_out.as_ref().map(|l| l.rows), Some(290));
    assert_eq!(b.layer_rows[0].trainable_parameters, 67_584);
    assert_eq!(
        b.layers_left_out.as_ref().map(|l| l.bytes),
        Some(220_000_000)
    );
    let dp = b.dp_sgd.as_ref().unwrap();
    assert_eq!(
        (
            dp.norms_bytes,
            dp.norms_source.as_str(),
            dp.temp_matrices_bytes
        ),
        (9472, "measured", Some(268_435_456))
    );

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
    // The API server kept every row field: the CRD's schema has them.
    assert_eq!(pb.parameter_rows, b.parameter_rows);
    assert_eq!(pb.layer_rows, b.layer_rows);
    assert_eq!(
        (pb.parameters_left_out, pb.layers_left_out, pb.dp_sgd),
        (b.parameters_left_out, b.layers_left_out, b.dp_sgd)
    );
    operator.stop().await;
}
