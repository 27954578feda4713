//! The roll-up stage's decisions and the operator's common parts: what a
//! Job's profile and status should be (`reconcile.rs`, pure), which reports
//! count (`trust.rs`, pure), the thresholds Event, the reporters' RBAC,
//! leader election, task supervision, metrics and the operator's flags.
//! The I/O that runs them is the one controller in `crate::pipeline`;
//! every status write is `crate::status`'s.
//!
//! Design decisions, and why:
//! - **Cleanup is the garbage collector's job.** The profile carries an
//!   ownerReference to its Job (`controller: false`, `blockOwnerDeletion:
//!   true`), so kube-controller-manager deletes it with the Job, whatever the
//!   propagation policy; there is no finalizer to get stuck. A Job whose
//!   annotation is removed loses its profile and our annotations at once.
//! - **Reads come from watch caches**, one watch per kind, slimmed to what
//!   the pipeline reads (`pipeline/slim.rs`).
//! - **Writes are spaced per Job, not debounced**, by the status writer:
//!   at most one write a Job every `--min-write-interval-ms` (1 s), the
//!   newest wish wins, Jobs are served in the order they asked.
//! - **Events are tied to status writes.** A risk transition is computed
//!   against the status already written or handed over, and published
//!   only after the status that records the new risk was written, so a
//!   restarted operator finds nothing to announce. Rejected reports are
//!   announced once: the names already listed in the stored `ReportsValid`
//!   condition are not repeated.
//! - **Job annotations are server-side applied** with the same field manager
//!   rather than merge-patched: the API server then records memprof as the
//!   owner of exactly those four keys, and applying an empty set when
//!   profiling is switched off removes them without touching anyone else's.
//! - **One active replica.** With `--leader-elect` the binary runs the
//!   controller only while it holds a `coordination.k8s.io/v1` Lease
//!   (`leader.rs`); standbys take over within the lease duration, at once
//!   after a graceful shutdown.

mod crds;
mod error;
mod job_gauges;
pub mod leader;
pub mod metrics;
pub mod rbac;
pub mod reconcile;
pub mod tasks;
pub mod thresholds;
pub mod trust;

pub use crds::check_crds;
pub use error::{Error, Result};
pub use leader::{Elector, LeaderOptions};
pub use metrics::{serve, Metrics};
pub use rbac::{binding_name, ensure_reporter_rbac, RbacError, REPORTER_ROLE};
pub use tasks::{supervise, Health, Ready};

/// What the operator needs to know besides the client (flags of
/// `memprof-operator`, each with an environment fallback).
#[derive(Clone, Debug, clap::Args)]
pub struct Options {
    /// Namespace to watch; empty watches all namespaces.
    #[arg(long, env = "MEMPROF_NAMESPACE", default_value = "")]
    pub namespace: String,

    /// Minimum time between two writes (status or annotations) for one Job, in milliseconds.
    #[arg(long, env = "MEMPROF_MIN_WRITE_INTERVAL_MS", default_value_t = 1000)]
    pub min_write_interval_ms: u64,

    /// Jobs reconciled at the same time, and status writes in flight (a Job
    /// is never reconciled twice at once). 16: with 8, the status writer's
    /// rate was 8 ÷ the write's round trip, below what the API server took
    /// (docs/benchmarks.md, the A/B).
    #[arg(long, env = "MEMPROF_CONCURRENCY", default_value_t = 16)]
    pub concurrency: u16,

    /// How the status writer writes a MemoryProfile status: `apply` (a
    /// server-side apply of the whole status) or `merge` (a JSON merge patch
    /// of what changed); both with the resourceVersion precondition.
    #[arg(long, env = "MEMPROF_STATUS_WRITE", value_enum, default_value_t)]
    pub status_write: WriteMode,

    /// Reporting instance in Events (the chart sets it to the pod name); defaults to the hostname.
    #[arg(long, env = "MEMPROF_INSTANCE")]
    pub instance: Option<String>,

    /// Namespaced install: profile only Jobs in these namespaces (comma-separated),
    /// where the chart grants write verbs; empty: every namespace watched.
    #[arg(long, env = "MEMPROF_ALLOWED_NAMESPACES", value_delimiter = ',', num_args = 0..)]
    pub allowed_namespaces: Vec<String>,

    /// Cluster-wide threshold overrides (the binary copies them from
    /// `--default-thresholds`), shown in each profile's status.
    #[arg(skip)]
    pub default_thresholds: serde_json::Map<String, serde_json::Value>,

    /// The operator's admission key ring: only reports of pods marked under
    /// it count (`trust.rs`). Filled by the binary; empty, nothing counts.
    #[arg(skip)]
    pub admission: memprof_api::admission::Keys,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            namespace: String::new(),
            min_write_interval_ms: 1000,
            concurrency: 16,
            status_write: Default::default(),
            instance: None,
            allowed_namespaces: Vec::new(),
            default_thresholds: serde_json::Map::new(),
            admission: Default::default(),
        }
    }
}

impl Options {
    /// Whether the operator may act in `namespace` (see `--allowed-namespaces`).
    pub fn allows(&self, namespace: &str) -> bool {
        // Per watch event: no allocation.
        let mut listed = self
            .allowed_namespaces
            .iter()
            .map(|s| s.trim())
            .filter(|s| !s.is_empty())
            .peekable();
        listed.peek().is_none() || listed.any(|s| s == namespace)
    }

    /// Options for one namespace, defaults otherwise (what the tests use).
    pub fn for_namespace(namespace: impl Into<String>) -> Self {
        Options {
            namespace: namespace.into(),
            ..Default::default()
        }
    }
}

/// How the status writer (`crate::status`) writes a status. An operator
/// option, defined here so that the flags need nothing of the writer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum WriteMode {
    /// A server-side apply of the whole status (field manager `memprof-operator`).
    #[default]
    Apply,
    /// A JSON merge patch of the fields that differ from the status it was
    /// composed on (field manager `memprof-operator`). Fewer bytes, but no
    /// faster on this machine's API server (docs/benchmarks.md, the A/B).
    Merge,
}

#[cfg(test)]
mod options_tests {
    use super::Options;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        opts: Options,
    }

    #[test]
    fn allowed_namespaces_limit_where_the_operator_acts() {
        let all = Cli::parse_from(["memprof-operator"]).opts;
        assert!(all.allows("anything"));
        // What the chart renders for a cluster-wide install: an empty value.
        let empty = Cli::parse_from(["memprof-operator", "--allowed-namespaces="]).opts;
        assert!(empty.allows("anything"));
        let some = Cli::parse_from(["memprof-operator", "--allowed-namespaces=team-a,team-b"]).opts;
        assert!(some.allows("team-a") && some.allows("team-b"));
        assert!(!some.allows("kube-system"));
    }
}
