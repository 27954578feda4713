//! Sampling intervals as people and the injection write them (`100ms`,
//! `1s`, `1.5s`, `1m`). One parser for every side: the webhook validates the
//! `memprof.dev/interval` annotation and writes `MEMPROF_INTERVAL` with it,
//! the sidecar reads `--interval` with it and the CLI checks `--interval`
//! with it, so what the injection writes is always what the sidecar accepts.

use std::time::Duration;

/// Shortest interval accepted: NVML queries take ~1 ms per GPU, so faster
/// sampling only burns the node's CPU.
pub const MIN_INTERVAL: Duration = Duration::from_millis(10);
/// Longest interval accepted (the MemoryReport's `intervalMs` schema bound).
pub const MAX_INTERVAL: Duration = Duration::from_secs(60);

/// Why an interval cannot be used; each message says what to write instead.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IntervalError {
    /// A bare number.
    #[error("interval {0:?} has no unit: write e.g. `500ms`, `1s` or `2m`")]
    NoUnit(String),
    /// Text before the number.
    #[error("interval {0:?} does not start with a number: write e.g. `500ms`, `1s` or `2m`")]
    NotANumber(String),
    /// A unit that is not ms, s, m or h.
    #[error("interval {0:?}: unit must be one of ms, s, m, h")]
    Unit(String),
    /// Faster or slower than memprof samples.
    #[error("interval {0:?} is outside 10ms..60s")]
    OutOfRange(String),
}

/// Parses `100ms`, `1s`, `1.5s`, `2m`, `1h` within
/// [`MIN_INTERVAL`]..=[`MAX_INTERVAL`], rounded to whole milliseconds.
/// jiff's "friendly" duration format does the parsing (so `1m30s` and
/// `1 sec` read too); the checks before it keep the advice of each error.
pub fn parse_interval(s: &str) -> Result<Duration, IntervalError> {
    let s = s.trim();
    if !s.contains(|c: char| c.is_alphabetic()) {
        return Err(IntervalError::NoUnit(s.into()));
    }
    if !s.starts_with(|c: char| c.is_ascii_digit() || c == '.') {
        return Err(IntervalError::NotANumber(s.into()));
    }
    // jiff wants a digit on both sides of a decimal point; `.5s` and `1.s`
    // have always been accepted here.
    let number_end = s.find(|c: char| !(c.is_ascii_digit() || c == '.'));
    let (number, unit) = s.split_at(number_end.unwrap_or(s.len()));
    let normal = format!("0{}{unit}", number.trim_end_matches('.'));
    let parsed: jiff::SignedDuration = normal.parse().map_err(|_| IntervalError::Unit(s.into()))?;
    let d = Duration::from_millis((parsed.as_secs_f64() * 1_000.0).round() as u64);
    if !(MIN_INTERVAL..=MAX_INTERVAL).contains(&d) {
        return Err(IntervalError::OutOfRange(s.into()));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals() {
        assert_eq!(parse_interval("100ms"), Ok(Duration::from_millis(100)));
        assert_eq!(parse_interval("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_interval("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_interval("1m"), Ok(Duration::from_secs(60)));
        // The sidecar's own bound: a longer interval would stop it at start-up.
        assert!(parse_interval("2m")
            .unwrap_err()
            .to_string()
            .contains("10ms..60s"));
        assert!(parse_interval("1").is_err());
        assert!(parse_interval("s").is_err());
        assert!(parse_interval("1d").is_err());
        assert!(parse_interval("1ms").is_err());
        assert!(parse_interval("2h").is_err());
        // The words of each refusal, as before jiff parsed them.
        assert!(parse_interval("1")
            .unwrap_err()
            .to_string()
            .contains("has no unit"));
        assert!(parse_interval("-1s")
            .unwrap_err()
            .to_string()
            .contains("does not start with a number"));
        assert!(parse_interval("1d")
            .unwrap_err()
            .to_string()
            .contains("ms, s, m, h"));
        assert!(parse_interval("1x")
            .unwrap_err()
            .to_string()
            .contains("ms, s, m, h"));
        assert!(parse_interval("1ms")
            .unwrap_err()
            .to_string()
            .contains("outside 10ms..60s"));
        // Rounded to whole milliseconds, as `MEMPROF_INTERVAL` is written.
        assert_eq!(parse_interval("0.0105s"), Ok(Duration::from_millis(11)));
        assert_eq!(parse_interval(" 250ms "), Ok(Duration::from_millis(250)));
        assert_eq!(parse_interval("0.5m"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_interval("1.s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_interval(".5s"), Ok(Duration::from_millis(500)));
    }
}
