//! Pure: the status to write from what the server holds and what the
//! roll-up wants, and whether it is worth a write.

pub use crate::operator::reconcile::COSMETIC_INTERVAL;
use crate::operator::reconcile::{status_write_needed, Why};
use memprof_analysis::recommend::settle;
use memprof_api::MemoryProfileStatus;
use std::time::Duration;

/// The status to write: the roll-up's `analysis` with the remediation
/// fields the server holds (only remediation edits change those), or the
/// server's status when there is no new analysis.
pub fn compose(
    server: Option<&MemoryProfileStatus>,
    analysis: Option<&MemoryProfileStatus>,
) -> Option<MemoryProfileStatus> {
    let Some(analysis) = analysis else {
        return server.cloned();
    };
    let mut st = analysis.clone();
    let recorded = server.cloned().unwrap_or_default();
    st.ooms = recorded.ooms;
    st.oom_count = recorded.oom_count;
    st.remediations = recorded.remediations;
    st.remediation_totals = recorded.remediation_totals;
    st.last_action = recorded.last_action;
    // The API server is not ours: a recommendation is written again only
    // when it moves by a rounding step (or newly seen phases change it).
    let fresh = std::mem::take(&mut st.recommendation);
    st.recommendation = settle(&recorded.recommendation, fresh);
    Some(st)
}

/// Whether a status write is due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Nothing differs.
    No,
    /// Something a reader sees differs: write (as spacing allows).
    Now,
    /// Only time moved (`lastReportTime`): write once this much more time passed.
    After(Duration),
}

/// Whether `desired` is worth writing over `server`, `since_last` after
/// this process last wrote the profile (`None`: never). The decision is the
/// roll-up's (`operator::reconcile::status_write_needed`: which fields are
/// cosmetic, how long they wait); this only maps it onto the writer's terms.
pub fn write_needed(
    server: Option<&MemoryProfileStatus>,
    desired: &MemoryProfileStatus,
    since_last: Option<Duration>,
) -> Need {
    let Some(server) = server else {
        return Need::Now;
    };
    match status_write_needed(server, desired, since_last) {
        Why::Unchanged => Need::No,
        Why::Changed(_) | Why::Refresh => Need::Now,
        Why::NotYet(wait) => Need::After(wait),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_api::{OomRecord, RiskLevel};

    #[test]
    fn the_recorded_remediation_fields_survive_any_analysis() {
        let server = MemoryProfileStatus {
            risk: RiskLevel::Low,
            last_action: Some("scaleBatch BATCH_SIZE 32->24".into()),
            ooms: vec![OomRecord {
                pod: "p".into(),
                ..Default::default()
            }],
            oom_count: Some(20),
            ..Default::default()
        };
        let analysis = MemoryProfileStatus {
            risk: RiskLevel::High,
            last_action: None,
            ..Default::default()
        };
        let st = compose(Some(&server), Some(&analysis)).unwrap();
        assert_eq!(st.risk, RiskLevel::High);
        assert_eq!(st.last_action, server.last_action);
        assert_eq!(st.ooms, server.ooms);
        assert_eq!(
            st.oom_count,
            Some(20),
            "the count is the remediation stage's"
        );
        assert_eq!(compose(Some(&server), None), Some(server.clone()));
        assert_eq!(compose(None, None), None);
    }

    /// A recommendation whose request moved within a rounding step is
    /// composed as the server holds it, so nothing is written for it.
    #[test]
    fn a_recommendation_moving_within_a_step_is_not_written() {
        use memprof_analysis::recommend::STEP_BYTES;
        use memprof_api::RoleRecommendation;
        let rec = |request: u64, steps: u64| RoleRecommendation {
            role: "worker".into(),
            request_bytes: Some(request),
            basis: memprof_api::RecommendationBasis {
                ranks_measured: 1,
                steps,
                ..Default::default()
            },
            reason: "r".into(),
            ..Default::default()
        };
        let server = MemoryProfileStatus {
            recommendation: vec![rec(100 * STEP_BYTES, 10)],
            ..Default::default()
        };
        let fell = MemoryProfileStatus {
            recommendation: vec![rec(99 * STEP_BYTES, 500)],
            ..Default::default()
        };
        let st = compose(Some(&server), Some(&fell)).unwrap();
        assert_eq!(st.recommendation, server.recommendation);
        assert_eq!(
            write_needed(Some(&server), &st, Some(Duration::from_secs(60))),
            Need::No
        );
        let rose = MemoryProfileStatus {
            recommendation: vec![rec(101 * STEP_BYTES, 500)],
            ..Default::default()
        };
        let st = compose(Some(&server), Some(&rose)).unwrap();
        assert_eq!(st.recommendation, rose.recommendation);
        assert_eq!(
            write_needed(Some(&server), &st, Some(Duration::from_secs(1))),
            Need::Now
        );
    }

    #[test]
    fn last_report_time_alone_waits_thirty_seconds() {
        let server = MemoryProfileStatus {
            last_report_time: Some("2026-01-01T00:00:00Z".into()),
            ..Default::default()
        };
        let moved = MemoryProfileStatus {
            last_report_time: Some("2026-01-01T00:00:05Z".into()),
            ..Default::default()
        };
        let s = Duration::from_secs;
        assert_eq!(
            write_needed(Some(&server), &moved, Some(s(10))),
            Need::After(s(20))
        );
        assert_eq!(write_needed(Some(&server), &moved, Some(s(30))), Need::Now);
        assert_eq!(
            write_needed(Some(&server), &moved, None),
            Need::Now,
            "never written by this process"
        );
        let risky = MemoryProfileStatus {
            risk: RiskLevel::High,
            ..moved.clone()
        };
        assert_eq!(write_needed(Some(&server), &risky, Some(s(1))), Need::Now);
        assert_eq!(write_needed(Some(&server), &server, Some(s(1))), Need::No);
        assert_eq!(write_needed(None, &server, Some(s(1))), Need::Now);
    }
}
