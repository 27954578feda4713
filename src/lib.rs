//! memprof: GPU memory profiling and OOM prevention for training jobs on Kubernetes.
//!
//! The work lives in role crates (`crates/`, see the README's "How it fits
//! together"); this facade re-exports them under their old paths so that
//! tests/, examples/ and bench/ say `memprof::api::…`, `memprof::operator::…`.
//! Nothing in a role crate depends on it. The sidecar (`memprof-sidecar`) is
//! not re-exported: its tests and examples live in `crates/sidecar`.
#![forbid(unsafe_code)]

pub use memprof_analysis as analysis;
pub use memprof_api as api;
pub use memprof_cli as cli;
pub use memprof_controller::{key, operator, pipeline, remediation, status, workload};
pub use memprof_policy as policy;
pub use memprof_webhook as webhook;
