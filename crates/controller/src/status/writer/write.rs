//! The writes of one pass: the status (composed, decided, applied with the
//! resourceVersion it was composed on) and the Job annotations.

use super::{compose, rv_num, write_needed, Annotations, Edit, Need, Notice, Server, Shared, Work};
use crate::key::JobKey;
use crate::operator::metrics::ReasonLabels;
use crate::status::patch::{self, WriteMode};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use kube::ResourceExt;
use memprof_api::{MemoryProfile, MemoryProfileStatus, OPERATOR_MANAGER};
use std::sync::Arc;
use tokio::time::Instant;
use tracing::{debug, warn};

/// Answers edits with the status now written (or `None`: gone).
fn answer(edits: Vec<Edit>, written: Option<Arc<MemoryProfileStatus>>) {
    for edit in edits {
        let _ = edit.done.send(written.clone());
    }
}

/// The profile is gone: edits are answered `None`, the analysis dropped
/// (the roll-up submits again once it has applied the profile anew).
fn gone(shared: &Shared, key: &JobKey, work: Work) {
    if let Some(e) = shared.entries().get_mut(key) {
        e.server = None;
        e.writing = None;
    }
    answer(work.edits, None);
}

async fn read(shared: &Shared, key: &JobKey) -> kube::Result<Option<Server>> {
    let api: Api<MemoryProfile> = Api::namespaced(shared.client.clone(), &key.namespace);
    Ok(api.get_opt(&key.name).await?.map(|p| Server {
        uid: p.uid().unwrap_or_default(),
        rv: p.resource_version().unwrap_or_default(),
        status: p.status.map(Arc::new),
    }))
}

/// Composes and writes the status of `key`, if it is worth a write. True when written.
pub(super) async fn write_status(shared: &Shared, key: &JobKey, mut work: Work) -> bool {
    let server = match work.server.take() {
        Some(s) => s,
        None => match read(shared, key).await {
            Ok(Some(s)) => s,
            Ok(None) => {
                gone(shared, key, work);
                return false;
            }
            Err(error) => {
                warn!(%key, %error, "cannot read the MemoryProfile before writing its status; retrying");
                let (_, delay) = shared.failed(key);
                shared.put_back(key, work, Some(delay));
                return false;
            }
        },
    };
    let recorded = server.status.clone();
    let Some(mut st) = compose(recorded.as_deref(), work.analysis.as_ref()) else {
        // No status yet and no analysis: there is nothing an edit could change.
        answer(std::mem::take(&mut work.edits), None);
        return false;
    };
    let before = st.clone();
    for edit in &mut work.edits {
        (edit.change)(&mut st);
    }
    let need = if st == before {
        write_needed(recorded.as_deref(), &st, work.since_status)
    } else {
        Need::Now
    };
    match need {
        Need::Now => apply(shared, key, &server, st, work).await,
        Need::No => {
            if let Some(e) = shared.entries().get_mut(key) {
                e.writing = None;
            }
            answer(work.edits, recorded);
            false
        }
        Need::After(delay) => {
            answer(std::mem::take(&mut work.edits), recorded);
            shared.metrics.status_deferred.inc();
            shared.put_back(key, work, Some(delay));
            false
        }
    }
}

async fn apply(
    shared: &Shared,
    key: &JobKey,
    server: &Server,
    st: MemoryProfileStatus,
    work: Work,
) -> bool {
    let api: Api<MemoryProfile> = Api::namespaced(shared.client.clone(), &key.namespace);
    let mode = shared.opts.mode;
    let body = patch::body(mode, &key.name, &server.rv, server.status.as_deref(), &st);
    let (params, patch) = match mode {
        WriteMode::Apply => (
            PatchParams::apply(OPERATOR_MANAGER).force(),
            Patch::Apply(&body),
        ),
        WriteMode::Merge => (
            PatchParams {
                field_manager: Some(OPERATOR_MANAGER.into()),
                ..Default::default()
            },
            Patch::Merge(&body),
        ),
    };
    match api.patch_status(&key.name, &params, &patch).await {
        Ok(written) => {
            written_ok(shared, key, written, work).await;
            true
        }
        Err(kube::Error::Api(s)) if s.is_conflict() => {
            shared.metrics.status_conflicts.inc();
            debug!(%key, "the profile changed since the writer saw it; composing again");
            if let Some(e) = shared.entries().get_mut(key) {
                e.server = None;
            }
            // At once the first time; a Job that keeps conflicting backs off.
            let (n, delay) = shared.failed(key);
            shared.put_back(key, work, (n > 1).then_some(delay));
            false
        }
        Err(kube::Error::Api(s)) if s.is_not_found() => {
            gone(shared, key, work);
            false
        }
        Err(error) => {
            let advice = crate::status::advice(&error, "memoryprofiles/status: patch");
            warn!(%key, %error, "cannot write the MemoryProfile status: {advice}; retrying with backoff");
            let (_, delay) = shared.failed(key);
            shared.put_back(key, work, Some(delay));
            false
        }
    }
}

async fn written_ok(shared: &Shared, key: &JobKey, written: MemoryProfile, work: Work) {
    let status = written.status.clone().map(Arc::new);
    {
        let mut entries = shared.entries();
        let e = entries.entry(key.clone()).or_default();
        e.server = Some(Server {
            uid: written.uid().unwrap_or_default(),
            rv: written.resource_version().unwrap_or_default(),
            status: status.clone(),
        });
        e.writing = None;
        e.last_status_write = Some(Instant::now());
        e.failures = 0;
    }
    shared.metrics.status_writes.inc();
    answer(work.edits, status);
    for notice in &work.notices {
        publish(shared, notice).await;
    }
}

/// Publishes an Event; a failure is logged and counted, never retried: the
/// status that motivated it is written, and a retry loop on Events would
/// be worse than a missing one.
async fn publish(shared: &Shared, notice: &Notice) {
    let plan = &notice.plan;
    let event = Event {
        type_: if plan.warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: plan.reason.into(),
        note: Some(plan.note.clone()),
        action: "Rollup".into(),
        secondary: notice.related.clone(),
    };
    match shared.recorder.publish(&event, &notice.regarding).await {
        Ok(()) => {
            let reason = ReasonLabels {
                reason: plan.reason,
            };
            shared.metrics.events.get_or_create(&reason).inc();
        }
        Err(error) => {
            shared.metrics.event_errors.inc();
            let advice = crate::status::advice(&error, "events.k8s.io events: create, patch");
            warn!(%error, reason = plan.reason, "cannot publish Event: {advice}; not retried");
        }
    }
}

/// Applies the Job's `memprof.dev/*` annotations (field manager
/// `memprof-operator`, so applying fewer keys removes ours and only ours).
/// The Job's uid is a precondition: a recreated Job gets its own.
pub(super) async fn write_annotations(shared: &Shared, key: &JobKey, a: Annotations) -> bool {
    // A Job, or the top-level workload a profile is about (untyped: its
    // fields are not this client's to round-trip).
    let resource = crate::workload::read::api_resource(a.kind);
    let api: Api<DynamicObject> =
        Api::namespaced_with(shared.client.clone(), &key.namespace, &resource);
    let body = serde_json::json!({
        "apiVersion": a.kind.api_version(),
        "kind": a.kind.kind(),
        "metadata": { "name": key.name, "uid": a.job_uid, "annotations": a.values },
    });
    let params = PatchParams::apply(OPERATOR_MANAGER).force();
    match api.patch(&key.name, &params, &Patch::Apply(&body)).await {
        Ok(job) => {
            let rv = rv_num(&job.resource_version().unwrap_or_default());
            if let Some(e) = shared.entries().get_mut(key) {
                e.annotated = Some((rv, a.values));
            }
            shared.metrics.annotation_patches.inc();
            true
        }
        Err(kube::Error::Api(s)) if matches!(s.code, 404 | 409 | 422) => {
            debug!(%key, "the Job is gone or was replaced: its annotations are decided again");
            false
        }
        Err(error) => {
            let advice = crate::status::advice(&error, "jobs: patch");
            warn!(%key, %error, "cannot annotate the Job: {advice}; retrying with backoff");
            let (_, delay) = shared.failed(key);
            let retry = Work {
                server: None,
                analysis: None,
                notices: Vec::new(),
                edits: Vec::new(),
                annotations: Some(a),
                since_status: None,
            };
            shared.put_back(key, retry, Some(delay));
            false
        }
    }
}
