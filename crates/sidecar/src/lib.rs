//! `memprof-sidecar`: samples a pod's GPUs ([`sampler`]), analyses them
//! ([`monitor`], over `memprof-analysis`) and writes the pod's MemoryReport
//! (`writer`), serving the in-process agent and `/metrics` (`server`).
//! Depends on `memprof-api` and `memprof-analysis` only: only the sidecar
//! samples GPUs, and nothing the CLI, the controller or the webhook does
//! rebuilds it.
#![forbid(unsafe_code)]

pub mod alone;
mod args;
pub mod budget;
pub mod gpus;
pub mod identity;
pub mod metrics;
pub mod monitor;
pub mod run;
pub mod sampler;
pub mod server;
pub mod writer;

pub use args::Args;
