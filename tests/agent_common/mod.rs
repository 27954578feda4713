//! What the agent end-to-end tests share: a real `memprof-sidecar` for one
//! pod of a Job named `train`, and agent pushes posted to it.

use std::process::{Child, Command, Stdio};

/// A sidecar process, killed (by PID, through its handle) when dropped.
pub struct Sidecar(Child);

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts a sidecar for the pod (rank 0 of Job `train`, NVML backend, a
/// 100 ms interval, a 5 s heartbeat) and waits until it listens; returns it
/// and its port.
pub async fn start(pod: &str, uid: &str, namespace: &str) -> (Sidecar, u16) {
    let port = free_port();
    let sidecar = Sidecar(
        Command::new(crate::common::sidecar_binary())
            .args(["--backend", "nvml", "--interval", "100ms"])
            .args(["--listen", &format!("127.0.0.1:{port}")])
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
            .expect("memprof-sidecar starts"),
    );
    crate::common::eventually("the sidecar listens", || async {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .await;
    (sidecar, port)
}

/// Posts one agent push (the JSON of docs/agent.md); returns the status code
/// and the whole response.
pub async fn push(port: u16, body: &serde_json::Value) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = body.to_string();
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let req = format!(
        "POST /v1/agent HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let code = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, out)
}
