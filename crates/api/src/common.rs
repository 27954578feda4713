use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// OOM risk, ordered from harmless to imminent.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    Deserialize,
    Serialize,
    JsonSchema,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
)]
#[serde(rename_all = "lowercase")]
pub enum RiskLevel {
    /// No data yet, or memory far from the ceiling and not growing.
    #[default]
    None,
    /// Normal training: memory below the warning levels, no trend towards OOM.
    Low,
    /// Worth a look: high usage, or growth that reaches OOM within the medium horizon.
    Medium,
    /// Act soon: OOM predicted within the high horizon, or usage near the ceiling.
    High,
    /// OOM imminent or observed.
    Critical,
}

impl RiskLevel {
    /// Lowercase name, as serialized and as written to annotations.
    pub fn as_str(self) -> &'static str {
        match self {
            RiskLevel::None => "none",
            RiskLevel::Low => "low",
            RiskLevel::Medium => "medium",
            RiskLevel::High => "high",
            RiskLevel::Critical => "critical",
        }
    }
}

impl std::fmt::Display for RiskLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for RiskLevel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "none" => RiskLevel::None,
            "low" => RiskLevel::Low,
            "medium" => RiskLevel::Medium,
            "high" => RiskLevel::High,
            "critical" => RiskLevel::Critical,
            other => {
                return Err(format!(
                    "unknown risk level {other:?}: expected none|low|medium|high|critical"
                ))
            }
        })
    }
}

/// Where a GPU's numbers came from.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DataSource {
    /// Sampled from the driver through NVML (what the GPU really has in use).
    #[default]
    Nvml,
    /// Pushed by the in-process agent from the trainer's allocator.
    Agent,
    /// The simulated backend (demos and tests): not a measurement of hardware.
    Sim,
    /// A recorded trace replayed (`--backend trace`): what some backend
    /// measured earlier, not live.
    Trace,
}

impl std::fmt::Display for DataSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DataSource::Nvml => "nvml",
            DataSource::Agent => "agent",
            DataSource::Sim => "sim",
            DataSource::Trace => "trace",
        })
    }
}

/// A condition, as in Kubernetes API conventions, bounded in size.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// Kind of condition, e.g. `GpuVisible`, `Ready`, `ReportsValid`.
    #[schemars(length(max = 64))]
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    #[schemars(regex(pattern = r"^(True|False|Unknown)$"), length(max = 7))]
    pub status: String,
    /// One CamelCase word saying why.
    #[schemars(length(max = 64))]
    pub reason: String,
    /// A sentence for humans, saying what to do where something is wrong.
    #[schemars(length(max = 1024))]
    pub message: String,
    /// When the condition last changed status (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub last_transition_time: Option<String>,
}

impl Condition {
    /// A condition with the given type, truthiness, reason and message.
    pub fn new(type_: &str, ok: bool, reason: &str, message: impl Into<String>) -> Self {
        let mut message = message.into();
        truncate_utf8(&mut message, 1024);
        Condition {
            type_: type_.to_string(),
            status: if ok { "True" } else { "False" }.to_string(),
            reason: reason.to_string(),
            message,
            last_transition_time: None,
        }
    }

    /// Whether the condition's status is `True`.
    pub fn is_true(&self) -> bool {
        self.status == "True"
    }
}

/// Merges `new` into `conditions`: replaces the condition of the same type,
/// keeping its transition time when the status did not change.
pub fn set_condition(conditions: &mut Vec<Condition>, mut new: Condition, now: &str) {
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        Some(old) => {
            new.last_transition_time = if old.status == new.status {
                old.last_transition_time.clone()
            } else {
                Some(now.to_string())
            };
            *old = new;
        }
        None => {
            new.last_transition_time = Some(now.to_string());
            conditions.push(new);
        }
    }
    conditions.truncate(crate::MAX_CONDITIONS);
}

/// Cuts `s` to at most `max` bytes on a character boundary.
pub fn truncate_utf8(s: &mut String, max: usize) {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
}

/// Formats bytes for humans: `1.5GiB`, `512MiB`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes}B")
    } else if v >= 100.0 {
        format!("{v:.0}{}", UNITS[unit])
    } else {
        format!("{v:.1}{}", UNITS[unit])
    }
}

/// `123`, `80GB`, `80 GiB`, `512MiB`: bytes (decimal and binary units, as
/// users write GPU memory), the inverse of [`format_bytes`] to its precision.
pub fn parse_bytes(s: &str) -> Result<u64, ByteSizeError> {
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| ByteSizeError::NotANumber(s.into()))?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024f64.powi(2),
        "gib" => 1024f64.powi(3),
        "tib" => 1024f64.powi(4),
        u => {
            return Err(ByteSizeError::Unit {
                input: s.into(),
                unit: u.into(),
            })
        }
    };
    Ok((n * mult).round() as u64)
}

/// A byte size that cannot be read; each message shows what to write.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ByteSizeError {
    /// No number first.
    #[error("{0:?}: expected bytes, e.g. 80000000000, 80GB or 40GiB")]
    NotANumber(String),
    /// A unit memprof does not know.
    #[error("{input:?}: unknown unit {unit:?} (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)")]
    Unit {
        /// The whole value.
        input: String,
        /// The unit in it.
        unit: String,
    },
}

/// Formats a rate of memory change in the same binary units as
/// [`format_bytes`]: `+12.3MiB/s`, `-512KiB/s`, `0B/s` (under 1 B/s), `-` when
/// not finite. The one home of rates: every command prints growth with it.
pub fn format_rate(bytes_per_second: f64) -> String {
    if !bytes_per_second.is_finite() {
        return "-".to_string();
    }
    if bytes_per_second.abs() < 1.0 {
        return "0B/s".to_string();
    }
    let sign = if bytes_per_second > 0.0 { "+" } else { "-" };
    format!("{sign}{}/s", format_bytes(bytes_per_second.abs() as u64))
}

/// Unix seconds as an RFC 3339 time (millisecond precision), the way every
/// time in a report or profile is written; empty where out of range.
pub fn rfc3339(unix_seconds: f64) -> String {
    jiff::Timestamp::from_millisecond((unix_seconds * 1000.0) as i64)
        .map(|ts| ts.to_string())
        .unwrap_or_default()
}

/// Formats a duration in seconds for humans, like kubectl's ages: `45s`, `3m20s`, `2h5m`.
pub fn format_duration(seconds: f64) -> String {
    if !seconds.is_finite() || seconds < 0.0 {
        return "-".to_string();
    }
    let s = seconds.round() as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{}s", s / 60, s % 60),
        3600..=86399 => format!("{}h{}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{}h", s / 86400, (s % 86400) / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_take_decimal_and_binary_units() {
        assert_eq!(parse_bytes("123"), Ok(123));
        assert_eq!(parse_bytes("80GB"), Ok(80_000_000_000));
        assert_eq!(parse_bytes("1.5 GiB"), Ok(1_610_612_736));
        assert_eq!(parse_bytes("512MiB"), Ok(512 * 1024 * 1024));
        assert!(parse_bytes("80 parsecs")
            .unwrap_err()
            .to_string()
            .contains("unknown unit"));
        assert!(parse_bytes("GB").is_err());
    }

    #[test]
    fn rates_use_the_binary_units_of_sizes_with_a_sign() {
        assert_eq!(format_rate(100.0 * 1024.0 * 1024.0), "+100MiB/s");
        assert_eq!(format_rate(-1.5 * 1024.0 * 1024.0 * 1024.0), "-1.5GiB/s");
        assert_eq!(format_rate(1e8), "+95.4MiB/s");
        assert_eq!(format_rate(0.4), "0B/s");
        assert_eq!(format_rate(f64::NAN), "-");
    }

    #[test]
    fn risk_levels_order_from_harmless_to_imminent() {
        assert!(RiskLevel::None < RiskLevel::Low);
        assert!(RiskLevel::High < RiskLevel::Critical);
        assert_eq!("high".parse::<RiskLevel>().unwrap(), RiskLevel::High);
        assert!("severe"
            .parse::<RiskLevel>()
            .unwrap_err()
            .contains("expected none|low"));
    }

    #[test]
    fn formats_bytes_and_durations_for_humans() {
        assert_eq!(format_bytes(512), "512B");
        assert_eq!(format_bytes(3 << 29), "1.5GiB");
        assert_eq!(format_bytes(80 << 30), "80.0GiB");
        assert_eq!(format_duration(45.2), "45s");
        assert_eq!(format_duration(200.0), "3m20s");
        assert_eq!(format_duration(7500.0), "2h5m");
        assert_eq!(format_duration(f64::INFINITY), "-");
    }

    #[test]
    fn set_condition_keeps_transition_time_when_status_is_unchanged() {
        let mut cs = vec![];
        set_condition(
            &mut cs,
            Condition::new("GpuVisible", true, "Nvml", "ok"),
            "t1",
        );
        set_condition(
            &mut cs,
            Condition::new("GpuVisible", true, "Nvml", "still ok"),
            "t2",
        );
        assert_eq!(cs[0].last_transition_time.as_deref(), Some("t1"));
        set_condition(
            &mut cs,
            Condition::new("GpuVisible", false, "NoDriver", "gone"),
            "t3",
        );
        assert_eq!(cs[0].last_transition_time.as_deref(), Some("t3"));
        assert_eq!(cs.len(), 1);
    }
}
