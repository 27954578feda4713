//! `scaleBatch` with `accumulation` against a real control plane: the Job is
//! recreated with a smaller micro-batch and more accumulation steps, keeping
//! micro × accumulation (exactly when a split divides it, otherwise the
//! nearest value above, which the record says).
//!
//!     eval "$(bash hack/local-cluster.sh env)"
//!     MEMPROF_REQUIRE_CLUSTER=1 cargo test --test integration remediation_accumulation::
//!
//! Without `KUBECONFIG` every test is skipped with a message.

use crate::common;
use crate::remediation_support;

use common::*;
use k8s_openapi::api::batch::v1::Job;
use kube::{Client, ResourceExt};
use remediation_support::*;
use serde_json::{json, Value};

/// `shrink_policy`, keeping the global batch through `GRAD_ACCUM_STEPS`.
fn keep_global_policy() -> Value {
    let mut p = shrink_policy(false);
    p["actions"][0]["scaleBatch"]["accumulation"] = json!({"env": "GRAD_ACCUM_STEPS"});
    p["actions"][0]["scaleBatch"]["minimum"] = json!(1);
    p
}

/// Drives one Job critical and waits for its recreation and `Done` record;
/// returns the new Job's (micro, accumulation) and the record's action.
async fn remediate(client: &Client, ns: &str, env: Value) -> (Job, String) {
    let operator = start_operator(client, ns);
    apply_policy(client, ns, "keep", keep_global_policy())
        .await
        .unwrap();
    let old = training_job_with_env(client, ns, "train", env).await;
    let old_uid = old.uid().unwrap();
    low_report(client, ns, "train").await;
    profile_with_status(client, ns, "train").await;
    critical_report(client, ns, "train", 100).await;
    let new = eventually("the Job recreated", || async {
        match job(client, ns, "train").await {
            Some(j) if j.uid().as_deref() != Some(old_uid.as_str()) => Ok(j),
            other => Err(format!("{:?}", other.map(|j| j.uid()))),
        }
    })
    .await;
    let recs = eventually("the record Done", || async {
        let recs = records(client, ns, "train").await;
        match recs.as_slice() {
            [r] if r.phase == "Done" => Ok(recs),
            _ => Err(format!("{recs:?}")),
        }
    })
    .await;
    operator.stop().await;
    (new, recs[0].action.clone())
}

#[tokio::test]
async fn accumulation_keeps_the_global_batch_exactly_when_it_divides() {
    let Some(client) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&client).await;
    let ns = ns.name.as_str();
    // 32 × 1; the factor 0.75 allows 24, which does not divide 32: 16 × 2 does.
    // The trainer does not set GRAD_ACCUM_STEPS: it counts as 1 and is added.
    let env = json!([{"name": "BATCH_SIZE", "value": "32"}, {"name": "LR", "value": "0.001"}]);
    let (new, action) = remediate(&client, ns, env).await;
    assert_eq!(action, "scaleBatch BATCH_SIZE×GRAD_ACCUM_STEPS 32×1 → 16×2");
    assert_eq!(env_of(&new, "BATCH_SIZE").as_deref(), Some("16"));
    assert_eq!(env_of(&new, "GRAD_ACCUM_STEPS").as_deref(), Some("2"));
    assert_eq!(env_of(&new, "LR").as_deref(), Some("0.001"));
    let ann = new.annotations();
    assert_eq!(ann["memprof.dev/original-batch_size"], "32");
    assert_eq!(ann["memprof.dev/original-grad_accum_steps"], "1");
}

#[tokio::test]
async fn accumulation_takes_the_nearest_global_batch_above_and_says_so() {
    let Some(client) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&client).await;
    let ns = ns.name.as_str();
    // 7 × 2 = 14 per rank; the factor allows 5; no micro-batch in [3, 5]
    // divides 14: 3 steps of 5 = 15, the nearest not below 14.
    let env = json!([
        {"name": "BATCH_SIZE", "value": "7"},
        {"name": "GRAD_ACCUM_STEPS", "value": "2"},
    ]);
    let (new, action) = remediate(&client, ns, env).await;
    assert_eq!(
        action,
        "scaleBatch BATCH_SIZE×GRAD_ACCUM_STEPS 7×2 → 5×3 (batch per rank 14 → 15, nearest not below)"
    );
    assert_eq!(env_of(&new, "BATCH_SIZE").as_deref(), Some("5"));
    assert_eq!(env_of(&new, "GRAD_ACCUM_STEPS").as_deref(), Some("3"));
    assert_eq!(
        new.annotations()["memprof.dev/original-grad_accum_steps"],
        "2"
    );
}
