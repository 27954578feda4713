//! The parts of memprof's objects that have one writer (a report's spec, a
//! profile's and a policy's status) are one field to the API server
//! (`x-kubernetes-map-type: atomic`, `memprof_api::crds`), on a real API
//! server: the owner's next write replaces the whole part, and server-side
//! apply tracks it as one field (what makes a write cheaper,
//! docs/benchmarks.md "Single-writer parts").

use crate::common;

use common::{apply_report, at, cluster, gpu, report, TestNamespace};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Resource;
use memprof::api::{
    MemoryProfile, MemoryProfileSpec, MemoryProfileStatus, MemoryReport, RankSummary,
    RemediationPolicy, RemediationPolicyStatus, RiskLevel, OPERATOR_MANAGER, REMEDIATION_MANAGER,
    SIDECAR_MANAGER,
};

#[tokio::test]
async fn a_value_someone_else_wrote_into_a_report_does_not_outlive_its_sidecars_next_write() {
    let Some(client) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&client).await;
    let reports: Api<MemoryReport> = Api::namespaced(client.clone(), &ns.name);
    let mut r = report("job", 0, &at(0), vec![gpu(0, 10, 12, RiskLevel::Low, None)]);
    r.spec.node_name = None;
    apply_report(&client, &ns.name, &r).await;

    // Someone with write access to the report (not its sidecar) adds a field
    // the sidecar does not write.
    let forged = serde_json::json!({ "spec": { "nodeName": "forged-node" } });
    reports
        .patch("job-0", &PatchParams::default(), &Patch::Merge(&forged))
        .await
        .unwrap();
    let stored = reports.get("job-0").await.unwrap();
    assert_eq!(stored.spec.node_name.as_deref(), Some("forged-node"));

    // The sidecar's next write is the whole report, and only it.
    r.spec.sampled_at = at(5);
    apply_report(&client, &ns.name, &r).await;
    let stored = reports.get("job-0").await.unwrap();
    assert_eq!(stored.spec.sampled_at, at(5));
    assert_eq!(
        stored.spec.node_name, None,
        "a field the sidecar did not write survived its write: is `spec` atomic in the CRD?"
    );
    assert_eq!(part_of(&stored, SIDECAR_MANAGER, "spec"), Some(whole()));
}

#[tokio::test]
async fn a_profile_status_is_one_field_to_server_side_apply() {
    let Some(client) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&client).await;
    let profiles: Api<MemoryProfile> = Api::namespaced(client.clone(), &ns.name);
    let spec = MemoryProfileSpec {
        job_name: "job".into(),
        expected_ranks: Some(2),
    };
    profiles
        .create(&PostParams::default(), &MemoryProfile::new("job", spec))
        .await
        .unwrap();
    let status = MemoryProfileStatus {
        ranks: "2/2".into(),
        peak: "12 GiB".into(),
        top_ranks: (0..2).map(rank).collect(),
        ..Default::default()
    };
    let body = serde_json::json!({
        "apiVersion": MemoryProfile::api_version(&()),
        "kind": MemoryProfile::kind(&()),
        "metadata": { "name": "job" },
        "status": status,
    });
    let written = profiles
        .patch_status(
            "job",
            &PatchParams::apply(OPERATOR_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .unwrap();
    assert_eq!(written.status.as_ref().map(|s| s.top_ranks.len()), Some(2));
    // One field, however many ranks and values the status holds: what the
    // API server tracks, stores and compares on every write.
    assert_eq!(part_of(&written, OPERATOR_MANAGER, "status"), Some(whole()));
}

#[tokio::test]
async fn a_policy_status_is_one_field_to_server_side_apply() {
    let Some(client) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&client).await;
    let policies: Api<RemediationPolicy> = Api::namespaced(client.clone(), &ns.name);
    let policy = serde_json::json!({
        "apiVersion": RemediationPolicy::api_version(&()),
        "kind": RemediationPolicy::kind(&()),
        "metadata": { "name": "on-oom" },
        "spec": {
            "triggers": [{ "oomObserved": true }],
            "actions": [{ "event": { "reason": "TrainerOom" } }],
        },
    });
    policies
        .patch(
            "on-oom",
            &PatchParams::apply("memprof-tests"),
            &Patch::Apply(&policy),
        )
        .await
        .unwrap();
    // As `remediation/status.rs` writes it: the whole desired status.
    let status = RemediationPolicyStatus {
        matched_count: 2,
        matched_jobs: vec!["train-a".into(), "train-b".into()],
        action_count: 1,
        ..Default::default()
    };
    let body = serde_json::json!({
        "apiVersion": RemediationPolicy::api_version(&()),
        "kind": RemediationPolicy::kind(&()),
        "metadata": { "name": "on-oom" },
        "status": status,
    });
    let written = policies
        .patch_status(
            "on-oom",
            &PatchParams::apply(REMEDIATION_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .unwrap();
    assert_eq!(written.status.as_ref().map(|s| s.matched_count), Some(2));
    assert_eq!(
        part_of(&written, REMEDIATION_MANAGER, "status"),
        Some(whole())
    );
}

/// What `manager` owns of the top-level `part` of `obj`, as the API server
/// recorded it.
fn part_of<K: Resource>(obj: &K, manager: &str, part: &str) -> Option<serde_json::Value> {
    obj.meta()
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| m.manager.as_deref() == Some(manager))
        .filter_map(|m| m.fields_v1.as_ref()?.0.get(format!("f:{part}")).cloned())
        .next()
}

/// What server-side apply records for an atomic part: the part, none of its
/// values.
fn whole() -> serde_json::Value {
    serde_json::json!({})
}

fn rank(rank: u32) -> RankSummary {
    let mut r = RankSummary {
        peak_bytes: 12 << 30,
        total_bytes: 80 << 30,
        ..Default::default()
    };
    r.location.rank = Some(rank);
    r.location.pod = format!("job-{rank}");
    r.location.gpu_uuid = format!("GPU-{rank}");
    r
}
