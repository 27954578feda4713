//! The sidecar half of `notifyTrainer` and the allocation sites, with the
//! real `memprof-sidecar` binary against the local control plane:
//! - directives written into a MemoryReport's `status.directives` (as the
//!   operator will) reach the trainer in the push answer; the trainer's ack
//!   lands in the report's `spec.agentAcks`;
//! - the sidecar does this as the pod's own identity (the reporter Role the
//!   operator grants: no list/watch, so it reads its one report), and with
//!   a watch where it may;
//! - that identity cannot write `memoryreports/status`: a pod cannot forge
//!   directives for itself or another rank;
//! - a push's allocation-site snapshot lands in the report, file and line.
//!
//! Run:
//!
//!     eval "$(bash hack/local-cluster.sh env)"
//!     MEMPROF_REQUIRE_CLUSTER=1 cargo test --test integration sidecar_directives::

use crate::common;
use crate::sidecar_support;

use common::{eventually, socket_request};
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use memprof::api::MemoryReport;
use serde_json::{json, Value};
use sidecar_support::{kubeconfig_as_pod, start, Sidecar};

/// A push of process 4242, one device, with these extra fields.
fn push(extra: Value) -> String {
    let mut b = json!({
        "version": 1, "time": jiff::Timestamp::now().as_second() as f64, "pid": 4242, "rank": 0,
        "devices": [{"index": 0, "uuid": "GPU-directives", "allocatedBytes": 2_000_000_000u64,
                     "reservedBytes": 3_000_000_000u64, "freeBytes": 70_000_000_000u64,
                     "totalBytes": 80_000_000_000u64}],
    });
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b.to_string()
}

/// The JSON body of an HTTP response.
fn body(response: &str) -> Value {
    let text = response.split("\r\n\r\n").nth(1).unwrap_or_default();
    serde_json::from_str(text).unwrap_or(Value::Null)
}

async fn pod(client: &Client, ns: &str) -> (String, String) {
    common::create_job(client, ns, "train", 1, true).await;
    let pod = common::job_pods(client, ns, "train", 1).await.remove(0);
    (pod.name_any(), pod.uid().unwrap())
}

/// Directives written into the report's status reach the push answer; the
/// ack of the next push reaches the report; a sites snapshot reaches it too.
async fn directive_round_trip(client: &Client, ns: &str, sidecar: &Sidecar, name: &str) {
    let reports: Api<MemoryReport> = Api::namespaced(client.clone(), ns);
    eventually("the sidecar's report exists", || async {
        socket_request(
            &sidecar.socket.path(),
            "POST",
            "/v1/agent",
            &push(json!({})),
        )
        .await;
        reports
            .get_opt(name)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "none yet".to_string())
    })
    .await;
    // What the operator's notifyTrainer will write (the status subresource).
    let status = json!({"status": {"directives": [{
        "id": "train/abc/critical", "kind": "notifyTrainer", "level": "critical",
        "reason": "risk critical on rank 0"}]}});
    reports
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("the operator's identity writes status.directives");
    let answer = eventually("the directive in the push answer", || async {
        let (code, resp) = socket_request(
            &sidecar.socket.path(),
            "POST",
            "/v1/agent",
            &push(json!({})),
        )
        .await;
        let b = body(&resp);
        match b["directives"].as_array() {
            Some(d) if code == 200 && !d.is_empty() => Ok(b),
            _ => Err(format!("{code}: {b}")),
        }
    })
    .await;
    assert_eq!(answer["directives"][0]["id"], "train/abc/critical");
    assert_eq!(answer["directives"][0]["level"], "critical");

    let acked = json!({
        "acks": [{"id": "train/abc/critical", "action": "micro-batch 32 -> 16, accumulation 1 -> 2", "ok": true}],
        "sites": {"time": jiff::Timestamp::now().as_second() as f64, "level": "critical", "source": "history",
                  "unattributedBytes": 1000,
                  "blocks": [{"sizeBytes": 3_000_000_000u64, "state": "active_allocated", "count": 300,
                              "frames": [{"filename": "/app/train.py", "line": 88, "name": "forward"}]},
                             {"sizeBytes": 500, "state": "active_allocated", "frames": []}]},
    });
    let (code, resp) =
        socket_request(&sidecar.socket.path(), "POST", "/v1/agent", &push(acked)).await;
    assert_eq!(code, 200, "{resp}");
    let r = eventually("the ack and the sites in the report", || async {
        let r = reports.get(name).await.map_err(|e| e.to_string())?;
        let has = !r.spec.agent_acks.is_empty() && r.spec.allocation_sites.is_some();
        has.then_some(r).ok_or_else(|| "not yet".to_string())
    })
    .await;
    let ack = &r.spec.agent_acks[0];
    assert_eq!(
        (ack.id.as_str(), ack.ok, ack.rank),
        ("train/abc/critical", true, Some(0))
    );
    assert_eq!(ack.action, "micro-batch 32 -> 16, accumulation 1 -> 2");
    let sites = r.spec.allocation_sites.unwrap();
    assert_eq!(sites.source, "history");
    assert_eq!(sites.sites.len(), 1);
    let s = &sites.sites[0];
    assert_eq!(
        (s.file.as_str(), s.line, s.function.as_str()),
        ("/app/train.py", 88, "forward")
    );
    assert_eq!((s.bytes, s.blocks), (3_000_000_000, 300));
    assert_eq!(sites.unattributed_bytes, 1500);

    // Withdrawn by the operator: gone from the answer.
    let none = json!({"status": {"directives": []}});
    reports
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&none))
        .await
        .unwrap();
    eventually("the directive withdrawn", || async {
        let (_, resp) = socket_request(
            &sidecar.socket.path(),
            "POST",
            "/v1/agent",
            &push(json!({})),
        )
        .await;
        let b = body(&resp);
        (b["directives"] == json!([]))
            .then_some(())
            .ok_or(format!("{b}"))
    })
    .await;
}

#[tokio::test]
async fn directives_reach_the_trainer_and_acks_the_report_as_the_pods_own_identity() {
    let Some(client) = common::cluster().await else {
        return;
    };
    let ns = common::TestNamespace::create(&client).await;
    memprof::operator::ensure_reporter_rbac(&client, &ns.name, "default")
        .await
        .expect("reporter RBAC");
    let (name, uid) = pod(&client, &ns.name).await;
    let sidecar = start(&name, &uid, &ns.name, Some(kubeconfig_as_pod(&ns.name))).await;
    directive_round_trip(&client, &ns.name, &sidecar, &name).await;
}

#[tokio::test]
async fn directives_reach_the_trainer_through_a_watch_where_one_is_allowed() {
    let Some(client) = common::cluster().await else {
        return;
    };
    let ns = common::TestNamespace::create(&client).await;
    let (name, uid) = pod(&client, &ns.name).await;
    let sidecar = start(&name, &uid, &ns.name, None).await;
    directive_round_trip(&client, &ns.name, &sidecar, &name).await;
}

#[tokio::test]
async fn the_pods_identity_cannot_write_directives() {
    let Some(client) = common::cluster().await else {
        return;
    };
    let ns = common::TestNamespace::create(&client).await;
    let ns = ns.name.as_str();
    memprof::operator::ensure_reporter_rbac(&client, ns, "default")
        .await
        .expect("reporter RBAC");
    let mut cfg = kube::Config::infer().await.unwrap();
    cfg.auth_info.impersonate = Some(format!("system:serviceaccount:{ns}:default"));
    cfg.auth_info.impersonate_groups = Some(vec![
        "system:serviceaccounts".into(),
        format!("system:serviceaccounts:{ns}"),
        "system:authenticated".into(),
    ]);
    let pod_client = Client::try_from(cfg).unwrap();
    let as_pod: Api<MemoryReport> = Api::namespaced(pod_client, ns);
    // The identity may write reports (so a refusal below is about status)…
    let report = common::report("train", 0, &common::at(0), vec![]);
    let name = report.name_any();
    as_pod
        .patch(
            &name,
            &PatchParams::apply(memprof::api::SIDECAR_MANAGER),
            &Patch::Apply(&report),
        )
        .await
        .expect("the reporter Role writes a report");
    // …but not their status, where directives live.
    let forged = json!({"status": {"directives": [{"id": "forged", "kind": "notifyTrainer", "level": "critical", "reason": "x"}]}});
    let err = as_pod
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&forged))
        .await
        .expect_err("a pod must not write status.directives");
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 403),
        "{err}"
    );
    // Nor through the main resource: the status subresource drops it.
    as_pod
        .patch(&name, &PatchParams::default(), &Patch::Merge(&forged))
        .await
        .expect("the main resource accepts the patch, without its status");
    let r = Api::<MemoryReport>::namespaced(client, ns)
        .get(&name)
        .await
        .unwrap();
    assert!(r
        .status
        .map(|s| s.directives)
        .unwrap_or_default()
        .is_empty());
}
