//! `notifyTrainer` against a real control plane: a policy
//! fires on a Job of three ranks, the operator writes one directive into
//! every counted rank's MemoryReport status (never into the report of a pod
//! the Job's controller did not create), simulated sidecars write their
//! agents' acknowledgements into `spec.agentAcks`, and the record tallies
//! exactly what the counted ranks answered, across an operator restart
//! without writing any directive twice.
//!
//!     eval "$(bash hack/local-cluster.sh env)"
//!     MEMPROF_REQUIRE_CLUSTER=1 cargo test --test integration remediation_notify::
//!
//! Without `KUBECONFIG` every test is skipped with a message.

use crate::common;
use crate::remediation_support;

use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use memprof::api::admission::LABEL_MANAGED;
use memprof::api::{Acknowledgements, AgentAck, MemoryReport, RemediationRecord, RiskLevel};
use remediation_support::*;
use serde_json::json;
use std::time::Duration;

/// Critical risk on any managed Job: tell its trainers, once.
fn notify_policy() -> serde_json::Value {
    json!({
        "selector": {"matchLabels": {LABEL_MANAGED: "true"}},
        "triggers": [{"riskAtLeast": {"level": "critical"}}],
        "actions": [{"notifyTrainer": {"level": "critical"}}],
        "cooldownSeconds": 600,
        "maxRemediations": 1,
    })
}

/// A pod someone created by hand, labelled as the Job's: no controller
/// reference, no admission mark. Its report claims rank 3 of the Job.
async fn hand_made_pod(client: &Client, ns: &str, job: &str) -> Pod {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": format!("{job}-planted"),
                     "labels": {"job-name": job, LABEL_MANAGED: "true"}},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "trainer", "image": "busybox"}]},
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await
        .expect("creating the hand-made pod")
}

/// Rank `rank`'s report on `pod`, with these acknowledgements (what its sidecar writes).
fn rank(pod: &Pod, rank: u32, risk: RiskLevel, acks: &[(&str, bool)]) -> MemoryReport {
    let (used, tto) = match risk {
        RiskLevel::Critical => (79, Some(5.0)),
        _ => (30, None),
    };
    let mut r = pod_report(
        pod,
        "train",
        rank,
        &at(10),
        vec![gpu(rank, used, used, risk, tto)],
    );
    r.spec.agent_acks = acks
        .iter()
        .map(|(id, ok)| AgentAck {
            id: id.to_string(),
            action: if *ok {
                "split 16x1 -> 8x2"
            } else {
                "no loop helper"
            }
            .into(),
            ok: *ok,
            time: at(20),
            pid: Some(100 + rank),
            rank: Some(rank),
        })
        .collect();
    r
}

/// The directives in report `name`'s status: (id, level) of each.
async fn directives(client: &Client, ns: &str, name: &str) -> Vec<(String, RiskLevel)> {
    let r = Api::<MemoryReport>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .unwrap();
    r.status
        .map(|s| s.directives)
        .unwrap_or_default()
        .into_iter()
        .map(|d| (d.id, d.level))
        .collect()
}

async fn the_record(client: &Client, ns: &str) -> RemediationRecord {
    eventually("one Done notifyTrainer record", || async {
        match records(client, ns, "train").await.as_slice() {
            [r] if r.phase == "Done" => Ok(r.clone()),
            other => Err(format!("{other:?}")),
        }
    })
    .await
}

async fn tally_becomes(client: &Client, ns: &str, want: &Acknowledgements) -> RemediationRecord {
    eventually("the record's tally", || async {
        let recs = records(client, ns, "train").await;
        match recs.first() {
            Some(r) if r.acknowledged.as_ref() == Some(want) => Ok(r.clone()),
            other => Err(format!("{:?}", other.map(|r| &r.acknowledged))),
        }
    })
    .await
}

#[tokio::test]
async fn notify_trainer_reaches_every_counted_rank_once_and_the_record_tallies_their_answers() {
    let Some(client) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&client).await;
    let ns = ns.name.as_str();
    let operator = start_operator(&client, ns);
    apply_policy(&client, ns, "tell", notify_policy())
        .await
        .unwrap();
    create_job(&client, ns, "train", 3, true).await;
    let pods = job_pods(&client, ns, "train", 3).await;
    let planted = hand_made_pod(&client, ns, "train").await;
    for (i, pod) in pods.iter().enumerate() {
        apply_report(&client, ns, &rank(pod, i as u32, RiskLevel::Low, &[])).await;
    }
    apply_report(&client, ns, &rank(&planted, 3, RiskLevel::Low, &[])).await;
    profile_with_status(&client, ns, "train").await;
    apply_report(&client, ns, &rank(&pods[0], 0, RiskLevel::Critical, &[])).await;

    let rec = the_record(&client, ns).await;
    assert_eq!(rec.action, "notifyTrainer critical");
    let id = rec.id.clone();
    for pod in &pods {
        let got = directives(&client, ns, &pod.name_any()).await;
        assert_eq!(
            got,
            [(id.clone(), RiskLevel::Critical)],
            "{}",
            pod.name_any()
        );
    }
    let planted_name = planted.name_any();
    assert!(
        directives(&client, ns, &planted_name).await.is_empty(),
        "not admitted: no directive"
    );
    assert_eq!(
        operator.remediation_metrics.directive_writes.get(),
        3,
        "one write per rank"
    );
    let first = rec.acknowledged.clone().expect("a tally from the start");
    assert_eq!(
        (first.delivered, first.ok, first.failed, first.pending),
        (3, 0, 0, 3)
    );
    assert_eq!(first.summary, "0/3 acknowledged (3 pending: ranks 0, 1, 2)");

    // Rank 0's trainer did it, rank 1's could not, rank 2 runs no agent;
    // the hand-made pod's "trainer" claims it did: it is no rank.
    apply_report(
        &client,
        ns,
        &rank(&pods[0], 0, RiskLevel::Critical, &[(&id, true)]),
    )
    .await;
    apply_report(
        &client,
        ns,
        &rank(&pods[1], 1, RiskLevel::Low, &[(&id, false)]),
    )
    .await;
    apply_report(
        &client,
        ns,
        &rank(&planted, 3, RiskLevel::Low, &[(&id, true)]),
    )
    .await;
    let want = Acknowledgements {
        delivered: 3,
        ok: 1,
        failed: 1,
        pending: 1,
        failed_ranks: vec![1],
        pending_ranks: vec![2],
        summary: "2/3 acknowledged (1 failed: rank 1; 1 pending: rank 2)".into(),
        ..Default::default()
    };
    tally_becomes(&client, ns, &want).await;

    // A restarted operator finds every directive written: none twice.
    operator.stop().await;
    let operator = start_operator(&client, ns);
    apply_report(&client, ns, &rank(&pods[2], 2, RiskLevel::Critical, &[])).await;
    stays(
        "one directive per rank, one record",
        Duration::from_secs(4),
        || async {
            for pod in &pods {
                let got = directives(&client, ns, &pod.name_any()).await;
                if got.len() != 1 {
                    return Err(format!("{}: {got:?}", pod.name_any()));
                }
            }
            match records(&client, ns, "train").await.len() {
                1 => Ok(()),
                n => Err(format!("{n} records")),
            }
        },
    )
    .await;
    assert_eq!(operator.remediation_metrics.directive_writes.get(), 0);
    // The restarted operator keeps the tally going: rank 2's agent answers late.
    apply_report(
        &client,
        ns,
        &rank(&pods[2], 2, RiskLevel::Critical, &[(&id, true)]),
    )
    .await;
    let want = Acknowledgements {
        ok: 2,
        pending: 0,
        pending_ranks: vec![],
        summary: "3/3 acknowledged (1 failed: rank 1)".into(),
        ..want
    };
    tally_becomes(&client, ns, &want).await;
    operator.stop().await;
}
