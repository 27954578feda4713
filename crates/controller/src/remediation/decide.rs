//! Pure: which policy, if any, acts on a Job now, and when to look again.

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;
use memprof_api::{MemoryProfileStatus, RemediationPolicy};
use memprof_policy::triggers::{self, Evaluation, RiskClock};
use std::sync::Arc;
use std::time::Duration;

/// A policy that fires and acts on a Job, not yet recorded.
#[derive(Clone, Debug)]
pub struct Decision {
    /// The policy.
    pub policy: Arc<RemediationPolicy>,
    /// The trigger that fired.
    pub fired: Evaluation,
    /// The record's deterministic id (`triggers::record_id`).
    pub id: String,
    /// Remediations of this policy before this one (what the record is decided on).
    pub count: u32,
    /// The Job decided on.
    pub job_uid: String,
}

/// The first policy (by name) that fires and may act on `job` with
/// `status` (its OOMs included) and has not recorded this decision yet,
/// and the delay after which a policy that does not fire yet might.
/// `resync` bounds the delay (cooldowns end and `forSeconds` elapse
/// without any watch event).
pub fn decide(
    policies: &[Arc<RemediationPolicy>],
    job: &Job,
    status: &MemoryProfileStatus,
    clock: &RiskClock,
    now: Timestamp,
    resync: Duration,
) -> (Option<Decision>, Duration) {
    let mut sorted: Vec<&Arc<RemediationPolicy>> = policies.iter().collect();
    sorted.sort_by_key(|p| p.name_any());
    let mut again = resync;
    let job_uid = job.uid().unwrap_or_default();
    for policy in sorted {
        let v = triggers::verdict(policy, job.labels(), Some(&job_uid), status, clock, now);
        if let Some(s) = v.recheck_after() {
            again = again.min(Duration::from_secs_f64(s.clamp(0.1, 3600.0)));
        }
        let Some(fired) = v.fired().filter(|_| v.acts()) else {
            continue;
        };
        let id = triggers::record_id(
            &policy.uid().unwrap_or_default(),
            policy.metadata.generation.unwrap_or_default(),
            &job_uid,
            &fired.name,
            v.history.count,
        );
        // Dry runs and skips are recorded once per decision, not per reconcile.
        if status.remediations.iter().any(|r| r.id == id) {
            continue;
        }
        let decision = Decision {
            policy: policy.clone(),
            fired: fired.clone(),
            id,
            count: v.history.count,
            job_uid,
        };
        return (Some(decision), again);
    }
    (None, again)
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_api::{RemediationRecord, RiskLevel};

    fn job() -> Job {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "train", "namespace": "ml", "uid": "job-1",
                         "labels": {"team": "ml"}},
        }))
        .unwrap()
    }

    fn policy(name: &str) -> Arc<RemediationPolicy> {
        let mut p = RemediationPolicy::test(name, "ml", 60, 1);
        p.metadata.uid = Some(format!("{name}-uid"));
        Arc::new(p)
    }

    #[test]
    fn the_first_firing_policy_by_name_acts_once_per_decision() {
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let status = MemoryProfileStatus {
            risk: RiskLevel::Critical,
            ranks_reporting: 1,
            ..Default::default()
        };
        let mut clock = RiskClock::default();
        clock.observe(
            RiskLevel::Critical,
            now - jiff::SignedDuration::from_secs(120),
        );
        let policies = [policy("zeta"), policy("alpha")];
        let resync = Duration::from_secs(60);
        let (d, _) = decide(&policies, &job(), &status, &clock, now, resync);
        let d = d.expect("a critical Job fires risk>=critical/60s");
        assert_eq!(d.policy.name_any(), "alpha");
        assert_eq!((d.count, d.job_uid.as_str()), (0, "job-1"));
        // Recorded already: not decided again.
        let recorded = MemoryProfileStatus {
            remediations: vec![RemediationRecord {
                id: d.id.clone(),
                policy: "alpha".into(),
                phase: "DryRun".into(),
                ..Default::default()
            }],
            ..status.clone()
        };
        let (again, _) = decide(&policies[1..], &job(), &recorded, &clock, now, resync);
        assert!(again.is_none());
        // Not critical for long enough: nothing yet, look again when it would be.
        let mut fresh = RiskClock::default();
        fresh.observe(
            RiskLevel::Critical,
            now - jiff::SignedDuration::from_secs(50),
        );
        let (none, recheck) = decide(&policies, &job(), &status, &fresh, now, resync);
        assert!(none.is_none());
        assert_eq!(recheck, Duration::from_secs(10));
    }
}
