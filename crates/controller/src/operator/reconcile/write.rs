//! Whether a desired profile status is worth a write now: the status task
//! asks before every write.
//!
//! Why: every report moved `lastReportTime`, so every report asked for a
//! status write (up to 800/s for 200 Jobs × 16 ranks, against the 50–80/s
//! that got through). Some fields only move with time or wobble with every
//! sample; a user reading `kubectl get`/`memprof top` gains nothing from
//! seeing them a second fresher. Those are **cosmetic**: a change to them
//! alone is written at most every [`COSMETIC_INTERVAL`] (and always rides
//! along with any other write). Every other field is **significant**:
//! written as soon as the writer's spacing allows.
//!
//! Cosmetic: `lastReportTime`, `oldestReportTime`; `currentUsedBytes`,
//! `currentPercent` (they swing with every training step); `confidence`;
//! `peakUsedBytes`/`peakPercent` while the `peak` text is unchanged;
//! `imbalance` moving by less than 0.05; in `topRanks`, each rank's numbers
//! (peak, total, growth, time to OOM, last report time) while its place,
//! location, risk and staleness are unchanged; and the time to OOM while it
//! only ages as predicted (the old value less the time since the last write,
//! within 30 s or 25 %). A time to OOM appearing or going, or a new
//! prediction, is significant.

use memprof_api::MemoryProfileStatus;
use std::time::Duration;

/// How often a change of cosmetic fields alone may be written.
pub const COSMETIC_INTERVAL: Duration = Duration::from_secs(30);
/// An imbalance change below this is cosmetic.
const IMBALANCE_NOISE: f64 = 0.05;

/// Whether to write, and why.
#[derive(Clone, Debug, PartialEq)]
pub enum Why {
    /// Nothing differs: no write.
    Unchanged,
    /// Something a user sees changed (the first such field by its JSON
    /// name, in alphabetical order): write now.
    Changed(String),
    /// Only cosmetic fields moved, and the last write is at least
    /// [`COSMETIC_INTERVAL`] old (or unknown): write.
    Refresh,
    /// Only cosmetic fields moved: write after this long, unless something
    /// significant comes first.
    NotYet(Duration),
}

impl Why {
    /// Whether the status should be written now.
    pub fn write(&self) -> bool {
        matches!(self, Why::Changed(_) | Why::Refresh)
    }
}

/// Whether `desired` is worth writing over `previous` (the last status
/// written), `since_last_write` after that write (`None`: not known, e.g.
/// after a restart). Pure; O(status size), which is bounded.
pub fn status_write_needed(
    previous: &MemoryProfileStatus,
    desired: &MemoryProfileStatus,
    since_last_write: Option<Duration>,
) -> Why {
    if previous == desired {
        return Why::Unchanged;
    }
    if let Some(field) = new_prediction(previous, desired, since_last_write)
        .or_else(|| imbalance_moved(previous, desired))
    {
        return Why::Changed(field.into());
    }
    let (a, b) = (significant(previous), significant(desired));
    if a != b {
        return Why::Changed(first_difference(&a, &b));
    }
    match since_last_write {
        Some(since) if since < COSMETIC_INTERVAL => Why::NotYet(COSMETIC_INTERVAL - since),
        _ => Why::Refresh,
    }
}

/// A time to OOM that differs from the old one aged by the time since the
/// last write by more than 30 s and 25 %: a new prediction, not time passing.
fn new_prediction(
    previous: &MemoryProfileStatus,
    desired: &MemoryProfileStatus,
    since: Option<Duration>,
) -> Option<&'static str> {
    let (old, new) = (previous.time_to_oom_seconds?, desired.time_to_oom_seconds?);
    let expected = (old - since?.as_secs_f64()).max(0.0);
    let tolerance = (0.25 * old).max(30.0);
    ((new - expected).abs() > tolerance).then_some("timeToOomSeconds")
}

/// An imbalance that appeared, went, or moved by [`IMBALANCE_NOISE`] or
/// more since the last write (drift adds up; a wobble does not).
fn imbalance_moved(
    previous: &MemoryProfileStatus,
    desired: &MemoryProfileStatus,
) -> Option<&'static str> {
    let moved = match (previous.imbalance, desired.imbalance) {
        (Some(a), Some(b)) => (a - b).abs() >= IMBALANCE_NOISE,
        (a, b) => a.is_some() != b.is_some(),
    };
    moved.then_some("imbalance")
}

/// `st` with its cosmetic fields blanked (see the module docs).
fn significant(st: &MemoryProfileStatus) -> MemoryProfileStatus {
    let mut s = st.clone();
    s.last_report_time = None;
    s.oldest_report_time = None;
    s.current_used_bytes = 0;
    s.current_percent = 0.0;
    s.confidence = 0.0;
    s.peak_used_bytes = 0;
    s.peak_percent = 0.0;
    // Presence only: the value ages, and a new prediction is checked apart.
    s.time_to_oom_seconds = s.time_to_oom_seconds.map(|_| 0.0);
    s.time_to_oom = s.time_to_oom.map(|_| String::new());
    // Compared apart, against the noise.
    s.imbalance = None;
    s.imbalance_display = None;
    for r in &mut s.top_ranks {
        r.peak_bytes = 0;
        r.total_bytes = 0;
        r.growth_bytes_per_second = 0.0;
        r.time_to_oom_seconds = r.time_to_oom_seconds.map(|_| 0.0);
        r.last_report_time = None;
    }
    s
}

/// The JSON name of the first top-level field (alphabetically) where `a`
/// and `b` differ.
fn first_difference(a: &MemoryProfileStatus, b: &MemoryProfileStatus) -> String {
    let (serde_json::Value::Object(a), serde_json::Value::Object(b)) = (
        serde_json::to_value(a).unwrap_or_default(),
        serde_json::to_value(b).unwrap_or_default(),
    ) else {
        return "status".into();
    };
    a.keys()
        .chain(b.keys())
        .find(|k| a.get(*k) != b.get(*k))
        .cloned()
        .unwrap_or_else(|| "status".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_api::RiskLevel;

    fn base() -> MemoryProfileStatus {
        MemoryProfileStatus {
            risk: RiskLevel::Medium,
            ranks: "16/16".into(),
            peak: "61.2GiB (76%)".into(),
            imbalance: Some(1.26),
            imbalance_display: Some("1.26".into()),
            time_to_oom_seconds: Some(300.0),
            time_to_oom: Some("5m0s".into()),
            last_report_time: Some("2027-01-15T08:00:00Z".into()),
            ..Default::default()
        }
    }

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn a_newer_report_time_alone_waits_for_the_cosmetic_interval() {
        let mut later = base();
        later.last_report_time = Some("2027-01-15T08:00:01Z".into());
        later.current_used_bytes = 7;
        assert_eq!(
            status_write_needed(&base(), &later, Some(S(10))),
            Why::NotYet(S(20))
        );
        assert_eq!(
            status_write_needed(&base(), &later, Some(S(30))),
            Why::Refresh
        );
        assert_eq!(status_write_needed(&base(), &later, None), Why::Refresh);
        assert_eq!(
            status_write_needed(&base(), &base(), Some(S(99))),
            Why::Unchanged
        );
        assert!(!Why::NotYet(S(1)).write() && Why::Refresh.write());
    }

    #[test]
    fn what_a_user_sees_is_written_at_once_and_named() {
        let changed = |f: fn(&mut MemoryProfileStatus)| {
            let mut d = base();
            f(&mut d);
            status_write_needed(&base(), &d, Some(S(1)))
        };
        assert_eq!(
            changed(|d| d.risk = RiskLevel::High),
            Why::Changed("risk".into())
        );
        assert_eq!(
            changed(|d| d.ranks = "15/16 (1 stale)".into()),
            Why::Changed("ranks".into())
        );
        assert_eq!(
            changed(|d| d.peak = "61.3GiB (76%)".into()),
            Why::Changed("peak".into())
        );
        assert_eq!(
            changed(|d| d.imbalance = Some(1.32)),
            Why::Changed("imbalance".into())
        );
        assert_eq!(
            changed(|d| d.imbalance = None),
            Why::Changed("imbalance".into())
        );
        assert_eq!(
            changed(|d| d.time_to_oom_seconds = None),
            Why::Changed("timeToOomSeconds".into())
        );
        // A wobble of the imbalance, or a time to OOM that only aged: cosmetic.
        assert_eq!(changed(|d| d.imbalance = Some(1.28)), Why::NotYet(S(29)));
        let aged = status_write_needed(
            &base(),
            &MemoryProfileStatus {
                time_to_oom_seconds: Some(290.0),
                time_to_oom: Some("4m50s".into()),
                ..base()
            },
            Some(S(10)),
        );
        assert_eq!(aged, Why::NotYet(S(20)));
        // A new prediction (5m -> 2m in 10 s) is not time passing.
        assert_eq!(
            changed(|d| d.time_to_oom_seconds = Some(120.0)),
            Why::Changed("timeToOomSeconds".into())
        );
    }

    #[test]
    fn reports_every_quarter_second_write_a_job_at_most_every_30_s() {
        // 16 ranks reporting at 4/s for two minutes: only the report time,
        // current use and imbalance noise move.
        let mut written = base();
        let mut last_write = 0u64; // ms
        let mut writes = 0;
        for tick in 1..=480u64 {
            let now = tick * 250;
            let mut d = base();
            d.last_report_time = Some(format!(
                "2027-01-15T08:{:02}:{:02}Z",
                now / 60_000,
                now / 1000 % 60
            ));
            d.current_used_bytes = tick % 7;
            d.imbalance = Some(1.26 + 0.01 * (tick % 3) as f64);
            d.time_to_oom_seconds = Some(300.0 - now as f64 / 1000.0);
            let since = Duration::from_millis(now - last_write);
            if status_write_needed(&written, &d, Some(since)).write() {
                written = d;
                last_write = now;
                writes += 1;
            }
        }
        assert_eq!(writes, 4, "once every 30 s");
    }
}
