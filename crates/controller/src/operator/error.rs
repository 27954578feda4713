//! The operator's one error type: variants are named after the step that
//! failed, and every message says what to do about it.

/// Why the operator, or one reconcile, failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A memprof CRD is not installed on the server.
    #[error("CRD {crd} not installed: run `kubectl apply -f crds/`")]
    CrdMissing {
        /// Full CRD name, e.g. `memoryprofiles.memprof.dev`.
        crd: &'static str,
    },

    /// The startup check could not talk to the API server.
    #[error(
        "cannot check that CRD {crd} is installed: {source}; \
         check KUBECONFIG (or the service account) and that the operator may list {crd}"
    )]
    CrdCheck {
        /// Full CRD name.
        crd: &'static str,
        /// What the API server (or the connection) said.
        #[source]
        source: kube::Error,
    },

    /// A Job in the watch cache lacks a field every stored object has.
    #[error("Job has no {field}: the watch cache holds a malformed object; restart the operator")]
    MalformedJob {
        /// `metadata.namespace`, `metadata.name` or `metadata.uid`.
        field: &'static str,
    },

    /// The watch caches were torn down while a reconcile waited for them.
    #[error(
        "the MemoryProfile and MemoryReport watch caches shut down before they were filled: \
         the operator is stopping"
    )]
    CacheClosed,

    /// Creating or updating a MemoryProfile's spec and owner reference failed.
    #[error(
        "applying MemoryProfile {namespace}/{name}: {source}; \
         check the operator's RBAC (memoryprofiles: get, list, watch, create, patch; \
         jobs/finalizers: update, for blockOwnerDeletion)"
    )]
    ApplyProfile {
        /// Namespace of the profile.
        namespace: String,
        /// Name of the profile (and of its Job).
        name: String,
        /// What the API server said.
        #[source]
        source: kube::Error,
    },

    /// Deleting a MemoryProfile (stale, or of a Job no longer annotated) failed.
    #[error(
        "deleting MemoryProfile {namespace}/{name}: {source}; \
         check the operator's RBAC (memoryprofiles: delete)"
    )]
    DeleteProfile {
        /// Namespace of the profile.
        namespace: String,
        /// Name of the profile.
        name: String,
        /// What the API server said.
        #[source]
        source: kube::Error,
    },

    /// Writing a MemoryProfile's status failed.
    #[error(
        "writing status of MemoryProfile {namespace}/{name}: {source}; \
         check the operator's RBAC (memoryprofiles/status: patch) and that crds/ is up to date"
    )]
    WriteStatus {
        /// Namespace of the profile.
        namespace: String,
        /// Name of the profile.
        name: String,
        /// What the API server said.
        #[source]
        source: kube::Error,
    },

    /// Annotating a Job failed.
    #[error(
        "annotating Job {namespace}/{name}: {source}; check the operator's RBAC (jobs: patch)"
    )]
    AnnotateJob {
        /// Namespace of the Job.
        namespace: String,
        /// Name of the Job.
        name: String,
        /// What the API server said.
        #[source]
        source: kube::Error,
    },

    /// Reading a JobSet child's workload (its JobSet, its TrainJob) failed.
    #[error(
        "reading the workload above a Job: {0}; check the operator's RBAC (jobsets, trainjobs: \
         get) and that their CRDs are installed"
    )]
    Workload(String),
}

impl Error {
    /// Short label for the `memprof_reconcile_errors_total` metric.
    pub fn step(&self) -> &'static str {
        match self {
            Error::CrdMissing { .. } | Error::CrdCheck { .. } => "crd_check",
            Error::MalformedJob { .. } => "malformed_job",
            Error::CacheClosed => "cache_closed",
            Error::ApplyProfile { .. } => "apply_profile",
            Error::DeleteProfile { .. } => "delete_profile",
            Error::WriteStatus { .. } => "write_status",
            Error::AnnotateJob { .. } => "annotate_job",
            Error::Workload(_) => "workload",
        }
    }
}

/// Result of the operator's fallible steps.
pub type Result<T, E = Error> = std::result::Result<T, E>;
