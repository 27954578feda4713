//! `memprof profile [FLAGS] [-- COMMAND...]`: this box's GPUs without
//! Kubernetes. Runs `memprof-sidecar --standalone` (its samples, analysis
//! and report, nothing re-implemented here), shows a status line per GPU
//! while it runs, then a summary table, and draws `--plot`. With a command,
//! runs it next to the sidecar with the in-process agent pointed at the
//! sidecar's socket (`MEMPROF_AGENT_SOCKET`, in a private directory removed
//! at exit; and, when an agent tree is found, started with no code change,
//! as the webhook does in a pod), then stops the sidecar once the command
//! exits, so `--output` holds the whole run. Exits with the command's status,
//! or [`BLIND`] (4) with one line saying why when there was nothing to watch:
//! no GPU visible and no data from an agent (a machine without the NVIDIA
//! driver, a `--devices` list that names no GPU).
//!
//! Where the numbers come from: the sidecar's risk transitions (its standard
//! output), its latest report (`GET /v1/report` on its socket, polled each second: the
//! status lines and the utilization average/max), its final report
//! (`--output`, a temporary file when not asked for: the table) and its
//! `--trace-out` CSV (every sample: the sample counts and the plot).

pub mod launch;
pub mod live;
pub mod sample;
pub mod sidecar;
pub mod summary;

use crate::local::install_agent::HOOK;
use memprof_api::MemoryReportSpec;
use memprof_api::DEFAULT_AGENT_SOURCE;
pub use sample::SampleArgs;
use sidecar::Sidecar;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::{Duration, Instant};

/// Why `memprof profile` could not run.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// The sidecar binary is missing or could not start.
    #[error("cannot run {path}: {error}; install memprof-sidecar next to memprof")]
    Sidecar {
        /// Binary path.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The sidecar exited or did not listen in time.
    #[error("memprof-sidecar did not start serving its socket {addr} within 10 s ({why}); run it alone with the same flags to see its error")]
    NotListening {
        /// Its address.
        addr: String,
        /// What happened.
        why: String,
    },
    /// The command could not start.
    #[error("cannot run {command:?}: {error}")]
    Command {
        /// The command.
        command: String,
        /// Why.
        error: std::io::Error,
    },
    /// No free loopback port.
    #[error("cannot pick a loopback port for the sidecar: {0}")]
    Port(std::io::Error),
    /// The private directory for the sidecar's socket could not be made.
    #[error(
        "cannot create the private directory {dir} for the sidecar's socket: {error}; check TMPDIR"
    )]
    PrivateDir {
        /// The directory.
        dir: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// A flag is wrong.
    #[error("{0}")]
    Usage(String),
    /// The sidecar wrote no final report.
    #[error("memprof-sidecar wrote no final report: its messages above say why (bad --scenario or --trace?)")]
    NoReport,
    /// A file could not be written.
    #[error("cannot write {path}: {error}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// A file the run was asked to write cannot be (checked before it starts).
    #[error(transparent)]
    OutFile(#[from] crate::outfile::OutFileError),
}

/// Where an agent tree's startup hook and package are.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentTree {
    /// Directory with `sitecustomize.py` (first on `PYTHONPATH`).
    pub bootstrap: PathBuf,
    /// Directory with `memprof_agent/` (last on `PYTHONPATH`).
    pub lib: PathBuf,
}

/// The agent tree at `--agent-path`, else the image's default place.
pub fn agent_tree(agent_path: Option<&Path>) -> Option<AgentTree> {
    find_tree(agent_path.unwrap_or(Path::new(DEFAULT_AGENT_SOURCE)))
}

/// The agent tree at `dir`: the image's layout (`bootstrap/`, `lib/`) or a
/// source checkout's `agent/python` (`bootstrap/`, `memprof_agent/`).
pub fn find_tree(dir: &Path) -> Option<AgentTree> {
    if !dir.join(HOOK).is_file() {
        return None;
    }
    let lib = [dir.join("lib"), dir.to_path_buf()]
        .into_iter()
        .find(|l| l.join("memprof_agent").join("__init__.py").is_file())?;
    Some(AgentTree {
        bootstrap: dir.join("bootstrap"),
        lib,
    })
}

/// `PYTHONPATH` for the command: the hook first, the user's own path kept,
/// the package last (the user's own memprof_agent, if any, wins).
pub fn python_path(tree: &AgentTree, own: Option<&str>) -> String {
    let mut parts = vec![tree.bootstrap.display().to_string()];
    parts.extend(own.filter(|o| !o.is_empty()).map(str::to_string));
    parts.push(tree.lib.display().to_string());
    parts.join(":")
}

/// Which samples the sidecar takes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// Real GPUs through NVML.
    #[default]
    Nvml,
    /// A simulation scenario (`--scenario`): shown as simulated, never as hardware.
    Sim,
    /// Replay of a recorded CSV trace (`--trace`).
    Trace,
}

impl Backend {
    fn flag(self) -> &'static str {
        match self {
            Backend::Nvml => "nvml",
            Backend::Sim => "sim",
            Backend::Trace => "trace",
        }
    }
}

/// Flags of `memprof profile`.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub sample: SampleArgs,
    /// Write the final report (the sidecar's MemoryReport spec, each GPU with
    /// the table's free memory, utilization and samples) as JSON to this file
    /// (what `memprof rollup` reads). `{rank}`, `{local_rank}` and `{host}`
    /// are filled in from the launch (torchrun's RANK, LOCAL_RANK), here and
    /// in `--trace-out` and `--plot`; a missing folder is created first.
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Draw every GPU's used memory over time, total memory and risk
    /// transitions as SVG into this file.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// Keep every sample as a CSV trace (what `memprof analyze` reads).
    #[arg(long, value_name = "FILE")]
    pub trace_out: Option<PathBuf>,
    /// After a CUDA OOM the agent saw, write its snapshot (the largest live
    /// blocks and where they were allocated) to FILE as the pickle PyTorch's
    /// memory_viz opens (`torch.cuda.memory._snapshot()`'s format).
    #[arg(long, value_name = "FILE")]
    pub oom_snapshot: Option<PathBuf>,
    /// Add this run's measured allocator peaks to FILE's estimate of the
    /// same command (`memprof estimate --points FILE`): a calibration point.
    #[arg(long, value_name = "FILE")]
    pub points: Option<PathBuf>,
    /// Address of the sidecar's /healthz and /metrics (default: a free
    /// loopback port; the agent talks to it over a private Unix socket).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// The agent tree to start in a Python command with no code change
    /// (the image's /opt/memprof/agent, or a checkout's agent/python).
    #[arg(long, value_name = "DIR")]
    pub agent_path: Option<PathBuf>,
    /// For `memprof sweep --nvml`: a run that saw no GPU and no agent data
    /// says so in its report (`GpuVisible`) and exits with the command's
    /// status instead of 4; the sweep reads the peak from the agent's summary.
    #[arg(long, hide = true)]
    pub blind_ok: bool,
    /// The command to profile, after `--` (e.g. `-- python train.py`).
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "COMMAND"
    )]
    pub command: Vec<String>,
}

impl Args {
    /// The sampling flags' checks, then the command's: a flag-looking word
    /// before it is a mistyped flag, not a program.
    pub fn check(&self) -> Result<(), ProfileError> {
        self.sample.check()?;
        crate::help::check_command::<Args>("profile", &self.command)
            .map_err(|e| ProfileError::Usage(e.to_string()))
    }

    /// Every file the run writes, checked (folders made) before it starts:
    /// an hour's run must not end with nowhere to put its report.
    pub fn prepare_outputs(&self) -> Result<(), ProfileError> {
        use crate::outfile::{prepare, prepare_image};
        if let Some(p) = &self.output {
            prepare("--output", p)?;
        }
        if let Some(p) = &self.trace_out {
            prepare("--trace-out", p)?;
        }
        if let Some(p) = &self.plot {
            prepare_image("--plot", p)?;
        }
        if let Some(p) = &self.oom_snapshot {
            prepare("--oom-snapshot", p)?;
        }
        Ok(())
    }
}

impl Args {
    /// The flags as this process's launch fills them in: `{rank}`,
    /// `{local_rank}` and `{host}` in file names, `--devices local-rank`, and
    /// the report's name and node.
    pub fn for_launch(mut self, l: &launch::Launch) -> Result<Args, ProfileError> {
        for p in [
            &mut self.output,
            &mut self.trace_out,
            &mut self.plot,
            &mut self.oom_snapshot,
        ]
        .into_iter()
        .flatten()
        {
            *p = l.expand(p)?;
        }
        self.sample.devices = l.devices(&self.sample.devices)?;
        self.sample.identity = vec![
            "--pod-name".into(),
            l.report_name(),
            "--node-name".into(),
            l.host.clone(),
        ];
        Ok(self)
    }
}

/// Runs `memprof profile` from its parsed flags; returns the exit code.
pub async fn run_args(args: Args) -> anyhow::Result<i32> {
    Ok(profile(args).await?)
}

/// Files the run writes and removes unless the user named them.
struct Files {
    trace: PathBuf,
    output: PathBuf,
    remove: Vec<PathBuf>,
}

impl Files {
    fn new(a: &Args) -> Files {
        let tmp = |what: &str| {
            std::env::temp_dir().join(format!("memprof-profile-{}-{what}", std::process::id()))
        };
        let mut remove = vec![];
        let mut pick = |given: &Option<PathBuf>, what: &str| {
            given.clone().unwrap_or_else(|| {
                let p = tmp(what);
                remove.push(p.clone());
                p
            })
        };
        let trace = pick(&a.trace_out, "trace.csv");
        let output = pick(&a.output, "report.json");
        Files {
            trace,
            output,
            remove,
        }
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        for p in &self.remove {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Profiles: starts the sidecar (and the command), shows progress, then the
/// summary, and draws `--plot`. Returns the command's exit status (0 without one).
pub async fn profile(a: Args) -> Result<i32, ProfileError> {
    a.check()?;
    let launch = launch::Launch::from_env();
    let a = a.for_launch(&launch)?;
    a.prepare_outputs()?;
    let exe = sidecar::sidecar_exe()?;
    let files = Files::new(&a);
    let addr = match &a.listen {
        Some(l) => l.clone(),
        None => sidecar::free_loopback()?,
    };
    // Removed (socket and all) when the profile ends, however it ends.
    let private = sidecar::PrivateDir::new("profile")?;
    let started = Instant::now();
    // The command's pid, once started: the sidecar follows it and its
    // children as the trainer's processes (growth in any other process on
    // the GPU is then a neighbour's).
    let trainer_pid = private.path().join("trainer.pid");
    let mut flags = a.sample.sidecar_flags(&files.trace, &files.output);
    flags.extend([
        "--trainer-pid-file".into(),
        trainer_pid.display().to_string(),
    ]);
    let mut side = Sidecar::start(&exe, &flags, &addr, &private.socket()).await?;
    let mut command = match a.command.is_empty() {
        true => None,
        false => Some(start_command(
            &a.command,
            &side.socket,
            a.agent_path.as_deref(),
        )?),
    };
    if let Some(pid) = command.as_ref().and_then(tokio::process::Child::id) {
        // Without it the sidecar only cannot tell whose growth it sees.
        if let Err(e) = std::fs::write(&trainer_pid, pid.to_string()) {
            eprintln!(
                "memprof profile: {}: {e} (a neighbour's growth will read as the trainer's)",
                trainer_pid.display()
            );
        }
    }
    let watched = live::watch(&mut side, command.as_mut()).await;
    // The trainer's last push needs one sampling interval to be taken.
    if command.is_some() {
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    side.stop().await;
    if let Some(why) = &watched.blind {
        eprintln!("{}", blind_line(why, a.sample.backend()));
        return Ok(BLIND);
    }
    finish(&a, &files, watched, started)
}

/// Exit status when nothing could be seen: no GPU and no agent data.
pub const BLIND: i32 = 4;

/// The one line said when a run sees nothing; on real GPUs, how to try
/// memprof without one (a run on a scenario or a trace has its source: the
/// sidecar's reason says what was wrong with it).
pub fn blind_line(why: &str, backend: Backend) -> String {
    let hint = match backend {
        Backend::Nvml => " (to try memprof without a GPU: --scenario hack/scenarios/demo.yaml)",
        Backend::Sim | Backend::Trace => "",
    };
    format!("memprof: no GPU and no agent data, nothing was watched: {why}{hint}")
}

/// After the sidecar stopped: the summary from its final report and trace,
/// `--plot`; the command's status, or [`BLIND`] when the whole run saw nothing.
fn finish(
    a: &Args,
    files: &Files,
    watched: live::Watched,
    started: Instant,
) -> Result<i32, ProfileError> {
    let rows =
        memprof_api::trace::read_trace(&files.trace.display().to_string()).unwrap_or_default();
    let written: Option<serde_json::Value> = std::fs::read(&files.output)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok());
    let report: Option<MemoryReportSpec> =
        written.clone().and_then(|v| serde_json::from_value(v).ok());
    let (Some(written), Some(report)) = (written, report) else {
        return Err(ProfileError::NoReport);
    };
    let counts = summary::sample_counts(&rows);
    let run = summary::Run {
        report: &report,
        tracker: &watched.tracker,
        samples: &counts,
        transitions: &watched.transitions,
        seconds: rows.last().map_or(started.elapsed().as_secs_f64(), |r| r.t),
        pid: watched.pid,
    };
    println!();
    print!("{}", summary::summary(&run));
    // The file holds what the table showed: free memory, utilization, samples.
    if let Some(path) = &a.output {
        let json = summary::with_run_numbers(&written, &run);
        let text = serde_json::to_string_pretty(&json).unwrap_or_default() + "\n";
        std::fs::write(path, text).map_err(|error| ProfileError::Write {
            path: path.clone(),
            error,
        })?;
    }
    if let Some(path) = &a.plot {
        let chart = summary::timeline(&rows, &watched.transitions, Some(&report));
        crate::plot::write_image(path, &chart.to_svg())
            .map_err(|e| ProfileError::Usage(format!("--plot: {e}")))?;
        println!("plot written to {}", path.display());
    }
    if let Some(path) = &a.oom_snapshot {
        write_oom_snapshot(path, &report)?;
    }
    add_point(a.points.as_deref(), &a.command, &report);
    match live::nothing_seen(&report).filter(|_| !a.blind_ok) {
        Some(why) => {
            eprintln!("{}", blind_line(&why, a.sample.backend()));
            Ok(if watched.code != 0 {
                watched.code
            } else {
                BLIND
            })
        }
        None => Ok(watched.code),
    }
}

/// `--points FILE`: the run's measurement beside FILE's estimate of the
/// same command, said in one line; a file that cannot be used is said too,
/// and leaves the run's exit status alone (the trainer's).
fn add_point(points: Option<&Path>, command: &[String], report: &MemoryReportSpec) {
    if let Some(path) = points {
        let added = crate::local::points::add_profiled(path, command, report);
        eprintln!("{}", added.unwrap_or_else(|e| format!("memprof: {e}")));
    }
}

/// `--oom-snapshot`: the agent's newest OOM as memory_viz's pickle, or one
/// line saying there was none (nothing is written then).
fn write_oom_snapshot(path: &Path, report: &MemoryReportSpec) -> Result<(), ProfileError> {
    match report.allocator.as_ref().and_then(|a| a.oom.as_ref()) {
        Some(oom) => {
            crate::memviz::write(path, oom).map_err(|error| ProfileError::Write {
                path: path.into(),
                error,
            })?;
            println!("{}", crate::memviz::written(path, oom));
        }
        None => eprintln!(
            "memprof profile: the agent saw no CUDA OOM, nothing written to {} (--oom-snapshot)",
            path.display()
        ),
    }
    Ok(())
}

pub(crate) fn start_command(
    command: &[String],
    socket: &Path,
    agent_path: Option<&Path>,
) -> Result<tokio::process::Child, ProfileError> {
    let mut cmd = tokio::process::Command::new(&command[0]);
    // The socket, never a URL: an old MEMPROF_AGENT_URL in the environment
    // would point the agent at some other (unauthenticated) endpoint.
    cmd.args(&command[1..])
        .env(memprof_api::env::AGENT_SOCKET, socket)
        .env_remove("MEMPROF_AGENT_URL");
    let tree = agent_tree(agent_path);
    match &tree {
        Some(tree) => {
            let own = std::env::var("PYTHONPATH").ok();
            cmd.env("PYTHONPATH", python_path(tree, own.as_deref()));
        }
        None => eprintln!(
            "memprof: no agent tree at {} (--agent-path): the command's own memprof_agent.start(), if any, pushes to the sidecar",
            agent_path.map_or(DEFAULT_AGENT_SOURCE.into(), |p| p.display().to_string())
        ),
    }
    cmd.spawn().map_err(|error| ProfileError::Command {
        command: command.join(" "),
        error,
    })
}

pub(crate) fn exit_code(status: Option<ExitStatus>) -> i32 {
    use std::os::unix::process::ExitStatusExt as _;
    match status {
        Some(s) => s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0)),
        None => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `memprof profile` parsed on its own.
    #[derive(clap::Parser)]
    #[command(name = "memprof profile")]
    struct Raw {
        #[command(flatten)]
        args: Args,
    }

    fn parse(v: &[&str]) -> Args {
        use clap::Parser as _;
        Raw::try_parse_from(std::iter::once("p").chain(v.iter().copied()))
            .expect("valid flags")
            .args
    }

    #[test]
    fn flags_map_to_the_sidecars_and_the_command_follows_the_double_dash() {
        let a = parse(&[
            "--devices",
            "0,GPU-x",
            "--duration",
            "30",
            "--backend",
            "sim",
            "--scenario",
            "s.yaml",
            "--",
            "python",
            "train.py",
            "--",
            "x",
        ]);
        assert_eq!(a.command, ["python", "train.py", "--", "x"]);
        let f = a
            .sample
            .sidecar_flags(Path::new("t.csv"), Path::new("r.json"));
        let has = |k: &str, v: &str| f.windows(2).any(|w| w[0] == k && w[1] == v);
        assert!(
            has("--gpus", "0,GPU-x") && has("--duration", "30") && has("--backend", "sim"),
            "{f:?}"
        );
        assert!(
            has("--trace-out", "t.csv") && has("--output", "r.json") && has("--scenario", "s.yaml"),
            "{f:?}"
        );
        let a = parse(&["python", "train.py"]);
        assert_eq!(a.command, ["python", "train.py"]);
        assert!(!a
            .sample
            .sidecar_flags(Path::new("t"), Path::new("o"))
            .contains(&"--duration".to_string()));
        assert!(
            parse(&["--backend", "sim"]).check().is_err(),
            "sim needs a scenario"
        );
        assert_eq!(
            parse(&["--interval", "5"]).sample.interval,
            Duration::from_secs(5)
        );
    }

    #[test]
    fn the_hook_goes_first_the_users_path_stays_and_the_package_goes_last() {
        let tree = AgentTree {
            bootstrap: "/a/bootstrap".into(),
            lib: "/a/lib".into(),
        };
        assert_eq!(
            python_path(&tree, Some("/mine")),
            "/a/bootstrap:/mine:/a/lib"
        );
        assert_eq!(python_path(&tree, Some("")), "/a/bootstrap:/a/lib");
        assert_eq!(python_path(&tree, None), "/a/bootstrap:/a/lib");
    }

    #[test]
    fn a_source_checkout_is_an_agent_tree() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let checkout = root.join("agent/python");
        let tree = find_tree(&checkout).expect("agent/python is a tree");
        assert_eq!(tree.lib, checkout);
        assert!(find_tree(&root).is_none());
    }
}
