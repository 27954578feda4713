//! The sidecar binary against the real local control plane: it writes its
//! MemoryReport with server-side apply (labels, owner, field manager), the
//! report follows a simulated leak to high risk, writes stay within budget,
//! the report goes with its pod, and a sidecar without RBAC stays healthy.

use crate::common;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use kube::api::{Api, DeleteParams, PostParams};
use memprof::api::{
    DataSource, MemoryReport, RiskLevel, LABEL_JOB, LABEL_PROFILE, SIDECAR_MANAGER,
};
use std::io::Write;
use std::process::{Child, Command, Stdio};

/// A sidecar process, killed (by PID, through its handle) when dropped.
struct Sidecar {
    child: Child,
    port: u16,
    socket: common::AgentSocket,
    _scenario: tempfile_lite::TempFile,
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A file removed when dropped (no extra dependency for one temp file).
mod tempfile_lite {
    pub struct TempFile(pub std::path::PathBuf);
    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start_sidecar(ns: &str, pod: &Pod, scenario: &str, extra_env: &[(&str, &str)]) -> Sidecar {
    let path =
        std::env::temp_dir().join(format!("memprof-scenario-{}.yaml", common::random_suffix()));
    std::fs::File::create(&path)
        .unwrap()
        .write_all(scenario.as_bytes())
        .unwrap();
    let port = free_port();
    let socket = common::AgentSocket::new();
    let mut cmd = Command::new(common::sidecar_binary());
    cmd.args([
        "--backend",
        "sim",
        "--scenario",
        path.to_str().unwrap(),
        "--speed",
        "10",
        "--interval",
        "100ms",
    ])
    .args(["--listen", &format!("127.0.0.1:{port}")])
    .arg("--agent-socket")
    .arg(socket.path())
    .env("POD_NAME", pod.metadata.name.as_deref().unwrap())
    .env("POD_UID", pod.metadata.uid.as_deref().unwrap())
    .env("POD_NAMESPACE", ns)
    .env("NODE_NAME", "node-a")
    .env("MEMPROF_JOB_NAME", "train")
    .env("RANK", "5")
    .env("MEMPROF_HEARTBEAT_SECONDS", "60")
    .stdout(Stdio::null())
    .stderr(Stdio::inherit());
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    Sidecar {
        child: cmd.spawn().expect("memprof-sidecar starts"),
        port,
        socket,
        _scenario: tempfile_lite::TempFile(path),
    }
}

async fn create_pod(client: &kube::Client, ns: &str, name: &str) -> Pod {
    let pod = Pod {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "trainer".into(),
                image: Some("example.invalid/trainer".into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    // In a fresh namespace, 1.20 rejects pods until the token controller has
    // made the default service account's token: retry until it has.
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    common::eventually("the pod is admitted", || async {
        pods.create(&PostParams::default(), &pod)
            .await
            .map_err(|e| e.to_string())
    })
    .await
}

async fn metric(port: u16, name: &str) -> f64 {
    let body = get(port, "/metrics").await;
    body.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A minimal HTTP GET over loopback (no client dependency for two endpoints).
async fn get(port: u16, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return String::new();
    };
    let req = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).await.is_err() {
        return String::new();
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out).await;
    out
}

const LEAK: &str = "seed: 3\ndefault: { baseGiB: 30, amplitudeGiB: 8, periodSeconds: 2, noiseGiB: 0.1, leakMiBPerSecond: 60 }\n";

#[tokio::test]
async fn sidecar_writes_its_report_and_follows_a_leak_within_the_write_budget() {
    let Some(client) = common::cluster().await else {
        return;
    };
    let ns = common::TestNamespace::create(&client).await;
    let pod = create_pod(&client, &ns.name, "train-abcde").await;
    let sidecar = start_sidecar(&ns.name, &pod, LEAK, &[]);
    let reports: Api<MemoryReport> = Api::namespaced(client.clone(), &ns.name);

    let r = common::eventually("the sidecar's MemoryReport exists", || async {
        reports
            .get_opt("train-abcde")
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "no report yet".to_string())
    })
    .await;
    let labels = r.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get(LABEL_JOB).map(String::as_str), Some("train"));
    assert_eq!(labels.get(LABEL_PROFILE).map(String::as_str), Some("train"));
    let owner = &r
        .metadata
        .owner_references
        .as_ref()
        .expect("owned by its pod")[0];
    assert_eq!(
        (owner.kind.as_str(), Some(owner.uid.as_str())),
        ("Pod", pod.metadata.uid.as_deref())
    );
    let managers: Vec<_> = r
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.manager.clone())
        .collect();
    assert!(
        managers.contains(&SIDECAR_MANAGER.to_string()),
        "{managers:?}"
    );
    assert_eq!(r.spec.rank, Some(5));
    assert_eq!(r.spec.node_name.as_deref(), Some("node-a"));
    assert_eq!(r.spec.summary.source, DataSource::Sim);
    assert!(r
        .spec
        .conditions
        .iter()
        .any(|c| c.type_ == "GpuVisible" && c.is_true()));

    // 60 MiB/s simulated at 10x: the report reaches high risk with a time to OOM.
    let high = common::eventually("the report reaches high risk", || async {
        let r = reports
            .get("train-abcde")
            .await
            .map_err(|e| e.to_string())?;
        if r.spec.summary.risk >= RiskLevel::High {
            Ok(r)
        } else {
            Err(format!("risk {}", r.spec.summary.risk))
        }
    })
    .await;
    assert!(high.spec.gpus[0].time_to_oom_seconds.is_some());
    assert!(
        high.spec.gpus[0].leak_suspected
            || high.spec.gpus[0].growth_bytes_per_second > 50.0 * 1024.0 * 1024.0
    );
    // The timeline as stored: one packed string the CRD accepted (its
    // pattern and bound), growing with the leak; no objects beside it.
    let raw: kube::api::Api<kube::api::DynamicObject> = kube::api::Api::namespaced_with(
        client.clone(),
        &ns.name,
        &kube::api::ApiResource::erase::<MemoryReport>(&()),
    );
    let stored = raw.get("train-abcde").await.unwrap().data;
    let packed = stored["spec"]["gpus"][0]["packedTimeline"]
        .as_str()
        .unwrap_or_else(|| panic!("no packedTimeline: {stored}"));
    assert!(
        stored["spec"]["gpus"][0].get("timeline").is_none(),
        "{stored}"
    );
    let points = memprof::api::timeline::unpack(packed).unwrap();
    assert!(points.len() >= 2, "{packed}");
    // Growing: the highest point is above the first. (Not the newest: it
    // is the bucket still filling, which may hold one sample at a trough of
    // the saw-tooth, depending on when the report was read.)
    let highest = points.iter().map(|p| p.max).max().unwrap_or(0);
    assert!(highest > points[0].max, "{packed}");

    // Whatever happened, the sidecar did not write more than its budget allows:
    // first + risk changes (≤ 4) + memory moves at most every 5 s.
    let writes = metric(sidecar.port, "memprof_sidecar_report_writes_total").await;
    let elapsed = r.metadata.creation_timestamp.as_ref().map_or(30.0, |t| {
        (jiff::Timestamp::now().as_second() - t.0.as_second()).max(1) as f64
    });
    assert!(writes >= 2.0, "writes {writes}");
    assert!(
        writes <= 5.0 + elapsed / 5.0 + 1.0,
        "{writes} writes in {elapsed} s"
    );
    assert!(get(sidecar.port, "/healthz").await.contains("ok"));

    // The report goes with its pod (garbage collector, ownerReference).
    Api::<Pod>::namespaced(client.clone(), &ns.name)
        .delete("train-abcde", &DeleteParams::background().grace_period(0))
        .await
        .unwrap();
    drop(sidecar);
    common::eventually_within(
        common::GC_TIMEOUT,
        "the report is garbage-collected with its pod",
        || async {
            match reports.get_opt("train-abcde").await {
                Ok(None) => Ok(()),
                other => Err(format!("{:?}", other.map(|r| r.is_some()))),
            }
        },
    )
    .await;
}

#[tokio::test]
async fn a_sidecar_without_permission_says_so_and_stays_healthy() {
    let Some(client) = common::cluster().await else {
        return;
    };
    let ns = common::TestNamespace::create(&client).await;
    let pod = create_pod(&client, &ns.name, "train-noperm").await;
    // The pod's service account has no Role: impersonate it through a kubeconfig.
    let kubeconfig = std::env::var("KUBECONFIG").unwrap();
    let text = std::fs::read_to_string(&kubeconfig).unwrap();
    let mut cfg: serde_yaml_ng_free::Value = serde_yaml_from(&text);
    for user in cfg["users"].as_array_mut().unwrap() {
        user["user"]["as"] =
            serde_json::json!(format!("system:serviceaccount:{}:default", ns.name));
    }
    let path = std::env::temp_dir().join(format!("memprof-kubeconfig-{}", common::random_suffix()));
    std::fs::write(&path, serde_json::to_string(&cfg).unwrap()).unwrap();
    let _cleanup = tempfile_lite::TempFile(path.clone());
    let sidecar = start_sidecar(
        &ns.name,
        &pod,
        LEAK,
        &[("KUBECONFIG", path.to_str().unwrap())],
    );

    let port = sidecar.port;
    common::eventually("the sidecar counts forbidden writes", || async move {
        let n = metric(
            port,
            "memprof_sidecar_report_write_errors_total{reason=\"forbidden\"}",
        )
        .await;
        if n >= 1.0 {
            Ok(())
        } else {
            Err(format!("{n} forbidden writes"))
        }
    })
    .await;
    assert!(get(port, "/healthz").await.contains("ok"), "still healthy");
    let (code, local) =
        common::socket_request(&sidecar.socket.path(), "GET", "/v1/report", "").await;
    assert!(
        code == 200 && local.contains("\"podName\""),
        "the report is still served locally, on the agent socket: {local}"
    );
    let reports: Api<MemoryReport> = Api::namespaced(client.clone(), &ns.name);
    assert!(reports.get_opt("train-noperm").await.unwrap().is_none());
}

/// kubeconfig is YAML; JSON is YAML too, so read it into JSON values and write JSON back.
mod serde_yaml_ng_free {
    pub type Value = serde_json::Value;
}
fn serde_yaml_from(text: &str) -> serde_json::Value {
    serde_yaml::from_str(text).expect("kubeconfig is YAML")
}
