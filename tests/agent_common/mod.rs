//! What the agent end-to-end tests share: a real `memprof-sidecar` for one
//! pod of a Job named `train`, and agent pushes posted to its agent socket
//! (contract A: HTTP/1.1 over a Unix socket, never TCP).

use crate::common::{socket_request, AgentSocket};
use std::process::{Child, Command, Stdio};

/// A sidecar process, killed (by PID, through its handle) when dropped, and
/// its socket's private directory.
pub struct Sidecar(Child, AgentSocket);

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Sidecar {
    /// Its agent socket.
    pub fn socket(&self) -> std::path::PathBuf {
        self.1.path()
    }
}

/// Starts a sidecar for the pod (rank 0 of Job `train`, NVML backend, a
/// 100 ms interval, a 5 s heartbeat) and waits until its socket answers.
pub async fn start(pod: &str, uid: &str, namespace: &str) -> Sidecar {
    let socket = AgentSocket::new();
    let child = Command::new(crate::common::sidecar_binary())
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
    let sidecar = Sidecar(child, socket);
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

/// Posts one agent push (the JSON of docs/agent.md) to the sidecar's socket;
/// returns the status code and the whole response (its body the sidecar's
/// answer, contract B).
pub async fn push(sidecar: &Sidecar, body: &serde_json::Value) -> (u16, String) {
    socket_request(&sidecar.socket(), "POST", "/v1/agent", &body.to_string()).await
}
