//! `memprof oom --monitor`: watches this machine's GPUs (through
//! `memprof-sidecar --standalone`, as `memprof profile` does), prints each
//! risk transition, and exits with status 3 as soon as the risk reaches
//! `--fail-on`: a guard to put in front of, or next to, a training run.
//!
//! Exit status: 0 when the watch ended (`--duration`, Ctrl-C) below
//! `--fail-on`; 3 when the risk reached it; 1 on an error (the sidecar
//! could not start); 2 on bad flags.

use crate::local::profile::sidecar::{self, Sidecar};
use crate::local::profile::{summary, ProfileError, SampleArgs};
use memprof_api::RiskLevel;

/// Exit status when the risk reached `--fail-on`.
pub const REACHED: i32 = 3;

/// Risk levels `--fail-on` accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FailOn {
    /// Medium or worse.
    Warning,
    /// High or worse.
    High,
    /// Critical.
    Critical,
}

impl FailOn {
    /// The lowest risk that counts as reached.
    pub fn level(self) -> RiskLevel {
        match self {
            FailOn::Warning => RiskLevel::Medium,
            FailOn::High => RiskLevel::High,
            FailOn::Critical => RiskLevel::Critical,
        }
    }
}

/// Flags of `memprof oom`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Watch the GPUs and print risk transitions (the only mode so far).
    #[arg(long)]
    pub monitor: bool,
    /// Exit with status 3 once the risk reaches this level
    /// (warning = medium or worse). Without it, only print.
    #[arg(long, value_enum)]
    pub fail_on: Option<FailOn>,
    #[command(flatten)]
    pub sample: SampleArgs,
}

/// Runs the subcommand; returns the process exit code.
pub async fn run(args: Args) -> anyhow::Result<i32> {
    if !args.monitor {
        anyhow::bail!("say what to do: `memprof oom --monitor [--fail-on critical]`");
    }
    Ok(monitor(args).await?)
}

/// Watches until the duration ends, Ctrl-C, or the risk reaches `--fail-on`.
async fn monitor(args: Args) -> Result<i32, ProfileError> {
    let profile = args.sample;
    profile.check()?;
    let dir = std::env::temp_dir();
    let pid = std::process::id();
    let (trace, output) = (
        dir.join(format!("memprof-oom-{pid}-trace.csv")),
        dir.join(format!("memprof-oom-{pid}-report.json")),
    );
    let flags = profile.sidecar_flags(&trace, &output);
    let addr = sidecar::free_loopback()?;
    let private = sidecar::PrivateDir::new("oom")?;
    let mut side =
        Sidecar::start(&sidecar::sidecar_exe()?, &flags, &addr, &private.socket()).await?;
    let fail_on = args.fail_on.map(FailOn::level);
    println!(
        "memprof oom: watching (interval {}{}); Ctrl-C to stop",
        profile.interval,
        fail_on.map_or(String::new(), |l| format!(
            ", exits {REACHED} at risk {l} or worse"
        ))
    );
    let mut announced_source = false;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let code = loop {
        tokio::select! {
            t = side.transitions.recv() => match t {
                Some(t) => {
                    if !announced_source {
                        announced_source = true;
                        if let Some(r) = side.report().await {
                            println!("source {}", summary::source_words(r.summary.source));
                        }
                    }
                    println!("{}", summary::transition_line(&t));
                    if fail_on.is_some_and(|l| t.to >= l) {
                        println!("risk {} reached --fail-on: exiting {REACHED}", t.to);
                        break REACHED;
                    }
                }
                // Its output closed: it stopped (--duration).
                None => break 0,
            },
            _ = &mut ctrl_c => break 0,
        }
    };
    side.stop().await;
    for p in [trace, output] {
        let _ = std::fs::remove_file(p);
    }
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn fail_on_names_the_lowest_level_that_counts() {
        assert_eq!(FailOn::Warning.level(), RiskLevel::Medium);
        assert!(RiskLevel::Critical >= FailOn::High.level());
        assert!(RiskLevel::Medium < FailOn::Critical.level());
    }

    #[test]
    fn the_sampling_flags_are_profiles_and_reach_the_sidecar() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            a: Args,
        }
        let a = <Cli as clap::Parser>::try_parse_from([
            "oom",
            "--monitor",
            "--devices",
            "0",
            "--backend",
            "trace",
            "--trace",
            "t.csv",
            "--interval",
            "500ms",
        ])
        .unwrap()
        .a;
        a.sample.check().unwrap();
        let f = a
            .sample
            .sidecar_flags(Path::new("o.csv"), Path::new("r.json"));
        let has = |k: &str, v: &str| f.windows(2).any(|w| w[0] == k && w[1] == v);
        assert!(
            has("--gpus", "0") && has("--trace", "t.csv") && has("--interval", "500ms"),
            "{f:?}"
        );
        assert!(has("--speed", "1"), "--speed defaults to 1: {f:?}");
    }
}
