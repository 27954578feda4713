//! What the agent end-to-end tests share: a real `memprof-sidecar` for one
//! pod of a Job named `train`, and agent pushes posted to its agent socket
//! (contract A: HTTP/1.1 over a Unix socket, never TCP).

use crate::common::{socket_request, AgentSocket};
use std::process::{Child, Command, Stdio};

/// A sidecar process, killed (by PID, through its handle) when dropped, and
/// its socket's private directory; the webhook that marks its writes and
/// the kubeconfig of its pod-bound token go with it.
pub struct Sidecar(
    Child,
    AgentSocket,
    #[allow(dead_code)] // held: the webhook serves while the sidecar runs
    crate::webhook_support::Writers,
    std::path::PathBuf,
);

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let _ = std::fs::remove_file(&self.3);
    }
}

impl Sidecar {
    /// Its agent socket.
    pub fn socket(&self) -> std::path::PathBuf {
        self.1.path()
    }
}

/// Starts a sidecar for the pod (rank 0 of Job `train`, NVML backend, a
/// 100 ms interval, a 5 s heartbeat) and waits until its socket answers. It
/// writes with a token bound to the pod, and the webhook marks its writes
/// as the pod's own, so the operator counts its report.
pub async fn start(client: &kube::Client, pod: &str, uid: &str, namespace: &str) -> Sidecar {
    memprof::operator::ensure_reporter_rbac(client, namespace, "default")
        .await
        .expect("reporter RBAC");
    let ring = crate::common::admission_keys(namespace).await;
    let writers = crate::webhook_support::serve_writers(client, namespace, ring).await;
    let kubeconfig = crate::common::kubeconfig_bound_to(client, namespace, pod, uid).await;
    let socket = AgentSocket::new();
    let child = Command::new(crate::common::sidecar_binary())
        .env("KUBECONFIG", &kubeconfig)
        .args(["--backend", "nvml", "--interval", "100ms"])
        .args(["--listen", "127.0.0.1:0"])
        .arg("--agent-socket")
        .arg(socket.path())
        .env("POD_NAME", pod)
        .env("POD_UID", uid)
        .env("POD_NAMESPACE", namespace)
        .env("NODE_NAME", "node-a")
        .env("MEMPROF_JOB_NAME", "train")
        .env("RANK", "0")
        .env("MEMPROF_HEARTBEAT_SECONDS", "5")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("memprof-sidecar starts");
    let sidecar = Sidecar(child, socket, writers, kubeconfig);
    let path = sidecar.socket();
    crate::common::eventually("the sidecar serves its socket", || async {
        match socket_request(&path, "GET", "/healthz", "").await.0 {
            200 => Ok(()),
            code => Err(format!("GET /healthz: {code}")),
        }
    })
    .await;
    sidecar
}

/// Posts one agent push (the JSON of docs/agent-wire.md) to the sidecar's socket;
/// returns the status code and the whole response (its body the sidecar's
/// answer, contract B).
pub async fn push(sidecar: &Sidecar, body: &serde_json::Value) -> (u16, String) {
    socket_request(&sidecar.socket(), "POST", "/v1/agent", &body.to_string()).await
}

/// The set-up the agent end-to-end tests share: a namespace, an operator
/// watching it, Job `train` with one pod, and a sidecar for that pod. The
/// fields stop everything when dropped (the sidecar first).
pub struct OneRank {
    /// The Job's pod.
    pub pod: k8s_openapi::api::core::v1::Pod,
    /// The pod's sidecar.
    pub sidecar: Sidecar,
    /// The operator watching the namespace.
    pub operator: crate::common::RunningOperator,
    /// The test's namespace.
    pub ns: crate::common::TestNamespace,
}

/// [`OneRank`] on the local control plane.
pub async fn one_rank(client: &kube::Client) -> OneRank {
    use kube::ResourceExt;
    let ns = crate::common::TestNamespace::create(client).await;
    let operator = crate::common::start_operator(client, &ns.name);
    crate::common::create_job(client, &ns.name, "train", 1, true).await;
    let pod = crate::common::job_pods(client, &ns.name, "train", 1)
        .await
        .remove(0);
    let sidecar = start(client, &pod.name_any(), &pod.uid().unwrap(), &ns.name).await;
    OneRank {
        pod,
        sidecar,
        operator,
        ns,
    }
}
