//! The real `memprof-sidecar` binary and its endpoints' port: `MEMPROF_PORT`
//! / `--port` is where it serves, and a port it cannot bind (the trainer's)
//! never fails it: it samples, writes its report and exits 0. No cluster:
//! `--standalone` with the simulated backend.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const SCENARIO: &str =
    "seed: 1\ndefault: { baseGiB: 20, amplitudeGiB: 2, periodSeconds: 2, noiseGiB: 0.1 }\n";

/// Files removed when dropped.
struct TempFiles(Vec<PathBuf>);

impl Drop for TempFiles {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn temp_path(what: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    std::env::temp_dir().join(format!(
        "memprof-port-{}-{}-{what}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ))
}

/// A sidecar process, killed (through its handle) when dropped.
struct Sidecar {
    child: Child,
    output: PathBuf,
    stderr: PathBuf,
    _files: TempFiles,
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Sidecar {
    /// Starts a standalone sidecar over a simulated GPU for `duration` seconds.
    fn start(duration: &str, args: &[&str], env: &[(&str, &str)]) -> Sidecar {
        let (scenario, output, stderr) = (
            temp_path("scenario.yaml"),
            temp_path("report.json"),
            temp_path("stderr.log"),
        );
        std::fs::write(&scenario, SCENARIO).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_memprof-sidecar"));
        cmd.args(["--standalone", "--backend", "sim", "--interval", "100ms"])
            .args(["--scenario", scenario.to_str().unwrap()])
            .args(["--duration", duration])
            .args(["--output", output.to_str().unwrap()])
            .args(args)
            .env_remove("MEMPROF_PORT")
            .env_remove("MEMPROF_LISTEN")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).unwrap());
        Sidecar {
            child: cmd.spawn().expect("memprof-sidecar starts"),
            _files: TempFiles(vec![scenario, output.clone(), stderr.clone()]),
            output,
            stderr,
        }
    }

    fn wait(&mut self, limit: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                start.elapsed() < limit,
                "the sidecar did not stop in {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }
}

fn loopback_listener() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").unwrap()
}

fn free_port() -> u16 {
    loopback_listener().local_addr().unwrap().port()
}

/// GET over loopback; the status line and body, or empty when nothing answers.
fn get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let req = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    let _ = s.write_all(req.as_bytes());
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// The trainer holds the port (9464 is also OpenTelemetry's Prometheus
/// exporter's): the sidecar samples, writes its report with a condition
/// saying the endpoints are not served, and exits 0, whether the port came
/// from `--port` or from `--listen`.
#[test]
fn a_port_held_by_the_trainer_never_fails_the_sidecar() {
    let trainer = loopback_listener();
    let port = trainer.local_addr().unwrap().port();
    let held = format!("127.0.0.1:{port}");
    let cases: [(&[&str], String); 2] = [
        (&["--port", &port.to_string()], format!("0.0.0.0:{port}")),
        (&["--listen", &held], held.clone()),
    ];
    for (args, addr) in cases {
        let mut sidecar = Sidecar::start("1.5", args, &[]);
        let status = sidecar.wait(Duration::from_secs(60));
        let log = sidecar.log();
        assert!(status.success(), "{args:?}: {status}\n{log}");
        assert!(
            log.contains(&format!("cannot listen on {addr}")),
            "{args:?}:\n{log}"
        );

        let report: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&sidecar.output).expect("the report is written"))
                .unwrap();
        let conditions = report["conditions"].as_array().unwrap();
        let serving = conditions
            .iter()
            .find(|c| c["type"] == "EndpointsServing")
            .unwrap_or_else(|| panic!("{args:?}: no EndpointsServing condition in {conditions:?}"));
        assert_eq!(serving["status"], "False");
        assert_eq!(serving["reason"], "ListenFailed");
        assert!(
            report["gpus"][0]["usedBytes"].as_u64().unwrap_or(0) > 0,
            "sampling went on: {report}"
        );
    }
    drop(trainer);
}

/// `MEMPROF_PORT` (what the injection sets) is where the endpoints are served.
#[test]
fn memprof_port_is_where_the_endpoints_are_served() {
    let port = free_port();
    let sidecar = Sidecar::start(
        "60",
        &["--listen", "127.0.0.1:0"],
        &[("MEMPROF_PORT", &port.to_string())],
    );
    let start = Instant::now();
    let mut answer = String::new();
    while start.elapsed() < Duration::from_secs(30) {
        answer = get(port, "/healthz");
        if answer.contains("200 OK") {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        answer.contains("200 OK"),
        "no /healthz on port {port}: {answer:?}\n{}",
        sidecar.log()
    );
    let metrics = get(port, "/metrics");
    assert!(
        metrics.contains("memprof_sidecar_listen_errors_total 0"),
        "{metrics}"
    );
    assert!(
        sidecar.log().contains(&format!("0.0.0.0:{port}")),
        "every interface, for Prometheus: {}",
        sidecar.log()
    );
    drop(sidecar);
}
