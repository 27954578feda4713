//! `memprof sweep`: runs a training command over a grid of settings, one process per configuration, and fits a memory model.

pub mod grid;
pub mod model;
pub mod record;

/// Flags of `memprof sweep`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Everything after the subcommand, until the module defines its flags.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub rest: Vec<String>,
}

/// Runs the subcommand; returns the process exit code.
pub async fn run(_args: Args) -> anyhow::Result<i32> {
    anyhow::bail!("memprof sweep is not built yet")
}
