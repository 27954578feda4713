//! Whose a profile is when two workloads share a name. A MemoryProfile is
//! named after its workload, and a namespace may hold a Job, a JobSet and a
//! PyTorchJob of the same name, made by different people: a tenant who may
//! create Jobs must not take over, or flap, another team's PyTorchJob
//! profile by making a Job of its name (docs/security.md, "Workloads").
//!
//! The rule: a profile is the workload's whose uid it already names as
//! owner. A second claimant (another kind, or the same kind with another
//! uid) gets no profile, and is told why; the profile is never rewritten
//! for it. A Job's claim on a profile owned by an earlier Job of its name
//! is the Job path's own rule (`operator::reconcile::profile_is_stale`):
//! memprof deletes the earlier Job's profile or, after a remediation that
//! recreated the Job, keeps its history.
//!
//! Whose a profile is must not depend on the order in which the operator
//! sees the objects, on whether it ran when they were made, or on a
//! recreation being under way:
//! - a profile with no owner (memprof deleted its workload to create it
//!   again, orphaning the profile) is still the kind's that made it, as its
//!   `memprof.dev/workload-kind` label says: never a namesake's of another
//!   kind, which would take it, and its history, with it when deleted;
//! - a missing profile is created (never applied: an apply would take over
//!   one a namesake made meanwhile) only by the claimant that
//!   [`comes_first`]: the one created first, as the API server stamped
//!   them, whichever the operator reconciles first.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use memprof_api::workload::{WorkloadKind, LABEL_WORKLOAD_KIND, WORKLOAD_KINDS};
use memprof_api::MemoryProfile;

/// Whose `profile` is, as seen by workload `kind` of uid `uid`.
#[derive(Clone, Debug, PartialEq)]
pub enum Claim {
    /// No profile of this name: the claimant may create it.
    Free,
    /// The profile names the claimant as owner.
    Ours,
    /// The profile is another workload's: leave it alone.
    Theirs(OwnerReference),
}

/// The claim of workload `kind` (uid `uid`) on `profile` (module docs).
/// For a Job, only an owner of another workload kind makes it `Theirs`;
/// Job owners are the Job path's (`profile_is_stale`).
pub fn claim(profile: Option<&MemoryProfile>, kind: WorkloadKind, uid: &str) -> Claim {
    let Some(profile) = profile else {
        return Claim::Free;
    };
    let owners = profile
        .metadata
        .owner_references
        .as_deref()
        .unwrap_or_default();
    if owners.iter().any(|o| o.uid == uid) {
        return Claim::Ours;
    }
    let other = owners.iter().find(|o| {
        let their = WorkloadKind::of(&o.api_version, &o.kind);
        kind != WorkloadKind::Job || their.is_some_and(|k| k != WorkloadKind::Job)
    });
    match other {
        Some(o) => Claim::Theirs(o.clone()),
        None if owners.is_empty() => orphaned(profile, kind),
        // For a Job, only Job owners (its earlier namesakes: the Job path
        // decides).
        None => Claim::Ours,
    }
}

/// The claim of workload `kind` on `profile`, which names no owner: the
/// kind that made it keeps it (a recreation by memprof: the workload it
/// creates again adopts it); a profile of no known kind is anyone's.
fn orphaned(profile: &MemoryProfile, kind: WorkloadKind) -> Claim {
    let made_by = profile.labels().get(LABEL_WORKLOAD_KIND);
    let Some(theirs) = made_by.and_then(|k| WORKLOAD_KINDS.into_iter().find(|w| w.kind() == k))
    else {
        return Claim::Ours;
    };
    if theirs == kind {
        return Claim::Ours;
    }
    // The workload memprof replaces: the newest record's.
    let history = profile.status.as_ref().map(|s| s.remediations.as_slice());
    let uid = history
        .and_then(|h| h.iter().rev().find_map(|r| r.job_uid.clone()))
        .unwrap_or_default();
    Claim::Theirs(OwnerReference {
        api_version: theirs.api_version().into(),
        kind: theirs.kind().into(),
        name: profile.name_any(),
        uid,
        ..Default::default()
    })
}

/// A workload that claims the profile of its name, with when the API
/// server created it.
#[derive(Clone, Debug, PartialEq)]
pub struct Claimant {
    pub kind: WorkloadKind,
    pub uid: String,
    pub created: Option<Timestamp>,
}

impl Claimant {
    /// The order claimants of one name come in: created first (one not
    /// stamped, last); made in the same second, a top-level workload before
    /// a Job (the more the profile is worth to), then by kind and uid, so
    /// that every path answers alike.
    fn order(&self) -> (bool, Option<Timestamp>, bool, &'static str, &str) {
        let job = self.kind == WorkloadKind::Job;
        let created = self.created;
        (created.is_none(), created, job, self.kind.kind(), &self.uid)
    }
}

/// Whether `me` may create the missing profile of its name: no other
/// claimant of the name in `others` comes before it.
pub fn comes_first(me: &Claimant, others: &[Claimant]) -> bool {
    others
        .iter()
        .filter(|o| o.uid != me.uid)
        .all(|o| me.order() < o.order())
}

/// What the claimant is told when the profile is `theirs`.
pub fn taken_message(kind: WorkloadKind, name: &str, theirs: &OwnerReference) -> String {
    format!(
        "no MemoryProfile for {} {name}: MemoryProfile {name} belongs to {} {} (uid {}); \
         rename this {} to profile it",
        kind.kind(),
        theirs.kind,
        theirs.name,
        theirs.uid,
        kind.kind()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_api::MemoryProfileSpec;

    fn owned_by(kind: WorkloadKind, uid: &str) -> MemoryProfile {
        let mut p = MemoryProfile::new("train", MemoryProfileSpec::default());
        p.metadata.owner_references = Some(vec![OwnerReference {
            api_version: kind.api_version().into(),
            kind: kind.kind().into(),
            name: "train".into(),
            uid: uid.into(),
            ..Default::default()
        }]);
        p
    }

    #[test]
    fn the_profile_is_the_workload_s_it_already_names() {
        let pt = owned_by(WorkloadKind::PyTorchJob, "pt-uid");
        assert_eq!(claim(None, WorkloadKind::PyTorchJob, "pt-uid"), Claim::Free);
        assert_eq!(
            claim(Some(&pt), WorkloadKind::PyTorchJob, "pt-uid"),
            Claim::Ours
        );
        // A tenant's Job of the same name: the PyTorchJob's profile is not its.
        assert!(matches!(
            claim(Some(&pt), WorkloadKind::Job, "job-uid"),
            Claim::Theirs(o) if o.kind == "PyTorchJob"
        ));
        // A PyTorchJob made after a Job of its name: the Job's.
        let job = owned_by(WorkloadKind::Job, "job-uid");
        assert!(matches!(
            claim(Some(&job), WorkloadKind::PyTorchJob, "pt-uid"),
            Claim::Theirs(o) if o.kind == "Job"
        ));
        // A later PyTorchJob of the same name (the earlier one's profile
        // not yet collected): not its either.
        assert!(matches!(
            claim(Some(&pt), WorkloadKind::PyTorchJob, "pt-2"),
            Claim::Theirs(_)
        ));
        // A Job's earlier namesake is the Job path's rule, not this one.
        assert_eq!(claim(Some(&job), WorkloadKind::Job, "job-2"), Claim::Ours);
    }

    /// memprof recreating the PyTorchJob: the garbage collector removed
    /// the old owner; the profile is still the PyTorchJob's, never a Job's
    /// of its name, and the other way round.
    #[test]
    fn an_ownerless_profile_stays_the_kind_s_that_made_it() {
        let mut pt = owned_by(WorkloadKind::PyTorchJob, "old");
        pt.metadata.owner_references = None;
        pt.metadata.labels = Some([(LABEL_WORKLOAD_KIND.into(), "PyTorchJob".into())].into());
        assert!(matches!(
            claim(Some(&pt), WorkloadKind::Job, "job-uid"),
            Claim::Theirs(o) if o.kind == "PyTorchJob"
        ));
        assert!(matches!(
            claim(Some(&pt), WorkloadKind::JobSet, "js-uid"),
            Claim::Theirs(o) if o.kind == "PyTorchJob"
        ));
        assert_eq!(
            claim(Some(&pt), WorkloadKind::PyTorchJob, "new"),
            Claim::Ours
        );
        let mut job = pt.clone();
        job.metadata.labels = Some([(LABEL_WORKLOAD_KIND.into(), "Job".into())].into());
        assert!(matches!(
            claim(Some(&job), WorkloadKind::PyTorchJob, "pt"),
            Claim::Theirs(o) if o.kind == "Job"
        ));
        assert_eq!(claim(Some(&job), WorkloadKind::Job, "new"), Claim::Ours);
        // Made by no kind memprof knows: anyone's, as before.
        job.metadata.labels = None;
        assert_eq!(
            claim(Some(&job), WorkloadKind::PyTorchJob, "pt"),
            Claim::Ours
        );
    }

    /// The first created claims a missing profile, whoever asks first;
    /// made in the same second, the top-level workload.
    #[test]
    fn the_first_created_claimant_comes_first() {
        let t = |s: i64| Some(Timestamp::from_second(s).unwrap());
        let c = |kind, uid: &str, created| Claimant {
            kind,
            uid: uid.into(),
            created,
        };
        let job = c(WorkloadKind::Job, "job", t(100));
        let pt = c(WorkloadKind::PyTorchJob, "pt", t(101));
        assert!(comes_first(&job, std::slice::from_ref(&pt)));
        assert!(!comes_first(&pt, std::slice::from_ref(&job)));
        let pt = c(WorkloadKind::PyTorchJob, "pt", t(100));
        assert!(comes_first(&pt, std::slice::from_ref(&job)));
        assert!(!comes_first(&job, std::slice::from_ref(&pt)));
        // Itself among the claimants; no other.
        assert!(comes_first(&job, std::slice::from_ref(&job)));
        assert!(comes_first(&job, &[]));
        // Not stamped: last.
        let unstamped = c(WorkloadKind::JobSet, "js", None);
        assert!(comes_first(&job, std::slice::from_ref(&unstamped)));
        // Two top-level workloads of one second: one answer, either way.
        let js = c(WorkloadKind::JobSet, "js", t(100));
        assert_ne!(
            comes_first(&js, std::slice::from_ref(&pt)),
            comes_first(&pt, std::slice::from_ref(&js))
        );
    }
}
