//! The local lab: commands on this machine's GPUs and on files, no cluster
//! needed (`profile` and `oom` start a standalone `memprof-sidecar` process).

pub mod analyze;
pub mod command_line;
pub mod compare_files;
pub mod estimate;
pub mod fragment;
pub mod install_agent;
pub mod oom;
pub mod points;
pub mod profile;
pub mod rollup;
pub mod sweep;
pub mod timeline;
pub mod watch;
