//! `memprof sweep [--vary VAR=v1,v2,…]… -- CMD…`: runs a training command
//! over a grid of environment values, one process per configuration (so one
//! configuration's allocator cache never colours the next), with the agent
//! auto-enabled, a step budget and a timeout per run; records each run's
//! peaks, breakdown, step time and OOM; fits peak = static + perUnit × value
//! per swept variable and prints the largest safe value under the headroom.
//! docs/sweep.md describes the output.

pub mod grid;
pub mod html;
pub mod model;
pub mod output;
pub mod record;
pub mod runner;

use crate::local::sweep::grid::Config;
use crate::local::sweep::model::{Metric, Target};
use crate::local::sweep::output::SweepResult;
use crate::local::sweep::record::{RunRecord, Status};
use crate::local::sweep::runner::Plan;
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
    /// Seconds a run may take before its process group is killed.
    #[arg(long, default_value_t = 600.0)]
    pub timeout: f64,
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
    #[error("cannot create {path}: {source}")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A run could not be set up.
    #[error(transparent)]
    Run(#[from] runner::RunError),
    /// An output file could not be written.
    #[error("cannot write {path}: {source}; check the directory exists and is writable")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Runs the subcommand; returns the process exit code: 0 when at least one
/// run ended ok or in an OOM (both are results), 1 when none did, 130 when
/// interrupted.
pub async fn run(args: Args) -> anyhow::Result<i32> {
    let command = args.command.clone();
    let configs = plan_grid(&args)?;
    let (dir, temporary) = log_dir(args.logs.as_deref())?;
    let plan = Plan {
        command,
        steps: (args.steps > 0).then_some(args.steps),
        timeout: Duration::from_secs_f64(args.timeout),
        tree: crate::local::profile::agent_tree(args.agent_path.as_deref()),
        agent_path: args.agent_path.clone(),
        nvml: args.nvml,
        memprof_exe: std::env::current_exe()?,
        dir: dir.clone(),
    };
    if plan.tree.is_none() {
        eprintln!("memprof sweep: no agent tree at {} (--agent-path): only a command that starts memprof_agent itself writes a summary", args.agent_path.as_deref().map_or(memprof_api::DEFAULT_AGENT_SOURCE.into(), |p| p.display().to_string()));
    }
    let started_at = jiff::Timestamp::now().to_string();
    let (runs, interrupted) = run_all(&plan, &configs).await;
    if temporary {
        let _ = std::fs::remove_dir_all(&dir);
    }
    let runs = runs?;
    let result = conclude(&args, started_at, runs, interrupted);
    print_result(&result);
    write_outputs(&args, &result)?;
    Ok(exit_code(&result))
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
    if !(args.timeout > 0.0 && args.timeout.is_finite()) {
        return Err(SweepError::Flag(format!(
            "--timeout {} must be a positive number of seconds",
            args.timeout
        )));
    }
    let varies = args
        .vary
        .iter()
        .map(|v| grid::parse_vary(v))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(grid::product(&varies)?)
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
    std::fs::create_dir_all(&dir).map_err(|source| SweepError::Dir {
        path: dir.clone(),
        source,
    })?;
    Ok((dir, temporary))
}

/// Runs every configuration in turn; stops at Ctrl-C (the run in flight is
/// killed and not recorded).
async fn run_all(plan: &Plan, configs: &[Config]) -> (Result<Vec<RunRecord>, SweepError>, bool) {
    let mut progress = Progress::new(configs.len());
    let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).ok();
    let mut runs = vec![];
    for (i, config) in configs.iter().enumerate() {
        progress.starting(i, config);
        let cancel = async {
            match sigint.as_mut() {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending().await,
            }
        };
        let (outcome, cancelled) = match runner::run_one(plan, i, config, cancel).await {
            Ok(x) => x,
            Err(e) => return (Err(e.into()), false),
        };
        if cancelled {
            progress.finish();
            eprintln!(
                "memprof sweep: interrupted; {} of {} configurations done",
                runs.len(),
                configs.len()
            );
            return (Ok(runs), true);
        }
        let mut r = record::record(
            i,
            config,
            &outcome.exit,
            outcome.duration_seconds,
            outcome.summary,
            &outcome.stderr_tail,
        );
        if outcome.nvml_peak_bytes.is_some() {
            r.nvml_peak_bytes = outcome.nvml_peak_bytes;
        }
        r.nvml_note = r
            .nvml_peak_bytes
            .is_none()
            .then_some(outcome.nvml_note)
            .flatten();
        progress.done(i, config, &r);
        runs.push(r);
    }
    progress.finish();
    (Ok(runs), false)
}

fn conclude(
    args: &Args,
    started_at: String,
    runs: Vec<RunRecord>,
    interrupted: bool,
) -> SweepResult {
    let variables: Vec<String> = args
        .vary
        .iter()
        .filter_map(|v| grid::parse_vary(v).ok().map(|v| v.name))
        .collect();
    let target = Target {
        metric: args.metric,
        headroom: args.headroom,
        limit_override: args.limit_bytes,
    };
    let models = model::models(&variables, &runs, target);
    SweepResult {
        kind: output::KIND.into(),
        version: 1,
        started_at,
        command: args.command.clone(),
        variables,
        step_budget: (args.steps > 0).then_some(args.steps),
        timeout_seconds: args.timeout,
        metric: args.metric,
        headroom: args.headroom,
        limit_bytes: args.limit_bytes,
        nvml: args.nvml,
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
        std::fs::write(path, text).map_err(|source| SweepError::Write {
            path: path.to_path_buf(),
            source,
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

/// `123`, `80GB`, `80 GiB`, `512MiB`: bytes.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?}: expected bytes, e.g. 80000000000, 80GB or 40GiB"))?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024f64.powi(2),
        "gib" => 1024f64.powi(3),
        "tib" => 1024f64.powi(4),
        u => {
            return Err(format!(
                "{s:?}: unknown unit {u:?} (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"
            ))
        }
    };
    Ok((n * mult).round() as u64)
}

/// Progress on stderr: a bar redrawn in place on a terminal, one line per
/// finished run otherwise (logs, CI).
struct Progress {
    tty: bool,
    total: usize,
}

impl Progress {
    fn new(total: usize) -> Self {
        Progress {
            tty: std::io::IsTerminal::is_terminal(&std::io::stderr()),
            total,
        }
    }

    fn starting(&mut self, i: usize, config: &Config) {
        let mut err = std::io::stderr().lock();
        if self.tty {
            let _ = write!(
                err,
                "\r\x1b[2K{}",
                output::bar(i, self.total, &config.label(), 30)
            );
        } else {
            let _ = writeln!(
                err,
                "memprof sweep: [{}/{}] {}: running",
                i + 1,
                self.total,
                config.label()
            );
        }
        let _ = err.flush();
    }

    fn done(&mut self, i: usize, config: &Config, r: &RunRecord) {
        let line = output::run_line(i + 1, self.total, config, r);
        let mut err = std::io::stderr().lock();
        if self.tty {
            let _ = writeln!(err, "\r\x1b[2K{line}");
        } else {
            let _ = writeln!(err, "memprof sweep: {line}");
        }
    }

    fn finish(&mut self) {
        if self.tty {
            let _ = write!(std::io::stderr(), "\r\x1b[2K");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_take_decimal_and_binary_units() {
        assert_eq!(parse_bytes("123"), Ok(123));
        assert_eq!(parse_bytes("80GB"), Ok(80_000_000_000));
        assert_eq!(parse_bytes("1.5 GiB"), Ok(1_610_612_736));
        assert_eq!(parse_bytes("512MiB"), Ok(512 * 1024 * 1024));
        assert!(parse_bytes("80 parsecs")
            .unwrap_err()
            .contains("unknown unit"));
        assert!(parse_bytes("GB").is_err());
    }
}
