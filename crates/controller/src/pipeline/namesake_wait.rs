//! A key's wait for a namesake to make its name's missing profile: pure,
//! kept in the key's state (`state.rs`), counted by `namesakes::deferred`.
//! Its own file so that the state does not depend on the paths that use it.

use memprof_runtime::backoff::NAMESAKE_WAIT;
use std::time::Duration;

/// A key's wait for a namesake created before its workload (a JobSet or
/// PyTorchJob of the name) to make the name's missing profile: each look
/// again may read the name's JobSet from the API server, so the looks
/// fall off with the passes in a row that waited, on the house's schedule
/// ([`NAMESAKE_WAIT`]: 2 s to 1 min), for as long as the namesake fails to
/// make it. The profile's watch event brings a Job's and a PyTorchJob's
/// key back as soon as it is made. Pure; kept in the key's state.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct NamesakeWait {
    /// Passes of the key in a row in which a path waited.
    passes: u32,
    /// A path of this pass waited (a pass counts once, however many did).
    now: bool,
}

impl NamesakeWait {
    /// A path of this pass leaves the profile to a namesake (or lost the
    /// create to one): how soon the key looks again.
    pub(crate) fn waits(&mut self) -> Duration {
        if !std::mem::replace(&mut self.now, true) {
            self.passes = self.passes.saturating_add(1);
        }
        NAMESAKE_WAIT.after(self.passes)
    }

    /// The key's pass is over (`ok`: it did not fail). One that completed
    /// without waiting ends the wait (the profile is there, made, or no
    /// longer wanted): the next wait starts again at the first delay. A
    /// failed pass, retried on the reconcile's own schedule, ends nothing.
    pub(crate) fn pass_ended(&mut self, ok: bool) {
        let waited = std::mem::take(&mut self.now);
        if ok && !waited {
            self.passes = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(d: Duration) -> f64 {
        d.as_secs_f64().round()
    }

    /// A key that waits pass after pass looks again less and less often
    /// (each look may be a JobSet GET): not every 2 s for ever.
    #[test]
    fn a_namesake_wait_falls_off_pass_after_pass_to_once_a_minute() {
        let mut wait = NamesakeWait::default();
        let looks: Vec<f64> = (0..9)
            .map(|_| {
                let again = wait.waits();
                wait.pass_ended(true);
                secs(again)
            })
            .collect();
        assert_eq!(looks, [2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0, 60.0]);
    }

    /// A pass counts once, however many of its paths wait (a PyTorchJob's
    /// and a Job's of one key); a failed pass ends no wait; a pass that
    /// completes without waiting does, and the next wait starts afresh.
    #[test]
    fn a_namesake_wait_counts_passes_and_starts_over_once_a_pass_no_longer_waits() {
        let mut wait = NamesakeWait::default();
        assert_eq!(secs(wait.waits()), 2.0);
        assert_eq!(secs(wait.waits()), 2.0, "the same pass");
        wait.pass_ended(true);
        assert_eq!(secs(wait.waits()), 4.0);
        wait.pass_ended(true);
        wait.pass_ended(false);
        assert_eq!(secs(wait.waits()), 8.0, "a failed pass ends nothing");
        wait.pass_ended(true);
        wait.pass_ended(true);
        assert_eq!(wait, NamesakeWait::default(), "the wait ended");
        assert_eq!(secs(wait.waits()), 2.0);
    }
}
