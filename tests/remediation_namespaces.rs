//! A RemediationPolicy acts only in its own namespace, even when the
//! operator watches every namespace: a tenant's policy with an empty
//! selector ("every profiled Job of the namespace") never reaches a Job of
//! another tenant, however dangerous that Job's memory looks.
//!
//!     eval "$(bash hack/local-cluster.sh env)"
//!     MEMPROF_REQUIRE_CLUSTER=1 cargo test --test integration remediation_namespaces::
//!
//! Without `KUBECONFIG` every test is skipped with a message. Each test's
//! operator watches all namespaces, so it has the cluster alone
//! (`common::alone`): no other test's Jobs run while it does.

use crate::common;
use crate::remediation_support;

use common::*;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use memprof::pipeline::Setup;
use remediation_support::*;
use serde_json::json;
use std::time::Duration;

/// Gives `ns` the admission key the all-namespaces operator holds (the
/// `default` namespace's in these tests), so that the pods of `ns` carry
/// genuine marks and their reports count: the victim's Job is then spared
/// by the policy's namespace alone, not by a failed trust check.
pub(crate) async fn share_admission_key(client: &Client, ns: &str) {
    admission_keys("").await;
    let name = memprof::api::admission::DEFAULT_KEY_SECRET;
    let source = Api::<Secret>::namespaced(client.clone(), "default")
        .get(name)
        .await
        .expect("the operator's admission key");
    let mut copy = Secret {
        data: source.data.clone(),
        type_: source.type_.clone(),
        ..Default::default()
    };
    copy.metadata.name = Some(name.into());
    copy.metadata.labels = source.metadata.labels.clone();
    copy.metadata.annotations = source.metadata.annotations.clone();
    Api::<Secret>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &copy)
        .await
        .unwrap_or_else(|e| panic!("copying the admission key into {ns}: {e}"));
}

#[tokio::test]
async fn a_policy_never_acts_on_a_job_of_another_namespace() {
    let Some(client) = cluster().await else {
        return;
    };
    let _alone = common::alone::alone().await;
    let (tenant, victim) = (
        TestNamespace::create(&client).await,
        TestNamespace::create(&client).await,
    );
    let (tenant, victim) = (tenant.name.as_str(), victim.name.as_str());
    share_admission_key(&client, tenant).await;
    share_admission_key(&client, victim).await;
    let mut setup = Setup::for_namespace("");
    setup.remediation.plan_namespace = Some(tenant.into());
    let operator = start_controller(&client, setup);

    // The tenant's policy: every profiled Job of its namespace, on critical.
    let mut policy = shrink_policy(false);
    policy["selector"] = json!({});
    apply_policy(&client, tenant, "shrink-all", policy)
        .await
        .unwrap();

    // The victim's Job goes critical first, then the tenant's own.
    let victim_job = training_job(&client, victim, "train", Some("32")).await;
    low_report(&client, victim, "train").await;
    profile_with_status(&client, victim, "train").await;
    critical_report(&client, victim, "train", 100).await;
    let own = training_job(&client, tenant, "train", Some("32")).await;
    low_report(&client, tenant, "train").await;
    profile_with_status(&client, tenant, "train").await;
    critical_report(&client, tenant, "train", 100).await;

    // The positive control: the operator saw the critical reports and acted
    // in the tenant's namespace.
    eventually("the tenant's own Job recreated", || async {
        match job(&client, tenant, "train").await {
            Some(j) if j.uid() != own.uid() => Ok(()),
            other => Err(format!("{:?}", other.map(|j| j.uid()))),
        }
    })
    .await;
    // The victim's Job: critical too, counted, and never touched.
    let victim_profile = profile_with_status(&client, victim, "train").await;
    let risk = victim_profile.status.map(|s| s.risk.to_string());
    assert_eq!(risk.as_deref(), Some("critical"), "the victim's roll-up");
    stays(
        "the victim's Job untouched and unrecorded",
        Duration::from_secs(5),
        || async {
            let j = job(&client, victim, "train").await;
            if j.as_ref().and_then(|j| j.uid()) != victim_job.uid() {
                return Err(format!("the Job is now {:?}", j.map(|j| j.uid())));
            }
            let recs = records(&client, victim, "train").await;
            if !recs.is_empty() {
                return Err(format!("records {recs:?}"));
            }
            Ok(())
        },
    )
    .await;
    operator.stop().await;
}

/// A hostile tenant: Jobs that run nothing (parallelism 0, so no report
/// ever), a policy that fires at risk `none` with no cooldown, rewritten
/// again and again. It never acts (no counted report, no evidence), and
/// another namespace's remediation still goes through.
#[tokio::test]
async fn a_tenant_with_jobs_that_run_nothing_and_a_policy_at_none_never_acts() {
    let Some(client) = cluster().await else {
        return;
    };
    let _alone = common::alone::alone().await;
    let (hostile, quiet) = (
        TestNamespace::create(&client).await,
        TestNamespace::create(&client).await,
    );
    let (hostile, quiet) = (hostile.name.as_str(), quiet.name.as_str());
    share_admission_key(&client, hostile).await;
    share_admission_key(&client, quiet).await;
    let mut setup = Setup::for_namespace("");
    setup.remediation.plan_namespace = Some(quiet.into());
    let operator = start_controller(&client, setup);

    // Parallelism 0 with one completion owed: never done, never a pod.
    let jobs = Api::<k8s_openapi::api::batch::v1::Job>::namespaced(client.clone(), hostile);
    let mut idle = Vec::new();
    for i in 0..20 {
        let mut j = training_job_manifest(&format!("idle-{i}"), "32");
        j.spec.as_mut().unwrap().parallelism = Some(0);
        idle.push(jobs.create(&PostParams::default(), &j).await.unwrap());
    }
    let at_none = |generation: u32| {
        json!({
            "selector": {},
            "triggers": [{"riskAtLeast": {"level": "none"}}],
            "actions": [{"scaleBatch": {"env": "BATCH_SIZE", "factor": 0.5, "minimum": 1}}],
            "cooldownSeconds": 0,
            "maxRemediations": 90 + generation,
        })
    };
    apply_policy(&client, hostile, "any", at_none(0))
        .await
        .unwrap();
    apply_policy(&client, quiet, "shrink", shrink_policy(false))
        .await
        .unwrap();
    let own = training_job(&client, quiet, "train", Some("32")).await;
    low_report(&client, quiet, "train").await;
    profile_with_status(&client, quiet, "train").await;
    for generation in 1..=3 {
        apply_policy(&client, hostile, "any", at_none(generation))
            .await
            .unwrap();
    }
    critical_report(&client, quiet, "train", 100).await;
    eventually("the quiet namespace's Job recreated", || async {
        match job(&client, quiet, "train").await {
            Some(j) if j.uid() != own.uid() => Ok(()),
            other => Err(format!("{:?}", other.map(|j| j.uid()))),
        }
    })
    .await;
    stays(
        "the hostile namespace acted on nothing",
        Duration::from_secs(5),
        || async {
            for j in &idle {
                let name = j.name_any();
                if !records(&client, hostile, &name).await.is_empty() {
                    return Err(format!("a remediation of {name}"));
                }
                let now = job(&client, hostile, &name).await.and_then(|j| j.uid());
                if now != j.uid() {
                    return Err(format!("{name} was recreated"));
                }
            }
            Ok(())
        },
    )
    .await;
    operator.stop().await;
}
