//! What the controller holds while it runs: the caches, the queue, the
//! status writer, and per Job what this process already announced. Lost
//! on restart by design: what must survive is in the profile's status.

use super::pytorch_watch::Caches as PyTorchCaches;
use super::tracked::{Pending, Tracked};
use super::watch::Caches;
use super::Setup;
use crate::key::JobKey;
use crate::operator::Error;
use crate::queue::WorkQueue;
use crate::remediation::Executor;
use crate::status::StatusWriter;
use kube::Client;
use memprof_api::MemoryProfile;
use memprof_policy::triggers::RiskClock;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::task::JoinSet;

/// Per Job, between reconciles.
#[derive(Debug, Default)]
pub(super) struct JobState {
    /// Rejected reports already announced with an Event.
    pub announced: BTreeSet<String>,
    /// Our annotations were removed after profiling was switched off.
    pub cleared: bool,
    /// Since when the Job's risk has been at each level (remediation triggers' `forSeconds`).
    pub clock: RiskClock,
    /// A remediation task runs for this Job: decide nothing more meanwhile.
    pub busy: bool,
    /// Reconciles that failed in a row.
    pub failures: u32,
    /// The profile as our last apply of its spec returned it (fresher than the cache right after).
    pub profile: Option<Arc<MemoryProfile>>,
    /// The Job's incremental roll-up (`rollups.rs`); `None` until first reconciled.
    pub rollup: Option<Tracked>,
    /// What changed since the last reconcile (noted by the dispatcher).
    pub pending: Pending,
    /// The workload a JobSet's child Job rolls up under, as last read (`workloads.rs`).
    pub workload: Option<crate::workload::read::Membership>,
    /// Under a workload's key (a JobSet's, a PyTorchJob's): its roll-up,
    /// shared by its reconciles (a JobSet's child Jobs') (`workload_index.rs`).
    pub workload_rollup: Option<super::workload_index::Cell>,
    /// Under a JobSet's key: the remediation target last handed to the
    /// executor and the ranks it was built from (`workloads::remediate`).
    pub workload_target: Option<(
        Arc<crate::remediation::Ranks>,
        Arc<crate::remediation::Target>,
    )>,
    /// Claimants (by uid) already told that this name's profile is
    /// another workload's (`pytorchjobs.rs`).
    pub name_taken: BTreeSet<String>,
    /// Its wait for a namesake to make its name's profile (`namesakes.rs`).
    pub namesake_wait: super::namesake_wait::NamesakeWait,
}

/// Shared by the dispatcher, the workers and the remediation tasks.
pub(super) struct Context {
    pub client: Client,
    pub setup: Setup,
    pub caches: Caches,
    /// The PyTorchJob watches' (`pytorch_watch.rs`).
    pub pytorch: PyTorchCaches,
    pub writer: StatusWriter,
    pub executor: Option<Arc<Executor>>,
    pub queue: Arc<WorkQueue<JobKey>>,
    state: Mutex<HashMap<JobKey, JobState>>,
    /// Running remediation tasks (reaped as they end).
    tasks: Mutex<JoinSet<()>>,
}

impl Context {
    pub fn new(
        client: Client,
        setup: Setup,
        (caches, pytorch): (Caches, PyTorchCaches),
        writer: StatusWriter,
        executor: Option<Arc<Executor>>,
        queue: Arc<WorkQueue<JobKey>>,
    ) -> Self {
        Context {
            client,
            setup,
            caches,
            pytorch,
            writer,
            executor,
            queue,
            state: Mutex::default(),
            tasks: Mutex::default(),
        }
    }

    /// The state of every Job, locked (held only for in-memory updates).
    pub fn states(&self) -> MutexGuard<'_, HashMap<JobKey, JobState>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the state of `key` (created empty when missing).
    pub fn with_state<T>(&self, key: &JobKey, f: impl FnOnce(&mut JobState) -> T) -> T {
        f(self.states().entry(key.clone()).or_default())
    }

    /// Drops what is kept for a Job that is gone with its profile.
    pub fn forget(&self, key: &JobKey) {
        let mut states = self.states();
        if states.get(key).is_some_and(|s| s.busy) {
            return;
        }
        if let Some(mut gone) = states.remove(key) {
            self.drop_rollup(&mut gone);
        }
        drop(states);
        self.writer.forget(key);
        self.queue.forget(key);
    }

    /// Drops a Job's roll-up (profiling off, or the Job forgotten).
    pub fn drop_rollup(&self, state: &mut JobState) {
        if let Some(t) = state.rollup.take() {
            let held = i64::try_from(t.approx_bytes()).unwrap_or(i64::MAX);
            self.setup.metrics.rollup_bytes.dec_by(held);
        }
    }

    /// Waits until every watch cache holds a full list: until then "no
    /// profile" or "no such pod" would be a lie, and a restarted operator
    /// would announce changes that did not happen.
    pub async fn caches_ready(&self) -> Result<(), Error> {
        for rx in self.caches.ready.iter().chain(&self.pytorch.ready) {
            let mut rx = rx.clone();
            rx.wait_for(|r| *r).await.map_err(|_| Error::CacheClosed)?;
        }
        Ok(())
    }

    /// Runs a remediation task for `key`; the Job is reconciled again when it ends.
    pub fn spawn_task(
        self: &Arc<Self>,
        key: JobKey,
        task: impl std::future::Future<Output = Option<std::time::Duration>> + Send + 'static,
    ) {
        self.with_state(&key, |s| s.busy = true);
        let ctx = self.clone();
        let mut tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        while tasks.try_join_next().is_some() {}
        tasks.spawn(async move {
            let again = task.await;
            ctx.with_state(&key, |s| s.busy = false);
            match again {
                Some(delay) => ctx.queue.add_after(key, delay),
                None => ctx.queue.add(key),
            }
        });
    }

    /// Waits for the running remediation tasks (at shutdown).
    pub async fn wait_for_remediations(&self) {
        let mut tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|e| e.into_inner()));
        while tasks.join_next().await.is_some() {}
    }
}
