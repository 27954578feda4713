//! The remediation tasks' context: what recording and carrying out a
//! decision needs (the client, the plans' namespace, the status writer),
//! and the entry points the controller spawns, one task per Job at a time.

use super::{Error, Metrics, Result};
use crate::key::JobKey;
use crate::status::StatusWriter;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::Store;
use kube::{Client, Resource};
use memprof_api::{
    truncate_utf8, MemoryProfile, MemoryProfileStatus, RemediationPolicy, REMEDIATION_MANAGER,
};
use std::collections::{HashMap, HashSet};
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
        }
    }

    /// Jobs of `ns` as untyped objects (a plan's manifest is kept whole).
    pub(super) fn jobs(&self, ns: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), ns, &ApiResource::erase::<Job>(&()))
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
