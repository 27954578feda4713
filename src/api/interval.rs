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

/// Parses `100ms`, `1s`, `1.5s`, `2m`, `1h` (one number, one unit) within
/// [`MIN_INTERVAL`]..=[`MAX_INTERVAL`].
pub fn parse_interval(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("interval {s:?} has no unit: write e.g. `500ms`, `1s` or `2m`"))?;
    let (num, unit) = s.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("interval {s:?} does not start with a number"))?;
    let millis_per_unit = match unit {
        "ms" => 1.0,
        "s" => 1_000.0,
        "m" => 60_000.0,
        "h" => 3_600_000.0,
        _ => return Err(format!("interval {s:?}: unit must be one of ms, s, m, h")),
    };
    let d = Duration::from_millis((value * millis_per_unit).round() as u64);
    if !(MIN_INTERVAL..=MAX_INTERVAL).contains(&d) {
        return Err(format!(
            "interval {s:?} is outside {}ms..{}s",
            MIN_INTERVAL.as_millis(),
            MAX_INTERVAL.as_secs()
        ));
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
        assert!(parse_interval("2m").unwrap_err().contains("10ms..60s"));
        assert!(parse_interval("1").is_err());
        assert!(parse_interval("s").is_err());
        assert!(parse_interval("1d").is_err());
        assert!(parse_interval("1ms").is_err());
        assert!(parse_interval("2h").is_err());
    }
}
