//! A RemediationPolicy acts only in its own namespace, even when the
//! operator watches every namespace: a tenant's policy with an empty
//! selector ("every profiled Job of the namespace") never reaches a Job of
//! another tenant, however dangerous that Job's memory looks.
//!
//!     eval "$(bash hack/local-cluster.sh env)"
//!     MEMPROF_REQUIRE_CLUSTER=1 cargo test --test remediation_namespaces
//!
//! Without `KUBECONFIG` every test is skipped with a message. The test
//! binary holds this one test only: its operator watches all namespaces.

mod common;
mod remediation_support;

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
async fn share_admission_key(client: &Client, ns: &str) {
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
