//! `memprof`: the command line. Also usable as the kubectl plugin
//! `kubectl memprof` (install it as `kubectl-memprof` on the PATH).
#![forbid(unsafe_code)]

use clap::{CommandFactory, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "memprof",
    version,
    about = "GPU memory profiling and OOM prevention for training jobs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print every memprof CRD as one YAML stream (what crds/ holds).
    Crd,
    /// Run the analysis offline over a recorded trace (CSV `t_s,gpu,used_bytes,total_bytes`):
    /// a table on a terminal, JSON lines with `-o json`, `--plot` draws the prediction.
    Analyze(memprof::cli::local::analyze::Args),
    /// Profile this machine's GPUs without Kubernetes: live status per GPU, then a
    /// summary table; with `-- COMMAND`, runs the command next to it with the
    /// in-process agent pushing to it, until the command exits.
    Profile(memprof::cli::local::profile::Args),
    /// A live full-screen view of this box's GPUs (no cluster): memory, risk,
    /// time to OOM, sparklines, the trainer's allocator numbers with
    /// `-- COMMAND`; keys switch views (g GPUs, a agent, l log, q quit).
    Watch(memprof::cli::local::watch::Args),
    /// Roll the reports of a distributed run up without Kubernetes (the files
    /// `memprof profile --output` wrote, one per rank): imbalance, bottleneck
    /// rank/node/GPU and worst risk, as the operator rolls up a Job.
    Rollup(memprof::cli::local::rollup::Args),
    /// How fragmented each trainer's allocator cache is, from `memprof profile
    /// --output` reports: now, over the run, the allocation-size pattern, advice.
    Fragment(memprof::cli::local::fragment::Args),
    /// The trainer's recorded events (the agent's timeline export) as a table
    /// of stages with the change of allocated memory, and `--plot`.
    Timeline(memprof::cli::local::timeline::Args),
    /// Show what memprof concluded about a job (its MemoryProfile and per-rank reports),
    /// or about every profiled job in scope.
    Report(memprof::cli::kube::report::Args),
    /// Watch this box's GPUs for a predicted OOM (`--monitor`, `--fail-on critical`).
    Oom(memprof::cli::local::oom::Args),
    /// Run a training command over a grid of settings (`--vary BATCH_SIZE=8,16,32`),
    /// one process per configuration, and print the largest safe value.
    Sweep(memprof::cli::local::sweep::Args),
    /// Profiled jobs by risk, then time to OOM (like `kubectl top`).
    Top(memprof::cli::kube::top::Args),
    /// Draw a Job's per-rank timelines and per-GPU peaks (SVG, or text on a terminal).
    Plot(memprof::cli::kube::plot::Args),
    /// Two sweep results, reports or Jobs side by side: what grew, where.
    Compare(memprof::cli::kube::compare::Args),
    /// Remediation policies: which match a Job and what they would do now.
    Policy {
        #[command(subcommand)]
        command: memprof::cli::kube::policy::Command,
    },
    /// Copy the Python agent and its startup hook into DIR (what the init
    /// container added for `memprof.dev/agent: "python"` runs).
    InstallAgent {
        /// Target directory (the pod's shared volume).
        dir: std::path::PathBuf,
        /// The agent tree to copy.
        #[arg(long, default_value = memprof::api::DEFAULT_AGENT_SOURCE)]
        from: std::path::PathBuf,
        /// On failure say why and exit 0: the pod then starts without the agent.
        #[arg(long)]
        best_effort: bool,
    },
    /// Print a shell completion script (`source <(memprof completion bash)`; for
    /// `kubectl memprof <TAB>` put `kubectl_complete-memprof` on the PATH).
    Completion {
        /// The shell.
        #[arg(value_enum)]
        shell: memprof::cli::kube::completion::Shell,
    },
    /// Completion candidates in Cobra's protocol (what `kubectl_complete-memprof` calls).
    #[command(name = "__complete", hide = true)]
    Complete {
        /// The words typed after `memprof`, the last one being completed.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        words: Vec<String>,
    },
}

/// Errors print as `error: <message>: <cause>…` and exit 1: never the
/// Debug form, which dumps a backtrace when RUST_BACKTRACE is set.
fn main() -> std::process::ExitCode {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let result = match runtime {
        Ok(rt) => rt.block_on(run(Cli::parse())),
        Err(e) => Err(e.into()),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Crd => print!("{}", memprof::api::crds_yaml()),
        Command::Analyze(args) => {
            std::process::exit(memprof::cli::local::analyze::run(args).await?)
        }
        Command::Profile(args) => {
            std::process::exit(memprof::cli::local::profile::run_args(args).await?)
        }
        Command::Watch(args) => std::process::exit(memprof::cli::local::watch::run(args).await?),
        Command::Rollup(args) => std::process::exit(memprof::cli::local::rollup::run(args).await?),
        Command::Fragment(args) => {
            std::process::exit(memprof::cli::local::fragment::run(args).await?)
        }
        Command::Timeline(args) => {
            std::process::exit(memprof::cli::local::timeline::run(args).await?)
        }
        Command::Report(args) => std::process::exit(memprof::cli::kube::report::run(args).await?),
        Command::Policy { command } => memprof::cli::kube::policy::run(command).await?,
        Command::Oom(args) => std::process::exit(memprof::cli::local::oom::run(args).await?),
        Command::Sweep(args) => std::process::exit(memprof::cli::local::sweep::run(args).await?),
        Command::Top(args) => std::process::exit(memprof::cli::kube::top::run(args).await?),
        Command::Completion { shell } => {
            let mut cmd = Cli::command();
            let script = memprof::cli::kube::completion::script(shell, &mut cmd, "memprof");
            memprof::cli::output::print(&script);
        }
        Command::Complete { words } => {
            let answer = memprof::cli::kube::completion::complete(&Cli::command(), &words).await;
            memprof::cli::output::print(&answer);
        }
        Command::Plot(args) => std::process::exit(memprof::cli::kube::plot::run(args).await?),
        Command::Compare(args) => std::process::exit(memprof::cli::compare(args).await?),
        Command::InstallAgent {
            dir,
            from,
            best_effort,
        } => match memprof::cli::local::install_agent::install(&from, &dir) {
            Ok(n) => println!(
                "installed the memprof agent ({n} files) into {}",
                dir.display()
            ),
            Err(e) if best_effort => {
                eprintln!("memprof install-agent: {e}; the trainers start without the agent")
            }
            Err(e) => return Err(e.into()),
        },
    }
    Ok(())
}
