//! The remediation tasks' context: what recording and carrying out a
//! decision needs (the client, the plans' namespace, the status writer),
//! and the entry points the controller spawns, one task per Job at a time.

use super::{Error, Metrics, Result};
use crate::key::JobKey;
use crate::status::StatusWriter;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, DynamicObject};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::Store;
use kube::{Client, Resource};
use memprof_api::workload::WorkloadKind;
use memprof_api::{
    truncate_utf8, MemoryProfile, MemoryProfileStatus, RemediationPolicy, REMEDIATION_MANAGER,
};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;
use tracing::warn;

/// What remediation tasks share.
pub struct Executor {
    pub(super) client: Client,
    /// Where plans are kept: the operator's own namespace, which no tenant can write.
    pub(super) plan_namespace: String,
    /// The one writer of profile statuses: records go through it.
    pub(super) writer: StatusWriter,
    pub(super) policies: Store<RemediationPolicy>,
    pub(super) recorder: Recorder,
    pub(super) metrics: Arc<Metrics>,
    /// Events already published by this process (`id/step`): a retried plan does not repeat them.
    pub(super) published: Mutex<HashSet<String>>,
    /// Reconciles so far that found a remediation's old Job still being deleted (by id).
    pub(super) waits: Mutex<HashMap<String, u32>>,
    /// Failed tasks in a row, by Job.
    pub(super) failures: Mutex<HashMap<JobKey, u32>>,
    /// Wakes the policy status writer after a record was written.
    pub(super) policy_status: Notify,
    /// The pipeline's counted reports (`notifyTrainer`), set once it runs.
    pub(super) counted: std::sync::OnceLock<std::sync::Weak<dyn super::CountedReports>>,
    /// Profiles that are a top-level workload's rather than a Job's, as the
    /// pipeline last read the workload (`set_target`).
    targets: Mutex<HashMap<JobKey, Target>>,
}

/// The top-level workload (JobSet, TrainJob, PyTorchJob) a profile is
/// about, as the pipeline read it from the API server: what a policy's
/// selector matches and how its environment is changed.
#[derive(Clone, Debug)]
pub struct Target {
    /// Its kind.
    pub kind: WorkloadKind,
    /// Its uid.
    pub uid: String,
    /// Its labels (the selector's, and Kueue's queue).
    pub labels: BTreeMap<String, String>,
    /// Its ranks, as its roll-up proves them: the checkpoint wait and
    /// `notifyTrainer` cover exactly these (`ranks.rs`).
    pub ranks: super::Ranks,
    /// When its labels were read.
    pub read: std::time::Instant,
}

impl Executor {
    /// An executor keeping plans in `plan_namespace`, recording through `writer`.
    pub fn new(
        client: Client,
        plan_namespace: &str,
        writer: StatusWriter,
        policies: Store<RemediationPolicy>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let reporter = Reporter {
            controller: REMEDIATION_MANAGER.into(),
            instance: Reporter::from(REMEDIATION_MANAGER).instance,
        };
        Executor {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            plan_namespace: plan_namespace.to_string(),
            writer,
            policies,
            metrics,
            published: Mutex::default(),
            waits: Mutex::default(),
            failures: Mutex::default(),
            policy_status: Notify::new(),
            counted: std::sync::OnceLock::new(),
            targets: Mutex::default(),
        }
    }

    /// Says that profile `key` is workload `target`'s (called by the
    /// pipeline each time it reads the workload).
    pub fn set_target(&self, key: &JobKey, target: Target) {
        let mut targets = self.targets.lock().unwrap_or_else(|e| e.into_inner());
        targets.insert(key.clone(), target);
    }

    /// The workload profile `key` is about, when it is not a Job's.
    pub fn target(&self, key: &JobKey) -> Option<Target> {
        let targets = self.targets.lock().unwrap_or_else(|e| e.into_inner());
        targets.get(key).cloned()
    }

    /// Reads the labels of workload `kind` `key` (uid `uid`) from the API
    /// server and says that profile `key` is its, with `ranks`; returns
    /// when to look again (a task of its own: a reconcile never awaits it).
    pub async fn read_target(
        self: Arc<Self>,
        key: JobKey,
        kind: WorkloadKind,
        uid: String,
        ranks: super::Ranks,
    ) -> Option<std::time::Duration> {
        let got = self.objects(&key.namespace, kind).get_opt(&key.name).await;
        let object = match got {
            Ok(o) => o.filter(|o| o.metadata.uid.as_deref() == Some(uid.as_str()))?,
            Err(error) => {
                let advice = crate::status::advice(&error, "get on the workload");
                warn!(%error, %key, "cannot read the workload's labels: {advice}; retrying");
                return Some(std::time::Duration::from_secs(5));
            }
        };
        let target = Target {
            kind,
            uid,
            labels: object.metadata.labels.unwrap_or_default(),
            ranks,
            read: std::time::Instant::now(),
        };
        self.set_target(&key, target);
        Some(std::time::Duration::ZERO)
    }

    /// Forgets that `key` is a workload's (it is gone).
    pub fn forget_target(&self, key: &JobKey) {
        let mut targets = self.targets.lock().unwrap_or_else(|e| e.into_inner());
        targets.remove(key);
    }

    /// The kind profile `key` is about (a Job unless the pipeline said otherwise).
    pub(super) fn kind_of(&self, key: &JobKey) -> WorkloadKind {
        self.target(key).map_or(WorkloadKind::Job, |t| t.kind)
    }

    /// Objects of `kind` in `ns`, untyped (a plan's manifest is kept whole).
    pub(super) fn objects(&self, ns: &str, kind: WorkloadKind) -> Api<DynamicObject> {
        let resource = crate::workload::read::api_resource(kind);
        Api::namespaced_with(self.client.clone(), ns, &resource)
    }

    /// What an Event about profile `key`'s workload regards: the Job, or
    /// the top-level workload (by uid when known).
    pub(super) fn regarding(&self, key: &JobKey, uid: Option<String>) -> ObjectReference {
        let kind = self.kind_of(key);
        ObjectReference {
            api_version: Some(kind.api_version().into()),
            kind: Some(kind.kind().into()),
            ..job_ref(key, uid)
        }
    }

    /// The RemediationPolicy cache.
    pub fn policies(&self) -> &Store<RemediationPolicy> {
        &self.policies
    }

    /// The Job's status as it stands (what a plan reads `mode: fit` from).
    pub(super) fn view(&self, key: &JobKey) -> Option<MemoryProfileStatus> {
        self.writer.view(key)
    }

    /// Applies `change` to the profile's status of `key` and waits until it is written.
    pub(super) async fn edit<T, F>(
        &self,
        key: &JobKey,
        change: F,
    ) -> Result<Option<(Arc<MemoryProfileStatus>, T)>>
    where
        T: Send + 'static,
        F: FnMut(&mut MemoryProfileStatus) -> Option<T> + Send + 'static,
    {
        self.writer.edit(key, change).await.map_err(Error::Stopped)
    }

    /// Publishes an Event; failures are logged, never retried (the record in
    /// the profile is what counts; an Event is a courtesy).
    pub(super) async fn publish(
        &self,
        type_: EventType,
        reason: &str,
        mut note: String,
        regarding: &ObjectReference,
    ) {
        truncate_utf8(&mut note, 1024);
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: "Remediate".into(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&event, regarding).await {
            let advice = crate::status::advice(&error, "events.k8s.io events: create, patch");
            warn!(%error, reason, "cannot publish Event: {advice}; not retried");
        }
    }
}

/// A reference to a Job for Events (by uid when known).
pub(super) fn job_ref(key: &JobKey, uid: Option<String>) -> ObjectReference {
    ObjectReference {
        api_version: Some("batch/v1".into()),
        kind: Some("Job".into()),
        name: Some(key.name.clone()),
        namespace: Some(key.namespace.clone()),
        uid,
        ..Default::default()
    }
}

/// A reference to the profile of Job `key` for Events (when the Job is gone).
pub(super) fn profile_ref(key: &JobKey) -> ObjectReference {
    ObjectReference {
        api_version: Some(MemoryProfile::api_version(&()).into()),
        kind: Some(MemoryProfile::kind(&()).into()),
        name: Some(key.name.clone()),
        namespace: Some(key.namespace.clone()),
        ..Default::default()
    }
}
