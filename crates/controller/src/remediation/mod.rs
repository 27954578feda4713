//! Automated OOM remediation: `RemediationPolicy` objects say what to do
//! when a profiled Job's GPU memory gets dangerous (or runs out); this
//! controller watches MemoryProfiles, policies, Jobs, Pods and MemoryReports,
//! records GPU OOMs in the profile, and carries out the policies' actions.
//!
//! It runs next to the operator's roll-up controller but apart from it, as
//! its own field manager (`memprof-remediation`), owning exactly the
//! profile's `status.ooms`, `status.remediations` and `status.lastAction` and
//! the policies' status. Server-side apply keeps both writers' fields.
//!
//! Pipeline per profile (`controller.rs` fetches, `execute.rs` acts):
//! fetch (watch caches) → detect OOMs (`oom.rs`) → evaluate triggers
//! (`triggers.rs`) → plan (`plan.rs`) → record → act → record the outcome.
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
//! 5. The record becomes `Done`, the ConfigMap is deleted.
//!
//! A restart anywhere resumes from the `Pending` record: each step is
//! idempotent and decided from what the API server holds, so it is finished
//! or skipped, never repeated. Cooldown and `maxRemediations` count records
//! in the profile, so they hold across restarts and recreations.

mod controller;
mod execute;
pub mod oom;
pub mod plan;
mod status;
mod store;
pub mod triggers;
pub mod verify;

pub use controller::run_controller;
pub use status::policy_status;

use kube::Client;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::future::Future;
use std::sync::Arc;

/// Flags of the remediation controller (in `memprof-operator`), each with an
/// environment fallback. The watched namespace is the operator's `--namespace`.
///
/// Every flag starts with `--remediation` so that they flatten next to the
/// operator's own (its `--leader-elect` included) without clashing.
#[derive(Clone, Debug, clap::Args)]
// The operator's flags are an `Options` too: clap's group ids must differ.
#[group(id = "RemediationOptions")]
pub struct Options {
    /// Run the remediation controller (RemediationPolicy objects).
    #[arg(id = "remediation", long = "remediation", value_name = "BOOL", env = "MEMPROF_REMEDIATION", default_value_t = true, action = clap::ArgAction::Set)]
    pub enabled: bool,

    /// Only the holder of the remediation Lease remediates (several replicas must not race).
    #[arg(id = "remediation_leader_elect", long = "remediation-leader-elect", value_name = "BOOL", env = "MEMPROF_REMEDIATION_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,

    /// Name of the coordination.k8s.io/v1 Lease of remediation leadership.
    #[arg(
        id = "remediation_lease",
        long = "remediation-lease",
        value_name = "NAME",
        env = "MEMPROF_REMEDIATION_LEASE",
        default_value = "memprof-remediation"
    )]
    pub lease_name: String,

    /// Namespace of that Lease; defaults to the pod's namespace, else the watched namespace, else `default`.
    #[arg(
        id = "remediation_lease_namespace",
        long = "remediation-lease-namespace",
        value_name = "NAMESPACE",
        env = "MEMPROF_REMEDIATION_LEASE_NAMESPACE"
    )]
    pub lease_namespace: Option<String>,

    /// This replica's identity in the Lease; defaults to the pod name (`HOSTNAME`).
    #[arg(
        id = "remediation_leader_identity",
        long = "remediation-leader-identity",
        value_name = "IDENTITY",
        env = "MEMPROF_REMEDIATION_LEADER_IDENTITY"
    )]
    pub leader_identity: Option<String>,

    /// Namespace where remediation plans (ConfigMaps) are kept: one only the
    /// operator may write, never a tenant's. Defaults like the Lease's namespace
    /// (the operator pod's own).
    #[arg(
        id = "remediation_plan_namespace",
        long = "remediation-plan-namespace",
        value_name = "NAMESPACE",
        env = "MEMPROF_REMEDIATION_PLAN_NAMESPACE"
    )]
    pub plan_namespace: Option<String>,

    /// The operator's admission key ring: only pods marked under it are OOM
    /// evidence or report writers (`operator::trust`). Filled by the binary.
    #[arg(skip)]
    pub admission: memprof_api::admission::Keys,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            enabled: true,
            leader_elect: true,
            lease_name: "memprof-remediation".into(),
            lease_namespace: None,
            leader_identity: None,
            plan_namespace: None,
            admission: Default::default(),
        }
    }
}

impl Options {
    /// The Lease's namespace: flag, else the pod's own, else the watched one, else `default`.
    pub fn lease_namespace(&self, watched: &str) -> String {
        own_namespace(self.lease_namespace.clone(), watched)
    }

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

/// Why the remediation controller, or one reconcile, failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The RemediationPolicy CRD is not installed.
    #[error("CRD remediationpolicies.memprof.dev not installed: run `kubectl apply -f crds/`")]
    CrdMissing,
    /// The startup check could not talk to the API server.
    #[error("cannot check that CRD remediationpolicies.memprof.dev is installed: {0}; check KUBECONFIG and RBAC (remediationpolicies: list)")]
    CrdCheck(#[source] kube::Error),
    /// A watch cache shut down while a reconcile waited for it.
    #[error("the watch cache of {0} shut down: the controller is stopping")]
    CacheClosed(&'static str),
    /// Reading an object failed.
    #[error("reading {what}: {source}; check the operator's RBAC (get on {what})")]
    Read {
        /// What was read, e.g. `Job ml/train`.
        what: String,
        /// What the API server said.
        #[source]
        source: kube::Error,
    },
    /// Writing a MemoryProfile's status failed.
    #[error("writing status of MemoryProfile {0}: {1}; check RBAC (memoryprofiles/status: patch) and that crds/ is up to date")]
    WriteStatus(String, #[source] kube::Error),
    /// Saving or deleting a remediation plan ConfigMap failed.
    #[error("saving the plan of remediation {0} (ConfigMap memprof-remediation-{0}): {1}; check RBAC (configmaps: get, create, delete)")]
    SavePlan(String, #[source] kube::Error),
    /// A plan stored in a ConfigMap cannot be read back.
    #[error("the plan in ConfigMap memprof-remediation-{0} is unreadable: {1}; delete the ConfigMap and the Pending record to give up on it")]
    BadPlan(String, String),
    /// A step of a plan failed (retried with backoff; the plan stays pending).
    #[error("remediation {id}: {step} failed: {source}; check RBAC (jobs: delete, create, patch; pods: deletecollection; configmaps: patch)")]
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
    /// 1 while this replica leads, else 0.
    pub leader: Gauge,
    /// Saved plans refused because they were not the recorded ones.
    pub plans_refused: Counter,
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
            "leader",
            "1 while this replica leads remediation",
            m.leader.clone(),
        );
        r.register(
            "plans_refused",
            "Saved remediation plans refused because they were not the recorded ones",
            m.plans_refused.clone(),
        );
        Arc::new(m)
    }

    /// Metrics registered nowhere (tests).
    pub fn unregistered() -> Arc<Self> {
        Arc::new(Metrics::default())
    }
}

/// Checks that the RemediationPolicy CRD is served and listable in
/// `namespace` (empty: all): the start check of [`run`], for callers that
/// report readiness once it passed.
pub async fn check(client: &Client, namespace: &str) -> Result<()> {
    controller::check_crd(client, namespace).await
}

/// Runs the remediation controller until `shutdown`: with leader election,
/// only while this replica leads (stopping when it loses the lease and
/// starting again when it wins it back). `namespace` is the watched one
/// (empty: all).
pub async fn run(
    client: Client,
    namespace: String,
    opts: Options,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    use futures::FutureExt;
    if !opts.enabled {
        tracing::info!("remediation disabled (--remediation=false)");
        return Ok(());
    }
    check(&client, &namespace).await?;
    let plan_ns = opts.plan_namespace(&namespace);
    let shutdown = shutdown.boxed().shared();
    if !opts.leader_elect {
        let keys = opts.admission.clone();
        return run_controller(client, &namespace, &plan_ns, keys, metrics, shutdown).await;
    }
    let identity = opts
        .leader_identity
        .clone()
        .unwrap_or_else(crate::operator::leader::default_identity);
    let lease_ns = opts.lease_namespace(&namespace);
    tracing::info!(lease = %format!("{lease_ns}/{}", opts.lease_name), %identity, "campaigning for remediation leadership");
    // The operator's Lease elector, on a Lease of our own: two electors in one
    // process must not compete for one Lease. Losing leadership does not end
    // the process: remediation stops and campaigns again. The controller is
    // told to stop at the renew deadline and finishes its step; only a step
    // stuck past the point where another replica may take over (a request to
    // a hung API server) is dropped, as a crash would drop it: every step of
    // the protocol is idempotent and resumed from the Pending record.
    let elector = crate::operator::Elector::new(
        client.clone(),
        &lease_ns,
        &opts.lease_name,
        &identity,
        std::time::Duration::from_secs(15),
    );
    let leader = metrics.leader.clone();
    crate::operator::leader::lead(elector, shutdown, leader, move |stop| {
        let (client, ns, plan_ns) = (client.clone(), namespace.clone(), plan_ns.clone());
        let (metrics, keys) = (metrics.clone(), opts.admission.clone());
        async move { run_controller(client, &ns, &plan_ns, keys, metrics, stop).await }
    })
    .await
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
        assert!(cli.remediation.enabled && cli.remediation.leader_elect);
        assert_eq!(cli.remediation.lease_name, "memprof-remediation");
        let cli = Cli::parse_from([
            "memprof-operator",
            "--remediation=false",
            "--remediation-leader-elect=false",
            "--remediation-lease-namespace",
            "memprof-system",
        ]);
        assert!(!cli.remediation.enabled && !cli.remediation.leader_elect);
        assert_eq!(cli.remediation.lease_namespace("ml"), "memprof-system");
    }
}
