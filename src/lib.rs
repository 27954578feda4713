//! memprof: GPU memory profiling and OOM prevention for training jobs on Kubernetes.
//!
//! The library holds everything the three binaries share: the API types
//! ([`api`]), the pure analysis ([`analysis`]), the GPU samplers ([`sampler`])
//! and the operator's reconcile logic ([`operator`]). Binaries only parse flags
//! and wire these together.
#![forbid(unsafe_code)]

pub mod analysis;
pub mod api;
pub mod cli;
pub mod monitor;
pub mod operator;
pub mod plot;
pub mod remediation;
pub mod sampler;
pub mod webhook;
