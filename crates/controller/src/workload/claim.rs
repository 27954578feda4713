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

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use memprof_api::workload::WorkloadKind;
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
        // For a Job, only Job owners (its earlier namesakes: the Job path
        // decides); for another kind, a profile with no owner at all.
        None => Claim::Ours,
    }
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
}
