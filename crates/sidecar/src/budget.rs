//! When to write the MemoryReport: the API server is shared infrastructure.
//!
//! A write happens when the risk level rises (at once), when it falls or when
//! memory moved by more than a few percent of total (at most every
//! `min_interval`), and otherwise as a heartbeat. "Memory" here is the upper
//! envelope of the last buckets and the peak, not the instantaneous sample:
//! periodic training swings by tens of percent every step, and writing on
//! every swing would break the budget of ≤ 1 write per rank per 30 s.
//! The agent's memory breakdown counts as a move when it appears or really
//! changes (`memprof_analysis::breakdown::moved`), not when it is re-measured;
//! so do new acknowledgements of directives (the operator waits for them).

use memprof_api::{MemoryBreakdown, RiskLevel};

/// Write-budget settings.
#[derive(Clone, Debug, PartialEq)]
pub struct Budget {
    /// Least time between two writes not caused by a rising risk, seconds.
    pub min_interval: f64,
    /// Longest time without a write, seconds.
    pub heartbeat: f64,
    /// Movement of a GPU's envelope or peak, as a fraction of its total, that warrants a write.
    pub change_fraction: f64,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            min_interval: 5.0,
            heartbeat: 60.0,
            change_fraction: 0.03,
        }
    }
}

/// What a report said about memory, as far as the budget cares.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// Time, seconds.
    pub t: f64,
    /// Worst risk.
    pub risk: RiskLevel,
    /// Per GPU: (envelope level, peak, total), bytes.
    pub gpus: Vec<(u64, u64, u64)>,
    /// The agent's memory breakdown the report carries.
    pub breakdown: Option<MemoryBreakdown>,
    /// Generation of the directive acknowledgements the report carries
    /// (`AckLog::generation`).
    pub acks: u64,
    /// Generation of the allocation sites the report carries (one per snapshot pushed).
    pub sites: u64,
    /// Generation of the checkpoint the report carries (`CheckpointLog::generation`).
    pub checkpoint: u64,
}

/// Why a report is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Nothing was written yet.
    First,
    /// The risk level rose.
    RiskRaised,
    /// The risk level fell.
    RiskLowered,
    /// Memory moved by more than the change fraction.
    MemoryMoved,
    /// The agent's memory breakdown appeared or changed.
    BreakdownChanged,
    /// A trainer acknowledged a directive.
    AcksChanged,
    /// A trainer pushed an allocation-site snapshot.
    SitesChanged,
    /// A trainer announced a newer checkpoint (a remediation may be waiting for it).
    CheckpointChanged,
    /// Nothing changed for a heartbeat.
    Heartbeat,
}

impl Reason {
    /// Every reason, in the order [`Budget::decide`] tries them.
    pub const ALL: [Reason; 9] = [
        Reason::First,
        Reason::RiskRaised,
        Reason::RiskLowered,
        Reason::MemoryMoved,
        Reason::BreakdownChanged,
        Reason::AcksChanged,
        Reason::SitesChanged,
        Reason::CheckpointChanged,
        Reason::Heartbeat,
    ];

    /// Label value for metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::First => "first",
            Reason::RiskRaised => "risk_raised",
            Reason::RiskLowered => "risk_lowered",
            Reason::MemoryMoved => "memory_moved",
            Reason::BreakdownChanged => "breakdown_changed",
            Reason::AcksChanged => "acks_changed",
            Reason::SitesChanged => "sites_changed",
            Reason::CheckpointChanged => "checkpoint_changed",
            Reason::Heartbeat => "heartbeat",
        }
    }
}

impl Budget {
    /// Decides whether `now` warrants a write given the last written snapshot.
    pub fn decide(&self, last: Option<&Snapshot>, now: &Snapshot) -> Option<Reason> {
        let Some(last) = last else {
            return Some(Reason::First);
        };
        let since = now.t - last.t;
        if now.risk > last.risk {
            return Some(Reason::RiskRaised);
        }
        if since < self.min_interval {
            return None;
        }
        if now.risk < last.risk {
            return Some(Reason::RiskLowered);
        }
        let moved =
            now.gpus.len() != last.gpus.len()
                || now.gpus.iter().zip(&last.gpus).any(
                    |(&(lvl, peak, total), &(lvl0, peak0, _))| {
                        let limit = self.change_fraction * total.max(1) as f64;
                        lvl.abs_diff(lvl0) as f64 > limit || peak.abs_diff(peak0) as f64 > limit
                    },
                );
        if moved {
            return Some(Reason::MemoryMoved);
        }
        let breakdown = memprof_analysis::breakdown::moved(
            last.breakdown.as_ref(),
            now.breakdown.as_ref(),
            self.change_fraction,
        );
        if breakdown {
            return Some(Reason::BreakdownChanged);
        }
        if now.acks != last.acks {
            return Some(Reason::AcksChanged);
        }
        if now.sites != last.sites {
            return Some(Reason::SitesChanged);
        }
        if now.checkpoint != last.checkpoint {
            return Some(Reason::CheckpointChanged);
        }
        (since >= self.heartbeat).then_some(Reason::Heartbeat)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1 << 30;

    fn snap(t: f64, risk: RiskLevel, level_gib: u64) -> Snapshot {
        Snapshot {
            t,
            risk,
            gpus: vec![(level_gib * G, level_gib * G, 80 * G)],
            breakdown: None,
            acks: 0,
            sites: 0,
            checkpoint: 0,
        }
    }

    #[test]
    fn first_write_and_rising_risk_go_at_once() {
        let b = Budget::default();
        assert_eq!(
            b.decide(None, &snap(0.0, RiskLevel::Low, 40)),
            Some(Reason::First)
        );
        let last = snap(0.0, RiskLevel::Low, 40);
        assert_eq!(
            b.decide(Some(&last), &snap(0.5, RiskLevel::High, 40)),
            Some(Reason::RiskRaised)
        );
        assert_eq!(b.decide(Some(&last), &snap(0.5, RiskLevel::None, 40)), None);
        assert_eq!(
            b.decide(Some(&last), &snap(5.0, RiskLevel::None, 40)),
            Some(Reason::RiskLowered)
        );
    }

    #[test]
    fn memory_moves_are_rate_limited_and_small_moves_wait_for_the_heartbeat() {
        let b = Budget::default();
        let last = snap(0.0, RiskLevel::Low, 40);
        assert_eq!(b.decide(Some(&last), &snap(2.0, RiskLevel::Low, 50)), None);
        assert_eq!(
            b.decide(Some(&last), &snap(5.0, RiskLevel::Low, 50)),
            Some(Reason::MemoryMoved)
        );
        assert_eq!(b.decide(Some(&last), &snap(30.0, RiskLevel::Low, 41)), None);
        assert_eq!(
            b.decide(Some(&last), &snap(60.0, RiskLevel::Low, 41)),
            Some(Reason::Heartbeat)
        );
    }

    #[test]
    fn steady_state_stays_within_one_write_per_30_seconds() {
        let b = Budget::default();
        let mut last: Option<Snapshot> = None;
        let mut writes = 0;
        for i in 0..36_000 {
            // 1 h at 10 Hz, an envelope wobbling by 1% of total.
            let now = Snapshot {
                t: i as f64 / 10.0,
                risk: RiskLevel::Low,
                gpus: vec![(40 * G + (i % 7) * G / 100, 41 * G, 80 * G)],
                breakdown: None,
                acks: 0,
                sites: 0,
                checkpoint: 0,
            };
            if b.decide(last.as_ref(), &now).is_some() {
                writes += 1;
                last = Some(now);
            }
        }
        assert!(writes <= 3600 / 30, "{writes} writes in an hour");
        assert!(writes >= 59, "heartbeats must still go out: {writes}");
    }

    #[test]
    fn a_breakdown_writes_when_it_appears_or_changes_never_when_re_measured() {
        let b = Budget::default();
        let breakdown = |activations_gib: u64, step: u64| MemoryBreakdown {
            step: Some(step),
            static_bytes: 10 * G,
            activations_peak_bytes: Some(activations_gib * G),
            ..Default::default()
        };
        let with = |t: f64, bd: Option<MemoryBreakdown>| Snapshot {
            breakdown: bd,
            ..snap(t, RiskLevel::Low, 40)
        };
        let last = with(0.0, None);
        // It appears: written at the next allowed moment, not at once.
        assert_eq!(
            b.decide(Some(&last), &with(2.0, Some(breakdown(20, 1)))),
            None
        );
        assert_eq!(
            b.decide(Some(&last), &with(5.0, Some(breakdown(20, 1)))),
            Some(Reason::BreakdownChanged)
        );
        // Re-measured at later steps with the same numbers: only the heartbeat.
        let last = with(5.0, Some(breakdown(20, 1)));
        for t in [10.0, 30.0, 64.0] {
            assert_eq!(
                b.decide(Some(&last), &with(t, Some(breakdown(20, t as u64)))),
                None
            );
        }
        assert_eq!(
            b.decide(Some(&last), &with(65.0, Some(breakdown(20, 65)))),
            Some(Reason::Heartbeat)
        );
        // Activations grew by a third: a change.
        assert_eq!(
            b.decide(Some(&last), &with(10.0, Some(breakdown(30, 9)))),
            Some(Reason::BreakdownChanged)
        );
    }

    #[test]
    fn a_new_acknowledgement_is_written_at_the_next_allowed_moment() {
        let b = Budget::default();
        let last = snap(0.0, RiskLevel::High, 40);
        let acked = |t: f64| Snapshot {
            acks: 1,
            ..snap(t, RiskLevel::High, 40)
        };
        assert_eq!(b.decide(Some(&last), &acked(2.0)), None);
        assert_eq!(
            b.decide(Some(&last), &acked(5.0)),
            Some(Reason::AcksChanged)
        );
        assert_eq!(b.decide(Some(&acked(5.0)), &acked(20.0)), None);
        let sited = |t: f64| Snapshot {
            sites: 1,
            ..acked(t)
        };
        assert_eq!(b.decide(Some(&acked(5.0)), &sited(6.0)), None);
        assert_eq!(
            b.decide(Some(&acked(5.0)), &sited(10.0)),
            Some(Reason::SitesChanged)
        );
    }
}
