//! `PlanError`: why a policy's actions cannot apply to a Job, with the
//! reason each is recorded and published under. Its own file because it is
//! the list a reader looks up from an Event or a `Skipped` record, apart
//! from how a plan is built.

/// Why a policy's actions cannot apply to a Job. Permanent for that Job (its
/// pod template is immutable), so it is recorded once, not retried.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum PlanError {
    /// No container sets the env var.
    #[error("no container{} of the Job sets env {env}: nothing to scale", container.as_ref().map(|c| format!(" named {c}")).unwrap_or_default())]
    NoSuchEnv {
        /// Env var.
        env: String,
        /// The container the action names, if any.
        container: Option<String>,
    },
    /// The env var comes from `valueFrom`, not a literal.
    #[error("env {env} of container {container} is set with valueFrom, not a literal value: memprof cannot change it")]
    NotLiteral {
        /// Env var.
        env: String,
        /// Container.
        container: String,
    },
    /// The env var's value is not a non-negative integer.
    #[error("env {env} of container {container} is {value:?}, not an integer: nothing to scale")]
    NotANumber {
        /// Env var.
        env: String,
        /// Container.
        container: String,
        /// The value found.
        value: String,
    },
    /// Scaling would not lower the value.
    #[error("{what} is {value}, already at the minimum {minimum}: nothing left to scale down")]
    AtMinimum {
        /// `env BATCH_SIZE` or `ConfigMap cm key k`.
        what: String,
        /// Current value.
        value: u64,
        /// The action's minimum.
        minimum: u64,
    },
    /// The ConfigMap to write does not exist.
    #[error("ConfigMap {name} does not exist in the Job's namespace: create it or fix the policy")]
    ConfigMapMissing {
        /// ConfigMap name.
        name: String,
    },
    /// The ConfigMap exists but its owner did not opt it in.
    #[error("ConfigMap {name} is not labelled memprof.dev/remediable=true: memprof writes only ConfigMaps their owners opted in")]
    ConfigMapNotOptedIn {
        /// ConfigMap name.
        name: String,
    },
    /// The ConfigMap key to scale is missing or not an integer.
    #[error("ConfigMap {name} key {key} is {value:?}, not an integer: nothing to scale")]
    ConfigMapNotANumber {
        /// ConfigMap name.
        name: String,
        /// Key.
        key: String,
        /// The value found (empty when the key is missing).
        value: String,
    },
    /// Another controller owns the Job, and the policy does not allow acting on such Jobs.
    #[error("the Job is controlled by {owner}, which would fight a change: set allowControlledJobs in the policy to act anyway")]
    ControlledJob {
        /// `Kind/name` of the owner.
        owner: String,
    },
    /// micro-batch × accumulation does not fit in 64 bits.
    #[error("container {container}: {env} × accumulation overflows: fix the Job's values")]
    BatchOverflow {
        /// Env var of the micro-batch.
        env: String,
        /// Container.
        container: String,
    },
    /// The Job lacks a field every stored Job has.
    #[error("the Job has no {0}: cannot recreate it")]
    MalformedJob(&'static str),
}

impl PlanError {
    /// CamelCase reason for Events and conditions.
    pub fn reason(&self) -> &'static str {
        match self {
            PlanError::NoSuchEnv { .. } => "NoSuchEnv",
            PlanError::NotLiteral { .. } => "EnvNotLiteral",
            PlanError::NotANumber { .. } => "EnvNotANumber",
            PlanError::AtMinimum { .. } => "AtMinimum",
            PlanError::ConfigMapMissing { .. } => "ConfigMapMissing",
            PlanError::ConfigMapNotOptedIn { .. } => "ConfigMapNotOptedIn",
            PlanError::ConfigMapNotANumber { .. } => "ConfigMapNotANumber",
            PlanError::ControlledJob { .. } => "ControlledByOwner",
            PlanError::BatchOverflow { .. } => "BatchOverflow",
            PlanError::MalformedJob(_) => "MalformedJob",
        }
    }
}
