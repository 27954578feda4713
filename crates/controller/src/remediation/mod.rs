//! Automated OOM remediation: `RemediationPolicy` objects say what to do
//! when a profiled Job's GPU memory gets dangerous (or runs out). This is
//! the second stage of the controller's per-Job pipeline (`crate::pipeline`):
//! on the same fetched and screened data as the roll-up, GPU OOMs are
//! detected (`oom.rs`) and the policies evaluated (`decide.rs`, on the
//! pure triggers of `memprof_policy::triggers`); a decision is planned
//! (`memprof_policy::plan`, pure too, so the CLI explains the same), recorded
//! (`recording.rs`) and carried out (`execute.rs`, `steps.rs`) by a task of
//! its own (`tasks.rs`), one per Job at a time, never by the reconcile.
//!
//! The profile's `status.ooms`, `status.remediations`,
//! `status.remediationTotals` and `status.lastAction` are changed only
//! through the status writer (`crate::status`), as edits it applies to the
//! newest status and answers once written; the policies' status is written
//! by `status.rs` (field manager `memprof-remediation`).
//!
//! At most once, never losing the Job — the protocol (see docs/remediation.md):
//! 1. The decision is recorded first, as a `Pending` record whose id is
//!    derived from (policy uid and generation, Job uid, trigger, count), in a
//!    status write conditioned on the profile's resourceVersion.
//! 2. The plan, with every value computed (`BATCH_SIZE 32 -> 24`) and the
//!    full manifest of the Job to create, goes to a ConfigMap
//!    `memprof-remediation-<id>` that nothing owns (so no garbage collection
//!    can take it), before anything is changed.
//! 3. The Job is deleted with `propagationPolicy: Orphan` and a uid
//!    precondition. Orphan, not Background or Foreground: the profile is a
//!    dependent of the Job, and the garbage collector removing the owner
//!    reference itself while the Job carries a deletionTimestamp is the one
//!    way the operator cannot race us into re-adding it (it leaves Jobs
//!    being deleted alone). The old pods, orphaned too, are deleted
//!    explicitly by their `controller-uid` label.
//! 4. The manifest is created; the new Job carries `memprof.dev/remediation:
//!    <id>`, which is how a restart tells "already created" from "not yet".
//! 5. The record becomes `Done` naming the created Job's uid
//!    (`replacementUid`: the one workload that inherits the profile,
//!    `memprof_policy::triggers::succession`), the ConfigMap is deleted.
//!
//! A restart anywhere resumes from the `Pending` record: each step is
//! idempotent and decided from what the API server holds, so it is finished
//! or skipped, never repeated. Cooldown and `maxRemediations` count records
//! in the profile, so they hold across restarts and recreations.

pub mod checkpoint;
mod decide;
mod execute;
mod executor;
pub mod nonce;
pub mod notify;
pub mod oom;
pub mod ranks;
mod recording;
mod records;
mod request;
mod status;
mod steps;
mod store;
mod suspend_step;
mod tasks;
pub mod verify;
pub mod workload;

pub use checkpoint::JobCheckpoints;
pub use decide::{decide, Decision};
pub use executor::{Executor, Target};
pub use notify::CountedReports;
pub use ranks::Ranks;
pub use records::replaced_by_memprof;
pub use request::{FAILPOINT_AFTER_DELETE, FAILPOINT_AFTER_SUSPEND, FAILPOINT_ENV};
pub use status::{policy_status, policy_status_task};

use crate::status::advice;
use kube::Client;
use memprof_api::RemediationPolicy;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use std::sync::Arc;

/// Flags of remediation (in `memprof-operator`), each with an environment
/// fallback. The watched namespace is the operator's `--namespace`; the
/// Lease is the operator's (one controller, one leader).
#[derive(Clone, Debug, clap::Args)]
// The operator's flags are an `Options` too: clap's group ids must differ.
#[group(id = "RemediationOptions")]
pub struct Options {
    /// Carry out RemediationPolicy objects.
    #[arg(id = "remediation", long = "remediation", value_name = "BOOL", env = "MEMPROF_REMEDIATION", default_value_t = true, action = clap::ArgAction::Set)]
    pub enabled: bool,

    /// Namespace where remediation plans (ConfigMaps) are kept: one only the
    /// operator may write, never a tenant's. Defaults to the operator pod's
    /// own namespace, else the watched one, else `default`.
    #[arg(
        id = "remediation_plan_namespace",
        long = "remediation-plan-namespace",
        value_name = "NAMESPACE",
        env = "MEMPROF_REMEDIATION_PLAN_NAMESPACE"
    )]
    pub plan_namespace: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            enabled: true,
            plan_namespace: None,
        }
    }
}

impl Options {
    /// Where plans are kept: flag, else the pod's own namespace, else the
    /// watched one (only out of cluster, e.g. a developer's run), else `default`.
    pub fn plan_namespace(&self, watched: &str) -> String {
        own_namespace(self.plan_namespace.clone(), watched)
    }
}

/// A namespace the operator owns: `flag`, else the pod's own, else `watched`, else `default`.
fn own_namespace(flag: Option<String>, watched: &str) -> String {
    const SA_NAMESPACE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";
    flag.or_else(|| std::env::var("POD_NAMESPACE").ok())
        .or_else(|| std::fs::read_to_string(SA_NAMESPACE).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| {
            if watched.is_empty() {
                "default".into()
            } else {
                watched.into()
            }
        })
}

/// Why the remediation controller, or one reconcile, failed. The advice
/// follows the API server's answer (`status::advice`): RBAC only for a 401/403.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The RemediationPolicy CRD is not installed.
    #[error("CRD remediationpolicies.memprof.dev not installed: run `kubectl apply -f crds/`")]
    CrdMissing,
    /// The startup check could not talk to the API server.
    #[error("cannot check that CRD remediationpolicies.memprof.dev is installed: {}; {}", .0, advice(.0, "remediationpolicies: list"))]
    CrdCheck(#[source] kube::Error),
    /// A watch cache shut down while a reconcile waited for it.
    #[error("the watch cache of {0} shut down: the controller is stopping")]
    CacheClosed(&'static str),
    /// Reading an object failed.
    #[error("reading {what}: {source}; {}", advice(.source, &format!("get on {what}")))]
    Read {
        /// What was read, e.g. `Job ml/train`.
        what: String,
        /// What the API server said.
        #[source]
        source: kube::Error,
    },
    /// Writing a MemoryProfile's status failed.
    #[error("writing status of MemoryProfile {}: {}; {}", .0, .1, advice(.1, "memoryprofiles/status: patch"))]
    WriteStatus(String, #[source] kube::Error),
    /// Saving or deleting a remediation plan ConfigMap failed.
    #[error("saving the plan of remediation {} (ConfigMap memprof-remediation-{}): {}; {}", .0, .0, .1, advice(.1, "configmaps: get, create, delete"))]
    SavePlan(String, #[source] kube::Error),
    /// A plan stored in a ConfigMap cannot be read back.
    #[error("the plan in ConfigMap memprof-remediation-{0} is unreadable: {1}; delete the ConfigMap and the Pending record to give up on it")]
    BadPlan(String, String),
    /// A step of a plan failed (retried with backoff; the plan stays pending).
    #[error("remediation {id}: {step} failed: {source}; {}", advice(.source, "jobs: delete, create, patch; pods: deletecollection; configmaps: patch"))]
    Step {
        /// Remediation id.
        id: String,
        /// The step, e.g. `deleting Job ml/train`.
        step: String,
        /// What the API server said.
        #[source]
        source: kube::Error,
    },
    /// Serializing a plan or manifest failed (a bug).
    #[error("serializing {0}: {1}; this is a bug, please report it")]
    Serialize(&'static str, #[source] serde_json::Error),
    /// The status writer stopped before a record was written.
    #[error(transparent)]
    Stopped(crate::status::WriteError),
}

impl Error {
    /// Short label for `memprof_remediation_reconcile_errors_total`.
    pub fn step(&self) -> &'static str {
        match self {
            Error::CrdMissing | Error::CrdCheck(_) => "crd_check",
            Error::CacheClosed(_) => "cache_closed",
            Error::Read { .. } => "read",
            Error::WriteStatus(..) => "write_status",
            Error::SavePlan(..) | Error::BadPlan(..) => "plan",
            Error::Step { .. } => "step",
            Error::Serialize(..) => "serialize",
            Error::Stopped(_) => "stopped",
        }
    }
}

/// Result of the remediation controller's fallible steps.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Label of `memprof_remediation_records_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    /// `Pending`, `Done`, `Skipped`, `Failed`, `DryRun`.
    pub phase: String,
}

/// Label of `memprof_remediation_reconcile_errors_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StepLabels {
    /// [`Error::step`].
    pub step: &'static str,
}

/// The remediation controller's metrics (prefix `memprof_remediation_`).
#[derive(Debug, Default)]
pub struct Metrics {
    /// Remediation records written, by phase.
    pub records: Family<PhaseLabels, Counter>,
    /// GPU OOMs recorded.
    pub ooms: Counter,
    /// Reconciles that failed, by step.
    pub reconcile_errors: Family<StepLabels, Counter>,
    /// Saved plans refused because they were not the recorded ones.
    pub plans_refused: Counter,
    /// Status patches of MemoryReports writing a `notifyTrainer` directive.
    pub directive_writes: Counter,
}

impl Metrics {
    /// Creates the metrics under `remediation_` in `registry`.
    pub fn register(registry: &mut Registry) -> Arc<Self> {
        let m = Metrics::default();
        let r = registry.sub_registry_with_prefix("remediation");
        r.register(
            "records",
            "Remediation records written, by phase",
            m.records.clone(),
        );
        r.register("gpu_ooms", "GPU OOMs recorded", m.ooms.clone());
        r.register(
            "reconcile_errors",
            "Remediation reconciles that failed, by step",
            m.reconcile_errors.clone(),
        );
        r.register(
            "plans_refused",
            "Saved remediation plans refused because they were not the recorded ones",
            m.plans_refused.clone(),
        );
        r.register(
            "directive_writes",
            "Status patches of MemoryReports writing a notifyTrainer directive",
            m.directive_writes.clone(),
        );
        Arc::new(m)
    }

    /// Metrics registered nowhere (tests).
    pub fn unregistered() -> Arc<Self> {
        Arc::new(Metrics::default())
    }
}

/// Checks that the RemediationPolicy CRD is served and listable in
/// `namespace` (empty: all).
pub async fn check(client: &Client, namespace: &str) -> Result<()> {
    let api: kube::Api<RemediationPolicy> = if namespace.is_empty() {
        kube::Api::all(client.clone())
    } else {
        kube::Api::namespaced(client.clone(), namespace)
    };
    match api
        .list_metadata(&kube::api::ListParams::default().limit(1))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Err(Error::CrdMissing),
        Err(e) => Err(Error::CrdCheck(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    /// The flags as `memprof-operator` flattens them next to the operator's.
    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        operator: crate::operator::Options,
        #[command(flatten)]
        leader: crate::operator::LeaderOptions,
        #[command(flatten)]
        remediation: Options,
    }

    #[test]
    fn flags_flatten_next_to_the_operators_without_clashes() {
        Cli::command().debug_assert();
        let cli = Cli::parse_from(["memprof-operator", "--namespace", "ml", "--leader-elect"]);
        assert!(cli.remediation.enabled && cli.leader.leader_elect);
        let cli = Cli::parse_from([
            "memprof-operator",
            "--remediation=false",
            "--remediation-plan-namespace",
            "memprof-system",
        ]);
        assert!(!cli.remediation.enabled);
        assert_eq!(cli.remediation.plan_namespace("ml"), "memprof-system");
    }

    #[test]
    fn a_failed_step_points_at_rbac_only_when_the_api_server_refused_permission() {
        let api = |code: u16| {
            let mut s = kube::core::Status::failure("x", "");
            s.code = code;
            kube::Error::Api(s.boxed())
        };
        let step = |code| {
            Error::Step {
                id: "r1".into(),
                step: "deleting Job ml/train".into(),
                source: api(code),
            }
            .to_string()
        };
        assert!(
            step(403).contains("check RBAC (jobs: delete"),
            "{}",
            step(403)
        );
        assert!(!step(503).contains("RBAC"), "{}", step(503));
        assert!(step(503).contains("overloaded or failing"), "{}", step(503));
        let read = Error::Read {
            what: "Job ml/train".into(),
            source: api(504),
        };
        assert!(!read.to_string().contains("RBAC"), "{read}");
    }
}
