//! Subcommands of the `memprof` CLI that are library code (so they are tested).
//! Each module owns its flags (`Args`) and its `run`; `src/bin/memprof.rs`
//! only dispatches.

pub mod analyze;
pub mod breakdown;
pub mod compare;
pub mod compare_files;
pub mod completion;
pub mod install_agent;
pub mod kube;
pub mod oom;
pub mod output;
pub mod plot;
pub mod policy;
pub mod profile;
pub mod report;
pub mod sweep;
pub mod top;
