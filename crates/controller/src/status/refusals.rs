//! The `ReportRejected` Events of a profile: one per report refused for
//! the first time, regarding the profile, related to the report. A Job's
//! roll-up (`pipeline/rollup_stage.rs`) and a workload's (`workload.rs`:
//! JobSet, TrainJob, PyTorchJob) both announce through [`announce_refused`],
//! so docs/security.md's "one `ReportRejected` Event" holds for every kind.
//!
//! Once per name, across reconciles and restarts: a name the stored
//! `ReportsValid` condition lists was announced before a restart
//! ([`rejected_in`]); one in `announced` (kept per profile by the caller)
//! by this process. `announced` then holds exactly the names refused now:
//! bounded by the roll-up's rejected list, and a report counted again and
//! later refused again is announced again. How many refusals may wait
//! beside the profile's risk Event is the writer's (`writer.rs`,
//! `bound_notices`).

use super::Notice;
use crate::operator::reconcile::{newly_rejected, rejected_in, rejection_event, Rejected};
use k8s_openapi::api::core::v1::ObjectReference;
use memprof_api::MemoryProfileStatus;
use std::collections::BTreeSet;
use tracing::warn;

/// The Events for the reports of `rejected` not announced yet (against
/// `previous`, the status before, and `announced`), regarding the profile
/// `regarding`, each related to its report as `report` finds it; leaves
/// in `announced` the names of `rejected`.
pub fn announce_refused(
    rejected: &[Rejected],
    previous: Option<&MemoryProfileStatus>,
    announced: &mut BTreeSet<String>,
    regarding: &ObjectReference,
    report: impl Fn(&str) -> Option<ObjectReference>,
) -> Vec<Notice> {
    let mut known = rejected_in(previous);
    known.extend(announced.iter().cloned());
    let notices = newly_rejected(rejected, &known)
        .into_iter()
        .map(|r| {
            warn!(report = %r.name, why = %r.why, "MemoryReport rejected");
            Notice {
                plan: rejection_event(r),
                regarding: regarding.clone(),
                related: report(&r.name),
            }
        })
        .collect();
    *announced = rejected.iter().map(|r| r.name.clone()).collect();
    notices
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::reconcile::{CONDITION_REPORTS_VALID, REPORT_REJECTED};
    use memprof_api::Condition;

    fn refused(names: &[&str]) -> Vec<Rejected> {
        names
            .iter()
            .map(|n| Rejected {
                name: n.to_string(),
                why: "pod forged-0 is not the Job's".into(),
            })
            .collect()
    }

    fn profile() -> ObjectReference {
        ObjectReference {
            kind: Some("MemoryProfile".into()),
            name: Some("train".into()),
            uid: Some("profile-uid".into()),
            ..Default::default()
        }
    }

    fn related(name: &str) -> Option<ObjectReference> {
        Some(ObjectReference {
            kind: Some("MemoryReport".into()),
            name: Some(name.into()),
            ..Default::default()
        })
    }

    fn names(notices: &[Notice]) -> Vec<String> {
        notices
            .iter()
            .map(|n| n.related.as_ref().and_then(|r| r.name.clone()).unwrap())
            .collect()
    }

    /// One Event per newly refused report, about the profile, naming the
    /// report; none again while it stays refused; again once it was
    /// counted and is refused anew; `announced` never outgrows the list.
    #[test]
    fn each_refused_report_is_announced_once_while_it_stays_refused() {
        let mut announced = BTreeSet::new();
        let first = announce_refused(
            &refused(&["a", "b"]),
            None,
            &mut announced,
            &profile(),
            related,
        );
        assert_eq!(names(&first), ["a", "b"]);
        for n in &first {
            assert_eq!((n.plan.reason, n.plan.warning), (REPORT_REJECTED, true));
            assert_eq!(n.regarding, profile());
            assert!(
                n.plan.note.contains("pod forged-0 is not the Job's"),
                "{}",
                n.plan.note
            );
        }
        let again = announce_refused(
            &refused(&["a", "b", "c"]),
            None,
            &mut announced,
            &profile(),
            related,
        );
        assert_eq!(names(&again), ["c"], "a and b are not repeated");
        let counted = announce_refused(&refused(&["c"]), None, &mut announced, &profile(), related);
        assert!(counted.is_empty());
        assert_eq!(announced, BTreeSet::from(["c".to_string()]));
        let anew = announce_refused(
            &refused(&["a", "c"]),
            None,
            &mut announced,
            &profile(),
            related,
        );
        assert_eq!(names(&anew), ["a"], "refused again after it was counted");
    }

    /// A restarted process knows nothing it announced: the names the
    /// stored `ReportsValid` condition lists are not announced again.
    #[test]
    fn a_restart_announces_only_what_the_stored_condition_does_not_name() {
        let message = "2 MemoryReport(s) ignored; fix the sidecar or agent that wrote them: \
                       a (pod a is not the Job's); b (pod b is not the Job's)";
        let previous = MemoryProfileStatus {
            conditions: vec![Condition::new(
                CONDITION_REPORTS_VALID,
                false,
                "InvalidReports",
                message,
            )],
            ..Default::default()
        };
        let mut fresh = BTreeSet::new();
        let rejected = refused(&["a", "b", "c"]);
        let out = announce_refused(&rejected, Some(&previous), &mut fresh, &profile(), related);
        assert_eq!(names(&out), ["c"]);
    }
}
