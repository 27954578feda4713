//! Subcommands of the `memprof` CLI that are library code (so they are tested):
//! offline trace analysis and the cluster report.

pub mod analyze;
pub mod install_agent;
pub mod policy;
pub mod profile;
pub mod report;
