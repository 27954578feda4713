//! A GPU's published risk level moves only on evidence:
//! it rises at once, and falls only after the lower level has held for a
//! while, so that a one-sample dip of a noisy estimate does not send a
//! `critical → high → critical` pair of Events and pages.
//!
//! Pure: time comes with each reading.

use memprof_api::RiskLevel;

/// How long a lower reading must hold before the published level falls.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Hold {
    /// Seconds the lower readings must span (from the first lower one).
    pub seconds: f64,
    /// Consecutive lower readings needed as well (a sampler that stalled
    /// for a minute has not shown a minute of evidence).
    pub readings: u32,
}

impl Hold {
    /// The hold of the thresholds (`levelHoldSeconds`), with 3 readings.
    pub fn from_thresholds(th: &memprof_api::thresholds::Thresholds) -> Self {
        Hold {
            seconds: th.level_hold_seconds,
            readings: 3,
        }
    }
}

/// The published level of one GPU (or one flag), with the evidence for a fall.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LevelGate {
    level: RiskLevel,
    /// Since when, and for how many readings, every reading was below `level`,
    /// and the highest of them (the level to fall to).
    lower: Option<(f64, u32, RiskLevel)>,
}

impl LevelGate {
    /// The level now published.
    pub fn level(&self) -> RiskLevel {
        self.level
    }

    /// While the published level is above the readings: when it falls if
    /// they stay lower (the first lower reading's time plus the hold).
    pub fn falls_at(&self, hold: Hold) -> Option<f64> {
        self.lower.map(|(since, _, _)| since + hold.seconds)
    }

    /// Takes the raw reading at time `t` and returns the level to publish.
    /// A higher reading is published at once; a lower one only once lower
    /// readings have held for `hold` (then the highest of them is published,
    /// so a fall from critical past a brief high lands on high, not low).
    pub fn update(&mut self, t: f64, raw: RiskLevel, hold: Hold) -> RiskLevel {
        if raw >= self.level {
            self.level = raw;
            self.lower = None;
            return self.level;
        }
        let (since, n, highest) = match self.lower {
            Some((since, n, highest)) if t >= since => (since, n + 1, highest.max(raw)),
            _ => (t, 1, raw),
        };
        if t - since >= hold.seconds && n >= hold.readings {
            self.level = highest;
            // The new level starts its own evidence from scratch.
            self.lower = None;
        } else {
            self.lower = Some((since, n, highest));
        }
        self.level
    }
}

/// A yes/no verdict (the leak flag) with the same rule: set at once,
/// cleared only after `hold` of readings without it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FlagGate(LevelGate);

impl FlagGate {
    /// Takes the raw reading at `t`; returns the flag to publish.
    pub fn update(&mut self, t: f64, raw: bool, hold: Hold) -> bool {
        let level = if raw {
            RiskLevel::Critical
        } else {
            RiskLevel::None
        };
        self.0.update(t, level, hold) == RiskLevel::Critical
    }

    /// The flag now published.
    pub fn get(&self) -> bool {
        self.0.level() == RiskLevel::Critical
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use RiskLevel::*;

    const HOLD: Hold = Hold {
        seconds: 30.0,
        readings: 3,
    };

    fn run(readings: &[(f64, RiskLevel)]) -> Vec<RiskLevel> {
        let mut g = LevelGate::default();
        readings
            .iter()
            .map(|&(t, r)| g.update(t, r, HOLD))
            .collect()
    }

    #[test]
    fn a_held_level_says_when_it_falls() {
        let mut g = LevelGate::default();
        assert_eq!(g.update(0.0, Critical, HOLD), Critical);
        assert_eq!(g.falls_at(HOLD), Option::None, "not held");
        g.update(5.0, Low, HOLD);
        g.update(6.0, Low, HOLD);
        assert_eq!(g.falls_at(HOLD), Some(35.0), "from the first lower reading");
        g.update(7.0, Critical, HOLD);
        assert_eq!(g.falls_at(HOLD), Option::None, "the evidence came back");
    }

    #[test]
    fn a_level_rises_at_once() {
        assert_eq!(
            run(&[(0.0, Low), (1.0, Medium), (2.0, Critical)]),
            [Low, Medium, Critical]
        );
    }

    /// What the simulated steady leak did: medium → low →
    /// medium within 2 s, and critical → high 15 s after critical.
    #[test]
    fn a_dip_shorter_than_the_hold_publishes_nothing() {
        let mut readings = vec![(0.0, Medium), (1.0, Low), (2.0, Medium)];
        readings.extend((3..40).map(|t| (t as f64, Critical)));
        readings.extend((40..50).map(|t| (t as f64, High)));
        readings.extend((50..60).map(|t| (t as f64, Critical)));
        let out = run(&readings);
        assert!(out[..3].iter().all(|l| *l == Medium), "{out:?}");
        assert!(out[3..].iter().all(|l| *l == Critical), "{out:?}");
    }

    #[test]
    fn a_fall_needs_the_hold_in_time_and_readings_and_lands_on_the_highest_lower_level() {
        let mut readings = vec![(0.0, Critical)];
        readings.extend((1..=40).map(|t| (t as f64, if t == 5 { High } else { Low })));
        let out = run(&readings);
        // Lower since t=1: published low... no: the highest lower reading (high) at t=31.
        assert_eq!(out[30], Critical, "t=30: the hold is not over");
        assert_eq!(out[31], High, "{out:?}");
        // Then high must itself be held down for 30 s before low.
        assert_eq!(*out.last().unwrap(), High);
        // Two readings 40 s apart are not 3 readings of evidence.
        assert_eq!(run(&[(0.0, High), (40.0, Low), (41.0, Low)])[2], High);
        assert_eq!(
            run(&[(0.0, High), (40.0, Low), (41.0, Low), (42.0, Low)])[3],
            High,
            "the span counts from the first lower reading"
        );
    }

    #[test]
    fn a_flag_is_set_at_once_and_cleared_after_the_hold() {
        let mut f = FlagGate::default();
        assert!(f.update(0.0, true, HOLD));
        assert!(f.update(10.0, false, HOLD));
        assert!(f.update(20.0, true, HOLD), "a gap in the evidence");
        assert!((21..51).all(|t| f.update(t as f64, false, HOLD)));
        assert!(!f.update(52.0, false, HOLD));
        assert!(!f.get());
    }
}
