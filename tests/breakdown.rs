//! The MemoryProfile's `breakdown` on the real local API server: the
//! operator copies the heaviest breakdown among the Job's genuine reports,
//! never one from a forged report or one whose numbers cannot be true, and
//! follows the reports as they change.

use crate::common;

use common::*;
use kube::api::Api;
use memprof::api::{MemoryBreakdown, MemoryProfile, MemoryProfileStatus, RiskLevel};

const MIB: u64 = 1 << 20;

fn breakdown(static_mib: u64, activations_mib: u64) -> MemoryBreakdown {
    MemoryBreakdown {
        pid: Some(4242),
        rank: Some(0),
        total_parameters: 1_000_000,
        trainable_parameters: 10_000,
        parameters_bytes: static_mib * MIB / 2,
        gradients_bytes: static_mib * MIB / 4,
        optimizer_bytes: static_mib * MIB / 4,
        static_bytes: static_mib * MIB,
        activations_peak_bytes: Some(activations_mib * MIB),
        batch_size: Some(8),
        ..Default::default()
    }
}

/// Waits until the profile's breakdown satisfies `ok`.
async fn wait_breakdown(
    profiles: &Api<MemoryProfile>,
    what: &str,
    ok: impl Fn(&MemoryProfileStatus) -> bool,
) -> MemoryProfileStatus {
    eventually(what, || async {
        let st = profiles
            .get("train")
            .await
            .map_err(|e| e.to_string())?
            .status
            .ok_or("no status yet")?;
        if ok(&st) {
            Ok(st)
        } else {
            Err(format!("{:?}", st.breakdown))
        }
    })
    .await
}

#[tokio::test]
async fn the_profile_takes_the_heaviest_genuine_consistent_breakdown() {
    let Some(client) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&client).await;
    let operator = start_operator(&client, &ns.name);
    create_job(&client, &ns.name, "train", 3, true).await;
    let gpus = |rank| vec![gpu(rank, 40, 40, RiskLevel::Low, None)];

    // Genuine ranks 0 and 1 (1 heavier); rank 2 genuine but impossible
    // (static part smaller than its parameters) and heaviest of all.
    for (rank, b) in [(0, breakdown(1000, 500)), (1, breakdown(1000, 2000))] {
        let mut r = rank_report(&client, &ns.name, "train", rank, &at(10), gpus(rank)).await;
        r.spec.breakdown = Some(b);
        apply_report(&client, &ns.name, &r).await;
    }
    let mut impossible = breakdown(10, 90_000);
    impossible.parameters_bytes = 20 * MIB;
    let mut r = rank_report(&client, &ns.name, "train", 2, &at(10), gpus(2)).await;
    r.spec.breakdown = Some(impossible);
    apply_report(&client, &ns.name, &r).await;
    // A forged report: claims the Job, belongs to no pod of it.
    let mut forged = report("train", 7, &at(10), gpus(7));
    forged.spec.breakdown = Some(breakdown(50_000, 50_000));
    apply_report(&client, &ns.name, &forged).await;

    let profiles: Api<MemoryProfile> = Api::namespaced(client.clone(), &ns.name);
    let st = wait_breakdown(&profiles, "rank 1's breakdown in the profile", |st| {
        st.ranks_reporting == 3 && st.breakdown.is_some()
    })
    .await;
    let b = st.breakdown.unwrap();
    assert_eq!(b.rank, Some(1), "{b:?}");
    let pod1 = rank_report(&client, &ns.name, "train", 1, &at(10), vec![]).await;
    assert_eq!(b.pod.as_deref(), Some(pod1.spec.pod_name.as_str()));
    assert_eq!(
        (b.static_bytes, b.activations_peak_bytes, b.batch_size),
        (1000 * MIB, Some(2000 * MIB), Some(8))
    );

    // Rank 1's trainer restarts without an agent: rank 0's is the job's now.
    let r = rank_report(&client, &ns.name, "train", 1, &at(20), gpus(1)).await;
    apply_report(&client, &ns.name, &r).await;
    let st = wait_breakdown(&profiles, "rank 0's breakdown in the profile", |st| {
        st.breakdown.as_ref().and_then(|b| b.rank) == Some(0)
    })
    .await;
    assert_eq!(
        st.breakdown.unwrap().activations_peak_bytes,
        Some(500 * MIB)
    );
    operator.stop().await;
}
