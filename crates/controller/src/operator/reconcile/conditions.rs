//! The profile's conditions: what a `kubectl describe memoryprofile` reader
//! learns about the reports behind the numbers. Each message names what to
//! do, is bounded, and moves only when what it says changes (no ages, no
//! counts of seconds), so that it never causes a status write by itself.

use super::Rejected;
use memprof_api::{truncate_utf8, Condition, MemoryProfileStatus, StaleRank};
use std::collections::BTreeSet;

/// Condition type: every counted rank reports (none stale), and there is one.
pub const CONDITION_READY: &str = "Ready";
/// Condition type: every report of the job passed validation.
pub const CONDITION_REPORTS_VALID: &str = "ReportsValid";
/// Condition type: every genuine report counted (none superseded by a newer
/// pod of its rank, none beyond what the Job can have).
pub const CONDITION_REPORTS_COUNTED: &str = "ReportsCounted";
/// Condition type: some counted rank's report is stale (True is the problem,
/// as in `MemoryPressure`).
pub const CONDITION_RANKS_STALE: &str = "RanksStale";
/// At most this many rejected reports are named in the `ReportsValid` message.
pub(super) const MAX_NAMED_REJECTIONS: usize = 8;
/// Prefix of the list of rejected reports in the `ReportsValid` message; what
/// follows it is parsed back after a restart (see [`rejected_in`]).
const REJECTED_PREFIX: &str = "fix the sidecar or agent that wrote them: ";

/// `Ready`: False with no counted report, or while a counted rank is stale.
pub(super) fn ready(counted: u32, stale: u32) -> Condition {
    if counted == 0 {
        return Condition::new(
            CONDITION_READY,
            false,
            "NoReports",
            "no valid MemoryReport yet: check that the job's pods run and that the \
             memprof sidecar was injected (kubectl get mrep -l memprof.dev/job=<job>)",
        );
    }
    if stale > 0 {
        return Condition::new(
            CONDITION_READY,
            false,
            "RanksStale",
            format!(
                "{stale} of {counted} ranks stopped reporting: the profile shows their last \
                 numbers (see the RanksStale condition)"
            ),
        );
    }
    Condition::new(
        CONDITION_READY,
        true,
        "Reporting",
        "every counted rank is reporting GPU memory",
    )
}

/// `RanksStale`: which ranks went quiet, bounded.
pub(super) fn ranks_stale(stale: u32, listed: &[StaleRank]) -> Condition {
    if stale == 0 {
        return Condition::new(
            CONDITION_RANKS_STALE,
            false,
            "AllReporting",
            "every counted rank reported within two heartbeats plus 30 s",
        );
    }
    let mut message = format!(
        "{stale} rank(s) sent no report for longer than two heartbeats plus 30 s; their \
         last verdicts still count (a critical one stays critical): "
    );
    let mut named = 0;
    for s in listed {
        let rank = s.rank.map_or_else(|| "-".to_string(), |r| r.to_string());
        let entry = format!(
            "{}rank {rank} (pod {}, last report {}, risk {})",
            if named > 0 { "; " } else { "" },
            s.pod,
            s.last_report_time,
            s.risk
        );
        // Room for the advice below within the 1 KiB a message may have.
        if message.len() + entry.len() > 760 {
            break;
        }
        message.push_str(&entry);
        named += 1;
    }
    if stale as usize > named {
        message.push_str(&format!("; and {} more", stale as usize - named));
    }
    message.push_str(
        ". Check that those pods and their memprof-sidecar containers run \
         (kubectl logs <pod> -c memprof-sidecar); after a rank finished this is expected",
    );
    Condition::new(CONDITION_RANKS_STALE, true, "NoRecentReport", message)
}

/// `ReportsCounted`.
pub(super) fn reports_counted(superseded: usize, over_limit: usize) -> Condition {
    if superseded == 0 && over_limit == 0 {
        return Condition::new(
            CONDITION_REPORTS_COUNTED,
            true,
            "OnePerRank",
            "one report per rank, within what the Job can have",
        );
    }
    Condition::new(
        CONDITION_REPORTS_COUNTED,
        false,
        if over_limit > 0 {
            "OverLimit"
        } else {
            "Superseded"
        },
        format!(
            "{superseded} report(s) of earlier pods of a rank that has a newer pod and \
             {over_limit} beyond twice the Job's parallelism (plus 4) were not counted"
        ),
    )
}

/// `ReportsValid`, naming at most [`MAX_NAMED_REJECTIONS`] rejected reports.
pub(super) fn reports_valid(rejected: &[Rejected]) -> Condition {
    if rejected.is_empty() {
        return Condition::new(
            CONDITION_REPORTS_VALID,
            true,
            "AllValid",
            "every MemoryReport passed validation",
        );
    }
    let mut message = format!(
        "{} MemoryReport(s) ignored; {REJECTED_PREFIX}",
        rejected.len()
    );
    let mut named = 0;
    for r in rejected.iter().take(MAX_NAMED_REJECTIONS) {
        // `;` separates entries; a reason must not fake one.
        let mut why = r.why.replace(';', ",");
        truncate_utf8(&mut why, 96);
        let entry = format!("{}{} ({why})", if named > 0 { "; " } else { "" }, r.name);
        if message.len() + entry.len() > 980 {
            break;
        }
        message.push_str(&entry);
        named += 1;
    }
    if named < rejected.len() {
        message.push_str(&format!("; and {} more", rejected.len() - named));
    }
    Condition::new(CONDITION_REPORTS_VALID, false, "InvalidReports", message)
}

/// Names of the reports a status's `ReportsValid` condition says were
/// rejected: what was already announced with an Event before a restart.
pub fn rejected_in(status: Option<&MemoryProfileStatus>) -> BTreeSet<String> {
    let Some(cond) = status.and_then(|s| {
        s.conditions
            .iter()
            .find(|c| c.type_ == CONDITION_REPORTS_VALID && !c.is_true())
    }) else {
        return BTreeSet::new();
    };
    let Some((_, list)) = cond.message.split_once(REJECTED_PREFIX) else {
        return BTreeSet::new();
    };
    list.split("; ")
        .filter_map(|entry| entry.split_once(" (").map(|(name, _)| name))
        // Object names never contain spaces: "and 3 more" is not a name.
        .filter(|name| !name.is_empty() && !name.contains(char::is_whitespace))
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_api::RiskLevel;

    #[test]
    fn stale_ranks_are_named_bounded_and_ready_says_so() {
        let listed: Vec<_> = (0..8)
            .map(|r| StaleRank {
                rank: Some(r),
                pod: format!("a-rather-long-pod-name-for-rank-{r}-of-a-big-training-job"),
                node: None,
                last_report_time: "2027-01-15T08:00:00.123456789Z".into(),
                risk: RiskLevel::Critical,
            })
            .collect();
        let c = ranks_stale(300, &listed);
        assert!(c.is_true() && c.message.len() <= 1024, "{}", c.message);
        // Not cut short by the 1 KiB bound: the advice is all there.
        assert!(c.message.ends_with("this is expected"), "{}", c.message);
        assert!(c.message.contains("more. Check"), "{}", c.message);
        assert!(c
            .message
            .contains("rank 0 (pod a-rather-long-pod-name-for-rank-0"));
        assert!(c.message.contains("risk critical"));
        assert!(!ranks_stale(0, &[]).is_true());
        let r = ready(4, 1);
        assert_eq!((r.is_true(), r.reason.as_str()), (false, "RanksStale"));
        assert!(ready(4, 0).is_true());
        assert_eq!(ready(0, 0).reason, "NoReports");
    }
}
