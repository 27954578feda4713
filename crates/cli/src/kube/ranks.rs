//! What the ranks' reports say beyond their numbers: how old each is and
//! which are stale (a sidecar that died leaves its last report behind), and
//! whether the numbers were measured at all (`sim` and `trace` reports are
//! not live hardware). The operator's verdict comes first: a status that
//! carries `oldestReportTime`/`staleRanks` is read as is; the reports are
//! judged here, by the operator's own rule, only for a status written before
//! those fields existed or when `--stale-after` asks for another threshold.
//! Pure functions over profiles, reports and a clock.

use jiff::Timestamp;
use memprof_analysis::RollupLimits;
use memprof_api::{DataSource, MemoryProfileStatus, MemoryReport, StaleRank};

/// When a rank counts as stale.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StaleRule {
    /// The operator's rule: older than two of the report's own heartbeats
    /// (`spec.heartbeatSeconds`, 60 s when absent) plus 30 s; the status's
    /// `staleRanks` when it has them.
    #[default]
    Operator,
    /// `--stale-after SECONDS`: older than this, whatever the status says.
    After(u64),
}

impl StaleRule {
    /// The rule `--stale-after` asks for (`None`: the operator's).
    pub fn from_flag(after: Option<std::time::Duration>) -> Self {
        after.map_or(StaleRule::Operator, |d| StaleRule::After(d.as_secs()))
    }

    /// Seconds after its sample that `r` turns stale.
    pub fn limit(self, r: &MemoryReport) -> i64 {
        match self {
            StaleRule::After(s) => i64::try_from(s).unwrap_or(i64::MAX),
            StaleRule::Operator => RollupLimits::default()
                .stale_after(r.spec.heartbeat_seconds)
                .as_secs(),
        }
    }
}

/// Seconds since the report's newest sample (`spec.sampledAt`); `None`
/// when that time does not parse.
pub fn age_seconds(r: &MemoryReport, now: Timestamp) -> Option<i64> {
    since(&r.spec.sampled_at, now)
}

/// Seconds from the RFC 3339 time `at` to `now` (never negative: clocks
/// between nodes disagree by a little).
fn since(at: &str, now: Timestamp) -> Option<i64> {
    let at: Timestamp = at.parse().ok()?;
    Some((now.as_second() - at.as_second()).max(0))
}

/// Whether the report is stale under `rule`. A report whose time does not
/// parse is stale too: nothing says it is recent.
pub fn is_stale(r: &MemoryReport, now: Timestamp, rule: StaleRule) -> bool {
    age_seconds(r, now).is_none_or(|a| a > rule.limit(r))
}

/// How a rank is named in a line: its rank number, else its pod.
pub fn rank_label(r: &MemoryReport) -> String {
    label(r.spec.rank, &r.spec.pod_name)
}

fn label(rank: Option<u32>, pod: &str) -> String {
    rank.map_or_else(|| pod.to_string(), |n| n.to_string())
}

/// A stale rank as a line names it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Silent {
    /// Rank number, else pod name.
    pub label: String,
    /// Pod name.
    pub pod: String,
    /// Node, when known.
    pub node: Option<String>,
    /// Seconds since its last report, when that time parses.
    pub silent_seconds: Option<i64>,
    /// The risk its last report gave, when the operator said.
    pub risk: Option<String>,
}

/// The age of one Job's ranks: the oldest report's age and the stale ranks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobAge {
    /// Seconds since the least recent rank's last report.
    pub oldest_seconds: Option<i64>,
    /// Stale ranks: the status's order (worst risk first), else report order.
    pub stale: Vec<Silent>,
    /// Stale ranks the status counted but did not list (it lists at most 8).
    pub unlisted: u32,
}

impl JobAge {
    /// The stale ranks' labels, comma-separated, with `+N` for the unlisted;
    /// `-` when none.
    pub fn stale_labels(&self) -> String {
        if self.stale.is_empty() && self.unlisted == 0 {
            return "-".into();
        }
        let mut s: Vec<String> = self.stale.iter().map(|x| x.label.clone()).collect();
        if self.unlisted > 0 {
            s.push(format!("+{}", self.unlisted));
        }
        s.join(",")
    }

    /// Whether the pod's rank is among the stale ones.
    pub fn is_stale_pod(&self, pod: &str) -> bool {
        self.stale.iter().any(|s| s.pod == pod)
    }
}

/// The age of a Job's ranks as the operator wrote it in the status, `None`
/// when the status predates `oldestReportTime` (or has no reports).
pub fn from_status(st: &MemoryProfileStatus, now: Timestamp) -> Option<JobAge> {
    let oldest = since(st.oldest_report_time.as_deref()?, now)?;
    let stale = st.stale_ranks.iter().map(|s| silent_of(s, now)).collect();
    Some(JobAge {
        oldest_seconds: Some(oldest),
        stale,
        unlisted: st.ranks_stale.saturating_sub(st.stale_ranks.len() as u32),
    })
}

fn silent_of(s: &StaleRank, now: Timestamp) -> Silent {
    Silent {
        label: label(s.rank, &s.pod),
        pod: s.pod.clone(),
        node: s.node.clone(),
        silent_seconds: since(&s.last_report_time, now),
        risk: Some(s.risk.to_string()),
    }
}

/// The ages of `reports` (one Job's), judged here under `rule`.
pub fn job_age<'a>(
    reports: impl IntoIterator<Item = &'a MemoryReport>,
    now: Timestamp,
    rule: StaleRule,
) -> JobAge {
    let mut out = JobAge::default();
    for r in reports {
        let age = age_seconds(r, now);
        out.oldest_seconds = match (out.oldest_seconds, age) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        if is_stale(r, now, rule) {
            out.stale.push(Silent {
                label: rank_label(r),
                pod: r.spec.pod_name.clone(),
                node: r.spec.node_name.clone(),
                silent_seconds: age,
                risk: None,
            });
        }
    }
    out
}

/// The ages of one Job's ranks: the operator's (from `st`) under its own
/// rule when the status has them, else judged from `reports`.
pub fn job_age_of<'a>(
    st: Option<&MemoryProfileStatus>,
    reports: impl IntoIterator<Item = &'a MemoryReport>,
    now: Timestamp,
    rule: StaleRule,
) -> JobAge {
    let from_operator = match rule {
        StaleRule::Operator => st.and_then(|s| from_status(s, now)),
        StaleRule::After(_) => None,
    };
    from_operator.unwrap_or_else(|| job_age(reports, now, rule))
}

/// Whether `top -o wide` must read the reports to fill AGE and STALE RANKS: a
/// threshold of the user's, or a status without the operator's ages.
pub fn needs_reports(statuses: &[Option<&MemoryProfileStatus>], rule: StaleRule) -> bool {
    rule != StaleRule::Operator
        || statuses
            .iter()
            .any(|s| s.is_some_and(|s| s.oldest_report_time.is_none() && !s.ranks.is_empty()))
}

/// The line a report prints about stale ranks, or `None` when none is.
pub fn stale_line(age: &JobAge) -> Option<String> {
    if age.stale.is_empty() && age.unlisted == 0 {
        return None;
    }
    let mut names: Vec<String> = age.stale.iter().map(describe).collect();
    if age.unlisted > 0 {
        names.push(format!("{} more", age.unlisted));
    }
    Some(format!(
        "  stale ranks: {} (their last numbers still count; is the sidecar running? `kubectl logs POD -c memprof-sidecar`)",
        names.join("; ")
    ))
}

fn describe(s: &Silent) -> String {
    let mut facts = Vec::new();
    if s.label != s.pod {
        facts.push(format!("pod {}", s.pod));
    }
    if let Some(n) = &s.node {
        facts.push(format!("node {n}"));
    }
    if let Some(a) = s.silent_seconds {
        facts.push(format!("silent {}", crate::output::age(a)));
    }
    if let Some(r) = &s.risk {
        facts.push(format!("last risk {r}"));
    }
    let who = if s.label == s.pod { "pod" } else { "rank" };
    match facts.is_empty() {
        true => format!("{who} {}", s.label),
        false => format!("{who} {} ({})", s.label, facts.join(", ")),
    }
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
    use memprof_api::{GpuReport, MemoryReportSpec, RiskLevel};

    fn report(rank: Option<u32>, sampled_at: &str, source: DataSource) -> MemoryReport {
        let mut spec = MemoryReportSpec {
            pod_name: format!("train-{}", rank.map_or("x".into(), |r| r.to_string())),
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
    fn the_operators_rule_is_two_of_the_reports_own_heartbeats_plus_30s() {
        // 140 s old: fresh under the default 60 s heartbeat (150 s)...
        let mut r = report(Some(0), "2026-11-22T10:07:40Z", DataSource::Nvml);
        assert!(!is_stale(&r, now(), StaleRule::Operator));
        // ...stale when its sidecar promised to write every 10 s (50 s)...
        r.spec.heartbeat_seconds = Some(10);
        assert!(is_stale(&r, now(), StaleRule::Operator));
        // ...and --stale-after overrides both.
        assert!(!is_stale(&r, now(), StaleRule::After(300)));
        assert_eq!(StaleRule::from_flag(None), StaleRule::Operator);
    }

    #[test]
    fn ranks_judged_from_reports_name_the_silent_one_with_its_pod_and_age() {
        let fresh = report(Some(0), "2026-11-22T10:09:30Z", DataSource::Nvml);
        let mut dead = report(Some(1), "2026-11-22T10:05:00Z", DataSource::Nvml);
        dead.spec.node_name = Some("node-b".into());
        let age = job_age([&fresh, &dead], now(), StaleRule::Operator);
        assert_eq!(age.oldest_seconds, Some(300));
        assert_eq!(age.stale_labels(), "1");
        assert!(age.is_stale_pod("train-1") && !age.is_stale_pod("train-0"));
        assert_eq!(
            stale_line(&age).unwrap(),
            "  stale ranks: rank 1 (pod train-1, node node-b, silent 5m) (their last numbers \
             still count; is the sidecar running? `kubectl logs POD -c memprof-sidecar`)"
        );
        let ok = job_age([&fresh], now(), StaleRule::Operator);
        assert_eq!((ok.oldest_seconds, stale_line(&ok)), (Some(30), None));
        assert_eq!(ok.stale_labels(), "-");
    }

    #[test]
    fn an_unparsable_time_is_stale_and_a_rankless_report_is_named_by_its_pod() {
        let r = report(None, "yesterday", DataSource::Nvml);
        assert_eq!(age_seconds(&r, now()), None);
        let age = job_age([&r], now(), StaleRule::Operator);
        assert_eq!(age.stale_labels(), "train-x");
        assert!(stale_line(&age)
            .unwrap()
            .starts_with("  stale ranks: pod train-x (their last"));
    }

    fn status_with_stale() -> MemoryProfileStatus {
        MemoryProfileStatus {
            ranks: "1/2 (1 stale)".into(),
            ranks_reporting: 1,
            ranks_stale: 9,
            oldest_report_time: Some("2026-11-22T10:00:00Z".into()),
            stale_ranks: vec![StaleRank {
                rank: Some(3),
                pod: "train-3".into(),
                node: Some("node-c".into()),
                last_report_time: "2026-11-22T10:00:00Z".into(),
                risk: RiskLevel::Critical,
            }],
            ..Default::default()
        }
    }

    #[test]
    fn the_operators_status_is_read_as_is_unless_the_user_sets_a_threshold() {
        let st = status_with_stale();
        // The reports say nothing is stale; the operator's verdict wins.
        let fresh = report(Some(0), "2026-11-22T10:09:50Z", DataSource::Nvml);
        let age = job_age_of(Some(&st), [&fresh], now(), StaleRule::Operator);
        assert_eq!(age.oldest_seconds, Some(600));
        assert_eq!(age.stale_labels(), "3,+8");
        let line = stale_line(&age).unwrap();
        assert!(
            line.starts_with(
                "  stale ranks: rank 3 (pod train-3, node node-c, silent 10m, last risk critical); 8 more"
            ),
            "{line}"
        );
        // --stale-after: judged from the reports.
        let mine = job_age_of(Some(&st), [&fresh], now(), StaleRule::After(5));
        assert_eq!(
            (mine.oldest_seconds, mine.stale_labels()),
            (Some(10), "0".into())
        );
    }

    #[test]
    fn reports_are_read_only_for_a_status_without_the_operators_ages() {
        let new = status_with_stale();
        assert!(!needs_reports(&[Some(&new), None], StaleRule::Operator));
        assert!(needs_reports(&[Some(&new)], StaleRule::After(60)));
        let old = MemoryProfileStatus {
            ranks: "2/2".into(),
            ..Default::default()
        };
        assert!(needs_reports(
            &[Some(&new), Some(&old)],
            StaleRule::Operator
        ));
        assert_eq!(from_status(&old, now()), None);
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
