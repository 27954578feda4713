//! One rule from evidence to a level, and the check every published
//! verdict passes ("levels that hold").
//!
//! A GPU's verdict carries its level, its time to OOM with the confidence
//! in it, and the fraction of memory its level was judged on. The level is
//! a function of those three under the thresholds in force
//! ([`level_of`]): the higher of the level by usage and the level the
//! predicted OOM calls for at its confidence. A published verdict may sit
//! above that only while the hysteresis holds a level the evidence reached
//! within the hold ([`check`]); it never sits below it. So a reading that
//! says `low` never carries a time to OOM of 20 s at confidence 1.0.
//!
//! Each verdict also names what would cause the OOM ([`Cause`]) with its
//! evidence in a few words.

use crate::Assessment;
use memprof_api::thresholds::Thresholds;
use memprof_api::RiskLevel;

// The vocabulary of causes is the API's: the report carries it as is.
pub use memprof_api::{Cause, NamedCause, MAX_EVIDENCE};

/// The level the evidence calls for: the higher of the level by usage
/// (`fraction` of the memory the level is judged against) and the level of
/// the predicted OOM `tto` at its `confidence` (an uncertain prediction may
/// warn, never alarm). The only place a level is derived.
pub fn level_of(tto: Option<f64>, confidence: f64, fraction: f64, th: &Thresholds) -> RiskLevel {
    let confidence = if confidence.is_finite() {
        confidence
    } else {
        0.0
    };
    by_level(fraction, th).max(by_trend(tto, confidence, th))
}

/// The level `a`'s own evidence calls for.
pub fn evidence_level(a: &Assessment, th: &Thresholds) -> RiskLevel {
    if a.risk == RiskLevel::None {
        return RiskLevel::None;
    }
    level_of(a.time_to_oom_seconds, a.confidence, a.level_fraction, th)
}

/// A verdict that contradicts its own evidence.
#[derive(Clone, Debug, PartialEq)]
pub struct Contradiction(pub String);

impl std::fmt::Display for Contradiction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The invariant of a published verdict: its level is never below what its
/// time to OOM, confidence and usage call for ([`level_of`]), and above it
/// only while `held` (the hysteresis keeps a level reached within the hold).
/// A verdict without data (`none`) carries no time to OOM.
pub fn check(a: &Assessment, th: &Thresholds, held: bool) -> Result<(), Contradiction> {
    let says = |why: &str| {
        Contradiction(format!(
            "{why}: risk {:?}, time to OOM {:?}, confidence {:.2}, usage {:.3}",
            a.risk, a.time_to_oom_seconds, a.confidence, a.level_fraction
        ))
    };
    if a.risk == RiskLevel::None {
        return match a.time_to_oom_seconds {
            None => Ok(()),
            Some(_) => Err(says("no data, yet a time to OOM")),
        };
    }
    if !(0.0..=1.0).contains(&a.confidence) {
        return Err(says("confidence outside 0..1"));
    }
    let due = evidence_level(a, th);
    if a.risk < due {
        return Err(says(&format!("level below its evidence ({due:?})")));
    }
    if a.risk > due && !held {
        return Err(says(&format!("level above its evidence ({due:?}) unheld")));
    }
    Ok(())
}

/// The level the share of the device in use calls for.
pub(crate) fn by_level(fraction: f64, th: &Thresholds) -> RiskLevel {
    if fraction >= th.critical_fraction {
        RiskLevel::Critical
    } else if fraction >= th.high_fraction {
        RiskLevel::High
    } else if fraction >= th.medium_fraction {
        RiskLevel::Medium
    } else {
        RiskLevel::Low
    }
}

/// The level a predicted OOM calls for, trusted by its confidence: an
/// uncertain trend may warn (medium) but not alarm.
pub(crate) fn by_trend(tto: Option<f64>, confidence: f64, th: &Thresholds) -> RiskLevel {
    match tto {
        Some(tto) if tto <= th.medium_tto_seconds => {
            let raw = if tto <= th.critical_tto_seconds {
                RiskLevel::Critical
            } else if tto <= th.high_tto_seconds {
                RiskLevel::High
            } else {
                RiskLevel::Medium
            };
            if confidence >= th.min_confidence {
                raw
            } else if confidence >= th.min_confidence / 2.0 {
                raw.min(RiskLevel::Medium)
            } else {
                RiskLevel::Low
            }
        }
        _ => RiskLevel::Low,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use RiskLevel::{Critical, High, Low, Medium};

    fn verdict(risk: RiskLevel, tto: Option<f64>, confidence: f64, fraction: f64) -> Assessment {
        Assessment {
            risk,
            time_to_oom_seconds: tto,
            confidence,
            level_fraction: fraction,
            ..Default::default()
        }
    }

    #[test]
    fn the_level_is_the_higher_of_usage_and_a_credible_forecast() {
        let th = Thresholds::default();
        assert_eq!(level_of(None, 1.0, 0.5, &th), Low);
        assert_eq!(level_of(Some(20.0), 1.0, 0.5, &th), Critical);
        assert_eq!(level_of(Some(300.0), 1.0, 0.5, &th), High);
        assert_eq!(level_of(Some(20.0), 0.4, 0.5, &th), Medium, "warns only");
        assert_eq!(level_of(Some(20.0), 0.1, 0.5, &th), Low);
        assert_eq!(level_of(Some(5000.0), 1.0, 0.96, &th), High);
        assert_eq!(level_of(Some(20.0), f64::NAN, 0.5, &th), Low);
    }

    /// What the NVML-only sidecar published: `low` with a time
    /// to OOM of 20 s at confidence 1.0; high with 8 s.
    #[test]
    fn a_level_below_its_evidence_is_a_contradiction_held_or_not() {
        let th = Thresholds::default();
        assert!(check(&verdict(Low, Some(20.0), 1.0, 0.5), &th, false).is_err());
        assert!(check(&verdict(Low, Some(20.0), 1.0, 0.5), &th, true).is_err());
        assert!(check(&verdict(High, Some(8.0), 1.0, 0.5), &th, false).is_err());
        assert!(check(&verdict(Critical, Some(8.0), 1.0, 0.5), &th, false).is_ok());
        assert!(check(&verdict(Low, Some(20.0), 0.1, 0.5), &th, false).is_ok());
        // Above the evidence only while held.
        assert!(check(&verdict(High, None, 1.0, 0.5), &th, false).is_err());
        assert!(check(&verdict(High, None, 1.0, 0.5), &th, true).is_ok());
        assert!(check(&verdict(RiskLevel::None, Some(3.0), 0.0, 0.0), &th, false).is_err());
        assert!(check(&verdict(RiskLevel::None, None, 0.0, 0.0), &th, false).is_ok());
    }

    #[test]
    fn evidence_is_bounded_and_causes_are_named_in_camel_case() {
        let c = NamedCause::new(Cause::GrowingDemand, "é".repeat(300));
        assert!(c.evidence.len() <= MAX_EVIDENCE);
        assert_eq!(c.cause.to_string(), "growingDemand");
        assert_eq!(Cause::Neighbour.as_str(), "neighbour");
    }
}
