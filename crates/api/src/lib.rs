//! The `memprof.dev/v1alpha1` API: the custom resources the sidecar, the
//! operator and the CLI exchange. Every field carries a doc comment because
//! it becomes the `kubectl explain` text of the generated CRD.
//!
//! `memprof-api` holds every contract shared by more than one role (see the
//! README's "How it fits together"): the CRD types, the agent wire format
//! ([`agent`]), the analysis thresholds ([`thresholds`]), sampling intervals
//! ([`interval`]), the trace CSV ([`trace`]) and the environment the webhook
//! and the sidecar agree on ([`env`]). It depends on no other memprof crate.
//!
//! Features, so that the pure crates (memprof-analysis) build the types
//! without what only the roles need: `crd` (the kinds `MemoryProfile`,
//! `MemoryReport`, `RemediationPolicy` from kube's derive, and `crds`),
//! `admission` (the admission and writer marks: the webhook, the operator,
//! the CLI's doctor) and `crd-yaml` (`crds_yaml`, what `memprof crd` prints).
#![forbid(unsafe_code)]

// Compiled for the crate's own tests too (their dependencies are dev-dependencies).
#[cfg(any(test, feature = "admission"))]
pub mod admission;
pub mod agent;
mod common;
pub mod env;
pub mod family;
pub mod interval;
mod policy;
mod profile;
mod report;
pub mod thresholds;
pub mod trace;
pub mod workload;
#[cfg(any(test, feature = "admission"))]
pub mod workload_mark;
#[cfg(any(test, feature = "admission"))]
pub mod writer;

pub use common::*;
pub use policy::*;
pub use profile::*;
pub use report::*;

// The CRDs themselves: only with the `crd` feature (the pure crates use the
// types without kube's derive and its dependencies).
#[cfg(any(test, feature = "crd"))]
mod crd;
#[cfg(any(test, feature = "crd"))]
pub use crd::crds;
#[cfg(feature = "crd-yaml")]
pub use crd::crds_yaml;

/// API group of every memprof resource.
pub const GROUP: &str = "memprof.dev";
/// API version of every memprof resource.
pub const VERSION: &str = "v1alpha1";

/// Annotation that turns profiling on for a Job.
pub const ANNOTATION_ENABLED: &str = "memprof.dev/enabled";
/// Job annotation: the job's current OOM risk level.
pub const ANNOTATION_OOM_RISK: &str = "memprof.dev/oom-risk";
/// Job annotation: the job's smallest predicted time to OOM.
pub const ANNOTATION_TIME_TO_OOM: &str = "memprof.dev/time-to-oom";
/// Job annotation: max/mean of per-GPU peak memory across the job.
pub const ANNOTATION_IMBALANCE: &str = "memprof.dev/imbalance";
/// Job annotation: where the job will run out of memory first.
pub const ANNOTATION_BOTTLENECK: &str = "memprof.dev/bottleneck";
/// Job annotation (the user's): the predicted peak GPU memory per rank,
/// e.g. `85.3GiB`, as `memprof estimate` prints it; with
/// [`ANNOTATION_GPU_MEMORY`] the webhook warns at admission when it does
/// not fit.
pub const ANNOTATION_PREDICTED_PEAK: &str = "memprof.dev/predicted-peak";
/// Job annotation (the user's): the memory of the GPU each rank gets, e.g. `80GiB`.
pub const ANNOTATION_GPU_MEMORY: &str = "memprof.dev/gpu-memory";
/// Job annotation (the user's): what the prediction is based on, in words.
pub const ANNOTATION_PREDICTED_BY: &str = "memprof.dev/predicted-by";
/// Label on a MemoryReport: the MemoryProfile it feeds.
pub const LABEL_PROFILE: &str = "memprof.dev/profile";
/// Label on a MemoryReport: the Job its pod belongs to.
pub const LABEL_JOB: &str = "memprof.dev/job";
/// Field manager of the sidecar's server-side applies.
pub const SIDECAR_MANAGER: &str = "memprof-sidecar";
/// Field manager of the operator's server-side applies.
pub const OPERATOR_MANAGER: &str = "memprof-operator";

/// The NVIDIA device plugin's resource name.
pub const DEFAULT_GPU_RESOURCE: &str = "nvidia.com/gpu";
/// Where the memprof image carries the Python agent tree (the Dockerfile
/// copies it there): what `memprof install-agent` copies from and the
/// webhook's `--agent-path` default.
pub const DEFAULT_AGENT_SOURCE: &str = "/opt/memprof/agent";
/// Fraction of the device a batch-size recommendation keeps free by default
/// (predicted peaks stay under 90 %), when the policy names no headroom.
pub const DEFAULT_HEADROOM_FRACTION: f64 = 0.10;

/// Upper bound on the GPUs one MemoryReport carries (a node has at most 16).
pub const MAX_GPUS_PER_REPORT: usize = 16;
/// Upper bound on the timeline points kept per GPU in a MemoryReport.
pub const MAX_TIMELINE_POINTS: usize = 60;
/// Upper bound on the ranks listed in a MemoryProfile's `topRanks`.
pub const MAX_TOP_RANKS: usize = 8;
/// Upper bound on OOM records and remediation records in a MemoryProfile.
pub const MAX_HISTORY: usize = 16;
/// Upper bound on conditions on one object.
pub const MAX_CONDITIONS: usize = 8;
