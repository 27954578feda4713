//! The GPU-memory recommendation end to end against the local control
//! plane: an agent-only pod's trainer pushes steady training steps, then an
//! evaluation phase and a checkpoint; the real operator writes
//! `status.recommendation` only once both were seen, and `memprof
//! recommend` prints it in each scheduler's dialect.

use crate::agent_common;
use crate::cli_support;
use crate::common;

use agent_common::push;
use kube::api::Api;
use memprof::api::{MemoryProfile, RoleRecommendation};

const RESERVED: u64 = 20_000_000_000;
const TOTAL: u64 = 80_000_000_000;

/// One push of a steady step: 20 GB reserved, `phase`, with `events`.
fn step(t: f64, step: u64, phase: &str, events: serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "version": 1, "time": t, "pid": 4242, "rank": 0, "step": step, "phase": phase,
        "devices": [{"index": 0, "uuid": "GPU-recommend", "allocatedBytes": RESERVED - 3_000_000_000,
                     "reservedBytes": RESERVED, "peakAllocatedBytes": RESERVED - 1_000_000_000,
                     "freeBytes": TOTAL - RESERVED - 500_000_000, "totalBytes": TOTAL}],
        "events": events,
    })
}

async fn recommendation(
    profiles: &Api<MemoryProfile>,
    what: &str,
    done: impl Fn(&RoleRecommendation) -> bool,
) -> RoleRecommendation {
    common::eventually(what, || async {
        let p = profiles.get("train").await.map_err(|e| e.to_string())?;
        let recs = p.status.map(|s| s.recommendation).unwrap_or_default();
        match recs.first() {
            Some(r) if done(r) => Ok(r.clone()),
            other => Err(format!("{other:?}")),
        }
    })
    .await
}

#[tokio::test]
async fn the_recommendation_waits_for_evaluation_and_a_checkpoint_then_prints_per_scheduler() {
    let Some(client) = common::cluster().await else {
        return;
    };
    let agent_common::OneRank {
        sidecar,
        operator,
        ns,
        ..
    } = agent_common::one_rank(&client).await;
    let profiles: Api<MemoryProfile> = Api::namespaced(client.clone(), &ns.name);

    // 1. Twenty training steps: steps enough, no evaluation, no checkpoint.
    let t0 = jiff::Timestamp::now().as_second() as f64 - 60.0;
    for i in 0..20u64 {
        let body = step(t0 + i as f64, i + 1, "forward", serde_json::json!([]));
        assert_eq!(push(&sidecar, &body).await.0, 200, "push {i}");
    }
    let early = recommendation(&profiles, "a recommendation without a request", |r| {
        r.basis.steps >= 3
    })
    .await;
    assert_eq!(early.request_bytes, None, "{early:?}");
    assert!(
        early.reason.contains("no evaluation phase yet"),
        "{early:?}"
    );
    assert!(early.reason.contains("no checkpoint yet"), "{early:?}");
    let out = cli_support::memprof(&["recommend", "train", "-n", &ns.name], &[]).await;
    assert_eq!(out.status.code(), Some(3), "{:?}", cli_support::texts(&out));

    // 2. An evaluation phase, then a checkpoint the trainer announces.
    let eval = step(t0 + 21.0, 21, "eval", serde_json::json!([]));
    assert_eq!(push(&sidecar, &eval).await.0, 200);
    let ckpt = serde_json::json!([{"t": t0 + 22.0, "name": "checkpoint", "note": "step=22"}]);
    let saved = step(t0 + 22.0, 22, "forward", ckpt);
    assert_eq!(push(&sidecar, &saved).await.0, 200);
    let rec = recommendation(&profiles, "a request", |r| r.request_bytes.is_some()).await;
    let request = rec.request_bytes.unwrap();
    assert_eq!(
        rec.peak_bytes,
        Some(RESERVED),
        "the allocator's reserved, not NVML: {rec:?}"
    );
    assert!(
        rec.basis.evaluation_seen && rec.basis.checkpoint_seen,
        "{rec:?}"
    );
    assert!(
        request >= RESERVED + rec.context_bytes + rec.margin_bytes,
        "{rec:?}"
    );
    assert_eq!(request % rec.step_bytes, 0, "{rec:?}");

    // 3. The CLI prints it per scheduler, rounded up.
    let args = ["recommend", "train", "-n", &ns.name, "-o", "yaml"];
    let doc = cli_support::yaml(&cli_support::ok(&args).await);
    let role = &doc["roles"][0];
    assert_eq!(role["requestBytes"].as_u64(), Some(request), "{doc:?}");
    let mib = request.div_ceil(1 << 20).to_string();
    let s = &role["schedulers"];
    assert_eq!(
        s["hami"]["resources"]["limits"]["nvidia.com/gpumem"].as_str(),
        Some(mib.as_str())
    );
    assert_eq!(
        s["kaiScheduler"]["annotations"]["gpu-memory"].as_str(),
        Some(mib.as_str())
    );
    let mps = &s["nvidiaDraMps"]["sharing"]["mpsConfig"]["defaultPinnedDeviceMemoryLimit"];
    assert_eq!(mps.as_str(), Some(format!("{mib}Mi").as_str()));
    operator.stop().await;
    drop(sidecar);
}
