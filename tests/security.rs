//! Attacks a namespace tenant can make on memprof, each against the real
//! local control plane. A tenant is an impersonated user with the built-in
//! `edit` ClusterRole bound in their namespace only (what a team gets on a
//! shared cluster), or a pod's service account holding the reporter Role.
//! Each test is named after the attack it proves closed (docs/security.md).

use crate::common;
use crate::remediation_support;
use crate::tenant_support;
use crate::webhook_support;

use common::*;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use memprof::api::{MemoryProfile, RiskLevel};
use memprof::pipeline::Setup;
use memprof::policy::triggers::record_id;
use remediation_support::job as job_of;
use remediation_support::*;
use serde_json::json;
use std::time::Duration;
use tenant_support::*;

/// The operator keeping its remediation plans in `plan_ns` (the operator's own namespace).
pub(crate) fn operator_with_plans_in(client: &Client, ns: &str, plan_ns: &str) -> RunningOperator {
    let mut setup = Setup::for_namespace(ns);
    setup.remediation.plan_namespace = Some(plan_ns.into());
    start_controller(client, setup)
}

/// The remediation id the operator will use for the first `risk>=critical`
/// decision of `policy` on `job`: deterministic, so a tenant can compute it too.
pub(crate) async fn first_id(client: &Client, ns: &str, policy: &str, job: &Job) -> String {
    let p = Api::<memprof::api::RemediationPolicy>::namespaced(client.clone(), ns)
        .get(policy)
        .await
        .unwrap();
    record_id(
        &p.uid().unwrap(),
        p.metadata.generation.unwrap_or_default(),
        &job.uid().unwrap(),
        "risk>=critical",
        0,
    )
}

/// A plan that, executed with the operator's rights, would create a Job in
/// another namespace under that namespace's service account.
pub(crate) fn evil_plan(id: &str, victim_ns: &str) -> String {
    json!({
        "id": id, "policy": "shrink", "namespace": victim_ns, "job": "pwned",
        "jobUid": "00000000-0000-0000-0000-000000000000", "why": "tenant",
        "steps": [{"kind": "recreate", "changes": [], "manifest": {
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "pwned", "namespace": victim_ns,
                         "annotations": {"memprof.dev/remediation": id}},
            "spec": {"template": {"spec": {
                "restartPolicy": "Never", "serviceAccountName": "default",
                "containers": [{"name": "x", "image": "busybox"}]}}}}}],
    })
    .to_string()
}

/// A ConfigMap not opted in to memprof (`someone-elses`, batch 64) and a
/// policy that would set its `batch` key to 8 at critical: what
/// `config_map_not_opted_in_is_never_written` and its twins start from.
pub(crate) async fn someone_elses_config_map_under_a_policy(
    admin: &Client,
    ns: &str,
) -> Api<ConfigMap> {
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), ns);
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "someone-elses"}, "data": {"batch": "64"}}))
    .unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let spec = json!({
        "triggers": [{"riskAtLeast": {"level": "critical"}}],
        "actions": [{"setConfigMapKey": {"configMap": "someone-elses", "key": "batch", "value": "8"}}],
    });
    apply_policy(admin, ns, "cm", spec).await.unwrap();
    cms
}

/// The tenant's attack: the plan ConfigMap under memprof's next
/// remediation `id`, in the tenant's namespace `ns`, aimed at `victim_ns`;
/// and the check that the operator's plan namespace `plans` is out of the
/// tenant's reach.
pub(crate) async fn plant_plan(
    tenant: &Client,
    (ns, plans): (&str, &str),
    id: &str,
    victim_ns: &str,
) {
    Api::<ConfigMap>::namespaced(tenant.clone(), ns)
        .create(
            &PostParams::default(),
            &plan_config_map(id, &evil_plan(id, victim_ns)),
        )
        .await
        .expect("edit lets the tenant write ConfigMaps in its namespace");
    let denied = Api::<ConfigMap>::namespaced(tenant.clone(), plans)
        .create(&PostParams::default(), &plan_config_map(id, "{}"))
        .await;
    assert!(
        matches!(denied, Err(kube::Error::Api(ref s)) if s.code == 403),
        "{denied:?}"
    );
}

pub(crate) fn plan_config_map(id: &str, json: &str) -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": {"name": format!("memprof-remediation-{id}")},
        "data": {"plan.json": json},
    }))
    .unwrap()
}

pub(crate) async fn job_exists(client: &Client, ns: &str, name: &str) -> bool {
    Api::<Job>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .unwrap()
        .is_some()
}

/// The shrink policy (admin-written) and a profiled Job `train` of `creator`
/// with `BATCH_SIZE=32`, whose profile has its first status.
async fn shrinkable_train(admin: &Client, creator: &Client, ns: &str) -> Job {
    apply_policy(admin, ns, "shrink", shrink_policy(false))
        .await
        .unwrap();
    let job = training_job(creator, ns, "train", Some("32")).await;
    low_report(admin, ns, "train").await;
    profile_with_status(admin, ns, "train").await;
    job
}

#[tokio::test]
async fn tenant_planted_plan_config_map_is_never_executed() {
    let Some(admin) = cluster().await else {
        return;
    };
    let tenant_ns = TestNamespace::create(&admin).await;
    let operator_ns = TestNamespace::create(&admin).await;
    let victim_ns = TestNamespace::create(&admin).await;
    let (ns, plans) = (tenant_ns.name.as_str(), operator_ns.name.as_str());
    let tenant = tenant(&admin, ns).await;

    let operator = operator_with_plans_in(&admin, ns, plans);
    // (On a real cluster the chart's memprof-edit lets `edit` write policies;
    // the local server has no chart, so the admin writes this one.)
    let job = shrinkable_train(&admin, &tenant, ns).await;

    // The attack: pre-create the plan ConfigMap the operator would use, in
    // the tenant's namespace, with a plan aimed at another namespace.
    let id = first_id(&admin, ns, "shrink", &job).await;
    plant_plan(&tenant, (ns, plans), &id, &victim_ns.name).await;

    critical_report(&admin, ns, "train", 100).await;
    let new = eventually(
        "the tenant's own Job recreated with BATCH_SIZE 24",
        || async {
            match job_of(&admin, ns, "train").await {
                Some(j)
                    if j.uid() != job.uid()
                        && env_of(&j, "BATCH_SIZE").as_deref() == Some("24") =>
                {
                    Ok(j)
                }
                other => Err(format!("{:?}", other.map(|j| j.uid()))),
            }
        },
    )
    .await;
    assert_eq!(new.namespace().as_deref(), Some(ns));
    assert!(
        !job_exists(&admin, &victim_ns.name, "pwned").await,
        "nothing was created in another namespace"
    );
    // The record is finished by the status writer's next write (spaced).
    let recs = eventually("the record Done", || async {
        let recs = records(&admin, ns, "train").await;
        match recs.as_slice() {
            [r] if r.phase == "Done" => Ok(recs),
            _ => Err(format!("{recs:?}")),
        }
    })
    .await;
    assert_eq!(recs[0].id, id);
    operator.stop().await;
}

#[tokio::test]
async fn plan_changed_after_recording_is_refused_not_executed() {
    let Some(admin) = cluster().await else {
        return;
    };
    let tenant_ns = TestNamespace::create(&admin).await;
    let operator_ns = TestNamespace::create(&admin).await;
    let victim_ns = TestNamespace::create(&admin).await;
    let (ns, plans) = (tenant_ns.name.as_str(), operator_ns.name.as_str());

    let operator = operator_with_plans_in(&admin, ns, plans);
    let metrics = operator.remediation_metrics.clone();
    let job = shrinkable_train(&admin, &admin, ns).await;

    // Whoever could write the plan namespace: the plan there is still only
    // carried out if it is the one the record names (digest, ns, Job, uid).
    let id = first_id(&admin, ns, "shrink", &job).await;
    Api::<ConfigMap>::namespaced(admin.clone(), plans)
        .create(
            &PostParams::default(),
            &plan_config_map(&id, &evil_plan(&id, &victim_ns.name)),
        )
        .await
        .unwrap();
    critical_report(&admin, ns, "train", 100).await;

    let rec = eventually("the remediation refused and recorded as Failed", || async {
        let recs = records(&admin, ns, "train").await;
        match recs.first() {
            Some(r) if r.phase == "Failed" => Ok(r.clone()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let message = rec.message.unwrap_or_default();
    assert!(message.contains("refused the saved plan"), "{message}");
    assert!(message.contains("digest"), "{message}");
    assert_eq!(metrics.plans_refused.get(), 1);
    assert!(!job_exists(&admin, &victim_ns.name, "pwned").await);
    let still = job_of(&admin, ns, "train").await.unwrap();
    assert_eq!(still.uid(), job.uid(), "the tenant's Job was not touched");
    // The Event follows the record's write.
    eventually("one RemediationFailed Event", || async {
        match count_events(&admin, ns, "RemediationFailed", "train").await {
            1 => Ok(()),
            n => Err(format!("{n}")),
        }
    })
    .await;
    operator.stop().await;
}

#[tokio::test]
async fn forged_report_for_another_job_is_named_and_never_acted_on() {
    let Some(admin) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&admin).await;
    let ns = ns.name.as_str();
    let operator = start_operator(&admin, ns);
    apply_policy(&admin, ns, "shrink", shrink_policy(false))
        .await
        .unwrap();
    let victim = training_job(&admin, ns, "victim", Some("32")).await;
    let attacker = create_job(&admin, ns, "attacker", 1, true).await;
    low_report(&admin, ns, "victim").await;
    profile_with_status(&admin, ns, "victim").await;
    let pod = pod_identity(&admin, ns).await;

    // 1. A critical report with an OOM count, labelled for the victim, named
    //    after nothing (the reporter Role allows any name).
    let mut forged = report(
        "victim",
        0,
        &at(200),
        vec![gpu(0, 79, 79, RiskLevel::Critical, Some(5.0))],
    );
    forged.metadata.name = Some("victim-forged".into());
    forged.spec.pod_name = "victim-forged".into();
    forged.spec.allocator = Some(memprof::api::AllocatorStats {
        num_ooms: 3,
        ..Default::default()
    });
    apply_report(&pod, ns, &forged).await;
    // 2. The attacker's own genuine pod claims the victim's Job.
    let apods = job_pods(&admin, ns, "attacker", 1).await;
    let claimed = pod_report(
        &apods[0],
        "victim",
        1,
        &at(201),
        vec![gpu(1, 79, 79, RiskLevel::Critical, Some(5.0))],
    );
    apply_report(&pod, ns, &claimed).await;
    // 3. The victim's own pod, but dated a day ahead (would never go stale).
    let vpods = job_pods(&admin, ns, "victim", 1).await;
    let future = jiff::Timestamp::now() + jiff::SignedDuration::from_hours(24);
    let mut ahead = pod_report(
        &vpods[0],
        "victim",
        0,
        &future.round(jiff::Unit::Second).unwrap().to_string(),
        vec![gpu(0, 79, 79, RiskLevel::Critical, Some(5.0))],
    );
    ahead.metadata.name = Some(vpods[0].name_any());
    apply_report(&pod, ns, &ahead).await;

    let profiles: Api<MemoryProfile> = Api::namespaced(admin.clone(), ns);
    let st = eventually("all three named in ReportsValid", || async {
        let st = profiles.get("victim").await.unwrap().status.unwrap();
        let cond = st.conditions.iter().find(|c| c.type_ == "ReportsValid");
        match cond {
            Some(c)
                if c.message.contains("victim-forged")
                    && c.message.contains(&apods[0].name_any())
                    && c.message.contains("in the future") =>
            {
                Ok(st.clone())
            }
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_ne!(st.risk, RiskLevel::Critical, "{st:?}");
    stays(
        "the victim's Job untouched, no OOM recorded",
        Duration::from_secs(4),
        || async {
            let j = job_of(&admin, ns, "victim").await.unwrap();
            let st = profiles.get("victim").await.unwrap().status.unwrap();
            (j.uid() == victim.uid() && st.ooms.is_empty() && st.remediations.is_empty())
                .then_some(())
                .ok_or(format!("{:?} {:?}", st.ooms, st.remediations))
        },
    )
    .await;
    assert!(job_of(&admin, ns, "attacker").await.unwrap().uid() == attacker.uid());
    operator.stop().await;
}

#[tokio::test]
async fn config_map_not_opted_in_is_never_written() {
    let Some(admin) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&admin).await;
    let ns = ns.name.as_str();
    let operator = start_operator(&admin, ns);
    let cms = someone_elses_config_map_under_a_policy(&admin, ns).await;
    training_job(&admin, ns, "train", Some("32")).await;
    low_report(&admin, ns, "train").await;
    profile_with_status(&admin, ns, "train").await;
    critical_report(&admin, ns, "train", 100).await;
    let rec = eventually("the remediation skipped", || async {
        match records(&admin, ns, "train").await.first() {
            Some(r) if r.phase == "Skipped" => Ok(r.clone()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(
        rec.message
            .as_deref()
            .unwrap_or_default()
            .contains("ConfigMapNotOptedIn"),
        "{rec:?}"
    );
    let data = cms.get("someone-elses").await.unwrap().data.unwrap();
    assert_eq!(data["batch"], "64");
    operator.stop().await;
}

#[tokio::test]
async fn job_that_cannot_be_created_again_is_never_deleted() {
    let Some(admin) = cluster().await else {
        return;
    };
    let tenant_ns = TestNamespace::create(&admin).await;
    let operator_ns = TestNamespace::create(&admin).await;
    let (ns, plans) = (tenant_ns.name.as_str(), operator_ns.name.as_str());
    // The operator runs as an identity that may delete Jobs but not create
    // them: the API server would refuse the new Job (403), which retrying
    // cannot fix. The dry run of the creation says so before anything is
    // deleted.
    let user = format!("remediation-{ns}");
    let read = ["get", "list", "watch"];
    grant(&admin, ns, "remediation", &user, json!([
        {"apiGroups": ["memprof.dev"], "resources": ["memoryreports", "remediationpolicies"], "verbs": read},
        {"apiGroups": ["memprof.dev"], "resources": ["memoryprofiles"], "verbs": ["get", "list", "watch", "create", "patch"]},
        {"apiGroups": ["memprof.dev"], "resources": ["memoryprofiles/status", "remediationpolicies/status"], "verbs": ["get", "patch", "update"]},
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "watch", "delete", "patch"]},
        {"apiGroups": ["batch"], "resources": ["jobs/finalizers"], "verbs": ["update"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "delete", "deletecollection"]},
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update", "patch"]},
    ])).await;
    grant(
        &admin,
        plans,
        "remediation-plans",
        &user,
        json!([
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "create", "delete"]},
        ]),
    )
    .await;
    let limited = as_user(&user, &["system:authenticated"]).await;
    let probe: Api<Job> = Api::namespaced(limited.clone(), ns);
    eventually("the remediation's Role in effect", || async {
        probe
            .list(&Default::default())
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .await;
    let operator = operator_with_plans_in(&limited, ns, plans);
    let job = shrinkable_train(&admin, &admin, ns).await;
    critical_report(&admin, ns, "train", 100).await;
    let rec = eventually("the remediation recorded as Failed", || async {
        match records(&admin, ns, "train").await.first() {
            Some(r) if r.phase == "Failed" => Ok(r.clone()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let message = rec.message.clone().unwrap_or_default();
    assert!(message.contains("would refuse Job train"), "{message}");
    assert!(message.contains("left running, untouched"), "{message}");
    assert!(!rec.job_deleted, "{rec:?}");
    let still = job_of(&admin, ns, "train")
        .await
        .expect("the Job is still there");
    assert_eq!(still.uid(), job.uid());
    assert_eq!(env_of(&still, "BATCH_SIZE").as_deref(), Some("32"));
    // The Event follows the record's write.
    eventually("one RemediationFailed Event", || async {
        match count_events(&admin, ns, "RemediationFailed", "train").await {
            1 => Ok(()),
            n => Err(format!("{n}")),
        }
    })
    .await;
    let kept = Api::<ConfigMap>::namespaced(admin.clone(), plans)
        .list(&Default::default())
        .await
        .unwrap()
        .items;
    assert!(
        kept.is_empty(),
        "no plan is kept: {:?}",
        kept.iter().map(|c| c.name_any()).collect::<Vec<_>>()
    );
    operator.stop().await;
}

/// A tenant's Job whose annotations sit just under the API server's limit:
/// its recreation, with memprof's annotations added, would be refused
/// (422). Nothing is deleted, and no plan is left behind, however many
/// such Jobs remediate.
#[tokio::test]
async fn job_whose_annotations_leave_no_room_is_never_deleted_and_leaves_no_plan() {
    let Some(admin) = cluster().await else {
        return;
    };
    let tenant_ns = TestNamespace::create(&admin).await;
    let operator_ns = TestNamespace::create(&admin).await;
    let (ns, plans) = (tenant_ns.name.as_str(), operator_ns.name.as_str());
    let operator = operator_with_plans_in(&admin, ns, plans);
    apply_policy(&admin, ns, "shrink", shrink_policy(false))
        .await
        .unwrap();
    // 256 KiB is the API server's limit on a Job's annotations (keys and
    // values): 8 bytes are left, after team.example/notes and memprof.dev/enabled.
    let filler = "x".repeat(262_144 - 41 - 8);
    let mut job = training_job_manifest("train", "32");
    job.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert("team.example/notes".into(), filler);
    let job = Api::<Job>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &job)
        .await
        .expect("just under the limit: accepted");
    critical_report(&admin, ns, "train", 100).await;
    let rec = eventually("the remediation recorded as Failed", || async {
        match records(&admin, ns, "train").await.first() {
            Some(r) if r.phase == "Failed" => Ok(r.clone()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let message = rec.message.clone().unwrap_or_default();
    assert!(message.contains("would refuse Job train"), "{message}");
    assert!(!rec.job_deleted);
    assert_eq!(job_of(&admin, ns, "train").await.unwrap().uid(), job.uid());
    // The plan is removed once the record says Failed (the record first, so
    // a restart in between finds it): left behind for good is the failure.
    let cms = Api::<ConfigMap>::namespaced(admin.clone(), plans);
    eventually("no plan kept", || async {
        let kept = cms
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?;
        kept.items
            .is_empty()
            .then_some(())
            .ok_or(format!("{} plans kept", kept.items.len()))
    })
    .await;
    operator.stop().await;
}

#[tokio::test]
async fn foreign_finalizer_holding_the_old_job_is_announced_and_waited_out() {
    let Some(admin) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&admin).await;
    let ns = ns.name.as_str();
    let operator = start_operator(&admin, ns);
    apply_policy(&admin, ns, "shrink", shrink_policy(false))
        .await
        .unwrap();
    let old = training_job(&admin, ns, "train", Some("32")).await;
    let jobs: Api<Job> = Api::namespaced(admin.clone(), ns);
    let hold = json!({"metadata": {"finalizers": ["example.com/hold"]}});
    jobs.patch("train", &PatchParams::default(), &Patch::Merge(&hold))
        .await
        .unwrap();
    low_report(&admin, ns, "train").await;
    profile_with_status(&admin, ns, "train").await;
    critical_report(&admin, ns, "train", 100).await;

    eventually_within(
        Duration::from_secs(90),
        "a RemediationWaiting Event naming the finalizer",
        || async {
            let n = count_events(&admin, ns, "RemediationWaiting", "train").await;
            (n >= 1).then_some(()).ok_or(format!("{n} events"))
        },
    )
    .await;
    let held = jobs.get("train").await.unwrap();
    assert_eq!(held.uid(), old.uid(), "still the old Job, being deleted");
    assert!(held.metadata.deletion_timestamp.is_some());
    // The owner of the finalizer lets go: the Job watch wakes the remediation.
    let release = json!({"metadata": {"finalizers": null}});
    jobs.patch("train", &PatchParams::default(), &Patch::Merge(&release))
        .await
        .unwrap();
    eventually("the Job recreated", || async {
        match job_of(&admin, ns, "train").await {
            Some(j) if j.uid() != old.uid() => Ok(()),
            other => Err(format!("{:?}", other.map(|j| j.uid()))),
        }
    })
    .await;
    operator.stop().await;
}

#[tokio::test]
async fn job_planted_under_memprofs_remediation_id_is_not_taken_for_the_recreated_one() {
    let Some(admin) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&admin).await;
    let ns = ns.name.as_str();
    apply_policy(&admin, ns, "shrink", shrink_policy(false))
        .await
        .unwrap();
    training_job(&admin, ns, "train", Some("32")).await;
    // The operator stops between deleting the old Job and creating the new one.
    let mut crashing = spawn_operator(ns, Some("remediation-after-delete"));
    low_report(&admin, ns, "train").await;
    profile_with_status(&admin, ns, "train").await;
    critical_report(&admin, ns, "train", 100).await;
    eventually("the operator to stop at the failpoint", || {
        let r = crashing.child.try_wait();
        async move { r.map_err(|e| e.to_string())?.ok_or("running".to_string()) }
    })
    .await;
    let id = records(&admin, ns, "train").await[0].id.clone();
    eventually_within(GC_TIMEOUT, "the old Job gone", || async {
        match job_of(&admin, ns, "train").await {
            None => Ok(()),
            Some(j) => Err(format!("{:?}", j.uid())),
        }
    })
    .await;

    // Someone who may create Jobs, not delete them, creates one in its
    // place under the (computable) remediation id, with an image of theirs.
    let creator = user_with(
        &admin,
        ns,
        &format!("job-creator-{ns}"),
        json!([{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create", "get", "list"]}]),
    )
    .await;
    let planted: Job = serde_json::from_value(json!({
        "metadata": {"name": "train", "labels": {"team": "ml"},
                     "annotations": {"memprof.dev/remediation": id, "memprof.dev/enabled": "true"}},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [
            {"name": "trainer", "image": "attacker.example/miner",
             "env": [{"name": "BATCH_SIZE", "value": "24"}]}]}}},
    }))
    .unwrap();
    let planted = Api::<Job>::namespaced(creator, ns)
        .create(&PostParams::default(), &planted)
        .await
        .expect("a Job creator may create Jobs");

    drop(crashing);
    let _restarted = spawn_operator(ns, None);
    let rec = eventually("the remediation recorded as not done", || async {
        match records(&admin, ns, "train").await.first() {
            Some(r) if r.id == id && r.phase != "Pending" => Ok(r.clone()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(rec.phase, "Failed", "{rec:?}");
    let message = rec.message.unwrap_or_default();
    assert!(message.contains("recreated by someone else"), "{message}");
    let now = job_of(&admin, ns, "train").await.unwrap();
    assert_eq!(now.uid(), planted.uid(), "left alone, not taken over");
}

/// Anyone who may create pods may run one under the victim Job's own
/// service account and, with that pod's token, write the victim pod's
/// report (same name, same owner): critical, with a checkpoint and an
/// acknowledgement in it. The write is refused while the webhook serves;
/// with the webhook off (failing open) or with a token bound to no pod, it
/// is stored unmarked and never counts: the Job is not recreated, the
/// report is named in ReportsValid. The victim's own sidecar, writing with
/// its pod's bound token, still counts.
#[tokio::test]
async fn a_pod_under_the_victims_service_account_cannot_speak_for_the_victims_pod() {
    let Some(admin) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&admin).await;
    let ns = ns.name.as_str();
    let operator = start_operator(&admin, ns);
    apply_policy(&admin, ns, "shrink", shrink_policy(false))
        .await
        .unwrap();
    let writers = webhook_support::serve_writers(&admin, ns, admission_keys(ns).await).await;
    let victim = training_job(&admin, ns, "victim", Some("32")).await;
    let pod = job_pods(&admin, ns, "victim", 1).await.remove(0);
    let (name, uid) = (pod.name_any(), pod.uid().unwrap());
    let own_client = client_as_pod(&admin, ns, &name, &uid).await;
    memprof::operator::ensure_reporter_rbac(&admin, ns, "default")
        .await
        .unwrap();

    // The victim's own sidecar: counted, once the webhook is active.
    let low = pod_report(
        &pod,
        "victim",
        0,
        &at(0),
        vec![gpu(0, 30, 31, RiskLevel::Low, None)],
    );
    eventually("the victim's own report counted", || async {
        let api = Api::<memprof::api::MemoryReport>::namespaced(own_client.clone(), ns);
        let mut r = low.clone();
        r.spec.sampled_at = at(1 + jiff::Timestamp::now().as_second() as u64 % 60);
        api.patch(
            &name,
            &PatchParams::apply(memprof::api::SIDECAR_MANAGER).force(),
            &Patch::Apply(&r),
        )
        .await
        .map_err(|e| e.to_string())?;
        let st = profile_with_status(&admin, ns, "victim")
            .await
            .status
            .unwrap_or_default();
        (st.ranks_reporting == 1)
            .then_some(())
            .ok_or(format!("{:?}", st.conditions))
    })
    .await;

    // The attacker's pod, under the same service account.
    let evil: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": {"name": "evil", "namespace": ns},
        "spec": {"serviceAccountName": "default",
                 "containers": [{"name": "x", "image": "busybox"}]}}))
    .unwrap();
    let evil = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &evil)
        .await
        .unwrap();
    let evil_client = client_as_pod(&admin, ns, "evil", &evil.uid().unwrap()).await;
    let mut forged = pod_report(
        &pod,
        "victim",
        0,
        &at(120),
        vec![gpu(0, 79, 79, RiskLevel::Critical, Some(5.0))],
    );
    forged.spec.last_checkpoint = Some(memprof::api::Checkpoint {
        time: at(119),
        step: Some(999_999),
        ..Default::default()
    });
    let apply = |client: Client| {
        let forged = forged.clone();
        async move {
            Api::<memprof::api::MemoryReport>::namespaced(client, ns)
                .patch(
                    &forged.name_any(),
                    &PatchParams::apply(memprof::api::SIDECAR_MANAGER).force(),
                    &Patch::Apply(&forged),
                )
                .await
        }
    };

    // 1. While the webhook serves, the write is refused and says why.
    let refused = apply(evil_client.clone()).await.expect_err("refused");
    assert!(
        refused
            .to_string()
            .contains("may write only its own MemoryReport"),
        "{refused}"
    );

    // 2. With the webhook gone (a webhook failing open), it is stored
    //    unmarked, and never counts.
    drop(writers);
    eventually("the forged write stored", || async {
        apply(evil_client.clone())
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .await;
    eventually("the forged report named in ReportsValid", || async {
        let st = profile_with_status(&admin, ns, "victim")
            .await
            .status
            .unwrap_or_default();
        let named = st.conditions.iter().any(|c| {
            // Unmarked, or still carrying the mark of the victim's last
            // genuine write, which does not match what the attacker wrote.
            c.type_ == "ReportsValid" && c.message.contains("memprof.dev/writer mark")
        });
        named.then_some(()).ok_or(format!("{:?}", st.conditions))
    })
    .await;
    stays(
        "the victim Job untouched",
        Duration::from_secs(8),
        || async {
            let j = job_of(&admin, ns, "victim").await;
            let recs = records(&admin, ns, "victim").await;
            match j {
                Some(j) if j.uid() == victim.uid() && recs.is_empty() => Ok(()),
                other => Err(format!("{:?} {recs:?}", other.map(|j| j.uid()))),
            }
        },
    )
    .await;
    let st = profile_with_status(&admin, ns, "victim")
        .await
        .status
        .unwrap_or_default();
    assert_ne!(st.risk, RiskLevel::Critical, "{st:?}");
    operator.stop().await;
}

/// Refused reports that name a victim Job, written right after its genuine
/// critical report, fill the Events waiting for the Job's next write: the
/// victim's `RiskCritical` Event must still be published.
#[tokio::test]
async fn refused_reports_naming_a_victim_never_hide_its_risk_event() {
    let Some(admin) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&admin).await;
    let ns = ns.name.as_str();
    let operator = start_operator(&admin, ns);
    training_job(&admin, ns, "victim", Some("32")).await;
    let pod = pod_identity(&admin, ns).await;
    let reports = Api::<memprof::api::MemoryReport>::namespaced(pod, ns);
    let flood: Vec<_> = (0..40)
        .map(|i| {
            let gpus = vec![gpu(0, 79, 79, RiskLevel::Critical, Some(5.0))];
            let mut r = report("victim", 0, &at(100), gpus);
            r.metadata.name = Some(format!("flood-{i}"));
            r.spec.pod_name = format!("flood-{i}");
            r
        })
        .collect();
    // The status was just written: the critical one waits out the write
    // spacing (1 s) with the flood's notices beside it.
    low_report(&admin, ns, "victim").await;
    profile_with_status(&admin, ns, "victim").await;
    let gpus = vec![gpu(0, 79, 79, RiskLevel::Critical, Some(5.0))];
    let critical = rank_report(&admin, ns, "victim", 0, &at(100), gpus).await;
    let params = PatchParams::apply(memprof::api::SIDECAR_MANAGER).force();
    // The genuine critical report and the flood at once: one roll-up sees both.
    let genuine = apply_report(&admin, ns, &critical);
    let (_, written) = futures::join!(
        genuine,
        futures::future::join_all(flood.iter().map(|r| {
            let (reports, params) = (&reports, &params);
            async move {
                let name = r.metadata.name.as_deref().unwrap();
                reports.patch(name, params, &Patch::Apply(r)).await
            }
        }))
    );
    written.into_iter().for_each(|w| {
        w.unwrap();
    });
    eventually("the victim's RiskCritical Event", || async {
        match count_events(&admin, ns, "RiskCritical", "victim").await {
            0 => Err("none".to_string()),
            _ => Ok(()),
        }
    })
    .await;
    operator.stop().await;
}
