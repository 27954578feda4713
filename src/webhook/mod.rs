//! The installation path: a mutating admission webhook that injects the
//! `memprof-sidecar` container into annotated Jobs (and labelled Pods), the
//! TLS material it is served with, and the namespaced RBAC the sidecars need
//! to write their `MemoryReport`s.
//!
//! Layout follows the reconcile style of the rest of the crate: the decision
//! and the JSON patch are pure functions on plain values ([`mutate`],
//! [`sidecar`]), everything that talks to the API server or the network takes
//! its dependencies ([`server::serve`], [`certs::ensure_serving_cert`],
//! [`rbac::ensure_reporter_rbac`]), and [`run`] wires them together for the
//! operator binary.
//!
//! Profiling must never block training: every path that cannot inject answers
//! "allowed, no patch" (with a warning where the user should know), and the
//! `MutatingWebhookConfiguration` uses `failurePolicy: Ignore`.

pub mod agent;
pub mod certs;
mod config;
pub mod mutate;
mod options;
pub mod rbac;
pub mod server;
pub mod sidecar;

pub use certs::{CertBundle, CertConfig, CertError};
pub use config::{
    parse_interval, GpuAccess, InjectionConfig, ServiceAccountTokenMode, SidecarMode, DEFAULT_IMAGE,
};
pub use mutate::{admit_review, injection_patch, Injection, MutateError, Target};
pub use options::{run, CertMode, Error, WebhookOptions};
pub use rbac::{binding_name, ensure_reporter_rbac, RbacError, REPORTER_ROLE};
pub use server::{serve, ServerError, TlsCert};

/// Name of the injected container (init or regular); its presence makes
/// injection a no-op, which is what keeps the webhook idempotent.
pub const SIDECAR_CONTAINER: &str = "memprof-sidecar";

/// Label that asks for injection into a bare Pod (for controllers other than Job).
pub const LABEL_INJECT: &str = "memprof.dev/inject";
/// Pod-template annotation the webhook sets once it has injected the sidecar.
pub const ANNOTATION_INJECTED: &str = "memprof.dev/injected";
/// Pod-template label (`"true"`) the webhook sets with the sidecar: what the
/// chart's PodMonitor selects, since a PodMonitor selects on labels only.
pub const LABEL_INJECTED: &str = "memprof.dev/injected";
/// Job/Pod annotation: sidecar image override.
pub const ANNOTATION_SIDECAR_IMAGE: &str = "memprof.dev/sidecar-image";
/// Job/Pod annotation: sampling interval override (`1s`, `100ms`, `2m`).
pub const ANNOTATION_INTERVAL: &str = "memprof.dev/interval";
/// Job/Pod annotation: sidecar metrics/agent port override.
pub const ANNOTATION_PORT: &str = "memprof.dev/port";
/// Job/Pod annotation: set to `keep` to leave the trainers'
/// `terminationMessagePolicy` alone (see [`mutate`] for why `File` is
/// otherwise replaced).
pub const ANNOTATION_TERMINATION_MESSAGE: &str = "memprof.dev/termination-message-policy";
/// Annotation the Job controller sets on the pods of Indexed Jobs.
pub const ANNOTATION_COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";

/// Environment the webhook sets on the sidecar. The sidecar reads these names;
/// they live here so both sides share one definition.
pub mod env {
    /// Pod name (downward API `metadata.name`).
    pub const POD_NAME: &str = "POD_NAME";
    /// Pod namespace (downward API `metadata.namespace`).
    pub const POD_NAMESPACE: &str = "POD_NAMESPACE";
    /// Node name (downward API `spec.nodeName`).
    pub const NODE_NAME: &str = "NODE_NAME";
    /// Pod UID (downward API `metadata.uid`), for the MemoryReport's owner reference.
    pub const POD_UID: &str = "POD_UID";
    /// Name of the Job the pod belongs to.
    pub const JOB_NAME: &str = "MEMPROF_JOB_NAME";
    /// The Job's parallelism: how many ranks the profile should expect.
    pub const EXPECTED_RANKS: &str = "MEMPROF_EXPECTED_RANKS";
    /// Completion index of an Indexed Job's pod (the rank).
    pub const JOB_COMPLETION_INDEX: &str = "JOB_COMPLETION_INDEX";
    /// Sampling interval, always written as whole milliseconds (`250ms`).
    pub const INTERVAL: &str = "MEMPROF_INTERVAL";
    /// Port of the sidecar's metrics / agent endpoint.
    pub const PORT: &str = "MEMPROF_PORT";
    /// `true` on legacy (non-native) sidecars: exit once the other containers
    /// have terminated so that the Job can complete.
    pub const EXIT_WHEN_ALONE: &str = "MEMPROF_EXIT_WHEN_ALONE";
    /// GPU discovery method forced by the GPU access mode (`podResources`, `agentOnly`).
    pub const GPU_DISCOVERY: &str = "MEMPROF_GPU_DISCOVERY";
    /// Read by the NVIDIA container runtime: which GPUs to expose.
    pub const NVIDIA_VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";
    /// Read by the NVIDIA container runtime: which driver parts to mount.
    pub const NVIDIA_DRIVER_CAPABILITIES: &str = "NVIDIA_DRIVER_CAPABILITIES";
    /// Analysis threshold overrides, JSON of camelCase fields.
    pub const THRESHOLDS: &str = "MEMPROF_THRESHOLDS";
    /// `true`: the sidecar logs JSON lines.
    pub const LOG_JSON: &str = "MEMPROF_LOG_JSON";
}
