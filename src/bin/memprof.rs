//! `memprof`: the command line. Also usable as the kubectl plugin
//! `kubectl memprof` (install it as `kubectl-memprof` on the PATH).
#![forbid(unsafe_code)]

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use memprof::cli::help;

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
    #[command(hide = true)]
    Crd,
    /// Print the agent wire's JSON Schema, `push` or `reply` (what agent/schema/ holds).
    #[command(hide = true)]
    AgentSchema {
        #[arg(value_parser = ["push", "reply"])]
        which: String,
    },
    /// Run the analysis offline over a recorded trace
    ///
    /// The trace is a CSV `t_s,gpu,used_bytes,total_bytes`: a table on a
    /// terminal, JSON lines with `-o json`, `--plot` draws the prediction.
    Analyze(memprof::cli::local::analyze::Args),
    /// Profile this machine's GPUs, or a command's, without Kubernetes
    ///
    /// Live status per GPU, then a summary table; with `-- COMMAND`, runs the
    /// command next to it with the in-process agent pushing to it, until the
    /// command exits.
    Profile(memprof::cli::local::profile::Args),
    /// A live full-screen view of this box's GPUs, no cluster
    ///
    /// Memory, risk, time to OOM, sparklines, the trainer's allocator numbers
    /// with `-- COMMAND`; keys switch views (g GPUs, a agent, l log, q quit).
    Watch(memprof::cli::local::watch::Args),
    /// Roll the reports of a distributed run up without Kubernetes
    ///
    /// The files `memprof profile --output` wrote, one per rank: imbalance,
    /// bottleneck rank/node/GPU and worst risk, as the operator rolls up a Job.
    Rollup(memprof::cli::local::rollup::Args),
    /// How fragmented each trainer's allocator cache is
    ///
    /// From `memprof profile --output` reports: now, over the run, the
    /// allocation-size pattern, advice.
    Fragment(memprof::cli::local::fragment::Args),
    /// The trainer's recorded events as a table of stages
    ///
    /// The agent's timeline export, with the change of allocated memory per
    /// stage, and `--plot`.
    Timeline(memprof::cli::local::timeline::Args),
    /// What memprof concluded about a Job, and its ranks
    ///
    /// The Job's MemoryProfile in words and one row per rank and GPU from its
    /// MemoryReports; without JOB, every profiled Job in scope.
    #[command(after_help = REPORT_EXAMPLES)]
    Report(memprof::cli::kube::report::Args),
    /// Watch this box's GPUs for a predicted OOM (`--monitor`, `--fail-on critical`).
    Oom(memprof::cli::local::oom::Args),
    /// Run a trainer over a grid of settings and find the largest safe value
    ///
    /// One process per configuration of the grid (`--vary BATCH_SIZE=8,16,32`).
    Sweep(memprof::cli::local::sweep::Args),
    /// Will it fit? A script's GPU memory before launch, on the CPU, no GPU
    ///
    /// Runs the script unchanged under fake tensors, adds the constants
    /// measured on a real GPU and says "fits with N GiB to spare" or "needs N
    /// GiB more" (exit 0 or 2); `--vary BATCH=8,16,32` finds the largest that fits.
    Estimate(memprof::cli::local::estimate::Args),
    /// Profiled jobs by risk, then time to OOM (like `kubectl top`).
    #[command(after_help = TOP_EXAMPLES)]
    Top(memprof::cli::kube::top::Args),
    /// Draw a Job's per-rank timelines and per-GPU peaks (SVG or PNG, or text on a terminal).
    #[command(after_help = PLOT_EXAMPLES)]
    Plot(memprof::cli::kube::plot::Args),
    /// The GPU memory to request per rank role, from what was measured,
    /// in each GPU-sharing scheduler's dialect (HAMi, Volcano, KAI, Run:ai, DRA MPS)
    Recommend(memprof::cli::kube::recommend::Args),
    /// Two Jobs, sweep results or reports side by side: what grew, where
    #[command(after_help = COMPARE_EXAMPLES)]
    Compare(memprof::cli::kube::compare::Args),
    /// Is the install working? One line per check, OK/WARN/FAIL, with what to do
    ///
    /// CRDs served; memprof webhooks registered with a caBundle; their
    /// Service's endpoints; the operator's pods (an image that cannot be
    /// pulled is named) and Deployment; the serving certificate as the API
    /// server checks it; annotated Jobs the webhook never injected. Exits 1
    /// on any FAIL.
    #[command(after_help = DOCTOR_EXAMPLES)]
    Doctor(memprof::cli::kube::doctor::Args),
    /// Which GPU access mode (gpuAccess) works on this node, and why
    ///
    /// Reads the node's GPU device nodes, the container runtime's config (is
    /// the NVIDIA runtime wired in, CDI-only, does it accept
    /// NVIDIA_VISIBLE_DEVICES), CDI specs and the kubelet PodResources socket.
    /// Run it on the node, or `kubectl debug node/NAME -it --image=IMAGE --
    /// memprof node-check --root /host`.
    NodeCheck(memprof::cli::nodecheck::Args),
    /// Remediation policies: which match a Job and what they would do now.
    Policy {
        #[command(subcommand)]
        command: memprof::cli::kube::policy::Command,
    },
    /// Copy the Python agent and its startup hook into DIR (what the init
    /// container added for `memprof.dev/agent: "python"` runs).
    #[command(hide = true)]
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
    /// Print a shell completion script
    ///
    /// `source <(memprof completion bash)`; for `kubectl memprof <TAB>` put
    /// `kubectl_complete-memprof` on the PATH.
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

const TOP_EXAMPLES: &str = "\
Examples:
  kubectl memprof top -A -o wide
  kubectl memprof top -l memprof.dev/job=train -o name
  kubectl memprof top --sort-by=.status.timeToOomSeconds \\
    -o custom-columns=JOB:.spec.jobName,RISK:.status.risk,TTO:.status.timeToOomSeconds
  kubectl memprof top -o jsonpath='{range .items[*]}{.metadata.name}{\"\\t\"}{.status.risk}{\"\\n\"}{end}'
  kubectl memprof top --watch";

const REPORT_EXAMPLES: &str = "\
Examples:
  kubectl memprof report train -n ml
  kubectl memprof report ml/train -o wide --no-headers
  kubectl memprof report -A
  kubectl memprof report train -o jsonpath='{.items[0].status.risk}'";

const PLOT_EXAMPLES: &str = "\
Examples:
  kubectl memprof plot train                  # text charts on the terminal
  kubectl memprof plot train --out train.png  # or .svg
  kubectl memprof plot ml/train --chart heatmap --out peaks.svg";

const DOCTOR_EXAMPLES: &str = "\
Examples:
  kubectl memprof doctor            # Jobs of the current namespace
  kubectl memprof doctor -A         # annotated Jobs of every namespace
  kubectl memprof doctor --webhook memprof";

const COMPARE_EXAMPLES: &str = "\
Examples:
  kubectl memprof compare train-bs16 train-bs32 -n ml
  memprof compare sweep-a.json sweep-b.json   # two files: compared locally";

/// The command line as `--help` shows it: grouped, internal commands hidden.
fn command() -> clap::Command {
    help::grouped(Cli::command())
}

/// Errors print as `error: <message>: <cause>…` and exit 1: never the
/// Debug form, which dumps a backtrace when RUST_BACKTRACE is set.
fn main() -> std::process::ExitCode {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let result = match runtime {
        Ok(rt) => rt.block_on(run(parse())),
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

/// Parses the command line; a mistyped command gets [`help::suggest`]'s suggestion.
fn parse() -> Cli {
    let cmd = command();
    let parsed = cmd
        .clone()
        .try_get_matches()
        .and_then(|m| Cli::from_arg_matches(&m));
    parsed.unwrap_or_else(|e| help::better_suggestion(e, &cmd).exit())
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Crd => memprof::cli::output::print(&memprof::api::crds_yaml()),
        Command::AgentSchema { which } => memprof::cli::output::print(
            &memprof::api::agent::schema_json(&which).expect("clap allows push or reply only"),
        ),
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
        Command::Estimate(args) => {
            std::process::exit(memprof::cli::local::estimate::run(args).await?)
        }
        Command::Top(args) => std::process::exit(memprof::cli::kube::top::run(args).await?),
        Command::NodeCheck(args) => std::process::exit(memprof::cli::nodecheck::run(&args)),
        Command::Doctor(args) => std::process::exit(memprof::cli::kube::doctor::run(args).await?),
        Command::Completion { shell } => {
            let mut cmd = command();
            let script = memprof::cli::kube::completion::script(shell, &mut cmd, "memprof");
            memprof::cli::output::print(&script);
        }
        Command::Complete { words } => {
            let answer = memprof::cli::kube::completion::complete(&command(), &words).await;
            memprof::cli::output::print(&answer);
        }
        Command::Plot(args) => std::process::exit(memprof::cli::kube::plot::run(args).await?),
        Command::Recommend(args) => {
            std::process::exit(memprof::cli::kube::recommend::run(args).await?)
        }
        Command::Compare(args) => std::process::exit(memprof::cli::compare(args).await?),
        Command::InstallAgent {
            dir,
            from,
            best_effort,
        } => install_agent(&from, &dir, best_effort)?,
    }
    Ok(())
}

/// `memprof install-agent`: with `--best-effort`, a failure is said and the
/// trainers start without the agent (an init container must not block the pod).
fn install_agent(
    from: &std::path::Path,
    dir: &std::path::Path,
    best_effort: bool,
) -> anyhow::Result<()> {
    match memprof::cli::local::install_agent::install(from, dir) {
        Ok(n) => println!(
            "installed the memprof agent ({n} files) into {}",
            dir.display()
        ),
        Err(e) if best_effort => {
            eprintln!("memprof install-agent: {e}; the trainers start without the agent")
        }
        Err(e) => return Err(e.into()),
    }
    Ok(())
}
