//! How the steps of a plan talk to the API server: the field manager they
//! write as, which answers retrying cannot fix, and the failpoints the
//! crash tests kill the operator at between two steps.

use kube::api::PatchParams;
use memprof_api::REMEDIATION_MANAGER;

/// Environment variable naming a failpoint (tests only).
pub const FAILPOINT_ENV: &str = "MEMPROF_FAILPOINT";
/// Failpoint: abort the process right after the old Job's deletion was accepted.
pub const FAILPOINT_AFTER_DELETE: &str = "remediation-after-delete";
/// Failpoint: abort the process right after a workload was suspended to change its environment.
pub const FAILPOINT_AFTER_SUSPEND: &str = "remediation-after-suspend";

/// Dies here when `MEMPROF_FAILPOINT` names this point: the crash tests use
/// it to kill the operator between two steps of the protocol.
pub(super) fn failpoint(name: &str) {
    if std::env::var(FAILPOINT_ENV).is_ok_and(|v| v == name) {
        eprintln!("{FAILPOINT_ENV}={name}: aborting on purpose");
        std::process::abort();
    }
}

/// What the steps write with: a merge patch as `memprof-remediation`.
pub(super) fn merge_params() -> PatchParams {
    PatchParams {
        field_manager: Some(REMEDIATION_MANAGER.into()),
        ..Default::default()
    }
}

/// An API error that retrying cannot fix: the manifest is invalid (400, 422),
/// the operator may not create it (403), or the namespace is gone (404).
pub(super) fn terminal_code(code: u16) -> bool {
    matches!(code, 400 | 403 | 404 | 422)
}
