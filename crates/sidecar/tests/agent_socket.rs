//! The real `memprof-sidecar` binary as the injection runs it (`--port`, so
//! `/metrics` is on every interface, and `MEMPROF_AGENT_SOCKET`): only the
//! pod's own processes, through the socket, can push or read the report.
//! No cluster: `--standalone` with the simulated backend. Set
//! `MEMPROF_SIDECAR_BIN` to run these against another build (an older one,
//! to see them fail).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const SCENARIO: &str = "default: { baseGiB: 20, amplitudeGiB: 0, noiseGiB: 0 }\n";

const PUSH: &str = r#"{"version": 1, "time": 1795000000.5, "pid": 7, "rank": 0,
    "devices": [{"index": 0, "allocatedBytes": 30, "reservedBytes": 40, "numOoms": 1}]}"#;

fn binary() -> PathBuf {
    std::env::var_os("MEMPROF_SIDECAR_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_memprof-sidecar").into())
}

/// A sidecar process and its private directory, both gone when dropped.
struct Sidecar {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Sidecar {
    fn start(name: &str) -> Sidecar {
        let dir = std::env::temp_dir().join(format!("memprof-sock-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("scenario.yaml"), SCENARIO).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(binary())
            .args(["--standalone", "--backend", "sim", "--interval", "100ms"])
            .arg("--scenario")
            .arg(dir.join("scenario.yaml"))
            .args(["--port", &port.to_string(), "--listen", "127.0.0.1:0"])
            .env("MEMPROF_AGENT_SOCKET", dir.join("agent.sock"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("stderr.log")).unwrap())
            .spawn()
            .expect("memprof-sidecar starts");
        let s = Sidecar { child, dir, port };
        s.wait_for(|| tcp(port, "GET", "/healthz", "").0 == 200);
        s
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("agent.sock")
    }

    fn wait_for(&self, ok: impl Fn() -> bool) {
        let start = Instant::now();
        while !ok() {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the sidecar did not come up: {}",
                std::fs::read_to_string(self.dir.join("stderr.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn request(mut s: impl Read + Write, method: &str, path: &str, body: &str) -> (u16, String) {
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = s.write_all(req.as_bytes());
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let code = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, out)
}

/// A request from 127.0.0.1: what a mesh relay's connection looks like.
fn tcp(port: u16, method: &str, path: &str, body: &str) -> (u16, String) {
    match std::net::TcpStream::connect(("127.0.0.1", port)) {
        Ok(s) => request(s, method, path, body),
        Err(_) => (0, String::new()),
    }
}

fn unix(path: &Path, method: &str, path_: &str, body: &str) -> (u16, String) {
    match UnixStream::connect(path) {
        Ok(s) => request(s, method, path_, body),
        Err(_) => (0, String::new()),
    }
}

/// Istio hands inbound traffic to the app from 127.0.0.6,
/// Linkerd and `kubectl port-forward` from loopback. Through such a relay a
/// pod in another namespace fed invented allocator data to a victim's
/// sidecar (62 of 62 pushes accepted: report low to critical, numOoms from
/// 0 to 1) and read its GPU's UUID from `GET /v1/report`. Neither is served
/// on TCP any more, whatever the peer's address.
#[test]
fn a_push_relayed_from_loopback_is_refused() {
    let s = Sidecar::start("relay");
    for _ in 0..3 {
        let (code, out) = tcp(s.port, "POST", "/v1/agent", PUSH);
        assert_eq!(code, 404, "a loopback TCP peer pushed: {out}");
    }
    s.wait_for(|| unix(&s.socket(), "GET", "/v1/report", "").0 == 200);
    let (code, out) = tcp(s.port, "GET", "/v1/report", "");
    assert_eq!(code, 404, "the report is served on TCP: {out}");
    assert!(!out.contains("uuid"), "{out}");
    let (_, metrics) = tcp(s.port, "GET", "/metrics", "");
    assert!(
        metrics.contains("memprof_sidecar_agent_pushes_total 0"),
        "{metrics}"
    );
    let (_, report) = unix(&s.socket(), "GET", "/v1/report", "");
    assert!(
        !report.contains("\"numOoms\": 1"),
        "the relayed pushes reached the analysis: {report}"
    );
}

/// The pod's own trainer, on the socket: pushed, answered with the verdict
/// (contract B), counted, and in the report.
#[test]
fn the_socket_takes_pushes_and_answers_with_the_verdict() {
    let s = Sidecar::start("own");
    s.wait_for(|| unix(&s.socket(), "GET", "/v1/report", "").0 == 200);
    let (code, out) = unix(&s.socket(), "POST", "/v1/agent", PUSH);
    assert_eq!(code, 200, "{out}");
    let body: serde_json::Value =
        serde_json::from_str(out.split_once("\r\n\r\n").unwrap().1).unwrap();
    assert_eq!(body["accepted"], true);
    assert_eq!(body["verdict"]["source"], "sim", "{body}");
    assert!(body["verdict"]["risk"].is_string(), "{body}");
    let (_, metrics) = tcp(s.port, "GET", "/metrics", "");
    assert!(
        metrics.contains("memprof_sidecar_agent_pushes_total 1"),
        "{metrics}"
    );
    s.wait_for(|| {
        unix(&s.socket(), "GET", "/v1/report", "")
            .1
            .contains("\"numOoms\": 1")
    });
}
