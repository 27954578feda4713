//! `memprof sweep [--vary VAR=v1,v2,…]… -- CMD…`: runs a training command
//! over a grid of environment values, one process per configuration (so one
//! configuration's allocator cache never colours the next), with the agent
//! auto-enabled, a step budget and a timeout per run; records each run's
//! peaks, breakdown, step time and OOM; fits peak = static + perUnit × value
//! with the one memory model (`memprof_analysis::memmodel`) per swept
//! variable, then verifies: the model proposes the largest value it expects
//! to fit and real runs decide, bisecting between what ran and what failed
//! (`verify.rs`), so that the value called safe is one that ran.
//! docs/sweep.md describes the output.

pub mod charts;
pub mod grid;
pub mod html;
pub mod model;
pub mod output;
pub mod pictures;
pub mod record;
pub mod runner;
pub mod session;
pub mod verify;

use crate::local::sweep::grid::Config;
use crate::local::sweep::model::{Metric, Target};
use crate::local::sweep::output::SweepResult;
use crate::local::sweep::record::{RunRecord, Status};
use crate::local::sweep::runner::Plan;
use crate::local::sweep::session::Session;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Flags of `memprof sweep`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// A variable and its values, e.g. `--vary BATCH_SIZE=8,16,32`; repeat
    /// for a grid (every combination runs).
    #[arg(long, value_name = "VAR=V1,V2,…")]
    pub vary: Vec<String>,
    /// Step budget per run (`MEMPROF_AGENT_MAX_STEPS`: the agent ends the
    /// run after this step); 0 leaves the trainer's own length.
    #[arg(long, default_value_t = 20)]
    pub steps: u64,
    /// How long a run may take before its process group is killed (`600`,
    /// `600s`, `10m`; a bare number is seconds).
    #[arg(long, default_value = "10m", value_name = "DURATION", value_parser = crate::duration::parse)]
    pub timeout: Duration,
    /// Fraction of device memory to keep free in the recommendation.
    #[arg(long, default_value_t = 0.1)]
    pub headroom: f64,
    /// Device memory to plan against (bytes, or e.g. `80GB`, `40GiB`)
    /// instead of the agent's `deviceTotalBytes`.
    #[arg(long, value_parser = parse_bytes)]
    pub limit_bytes: Option<u64>,
    /// The peak the model fits.
    #[arg(long, value_enum, default_value_t = Metric::Reserved)]
    pub metric: Metric,
    /// Skip the verification runs: the model's prediction is printed as
    /// not verified, and only values that ran are called safe.
    #[arg(long)]
    pub no_verify: bool,
    /// Most verification runs per model (per swept variable and group).
    #[arg(long, default_value_t = 4)]
    pub verify_runs: usize,
    /// The step a variable's values are searched on, e.g. `--step
    /// BATCH_SIZE=8` (default: the greatest common divisor of its values).
    #[arg(long, value_name = "VAR=N")]
    pub step: Vec<String>,
    /// Run each configuration through `memprof profile` (a standalone
    /// sidecar next to it) to record the NVML peak.
    #[arg(long)]
    pub nvml: bool,
    /// Write the result (runs and models) as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write one CSV row per run here.
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Write a self-contained HTML report (plots and table) here.
    #[arg(long)]
    pub html: Option<PathBuf>,
    /// A line shown at the top of the HTML report and kept in the JSON
    /// (e.g. the machine and model).
    #[arg(long)]
    pub note: Option<String>,
    /// Keep each run's stdout, stderr and summary in this directory
    /// (default: a temporary directory, removed at the end).
    #[arg(long)]
    pub logs: Option<PathBuf>,
    /// How often the agent pushes (`MEMPROF_AGENT_INTERVAL`): each run's
    /// memory timeline has one point per push (`250ms`, `1s`, `1`; 10ms..60s).
    #[arg(long, default_value = "250ms", value_name = "DURATION", value_parser = crate::duration::parse_interval)]
    pub agent_interval: Duration,
    /// Write every chart as SVG and PNG into this directory: the peak per
    /// swept variable, the memory timeline per configuration, the peak
    /// heatmap over two variables, one step's forward/backward/optimizer
    /// timeline, the breakdown and the memory/step-time trade-off.
    #[arg(long)]
    pub plot_dir: Option<PathBuf>,
    /// The agent tree started in the command with no code change (the
    /// image's /opt/memprof/agent, or a checkout's agent/python).
    #[arg(long)]
    pub agent_path: Option<PathBuf>,
    /// The training command, after `--`.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
    pub command: Vec<String>,
}

/// Why a sweep could not run.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    /// A `--vary` list is wrong.
    #[error(transparent)]
    Grid(#[from] grid::GridError),
    /// A flag is out of range.
    #[error("{0}")]
    Flag(String),
    /// The log directory could not be made.
    #[error("cannot create {path}: {error}")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// A run could not be set up.
    #[error(transparent)]
    Run(#[from] runner::RunError),
    /// A chart could not be written.
    #[error(transparent)]
    Image(#[from] crate::plot::ImageError),
    /// A file or folder the sweep was asked to write cannot be (checked before it starts).
    #[error(transparent)]
    OutFile(#[from] crate::outfile::OutFileError),
    /// An output file could not be written.
    #[error("cannot write {path}: {error}; check the directory exists and is writable")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
}

/// Runs the subcommand; returns the process exit code: 0 when at least one
/// run ended ok or in an OOM (both are results), 1 when none did, 130 when
/// interrupted.
pub async fn run(args: Args) -> anyhow::Result<i32> {
    crate::help::check_command::<Args>("sweep", &args.command)
        .map_err(|e| SweepError::Flag(e.to_string()))?;
    let configs = plan_grid(&args)?;
    prepare_outputs(&args)?;
    let target = target_of(&args)?;
    let (dir, temporary) = log_dir(args.logs.as_deref())?;
    let plan = Plan {
        command: args.command.clone(),
        steps: (args.steps > 0).then_some(args.steps),
        timeout: args.timeout,
        tree: crate::local::profile::agent_tree(args.agent_path.as_deref()),
        agent_path: args.agent_path.clone(),
        nvml: args.nvml,
        memprof_exe: std::env::current_exe()?,
        dir: dir.clone(),
        agent_interval: crate::duration::millis(args.agent_interval),
    };
    if plan.tree.is_none() {
        eprintln!("memprof sweep: no agent tree at {} (--agent-path): only a command that starts memprof_agent itself writes a summary", args.agent_path.as_deref().map_or(memprof_api::DEFAULT_AGENT_SOURCE.into(), |p| p.display().to_string()));
    }
    let started_at = jiff::Timestamp::now().to_string();
    let mut session = Session::new(&plan, configs.len());
    let outcome = run_all(&args, &mut session, &configs, &target).await;
    session.finish();
    if temporary {
        let _ = std::fs::remove_dir_all(&dir);
    }
    let (runs, interrupted) = outcome?;
    let result = conclude(&args, &target, started_at, runs, interrupted);
    print_result(&result);
    write_outputs(&args, &result)?;
    Ok(exit_code(&result))
}

/// The grid, then the verification runs; stops at Ctrl-C.
async fn run_all(
    args: &Args,
    session: &mut Session<'_>,
    configs: &[Config],
    target: &Target,
) -> Result<(Vec<RunRecord>, bool), SweepError> {
    let mut runs = vec![];
    for config in configs {
        match session.run(config, None).await? {
            Some(r) => runs.push(r),
            None => return Ok((runs, true)),
        }
    }
    let budget = if args.no_verify { 0 } else { args.verify_runs };
    let interrupted = verify::verify(session, &variables(args), target, budget, &mut runs).await?;
    Ok((runs, interrupted))
}

fn variables(args: &Args) -> Vec<String> {
    args.vary
        .iter()
        .filter_map(|v| grid::parse_vary(v).ok().map(|v| v.name))
        .collect()
}

/// The model's inputs from the flags; `--step VAR=N` parsed.
fn target_of(args: &Args) -> Result<Target, SweepError> {
    let mut steps = std::collections::BTreeMap::new();
    for s in &args.step {
        let parsed = s
            .split_once('=')
            .and_then(|(k, v)| Some((k.trim(), v.trim().parse::<u64>().ok()?)))
            .filter(|(_, n)| *n >= 1);
        let Some((name, n)) = parsed else {
            return Err(SweepError::Flag(format!(
                "--step {s:?}: expected VAR=N with N a whole number >= 1, e.g. --step BATCH_SIZE=8"
            )));
        };
        steps.insert(name.to_string(), n as f64);
    }
    Ok(Target {
        metric: args.metric,
        headroom: args.headroom,
        limit_override: args.limit_bytes,
        steps,
    })
}

fn plan_grid(args: &Args) -> Result<Vec<Config>, SweepError> {
    if !(0.0..1.0).contains(&args.headroom) {
        return Err(SweepError::Flag(format!(
            "--headroom {} must be a fraction in [0, 1), e.g. 0.1 for 10%",
            args.headroom
        )));
    }
    if args.metric == Metric::Nvml && !args.nvml {
        return Err(SweepError::Flag(
            "--metric nvml needs --nvml (the sidecar measures the NVML peak)".into(),
        ));
    }
    if args.timeout.is_zero() {
        return Err(SweepError::Flag(
            "--timeout 0: give a run some time, e.g. --timeout 10m".into(),
        ));
    }
    let varies = args
        .vary
        .iter()
        .map(|v| grid::parse_vary(v))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(grid::product(&varies)?)
}

/// `--json`, `--csv`, `--html`, `--plot-dir` and `--logs`, checked (folders
/// made) before the first run: a sweep of an hour must not end with
/// nowhere to put its result.
fn prepare_outputs(args: &Args) -> Result<(), SweepError> {
    use crate::outfile::{prepare, prepare_dir};
    for (flag, file) in [
        ("--json", &args.json),
        ("--csv", &args.csv),
        ("--html", &args.html),
    ] {
        if let Some(p) = file {
            prepare(flag, p)?;
        }
    }
    for (flag, dir) in [("--plot-dir", &args.plot_dir), ("--logs", &args.logs)] {
        if let Some(d) = dir {
            prepare_dir(flag, d)?;
        }
    }
    Ok(())
}

fn log_dir(logs: Option<&Path>) -> Result<(PathBuf, bool), SweepError> {
    let (dir, temporary) = match logs {
        Some(d) => (d.to_path_buf(), false),
        None => {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let name = format!("memprof-sweep-{}-{nanos}", std::process::id());
            (std::env::temp_dir().join(name), true)
        }
    };
    std::fs::create_dir_all(&dir).map_err(|error| SweepError::Dir {
        path: dir.clone(),
        error,
    })?;
    Ok((dir, temporary))
}

fn conclude(
    args: &Args,
    target: &Target,
    started_at: String,
    runs: Vec<RunRecord>,
    interrupted: bool,
) -> SweepResult {
    let variables = variables(args);
    let models = model::models(&variables, &runs, target);
    SweepResult {
        kind: output::KIND.into(),
        version: output::VERSION,
        started_at,
        command: args.command.clone(),
        variables,
        step_budget: (args.steps > 0).then_some(args.steps),
        timeout_seconds: args.timeout.as_secs_f64(),
        metric: args.metric,
        headroom: args.headroom,
        limit_bytes: args.limit_bytes,
        nvml: args.nvml,
        verify_runs: if args.no_verify { 0 } else { args.verify_runs },
        agent_interval: crate::duration::millis(args.agent_interval),
        interrupted,
        note: args.note.clone(),
        runs,
        models,
    }
}

fn print_result(r: &SweepResult) {
    let mut out = std::io::stdout().lock();
    let _ = write!(out, "{}", output::table(&r.variables, &r.runs));
    for m in &r.models {
        let _ = writeln!(out);
        for line in model::describe(m) {
            let _ = writeln!(out, "{line}");
        }
    }
}

fn write_outputs(args: &Args, r: &SweepResult) -> Result<(), SweepError> {
    let write = |path: &Path, text: String| {
        std::fs::write(path, text).map_err(|error| SweepError::Write {
            path: path.to_path_buf(),
            error,
        })
    };
    if let Some(p) = &args.json {
        write(
            p,
            serde_json::to_string_pretty(r).unwrap_or_default() + "\n",
        )?;
    }
    if let Some(p) = &args.csv {
        write(p, record::to_csv(&r.variables, &r.runs))?;
    }
    if let Some(p) = &args.html {
        write(p, html::render(r))?;
    }
    if let Some(dir) = &args.plot_dir {
        write_plots(dir, r)?;
    }
    Ok(())
}

/// Every chart as `NAME.svg` and `NAME.png` in `dir`; prints what it wrote.
fn write_plots(dir: &Path, r: &SweepResult) -> Result<(), SweepError> {
    std::fs::create_dir_all(dir).map_err(|error| SweepError::Dir {
        path: dir.to_path_buf(),
        error,
    })?;
    let mut names = vec![];
    for f in charts::figures(r) {
        for ext in ["svg", "png"] {
            let path = dir.join(format!("{}.{ext}", f.file));
            crate::plot::write_image(&path, &f.svg)?;
        }
        names.push(f.file);
    }
    eprintln!(
        "memprof sweep: wrote {} chart(s) as SVG and PNG to {}: {}",
        names.len(),
        dir.display(),
        names.join(", ")
    );
    Ok(())
}

fn exit_code(r: &SweepResult) -> i32 {
    if r.interrupted {
        return 130;
    }
    let results = r
        .runs
        .iter()
        .any(|x| matches!(x.status, Some(Status::Ok | Status::Oom)));
    if results {
        0
    } else {
        1
    }
}

/// Byte sizes are parsed in one place, beside `format_bytes`.
pub use memprof_api::parse_bytes;
