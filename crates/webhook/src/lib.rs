//! The installation path: a mutating admission webhook that injects the
//! `memprof-sidecar` container into annotated Jobs (and labelled Pods), and
//! the TLS material it is served with. (The namespaced RBAC the sidecars need
//! to write their `MemoryReport`s is the operator's: `operator/rbac.rs`.)
//!
//! Layout follows the reconcile style of the rest of the crate: the decision
//! and the JSON patch are pure functions on plain values ([`mutate`],
//! [`sidecar`]), everything that talks to the API server or the network takes
//! its dependencies ([`server::serve`], [`certs::ensure_serving_cert`]), and
//! [`run`] wires them together for the operator binary.
//!
//! Profiling must never block training: every path that cannot inject answers
//! "allowed, no patch" (with a warning where the user should know), and the
//! `MutatingWebhookConfiguration` uses `failurePolicy: Ignore`.
//!
//! `memprof-webhook` depends only on `memprof-api`.
#![forbid(unsafe_code)]

pub mod agent;
pub mod certs;
mod config;
pub mod history;
pub mod keys;
pub mod marks;
pub mod mutate;
mod options;
pub mod paths;
pub mod prediction;
mod retry;
pub mod server;
pub mod sidecar;
pub mod workload_marks;
pub mod writers;

pub use certs::{CertBundle, CertConfig, CertError};
pub use config::{GpuAccess, InjectionConfig, MarkConfig, ServiceAccountTokenMode, SidecarMode};
pub use marks::Caller;
pub use mutate::{admit_review, injection_patch, Injection, MutateError, Target};
pub use options::{run, CertMode, Error, WebhookOptions};
pub use server::{serve, ServerError, TlsCert};
pub use workload_marks::WorkloadIdentities;

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
