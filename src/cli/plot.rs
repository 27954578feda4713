//! `memprof plot`: a Job's per-rank timelines and per-GPU peak heatmap.
//! (skeleton: the subcommand is wired; its owner fills this module in.)

/// Flags of `memprof plot`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Everything after the subcommand, until the module defines its flags.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub rest: Vec<String>,
}

/// Runs the subcommand; returns the process exit code.
pub async fn run(_args: Args) -> anyhow::Result<i32> {
    anyhow::bail!("memprof plot is not built yet")
}
