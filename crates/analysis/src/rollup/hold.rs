//! The profile's risk level moves only on evidence: it rises at once, and
//! falls only when the lower level has lasted a dwell time.
//!
//! Why: a steady simulated leak's profile went medium → low → medium within
//! 2 s, and critical → high 15 s after reaching critical while the leak went
//! on: one rank's report dipping for a moment, or the worst
//! rank's sidecar lowering its own level while another's had not caught up.
//! Each flap is a risk Event and a possible page. A level is held for
//! `dwell` after the last moment some counted report was at or above it;
//! a report at that level renews it.
//!
//! Pure: time comes in with the calls.

use jiff::{SignedDuration, Timestamp};
use memprof_api::{MemoryProfileStatus, RiskLevel};

const LEVELS: [RiskLevel; 5] = [
    RiskLevel::None,
    RiskLevel::Low,
    RiskLevel::Medium,
    RiskLevel::High,
    RiskLevel::Critical,
];

fn slot(r: RiskLevel) -> usize {
    LEVELS.iter().position(|l| *l == r).unwrap_or(0)
}

/// Per level, the last moment the Job's counted reports were at or above it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RiskHold {
    seen: [Option<Timestamp>; 5],
}

impl RiskHold {
    /// The Job's reports went from `before` to `after` at `at`: both levels
    /// (and every one below) were true until then.
    pub fn observe(&mut self, before: RiskLevel, after: RiskLevel, at: Timestamp) {
        for l in 1..=slot(before.max(after)) {
            self.seen[l] = self.seen[l].max(Some(at));
        }
    }

    /// Carries a hold over from an earlier status (an operator restart, or a
    /// roll-up built afresh): its level is held until its `riskHeldUntil`,
    /// or for a whole dwell from `now` when it gave none (it was not held:
    /// its level was the reports' own when written).
    pub fn resume(
        &mut self,
        previous: &MemoryProfileStatus,
        dwell: SignedDuration,
        now: Timestamp,
    ) {
        let until = previous
            .risk_held_until
            .as_deref()
            .and_then(|t| t.parse::<Timestamp>().ok());
        let since = match until {
            Some(u) => u.checked_sub(dwell).unwrap_or(u),
            None => now,
        };
        self.observe(previous.risk, previous.risk, since);
    }

    /// The level to show at `now` when the reports say `raw`, and until
    /// when it is held above `raw` (when it is).
    pub fn shown(
        &self,
        raw: RiskLevel,
        dwell: SignedDuration,
        now: Timestamp,
    ) -> (RiskLevel, Option<Timestamp>) {
        for l in (slot(raw) + 1..LEVELS.len()).rev() {
            if let Some(until) = self.seen[l].and_then(|s| s.checked_add(dwell).ok()) {
                if until > now {
                    return (LEVELS[l], Some(until));
                }
            }
        }
        (raw, None)
    }

    /// The next moment after `now` at which a held level ends.
    pub fn next_change(
        &self,
        raw: RiskLevel,
        dwell: SignedDuration,
        now: Timestamp,
    ) -> Option<Timestamp> {
        (slot(raw) + 1..LEVELS.len())
            .filter_map(|l| self.seen[l]?.checked_add(dwell).ok())
            .filter(|until| *until > now)
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use RiskLevel::{Critical, High, Low, Medium};

    const DWELL: SignedDuration = SignedDuration::from_secs(60);

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    #[test]
    fn a_level_rises_at_once_and_falls_only_after_the_dwell() {
        let mut h = RiskHold::default();
        h.observe(Low, Medium, t(20));
        assert_eq!(h.shown(Medium, DWELL, t(20)), (Medium, None));
        // The flap seen: medium -> low -> medium within 2 s.
        h.observe(Medium, Low, t(21));
        assert_eq!(h.shown(Low, DWELL, t(21)), (Medium, Some(t(81))));
        h.observe(Low, Medium, t(22));
        assert_eq!(h.shown(Medium, DWELL, t(22)), (Medium, None));
        // Low for good from 30 s: still medium at 89 s, low at 90 s.
        h.observe(Medium, Low, t(30));
        assert_eq!(h.shown(Low, DWELL, t(89)).0, Medium);
        assert_eq!(h.next_change(Low, DWELL, t(89)), Some(t(90)));
        assert_eq!(h.shown(Low, DWELL, t(90)), (Low, None));
        assert_eq!(h.next_change(Low, DWELL, t(90)), None);
    }

    #[test]
    fn critical_is_held_through_a_dip_to_high_while_the_leak_goes_on() {
        let mut h = RiskHold::default();
        h.observe(High, Critical, t(100));
        // 15 s later the worst rank's own level dips to high.
        h.observe(Critical, High, t(115));
        assert_eq!(h.shown(High, DWELL, t(150)), (Critical, Some(t(175))));
        // Critical again at 160 s: renewed, no Event in between.
        h.observe(High, Critical, t(160));
        h.observe(Critical, High, t(170));
        assert_eq!(h.shown(High, DWELL, t(200)).0, Critical);
        assert_eq!(h.shown(High, DWELL, t(230)), (High, None));
    }

    #[test]
    fn a_fall_of_several_levels_holds_each_until_its_own_dwell() {
        let mut h = RiskHold::default();
        h.observe(Low, Critical, t(0));
        h.observe(Critical, High, t(10));
        h.observe(High, Low, t(40));
        assert_eq!(h.shown(Low, DWELL, t(69)).0, Critical);
        assert_eq!(h.shown(Low, DWELL, t(70)), (High, Some(t(100))));
        assert_eq!(h.shown(Low, DWELL, t(100)), (Low, None));
    }

    #[test]
    fn a_restart_keeps_holding_what_the_last_status_held() {
        let held = MemoryProfileStatus {
            risk: Critical,
            risk_held_until: Some(t(75).to_string()),
            ..Default::default()
        };
        let mut h = RiskHold::default();
        h.resume(&held, DWELL, t(50));
        assert_eq!(h.shown(High, DWELL, t(74)), (Critical, Some(t(75))));
        assert_eq!(h.shown(High, DWELL, t(75)).0, High);
        // A status at its reports' own level: held for a dwell from the restart.
        let plain = MemoryProfileStatus {
            risk: High,
            ..Default::default()
        };
        let mut h = RiskHold::default();
        h.resume(&plain, DWELL, t(50));
        assert_eq!(h.shown(Low, DWELL, t(109)).0, High);
        assert_eq!(h.shown(Low, DWELL, t(110)).0, Low);
    }
}
