//! Durations as every flag of the CLI takes them: a bare number is seconds
//! (`5`, `0.5`), or a number with a unit (`500ms`, `5s`, `2m`, `1h`, and
//! combinations such as `1m30s`). One parser for every command's
//! `--interval`, `--duration`, `--timeout`, `--stale-after`…, so what one
//! command accepts the others do too. The sidecar and the agent get the
//! result spelled in their own form (see [`millis`]).

use std::time::Duration;

/// What every refusal advises.
const ADVICE: &str = "write seconds (`5`) or a number with a unit (`500ms`, `5s`, `2m`, `1h`)";

/// Why a duration flag cannot be read; each message says what to write.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// Nothing given.
    #[error("no duration given: {ADVICE}")]
    Empty,
    /// A negative or non-finite number of seconds.
    #[error("{0:?} is not a duration of 0 or more seconds: {ADVICE}")]
    NotSeconds(String),
    /// Text before the number.
    #[error("{0:?} does not start with a number: {ADVICE}")]
    NotANumber(String),
    /// A unit jiff does not read.
    #[error("{0:?}: unknown unit, {ADVICE}")]
    Unit(String),
    /// Below zero.
    #[error("{0:?} is negative: {ADVICE}")]
    Negative(String),
    /// A sampling interval outside what the sidecar and the agent take.
    #[error("{0:?} is outside 10ms..60s")]
    Interval(String),
}

/// Parses a duration flag: `5` (seconds), `5s`, `500ms`, `2m`, `1h`, `1.5s`, `1m30s`.
pub fn parse(s: &str) -> Result<Duration, DurationError> {
    let s = s.trim();
    if s.is_empty() {
        return Err(DurationError::Empty);
    }
    if let Ok(seconds) = s.parse::<f64>() {
        return Duration::try_from_secs_f64(seconds)
            .map_err(|_| DurationError::NotSeconds(s.into()));
    }
    if !s.starts_with(|c: char| c.is_ascii_digit() || c == '.') {
        return Err(DurationError::NotANumber(s.into()));
    }
    // jiff wants a digit on both sides of a decimal point: `.5s` and `1.s` read too.
    let number_end = s.find(|c: char| !(c.is_ascii_digit() || c == '.'));
    let (number, unit) = s.split_at(number_end.unwrap_or(s.len()));
    let normal = format!("0{}{unit}", number.trim_end_matches('.'));
    let parsed: jiff::SignedDuration = normal.parse().map_err(|_| DurationError::Unit(s.into()))?;
    Duration::try_from(parsed).map_err(|_| DurationError::Negative(s.into()))
}

/// `d` as whole milliseconds with the unit (`1500ms`): the form the
/// sidecar's `--interval` and the agent's `MEMPROF_AGENT_INTERVAL` read.
pub fn millis(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

/// A sampling interval: [`parse`], then within the sidecar's and the agent's
/// bounds (10ms to 60s), so a bad one is refused before anything starts.
pub fn parse_interval(s: &str) -> Result<Duration, DurationError> {
    use memprof_api::interval::{MAX_INTERVAL, MIN_INTERVAL};
    let d = parse(s)?;
    let d = Duration::from_millis((d.as_secs_f64() * 1_000.0).round() as u64);
    if !(MIN_INTERVAL..=MAX_INTERVAL).contains(&d) {
        return Err(DurationError::Interval(s.trim().into()));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_number_is_seconds_and_units_are_read() {
        let ok = |s: &str| parse(s).unwrap();
        assert_eq!(ok("5"), Duration::from_secs(5));
        assert_eq!(ok("0.5"), Duration::from_millis(500));
        assert_eq!(ok("0"), Duration::ZERO);
        assert_eq!(ok("5s"), Duration::from_secs(5));
        assert_eq!(ok("500ms"), Duration::from_millis(500));
        assert_eq!(ok("2m"), Duration::from_secs(120));
        assert_eq!(ok("1h"), Duration::from_secs(3600));
        assert_eq!(ok("1.5s"), Duration::from_millis(1500));
        assert_eq!(ok(".5s"), Duration::from_millis(500));
        assert_eq!(ok("1m30s"), Duration::from_secs(90));
        assert_eq!(ok(" 2s "), Duration::from_secs(2));
    }

    #[test]
    fn what_is_not_a_duration_says_how_to_write_one() {
        for bad in ["", "s", "5x", "-1", "-1s", "five", "NaN", "inf"] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(e.contains("`500ms`, `5s`, `2m`"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn an_interval_is_bounded_and_spelled_in_milliseconds_for_the_sidecar() {
        assert_eq!(parse_interval("5"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_interval("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_interval("2m")
            .unwrap_err()
            .to_string()
            .contains("10ms..60s"));
        assert!(parse_interval("1ms")
            .unwrap_err()
            .to_string()
            .contains("10ms..60s"));
        assert_eq!(millis(parse_interval("1.5").unwrap()), "1500ms");
        // What the sidecar's own parser reads back is the same interval.
        let d = parse_interval("0.25").unwrap();
        assert_eq!(memprof_api::interval::parse_interval(&millis(d)), Ok(d));
    }
}
