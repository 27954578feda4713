//! `memprof-sidecar`: samples the pod's GPUs, analyses them and writes the
//! pod's MemoryReport; `--standalone` does the same without Kubernetes.
#![forbid(unsafe_code)]

mod budget;
mod gpus;
mod identity;
mod metrics;
mod run;
mod server;
mod writer;

use clap::Parser;
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
    /// Address of the local HTTP endpoints (/healthz, /metrics, /v1/report, POST /v1/agent); port 0 picks one.
    #[arg(long, env = "MEMPROF_LISTEN", default_value = "127.0.0.1:9464")]
    pub listen: std::net::SocketAddr,
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
    /// Record every sample to this CSV trace (`t_s,gpu,used_bytes,total_bytes`).
    #[arg(long)]
    pub trace_out: Option<String>,
    /// Seconds between heartbeat writes when nothing changes.
    #[arg(long, env = "MEMPROF_HEARTBEAT_SECONDS", default_value_t = 60.0)]
    pub heartbeat_seconds: f64,
    /// Analysis thresholds as JSON (fields of `Thresholds`, camelCase), e.g. `{"highTtoSeconds":900}`.
    #[arg(long, env = "MEMPROF_THRESHOLDS")]
    pub thresholds: Option<String>,
}

/// Parses `250ms`, `1s`, `2m` or plain seconds, within 10 ms and 60 s.
fn parse_interval(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = s
        .find(|c: char| c.is_ascii_alphabetic())
        .map_or((s, "s"), |i| (&s[..i], &s[i..]));
    let v: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 100ms, 1s, 2m"))?;
    let secs = match unit {
        "ms" => v / 1000.0,
        "s" => v,
        "m" => v * 60.0,
        other => return Err(format!("unknown unit {other:?}: use ms, s or m")),
    };
    if !(0.01..=60.0).contains(&secs) {
        return Err(format!("{s} is outside 10ms..60s"));
    }
    Ok(Duration::from_secs_f64(secs))
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    // One worker thread: the sidecar must stay small next to the trainer.
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("memprof-sidecar: cannot start the runtime: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    match rt.block_on(run::run(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // Bad flags or files only: runtime failures are logged and retried, never fatal.
            eprintln!("memprof-sidecar: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_parse_within_bounds() {
        assert_eq!(parse_interval("100ms").unwrap(), Duration::from_millis(100));
        assert_eq!(parse_interval("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_interval("1m").unwrap(), Duration::from_secs(60));
        assert!(parse_interval("5ms").unwrap_err().contains("outside"));
        assert!(parse_interval("2h").unwrap_err().contains("unknown unit"));
        assert!(parse_interval("fast").is_err());
    }
}
