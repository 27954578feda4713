//! A top-level workload's status handed to the writer (JobSet, TrainJob,
//! PyTorchJob): with it, the risk Event and the `memprof.dev/` annotations
//! a Job's status brings on the Job go on the workload itself, where its
//! team looks (`kubectl describe pytorchjob`), never on its child Jobs or
//! pods. One home for every kind, so each kind's pipeline hands over the
//! same: what differs is only who the workload is.

use super::{Analysis, Notice, StatusWriter};
use crate::key::JobKey;
use crate::operator::reconcile::{annotations_outdated, job_annotations, risk_event};
use crate::workload::resolve::Workload;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;
use memprof_api::{MemoryProfile, MemoryProfileStatus};

/// Hands `status`, the status of workload `top`'s profile `wkey`
/// (`profile` as cached, the one before it `previous`), to `writer`, with
/// the risk Event of the change and the workload's annotations when a
/// value differs from what memprof last put there (counted and spaced as a
/// Job's). A restarted operator knows no earlier values: it writes them once.
pub fn submit_workload(
    writer: &StatusWriter,
    wkey: &JobKey,
    top: &Workload,
    (profile, previous): (Option<&MemoryProfile>, Option<&MemoryProfileStatus>),
    status: MemoryProfileStatus,
) {
    let previous_risk = previous.map(|s| s.risk).unwrap_or_default();
    let notices = risk_event(previous_risk, &status).map(|plan| Notice {
        plan,
        regarding: reference(wkey, top),
        related: profile.map(|p| ObjectReference {
            resource_version: None,
            ..p.object_ref(&())
        }),
    });
    let current = writer.annotations(wkey, 0).unwrap_or_default();
    let desired = job_annotations(&status, &current);
    if annotations_outdated(&current, &desired) {
        writer.annotate_object(wkey, top.kind, &top.uid, desired);
    }
    let analysis = Analysis {
        status,
        notices: notices.into_iter().collect(),
    };
    writer.submit(wkey, analysis);
}

/// A reference to the top-level object for Events (by uid).
fn reference(wkey: &JobKey, top: &Workload) -> ObjectReference {
    ObjectReference {
        api_version: Some(top.kind.api_version().into()),
        kind: Some(top.kind.kind().into()),
        name: Some(top.name.clone()),
        namespace: Some(wkey.namespace.clone()),
        uid: Some(top.uid.clone()),
        ..Default::default()
    }
}
