//! A top-level workload's status handed to the writer (JobSet, TrainJob,
//! PyTorchJob): with it, the risk Event and the `memprof.dev/` annotations
//! (`memprof.dev/gpu-oom` among them)
//! a Job's status brings on the Job go on the workload itself, where its
//! team looks (`kubectl describe pytorchjob`), never on its child Jobs or
//! pods. One home for every kind, so each kind's pipeline hands over the
//! same: what differs is only who the workload is.

use super::{Analysis, Notice, StatusWriter};
use crate::key::JobKey;
use crate::operator::reconcile::{
    annotations_outdated, gpu_oom_annotation, job_annotations, risk_event,
};
use crate::workload::resolve::Workload;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;
use memprof_api::{MemoryProfile, MemoryProfileStatus, ANNOTATION_GPU_OOM};

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
    annotate_workload(writer, wkey, top, &status);
    let analysis = Analysis {
        status,
        notices: notices.into_iter().collect(),
    };
    writer.submit(wkey, analysis);
}

/// Hands workload `top`'s `memprof.dev/` annotations for `status` to
/// `writer` when a value differs from what memprof last put there: the
/// roll-up's (`oom-risk`, …), and `gpu-oom`, the newest GPU OOM the
/// remediation stage recorded for this workload (not one of a workload
/// it replaced), as a Job carries its own. Called with each roll-up and
/// by the remediation stage, which records OOMs after the roll-up handed
/// its status over (a JobSet's roll-up runs in its child Jobs'
/// reconciles, which an OOM's record does not bring about).
pub fn annotate_workload(
    writer: &StatusWriter,
    wkey: &JobKey,
    top: &Workload,
    status: &MemoryProfileStatus,
) {
    let current = writer.annotations(wkey, 0).unwrap_or_default();
    let mut desired = job_annotations(status, &current);
    if let Some(oom) = gpu_oom_annotation(status, &top.uid) {
        desired.insert(ANNOTATION_GPU_OOM.into(), oom);
    }
    if annotations_outdated(&current, &desired) {
        writer.annotate_object(wkey, top.kind, &top.uid, desired);
    }
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
