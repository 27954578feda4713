//! Runs one configuration: its own process group (a fresh CUDA context, and
//! one PID to kill with all its children), the swept values in its
//! environment, the agent auto-enabled as `memprof profile` does it, the
//! agent's summary in a per-configuration file, a timeout; optionally
//! through `memprof profile`, whose standalone sidecar records the NVML peak.

use crate::local::profile::{python_path, AgentTree};
use crate::local::sweep::grid::Config;
use crate::local::sweep::record::{AgentSummary, Exit, SummaryError};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Why a configuration could not be run at all (not: why it failed).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A log file could not be created.
    #[error("cannot create {path}: {error}; check that the directory is writable")]
    Log {
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The private directory for the run could not be made.
    #[error(transparent)]
    PrivateDir(#[from] crate::local::profile::ProfileError),
}

/// How every configuration is run.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The training command.
    pub command: Vec<String>,
    /// `MEMPROF_AGENT_MAX_STEPS`, when set.
    pub steps: Option<u64>,
    /// Kill a run after this long.
    pub timeout: Duration,
    /// The agent tree put on `PYTHONPATH` (None: the command starts its own agent, if any).
    pub tree: Option<AgentTree>,
    /// Where `--agent-path` pointed, passed on to `memprof profile`.
    pub agent_path: Option<PathBuf>,
    /// Run through `memprof profile` (this binary) for the NVML peak.
    pub nvml: bool,
    /// The `memprof` binary (for `memprof profile`).
    pub memprof_exe: PathBuf,
    /// Where the per-configuration files go.
    pub dir: PathBuf,
    /// `MEMPROF_AGENT_INTERVAL`: how often the agent pushes, and so how fine
    /// each run's memory timeline is.
    pub agent_interval: String,
}

/// What one run left behind.
#[derive(Debug)]
pub struct Outcome {
    /// Exit status and timeout.
    pub exit: Exit,
    /// Wall-clock seconds.
    pub duration_seconds: f64,
    /// The agent's summary: absent, or unreadable with the reason.
    pub summary: Result<Option<AgentSummary>, SummaryError>,
    /// The end of the process's stderr.
    pub stderr_tail: String,
    /// The sidecar's peak (busiest NVML GPU) when run with `--nvml`.
    pub nvml_peak_bytes: Option<u64>,
    /// Why the NVML peak is null.
    pub nvml_note: Option<String>,
}

/// Seconds a run gets after SIGTERM before SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(5);

/// Bytes of stderr kept for the record.
const TAIL_BYTES: u64 = 16 * 1024;

/// Runs configuration `index`; `cancel` resolving (Ctrl-C) kills it.
pub async fn run_one(
    plan: &Plan,
    index: usize,
    config: &Config,
    cancel: impl std::future::Future<Output = ()>,
) -> Result<(Outcome, bool), RunError> {
    let files = Files::new(&plan.dir, index);
    let _ = std::fs::remove_file(&files.summary);
    // Without a sidecar the agent is pointed at a socket no one serves, in a
    // directory no one else can enter: never at another sidecar's socket.
    let nowhere = crate::local::profile::sidecar::PrivateDir::new("sweep")?;
    let mut cmd = command(plan, config, &files, &nowhere.socket())?;
    let started = Instant::now();
    let mut cancelled = false;
    tokio::pin!(cancel);
    let exit = match cmd.spawn() {
        Err(e) => {
            append(
                &files.stderr,
                &format!("memprof sweep: cannot start {:?}: {e}\n", plan.command[0]),
            );
            Exit::default()
        }
        Ok(mut child) => {
            let pgid = child.id();
            let waited = tokio::select! {
                s = tokio::time::timeout(plan.timeout, child.wait()) => s.ok(),
                _ = &mut cancel => { cancelled = true; None }
            };
            let exit = match waited {
                Some(status) => Exit {
                    code: Some(exit_code(status.ok())),
                    timed_out: false,
                },
                None => Exit {
                    code: Some(terminate(&mut child, pgid).await),
                    timed_out: !cancelled,
                },
            };
            // Children it left behind (data loader workers) go with it.
            signal_group(pgid, "KILL").await;
            exit
        }
    };
    let duration_seconds = started.elapsed().as_secs_f64();
    let (nvml_peak_bytes, nvml_note) = nvml_peak(plan, &files);
    Ok((
        Outcome {
            exit,
            duration_seconds,
            summary: read_summary(&files.summary),
            stderr_tail: read_tail(&files.stderr),
            nvml_peak_bytes,
            nvml_note,
        },
        cancelled,
    ))
}

/// The files of one configuration.
struct Files {
    summary: PathBuf,
    sidecar: PathBuf,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Files {
    fn new(dir: &Path, index: usize) -> Self {
        let f = |s: &str| dir.join(format!("run-{index:03}.{s}"));
        Files {
            summary: f("summary.json"),
            sidecar: f("sidecar.json"),
            stdout: f("stdout.log"),
            stderr: f("stderr.log"),
        }
    }
}

fn command(
    plan: &Plan,
    config: &Config,
    files: &Files,
    nowhere: &Path,
) -> Result<tokio::process::Command, RunError> {
    let mut cmd = if plan.nvml {
        let mut c = tokio::process::Command::new(&plan.memprof_exe);
        // No GPU is a note in the sidecar's report (read by nvml_peak), not
        // a failed run: the sweep's peak is the agent's.
        c.args(["profile", "--blind-ok"]);
        if let Some(p) = &plan.agent_path {
            c.arg("--agent-path").arg(p);
        }
        // The sidecar samples every 100 ms: NVML's peak is sampled, a finer
        // interval misses less of a short spike.
        c.args(["--interval", "100ms", "--output"])
            .arg(&files.sidecar)
            .arg("--")
            .args(&plan.command);
        c
    } else {
        let mut c = tokio::process::Command::new(&plan.command[0]);
        c.args(&plan.command[1..]);
        // No sidecar: the agent's pushes go to a socket nobody serves
        // (refused at once), never to another sidecar's.
        c.env(memprof_api::env::AGENT_SOCKET, nowhere)
            .env_remove("MEMPROF_AGENT_URL");
        if let Some(tree) = &plan.tree {
            let own = std::env::var("PYTHONPATH").ok();
            c.env("PYTHONPATH", python_path(tree, own.as_deref()));
        }
        c
    };
    for (k, v) in &config.values {
        cmd.env(k, v);
    }
    cmd.env("MEMPROF_AGENT_SUMMARY", &files.summary);
    cmd.env("MEMPROF_AGENT_INTERVAL", &plan.agent_interval);
    match plan.steps {
        Some(n) => cmd.env("MEMPROF_AGENT_MAX_STEPS", n.to_string()),
        None => cmd.env_remove("MEMPROF_AGENT_MAX_STEPS"),
    };
    let log = |path: &Path| {
        std::fs::File::create(path).map_err(|error| RunError::Log {
            path: path.to_path_buf(),
            error,
        })
    };
    cmd.stdin(Stdio::null())
        .stdout(log(&files.stdout)?)
        .stderr(log(&files.stderr)?)
        // Its own group: one kill reaches the trainer and its children,
        // and the terminal's Ctrl-C reaches only memprof, which decides.
        .process_group(0)
        .kill_on_drop(true);
    Ok(cmd)
}

/// SIGTERM to the group (a trainer that handles it can clean up), then
/// SIGKILL after the grace period; returns the exit code.
async fn terminate(child: &mut tokio::process::Child, pgid: Option<u32>) -> i32 {
    signal_group(pgid, "TERM").await;
    match tokio::time::timeout(TERM_GRACE, child.wait()).await {
        Ok(status) => exit_code(status.ok()),
        Err(_) => {
            signal_group(pgid, "KILL").await;
            exit_code(child.wait().await.ok())
        }
    }
}

/// Signals the process group `pgid` (by its leader's PID) with `kill`.
async fn signal_group(pgid: Option<u32>, signal: &str) {
    if let Some(pid) = pgid {
        let _ = tokio::process::Command::new("kill")
            .args([&format!("-{signal}"), "--", &format!("-{pid}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .await;
    }
}

fn exit_code(status: Option<std::process::ExitStatus>) -> i32 {
    use std::os::unix::process::ExitStatusExt as _;
    match status {
        Some(s) => s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0)),
        None => 1,
    }
}

fn read_summary(path: &Path) -> Result<Option<AgentSummary>, SummaryError> {
    match std::fs::read(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(SummaryError::Read {
            path: path.to_path_buf(),
            source,
        }),
        Ok(bytes) => {
            serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|source| SummaryError::Parse {
                    path: path.to_path_buf(),
                    source,
                })
        }
    }
}

fn read_tail(path: &Path) -> String {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(TAIL_BYTES)));
    let mut buf = vec![];
    let _ = f.read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}

fn append(path: &Path, text: &str) {
    use std::io::Write as _;
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = f.write_all(text.as_bytes());
    }
}

/// The busiest NVML GPU's peak from the sidecar's report; null with the
/// reason when not measured or NVML saw no GPU (never a silent 0).
fn nvml_peak(plan: &Plan, files: &Files) -> (Option<u64>, Option<String>) {
    if !plan.nvml {
        return (None, Some("not measured (run with --nvml)".into()));
    }
    let report = std::fs::read(&files.sidecar)
        .map_err(|e| format!("no sidecar report ({e})"))
        .and_then(|b| {
            serde_json::from_slice::<memprof_api::MemoryReportSpec>(&b)
                .map_err(|e| format!("unreadable sidecar report ({e})"))
        });
    match report {
        Err(why) => (None, Some(why)),
        Ok(r) => nvml_peak_of(&r),
    }
}

/// The highest per-GPU peak among the GPUs NVML sampled.
pub fn nvml_peak_of(r: &memprof_api::MemoryReportSpec) -> (Option<u64>, Option<String>) {
    let peak = r
        .gpus
        .iter()
        .filter(|g| g.source == memprof_api::DataSource::Nvml)
        .map(|g| g.peak_bytes)
        .max();
    match peak {
        Some(p) => (Some(p), None),
        None => {
            let why = r
                .conditions
                .iter()
                .find(|c| c.status == "False")
                .map_or("no GPU sampled through NVML".to_string(), |c| {
                    format!("NVML not available: {}", c.message)
                });
            (None, Some(why))
        }
    }
}
