//! The JobSet and PyTorchJob twins of the Job tests of the recreate
//! path's safety (docs/security.md and docs/remediation.md, "Twins per
//! kind"). Each workload is one Kueue does not manage (no
//! `kueue.x-k8s.io/queue-name`), so memprof recreates it at the top level
//! through its recorded, crash-safe plan, as it recreates a Job:
//!
//! - a plan ConfigMap a tenant plants in its own namespace, under the id
//!   memprof will use, is never read: the workload is recreated from the
//!   plan memprof keeps in its own namespace (twin of
//!   `security::tenant_planted_plan_config_map_is_never_executed`);
//! - a plan in memprof's namespace that is not the one the record names
//!   is refused, nothing done (twin of
//!   `security::plan_changed_after_recording_is_refused_not_executed`);
//! - a ConfigMap its owner did not opt in is never written (twin of
//!   `security::config_map_not_opted_in_is_never_written`);
//! - a workload the API server would not let memprof create again is
//!   never deleted (twin of
//!   `security::job_that_cannot_be_created_again_is_never_deleted`), nor
//!   one whose annotations leave no room for memprof's (twin of
//!   `security::job_whose_annotations_leave_no_room_is_never_deleted_and_leaves_no_plan`).
//!
//! The upper controllers are played as `workload_support` does.
//!
//! Run them:
//!
//!     eval "$(bash hack/local-cluster.sh env)"
//!     MEMPROF_REQUIRE_CLUSTER=1 cargo test --test integration workload_twins_recreate::
//!
//! Without `KUBECONFIG` every test is skipped with a message.

use crate::common;
use crate::remediation_support;
use crate::security::{
    evil_plan, first_id, job_exists, operator_with_plans_in, plan_config_map, plant_plan,
    someone_elses_config_map_under_a_policy,
};
use crate::tenant_support;
use crate::workload_remediation_pytorch::{batches as pytorch_batches, profiled_pytorchjob};
use crate::workload_remediation_twins::{profiled_jobset, BATCH};
use crate::workload_support;

use common::*;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, DynamicObject, PostParams};
use kube::{Client, ResourceExt};
use memprof::api::workload::WorkloadKind;
use memprof::api::RiskLevel;
use remediation_support::{apply_policy, shrink_policy};
use serde_json::{json, Value};
use tenant_support::{as_user, grant, tenant};
use workload_support::*;

/// A profiled workload `train` of one kind and, for a PyTorchJob, its pods.
struct Profiled {
    kind: WorkloadKind,
    object: DynamicObject,
    pods: Vec<Pod>,
}

/// Workload `train` of `kind` in `ns`, no Kueue queue: profiled, every
/// rank reporting low.
async fn profiled(admin: &Client, ns: &str, kind: WorkloadKind) -> Profiled {
    let (object, pods) = match kind {
        WorkloadKind::JobSet => (profiled_jobset(admin, ns, json!({})).await, vec![]),
        _ => profiled_pytorchjob(admin, ns, json!({})).await,
    };
    Profiled { kind, object, pods }
}

impl Profiled {
    /// One of its ranks critical (a child Job's, or a worker's).
    async fn critical(&self, admin: &Client, ns: &str) {
        match self.kind {
            WorkloadKind::JobSet => {
                child_report(admin, ns, "train-workers-1", 100, RiskLevel::Critical).await
            }
            _ => {
                let gpus = vec![gpu(0, 79, 79, RiskLevel::Critical, Some(5.0))];
                let report = pod_report(&self.pods[2], "train", 0, &at(100), gpus);
                apply_report(admin, ns, &report).await;
            }
        }
    }

    /// The remediation id memprof will use for the first `risk>=critical`
    /// decision of `policy` on it: deterministic, so a tenant can compute
    /// it too. The Job memprof decides on is the workload's stand-in,
    /// carrying the workload's uid.
    async fn first_id(&self, admin: &Client, ns: &str, policy: &str) -> String {
        let mut stand_in = Job::default();
        stand_in.metadata.uid = self.object.uid();
        first_id(admin, ns, policy, &stand_in).await
    }

    /// `train` of its kind as stored now.
    async fn now(&self, admin: &Client, ns: &str) -> DynamicObject {
        api(admin, ns, self.kind).get("train").await.unwrap()
    }
}

/// The `BATCH_SIZE` of every pod template of `object` of `kind`.
fn batches(kind: WorkloadKind, object: &DynamicObject) -> Vec<Option<Value>> {
    match kind {
        WorkloadKind::JobSet => vec![object.data.pointer(BATCH).cloned()],
        _ => pytorch_batches(object),
    }
}

/// Whether every pod template of `object` of `kind` runs `BATCH_SIZE=batch`.
fn runs_batch(kind: WorkloadKind, object: &DynamicObject, batch: &str) -> bool {
    let all = batches(kind, object);
    !all.is_empty() && all.iter().all(|b| b.as_ref() == Some(&json!(batch)))
}

/// The twin of `security::tenant_planted_plan_config_map_is_never_executed`
/// for `kind`: the tenant pre-creates, in its own namespace, the plan
/// ConfigMap memprof would use for its workload, aimed at another
/// namespace; memprof keeps its plans in its own namespace, out of the
/// tenant's reach, and recreates the workload from its own plan.
async fn a_planted_plan_is_never_executed(kind: WorkloadKind) {
    let Some((admin, tenant_ns)) = workload_cluster().await else {
        return;
    };
    let operator_ns = TestNamespace::create(&admin).await;
    let victim_ns = TestNamespace::create(&admin).await;
    let (ns, plans) = (tenant_ns.name.as_str(), operator_ns.name.as_str());
    let tenant = tenant(&admin, ns).await;
    let operator = operator_with_plans_in(&admin, ns, plans);
    apply_policy(&admin, ns, "shrink", shrink_policy(false))
        .await
        .unwrap();
    let w = profiled(&admin, ns, kind).await;

    // The attack: the plan ConfigMap under the id memprof will use.
    let id = w.first_id(&admin, ns, "shrink").await;
    plant_plan(&tenant, (ns, plans), &id, &victim_ns.name).await;

    w.critical(&admin, ns).await;
    let old = w.object.uid();
    eventually("the workload recreated with BATCH_SIZE 24", || async {
        let top = api(&admin, ns, kind).get("train").await;
        let top = top.map_err(|e| e.to_string())?;
        (top.uid() != old && runs_batch(kind, &top, "24"))
            .then_some(())
            .ok_or(format!("{:?} {:?}", top.uid(), batches(kind, &top)))
    })
    .await;
    assert!(
        !job_exists(&admin, &victim_ns.name, "pwned").await,
        "nothing was created in another namespace"
    );
    let rec = record_in(&admin, ns, "Done").await;
    assert_eq!(rec.id, id, "the id the tenant planted under");
    operator.stop().await;
}

#[tokio::test]
async fn a_tenant_planted_plan_config_map_is_never_executed_for_a_jobset() {
    a_planted_plan_is_never_executed(WorkloadKind::JobSet).await;
}

#[tokio::test]
async fn a_tenant_planted_plan_config_map_is_never_executed_for_a_pytorchjob() {
    a_planted_plan_is_never_executed(WorkloadKind::PyTorchJob).await;
}

/// The twin of `security::plan_changed_after_recording_is_refused_not_executed`
/// for `kind`: whoever could write memprof's own namespace plants a plan
/// under the workload's remediation id; memprof carries out only the plan
/// its record names (digest, namespace, name, uid), so it refuses this one.
async fn a_changed_plan_is_refused(kind: WorkloadKind) {
    let Some((admin, tenant_ns)) = workload_cluster().await else {
        return;
    };
    let operator_ns = TestNamespace::create(&admin).await;
    let victim_ns = TestNamespace::create(&admin).await;
    let (ns, plans) = (tenant_ns.name.as_str(), operator_ns.name.as_str());
    let operator = operator_with_plans_in(&admin, ns, plans);
    let metrics = operator.remediation_metrics.clone();
    apply_policy(&admin, ns, "shrink", shrink_policy(false))
        .await
        .unwrap();
    let w = profiled(&admin, ns, kind).await;
    let id = w.first_id(&admin, ns, "shrink").await;
    Api::<ConfigMap>::namespaced(admin.clone(), plans)
        .create(
            &PostParams::default(),
            &plan_config_map(&id, &evil_plan(&id, &victim_ns.name)),
        )
        .await
        .unwrap();
    w.critical(&admin, ns).await;

    let rec = record_in(&admin, ns, "Failed").await;
    let message = rec.message.unwrap_or_default();
    assert!(message.contains("refused the saved plan"), "{message}");
    assert!(message.contains("digest"), "{message}");
    assert_eq!(metrics.plans_refused.get(), 1);
    assert!(!job_exists(&admin, &victim_ns.name, "pwned").await);
    let still = w.now(&admin, ns).await;
    assert_eq!(still.uid(), w.object.uid(), "the workload was not touched");
    assert!(
        runs_batch(kind, &still, "32"),
        "{:?}",
        batches(kind, &still)
    );
    failed_event_about(&admin, ns, kind).await;
    operator.stop().await;
}

/// Waits for the `RemediationFailed` Event about `train`, which follows
/// the record's write: one, regarding the workload of `kind`.
async fn failed_event_about(admin: &Client, ns: &str, kind: WorkloadKind) {
    eventually("one RemediationFailed Event about the workload", || async {
        let kinds = event_kinds(admin, ns, "RemediationFailed", "train").await;
        (kinds == [kind.kind()])
            .then_some(())
            .ok_or(format!("{kinds:?}"))
    })
    .await;
}

#[tokio::test]
async fn a_plan_changed_after_recording_is_refused_not_executed_for_a_jobset() {
    a_changed_plan_is_refused(WorkloadKind::JobSet).await;
}

#[tokio::test]
async fn a_plan_changed_after_recording_is_refused_not_executed_for_a_pytorchjob() {
    a_changed_plan_is_refused(WorkloadKind::PyTorchJob).await;
}

/// The twin of `security::config_map_not_opted_in_is_never_written` for
/// `kind`: a policy on the workload's namespace writes a key of a
/// ConfigMap its owner never labelled `memprof.dev/remediable=true`; the
/// remediation is skipped, saying why, and neither the ConfigMap nor the
/// workload changes.
async fn an_unopted_config_map_is_never_written(kind: WorkloadKind) {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let ns = ns.name.as_str();
    let operator = start_operator(&admin, ns);
    let cms = someone_elses_config_map_under_a_policy(&admin, ns).await;
    let w = profiled(&admin, ns, kind).await;
    w.critical(&admin, ns).await;
    let rec = record_in(&admin, ns, "Skipped").await;
    let message = rec.message.unwrap_or_default();
    assert!(message.contains("ConfigMapNotOptedIn"), "{message}");
    let data = cms.get("someone-elses").await.unwrap().data.unwrap();
    assert_eq!(data["batch"], "64");
    assert_eq!(w.now(&admin, ns).await.uid(), w.object.uid());
    operator.stop().await;
}

#[tokio::test]
async fn a_config_map_not_opted_in_is_never_written_for_a_jobset() {
    an_unopted_config_map_is_never_written(WorkloadKind::JobSet).await;
}

#[tokio::test]
async fn a_config_map_not_opted_in_is_never_written_for_a_pytorchjob() {
    an_unopted_config_map_is_never_written(WorkloadKind::PyTorchJob).await;
}

/// The operator's rights in the workload's namespace with the workloads'
/// `create` left out: what the Job test grants, the workload kinds
/// (JobSet, TrainJob, PyTorchJob) in place of Job creation.
fn rights_without_create() -> Value {
    let read = ["get", "list", "watch"];
    let change = ["get", "list", "watch", "delete", "patch", "update"];
    json!([
        {"apiGroups": ["memprof.dev"], "resources": ["memoryreports", "remediationpolicies"], "verbs": read},
        {"apiGroups": ["memprof.dev"], "resources": ["memoryprofiles"], "verbs": ["get", "list", "watch", "create", "patch"]},
        {"apiGroups": ["memprof.dev"], "resources": ["memoryprofiles/status", "remediationpolicies/status"], "verbs": ["get", "patch", "update"]},
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "watch", "delete", "patch"]},
        {"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"], "verbs": change},
        {"apiGroups": ["trainer.kubeflow.org"], "resources": ["trainjobs"], "verbs": change},
        {"apiGroups": ["kubeflow.org"], "resources": ["pytorchjobs"], "verbs": change},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "delete", "deletecollection"]},
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update", "patch"]},
    ])
}

/// The operator for `ns`, its plans in `plans`, running as an identity
/// that may delete `kind` but not create it: the API server would refuse
/// the new workload (403), which retrying cannot fix.
async fn operator_that_cannot_create(
    admin: &Client,
    ns: &str,
    plans: &str,
    kind: WorkloadKind,
) -> RunningOperator {
    let user = format!("remediation-{ns}");
    grant(admin, ns, "remediation", &user, rights_without_create()).await;
    let plan_rights = json!([
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "create", "delete"]},
    ]);
    grant(admin, plans, "remediation-plans", &user, plan_rights).await;
    let limited = as_user(&user, &["system:authenticated"]).await;
    let probe = api(&limited, ns, kind);
    eventually("the remediation's Role in effect", || async {
        let listed = probe.list(&Default::default()).await;
        listed.map(|_| ()).map_err(|e| e.to_string())
    })
    .await;
    operator_with_plans_in(&limited, ns, plans)
}

/// What the Job tests of a refused recreation check, for `kind`: the
/// record `Failed`, saying the API server would refuse the new workload;
/// nothing deleted, the workload as it was; no plan kept in `plans`.
async fn refused_and_untouched(w: &Profiled, admin: &Client, ns: &str, plans: &str) {
    let rec = record_in(admin, ns, "Failed").await;
    let message = rec.message.clone().unwrap_or_default();
    let refused = format!("would refuse {} train", w.kind.kind());
    assert!(message.contains(&refused), "{message}");
    assert!(message.contains("left running, untouched"), "{message}");
    assert!(!rec.job_deleted, "{rec:?}");
    let still = w.now(admin, ns).await;
    assert_eq!(still.uid(), w.object.uid(), "never deleted");
    assert!(
        runs_batch(w.kind, &still, "32"),
        "{:?}",
        batches(w.kind, &still)
    );
    // The plan is removed once the record says Failed (the record first).
    let cms = Api::<ConfigMap>::namespaced(admin.clone(), plans);
    eventually("no plan kept", || async {
        let kept = cms.list(&Default::default()).await;
        let kept = kept.map_err(|e| e.to_string())?.items;
        let names: Vec<String> = kept.iter().map(|c| c.name_any()).collect();
        names.is_empty().then_some(()).ok_or(format!("{names:?}"))
    })
    .await;
}

/// The twin of `security::job_that_cannot_be_created_again_is_never_deleted`
/// for `kind`: the dry run of the new workload's creation says the API
/// server would refuse it before anything is deleted.
async fn an_uncreatable_workload_is_never_deleted(kind: WorkloadKind) {
    let Some((admin, tenant_ns)) = workload_cluster().await else {
        return;
    };
    let operator_ns = TestNamespace::create(&admin).await;
    let (ns, plans) = (tenant_ns.name.as_str(), operator_ns.name.as_str());
    let operator = operator_that_cannot_create(&admin, ns, plans, kind).await;
    apply_policy(&admin, ns, "shrink", shrink_policy(false))
        .await
        .unwrap();
    let w = profiled(&admin, ns, kind).await;
    w.critical(&admin, ns).await;
    refused_and_untouched(&w, &admin, ns, plans).await;
    failed_event_about(&admin, ns, kind).await;
    operator.stop().await;
}

#[tokio::test]
async fn a_jobset_that_cannot_be_created_again_is_never_deleted() {
    an_uncreatable_workload_is_never_deleted(WorkloadKind::JobSet).await;
}

#[tokio::test]
async fn a_pytorchjob_that_cannot_be_created_again_is_never_deleted() {
    an_uncreatable_workload_is_never_deleted(WorkloadKind::PyTorchJob).await;
}

/// The API server's limit on an object's annotations, keys and values
/// together (256 KiB), a custom resource's as a Job's.
const ANNOTATIONS_LIMIT: usize = 262_144;

/// Fills `train`'s annotations (of `w`'s kind) with a note of the team's
/// up to `room` bytes under the API server's limit, whatever memprof has
/// written there already (its risk annotations).
async fn leave_room(w: &Profiled, admin: &Client, ns: &str, room: usize) {
    const NOTE: &str = "team.example/notes";
    let objects = api(admin, ns, w.kind);
    // A replace carries the resourceVersion read: a write of memprof's in
    // between makes it fail (409), and it is computed again.
    eventually("the workload's annotations filled", || async {
        let mut top = objects.get("train").await.map_err(|e| e.to_string())?;
        let used: usize = top
            .annotations()
            .iter()
            .filter(|(k, _)| *k != NOTE)
            .map(|(k, v)| k.len() + v.len())
            .sum();
        let filler = "x".repeat(ANNOTATIONS_LIMIT - used - NOTE.len() - room);
        top.annotations_mut().insert(NOTE.into(), filler);
        let pp = PostParams::default();
        objects
            .replace("train", &pp, &top)
            .await
            .map_err(|e| e.to_string())
    })
    .await;
}

/// The twin of `security::job_whose_annotations_leave_no_room_is_never_deleted_and_leaves_no_plan`
/// for `kind`: the workload's annotations sit 8 bytes under the limit, so
/// its recreation with memprof's annotations added would be refused (422).
async fn a_workload_without_room_is_never_deleted(kind: WorkloadKind) {
    let Some((admin, tenant_ns)) = workload_cluster().await else {
        return;
    };
    let operator_ns = TestNamespace::create(&admin).await;
    let (ns, plans) = (tenant_ns.name.as_str(), operator_ns.name.as_str());
    let operator = operator_with_plans_in(&admin, ns, plans);
    apply_policy(&admin, ns, "shrink", shrink_policy(false))
        .await
        .unwrap();
    let w = profiled(&admin, ns, kind).await;
    leave_room(&w, &admin, ns, 8).await;
    w.critical(&admin, ns).await;
    refused_and_untouched(&w, &admin, ns, plans).await;
    operator.stop().await;
}

#[tokio::test]
async fn a_jobset_whose_annotations_leave_no_room_is_never_deleted_and_leaves_no_plan() {
    a_workload_without_room_is_never_deleted(WorkloadKind::JobSet).await;
}

#[tokio::test]
async fn a_pytorchjob_whose_annotations_leave_no_room_is_never_deleted_and_leaves_no_plan() {
    a_workload_without_room_is_never_deleted(WorkloadKind::PyTorchJob).await;
}
