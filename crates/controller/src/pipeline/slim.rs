//! What the caches keep of each object: only what the pipeline reads.

use crate::operator::reconcile::slim_job;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kube::ResourceExt;
use memprof_api::{MemoryProfile, MemoryReport, RemediationPolicy};

/// Pod annotation of indexed Jobs: the pod's completion index (its rank).
const COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";

/// A Job: see [`slim_job`].
pub(super) fn job(j: &mut Job) {
    slim_job(j);
}

/// A profile: its status and identity; nothing else is read.
pub(super) fn profile(p: &mut MemoryProfile) {
    p.managed_fields_mut().clear();
    p.annotations_mut().clear();
}

/// A report: the timelines (most of its bytes at 8 GPUs) are for `kubectl memprof plot`.
pub(super) fn report(r: &mut MemoryReport) {
    r.managed_fields_mut().clear();
    r.annotations_mut().clear();
    for gpu in &mut r.spec.gpus {
        gpu.timeline = Vec::new();
    }
}

/// A pod: its identity and owner (whose reports count), its completion
/// index and memprof's marks, and its containers' terminations (OOM evidence).
pub(super) fn pod(p: &mut Pod) {
    p.managed_fields_mut().clear();
    p.annotations_mut()
        .retain(|k, _| k == COMPLETION_INDEX || k.starts_with("memprof.dev/"));
    p.spec = None;
    let statuses = p.status.take().and_then(|s| s.container_statuses);
    p.status = statuses.map(|c| PodStatus {
        container_statuses: Some(c),
        ..Default::default()
    });
}

/// A policy, whole but for its managedFields (policies are few and small).
pub(super) fn policy(p: &mut RemediationPolicy) {
    p.managed_fields_mut().clear();
}
