//! Helpers of the fault tests (`tests/faults.rs`): a private control plane
//! whose API server may be frozen (`kill -STOP`/`-CONT` by PID) and
//! restarted without disturbing any other test, a TCP proxy that cuts one
//! process off the API server, the operator and the sidecar as child
//! processes, and their `/metrics`.
#![allow(dead_code)] // tests/faults.rs uses a subset in each test

mod proxy;
pub use proxy::{Link, Proxy};

use crate::common;
use kube::Client;
use serde_json::Value;
use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The operator binary of this package.
pub const OPERATOR: &str = env!("CARGO_BIN_EXE_memprof-operator");

/// The operator binary to run: `MEMPROF_OPERATOR_BIN` (e.g. an older build,
/// to see a test fail without a change), else this package's.
pub fn operator_binary() -> PathBuf {
    std::env::var_os("MEMPROF_OPERATOR_BIN").map_or_else(|| OPERATOR.into(), PathBuf::from)
}

/// `memprof-sidecar`, a binary of another package of the workspace:
/// `MEMPROF_SIDECAR_BIN`, else next to `memprof-operator` (hack/test.sh
/// builds the workspace first).
pub fn sidecar_binary() -> PathBuf {
    if let Ok(p) = std::env::var("MEMPROF_SIDECAR_BIN") {
        return p.into();
    }
    let p = Path::new(OPERATOR).with_file_name("memprof-sidecar");
    assert!(
        p.exists(),
        "{} is missing: run `cargo build -p memprof-sidecar` first (or set MEMPROF_SIDECAR_BIN)",
        p.display()
    );
    p
}

fn local_cluster_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/local-cluster.sh")
}

/// A file removed when dropped.
pub struct TempFile(pub PathBuf);

impl TempFile {
    /// A new private (0600) file in the temp dir: kubeconfigs hold tokens.
    pub fn with(prefix: &str, contents: &[u8]) -> Self {
        let path = std::env::temp_dir().join(format!("{prefix}-{}", common::random_suffix()));
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .and_then(|mut f| f.write_all(contents))
            .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        TempFile(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A client for the cluster of `kubeconfig`.
pub async fn client_for(kubeconfig: &Path) -> Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).expect("readable kubeconfig");
    let opts = kube::config::KubeConfigOptions::default();
    let config = kube::Config::from_custom_kubeconfig(kc, &opts)
        .await
        .expect("usable kubeconfig");
    Client::try_from(config).expect("a client")
}

/// The kubeconfig `base` (YAML; JSON is YAML too) as JSON, edited.
pub fn kubeconfig_with(base: &Path, edit: impl FnOnce(&mut Value)) -> TempFile {
    let text = std::fs::read_to_string(base).expect("readable kubeconfig");
    let mut cfg: Value = serde_yaml::from_str(&text).expect("kubeconfig is YAML");
    edit(&mut cfg);
    TempFile::with(
        "memprof-faults-kubeconfig",
        serde_json::to_string(&cfg).unwrap().as_bytes(),
    )
}

/// The API server's loopback address in `kubeconfig`.
pub fn apiserver_addr(kubeconfig: &Path) -> SocketAddr {
    let text = std::fs::read_to_string(kubeconfig).expect("readable kubeconfig");
    let cfg: Value = serde_yaml::from_str(&text).expect("kubeconfig is YAML");
    let server = cfg["clusters"][0]["cluster"]["server"]
        .as_str()
        .expect("a server URL");
    let authority = server.trim_start_matches("https://").trim_end_matches('/');
    authority.parse().expect("a loopback address and port")
}

/// The shared test cluster's kubeconfig (`KUBECONFIG`).
pub fn shared_kubeconfig() -> PathBuf {
    std::env::var_os("KUBECONFIG")
        .expect("KUBECONFIG is set")
        .into()
}

/// A control plane of this test alone (`hack/local-cluster.sh up` with its
/// own state dir), so that freezing or restarting its API server disturbs
/// no other test. Stopped (by PID, by the script) when dropped.
pub struct PrivateCluster {
    pub kubeconfig: PathBuf,
    pub client: Client,
    // Last: the control plane stops after the client is gone.
    down: Down,
}

impl PrivateCluster {
    /// Starts it (seconds once the binaries are cached) and installs the CRDs.
    pub async fn up(name: &str) -> Self {
        // Its own state dir per run: `up` on a dir already up is a no-op,
        // so a fixed one let two runs on one machine (two CI jobs, two
        // developers) share, and stop, each other's control plane. `down`
        // removes it.
        let unique = format!("memprof-faults-{name}-{}", common::random_suffix());
        let dir = std::env::temp_dir().join(unique);
        let started = Instant::now();
        let up = Command::new("bash")
            .arg(local_cluster_script())
            .arg("up")
            .env("MEMPROF_CLUSTER_DIR", &dir)
            .stdout(Stdio::null())
            .status()
            .expect("running hack/local-cluster.sh");
        let kubeconfig = dir.join("kubeconfig");
        // Stops it even when what follows fails.
        let down = Down(dir.clone());
        assert!(
            up.success(),
            "hack/local-cluster.sh up failed for {}",
            dir.display()
        );
        let client = client_for(&kubeconfig).await;
        common::install_crds(&client).await;
        eprintln!("private control plane {name} up in {:?}", started.elapsed());
        PrivateCluster {
            kubeconfig,
            client,
            down,
        }
    }

    fn script(&self, args: &[&str]) -> String {
        let out = Command::new("bash")
            .arg(local_cluster_script())
            .args(args)
            .env("MEMPROF_CLUSTER_DIR", &self.down.0)
            .output()
            .expect("running hack/local-cluster.sh");
        assert!(
            out.status.success(),
            "hack/local-cluster.sh {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// PID of the API server process.
    pub fn apiserver_pid(&self) -> u32 {
        self.script(&["pid", "kube-apiserver"])
            .trim()
            .parse()
            .expect("a PID")
    }

    /// Freezes the API server (SIGSTOP) until the guard is dropped (SIGCONT).
    pub fn freeze_apiserver(&self) -> Frozen {
        let pid = self.apiserver_pid();
        signal("STOP", pid);
        Frozen { pid }
    }

    /// Stops the API server and starts it again with the same command line.
    pub async fn restart_apiserver(&self) {
        let (dir, script) = (self.down.0.clone(), local_cluster_script());
        let out = tokio::task::spawn_blocking(move || {
            Command::new("bash")
                .arg(script)
                .args(["restart", "kube-apiserver"])
                .env("MEMPROF_CLUSTER_DIR", dir)
                .output()
                .expect("running hack/local-cluster.sh")
        })
        .await
        .unwrap();
        assert!(
            out.status.success(),
            "restarting the API server: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Stops a private control plane when dropped.
struct Down(PathBuf);

impl Drop for Down {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(local_cluster_script())
            .arg("down")
            .env("MEMPROF_CLUSTER_DIR", &self.0)
            .stderr(Stdio::null())
            .status();
    }
}

/// `kill -s SIG PID` with bash's builtin (no procps needed).
fn kill(sig: &str, pid: u32) -> bool {
    Command::new("bash")
        .args(["-c", "kill -s \"$1\" \"$2\"", "kill", sig, &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success())
}

fn signal(sig: &str, pid: u32) {
    assert!(kill(sig, pid), "kill -s {sig} {pid} failed");
}

/// A frozen process: resumed (SIGCONT) when dropped, panics included, so a
/// failing test never leaves an API server frozen.
pub struct Frozen {
    pid: u32,
}

impl Drop for Frozen {
    fn drop(&mut self) {
        kill("CONT", self.pid);
    }
}

/// A free loopback port (bound and released: the kernel's pick, free now).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A child process, its output in a temp file; killed (by PID, through its
/// handle) when dropped, with the log's tail printed if the test failed.
pub struct Proc {
    pub name: String,
    pub port: u16,
    child: Child,
    log: TempFile,
}

impl Proc {
    /// Spawns `cmd` with its output to a log file.
    pub fn spawn(name: &str, port: u16, mut cmd: Command) -> Self {
        let log = TempFile::with(&format!("memprof-faults-{name}-log"), b"");
        let file = std::fs::OpenOptions::new()
            .append(true)
            .open(&log.0)
            .unwrap();
        // tracing logs to stdout: both go to the log.
        cmd.stdout(file.try_clone().unwrap()).stderr(file);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {name}: {e}"));
        Proc {
            name: name.into(),
            port,
            child,
            log,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it still runs (has not exited).
    pub fn alive(&mut self) -> bool {
        self.child.try_wait().expect("waitpid").is_none()
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log.0).unwrap_or_default()
    }

    /// Resident memory, KiB (Linux `/proc`).
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS in /proc/PID/status")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = self.log();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            eprintln!("---- last lines of {}'s log ----", self.name);
            for line in tail.iter().rev() {
                eprintln!("{line}");
            }
        }
    }
}

/// Starts `memprof-operator` named `name` (its Event instance and both Lease
/// identities) on namespace `ns`, its Leases there too, without the webhook.
pub fn operator(name: &str, kubeconfig: &Path, ns: &str, extra: &[&str]) -> Proc {
    let port = free_port();
    let mut cmd = Command::new(operator_binary());
    cmd.args(["--namespace", ns, "--webhook-port", "0", "--instance", name])
        // The admission-mark key lives in the test's namespace (the harness marks pods with it).
        .args(["--webhook-namespace", ns])
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
        .args(["--leader-election-namespace", ns])
        .args(["--remediation-plan-namespace", ns])
        .args(extra)
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "info,kube=warn")
        .env_remove("MEMPROF_FAILPOINT")
        .env_remove("POD_NAMESPACE");
    Proc::spawn(name, port, cmd)
}

/// A simulated rank: 30 GiB ± 8 GiB every 2 s of simulated time, no leak.
pub const SCENARIO: &str =
    "seed: 3\ndefault: { baseGiB: 30, amplitudeGiB: 8, periodSeconds: 2, noiseGiB: 0.1, leakMiBPerSecond: 0 }\n";

/// A sidecar's files: its scenario and its agent socket's private directory.
pub struct SidecarFiles {
    _scenario: TempFile,
    socket: common::AgentSocket,
}

impl SidecarFiles {
    /// The agent socket (`GET /v1/report` is served there only).
    pub fn socket(&self) -> PathBuf {
        self.socket.path()
    }
}

/// Starts `memprof-sidecar` (sim backend) as the sidecar of `pod` of Job
/// `job`, with a heartbeat every 5 s: the scenario is steady, so that every
/// write decision carries a fresh sample and "caught up" is well defined.
pub fn sidecar(
    kubeconfig: &Path,
    ns: &str,
    pod: &k8s_openapi::api::core::v1::Pod,
    job: &str,
) -> (Proc, SidecarFiles) {
    let scenario = TempFile::with("memprof-faults-scenario.yaml", SCENARIO.as_bytes());
    let socket = common::AgentSocket::new();
    let port = free_port();
    let name = pod.metadata.name.clone().unwrap();
    let mut cmd = Command::new(sidecar_binary());
    cmd.args(["--backend", "sim", "--speed", "10", "--interval", "200ms"])
        .arg("--scenario")
        .arg(&scenario.0)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .arg("--agent-socket")
        .arg(socket.path())
        .env("KUBECONFIG", kubeconfig)
        .env("POD_NAME", &name)
        .env("POD_UID", pod.metadata.uid.clone().unwrap())
        .env("POD_NAMESPACE", ns)
        .env("NODE_NAME", "node-a")
        .env("MEMPROF_JOB_NAME", job)
        .env("RANK", "0")
        .env("MEMPROF_HEARTBEAT_SECONDS", "5")
        .env("RUST_LOG", "info");
    let files = SidecarFiles {
        _scenario: scenario,
        socket,
    };
    (Proc::spawn("sidecar", port, cmd), files)
}

/// `GET path` on a sidecar's agent socket: status and body, `None` when it
/// does not answer within a second.
pub async fn get_socket(socket: &Path, path: &str) -> Option<(u16, String)> {
    let fetch = common::socket_request(socket, "GET", path, "");
    let (status, out) = tokio::time::timeout(Duration::from_secs(1), fetch)
        .await
        .ok()?;
    let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status != 0).then(|| (status, body.to_string()))
}

/// `GET path` on a loopback port: status and body, `None` when it does not
/// answer within a second.
pub async fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let fetch = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        let req = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).await.ok()?;
        let status = out.split_whitespace().nth(1)?.parse().ok()?;
        let body = out
            .split_once("\r\n\r\n")
            .map_or("", |(_, b)| b)
            .to_string();
        Some((status, body))
    };
    tokio::time::timeout(Duration::from_secs(1), fetch)
        .await
        .ok()?
}

/// The sum of the samples of `series` (a name, or a name with its labels)
/// on `port`'s `/metrics`; `None` when it does not answer or lacks it.
pub async fn metric(port: u16, series: &str) -> Option<f64> {
    let (_, body) = get(port, "/metrics").await?;
    let values: Vec<f64> = body
        .lines()
        .filter(|l| {
            l.strip_prefix(series)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// Leader gauges, one per Lease: the one controller's (roll-up and remediation).
pub const LEASES: [&str; 1] = ["memprof_leader"];

/// One poll of the leader gauges of some operators.
#[derive(Clone, Debug)]
pub struct Sample {
    /// When the poll started.
    pub at: Instant,
    /// `[operator][lease]`: 1.0 leads, 0.0 stands by, `None` no answer.
    pub gauges: Vec<[Option<f64>; LEASES.len()]>,
}

/// The leader gauges of `ports` (one per operator), polled every 100 ms.
pub struct LeaderWatch {
    samples: Arc<Mutex<Vec<Sample>>>,
    task: tokio::task::JoinHandle<()>,
}

impl LeaderWatch {
    pub fn start(ports: Vec<u16>) -> Self {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let s = samples.clone();
        let task = tokio::spawn(async move {
            loop {
                let at = Instant::now();
                let mut gauges = Vec::new();
                for port in &ports {
                    let mut g = [None; LEASES.len()];
                    for (lease, name) in LEASES.iter().enumerate() {
                        g[lease] = metric(*port, name).await;
                    }
                    gauges.push(g);
                }
                s.lock().unwrap().push(Sample { at, gauges });
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        LeaderWatch { samples, task }
    }

    /// What was seen so far.
    pub fn samples(&self) -> Vec<Sample> {
        self.samples.lock().unwrap().clone()
    }

    /// Fails if any poll saw two operators lead the same Lease.
    pub fn assert_never_two_leaders(&self) {
        for s in self.samples() {
            for (lease, name) in LEASES.iter().enumerate() {
                let leading = s.gauges.iter().filter(|g| g[lease] == Some(1.0)).count();
                assert!(leading <= 1, "two leaders of {name} at once: {s:?}");
            }
        }
    }

    /// The first instant from `after` on at which operator `op` was seen
    /// with gauge `lease` at `value`.
    pub fn first(&self, op: usize, lease: usize, value: f64, after: Instant) -> Option<Instant> {
        self.samples()
            .into_iter()
            .find(|s| s.at >= after && s.gauges[op][lease] == Some(value))
            .map(|s| s.at)
    }
}

impl Drop for LeaderWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Which of `ports` leads each Lease, when exactly one does.
pub async fn leaders_now(ports: &[u16]) -> Option<[usize; LEASES.len()]> {
    let mut leaders = [0; LEASES.len()];
    for (lease, name) in LEASES.iter().enumerate() {
        let mut leading = Vec::new();
        for (i, port) in ports.iter().enumerate() {
            if metric(*port, name).await == Some(1.0) {
                leading.push(i);
            }
        }
        match leading[..] {
            [i] => leaders[lease] = i,
            _ => return None,
        }
    }
    Some(leaders)
}

/// Waits until exactly one of `ports` leads each Lease; returns its index per Lease.
pub async fn one_leader_each(ports: &[u16]) -> [usize; LEASES.len()] {
    common::eventually_within(Duration::from_secs(60), "one leader per Lease", || async {
        leaders_now(ports)
            .await
            .ok_or_else(|| "not one leader per Lease".to_string())
    })
    .await
}
