//! `notifyTrainer` end to end, every part real but the GPU: the operator's
//! policy writes the directive into the pod's MemoryReport status; the real
//! `memprof-sidecar`, running as the pod's own identity, reads it and hands
//! it to the real Python agent (`agent/python`, over a fake torch) in its
//! push answer; the trainer's `on_risk` callback runs at its next step and
//! the agent acknowledges; the sidecar writes the ack into the report; the
//! operator's record says the rank acknowledged, with what it did.
//!
//!     eval "$(bash hack/local-cluster.sh env)"
//!     MEMPROF_REQUIRE_CLUSTER=1 cargo test --test integration notify_end_to_end::
//!
//! Needs `python3` (the agent has no dependency beyond the standard library;
//! the fake torch is the agent tests' own). Without `KUBECONFIG` the test is
//! skipped with a message.

use crate::common;
use crate::remediation_support;
use crate::sidecar_support;
use crate::webhook_support;

use common::*;
use remediation_support::{apply_policy, records};
use serde_json::json;
use sidecar_support::start;
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The trainer: the agent with one `on_risk` callback at critical that says
/// what it did, stepping every 50 ms until killed.
const TRAINER: &str = r#"
import sys, time
import fake_torch
fake_torch.install()
import memprof_agent

def split(event):
    print("callback %s %s" % (event.level, event.directive), flush=True)
    return "split micro-batch 16 x 2 -> 8 x 4, global batch kept"

memprof_agent.on_risk("critical", split)
assert memprof_agent.start(interval=0.1, socket=sys.argv[1])
step = 0
while True:
    step += 1
    memprof_agent.step(step)
    time.sleep(0.05)
"#;

/// A Python process killed (by PID, through its handle) when dropped.
struct Trainer(Child);

impl Trainer {
    fn start(socket: &std::path::Path) -> Trainer {
        let root = env!("CARGO_MANIFEST_DIR");
        let path = format!("{root}/agent/python:{root}/agent/python/tests");
        let child = Command::new("python3")
            .args(["-c", TRAINER])
            .arg(socket)
            .env("PYTHONPATH", path)
            .env_remove("MEMPROF_AGENT_SOCKET")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3 runs the agent");
        Trainer(child)
    }

    /// Stops the trainer and returns what it printed.
    fn stop(mut self) -> String {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let mut out = String::new();
        if let Some(mut s) = self.0.stdout.take() {
            let _ = s.read_to_string(&mut out);
        }
        out
    }
}

impl Drop for Trainer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn a_directive_reaches_the_real_agent_and_its_ack_reaches_the_record() {
    let Some(client) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&client).await;
    let ns = ns.name.as_str();
    memprof::operator::ensure_reporter_rbac(&client, ns, "default")
        .await
        .expect("reporter RBAC");
    let operator = start_operator(&client, ns);
    // Fires as soon as the Job's profile has a status: the test is about the
    // channel, not the risk analysis.
    let policy = json!({
        "selector": {},
        "triggers": [{"riskAtLeast": {"level": "none"}}],
        "actions": [{"notifyTrainer": {"level": "critical"}}],
        "maxRemediations": 1,
    });
    apply_policy(&client, ns, "tell", policy).await.unwrap();
    create_job(&client, ns, "train", 1, true).await;
    let pod = job_pods(&client, ns, "train", 1).await.remove(0);
    let (name, uid) = (
        pod.metadata.name.clone().unwrap(),
        pod.metadata.uid.clone().unwrap(),
    );
    // The sidecar writes as its pod (a bound token), and the webhook marks
    // those writes: only then does the report, and the ack in it, count.
    let _writers = webhook_support::serve_writers(&client, ns, admission_keys(ns).await).await;
    let kubeconfig = kubeconfig_bound_to(&client, ns, &name, &uid).await;
    let sidecar = start(&name, &uid, ns, Some(kubeconfig)).await;
    let trainer = Trainer::start(&sidecar.socket.path());

    let record = eventually_within(
        Duration::from_secs(90),
        "the record says rank 0 acknowledged",
        || async {
            let recs = records(&client, ns, "train").await;
            let acked = recs.iter().find(|r| {
                r.acknowledged
                    .as_ref()
                    .is_some_and(|a| a.ok == 1 && a.pending == 0)
            });
            acked.cloned().ok_or_else(|| format!("{recs:?}"))
        },
    )
    .await;
    let printed = trainer.stop();
    let a = record.acknowledged.as_ref().unwrap();
    assert_eq!((a.delivered, a.ok, a.failed), (1, 1, 0), "{a:?}");
    assert!(a.summary.starts_with("1/1 acknowledged"), "{a:?}");
    assert_eq!(record.action, "notifyTrainer critical");
    // The callback ran once, at the directive's level, for the record's directive.
    let callbacks: Vec<&str> = printed
        .lines()
        .filter(|l| l.starts_with("callback"))
        .collect();
    assert_eq!(
        callbacks,
        [format!("callback critical {}", record.id).as_str()],
        "{printed}"
    );
    // The ack in the report is the trainer's own words.
    let report: kube::Api<memprof::api::MemoryReport> = kube::Api::namespaced(client.clone(), ns);
    let acks = report.get(&name).await.unwrap().spec.agent_acks;
    assert!(
        acks.iter().any(|k| k.id == record.id
            && k.ok
            && k.action == "split micro-batch 16 x 2 -> 8 x 4, global batch kept"),
        "{acks:?}"
    );
    drop(sidecar);
    operator.stop().await;
}
