//! Every retry schedule of memprof, in one place. Each doubles from a first
//! delay to a cap and never gives up; a caller names the schedule of what it
//! retries instead of building its own, so two loops that retry the same
//! thing cannot drift apart, and the delays are read here in one table.
//!
//! A schedule is used three ways: as backon's builder (`f.retry(s.builder())`),
//! as an endless iterator of delays ([`Schedule::delays`]), or as the delay
//! after the n-th failure in a row ([`Schedule::after`]) where the count is
//! kept per object (a Job's reconcile failures).

use backon::{BackoffBuilder, ExponentialBuilder};
use std::time::Duration;

/// A doubling schedule: `first`, `2 × first`, ... up to `max`, for ever.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Schedule {
    first: Duration,
    max: Duration,
    jitter: bool,
}

impl Schedule {
    /// Doubling from `first` to `max`, without jitter.
    pub const fn doubling(first: Duration, max: Duration) -> Self {
        Schedule {
            first,
            max,
            jitter: false,
        }
    }

    /// Adds up to one more delay on top of each, at random, so that many
    /// processes that failed together do not all retry in the same second.
    pub const fn with_jitter(self) -> Self {
        Schedule {
            jitter: true,
            ..self
        }
    }

    /// The first delay.
    pub const fn first(&self) -> Duration {
        self.first
    }

    /// The longest delay (before jitter).
    pub const fn max(&self) -> Duration {
        self.max
    }

    /// backon's builder of this schedule, for `Retryable::retry`.
    pub fn builder(&self) -> ExponentialBuilder {
        let b = ExponentialBuilder::new()
            .with_min_delay(self.first)
            .with_max_delay(self.max)
            .without_max_times();
        if self.jitter {
            b.with_jitter()
        } else {
            b
        }
    }

    /// The delays, one per failure in a row; the iterator never ends.
    pub fn delays(&self) -> impl Iterator<Item = Duration> + Send {
        self.builder().build()
    }

    /// The delay after `failures` failures in a row (1 or more; 0 counts as
    /// 1). The count is capped where the delay has long reached `max`.
    pub fn after(&self, failures: u32) -> Duration {
        self.delays()
            .nth(failures.saturating_sub(1).min(MAX_DOUBLINGS) as usize)
            .unwrap_or(self.max)
    }
}

/// Doublings after which every schedule here has reached its cap (2^16 × the
/// first delay is past any cap); a longer run of failures waits as long.
const MAX_DOUBLINGS: u32 = 16;

/// The operator's Job reconcile after a failed step: 500 ms to 5 min. Each
/// Job counts its own failures; a watch event still wakes it sooner.
pub const RECONCILE: Schedule =
    Schedule::doubling(Duration::from_millis(500), Duration::from_secs(300));

/// A failed remediation step (recording, deleting, recreating a Job):
/// 500 ms to 2 min, per Job.
pub const REMEDIATION: Schedule =
    Schedule::doubling(Duration::from_millis(500), Duration::from_secs(120));

/// Looks at a Job whose deletion is held up (finalizers, pods still going):
/// 1 s to 5 min. The Job watch wakes the reconcile as soon as the Job goes,
/// so a long delay costs no latency, only the polling.
pub const DELETION_WAIT: Schedule =
    Schedule::doubling(Duration::from_secs(1), Duration::from_secs(300));

/// Polls, inside one remediation step, for the old Job to be gone before its
/// replacement is created: 50 ms to 1 s (the step itself has a deadline).
pub const RECREATE_POLL: Schedule =
    Schedule::doubling(Duration::from_millis(50), Duration::from_secs(1));

/// A failed MemoryProfile status write or Job annotation patch: 500 ms to
/// 1 min, per Job.
pub const STATUS_WRITE: Schedule =
    Schedule::doubling(Duration::from_millis(500), Duration::from_secs(60));

/// A long-lived operator task that ended (roll-up, remediation, webhook,
/// metrics server) is started again after 1 s to 1 min.
pub const TASK_RESTART: Schedule =
    Schedule::doubling(Duration::from_secs(1), Duration::from_secs(60));

/// A path that left its name's missing profile to a namesake created
/// before it (a JobSet or PyTorchJob of the name) looks again: 2 s to
/// 1 min, per key, the count reset once a pass no longer waits
/// (`pipeline/namesakes.rs`). Each look may read the name's JobSet from the
/// API server; the profile's watch event brings the key back as soon as the
/// namesake makes it, so a long delay costs the reads, not the latency.
pub const NAMESAKE_WAIT: Schedule =
    Schedule::doubling(Duration::from_secs(2), Duration::from_secs(60));

/// The webhook's reads of the API server (the admission key, its own
/// configuration): 1 s to 30 s, as often as it refreshes them anyway.
pub const WEBHOOK_API: Schedule =
    Schedule::doubling(Duration::from_secs(1), Duration::from_secs(30));

/// The sidecar's MemoryReport writes and its Kubernetes client: 1 s to
/// 1 min, with jitter, so that the ranks of a Job whose API server came
/// back do not all write in the same second.
pub const REPORT_WRITE: Schedule =
    Schedule::doubling(Duration::from_secs(1), Duration::from_secs(60)).with_jitter();

#[cfg(test)]
mod tests;
