//! The JobSet and PyTorchJob twins of the Job tests of who may speak for
//! a workload (docs/security.md, "Twins per kind"), against the real local
//! control plane. The upper controllers are played as `workload_support`
//! does (child Jobs created with controller references and marks; the
//! PyTorchJob's pods created as the training operator's identity); the
//! real Job controller creates a child Job's pods.
//!
//! - a JobSet's child-Job pod created while the webhook fails open, a
//!   genuine pod's admission mark copied onto a planted pod, and the
//!   genuine pod deleted and created again with its mark never steer the
//!   JobSet (twins of `pod_trust`'s; the PyTorchJob's are
//!   `pytorchjobs::pytorchjob_pods_planted_or_replayed_never_count`);
//! - a tenant's workloads that never report, under a policy at `none`,
//!   are never acted on, and another namespace's remediation goes through
//!   (twin of `remediation_namespaces::a_tenant_with_jobs_that_run_nothing_…`);
//! - a pod under the victim's service account cannot write the victim
//!   pod's report for it (twin of `security::a_pod_under_the_victims_…`);
//! - forged reports claiming the workload are named and never acted on
//!   (twin of `security::forged_report_for_another_job_is_named_and_never_acted_on`);
//! - every rank's allocation sites taken at critical reach the profile and
//!   `memprof report`, under the workload's own ranks (twin of
//!   `gpu_oom_visibility::every_ranks_sites_at_critical_…`).
//!
//! - a refused report gets its one `ReportRejected` Event, about the
//!   workload's profile, and a flood of refused reports naming a rank,
//!   written with its genuine critical report, never hides the workload's
//!   `RiskCritical` Event nor brings that refusal's Event again (twin of
//!   `security::refused_reports_naming_a_victim_never_hide_its_risk_event`).
//!
//! Run them:
//!
//!     eval "$(bash hack/local-cluster.sh env)"
//!     MEMPROF_REQUIRE_CLUSTER=1 cargo test --test integration workload_twins_trust::
//!
//! Without `KUBECONFIG` every test is skipped with a message.

use crate::cli_support;
use crate::common;
use crate::gpu_oom_visibility::sites_at;
use crate::pod_trust::{self, Setup, Webhook};
use crate::remediation_namespaces::share_admission_key;
use crate::remediation_support;
use crate::tenant_support;
use crate::webhook_support;
use crate::workload_remediation_pytorch::profiled_pytorchjob;
use crate::workload_remediation_twins::{profiled_jobset, BATCH};
use crate::workload_support;
use crate::workload_twins_more::critical_workload;

use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use memprof::api::workload::WorkloadKind;
use memprof::api::{MemoryProfile, MemoryProfileStatus, MemoryReport, RiskLevel};
use memprof::pipeline::Setup as OperatorSetup;
use remediation_support::{apply_policy, records, shrink_policy, stays};
use serde_json::json;
use std::time::Duration;
use tenant_support::{pod_identity, tenant};
use workload_support::*;

/// The status of profile `train` in `ns` as it is now.
async fn status(admin: &Client, ns: &str) -> Result<MemoryProfileStatus, String> {
    let p = Api::<MemoryProfile>::namespaced(admin.clone(), ns)
        .get("train")
        .await
        .map_err(|e| e.to_string())?;
    Ok(p.status.unwrap_or_default())
}

/// Workload `train` of `kind` stays the object of uid `uid`, no OOM or
/// remediation recorded in its profile, for `window`.
async fn untouched(admin: &Client, ns: &str, kind: WorkloadKind, uid: &str, window: Duration) {
    stays(
        "the workload untouched, no OOM or remediation recorded",
        window,
        || async {
            let top = api(admin, ns, kind).get("train").await;
            let top = top.map_err(|e| e.to_string())?;
            let st = status(admin, ns).await?;
            (top.uid().as_deref() == Some(uid) && st.ooms.is_empty() && st.remediations.is_empty())
                .then_some(())
                .ok_or(format!(
                    "{:?} {:?} {:?}",
                    top.uid(),
                    st.ooms,
                    st.remediations
                ))
        },
    )
    .await;
}

// ---------------------------------------------------------------------------
// The pod-trust twins for a JobSet's child-Job pods (tests/pod_trust.rs).

/// `pod_trust`'s set-up (its webhook marking the Job controller's pods,
/// the operator, the shrink policy), the stand-in CRDs installed first.
async fn pod_trust_setup(webhook: Webhook) -> Option<Setup> {
    install_workload_crds(&cluster().await?).await;
    Setup::start(webhook).await
}

/// JobSet `train` (`team: ml`, BATCH_SIZE 32) of two marked child Jobs,
/// whose pods the real Job controller created (marked or not as the
/// webhook stands: nothing here marks them), each pod's healthy report
/// written with its own token. Returns the JobSet and the pods by index.
async fn victim_jobset(s: &Setup) -> (DynamicObject, Vec<Pod>) {
    let (admin, ns) = (&s.admin, s.ns.name.as_str());
    let manifest = jobset("train", 2, json!({"team": "ml"}));
    let js = create(admin, ns, WorkloadKind::JobSet, manifest).await;
    let mut pods = Vec::new();
    for i in 0..2 {
        let child = marked_child(admin, ns, &js, i).await;
        let pod = pod_trust::pods_of(admin, ns, &child, 1).await.remove(0);
        let reporter = pod_trust::as_pod(admin, ns, &pod).await;
        let healthy = vec![gpu(0, 30, 31, RiskLevel::Low, None)];
        let job = child.name_any();
        apply_report(&reporter, ns, &pod_report(&pod, &job, 0, &at(0), healthy)).await;
        pods.push(pod);
    }
    remediation_support::profile_with_status(admin, ns, "train").await;
    (js, pods)
}

/// The planted pod reports the rank it claims (child Job 1's) critical,
/// writing with its own bound token: the report is refused as one the
/// admission webhook never saw written, and the JobSet stays as it was.
async fn planted_rank_is_refused(s: &Setup, js: &DynamicObject, planted: &Pod) {
    let (admin, ns) = (&s.admin, s.ns.name.as_str());
    let reporter = pod_trust::as_pod(admin, ns, planted).await;
    let critical = pod_trust::critical_of(planted, "train-workers-1", 200);
    apply_report(&reporter, ns, &critical).await;
    s.refuses(&planted.name_any(), pod_trust::UNSEEN).await;
    jobset_untouched(s, js).await;
}

/// The JobSet stays the one it was, with BATCH_SIZE 32, nothing recorded.
async fn jobset_untouched(s: &Setup, js: &DynamicObject) {
    let (admin, ns) = (&s.admin, s.ns.name.as_str());
    let uid = js.uid().unwrap();
    untouched(admin, ns, WorkloadKind::JobSet, &uid, pod_trust::QUIET).await;
    let now = api(admin, ns, WorkloadKind::JobSet).get("train").await;
    let batch = now.unwrap().data.pointer(BATCH).cloned();
    assert_eq!(batch, Some(json!("32")));
}

/// The positive control: child Job 1's own pod reporting critical gets the
/// JobSet recreated with BATCH_SIZE 24.
async fn genuine_report_still_remediates(s: &Setup, js: &DynamicObject, pod: &Pod) {
    let (admin, ns) = (&s.admin, s.ns.name.as_str());
    let reporter = pod_trust::as_pod(admin, ns, pod).await;
    let critical = pod_trust::critical_of(pod, "train-workers-1", 300);
    apply_report(&reporter, ns, &critical).await;
    eventually("the JobSet recreated with BATCH_SIZE 24", || async {
        let now = api(admin, ns, WorkloadKind::JobSet).get("train").await;
        let now = now.map_err(|e| e.to_string())?;
        let batch = now.data.pointer(BATCH).cloned();
        (now.uid() != js.uid() && batch == Some(json!("24")))
            .then_some(())
            .ok_or(format!("{:?} {batch:?}", now.uid()))
    })
    .await;
}

#[tokio::test]
async fn pods_created_while_the_webhook_fails_open_never_steer_their_jobset() {
    let Some(s) = pod_trust_setup(Webhook::FailedOpen).await else {
        return;
    };
    let (admin, ns) = (&s.admin, s.ns.name.as_str());
    // The webhook is registered but does not answer: `failurePolicy: Ignore`
    // admits the child Jobs' pods, unmarked.
    let (js, pods) = victim_jobset(&s).await;
    assert!(!pods[1].annotations().contains_key("memprof.dev/admission"));
    let reporter = pod_trust::as_pod(admin, ns, &pods[1]).await;
    let critical = pod_trust::critical_of(&pods[1], "train-workers-1", 200);
    apply_report(&reporter, ns, &critical).await;
    // Both children's reports are refused (`Setup::refuses` reads only the
    // first one named): the critical one must be among them, for its mark.
    let name = pods[1].name_any();
    let why = format!("{name} (pod {name} has no memprof.dev/admission mark");
    eventually("the critical report named in ReportsValid", || async {
        let st = status(admin, ns).await?;
        let valid = st.conditions.iter().find(|c| c.type_ == "ReportsValid");
        let message = valid.map(|c| c.message.clone()).unwrap_or_default();
        message.contains(&why).then_some(()).ok_or(message)
    })
    .await;
    jobset_untouched(&s, &js).await;
    s.stop().await;
}

#[tokio::test]
async fn genuine_admission_mark_copied_onto_a_planted_pod_never_steers_its_jobset() {
    let Some(s) = pod_trust_setup(Webhook::Serving).await else {
        return;
    };
    let (admin, ns) = (&s.admin, s.ns.name.as_str());
    let (js, pods) = victim_jobset(&s).await;
    // A tenant with `edit` copies child Job 1's pod, mark and owner
    // reference included, under another name.
    let pods_api: Api<Pod> = Api::namespaced(tenant(admin, ns).await, ns);
    let original = pods_api.get(&pods[1].name_any()).await.unwrap();
    assert!(original.annotations().contains_key("memprof.dev/admission"));
    pod_trust::newer_than(&original).await;
    let copy = pod_trust::copy_of(&original, "train-workers-1-replayed");
    let copied = pods_api.create(&PostParams::default(), &copy).await;
    let copied = copied.unwrap();
    assert_eq!(
        copied.annotations().get("memprof.dev/admission"),
        original.annotations().get("memprof.dev/admission"),
        "the copy carries the genuine mark"
    );
    planted_rank_is_refused(&s, &js, &copied).await;
    genuine_report_still_remediates(&s, &js, &pods[1]).await;
    pod_trust::release(admin, ns, "train-workers-1-replayed").await;
    s.stop().await;
}

#[tokio::test]
async fn genuine_pod_deleted_and_recreated_with_its_mark_never_steers_its_jobset() {
    let Some(s) = pod_trust_setup(Webhook::Serving).await else {
        return;
    };
    let (admin, ns) = (&s.admin, s.ns.name.as_str());
    let (js, pods) = victim_jobset(&s).await;
    let pods_api: Api<Pod> = Api::namespaced(tenant(admin, ns).await, ns);
    let name = pods[1].name_any();
    let original = pods_api.get(&name).await.unwrap();
    // Past the mark's window, the tenant deletes child Job 1's pod and
    // creates one of the same name, with its mark, owner reference and labels.
    let created = original.creation_timestamp().unwrap().0;
    let past = created + memprof::api::admission::MARK_LATE + jiff::SignedDuration::from_secs(2);
    if let Ok(wait) = Duration::try_from(past - jiff::Timestamp::now()) {
        tokio::time::sleep(wait).await;
    }
    pod_trust::delete_pod_and_its_report(admin, ns, &pods_api, &name).await;
    let copy = pod_trust::copy_of(&original, &name);
    let replayed = pods_api.create(&PostParams::default(), &copy).await;
    let replayed = replayed.unwrap();
    planted_rank_is_refused(&s, &js, &replayed).await;
    pod_trust::release(admin, ns, &name).await;
    s.stop().await;
}

// ---------------------------------------------------------------------------
// A hostile tenant's idle workloads under a policy at `none`
// (remediation_namespaces.rs).

/// Three workloads of `kind` in `ns` that never report: a JobSet's marked
/// child Jobs have pods no kubelet runs; a PyTorchJob, profiled, has no
/// pod at all. Each gets its profile (its status at `none`, no rank
/// counted), which is what a policy at `none` would act on.
async fn idle_workloads(admin: &Client, ns: &str, kind: WorkloadKind) -> Vec<DynamicObject> {
    let mut idle = Vec::new();
    for i in 0..3 {
        let name = format!("idle-{i}");
        let top = match kind {
            WorkloadKind::JobSet => {
                let js = create(admin, ns, kind, jobset(&name, 2, json!({}))).await;
                for index in 0..2 {
                    marked_child(admin, ns, &js, index).await;
                }
                js
            }
            _ => {
                let mut manifest = pytorchjob(&name, 1, json!({"memprof.dev/managed": "true"}));
                manifest["metadata"]["annotations"] = json!({"memprof.dev/enabled": "true"});
                create(admin, ns, kind, manifest).await
            }
        };
        idle.push(top);
    }
    for top in &idle {
        remediation_support::profile_with_status(admin, ns, &top.name_any()).await;
    }
    idle
}

/// The hostile tenant's policy: everything, at risk `none`, no cooldown.
fn at_none(generation: u32) -> serde_json::Value {
    json!({
        "selector": {},
        "triggers": [{"riskAtLeast": {"level": "none"}}],
        "actions": [{"scaleBatch": {"env": "BATCH_SIZE", "factor": 0.5, "minimum": 1}}],
        "cooldownSeconds": 0,
        "maxRemediations": 90 + generation,
    })
}

/// The twin for `kind` of
/// `remediation_namespaces::a_tenant_with_jobs_that_run_nothing_and_a_policy_at_none_never_acts`:
/// the hostile namespace's idle workloads, profiled at `none` under a
/// policy at `none` rewritten again and again, are never acted on; the
/// quiet namespace's critical workload is.
async fn idle_workloads_under_a_policy_at_none(kind: WorkloadKind) {
    let Some((admin, hostile)) = workload_cluster().await else {
        return;
    };
    let _alone = common::alone::alone().await;
    let quiet = TestNamespace::create(&admin).await;
    let (hostile, quiet) = (hostile.name.as_str(), quiet.name.as_str());
    share_admission_key(&admin, hostile).await;
    share_admission_key(&admin, quiet).await;
    let mut setup = OperatorSetup::for_namespace("");
    setup.remediation.plan_namespace = Some(quiet.into());
    let operator = start_controller(&admin, setup);

    apply_policy(&admin, hostile, "any", at_none(0))
        .await
        .unwrap();
    apply_policy(&admin, quiet, "shrink", shrink_policy(false))
        .await
        .unwrap();
    let idle = idle_workloads(&admin, hostile, kind).await;
    for generation in 1..=3 {
        apply_policy(&admin, hostile, "any", at_none(generation))
            .await
            .unwrap();
    }
    let own = critical_workload(&admin, quiet, kind).await;
    eventually("the quiet namespace's workload recreated", || async {
        let now = api(&admin, quiet, kind).get("train").await;
        let uid = now.map_err(|e| e.to_string())?.uid();
        (uid.as_deref() != Some(own.as_str()))
            .then_some(())
            .ok_or(format!("{uid:?}"))
    })
    .await;
    stays(
        "the hostile namespace acted on nothing",
        Duration::from_secs(5),
        || async {
            for top in &idle {
                let name = top.name_any();
                let recs = records(&admin, hostile, &name).await;
                let now = api(&admin, hostile, kind).get(&name).await;
                let now = now.map_err(|e| e.to_string())?;
                if !recs.is_empty() || now.uid() != top.uid() {
                    return Err(format!("{name}: {recs:?} {:?}", now.uid()));
                }
            }
            Ok(())
        },
    )
    .await;
    operator.stop().await;
}

#[tokio::test]
async fn a_tenant_with_jobsets_that_run_nothing_and_a_policy_at_none_never_acts() {
    idle_workloads_under_a_policy_at_none(WorkloadKind::JobSet).await;
}

#[tokio::test]
async fn a_tenant_with_pytorchjobs_that_run_nothing_and_a_policy_at_none_never_acts() {
    idle_workloads_under_a_policy_at_none(WorkloadKind::PyTorchJob).await;
}

// ---------------------------------------------------------------------------
// Who may write a rank's report, and forged reports (security.rs).

/// A profiled workload `train` of `kind` (`team: ml`, every rank low).
/// Returns its uid, the pod of its last rank, the Job name that pod's
/// reports claim, and its ranks.
async fn victim(admin: &Client, ns: &str, kind: WorkloadKind) -> (String, Pod, String, u32) {
    match kind {
        WorkloadKind::JobSet => {
            let js = profiled_jobset(admin, ns, json!({})).await;
            let pod = job_pods(admin, ns, "train-workers-1", 1).await.remove(0);
            (js.uid().unwrap(), pod, "train-workers-1".into(), 2)
        }
        _ => {
            let (pt, mut pods) = profiled_pytorchjob(admin, ns, json!({})).await;
            (pt.uid().unwrap(), pods.remove(2), "train".into(), 3)
        }
    }
}

/// `report` applied as the sidecar's field manager by `client`, unmarked
/// unless a webhook marks it.
async fn write_as(client: &Client, ns: &str, report: &MemoryReport) -> kube::Result<MemoryReport> {
    Api::<MemoryReport>::namespaced(client.clone(), ns)
        .patch(
            &report.name_any(),
            &PatchParams::apply(memprof::api::SIDECAR_MANAGER).force(),
            &Patch::Apply(report),
        )
        .await
}

/// The victim pod's own sidecar, writing with its bound token, counts once
/// the writers webhook marks its writes: every rank counted again.
async fn own_write_counts(admin: &Client, ns: &str, pod: &Pod, job: &str, ranks: u32) {
    let own = client_as_pod(admin, ns, &pod.name_any(), &pod.uid().unwrap()).await;
    let low = vec![gpu(0, 30, 31, RiskLevel::Low, None)];
    let low = pod_report(pod, job, 0, &at(0), low);
    eventually("the victim's own report counted", || async {
        let mut r = low.clone();
        r.spec.sampled_at = at(1 + jiff::Timestamp::now().as_second() as u64 % 60);
        write_as(&own, ns, &r).await.map_err(|e| e.to_string())?;
        let st = status(admin, ns).await?;
        (st.ranks_reporting == ranks)
            .then_some(())
            .ok_or(format!("{} {:?}", st.ranks_reporting, st.conditions))
    })
    .await;
}

/// A client of the pod `evil` the attacker runs under the victim's
/// service account (`default`).
async fn evil_pod(admin: &Client, ns: &str) -> Client {
    let evil: Pod = serde_json::from_value(json!({
        "metadata": {"name": "evil", "namespace": ns},
        "spec": {"serviceAccountName": "default",
                 "containers": [{"name": "x", "image": "busybox"}]}}))
    .unwrap();
    let evil = Api::<Pod>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &evil)
        .await
        .unwrap();
    client_as_pod(admin, ns, "evil", &evil.uid().unwrap()).await
}

/// The twin for `kind` of
/// `security::a_pod_under_the_victims_service_account_cannot_speak_for_the_victims_pod`:
/// a pod under the victim's service account writes the report of the
/// victim's last rank, critical, with a checkpoint. Refused while the
/// writers webhook serves; with it gone (failing open) stored unmarked,
/// named in ReportsValid, never counted or acted on.
async fn another_pod_speaking_for_a_rank(kind: WorkloadKind) {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let ns = ns.name.as_str();
    let operator = start_operator(&admin, ns);
    apply_policy(&admin, ns, "shrink", shrink_policy(false))
        .await
        .unwrap();
    let (uid, pod, job, ranks) = victim(&admin, ns, kind).await;
    let writers = webhook_support::serve_writers(&admin, ns, admission_keys(ns).await).await;
    memprof::operator::ensure_reporter_rbac(&admin, ns, "default")
        .await
        .unwrap();
    own_write_counts(&admin, ns, &pod, &job, ranks).await;

    let evil = evil_pod(&admin, ns).await;
    let critical = vec![gpu(0, 79, 79, RiskLevel::Critical, Some(5.0))];
    let mut forged = pod_report(&pod, &job, 0, &at(120), critical);
    forged.spec.last_checkpoint = Some(memprof::api::Checkpoint {
        time: at(119),
        step: Some(999_999),
        ..Default::default()
    });
    // 1. While the webhook serves, the write is refused and says why.
    let refused = write_as(&evil, ns, &forged).await.expect_err("refused");
    let why = "may write only its own MemoryReport";
    assert!(refused.to_string().contains(why), "{refused}");
    // 2. With the webhook gone (failing open), stored unmarked, never counted.
    drop(writers);
    eventually("the forged write stored", || async {
        write_as(&evil, ns, &forged)
            .await
            .map_err(|e| e.to_string())
    })
    .await;
    eventually("the forged report named in ReportsValid", || async {
        let st = status(&admin, ns).await?;
        let named = st
            .conditions
            .iter()
            .any(|c| c.type_ == "ReportsValid" && c.message.contains("memprof.dev/writer mark"));
        named.then_some(()).ok_or(format!("{:?}", st.conditions))
    })
    .await;
    untouched(&admin, ns, kind, &uid, Duration::from_secs(8)).await;
    let st = status(&admin, ns).await.unwrap();
    assert_ne!(st.risk, RiskLevel::Critical, "{st:?}");
    operator.stop().await;
}

#[tokio::test]
async fn a_pod_under_the_victims_service_account_cannot_speak_for_a_jobset_s_pod() {
    another_pod_speaking_for_a_rank(WorkloadKind::JobSet).await;
}

#[tokio::test]
async fn a_pod_under_the_victims_service_account_cannot_speak_for_a_pytorchjob_s_pod() {
    another_pod_speaking_for_a_rank(WorkloadKind::PyTorchJob).await;
}

/// The three forged reports of the Job test, claiming Job `job` of the
/// workload whose last rank's pod is `pod`; returns the names the
/// profile must give them: one named after nothing with an OOM count,
/// the attacker's own genuine Job pod's, and the victim pod's dated a day
/// ahead (named "in the future").
async fn forge_three(admin: &Client, ns: &str, pod: &Pod, job: &str) -> [String; 3] {
    let reporter = pod_identity(admin, ns).await;
    let critical = |g| vec![gpu(g, 79, 79, RiskLevel::Critical, Some(5.0))];
    let mut forged = report(job, 0, &at(200), critical(0));
    forged.metadata.name = Some("train-forged".into());
    forged.spec.pod_name = "train-forged".into();
    forged.spec.allocator = Some(memprof::api::AllocatorStats {
        num_ooms: 3,
        ..Default::default()
    });
    apply_report(&reporter, ns, &forged).await;
    create_job(admin, ns, "attacker", 1, true).await;
    let apod = job_pods(admin, ns, "attacker", 1).await.remove(0);
    let claimed = pod_report(&apod, job, 1, &at(201), critical(1));
    apply_report(&reporter, ns, &claimed).await;
    let future = jiff::Timestamp::now() + jiff::SignedDuration::from_hours(24);
    let future = future.round(jiff::Unit::Second).unwrap().to_string();
    let ahead = pod_report(pod, job, 0, &future, critical(0));
    apply_report(&reporter, ns, &ahead).await;
    let names = ["train-forged".to_string(), apod.name_any()];
    [names[0].clone(), names[1].clone(), "in the future".into()]
}

/// The twin for `kind` of
/// `security::forged_report_for_another_job_is_named_and_never_acted_on`,
/// both halves: each forged report is named in ReportsValid, and under the
/// shrink policy nothing is acted on or recorded.
async fn forged_reports_named_and_never_acted_on(kind: WorkloadKind) {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let ns = ns.name.as_str();
    let operator = start_operator(&admin, ns);
    apply_policy(&admin, ns, "shrink", shrink_policy(false))
        .await
        .unwrap();
    let (uid, pod, job, _) = victim(&admin, ns, kind).await;
    let named = forge_three(&admin, ns, &pod, &job).await;
    let st = eventually("all three named in ReportsValid", || async {
        let st = status(&admin, ns).await?;
        let cond = st.conditions.iter().find(|c| c.type_ == "ReportsValid");
        let message = cond.map(|c| c.message.clone()).unwrap_or_default();
        named
            .iter()
            .all(|n| message.contains(n.as_str()))
            .then_some(st.clone())
            .ok_or(message)
    })
    .await;
    assert_ne!(st.risk, RiskLevel::Critical, "{st:?}");
    untouched(&admin, ns, kind, &uid, Duration::from_secs(4)).await;
    operator.stop().await;
}

#[tokio::test]
async fn forged_reports_for_a_jobset_are_named_and_never_acted_on() {
    forged_reports_named_and_never_acted_on(WorkloadKind::JobSet).await;
}

#[tokio::test]
async fn forged_reports_for_a_pytorchjob_are_named_and_never_acted_on() {
    forged_reports_named_and_never_acted_on(WorkloadKind::PyTorchJob).await;
}

// ---------------------------------------------------------------------------
// Refused reports' Events beside the risk Event (security.rs).

/// A report claiming rank 0 of Job `job`, critical, named `name` after a
/// pod that does not exist: refused, whoever writes it.
fn refused(job: &str, name: &str) -> MemoryReport {
    let gpus = vec![gpu(0, 79, 79, RiskLevel::Critical, Some(5.0))];
    let mut r = report(job, 0, &at(100), gpus);
    r.metadata.name = Some(name.into());
    r.spec.pod_name = name.into();
    r
}

/// The `ReportRejected` Events about profile `train` naming report
/// `name`, a repeat counted in its Event's series as the Recorder counts it.
async fn rejections_of(admin: &Client, ns: &str, name: &str) -> i32 {
    let named = format!("MemoryReport {name} ignored");
    Api::<k8s_openapi::api::events::v1::Event>::namespaced(admin.clone(), ns)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|e| e.reason.as_deref() == Some("ReportRejected"))
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("train"))
        .filter(|e| e.note.as_deref().is_some_and(|n| n.contains(&named)))
        .map(|e| e.series.as_ref().map_or(1, |s| s.count))
        .sum()
}

/// The twin for `kind` of
/// `security::refused_reports_naming_a_victim_never_hide_its_risk_event`:
/// a refused report claiming the workload's last rank gets its one
/// `ReportRejected` Event, about the workload's profile; then 40 more,
/// written with that rank's genuine critical report (the status just
/// written: the critical one waits out the write spacing with the flood's
/// notices beside it), never hide the workload's `RiskCritical` Event, and
/// the first refusal is not announced again.
async fn refused_reports_never_hide_the_risk_event(kind: WorkloadKind) {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let ns = ns.name.as_str();
    let operator = start_operator(&admin, ns);
    let (_, pod, job, _) = victim(&admin, ns, kind).await;
    let reporter = pod_identity(&admin, ns).await;
    write_as(&reporter, ns, &refused(&job, "forged-first"))
        .await
        .unwrap();
    eventually("the refused report's one ReportRejected Event", || async {
        match rejections_of(&admin, ns, "forged-first").await {
            1 => Ok(()),
            n => Err(format!("{n}")),
        }
    })
    .await;
    let kinds = event_kinds(&admin, ns, "ReportRejected", "train").await;
    assert_eq!(kinds, ["MemoryProfile"], "about the workload's profile");
    let flood: Vec<_> = (0..40)
        .map(|i| refused(&job, &format!("flood-{i}")))
        .collect();
    let critical = vec![gpu(0, 79, 79, RiskLevel::Critical, Some(5.0))];
    let critical = pod_report(&pod, &job, 0, &at(100), critical);
    let (_, written) = futures::join!(
        apply_report(&admin, ns, &critical),
        futures::future::join_all(flood.iter().map(|r| write_as(&reporter, ns, r)))
    );
    written.into_iter().for_each(|w| {
        w.unwrap();
    });
    eventually("the workload's RiskCritical Event", || async {
        let kinds = event_kinds(&admin, ns, "RiskCritical", "train").await;
        kinds
            .contains(&kind.kind().to_string())
            .then_some(())
            .ok_or(format!("{kinds:?}"))
    })
    .await;
    stays(
        "the first refusal announced once",
        Duration::from_secs(4),
        || async {
            match rejections_of(&admin, ns, "forged-first").await {
                1 => Ok(()),
                n => Err(format!("{n}")),
            }
        },
    )
    .await;
    operator.stop().await;
}

#[tokio::test]
async fn refused_reports_naming_a_jobset_s_rank_never_hide_its_risk_event() {
    refused_reports_never_hide_the_risk_event(WorkloadKind::JobSet).await;
}

#[tokio::test]
async fn refused_reports_naming_a_pytorchjob_s_rank_never_hide_its_risk_event() {
    refused_reports_never_hide_the_risk_event(WorkloadKind::PyTorchJob).await;
}

// ---------------------------------------------------------------------------
// Every rank's allocation sites at critical (gpu_oom_visibility.rs).

/// One rank's report: its pod, the Job its reports claim, its rank in the
/// workload, its peak (GiB), the level of its risk and of its sites'
/// snapshot, and the sizes of its sites (GiB).
type RankSites<'a> = (Pod, String, u32, u64, RiskLevel, &'a [u64]);

/// The twin of
/// `gpu_oom_visibility::every_ranks_sites_at_critical_reach_the_profile_and_the_report`
/// for the workload `train` of `ranks`: the critical ranks' sites are
/// listed under the workload's ranks (not the rank the reports claim),
/// largest peak first, in the profile and in `memprof report`; a snapshot
/// taken at high is not.
async fn every_ranks_sites(ns: &str, ranks: &[RankSites<'_>]) {
    let admin = cluster().await.unwrap();
    for (pod, job, rank, peak, level, sizes) in ranks {
        let gpus = vec![gpu(*rank, *peak, *peak, *level, Some(30.0))];
        let mut r = pod_report(pod, job, 0, &at(10), gpus);
        r.spec.allocation_sites = Some(sites_at(*level, *rank, sizes));
        apply_report(&admin, ns, &r).await;
    }
    let st = eventually("both critical ranks' sites in the profile", || async {
        let st = status(&admin, ns).await?;
        let sites: Vec<_> = st
            .critical_allocation_sites
            .iter()
            .map(|w| w.rank)
            .collect();
        (sites.len() == 2 && st.ranks_reporting as usize == ranks.len())
            .then_some(st.clone())
            .ok_or(format!("{sites:?} {}", st.ranks_reporting))
    })
    .await;
    let listed: Vec<_> = st
        .critical_allocation_sites
        .iter()
        .map(|w| w.rank)
        .collect();
    assert_eq!(listed, [Some(1), Some(0)]);
    assert_eq!(st.critical_ranks_with_sites_omitted, 0);
    let first = &st.critical_allocation_sites[0].sites.sites;
    let lines: Vec<_> = first.iter().map(|x| x.line).collect();
    assert_eq!(
        lines,
        [1, 5, 3, 4],
        "each rank's four largest, largest first"
    );
    assert_eq!(st.allocation_sites.map(|w| w.rank), Some(Some(1)));

    let text = cli_support::ok(&["report", "train", "-n", ns]).await;
    let section = text
        .split_once("  allocation sites at critical, every rank")
        .unwrap_or_else(|| panic!("no critical section in:\n{text}"))
        .1;
    let (one, zero) = (section.find("rank 1, pod"), section.find("rank 0, pod"));
    assert!(one.is_some() && one < zero, "{text}");
    let line = "9.0GiB      1 blocks  /app/rank1.py:1 (forward)";
    assert!(section.contains(line), "{text}");
    assert!(!section.contains("rank 2, pod"), "{text}");
}

/// Child Job `i` of JobSet `train` is its rank `i`, though each report
/// claims rank 0 of its child Job.
#[tokio::test]
async fn every_jobset_ranks_sites_at_critical_reach_the_profile_and_the_report() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let ns = ns.name.as_str();
    let operator = start_operator(&admin, ns);
    profiled_jobset(&admin, ns, json!({})).await;
    let mut ranks = Vec::new();
    for (i, peak, sizes) in [(0, 70, &[2][..]), (1, 79, &[1, 9, 3, 7, 5, 8][..])] {
        let job = format!("train-workers-{i}");
        let pod = job_pods(&admin, ns, &job, 1).await.remove(0);
        ranks.push((pod, job, i, peak, RiskLevel::Critical, sizes));
    }
    every_ranks_sites(ns, &ranks).await;
    operator.stop().await;
}

/// The master is rank 0, worker i rank i + 1, as torchrun numbers them.
#[tokio::test]
async fn every_pytorchjob_ranks_sites_at_critical_reach_the_profile_and_the_report() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let ns = ns.name.as_str();
    let operator = start_operator(&admin, ns);
    let (_, pods) = profiled_pytorchjob(&admin, ns, json!({})).await;
    use RiskLevel::{Critical, High};
    let shape: [(u32, u64, RiskLevel, &[u64]); 3] = [
        (0, 70, Critical, &[2]),
        (1, 79, Critical, &[1, 9, 3, 7, 5, 8]),
        (2, 75, High, &[4]),
    ];
    let ranks: Vec<_> = pods
        .into_iter()
        .zip(shape)
        .map(|(pod, (rank, peak, level, sizes))| (pod, "train".into(), rank, peak, level, sizes))
        .collect();
    every_ranks_sites(ns, &ranks).await;
    operator.stop().await;
}
