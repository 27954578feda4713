//! `memprof-sidecar`: samples a pod's GPUs ([`sampler`]), analyses them
//! ([`monitor`], over `memprof-analysis`), decides what to write and what to
//! answer the agent ([`budget`], [`answer`]) and writes the pod's
//! MemoryReport ([`writer`]), one step after the other in [`run`]. It serves
//! the in-process agent on a Unix socket ([`socket`], [`server`]) and
//! `/metrics` on TCP. On Kubernetes it names the pods sharing a GPU whose
//! verdict blames a neighbour ([`neighbours`], from the kubelet).
//! Depends on `memprof-api` and `memprof-analysis` only: only the sidecar
//! samples GPUs, and nothing the CLI, the controller or the webhook does
//! rebuilds it.
#![forbid(unsafe_code)]

pub mod acks;
pub mod alone;
pub mod answer;
mod args;
pub mod budget;
pub mod checkpoints;
pub mod directives;
pub mod gpus;
pub mod identity;
pub mod metrics;
pub mod monitor;
pub mod neighbours;
pub mod run;
pub mod sampler;
pub mod server;
pub mod setup;
pub mod socket;
pub mod trainer;
pub mod writer;

pub use args::Args;
