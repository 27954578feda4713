//! The sidecar's flags.

use crate::gpus;
use clap::Parser;
// The injection validates intervals with the same parser, so what it
// writes into a pod is always something the sidecar accepts.
use memprof_api::interval::parse_interval;
use std::time::Duration;

/// Command-line flags; every one has a default and an environment fallback.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "memprof-sidecar",
    version,
    about = "Samples a pod's GPUs, predicts OOM and writes its MemoryReport"
)]
pub struct Args {
    /// GPU backend.
    #[arg(long, env = "MEMPROF_BACKEND", value_enum, default_value = "nvml")]
    pub backend: gpus::Backend,
    /// Scenario file for `--backend sim` (YAML or JSON; see the README).
    #[arg(long, env = "MEMPROF_SCENARIO")]
    pub scenario: Option<String>,
    /// CSV trace for `--backend trace` (`t_s,gpu,used_bytes,total_bytes`).
    #[arg(long, env = "MEMPROF_TRACE")]
    pub trace: Option<String>,
    /// GPU UUIDs to sample, comma-separated (first in the discovery order; see the README).
    #[arg(long, env = "MEMPROF_GPUS")]
    pub gpus: Option<String>,
    /// Speed of simulated or replayed time relative to the wall clock.
    #[arg(long, env = "MEMPROF_SPEED", default_value_t = 1.0)]
    pub speed: f64,
    /// Sampling interval (10ms to 60s), e.g. `100ms`, `1s`.
    #[arg(long, env = "MEMPROF_INTERVAL", default_value = "1s", value_parser = parse_interval)]
    pub interval: Duration,
    /// Faster sampling interval used while the risk is medium or above.
    #[arg(long, env = "MEMPROF_FAST_INTERVAL", value_parser = parse_interval)]
    pub fast_interval: Option<Duration>,
    /// Address of `/healthz` and `/metrics` when `--port` is not set; port 0
    /// picks one. The agent's endpoints are never on TCP (`--agent-socket`).
    #[arg(long, env = "MEMPROF_LISTEN", default_value = "127.0.0.1:9464")]
    pub listen: std::net::SocketAddr,
    /// Serve `/healthz` and `/metrics` on all IPv4 interfaces (0.0.0.0) at this
    /// port instead of `--listen`: set by the injection only when Prometheus
    /// scrapes the sidecars. A port that cannot be bound is logged, counted
    /// and reported, never fatal.
    #[arg(long, env = "MEMPROF_PORT")]
    pub port: Option<u16>,
    /// Unix socket to serve `POST /v1/agent` and `GET /v1/report` on (the
    /// injection sets /var/run/memprof/agent.sock, on an emptyDir only the
    /// pod's containers mount). Without it the agent's pushes are not taken.
    #[arg(long, env = "MEMPROF_AGENT_SOCKET")]
    pub agent_socket: Option<std::path::PathBuf>,
    /// Pod name (downward API).
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
    /// Pod namespace (downward API).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub namespace: String,
    /// Pod UID (downward API), for the report's owner reference.
    #[arg(long, env = "POD_UID")]
    pub pod_uid: Option<String>,
    /// Node name (downward API).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// Job the pod belongs to.
    #[arg(long, env = "MEMPROF_JOB_NAME")]
    pub job_name: Option<String>,
    /// Rank; by default `JOB_COMPLETION_INDEX`, then `RANK`, then the pod name's ordinal.
    #[arg(long, env = "MEMPROF_RANK")]
    pub rank: Option<u32>,
    /// Run without Kubernetes: sample, analyse, print risk transitions as JSON lines.
    #[arg(long)]
    pub standalone: bool,
    /// Stop after this many seconds (0: run until interrupted).
    #[arg(long, env = "MEMPROF_DURATION", default_value_t = 0.0)]
    pub duration: f64,
    /// Write the final report as JSON to this file.
    #[arg(long)]
    pub output: Option<String>,
    /// A file holding the trainer's pid (`memprof profile` writes it once it
    /// started the command): that process and its children are the
    /// trainer's, and growth NVML sees in any other process is blamed on
    /// that process (cause `neighbour`), not on the trainer.
    #[arg(long)]
    pub trainer_pid_file: Option<std::path::PathBuf>,
    /// Record every sample to this CSV trace (`t_s,gpu,used_bytes,total_bytes`).
    #[arg(long)]
    pub trace_out: Option<String>,
    /// Seconds between heartbeat writes when nothing changes.
    #[arg(long, env = "MEMPROF_HEARTBEAT_SECONDS", default_value_t = 60.0)]
    pub heartbeat_seconds: f64,
    /// Exit (status 0) once the trainer is gone: no compute process on the GPUs
    /// and no agent push for `--alone-grace-seconds`. Set by the injection when
    /// the server has no native sidecars, so the Job can complete.
    #[arg(long, env = "MEMPROF_EXIT_WHEN_ALONE", default_value_t = false, action = clap::ArgAction::Set)]
    pub exit_when_alone: bool,
    /// Idle seconds before `--exit-when-alone` exits.
    #[arg(long, env = "MEMPROF_ALONE_GRACE_SECONDS", default_value_t = 30.0)]
    pub alone_grace_seconds: f64,
    /// Analysis thresholds as JSON (fields of `Thresholds`, camelCase), e.g. `{"highTtoSeconds":900}`.
    #[arg(long, env = "MEMPROF_THRESHOLDS")]
    pub thresholds: Option<String>,
    /// Log as JSON lines (for log collectors) instead of text; the injection
    /// sets it from the chart's `sidecar.logFormat`.
    #[arg(long, env = "MEMPROF_LOG_JSON", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub log_json: bool,
    /// Print the metric families this binary registers (no samples) and exit:
    /// what the chart's dashboard and alert tests check their queries against.
    #[arg(long, hide = true)]
    pub print_metrics: bool,
}
