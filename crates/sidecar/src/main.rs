//! `memprof-sidecar`: samples the pod's GPUs, analyses them and writes the
//! pod's MemoryReport; `--standalone` does the same without Kubernetes.
//! Flags and start-up only: the work is in the `memprof_sidecar` library.
#![forbid(unsafe_code)]

use clap::Parser;
use memprof_sidecar::{metrics, run, Args};

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    if args.print_metrics {
        print!("{}", metrics::describe());
        return std::process::ExitCode::SUCCESS;
    }
    let logs = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        // Colours only for a person at a terminal, never in a pod's log.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    if args.log_json {
        logs.json().init();
    } else {
        logs.init();
    }
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
            // Bad flags or files only: runtime failures (the API server, the
            // endpoints' port) are logged and counted, never fatal.
            eprintln!("memprof-sidecar: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}
