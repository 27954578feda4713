//! A `memprof-sidecar --standalone` child, as `memprof profile` and
//! `memprof oom --monitor` drive it: its risk transitions come from its
//! standard output (one JSON line each), its latest report from its own
//! `GET /v1/report`, its samples from the `--trace-out` CSV it writes.

use super::ProfileError;
use memprof_api::{MemoryReportSpec, RiskLevel};
use serde::Deserialize;
use std::path::Path;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

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
    /// Where its endpoints listen.
    pub addr: String,
    /// Its risk transitions, as printed.
    pub transitions: mpsc::UnboundedReceiver<Transition>,
}

/// The sidecar binary next to this one.
pub fn sidecar_exe() -> Result<std::path::PathBuf, ProfileError> {
    std::env::current_exe()
        .map(|p| p.with_file_name("memprof-sidecar"))
        .map_err(|source| ProfileError::Sidecar {
            path: "memprof-sidecar".into(),
            source,
        })
}

/// A free loopback address for the sidecar's endpoints.
pub fn free_loopback() -> Result<String, ProfileError> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(ProfileError::Port)?;
    Ok(l.local_addr().map_err(ProfileError::Port)?.to_string())
}

impl Sidecar {
    /// Starts `exe --standalone ARGS --listen ADDR` and waits until it listens.
    pub async fn start(exe: &Path, args: &[String], addr: &str) -> Result<Sidecar, ProfileError> {
        let mut cmd = tokio::process::Command::new(exe);
        // Its info logs would scroll the live display away; warnings stay.
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "warn");
        }
        let mut child = cmd
            .arg("--standalone")
            .args(args)
            .args(["--listen", addr])
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| ProfileError::Sidecar {
                path: exe.to_path_buf(),
                source,
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
            addr: addr.to_string(),
            transitions,
        };
        s.wait_listening().await?;
        Ok(s)
    }

    async fn wait_listening(&mut self) -> Result<(), ProfileError> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let not_listening = |why: String| ProfileError::NotListening {
            addr: self.addr.clone(),
            why,
        };
        loop {
            if tokio::net::TcpStream::connect(&self.addr).await.is_ok() {
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
        let body = http_get(&self.addr, "/v1/report").await?;
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

/// A GET over HTTP/1.0 (the server closes, no chunking): the body of a 200.
async fn http_get(addr: &str, path: &str) -> Option<Vec<u8>> {
    let io = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await
            .ok()?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.ok()?;
        Some(buf)
    };
    let buf = tokio::time::timeout(Duration::from_secs(2), io)
        .await
        .ok()??;
    let split = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&buf[..split]).ok()?;
    let ok = head
        .lines()
        .next()
        .is_some_and(|l| l.split_whitespace().nth(1) == Some("200"));
    ok.then(|| buf[split + 4..].to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

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
