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
//!   again, orphaning the profile; or someone deleted it with
//!   `--cascade=orphan`) is still the kind's that made it, as its
//!   `memprof.dev/workload-kind` label says: never a namesake's of another
//!   kind, which would take it, and its history, with it when deleted; and
//!   of that kind it is only the workload's that memprof's own record names
//!   as the one it created in place of the deleted one. Any other namesake
//!   is a stranger: the profile, which describes another run, is deleted
//!   and the namesake gets a fresh one;
//! - a missing profile is created (never applied: an apply would take over
//!   one a namesake made meanwhile) only by the claimant that
//!   [`comes_first`]: the one created first, as the API server stamped
//!   them, whichever the operator reconciles first.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use memprof_api::workload::{WorkloadKind, LABEL_WORKLOAD_KIND, WORKLOAD_KINDS};
use memprof_api::MemoryProfile;
use memprof_policy::triggers::{succession, Succession};

/// Whose `profile` is, as seen by workload `kind` of uid `uid`.
#[derive(Clone, Debug, PartialEq)]
pub enum Claim {
    /// No profile of this name: the claimant may create it.
    Free,
    /// The profile names the claimant as owner.
    Ours,
    /// The profile is another workload's: leave it alone.
    Theirs(OwnerReference),
    /// The profile's workload is gone and memprof is replacing it: leave
    /// the profile alone until memprof's record names the replacement.
    Settling,
    /// The profile's workload is gone, and memprof's records do not name
    /// the claimant as its replacement: the profile describes another run
    /// and must go before the claimant gets its own.
    Stale,
}

/// The claim of workload `me` on `profile` (module docs). For a Job,
/// only an owner of another workload kind makes it `Theirs`; Job owners
/// are the Job path's (`operator::reconcile::earlier_jobs_profile`).
pub fn claim(profile: Option<&MemoryProfile>, me: &Claimant) -> Claim {
    let (kind, uid) = (me.kind, me.uid.as_str());
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
        None if owners.is_empty() => orphaned(profile, me),
        // For a Job, only Job owners (its earlier namesakes: the Job path
        // decides).
        None => Claim::Ours,
    }
}

/// The claim of workload `kind` (uid `uid`) on `profile`, which names no
/// owner (its workload deleted, by memprof to create it again or by
/// someone with `--cascade=orphan`): never a namesake's of another kind
/// than its `memprof.dev/workload-kind` label names; of that kind (or any,
/// unlabelled), the workload memprof's records name as its replacement
/// ([`succeeded`]).
fn orphaned(profile: &MemoryProfile, me: &Claimant) -> Claim {
    let kind = me.kind;
    let made_by = profile.labels().get(LABEL_WORKLOAD_KIND);
    let Some(theirs) = made_by.and_then(|k| WORKLOAD_KINDS.into_iter().find(|w| w.kind() == k))
    else {
        return succeeded(profile, me);
    };
    if theirs == kind {
        return succeeded(profile, me);
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

/// The claim of workload `me` on ownerless `profile` of its kind. One the
/// API server stamped before the profile is the workload it was made for,
/// which the garbage collector is parting from it (deleted with
/// `--cascade=orphan`, or by memprof): it leaves the profile alone (the
/// paths also skip a workload being deleted, which covers one stamped in
/// the profile's second). Of a later one, memprof's records alone decide
/// (`succession`); a label, an annotation or a name is anyone's to write.
fn succeeded(profile: &MemoryProfile, me: &Claimant) -> Claim {
    let made = profile.metadata.creation_timestamp.as_ref().map(|t| t.0);
    if me.created.is_some_and(|c| made.is_some_and(|m| c < m)) {
        return Claim::Settling;
    }
    match succession(profile.status.as_ref(), &[], &me.uid) {
        Succession::Heir => Claim::Ours,
        Succession::Pending => Claim::Settling,
        Succession::Stranger => Claim::Stale,
    }
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

    /// A claimant the API server stamped after every profile here was made.
    fn me(kind: WorkloadKind, uid: &str) -> Claimant {
        Claimant {
            kind,
            uid: uid.into(),
            created: Some(Timestamp::from_second(2_000_000_000).unwrap()),
        }
    }

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
        assert_eq!(
            claim(None, &me(WorkloadKind::PyTorchJob, "pt-uid")),
            Claim::Free
        );
        assert_eq!(
            claim(Some(&pt), &me(WorkloadKind::PyTorchJob, "pt-uid")),
            Claim::Ours
        );
        // A tenant's Job of the same name: the PyTorchJob's profile is not its.
        assert!(matches!(
            claim(Some(&pt), &me(WorkloadKind::Job, "job-uid")),
            Claim::Theirs(o) if o.kind == "PyTorchJob"
        ));
        // A PyTorchJob made after a Job of its name: the Job's.
        let job = owned_by(WorkloadKind::Job, "job-uid");
        assert!(matches!(
            claim(Some(&job), &me(WorkloadKind::PyTorchJob, "pt-uid")),
            Claim::Theirs(o) if o.kind == "Job"
        ));
        // A later PyTorchJob of the same name (the earlier one's profile
        // not yet collected): not its either.
        assert!(matches!(
            claim(Some(&pt), &me(WorkloadKind::PyTorchJob, "pt-2")),
            Claim::Theirs(_)
        ));
        // A Job's earlier namesake is the Job path's rule, not this one.
        assert_eq!(
            claim(Some(&job), &me(WorkloadKind::Job, "job-2")),
            Claim::Ours
        );
    }

    /// memprof recreating the PyTorchJob: the garbage collector removed
    /// the old owner; the profile is still the PyTorchJob's, never a Job's
    /// of its name, and the other way round; of its kind, only the
    /// replacement memprof recorded takes it.
    #[test]
    fn an_ownerless_profile_stays_the_kind_s_that_made_it() {
        let mut pt = owned_by(WorkloadKind::PyTorchJob, "old");
        pt.metadata.owner_references = None;
        pt.metadata.labels = Some([(LABEL_WORKLOAD_KIND.into(), "PyTorchJob".into())].into());
        pt.status = Some(recreated("old", Some("new")));
        assert!(matches!(
            claim(Some(&pt), &me(WorkloadKind::Job, "job-uid")),
            Claim::Theirs(o) if o.kind == "PyTorchJob"
        ));
        assert!(matches!(
            claim(Some(&pt), &me(WorkloadKind::JobSet, "js-uid")),
            Claim::Theirs(o) if o.kind == "PyTorchJob"
        ));
        assert_eq!(
            claim(Some(&pt), &me(WorkloadKind::PyTorchJob, "new")),
            Claim::Ours
        );
        let mut job = pt.clone();
        job.metadata.labels = Some([(LABEL_WORKLOAD_KIND.into(), "Job".into())].into());
        assert!(matches!(
            claim(Some(&job), &me(WorkloadKind::PyTorchJob, "pt")),
            Claim::Theirs(o) if o.kind == "Job"
        ));
        assert_eq!(
            claim(Some(&job), &me(WorkloadKind::Job, "new")),
            Claim::Ours
        );
        // Made by no kind memprof knows: the replacement's too.
        job.metadata.labels = None;
        assert_eq!(
            claim(Some(&job), &me(WorkloadKind::PyTorchJob, "new")),
            Claim::Ours
        );
    }

    /// A namesake of the same kind that memprof did not create (made while
    /// memprof recreated, or after `kubectl delete --cascade=orphan`)
    /// inherits nothing: the profile is stale; while memprof's recreation
    /// is under way, everyone waits.
    #[test]
    fn an_ownerless_profile_is_only_memprof_s_replacement_s() {
        for kind in [
            WorkloadKind::Job,
            WorkloadKind::JobSet,
            WorkloadKind::PyTorchJob,
        ] {
            let mut p = owned_by(kind, "old");
            p.metadata.owner_references = None;
            p.metadata.labels = Some([(LABEL_WORKLOAD_KIND.into(), kind.kind().into())].into());
            // Deleted by its team with --cascade=orphan: no record at all.
            assert_eq!(claim(Some(&p), &me(kind, "new")), Claim::Stale, "{kind:?}");
            // memprof's recreation under way: wait.
            p.status = Some(recreated("old", None));
            assert_eq!(claim(Some(&p), &me(kind, "new")), Claim::Settling);
            assert_eq!(claim(Some(&p), &me(kind, "old")), Claim::Settling);
            // Done: memprof's replacement, and no one else.
            p.status = Some(recreated("old", Some("new")));
            assert_eq!(claim(Some(&p), &me(kind, "new")), Claim::Ours);
            assert_eq!(claim(Some(&p), &me(kind, "squatter")), Claim::Stale);
            // memprof's create lost the name to someone else's: no heir.
            let mut lost = recreated("old", None);
            lost.remediations[0].phase = "Failed".into();
            lost.remediations[0].job_deleted = true;
            p.status = Some(lost);
            assert_eq!(claim(Some(&p), &me(kind, "squatter")), Claim::Stale);
            // The workload the profile was made for, stamped before it,
            // while the garbage collector parts them: left alone, not
            // judged a stranger (which would delete its profile).
            let t = |s: i64| Some(Timestamp::from_second(s).unwrap());
            let stamp = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
            p.metadata.creation_timestamp = t(1_000).map(stamp);
            p.status = None;
            let original = Claimant {
                created: t(999),
                ..me(kind, "old")
            };
            assert_eq!(claim(Some(&p), &original), Claim::Settling);
            // Stamped in the profile's second: a newcomer as much as the
            // original (which the paths skip while it is being deleted).
            let later = Claimant {
                created: t(1_000),
                ..me(kind, "old")
            };
            assert_eq!(claim(Some(&p), &later), Claim::Stale);
        }
    }

    /// A status with one record of memprof recreating workload `old`:
    /// `Done` with its replacement's uid, or `Pending` without one.
    fn recreated(old: &str, new: Option<&str>) -> memprof_api::MemoryProfileStatus {
        let record = memprof_api::RemediationRecord {
            phase: if new.is_some() { "Done" } else { "Pending" }.into(),
            job_uid: Some(old.into()),
            job_deleted: new.is_some(),
            env_change: Some("recreate".into()),
            replacement_uid: new.map(str::to_string),
            ..Default::default()
        };
        memprof_api::MemoryProfileStatus {
            remediations: vec![record],
            ..Default::default()
        }
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
