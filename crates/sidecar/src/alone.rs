//! When a sidecar that is not a native sidecar (servers before 1.29) should
//! exit, so that its Job can complete: once the trainer is gone.
//!
//! The sidecar cannot read its own Pod (the reporter Role grants only
//! `memoryreports`), so "the trainer is gone" is read from what it does see:
//! compute processes on its GPUs (NVML) and pushes from the in-process agent.
//! Once it has seen the trainer busy, and then neither for `grace` seconds, it
//! exits 0. It never exits before it has seen the trainer, nor when it cannot
//! tell. Caveat (README): on GPUs shared with other pods, their processes keep
//! it running.

/// Tracks whether the trainer is still there.
#[derive(Clone, Debug)]
pub struct AloneDetector {
    grace: f64,
    seen_busy: bool,
    idle_since: Option<f64>,
}

impl AloneDetector {
    /// A detector that waits `grace` seconds of idleness before saying "alone".
    pub fn new(grace: f64) -> Self {
        AloneDetector {
            grace,
            seen_busy: false,
            idle_since: None,
        }
    }

    /// Records what was seen at `t` (processes on the GPUs, when known; whether
    /// the agent pushed since the last call) and says whether to exit now.
    pub fn observe(&mut self, t: f64, processes: Option<usize>, agent_pushed: bool) -> bool {
        let busy = match (processes, agent_pushed) {
            (_, true) => true,
            (Some(n), false) => n > 0,
            // Cannot tell: never conclude the trainer is gone.
            (None, false) => {
                self.idle_since = None;
                return false;
            }
        };
        if busy {
            self.seen_busy = true;
            self.idle_since = None;
            return false;
        }
        if !self.seen_busy {
            return false;
        }
        let since = *self.idle_since.get_or_insert(t);
        t - since >= self.grace
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exits_only_after_the_trainer_was_seen_and_left_for_the_grace_period() {
        let mut a = AloneDetector::new(30.0);
        assert!(
            !a.observe(0.0, Some(0), false),
            "the trainer has not started yet"
        );
        assert!(!a.observe(100.0, Some(0), false));
        assert!(!a.observe(101.0, Some(2), false));
        assert!(!a.observe(102.0, Some(0), false));
        assert!(!a.observe(120.0, Some(0), false));
        assert!(
            !a.observe(125.0, Some(1), false),
            "back: the idle clock restarts"
        );
        assert!(!a.observe(130.0, Some(0), false));
        assert!(a.observe(160.0, Some(0), false));
    }

    #[test]
    fn agent_pushes_count_as_busy_and_unknown_never_exits() {
        let mut a = AloneDetector::new(10.0);
        assert!(!a.observe(0.0, None, true));
        assert!(!a.observe(5.0, None, false));
        assert!(!a.observe(500.0, None, false), "cannot tell: stay");
        assert!(!a.observe(501.0, Some(0), false));
        assert!(a.observe(512.0, Some(0), false));
    }
}
