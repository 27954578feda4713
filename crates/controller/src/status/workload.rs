//! A top-level workload's status handed to the writer (JobSet, TrainJob,
//! PyTorchJob): with it, the risk Event and the `memprof.dev/` annotations
//! (`memprof.dev/gpu-oom` among them)
//! a Job's status brings on the Job go on the workload itself, where its
//! team looks (`kubectl describe pytorchjob`), never on its child Jobs or
//! pods; a refused report's `ReportRejected` Event regards the workload's
//! profile, as a Job's regards the Job's (`refusals.rs`). One home for
//! every kind, so each kind's pipeline hands over the same: what differs
//! is only who the workload is.

use super::refusals::announce_refused;
use super::{Analysis, Notice, StatusWriter};
use crate::key::JobKey;
use crate::operator::reconcile::{
    annotations_outdated, gpu_oom_annotation, job_annotations, risk_event, DesiredStatus,
};
use crate::operator::thresholds::invalid_event;
use crate::workload::resolve::Workload;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;
use memprof_api::{MemoryProfile, MemoryProfileStatus, ANNOTATION_GPU_OOM};
use std::collections::BTreeSet;

/// The Events workload `top`'s roll-up `desired` calls for against
/// `previous`, the status of its profile `wkey` before it (`profile` as
/// last known): the risk Event of the change and the `InvalidThresholds`
/// Warning of a newly refused `memprof.dev/thresholds`, regarding the
/// workload, and one `ReportRejected` per report refused for the first time, regarding
/// the profile and related to the report as `report` finds it, as for a
/// Job (`announce_refused`, with `announced` kept under `wkey`).
pub fn workload_notices(
    (wkey, top): (&JobKey, &Workload),
    (profile, previous): (Option<&MemoryProfile>, Option<&MemoryProfileStatus>),
    desired: &DesiredStatus,
    announced: &mut BTreeSet<String>,
    report: impl Fn(&str) -> Option<ObjectReference>,
) -> Vec<Notice> {
    let profile_ref = profile.map_or_else(|| profile_by_name(wkey), object_reference);
    let previous_risk = previous.map(|s| s.risk).unwrap_or_default();
    let risk = risk_event(previous_risk, &desired.status).map(|plan| Notice {
        plan,
        regarding: reference(wkey, top),
        related: Some(profile_ref.clone()),
    });
    // Once per distinct message, against the status before, as a Job's.
    let was = previous.and_then(|s| s.thresholds.as_ref());
    let now = desired.status.thresholds.as_ref();
    let invalid = now.and_then(|t| invalid_event(was, t)).map(|plan| Notice {
        plan,
        regarding: reference(wkey, top),
        related: Some(profile_ref.clone()),
    });
    let refused = announce_refused(&desired.rejected, previous, announced, &profile_ref, report);
    risk.into_iter().chain(invalid).chain(refused).collect()
}

/// Hands `status`, the status of workload `top`'s profile `wkey`, to
/// `writer` with `notices` (`workload_notices`), and the workload's
/// annotations when a value differs from what memprof last put there
/// (counted and spaced as a Job's). A restarted operator knows no earlier
/// values: it writes them once.
pub fn submit_workload(
    writer: &StatusWriter,
    (wkey, top): (&JobKey, &Workload),
    status: MemoryProfileStatus,
    notices: Vec<Notice>,
) {
    annotate_workload(writer, wkey, top, &status);
    writer.submit(wkey, &top.uid, Analysis { status, notices });
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

/// A reference to `obj` for Events: the Recorder de-duplicates by
/// reference, so the version must not split a series.
pub fn object_reference<K: Resource<DynamicType = ()>>(obj: &K) -> ObjectReference {
    ObjectReference {
        resource_version: None,
        ..obj.object_ref(&())
    }
}

/// The profile `wkey` by name, while no copy of it was seen yet (the
/// cache lags the apply that made it): its Events still regard it.
fn profile_by_name(wkey: &JobKey) -> ObjectReference {
    ObjectReference {
        api_version: Some(MemoryProfile::api_version(&()).into()),
        kind: Some(MemoryProfile::kind(&()).into()),
        name: Some(wkey.name.clone()),
        namespace: Some(wkey.namespace.clone()),
        ..Default::default()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::reconcile::{Rejected, REPORT_REJECTED};
    use memprof_api::workload::WorkloadKind;
    use memprof_api::{MemoryProfileSpec, RiskLevel};

    fn jobset() -> (JobKey, Workload) {
        let top = Workload {
            kind: WorkloadKind::JobSet,
            name: "train".into(),
            uid: "js-uid".into(),
        };
        (JobKey::new("ml", "train"), top)
    }

    fn profile() -> MemoryProfile {
        let mut p = MemoryProfile::new("train", MemoryProfileSpec::default());
        p.metadata.namespace = Some("ml".into());
        p.metadata.uid = Some("profile-uid".into());
        p
    }

    /// A critical roll-up with one report of a rank refused.
    fn critical_with_a_refusal() -> DesiredStatus {
        DesiredStatus {
            status: MemoryProfileStatus {
                risk: RiskLevel::Critical,
                ..Default::default()
            },
            rejected: vec![Rejected {
                name: "forged-0".into(),
                why: "pod forged-0 is not the workload's".into(),
            }],
        }
    }

    fn report(name: &str) -> Option<ObjectReference> {
        Some(ObjectReference {
            kind: Some("MemoryReport".into()),
            name: Some(name.into()),
            ..Default::default()
        })
    }

    /// docs/security.md, "Forged reports", per kind: a workload's refused
    /// report gets its one `ReportRejected` Event, about the workload's
    /// profile and naming the report, beside the risk Event about the
    /// workload; the next roll-up announces it no more.
    #[test]
    fn a_workloads_refused_report_is_announced_once_about_its_profile() {
        let (wkey, top) = jobset();
        let (profile, desired) = (profile(), critical_with_a_refusal());
        let mut announced = BTreeSet::new();
        let seen = (Some(&profile), None);
        let first = workload_notices((&wkey, &top), seen, &desired, &mut announced, report);
        let reasons: Vec<_> = first.iter().map(|n| n.plan.reason).collect();
        assert_eq!(reasons, ["RiskCritical", REPORT_REJECTED]);
        assert_eq!(first[0].regarding.kind.as_deref(), Some("JobSet"));
        let refusal = &first[1];
        assert_eq!(refusal.regarding, object_reference(&profile));
        assert_eq!(refusal.related, report("forged-0"));
        assert!(
            refusal.plan.note.contains("forged-0"),
            "{}",
            refusal.plan.note
        );
        let seen = (Some(&profile), Some(&desired.status));
        let next = workload_notices((&wkey, &top), seen, &desired, &mut announced, report);
        assert!(next.is_empty(), "{next:?}");
    }

    /// A workload's refused `memprof.dev/thresholds` is announced as a
    /// Job's: one Warning `InvalidThresholds`, regarding the workload,
    /// again only when the message changes.
    #[test]
    fn a_workloads_refused_thresholds_are_announced_once_on_it() {
        use memprof_api::thresholds::resolve;
        let (wkey, top) = jobset();
        let profile = profile();
        let refused = resolve(&Default::default(), Some(r#"{"highTtoSeconds": 5}"#));
        let desired = DesiredStatus {
            status: MemoryProfileStatus {
                thresholds: Some(refused.status()),
                ..Default::default()
            },
            rejected: Vec::new(),
        };
        let mut announced = BTreeSet::new();
        let seen = (Some(&profile), None);
        let first = workload_notices((&wkey, &top), seen, &desired, &mut announced, report);
        assert_eq!(first.len(), 1, "{first:?}");
        let ev = &first[0];
        assert_eq!(
            (ev.plan.reason, ev.plan.warning),
            ("InvalidThresholds", true)
        );
        assert_eq!(ev.regarding.kind.as_deref(), Some("JobSet"));
        assert_eq!(ev.regarding.uid.as_deref(), Some("js-uid"));
        assert_eq!(ev.related, Some(object_reference(&profile)));
        let seen = (Some(&profile), Some(&desired.status));
        let next = workload_notices((&wkey, &top), seen, &desired, &mut announced, report);
        assert!(next.is_empty(), "announced once: {next:?}");
    }

    /// Before any copy of a new profile is seen, its refusals still regard
    /// it, by name.
    #[test]
    fn a_refusal_before_the_profile_is_seen_regards_it_by_name() {
        let (wkey, top) = jobset();
        let desired = critical_with_a_refusal();
        let mut announced = BTreeSet::new();
        let out = workload_notices(
            (&wkey, &top),
            (None, None),
            &desired,
            &mut announced,
            report,
        );
        let refusal = out
            .iter()
            .find(|n| n.plan.reason == REPORT_REJECTED)
            .unwrap();
        assert_eq!(refusal.regarding.kind.as_deref(), Some("MemoryProfile"));
        assert_eq!(refusal.regarding.name.as_deref(), Some("train"));
        assert_eq!(refusal.regarding.namespace.as_deref(), Some("ml"));
    }
}
