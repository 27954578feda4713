//! The JobSet and PyTorchJob twins of
//! `remediation_trust::an_ownerless_profile_passes_only_to_the_job_memprof_created`
//! (docs/security.md, "Twins per kind"): a profile left with no owner
//! passes only to the workload memprof's own record names as the one it
//! created (`replacementUid`; `memprof_policy::triggers::succession`,
//! `workload::claim`). Against the local control plane, through the
//! operator; the upper controllers are played as `workload_support` does.
//!
//! For each kind: memprof recreates workload `train` (a critical rank, the
//! shrink policy): its record is `Done` naming the new workload's uid,
//! and the new workload (its child Jobs or pods made as its controller
//! makes them) keeps the profile and its history. Then its team deletes
//! it with `--cascade=orphan` (the profile left with no owner) and makes
//! one of its name carrying the very `memprof.dev/remediation` id and
//! nonce memprof stamped on the one it made: the profile never passes to
//! it; it goes, and the newcomer gets a fresh one without history. The
//! same after a workload memprof never touched.
//!
//!     eval "$(bash hack/local-cluster.sh env)"
//!     MEMPROF_REQUIRE_CLUSTER=1 cargo test --test integration workload_ownerless::
//!
//! Without `KUBECONFIG` every test is skipped with a message.

use crate::common;
use crate::remediation_support;
use crate::workload_support;
use crate::workload_twins_more::critical_workload;

use common::*;
use kube::api::{Api, DeleteParams, DynamicObject, PropagationPolicy};
use kube::{Client, ResourceExt};
use memprof::api::workload::WorkloadKind;
use memprof::api::{MemoryProfile, ANNOTATION_REMEDIATION};
use remediation_support::{fresh_profile, init_logs, shrinking_workload_cluster, stamped};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use workload_support::*;

/// Workload `name` of `kind` as its team writes it (`team: ml`, profiled),
/// with `annotations` besides.
fn manifest(kind: WorkloadKind, name: &str, annotations: &BTreeMap<String, String>) -> Value {
    let labels = json!({"team": "ml", "memprof.dev/managed": "true"});
    let mut manifest = match kind {
        WorkloadKind::JobSet => jobset(name, 2, labels),
        _ => pytorchjob(name, 2, labels),
    };
    manifest["metadata"]["annotations"] = json!(annotations);
    if kind == WorkloadKind::PyTorchJob {
        manifest["metadata"]["annotations"]["memprof.dev/enabled"] = json!("true");
    }
    manifest
}

/// Profile `name` once it names `owner` alone and holds `history` records.
async fn owned_by(
    admin: &Client,
    ns: &str,
    name: &str,
    owner: &str,
    history: usize,
) -> MemoryProfile {
    let profiles = Api::<MemoryProfile>::namespaced(admin.clone(), ns);
    let what = format!("profile {name} owned by {owner} alone, {history} records");
    eventually(&what, || async {
        let p = profiles.get(name).await.map_err(|e| e.to_string())?;
        let owners: Vec<_> = p.owner_references().iter().map(|o| o.uid.clone()).collect();
        let kept = p.status.as_ref().map_or(0, |s| s.remediations.len());
        (owners == [owner] && kept == history)
            .then_some(p)
            .ok_or(format!("owners {owners:?}, {kept} records"))
    })
    .await
}

/// Workload `train` of `kind`, recreated by memprof; returns the one it
/// made and the uid of the profile. Checks the genuine path: the record
/// `Done` names the new workload's uid as memprof's replacement, and the
/// new workload, once its controller made its parts, owns the profile,
/// its history kept.
async fn recreated_by_memprof(
    admin: &Client,
    ns: &str,
    kind: WorkloadKind,
) -> (DynamicObject, String) {
    let old = critical_workload(admin, ns, kind).await;
    // Read while memprof recreates: its genuine path never replaces the
    // profile (a fresh one would show below, without history).
    let profiles = Api::<MemoryProfile>::namespaced(admin.clone(), ns);
    let profile_uid = profiles.get("train").await.unwrap().uid().unwrap();
    let record = record_in(admin, ns, "Done").await;
    assert_eq!(record.env_change.as_deref(), Some("recreate"), "{record:?}");
    assert!(record.job_deleted, "{record:?}");
    assert_eq!(record.job_uid.as_deref(), Some(old.as_str()));
    let made = api(admin, ns, kind).get("train").await.unwrap();
    let made_uid = made.uid().unwrap();
    assert_ne!(made_uid, old, "a new {}", kind.kind());
    assert_eq!(
        record.replacement_uid.as_deref(),
        Some(made_uid.as_str()),
        "memprof's record names the {} it created",
        kind.kind()
    );
    assert_eq!(made.annotations()[ANNOTATION_REMEDIATION], record.id);
    // Its controller's part, once memprof deleted the old workload's.
    controller_part_gone(admin, ns, kind, "train").await;
    controller_part(admin, ns, kind, &made).await;
    let kept = owned_by(admin, ns, "train", &made_uid, 1).await;
    assert_eq!(kept.uid(), Some(profile_uid.clone()), "the profile kept");
    (made, profile_uid)
}

/// The team deletes `earlier` (of `kind`) with `--cascade=orphan`: the
/// garbage collector leaves its profile (uid `profile_uid`) with no owner.
/// The team clears the parts its controller made, now ownerless too; then
/// a workload of that name that memprof did not create, annotated
/// `annotations`, appears with its parts: the ownerless profile must not
/// pass to it (never adopted); it goes, and the newcomer gets a fresh
/// profile without history.
async fn orphaned_then_taken(
    admin: &Client,
    ns: &str,
    kind: WorkloadKind,
    earlier: &DynamicObject,
    profile_uid: &str,
    annotations: BTreeMap<String, String>,
) {
    let name = earlier.name_any();
    let workloads = api(admin, ns, kind);
    let orphan = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Orphan),
        ..Default::default()
    };
    workloads
        .delete(&name, &orphan)
        .await
        .unwrap_or_else(|e| panic!("deleting {} {name} with --cascade=orphan: {e}", kind.kind()));
    let profiles = Api::<MemoryProfile>::namespaced(admin.clone(), ns);
    let what = format!("{} {name} gone, its profile ownerless", kind.kind());
    eventually_within(GC_TIMEOUT, &what, || async {
        let gone = workloads.get_opt(&name).await.map_err(|e| e.to_string())?;
        let p = profiles.get(&name).await.map_err(|e| e.to_string())?;
        let same = p.uid().as_deref() == Some(profile_uid);
        (gone.is_none() && same && p.owner_references().is_empty())
            .then_some(())
            .ok_or(format!(
                "gone: {}, owners {:?}",
                gone.is_none(),
                p.owner_references()
            ))
    })
    .await;
    clear_controller_part(admin, ns, kind, &name).await;

    let newcomer = create(admin, ns, kind, manifest(kind, &name, &annotations)).await;
    controller_part(admin, ns, kind, &newcomer).await;
    let uid = newcomer.uid().unwrap();
    let who = format!("a {} memprof did not create ({annotations:?})", kind.kind());
    fresh_profile(admin, ns, &name, profile_uid, &uid, &who).await;
}

/// The twin for `kind` of
/// `remediation_trust::an_ownerless_profile_passes_only_to_the_job_memprof_created`.
async fn an_ownerless_profile_passes_only_to_the_one_memprof_created(kind: WorkloadKind) {
    let Some((admin, ns)) = shrinking_workload_cluster().await else {
        return;
    };
    init_logs();
    let ns = ns.name.as_str();
    let operator = start_operator(&admin, ns);
    let (made, profile_uid) = recreated_by_memprof(&admin, ns, kind).await;
    let copied = stamped(&made);
    orphaned_then_taken(&admin, ns, kind, &made, &profile_uid, copied).await;

    // A workload memprof never touched: no record names any heir.
    let plain = create(&admin, ns, kind, manifest(kind, "plain", &BTreeMap::new())).await;
    controller_part(&admin, ns, kind, &plain).await;
    let profile = owned_by(&admin, ns, "plain", &plain.uid().unwrap(), 0).await;
    let profile_uid = profile.uid().unwrap();
    orphaned_then_taken(&admin, ns, kind, &plain, &profile_uid, BTreeMap::new()).await;
    operator.stop().await;
}

#[tokio::test]
async fn an_ownerless_profile_passes_only_to_the_jobset_memprof_created() {
    an_ownerless_profile_passes_only_to_the_one_memprof_created(WorkloadKind::JobSet).await;
}

#[tokio::test]
async fn an_ownerless_profile_passes_only_to_the_pytorchjob_memprof_created() {
    an_ownerless_profile_passes_only_to_the_one_memprof_created(WorkloadKind::PyTorchJob).await;
}
