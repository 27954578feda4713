//! An agent-only pod end to end against the real local control plane: the
//! sidecar sees no GPU through NVML (no driver here), the in-process agent's
//! pushes are all it has, and the operator rolls its report up into the
//! Job's MemoryProfile with a risk, a time to OOM and the allocator's verdict.

use crate::agent_common;
use crate::common;

use agent_common::push;
use kube::api::Api;
use kube::ResourceExt;
use memprof::api::{DataSource, MemoryProfile, MemoryReport, RiskLevel};

#[tokio::test]
async fn an_agent_only_pod_rolls_up_with_risk_and_time_to_oom() {
    let Some(client) = common::cluster().await else {
        return;
    };
    let agent_common::OneRank {
        pod,
        sidecar,
        operator,
        ns,
    } = agent_common::one_rank(&client).await;

    // 200 s of a 100 MB/s leak, as the agent would push it once a second,
    // dated in the recent past (the operator ignores reports from the future).
    let t0 = jiff::Timestamp::now().as_second() as f64 - 210.0;
    for i in 0..=200u64 {
        let allocated = 30_000_000_000u64 + 100_000_000 * i;
        let reserved = allocated + 2_000_000_000;
        let body = serde_json::json!({
            "version": 1, "time": t0 + i as f64, "step": 2 * i,
            "devices": [{"index": 0, "uuid": "GPU-agent-only", "allocatedBytes": allocated,
                         "reservedBytes": reserved, "peakAllocatedBytes": allocated,
                         "freeBytes": 80_000_000_000u64 - reserved - 500_000_000,
                         "totalBytes": 80_000_000_000u64}],
        });
        assert_eq!(push(&sidecar, &body).await.0, 200, "push {i}");
    }

    let reports: Api<MemoryReport> = Api::namespaced(client.clone(), &ns.name);
    let report = common::eventually("the agent-only report", || async {
        match reports
            .get_opt(&pod.name_any())
            .await
            .map_err(|e| e.to_string())?
        {
            Some(r) if r.spec.summary.risk >= RiskLevel::High => Ok(r),
            other => Err(format!("{:?}", other.map(|r| r.spec.summary))),
        }
    })
    .await;
    assert_eq!(report.spec.summary.source, DataSource::Agent);
    assert_eq!(
        report.spec.heartbeat_seconds,
        Some(5),
        "the operator can tell a stale rank"
    );

    // Contract B: the next push is answered with that verdict and asks for
    // allocation history; its acknowledgement of a directive is kept and
    // written into the report (the API server's schema takes both fields).
    let ack = serde_json::json!({
        "version": 1, "time": t0 + 201.0, "pid": 4242, "rank": 0,
        "devices": [{"index": 0, "uuid": "GPU-agent-only", "allocatedBytes": 50_100_000_000u64,
                     "reservedBytes": 52_100_000_000u64, "freeBytes": 27_400_000_000u64,
                     "totalBytes": 80_000_000_000u64}],
        "acks": [{"id": "train/critical-1", "action": "split micro-batch 16 x 1 -> 8 x 2", "ok": true}],
    });
    let (code, answer) = push(&sidecar, &ack).await;
    assert_eq!(code, 200, "{answer}");
    let answer: serde_json::Value =
        serde_json::from_str(answer.split_once("\r\n\r\n").unwrap().1).unwrap();
    assert!(
        ["high", "critical"].contains(&answer["verdict"]["risk"].as_str().unwrap_or("")),
        "{answer}"
    );
    assert_eq!(answer["verdict"]["source"], "agent", "{answer}");
    assert_eq!(answer["history"], true, "{answer}");
    let acked = common::eventually("the ack in the report", || async {
        let r = reports
            .get(&pod.name_any())
            .await
            .map_err(|e| e.to_string())?;
        match r.spec.agent_acks.first() {
            Some(a) => Ok(a.clone()),
            None => Err("no agentAcks yet".to_string()),
        }
    })
    .await;
    assert_eq!(
        (acked.id.as_str(), acked.ok, acked.pid, acked.rank),
        ("train/critical-1", true, Some(4242), Some(0))
    );

    let profiles: Api<MemoryProfile> = Api::namespaced(client.clone(), &ns.name);
    let st = common::eventually("the profile rolled up from the agent", || async {
        let p = profiles.get("train").await.map_err(|e| e.to_string())?;
        match p.status {
            Some(st) if st.risk >= RiskLevel::High && st.time_to_oom_seconds.is_some() => Ok(st),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(st.ranks_reporting, 1, "{st:?}");
    assert!(st.leak_suspected, "{st:?}");
    let allocator = serde_json::to_value(&st).unwrap()["allocator"].clone();
    assert!(
        !allocator.is_null(),
        "the allocator roll-up is in the status: {st:?}"
    );
    operator.stop().await;
}
