//! A `memprof-sidecar --standalone` child, as `memprof profile` and
//! `memprof oom --monitor` drive it: its risk transitions come from its
//! standard output (one JSON line each), its latest report from its own
//! `GET /v1/report` on its agent socket, its samples from the `--trace-out`
//! CSV it writes.
//!
//! The agent socket lives in a [`PrivateDir`] (mode 0700, removed at exit):
//! only this user's processes can push to the sidecar or read its report,
//! as only the pod's containers can in a cluster (docs/agent-wire.md, "Transport").

use super::ProfileError;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use memprof_api::{MemoryReportSpec, RiskLevel};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio::io::AsyncBufReadExt;
use tokio::sync::mpsc;

/// A directory only this user can enter (mode 0700), created afresh (never
/// one that already exists, which someone else could have made) and removed
/// with what it holds when dropped: where the sidecar's agent socket lives.
/// `tempfile` makes it so (a fresh name, mode 0700 asked for, removal on drop).
#[derive(Debug)]
pub struct PrivateDir(tempfile::TempDir);

impl PrivateDir {
    /// A new directory `memprof-WHAT-…` under the temporary directory.
    pub fn new(what: &str) -> Result<PrivateDir, ProfileError> {
        use std::os::unix::fs::PermissionsExt;
        let base = std::env::temp_dir();
        tempfile::Builder::new()
            .prefix(&format!("memprof-{what}-"))
            .permissions(std::fs::Permissions::from_mode(0o700))
            .tempdir_in(&base)
            .map(PrivateDir)
            .map_err(|error| ProfileError::PrivateDir { dir: base, error })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        self.0.path()
    }

    /// The agent socket's path in it.
    pub fn socket(&self) -> PathBuf {
        self.0.path().join("agent.sock")
    }
}

/// A risk transition the sidecar printed (`"event":"risk"`).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Transition {
    /// Seconds since the sidecar started, in the trace's time (scaled by `--speed`).
    pub elapsed_seconds: f64,
    /// Worst risk before.
    pub from: RiskLevel,
    /// Worst risk now.
    pub to: RiskLevel,
    /// The GPU with the worst risk.
    #[serde(default)]
    pub gpu: Option<u32>,
    /// Its used memory.
    #[serde(default)]
    pub used_bytes: Option<u64>,
    /// Its growth.
    #[serde(default)]
    pub growth_bytes_per_second: Option<f64>,
    /// Its predicted time to OOM.
    #[serde(default)]
    pub time_to_oom_seconds: Option<f64>,
}

/// Parses one line of the sidecar's standard output; None for anything
/// that is not a risk transition.
pub fn parse_transition(line: &str) -> Option<Transition> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    if v.get("event")?.as_str()? != "risk" {
        return None;
    }
    serde_json::from_value(v).ok()
}

/// The running sidecar.
pub struct Sidecar {
    child: tokio::process::Child,
    /// Its agent socket: `POST /v1/agent`, `GET /v1/report`.
    pub socket: PathBuf,
    /// Its risk transitions, as printed.
    pub transitions: mpsc::UnboundedReceiver<Transition>,
}

/// The sidecar binary next to this one.
pub fn sidecar_exe() -> Result<std::path::PathBuf, ProfileError> {
    std::env::current_exe()
        .map(|p| p.with_file_name("memprof-sidecar"))
        .map_err(|error| ProfileError::Sidecar {
            path: "memprof-sidecar".into(),
            error,
        })
}

/// A free loopback address for the sidecar's `/healthz` and `/metrics`.
pub fn free_loopback() -> Result<String, ProfileError> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(ProfileError::Port)?;
    Ok(l.local_addr().map_err(ProfileError::Port)?.to_string())
}

impl Sidecar {
    /// Starts `exe --standalone ARGS --listen ADDR --agent-socket SOCKET` and
    /// waits until its socket answers.
    pub async fn start(
        exe: &Path,
        args: &[String],
        addr: &str,
        socket: &Path,
    ) -> Result<Sidecar, ProfileError> {
        let mut cmd = tokio::process::Command::new(exe);
        // Its info logs would scroll the live display away; warnings stay.
        // Not its "no GPU visible" error: the CLI says that itself, in one
        // line with what to do (profile::blind_line).
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "warn,memprof_sidecar::gpus=off");
        }
        let mut child = cmd
            .arg("--standalone")
            .args(args)
            .args(["--listen", addr])
            .arg("--agent-socket")
            .arg(socket)
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|error| ProfileError::Sidecar {
                path: exe.to_path_buf(),
                error,
            })?;
        let (tx, transitions) = mpsc::unbounded_channel();
        if let Some(out) = child.stdout.take() {
            tokio::spawn(async move {
                let mut lines = tokio::io::BufReader::new(out).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if let Some(t) = parse_transition(&line) {
                        let _ = tx.send(t);
                    }
                }
            });
        }
        let mut s = Sidecar {
            child,
            socket: socket.to_path_buf(),
            transitions,
        };
        s.wait_listening().await?;
        Ok(s)
    }

    async fn wait_listening(&mut self) -> Result<(), ProfileError> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let not_listening = |why: String| ProfileError::NotListening {
            addr: self.socket.display().to_string(),
            why,
        };
        loop {
            if tokio::net::UnixStream::connect(&self.socket).await.is_ok() {
                return Ok(());
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(not_listening(format!("it exited: {status}")));
            }
            if Instant::now() >= deadline {
                return Err(not_listening("timed out".into()));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Whether it has exited (its `--duration` ran out), with its status.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Its latest report (None before the first analysis or when unreachable).
    pub async fn report(&self) -> Option<MemoryReportSpec> {
        let body = http_get(&self.socket, "/v1/report").await?;
        serde_json::from_slice(&body).ok()
    }

    /// Asks it to stop (SIGTERM by PID, so it writes `--output` and flushes
    /// the trace) and waits; kills it after 10 s.
    pub async fn stop(&mut self) -> Option<std::process::ExitStatus> {
        if let Some(pid) = self.child.id() {
            let _ = tokio::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()
                .await;
        }
        match tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await {
            Ok(status) => status.ok(),
            Err(_) => {
                let _ = self.child.kill().await;
                None
            }
        }
    }

    /// Waits for it to exit by itself.
    pub async fn wait(&mut self) -> Option<std::process::ExitStatus> {
        self.child.wait().await.ok()
    }
}

/// One HTTP/1.1 GET over the Unix socket at `socket`: the body of a 200,
/// within 2 s.
pub async fn http_get(socket: &Path, path: &str) -> Option<Vec<u8>> {
    let io = async {
        let stream = tokio::net::UnixStream::connect(socket).await.ok()?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .ok()?;
        // Drives the connection; it ends when `sender` is dropped.
        tokio::spawn(conn);
        let req = hyper::Request::get(path)
            .header(hyper::header::HOST, "localhost")
            .body(Empty::<Bytes>::new())
            .ok()?;
        let resp = sender.send_request(req).await.ok()?;
        if resp.status() != hyper::StatusCode::OK {
            return None;
        }
        let body = resp.into_body().collect().await.ok()?.to_bytes();
        Some(body.to_vec())
    };
    tokio::time::timeout(Duration::from_secs(2), io)
        .await
        .ok()?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_private_dir_is_0700_fresh_and_gone_when_dropped() {
        use std::os::unix::fs::PermissionsExt;
        let a = PrivateDir::new("test").unwrap();
        let b = PrivateDir::new("test").unwrap();
        assert_ne!(a.path(), b.path(), "never an existing directory");
        let mode = std::fs::metadata(a.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        assert!(a.socket().as_os_str().len() < 108, "fits a socket address");
        std::fs::write(a.path().join("x"), "y").unwrap();
        let path = a.path().to_path_buf();
        drop(a);
        assert!(!path.exists());
    }

    /// The report is read with hyper over the socket; anything but a 200 is
    /// no report.
    #[tokio::test]
    async fn the_report_is_read_over_the_socket() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let dir = PrivateDir::new("test").unwrap();
        let listener = tokio::net::UnixListener::bind(dir.socket()).unwrap();
        tokio::spawn(async move {
            for status in ["200 OK", "503 Service Unavailable"] {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = vec![0; 1024];
                let n = s.read(&mut buf).await.unwrap();
                let head = String::from_utf8_lossy(&buf[..n]).to_string();
                assert!(head.starts_with("GET /v1/report HTTP/1.1"), "{head}");
                let body = "{\"podName\":\"p\"}";
                let resp = format!(
                    "HTTP/1.1 {status}\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                s.write_all(resp.as_bytes()).await.unwrap();
            }
        });
        let body = http_get(&dir.socket(), "/v1/report").await.unwrap();
        assert_eq!(body, br#"{"podName":"p"}"#);
        assert_eq!(http_get(&dir.socket(), "/v1/report").await, None);
    }

    #[test]
    fn risk_lines_are_transitions_and_the_rest_is_not() {
        let t = parse_transition(
            r#"{"event":"risk","elapsedSeconds":12.5,"from":"low","to":"high","gpu":1,"usedBytes":5,"growthBytesPerSecond":2.0,"timeToOomSeconds":300.0,"confidence":0.9}"#,
        )
        .expect("a transition");
        assert_eq!(
            (t.elapsed_seconds, t.from, t.to, t.gpu),
            (12.5, RiskLevel::Low, RiskLevel::High, Some(1))
        );
        assert_eq!(parse_transition(r#"{"event":"estimate"}"#), None);
        assert_eq!(parse_transition("not json"), None);
    }
}
