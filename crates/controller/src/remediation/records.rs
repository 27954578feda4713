//! Pure: remediation records as the profile's status holds them.

use crate::workload::action::EnvChange;
use jiff::Timestamp;
use kube::ResourceExt;
use memprof_api::{truncate_utf8, MemoryProfileStatus, RemediationPolicy, RemediationRecord};
use memprof_policy::triggers::{PHASE_DRY_RUN, PHASE_FAILED, PHASE_PENDING, PHASE_SKIPPED};

/// The record `id` of `st` while it is still `Pending`: what every step of
/// a remediation edits (once it is Done, Failed or gone, nothing may).
pub(super) fn pending_mut<'a>(
    st: &'a mut MemoryProfileStatus,
    id: &str,
) -> Option<&'a mut RemediationRecord> {
    st.remediations
        .iter_mut()
        .find(|r| r.id == id && r.phase == PHASE_PENDING)
}

/// A new remediation record.
pub(super) fn new_record(
    id: &str,
    policy: &RemediationPolicy,
    action: &str,
    phase: &str,
    now: Timestamp,
    mut message: String,
) -> RemediationRecord {
    truncate_utf8(&mut message, 512);
    let mut action = action.to_string();
    truncate_utf8(&mut action, 256);
    RemediationRecord {
        id: id.into(),
        policy: policy.name_any(),
        action,
        phase: phase.into(),
        time: now.round(jiff::Unit::Second).unwrap_or(now).to_string(),
        message: Some(message),
        ..Default::default()
    }
}

/// The profile's `lastAction` for a record (at most 128 bytes).
pub(super) fn last_action(r: &RemediationRecord) -> String {
    let mut s = match r.phase.as_str() {
        PHASE_PENDING => format!("{} (pending)", r.action),
        PHASE_DRY_RUN => format!("dry run: {}", r.action),
        PHASE_SKIPPED => format!(
            "skipped: {}",
            r.message
                .as_deref()
                .and_then(|m| m.split(':').next())
                .unwrap_or("")
        ),
        PHASE_FAILED => format!("failed: {}", r.action),
        _ => r.action.clone(),
    };
    truncate_utf8(&mut s, 128);
    s
}

/// Whether a remediation recorded in `status` deletes (or deleted) the
/// workload of uid `uid` to create it again: a Job, or a JobSet, TrainJob
/// or PyTorchJob recreated at the top level. Then no pipeline may make
/// that uid the profile's owner again: it is (about to be) gone, and the
/// garbage collector would delete the profile, and its history, with it.
/// One rule for a Job's path and every workload's. A suspend-patch-resume
/// keeps the workload and its uid: it replaces nothing.
pub fn replaced_by_memprof(status: Option<&MemoryProfileStatus>, uid: &str) -> bool {
    let keeps = Some(EnvChange::SuspendPatchResume.as_str());
    status.is_some_and(|s| {
        s.remediations.iter().any(|r| {
            let pending = r.phase == PHASE_PENDING && r.env_change.as_deref() != keeps;
            r.job_uid.as_deref() == Some(uid) && (pending || r.job_deleted)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workload_memprof_is_replacing_is_not_adopted_again() {
        let record = |phase: &str, deleted: bool, how: Option<EnvChange>| MemoryProfileStatus {
            remediations: vec![RemediationRecord {
                phase: phase.into(),
                job_uid: Some("old".into()),
                job_deleted: deleted,
                env_change: how.map(|h| h.as_str().to_string()),
                ..Default::default()
            }],
            ..Default::default()
        };
        let recreate = Some(EnvChange::Recreate);
        assert!(replaced_by_memprof(
            Some(&record("Pending", false, None)),
            "old"
        ));
        assert!(replaced_by_memprof(
            Some(&record("Pending", false, recreate)),
            "old"
        ));
        assert!(replaced_by_memprof(
            Some(&record("Done", true, recreate)),
            "old"
        ));
        assert!(!replaced_by_memprof(
            Some(&record("Done", true, recreate)),
            "new"
        ));
        assert!(!replaced_by_memprof(
            Some(&record("Skipped", false, None)),
            "old"
        ));
        assert!(!replaced_by_memprof(None, "old"));
        // Suspended, patched and resumed: the same workload, still the owner.
        let kept = Some(EnvChange::SuspendPatchResume);
        assert!(!replaced_by_memprof(
            Some(&record("Pending", false, kept)),
            "old"
        ));
    }

    #[test]
    fn last_action_says_what_happened_in_few_bytes() {
        let policy = RemediationPolicy::test("shrink", "ml", 60, 1);
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let long = "x".repeat(600);
        let r = new_record(
            "id",
            &policy,
            &long,
            PHASE_SKIPPED,
            now,
            format!("NoSuchEnv: {long}"),
        );
        assert_eq!(
            (r.action.len(), r.message.as_ref().unwrap().len()),
            (256, 512)
        );
        assert_eq!(r.time, "2027-01-15T08:00:00Z");
        assert_eq!(last_action(&r), "skipped: NoSuchEnv");
        let pending = RemediationRecord {
            phase: PHASE_PENDING.into(),
            action: "scaleBatch BATCH_SIZE 32->24".into(),
            ..r.clone()
        };
        assert_eq!(
            last_action(&pending),
            "scaleBatch BATCH_SIZE 32->24 (pending)"
        );
        let huge = RemediationRecord {
            phase: PHASE_FAILED.into(),
            ..r
        };
        assert!(last_action(&huge).len() <= 128);
    }
}
