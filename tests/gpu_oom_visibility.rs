//! A CUDA OOM of a profiled Job where people look, and the
//! worst rank's allocation sites in the profile, and every rank's taken at
//! critical (item 4), there and in `memprof report`, against a real
//! control plane (`hack/local-cluster.sh up`; no kubelet: the test writes
//! the pod's termination as a kubelet would).
//!
//!     eval "$(bash hack/local-cluster.sh env)"
//!     MEMPROF_REQUIRE_CLUSTER=1 cargo test --test integration gpu_oom_visibility::
//!
//! Without `KUBECONFIG` every test is skipped with a message.

use crate::cli_support;
use crate::common;
use crate::remediation_support;

use common::*;
use kube::api::Api;
use kube::{Client, ResourceExt};
use memprof::api::{
    AllocationSite, AllocationSites, MemoryProfile, RiskLevel, ANNOTATION_GPU_OOM,
    REASON_GPU_OUT_OF_MEMORY,
};
use remediation_support::*;
use std::time::Duration;

/// The MemoryProfile `name` as `kubectl get memoryprofiles` prints it: the
/// API server's Table, built from the CRD's printer columns. (column, cell) pairs.
async fn printed_row(client: &Client, ns: &str, name: &str) -> Vec<(String, serde_json::Value)> {
    let uri = format!("/apis/memprof.dev/v1alpha1/namespaces/{ns}/memoryprofiles/{name}");
    let req = hyper::Request::get(uri)
        .header(
            "Accept",
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
        )
        .body(Vec::new())
        .unwrap();
    let text = client
        .request_text(req)
        .await
        .expect("the profile as a Table");
    let table: serde_json::Value = serde_json::from_str(&text).unwrap();
    let columns = table["columnDefinitions"].as_array().expect("a Table");
    let cells = table["rows"][0]["cells"].as_array().expect("one row");
    columns
        .iter()
        .map(|c| c["name"].as_str().unwrap_or_default().to_string())
        .zip(cells.iter().cloned())
        .collect()
}

fn cell(row: &[(String, serde_json::Value)], column: &str) -> serde_json::Value {
    row.iter()
        .find(|(c, _)| c == column)
        .unwrap_or_else(|| panic!("no column {column} in {row:?}"))
        .1
        .clone()
}

/// A critical rank 0 whose agent snapshot named the allocating line.
async fn report_with_sites(client: &Client, ns: &str, job: &str) {
    let gpus = vec![gpu(0, 79, 79, RiskLevel::Critical, Some(30.0))];
    let mut r = rank_report(client, ns, job, 0, &at(0), gpus).await;
    r.spec.allocation_sites = Some(AllocationSites {
        time: at(0),
        level: RiskLevel::Critical,
        source: "history".into(),
        sites: vec![AllocationSite {
            file: "/app/train.py".into(),
            line: 88,
            function: "forward".into(),
            bytes: 3 << 30,
            blocks: 300,
        }],
        unattributed_bytes: 0,
    });
    apply_report(client, ns, &r).await;
}

#[tokio::test]
async fn a_cuda_oom_is_annotated_announced_once_and_counted() {
    let Some(client) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&client).await;
    let ns = ns.name.as_str();
    let operator = start_operator(&client, ns);
    training_job(&client, ns, "train", Some("32")).await;
    let pod = first_pod(&client, ns, "train").await;
    report_with_sites(&client, ns, "train").await;
    let profiles = Api::<MemoryProfile>::namespaced(client.clone(), ns);

    // Item 4: the worst rank's sites reach the profile through the roll-up.
    let sites = eventually("the profile's allocation sites", || async {
        let st = profiles.get("train").await.map_err(|e| e.to_string())?;
        st.status
            .and_then(|s| s.allocation_sites)
            .ok_or("no allocationSites yet".to_string())
    })
    .await;
    assert_eq!(
        (sites.rank, sites.pod.as_str()),
        (Some(0), &*pod.name_any())
    );
    assert_eq!(
        (
            sites.sites.sites[0].file.as_str(),
            sites.sites.sites[0].line
        ),
        ("/app/train.py", 88)
    );
    // Before any OOM: no annotation, no count (the column prints <none>).
    let j = job(&client, ns, "train").await.unwrap();
    assert!(!j.annotations().contains_key(ANNOTATION_GPU_OOM));
    assert_eq!(
        cell(&printed_row(&client, ns, "train").await, "OOMS"),
        serde_json::Value::Null
    );

    let msg = "Traceback (most recent call last):\n  ...\ntorch.cuda.OutOfMemoryError: CUDA out of memory. \
               Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity)";
    terminate_container(&client, ns, &pod.name_any(), "trainer", 1, msg).await;
    let st = eventually("the OOM recorded and counted", || async {
        let st = profiles.get("train").await.unwrap().status.unwrap();
        (st.ooms.len() == 1 && st.oom_count == Some(1))
            .then_some(st.clone())
            .ok_or(format!("{:?} {:?}", st.oom_count, st.ooms))
    })
    .await;
    let oom = &st.ooms[0];
    assert_eq!((oom.pod.as_str(), oom.rank), (&*pod.name_any(), Some(0)));
    let want = format!("{} rank 0", oom.time);
    eventually("the Job annotated memprof.dev/gpu-oom", || async {
        let j = job(&client, ns, "train").await.ok_or("Job gone")?;
        let v = j.annotations().get(ANNOTATION_GPU_OOM).cloned();
        (v.as_deref() == Some(want.as_str()))
            .then_some(())
            .ok_or(format!("{v:?}"))
    })
    .await;
    eventually("one GPUOutOfMemory Warning", || async {
        let n = count_events(&client, ns, REASON_GPU_OUT_OF_MEMORY, "train").await;
        (n == 1).then_some(()).ok_or(format!("{n} Events"))
    })
    .await;
    let event = gpu_oom_event(&client, ns).await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    let note = event.note.unwrap_or_default();
    for part in [pod.name_any(), "rank 0".into(), oom.time.clone()] {
        assert!(note.contains(&part), "{part:?} not in {note:?}");
    }
    assert_eq!(cell(&printed_row(&client, ns, "train").await, "OOMS"), 1);

    // The kubelet reports the pod again; then the operator restarts: the
    // records in the status say this OOM was seen, so nothing is repeated.
    terminate_container(&client, ns, &pod.name_any(), "trainer", 1, msg).await;
    operator.stop().await;
    let operator = start_operator(&client, ns);
    report_with_sites(&client, ns, "train").await;
    stays("one OOM, one Event", Duration::from_secs(5), || async {
        let st = profiles.get("train").await.unwrap().status.unwrap();
        let n = count_events(&client, ns, REASON_GPU_OUT_OF_MEMORY, "train").await;
        let j = job(&client, ns, "train").await.ok_or("Job gone")?;
        let v = j.annotations().get(ANNOTATION_GPU_OOM).cloned();
        let kept = v.as_deref() == Some(want.as_str());
        (st.ooms.len() == 1 && st.oom_count == Some(1) && n == 1 && kept)
            .then_some(())
            .ok_or(format!(
                "{n} Events, {v:?}, {:?} {:?}",
                st.oom_count, st.ooms
            ))
    })
    .await;
    operator.stop().await;
}

/// Sites taken at `level` by rank `rank`'s agent, one per size (GiB), in
/// the given order.
pub(crate) fn sites_at(level: RiskLevel, rank: u32, sizes_gib: &[u64]) -> AllocationSites {
    AllocationSites {
        time: at(0),
        level,
        source: "history".into(),
        sites: sizes_gib
            .iter()
            .enumerate()
            .map(|(i, g)| AllocationSite {
                file: format!("/app/rank{rank}.py"),
                line: i as u32,
                function: "forward".into(),
                bytes: g << 30,
                blocks: 1,
            })
            .collect(),
        unattributed_bytes: 0,
    }
}

#[tokio::test]
async fn every_ranks_sites_at_critical_reach_the_profile_and_the_report() {
    let Some(client) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&client).await;
    let ns = ns.name.as_str();
    let operator = start_operator(&client, ns);
    create_job(&client, ns, "train", 3, true).await;
    use RiskLevel::{Critical, High};
    // (rank, peak GiB, level of risk and of the snapshot, site sizes)
    let ranks: [(u32, u64, RiskLevel, &[u64]); 3] = [
        (0, 70, Critical, &[2]),
        (1, 79, Critical, &[1, 9, 3, 7, 5, 8]),
        (2, 75, High, &[4]),
    ];
    for (rank, peak, level, sizes) in ranks {
        let gpus = vec![gpu(rank, peak, peak, level, Some(30.0))];
        let mut r = rank_report(&client, ns, "train", rank, &at(0), gpus).await;
        r.spec.allocation_sites = Some(sites_at(level, rank, sizes));
        apply_report(&client, ns, &r).await;
    }
    let profiles = Api::<MemoryProfile>::namespaced(client.clone(), ns);
    let st = eventually("both critical ranks' sites in the profile", || async {
        let st = profiles.get("train").await.map_err(|e| e.to_string())?;
        let st = st.status.ok_or("no status yet")?;
        (st.critical_allocation_sites.len() == 2 && st.ranks_reporting == 3)
            .then_some(st.clone())
            .ok_or(format!("{:?}", st.critical_allocation_sites))
    })
    .await;
    // The largest peak first; rank 2's snapshot was taken at high: not listed.
    let listed: Vec<_> = st
        .critical_allocation_sites
        .iter()
        .map(|w| w.rank)
        .collect();
    assert_eq!(listed, [Some(1), Some(0)]);
    assert_eq!(st.critical_ranks_with_sites_omitted, 0);
    // Each rank's four largest sites, largest first.
    let lines: Vec<_> = st.critical_allocation_sites[0]
        .sites
        .sites
        .iter()
        .map(|x| x.line)
        .collect();
    assert_eq!(lines, [1, 5, 3, 4]);
    assert_eq!(st.allocation_sites.map(|w| w.rank), Some(Some(1)));

    let text = cli_support::ok(&["report", "train", "-n", ns]).await;
    let section = text
        .split_once("  allocation sites at critical, every rank")
        .unwrap_or_else(|| panic!("no critical section in:\n{text}"))
        .1;
    let (one, zero) = (section.find("rank 1, pod"), section.find("rank 0, pod"));
    assert!(one.is_some() && one < zero, "{text}");
    assert!(
        section.contains("9.0GiB      1 blocks  /app/rank1.py:1 (forward)"),
        "{text}"
    );
    assert!(!section.contains("rank 2, pod"), "{text}");
    operator.stop().await;
}

async fn gpu_oom_event(client: &Client, ns: &str) -> k8s_openapi::api::events::v1::Event {
    Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), ns)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|e| e.reason.as_deref() == Some(REASON_GPU_OUT_OF_MEMORY))
        .expect("the GPUOutOfMemory Event")
}
