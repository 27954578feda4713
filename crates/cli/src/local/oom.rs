//! `memprof oom --monitor`: watches this machine's GPUs (through
//! `memprof-sidecar --standalone`, as `memprof profile` does), prints each
//! risk transition, and exits with status 3 as soon as the risk reaches
//! `--fail-on`: a guard to put in front of, or next to, a training run.
//!
//! Exit status: 0 when the watch ended (`--duration`, Ctrl-C) below
//! `--fail-on`; 3 when the risk reached it; 4 when there is nothing to
//! watch (no GPU visible: a guard that cannot see must not pass), with one
//! line saying why; 1 on an error (the sidecar could not start); 2 on bad
//! flags.

use crate::local::profile::sidecar::{self, Sidecar};
use crate::local::profile::{self, summary, ProfileError, SampleArgs};
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
    let files = [trace, output];
    if let Some(why) = blind(&side).await {
        stop(&mut side, &files).await;
        eprintln!("{}", profile::blind_line(&why, profile.backend()));
        return Ok(profile::BLIND);
    }
    let fail_on = args.fail_on.map(FailOn::level);
    println!(
        "memprof oom: watching (interval {}{}); Ctrl-C to stop",
        crate::duration::millis(profile.interval),
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
    stop(&mut side, &files).await;
    Ok(code)
}

/// Stops the sidecar and removes its files (a guard keeps nothing).
async fn stop(side: &mut Sidecar, files: &[std::path::PathBuf]) {
    side.stop().await;
    for p in files {
        let _ = std::fs::remove_file(p);
    }
}

/// Why the sidecar sees nothing (no GPU; the guard runs no trainer, so no
/// agent can push), from its first report; None once it shows a GPU, or when
/// no report came within 10 s (the transitions then decide, as before).
async fn blind(side: &Sidecar) -> Option<String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        if let Some(r) = side.report().await {
            return crate::local::profile::live::nothing_seen(&r);
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    None
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
        // check() reads the trace: a real one.
        let t = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/traces/leak300_h100.csv"
        );
        let a = <Cli as clap::Parser>::try_parse_from([
            "oom",
            "--monitor",
            "--devices",
            "0",
            "--backend",
            "trace",
            "--trace",
            t,
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
            has("--gpus", "0") && has("--trace", t) && has("--interval", "500ms"),
            "{f:?}"
        );
        assert!(has("--speed", "1"), "--speed defaults to 1: {f:?}");
    }
}
