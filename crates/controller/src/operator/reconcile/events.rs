//! The Events the roll-up publishes: pure plans, published by the I/O half.
//!
//! Why one reason per risk level and direction: kube-runtime's `Recorder`
//! folds Events with the same (type, action, reason, reporting controller,
//! regarding, related) into one series and keeps the FIRST Event's note
//! (`kube-runtime` 5.0 `events.rs`: `EventKey`, and `publish` clones the
//! cached event), for six minutes. With one `RiskRaised` reason, a Job that
//! went medium → high → critical showed `RiskRaised … risk high (was medium)
//! (x2)`: critical never reached `kubectl describe`. A reason per level and
//! direction gives every level a Job reaches its own Event and its own note.

use memprof_api::{truncate_utf8, GpuLocation, MemoryProfileStatus, RiskLevel};
use std::collections::BTreeSet;

use super::Rejected;

/// The reason of the Event naming a refused report.
pub const REPORT_REJECTED: &str = "ReportRejected";

/// An Event to publish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventPlan {
    /// CamelCase reason: see [`risk_reason`], `ReportRejected`.
    pub reason: &'static str,
    /// Warning rather than Normal.
    pub warning: bool,
    /// The sentence shown by `kubectl describe` (at most 1 KiB).
    pub note: String,
}

/// The reason of the Event for the risk reaching `to` from `from`:
/// `RiskCritical`, `RiskHigh`, `RiskMedium`, `RiskLow` when it rose;
/// `RiskLoweredToHigh`, `…ToMedium`, `…ToLow`, `…ToNone` when it fell.
pub fn risk_reason(from: RiskLevel, to: RiskLevel) -> Option<&'static str> {
    use RiskLevel::{Critical, High, Low, Medium};
    Some(match (to.cmp(&from), to) {
        (std::cmp::Ordering::Equal, _) => return None,
        (std::cmp::Ordering::Greater, Critical) => "RiskCritical",
        (std::cmp::Ordering::Greater, High) => "RiskHigh",
        (std::cmp::Ordering::Greater, Medium) => "RiskMedium",
        (std::cmp::Ordering::Greater, _) => "RiskLow",
        (_, High) => "RiskLoweredToHigh",
        (_, Medium) => "RiskLoweredToMedium",
        (_, Low) => "RiskLoweredToLow",
        _ => "RiskLoweredToNone",
    })
}

/// Where a GPU is, for annotations and events: `rank=3 pod=x node=y gpu=0`.
pub fn format_location(loc: &GpuLocation) -> String {
    let rank = loc.rank.map_or_else(|| "-".to_string(), |r| r.to_string());
    let node = loc.node.as_deref().unwrap_or("-");
    format!(
        "rank={rank} pod={} node={node} gpu={}",
        loc.pod, loc.gpu_index
    )
}

/// The Event for a change of the job's (held) risk level, if it changed.
/// A rise is a Warning from `high` up; a fall is Normal and comes only after
/// the higher level's dwell time (the status's `risk` is already held).
pub fn risk_event(previous: RiskLevel, status: &MemoryProfileStatus) -> Option<EventPlan> {
    let reason = risk_reason(previous, status.risk)?;
    let raised = status.risk > previous;
    let what = if raised {
        format!("GPU OOM risk {} (was {previous})", status.risk)
    } else {
        format!(
            "GPU OOM risk lowered to {} (was {previous}): no counted rank was at {previous} \
             for the dwell time",
            status.risk
        )
    };
    let mut note = format!(
        "{what}; cause {}; time to OOM {}; imbalance {}; bottleneck {}; ranks {}",
        status
            .cause
            .as_ref()
            .map_or_else(|| "-".into(), |c| c.line()),
        status.time_to_oom.as_deref().unwrap_or("-"),
        status.imbalance_display.as_deref().unwrap_or("-"),
        status
            .bottleneck
            .as_ref()
            .map_or_else(|| "-".to_string(), format_location),
        if status.ranks.is_empty() {
            "-"
        } else {
            &status.ranks
        },
    );
    truncate_utf8(&mut note, 1024);
    Some(EventPlan {
        reason,
        warning: raised && status.risk >= RiskLevel::High,
        note,
    })
}

/// The Event for one newly rejected report.
pub fn rejection_event(rejected: &Rejected) -> EventPlan {
    let mut note = format!(
        "MemoryReport {} ignored: {}; fix the sidecar or agent that wrote it",
        rejected.name, rejected.why
    );
    truncate_utf8(&mut note, 1024);
    EventPlan {
        reason: REPORT_REJECTED,
        warning: true,
        note,
    }
}

/// Rejected reports not yet announced with an Event.
pub fn newly_rejected<'a>(
    rejected: &'a [Rejected],
    announced: &BTreeSet<String>,
) -> Vec<&'a Rejected> {
    rejected
        .iter()
        .filter(|r| !announced.contains(&r.name))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use RiskLevel::{Critical, High, Low, Medium};

    fn status(risk: RiskLevel) -> MemoryProfileStatus {
        MemoryProfileStatus {
            risk,
            time_to_oom: Some("1m50s".into()),
            ranks: "3/4 (1 stale)".into(),
            bottleneck: Some(GpuLocation {
                rank: Some(3),
                pod: "train-3".into(),
                node: Some("node-3".into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn every_level_reached_has_its_own_reason_so_the_recorder_never_folds_two() {
        // The path of the issue: medium -> high -> critical, then down again.
        let path = [
            RiskLevel::None,
            Low,
            Medium,
            High,
            Critical,
            High,
            Medium,
            Low,
        ];
        let plans: Vec<_> = path
            .windows(2)
            .map(|w| risk_event(w[0], &status(w[1])).unwrap())
            .collect();
        let reasons: Vec<_> = plans.iter().map(|p| p.reason).collect();
        assert_eq!(
            reasons,
            [
                "RiskLow",
                "RiskMedium",
                "RiskHigh",
                "RiskCritical",
                "RiskLoweredToHigh",
                "RiskLoweredToMedium",
                "RiskLoweredToLow"
            ]
        );
        // The recorder's key (type, action, reason, ...): all distinct.
        let keys: BTreeSet<_> = plans.iter().map(|p| (p.warning, p.reason)).collect();
        assert_eq!(keys.len(), plans.len());
        let critical = &plans[3];
        assert!(critical.warning);
        assert!(critical
            .note
            .starts_with("GPU OOM risk critical (was high)"));
        assert!(critical.note.contains("time to OOM 1m50s"));
        assert!(critical.note.contains("bottleneck rank=3 pod=train-3"));
        assert!(critical.note.contains("ranks 3/4 (1 stale)"));
        let lowered = &plans[4];
        assert!(!lowered.warning);
        assert!(lowered
            .note
            .starts_with("GPU OOM risk lowered to high (was critical)"));
        assert!(critical.note.contains("; cause -;"), "{}", critical.note);
        assert_eq!(risk_event(High, &status(High)), None);
        assert_eq!(
            risk_reason(Critical, RiskLevel::None),
            Some("RiskLoweredToNone")
        );
    }

    #[test]
    fn a_risk_event_names_the_cause_and_its_evidence() {
        let mut st = status(Critical);
        st.cause = Some(memprof_api::NamedCause::new(
            memprof_api::Cause::Neighbour,
            "pid 4242 holds 31 GiB, +400 MiB/s",
        ));
        let plan = risk_event(High, &st).unwrap();
        assert!(
            plan.note
                .contains("; cause neighbour: pid 4242 holds 31 GiB, +400 MiB/s;"),
            "{}",
            plan.note
        );
    }
}
