//! `memprof estimate [--gpu H100-80GB] [--vary NAME=v1,v2] -- python train.py`:
//! will this configuration fit on this card, before launch and with no GPU.
//! The script runs unchanged on the CPU under fake tensors (the agent's
//! `memprof_agent.estimate`); this side adds the constants measured on a
//! real GPU (bench/estimate/calibration.json), judges the verdict with the
//! calibration's worst under-estimate as margin, and prints it. Exit 0 when
//! it fits, 2 when it does not, 1 on an error. docs/estimate.md.

pub mod calibration;
pub mod gpus;
pub mod python;
pub mod render;
pub mod verdict;

use crate::local::command_line::Launch;
use crate::local::points;
use crate::output::{Format, OutputArgs};
use calibration::{Accuracy, Calibration};
use python::{Answer, Request};
use serde::Serialize;
use std::path::PathBuf;

/// Flags of `memprof estimate`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The card to judge against: a model (H100-80GB, H200, A100-40GB, L4, ...)
    /// or a memory size (80GiB, 40GB).
    #[arg(long, default_value = "H100-80GB")]
    pub gpu: String,
    /// Optimizer steps to run under fake tensors (the peak is usually in the
    /// second, once the optimizer state exists); 0 runs the whole script.
    #[arg(long, default_value_t = 2)]
    pub steps: u64,
    /// An environment variable the script reads and its values, e.g.
    /// `--vary BATCH_SIZE=4,8,16,32`: bisects for the largest that fits.
    #[arg(long, value_name = "NAME=V1,V2,…")]
    pub vary: Option<String>,
    /// Ranks of the fake process group (DDP/FSDP); a torchrun command's
    /// `--nproc_per_node` is read by itself.
    #[arg(long)]
    pub world_size: Option<u32>,
    /// The interpreter with torch, when the command does not start with one.
    #[arg(long, env = "MEMPROF_PYTHON", default_value = "python3")]
    pub python: String,
    /// The agent tree (the image's /opt/memprof/agent, or a checkout's agent/python).
    #[arg(long)]
    pub agent_path: Option<PathBuf>,
    /// Print the error on the recorded calibration points and exit.
    #[arg(long)]
    pub accuracy: bool,
    /// A calibration measured on your own cards (what
    /// bench/gpu/estimate_calibrate.py writes) instead of the built-in one.
    #[arg(long, value_name = "FILE")]
    pub calibration: Option<PathBuf>,
    /// Record this estimate in FILE (made if missing), where `memprof profile
    /// --points FILE` of the same command on a GPU adds the measured peak as
    /// a calibration point; the error and the margin count FILE's points.
    #[arg(long, value_name = "FILE")]
    pub points: Option<PathBuf>,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub output: OutputArgs,
    /// The training command, after `--`.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<String>,
}

/// Why no estimate was made.
#[derive(Debug, thiserror::Error)]
pub enum EstimateError {
    /// `--gpu` not understood.
    #[error(transparent)]
    Gpu(#[from] gpus::UnknownGpu),
    /// Nothing after `--`.
    #[error("no training command: put it after --, e.g. memprof estimate --gpu H100-80GB -- python train.py")]
    NoCommand,
    /// The agent package is not where it was looked for.
    #[error("the memprof agent is not at {0}: pass --agent-path (a checkout's agent/python)")]
    NoAgent(String),
    /// The interpreter could not run the estimator.
    #[error(transparent)]
    Python(#[from] python::PythonError),
    /// The script raised under fake tensors.
    #[error("the script failed under fake tensors{at}: {error}; check that `{python} {script}` runs, and see docs/estimate.md for what a fake run cannot do")]
    Script {
        /// The exception.
        error: String,
        /// ` at file:line`, or empty.
        at: String,
        /// The interpreter.
        python: String,
        /// The script.
        script: String,
    },
}

/// One rank's parts, in bytes.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RankParts {
    /// The rank (data-parallel ranks hold the same; rank 0 is estimated).
    pub rank: u32,
    /// The fake run's record.
    #[serde(flatten)]
    pub run: python::RankRun,
    /// Allocated peak beyond the tracked tensors: 512 B blocks, unsplit remainders.
    pub allocator_rounding_bytes: u64,
    /// Reserved beyond allocated: 2 MiB / 20 MiB segments, cached free blocks.
    pub allocator_reserve_bytes: u64,
    /// Measured: the cuBLAS workspace (inside allocated).
    pub workspace_bytes: u64,
    /// Measured: CUDA context, handles and kernels, outside the allocator.
    pub context_bytes: u64,
    /// Measured: NCCL's buffers (world size > 1).
    pub nccl_bytes: u64,
}

/// `memprof estimate -o json`.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Estimate {
    /// Always `memprofEstimate`.
    pub kind: &'static str,
    /// Of this shape.
    pub version: u32,
    /// The card.
    pub gpu: String,
    /// Its memory.
    pub gpu_total_bytes: u64,
    /// torch where the fake run ran.
    pub torch: Option<String>,
    /// MemTracker or the dispatch fallback.
    pub tracker: Option<String>,
    /// Ranks.
    pub world_size: u32,
    /// One entry per distinct rank role (rank 0).
    pub ranks: Vec<RankParts>,
    /// Fits or not.
    pub verdict: verdict::Verdict,
    /// The --vary bisection.
    pub vary: Option<serde_json::Value>,
    /// The error on the recorded points.
    pub accuracy: Accuracy,
    /// Parts from the fake run and the allocator model.
    pub modelled: Vec<&'static str>,
    /// Parts measured on a real GPU.
    pub measured: Vec<&'static str>,
    /// Seconds the estimate took.
    pub seconds: f64,
}

/// Runs the subcommand; returns the process exit code.
pub async fn run(args: Args) -> anyhow::Result<i32> {
    let mut cal = calibration::load(args.calibration.as_deref())?;
    let recorded = args.points.as_deref().map(points::load).transpose()?;
    if let Some(r) = &recorded {
        cal.points.extend(calibration::profiled(r));
    }
    if args.points.is_some() && args.vary.is_some() && !args.accuracy {
        return Err(points::PointsError::Vary.into());
    }
    let accuracy = calibration::accuracy(&cal);
    if args.accuracy {
        print(
            &render::accuracy_table(&cal, &accuracy),
            &accuracy,
            args.output.format,
        );
        return Ok(0);
    }
    let estimate = estimate(&args, &cal, accuracy)?;
    print(
        &render::table(&estimate, &cal),
        &estimate,
        args.output.format,
    );
    if let (Some(path), Some(points)) = (&args.points, recorded) {
        eprintln!("{}", record(path, points, &args, &estimate)?);
    }
    Ok(if estimate.verdict.fits { 0 } else { 2 })
}

/// `--points FILE`: the estimate recorded for a profiled run of the same
/// command to measure; the line that says so.
fn record(
    path: &std::path::Path,
    mut recorded: points::Points,
    args: &Args,
    e: &Estimate,
) -> Result<String, points::PointsError> {
    let (command, world_size) = points::key(&args.command, args.world_size);
    let run = &e.ranks[0].run;
    recorded.estimated(points::Entry {
        command: command.clone(),
        world_size,
        gpu: e.gpu.clone(),
        estimate: points::Peaks {
            allocated_bytes: run.allocated_peak_bytes,
            reserved_bytes: run.reserved_peak_bytes,
        },
        measured: None,
    });
    points::save(path, &recorded)?;
    Ok(format!(
        "memprof: estimate of `{command}` ({world_size} rank(s)) recorded in {p}; `memprof profile --points {p} -- COMMAND` on a GPU adds what it measures",
        p = path.display()
    ))
}

fn print<T: Serialize>(table: &str, value: &T, format: Format) {
    if format.is_structured() {
        crate::output::print(&crate::output::structured(value, format));
    } else {
        crate::output::print(table);
    }
}

/// Steps: the card, the command, the fake run, the parts, the verdict.
pub fn estimate(
    args: &Args,
    cal: &Calibration,
    accuracy: Accuracy,
) -> Result<Estimate, EstimateError> {
    let gpu = gpus::parse(&args.gpu)?;
    if args.command.is_empty() {
        return Err(EstimateError::NoCommand);
    }
    let launch = crate::local::command_line::launch(&args.command, &args.python);
    let world = args.world_size.or(launch.world_size).unwrap_or(1).max(1);
    let margin = accuracy.worst_reserved_under_pct / 100.0;
    let fixed = fixed_bytes(cal, world);
    let req = request(
        args,
        &gpu,
        cal,
        world,
        verdict::reserved_budget(gpu.total_bytes, fixed, margin),
    )?;
    let answer = python::estimate(&launch, &req)?;
    check(&answer, &launch)?;
    let verdict = verdict::judge(
        answer.rank.reserved_peak_bytes,
        fixed,
        margin,
        gpu.total_bytes,
    );
    Ok(assemble(answer, &gpu, cal, world, verdict, accuracy))
}

/// Context, plus NCCL's buffers when there is more than one rank.
fn fixed_bytes(cal: &Calibration, world: u32) -> u64 {
    let nccl = if world > 1 {
        cal.constants.nccl_bytes.unwrap_or(0)
    } else {
        0
    };
    cal.constants.context_bytes + nccl
}

fn request(
    args: &Args,
    gpu: &gpus::Gpu,
    cal: &Calibration,
    world: u32,
    budget: u64,
) -> Result<Request, EstimateError> {
    let tree = crate::local::profile::agent_tree(args.agent_path.as_deref()).ok_or_else(|| {
        EstimateError::NoAgent(
            args.agent_path
                .as_ref()
                .map_or(memprof_api::DEFAULT_AGENT_SOURCE.to_string(), |p| {
                    p.display().to_string()
                }),
        )
    })?;
    Ok(Request {
        agent_lib: tree.lib,
        steps: args.steps,
        world_size: world,
        gpu_name: gpu.name.clone(),
        total_bytes: gpu.total_bytes,
        workspace_bytes: cal.constants.workspace_bytes,
        budget_bytes: budget,
        vary: args.vary.clone(),
    })
}

fn check(answer: &Answer, launch: &Launch) -> Result<(), EstimateError> {
    match &answer.rank.error {
        None => Ok(()),
        Some(error) => Err(EstimateError::Script {
            error: error.clone(),
            at: answer
                .rank
                .at
                .as_ref()
                .map_or(String::new(), |a| format!(" at {a}")),
            python: launch.python.clone(),
            script: launch.script.join(" "),
        }),
    }
}

fn assemble(
    answer: Answer,
    gpu: &gpus::Gpu,
    cal: &Calibration,
    world: u32,
    verdict: verdict::Verdict,
    accuracy: Accuracy,
) -> Estimate {
    let run = answer.rank;
    let ws = cal.constants.workspace_bytes;
    let parts = RankParts {
        rank: 0,
        allocator_rounding_bytes: run
            .allocated_peak_bytes
            .saturating_sub(run.tracked_peak_bytes + ws),
        allocator_reserve_bytes: run
            .reserved_peak_bytes
            .saturating_sub(run.allocated_peak_bytes),
        workspace_bytes: ws,
        context_bytes: cal.constants.context_bytes,
        nccl_bytes: if world > 1 {
            cal.constants.nccl_bytes.unwrap_or(0)
        } else {
            0
        },
        run,
    };
    Estimate {
        kind: "memprofEstimate",
        version: 1,
        gpu: gpu.name.clone(),
        gpu_total_bytes: gpu.total_bytes,
        torch: answer.torch,
        tracker: answer.tracker,
        world_size: world,
        ranks: vec![parts],
        verdict,
        vary: answer.vary,
        accuracy,
        modelled: MODELLED.to_vec(),
        measured: MEASURED.to_vec(),
        seconds: answer.seconds,
    }
}

/// What the fake run and the allocator model give.
pub const MODELLED: &[&str] = &[
    "parameters, gradients, optimizer state, activations, temporaries (fake run)",
    "allocator rounding and reserve (caching-allocator model)",
    "DDP gradient buckets (one copy of the trainable parameters)",
];

/// What was measured on a real GPU.
pub const MEASURED: &[&str] = &[
    "CUDA context, handles and kernels",
    "cuBLAS workspace",
    "NCCL buffers",
    "the margin (worst under-estimate on the recorded runs)",
];
