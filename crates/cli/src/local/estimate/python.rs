//! The Python side: the run of `python -m memprof_agent.estimate` with the
//! interpreter and script the command names (`local::command_line`), and
//! the JSON it prints (agent/python/memprof_agent/estimate/contract.py).

use crate::local::command_line::Launch;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The estimator's answer (contract.result()).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Answer {
    /// torch's version where the fake run ran.
    pub torch: Option<String>,
    /// `MemTracker` or `dispatch` (the fallback).
    pub tracker: Option<String>,
    /// Ranks of the fake process group.
    pub world_size: u32,
    /// The run reported (with --vary: the largest that fits).
    pub rank: RankRun,
    /// The bisection, with --vary.
    pub vary: Option<serde_json::Value>,
    /// Wall time of the estimate.
    pub seconds: f64,
}

/// One fake run's bytes (contract.run_record()).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct RankRun {
    /// Parameters at the tracked peak.
    pub parameters_bytes: u64,
    /// Buffers (BatchNorm statistics...).
    pub buffers_bytes: u64,
    /// Gradients.
    pub gradients_bytes: u64,
    /// Optimizer state.
    pub optimizer_bytes: u64,
    /// Activations (and DDP's gradient buckets).
    pub activations_bytes: u64,
    /// Temporaries of backward and the optimizer step.
    pub temporaries_bytes: u64,
    /// Tensors in no category.
    pub other_bytes: u64,
    /// Sum of the tracked tensors at the peak, 512 B rounding included.
    pub tracked_peak_bytes: u64,
    /// The allocator model's peak allocated (workspace included).
    pub allocated_peak_bytes: u64,
    /// The allocator model's peak reserved.
    pub reserved_peak_bytes: u64,
    /// Optimizer steps run.
    pub steps_run: u64,
    /// The --vary value of this run.
    pub value: Option<String>,
    /// Why the script failed under fake tensors.
    pub error: Option<String>,
    /// The script's line where it failed.
    pub at: Option<String>,
}

/// The flags handed to the estimator.
#[derive(Clone, Debug)]
pub struct Request {
    /// Directory holding `memprof_agent/`.
    pub agent_lib: PathBuf,
    /// Optimizer steps.
    pub steps: u64,
    /// Ranks.
    pub world_size: u32,
    /// What torch.cuda reports.
    pub gpu_name: String,
    /// What torch.cuda reports.
    pub total_bytes: u64,
    /// Measured cuBLAS workspace.
    pub workspace_bytes: u64,
    /// Largest reserved peak that fits.
    pub budget_bytes: u64,
    /// `NAME=v1,v2,...`.
    pub vary: Option<String>,
}

/// Why the estimator gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum PythonError {
    /// The interpreter is not there.
    #[error("cannot start {python:?}: {error}; pass --python PATH (the interpreter that has torch), or write `-- python3 train.py`")]
    Spawn {
        /// The interpreter.
        python: String,
        /// Why.
        error: std::io::Error,
    },
    /// It printed no answer (crashed, or not the estimator).
    #[error("{python} -m memprof_agent.estimate printed no answer (exit {code}): {detail}; check that {python} has torch (python -c 'import torch')")]
    NoAnswer {
        /// The interpreter.
        python: String,
        /// Its exit code.
        code: i32,
        /// The parse error.
        detail: String,
    },
}

/// Runs the estimator; the script's output goes to stderr, the answer is read from stdout.
pub fn estimate(launch: &Launch, req: &Request) -> Result<Answer, PythonError> {
    let mut cmd = Command::new(&launch.python);
    cmd.args([
        "-m",
        "memprof_agent.estimate",
        "--steps",
        &req.steps.to_string(),
    ])
    .args([
        "--world-size",
        &req.world_size.to_string(),
        "--gpu-name",
        &req.gpu_name,
    ])
    .args(["--total-bytes", &req.total_bytes.to_string()])
    .args(["--workspace-bytes", &req.workspace_bytes.to_string()])
    .args(["--budget-bytes", &req.budget_bytes.to_string()]);
    if let Some(v) = &req.vary {
        cmd.args(["--vary", v]);
    }
    cmd.arg("--")
        .args(&launch.script)
        .env("PYTHONPATH", python_path(&req.agent_lib));
    let out = cmd.stdin(Stdio::null()).stderr(Stdio::inherit()).output();
    let out = out.map_err(|error| PythonError::Spawn {
        python: launch.python.clone(),
        error,
    })?;
    serde_json::from_slice(&out.stdout).map_err(|e| PythonError::NoAnswer {
        python: launch.python.clone(),
        code: out.status.code().unwrap_or(-1),
        detail: e.to_string(),
    })
}

fn python_path(lib: &Path) -> String {
    let own = std::env::var("PYTHONPATH").unwrap_or_default();
    if own.is_empty() {
        lib.display().to_string()
    } else {
        format!("{}:{own}", lib.display())
    }
}
