//! One Job's pipeline, as named steps: fetch → screen and build (roll-up, `rollups.rs`) →
//! decide (remediation); the writes are the status writer's. And the
//! workers that run it, one Job at a time per key.

use super::namesakes::{Taken, SETTLING};
use super::state::Context;
use super::{pytorchjobs, remediation_stage, rollup_stage};
use crate::key::JobKey;
use crate::operator::metrics::StepLabels;
use crate::operator::Result;
use k8s_openapi::api::batch::v1::Job;
use kube::runtime::reflector::ObjectRef;
use memprof_api::MemoryProfile;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::warn;

/// What one reconcile reads, from the watch caches: the Job and its
/// profile. Its reports are the roll-up's (`rollups.rs`, fed report by
/// report), its pods read only where something changed.
pub(super) struct Fetched {
    pub key: JobKey,
    pub job: Option<Arc<Job>>,
    pub profile: Option<Arc<MemoryProfile>>,
}

/// Fetch: O(1), by name.
fn fetch(ctx: &Context, key: &JobKey) -> Fetched {
    let job = ObjectRef::new(&key.name).within(&key.namespace);
    let profile = ObjectRef::new(&key.name).within(&key.namespace);
    Fetched {
        key: key.clone(),
        job: ctx.caches.jobs.get(&job),
        profile: ctx.caches.profiles.get(&profile),
    }
}

/// The whole pipeline for `key`; returns when to look again.
async fn reconcile(ctx: &Arc<Context>, key: &JobKey) -> Result<Option<Duration>> {
    if !ctx.setup.options.allows(&key.namespace) {
        // Namespaced install: no write verbs here, so nothing to do either.
        return Ok(None);
    }
    let mut fetched = fetch(ctx, key);
    if let Some(p) = &fetched.profile {
        ctx.writer.observe(key, p);
    }
    // A PyTorchJob shares its name's key with a Job of that name: its
    // path first, then the Job's, which leaves another workload's profile
    // alone (`pytorchjobs.rs`). Its failure (a malformed spec) must not
    // hold the Job's path up: said once both ran.
    let workload = pytorchjobs::run(ctx, key).await;
    // The Job's claim is judged on the profile as the PyTorchJob's path
    // left it: made just now (not in the cache yet), or as cached now. The
    // profile fetched before that path ran may be none when it is not.
    let made = workload.as_ref().ok().and_then(|w| w.made.clone());
    fetched.profile = made.or_else(|| fetch(ctx, key).profile);
    let mut settling = None;
    if let Some(job) = fetched.job.clone() {
        let standing =
            pytorchjobs::namesake_job(ctx, key, &job, fetched.profile.as_deref()).await?;
        if standing != Taken::No {
            fetched.job = None;
        }
        // No event may follow (a delete refused on a newer version): look again.
        settling = (standing == Taken::Settling).then_some(SETTLING);
    }
    let again = rollup_stage::run(ctx, &fetched).await?;
    let decided = remediation_stage::run(ctx, &fetched);
    let workload = workload?.again;
    if fetched.job.is_none() && fetched.profile.is_none() && workload.is_none() {
        ctx.forget(key);
        return Ok(None);
    }
    Ok([workload, again, decided, settling]
        .into_iter()
        .flatten()
        .min())
}

/// A worker: serves Job keys from the queue until it closes.
pub(super) async fn worker(ctx: Arc<Context>) {
    if ctx.caches_ready().await.is_err() {
        return;
    }
    while let Some(key) = ctx.queue.next().await {
        let started = Instant::now();
        ctx.setup.metrics.reconciles.inc();
        let outcome = reconcile(&ctx, &key).await;
        ctx.setup
            .metrics
            .reconcile_duration
            .observe(started.elapsed().as_secs_f64());
        // Not `with_state`: a key this pass forgot gets no state back (an
        // entry per Job ever seen would grow without bound).
        if let Some(s) = ctx.states().get_mut(&key) {
            s.namesake_wait.pass_ended(outcome.is_ok());
            if outcome.is_ok() {
                s.failures = 0;
            }
        }
        let again = match outcome {
            Ok(again) => again,
            Err(error) => Some(failed(&ctx, &key, &error)),
        };
        ctx.queue.done(&key);
        if let Some(delay) = again {
            ctx.queue.add_after(key, delay);
        }
    }
}

/// Counts a failed reconcile; the delay before the next, doubling from
/// 500 ms to 5 min with failures in a row.
fn failed(ctx: &Context, key: &JobKey, error: &crate::operator::Error) -> Duration {
    ctx.setup
        .metrics
        .reconcile_errors
        .get_or_create(&StepLabels { step: error.step() })
        .inc();
    let failures = ctx.with_state(key, |s| {
        s.failures = s.failures.saturating_add(1);
        s.failures
    });
    let delay = memprof_runtime::backoff::RECONCILE.after(failures);
    warn!(job = %key, %error, failures, retry_in = ?delay, "reconcile failed");
    delay
}
