//! What the controller spawns, one task per Job at a time: record (and
//! carry out) a decision, or resume a pending one. A task's failure is
//! counted and retried with backoff; the plan stays pending meanwhile.

use super::decide::Decision;
use super::executor::Executor;
use super::{execute, recording, JobCheckpoints, Result, StepLabels};
use crate::key::JobKey;
use memprof_api::{OomRecord, RemediationRecord};
use std::sync::Arc;
use std::time::Duration;
use tracing::warn;

impl Executor {
    /// Records new OOMs and a decision (if any), then carries the decision
    /// out. Returns when the Job should be looked at again.
    pub async fn record(
        self: Arc<Self>,
        key: JobKey,
        job_uid: Option<String>,
        ooms: Vec<OomRecord>,
        decision: Option<Decision>,
    ) -> Option<Duration> {
        let outcome = recording::record(&self, &key, job_uid, ooms, decision).await;
        self.settle(&key, outcome)
    }

    /// Finishes the `Pending` record `record` of Job `key`, whose counted
    /// ranks' checkpoints are `ranks` (what a restart may wait for; `None`:
    /// not known yet, and a wait not over waits on).
    pub async fn resume(
        self: Arc<Self>,
        key: JobKey,
        record: RemediationRecord,
        ranks: Option<JobCheckpoints>,
    ) -> Option<Duration> {
        let outcome = execute::resume(&self, &key, &record, ranks.as_ref()).await;
        self.settle(&key, outcome)
    }

    /// Counts a task's failure and says when to try again (doubling from
    /// 500 ms to 2 min with failures in a row); the plan stays pending.
    fn settle(&self, key: &JobKey, outcome: Result<Option<Duration>>) -> Option<Duration> {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let error = match outcome {
            Ok(again) => {
                failures.remove(key);
                return again;
            }
            Err(e) => e,
        };
        let step = StepLabels { step: error.step() };
        self.metrics.reconcile_errors.get_or_create(&step).inc();
        let n = failures.entry(key.clone()).or_default();
        *n = n.saturating_add(1);
        let delay = memprof_runtime::backoff::REMEDIATION.after(*n);
        warn!(job = %key, %error, retry_in = ?delay, "remediation failed; retrying");
        Some(delay)
    }
}
