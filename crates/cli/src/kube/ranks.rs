//! What the ranks' reports say beyond their numbers: how old each is (a
//! sidecar that died leaves its last report behind, which still counts in a
//! profile written before the rollup learned about age) and whether the
//! numbers were measured at all (`sim` and `trace` reports are not live
//! hardware). Pure functions over reports and a clock.

use jiff::Timestamp;
use memprof_api::{DataSource, MemoryReport};

/// A report older than this is stale: three of the sidecar's default 60 s
/// heartbeats (`MEMPROF_HEARTBEAT_SECONDS`), so one late write is not enough.
pub const DEFAULT_STALE_AFTER_SECONDS: u64 = 180;

/// Seconds since the report's newest sample (`spec.sampledAt`); `None`
/// when that time does not parse.
pub fn age_seconds(r: &MemoryReport, now: Timestamp) -> Option<i64> {
    let at: Timestamp = r.spec.sampled_at.parse().ok()?;
    Some((now.as_second() - at.as_second()).max(0))
}

/// Whether the report is older than `stale_after` seconds. A report whose
/// time does not parse is stale too: nothing says it is recent.
pub fn is_stale(r: &MemoryReport, now: Timestamp, stale_after: u64) -> bool {
    age_seconds(r, now).is_none_or(|a| a > stale_after as i64)
}

/// How a rank is named in a line: its rank number, else its pod.
pub fn rank_label(r: &MemoryReport) -> String {
    r.spec
        .rank
        .map_or_else(|| r.spec.pod_name.clone(), |n| n.to_string())
}

/// The age of one Job's ranks: the oldest report's age and the stale ranks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobAge {
    /// Seconds since the least recent rank's last report.
    pub oldest_seconds: Option<i64>,
    /// Ranks (or pods) whose last report is stale, in report order.
    pub stale: Vec<String>,
}

/// The ages of `reports` (one Job's).
pub fn job_age<'a>(
    reports: impl IntoIterator<Item = &'a MemoryReport>,
    now: Timestamp,
    stale_after: u64,
) -> JobAge {
    let mut out = JobAge::default();
    for r in reports {
        let age = age_seconds(r, now);
        out.oldest_seconds = match (out.oldest_seconds, age) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        if is_stale(r, now, stale_after) {
            out.stale.push(rank_label(r));
        }
    }
    out
}

/// The line a report prints about stale ranks, or `None` when none is.
pub fn stale_line(age: &JobAge, stale_after: u64) -> Option<String> {
    (!age.stale.is_empty()).then(|| {
        format!(
            "  stale ranks: {} (no report for over {}: is the sidecar running? `kubectl logs POD -c memprof-sidecar`)",
            age.stale.join(", "),
            crate::output::age(stale_after as i64)
        )
    })
}

/// The sources of the reports that are not live measurements, as words:
/// `None` when every report is from NVML or the agent.
pub fn not_measured<'a>(reports: impl IntoIterator<Item = &'a MemoryReport>) -> Option<String> {
    let mut seen: Vec<DataSource> = Vec::new();
    for r in reports {
        let sources =
            std::iter::once(r.spec.summary.source).chain(r.spec.gpus.iter().map(|g| g.source));
        for s in sources {
            if matches!(s, DataSource::Sim | DataSource::Trace) && !seen.contains(&s) {
                seen.push(s);
            }
        }
    }
    if seen.is_empty() {
        return None;
    }
    let words: Vec<&str> = seen
        .iter()
        .map(|s| match s {
            DataSource::Sim => "simulated data, not measured on a GPU",
            _ => "a replayed trace, not live",
        })
        .collect();
    Some(words.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_api::{GpuReport, MemoryReportSpec};

    fn report(rank: Option<u32>, sampled_at: &str, source: DataSource) -> MemoryReport {
        let mut spec = MemoryReportSpec {
            pod_name: "train-x".into(),
            rank,
            sampled_at: sampled_at.into(),
            gpus: vec![GpuReport {
                source,
                ..Default::default()
            }],
            ..Default::default()
        };
        spec.summary.source = source;
        MemoryReport::new("r", spec)
    }

    fn now() -> Timestamp {
        "2026-11-22T10:10:00Z".parse().unwrap()
    }

    #[test]
    fn a_rank_silent_for_more_than_three_heartbeats_is_named_stale() {
        let fresh = report(Some(0), "2026-11-22T10:09:30Z", DataSource::Nvml);
        let dead = report(Some(1), "2026-11-22T10:05:00Z", DataSource::Nvml);
        let age = job_age([&fresh, &dead], now(), DEFAULT_STALE_AFTER_SECONDS);
        assert_eq!(age.oldest_seconds, Some(300));
        assert_eq!(age.stale, ["1"]);
        let line = stale_line(&age, DEFAULT_STALE_AFTER_SECONDS).unwrap();
        assert!(
            line.starts_with("  stale ranks: 1 (no report for over 3m"),
            "{line}"
        );
        let ok = job_age([&fresh], now(), DEFAULT_STALE_AFTER_SECONDS);
        assert_eq!((ok.oldest_seconds, stale_line(&ok, 180)), (Some(30), None));
    }

    #[test]
    fn an_unparsable_time_is_stale_and_a_rankless_report_is_named_by_its_pod() {
        let r = report(None, "yesterday", DataSource::Nvml);
        assert_eq!(age_seconds(&r, now()), None);
        assert_eq!(job_age([&r], now(), 180).stale, ["train-x"]);
    }

    #[test]
    fn sim_and_trace_sources_are_said_and_measured_ones_are_not() {
        let nvml = report(Some(0), "", DataSource::Nvml);
        let agent = report(Some(0), "", DataSource::Agent);
        assert_eq!(not_measured([&nvml, &agent]), None);
        let sim = report(Some(1), "", DataSource::Sim);
        assert_eq!(
            not_measured([&nvml, &sim]).as_deref(),
            Some("simulated data, not measured on a GPU")
        );
        let trace = report(Some(2), "", DataSource::Trace);
        assert_eq!(
            not_measured([&trace, &sim]).as_deref(),
            Some("a replayed trace, not live; simulated data, not measured on a GPU")
        );
    }
}
