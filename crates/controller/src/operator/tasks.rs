//! No silent death: every long-lived task of `memprof-operator` (roll-up,
//! remediation, webhook, metrics server) runs under [`supervise`]. A task
//! that ends without being asked to, with an error, by returning or by
//! panicking, is logged with its error, counted in
//! `memprof_operator_task_failures_total{task}`, turns the operator unready
//! (`/readyz` answers 503 naming it) and is started again after a backoff
//! (`memprof_runtime::backoff::TASK_RESTART`: 1 s, doubling to 60 s; back
//! to 1 s after a task ran for a minute).
//!
//! Readiness is per task: a task is ready once its start checks passed (it
//! says so through its [`Ready`] handle), so one failing CRD check at start
//! shows as unready until a retry gets past it.

use super::leader::Stop;
use futures::FutureExt;
use memprof_runtime::backoff::TASK_RESTART;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use std::collections::BTreeMap;
use std::fmt::Display;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use tracing::{error, info};

/// Label of `memprof_operator_task_failures_total`: the task that ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TaskLabels {
    /// `operator`, `remediation`, `webhook`, `metrics`.
    pub task: &'static str,
}

/// A task that ran this long before it failed starts over from the first delay.
const HEALTHY_RUN: Duration = Duration::from_secs(60);

/// The tasks that are not ready, one line each (`task: starting`, or
/// `task: failed, retrying in Ns: why`): `/readyz` answers it with 503.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{}", .0.join("\n"))]
pub struct NotReady(pub Vec<String>);

/// Where one task stands.
#[derive(Clone, Debug, PartialEq)]
pub enum State {
    /// Started, start checks not passed yet.
    Starting,
    /// Running.
    Ready,
    /// Ended; started again after `retry_in`.
    Failed {
        /// Why it ended.
        error: String,
        /// Delay before the next start.
        retry_in: Duration,
    },
}

/// The readiness of the operator: every registered task's state.
#[derive(Debug, Default)]
pub struct Health {
    tasks: Mutex<BTreeMap<&'static str, State>>,
}

impl Health {
    /// An empty health (ready: no task registered yet).
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    fn set(&self, task: &'static str, state: State) {
        self.tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(task, state);
    }

    /// The state of `task`, if it is supervised.
    pub fn state(&self, task: &str) -> Option<State> {
        let tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        tasks.get(task).cloned()
    }

    /// `Ok` when every task is ready, else one line per task that is not.
    pub fn readiness(&self) -> Result<(), NotReady> {
        let tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        let not_ready: Vec<String> = tasks
            .iter()
            .filter_map(|(task, state)| match state {
                State::Ready => None,
                State::Starting => Some(format!("{task}: starting")),
                State::Failed { error, retry_in } => Some(format!(
                    "{task}: failed, retrying in {}s: {error}",
                    retry_in.as_secs()
                )),
            })
            .collect();
        if not_ready.is_empty() {
            Ok(())
        } else {
            Err(NotReady(not_ready))
        }
    }
}

/// Handed to each start of a task: it marks the task ready once its start
/// checks (CRDs installed, listener bound) have passed.
#[derive(Clone, Debug)]
pub struct Ready {
    health: Arc<Health>,
    task: &'static str,
}

impl Ready {
    /// The task passed its start checks.
    pub fn set(&self) {
        self.health.set(self.task, State::Ready);
    }
}

/// Runs `start` as task `task` until `shutdown`, starting it again whenever
/// it ends before `shutdown` (see the module docs). A task stops by itself
/// on `shutdown` (each start gets a clone of it): it is never cancelled.
pub async fn supervise<F, Fut, E>(
    task: &'static str,
    health: Arc<Health>,
    failures: Family<TaskLabels, Counter>,
    shutdown: Stop,
    mut start: F,
) where
    F: FnMut(Ready) -> Fut,
    Fut: Future<Output = Result<(), E>> + Send + 'static,
    E: Display,
{
    let mut in_a_row = 0;
    loop {
        health.set(task, State::Starting);
        let started = Instant::now();
        let ready = Ready {
            health: health.clone(),
            task,
        };
        // Its own tokio task, so that a panic is caught and counted too.
        let ended = tokio::spawn(start(ready).map(|r| r.map_err(|e| e.to_string()))).await;
        if shutdown.clone().now_or_never().is_some() {
            info!(task, "stopped");
            return;
        }
        let error = match ended {
            Ok(Ok(())) => "returned without being asked to stop".to_string(),
            Ok(Err(e)) => e,
            Err(e) => format!("panicked: {e}"),
        };
        in_a_row = if started.elapsed() >= HEALTHY_RUN {
            1
        } else {
            in_a_row + 1
        };
        let retry_in = TASK_RESTART.after(in_a_row);
        failures.get_or_create(&TaskLabels { task }).inc();
        error!(task, %error, ?retry_in, "operator task ended: the operator is unready until it runs again");
        health.set(task, State::Failed { error, retry_in });
        tokio::select! {
            () = tokio::time::sleep(retry_in) => {}
            () = shutdown.clone() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn readiness_names_every_task_that_is_not_ready() {
        let health = Health::new();
        assert_eq!(health.readiness(), Ok(()));
        health.set("operator", State::Ready);
        health.set("metrics", State::Starting);
        health.set(
            "remediation",
            State::Failed {
                error: "CRD missing".into(),
                retry_in: 2 * S,
            },
        );
        let not_ready = health.readiness().unwrap_err();
        assert_eq!(
            not_ready.to_string(),
            "metrics: starting\nremediation: failed, retrying in 2s: CRD missing"
        );
        assert_eq!(not_ready.0.len(), 2, "one line per task");
    }

    fn never() -> Stop {
        std::future::pending().boxed().shared()
    }

    fn count(failures: &Family<TaskLabels, Counter>, task: &'static str) -> u64 {
        failures.get_or_create(&TaskLabels { task }).get()
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_failing_its_start_check_is_counted_unready_and_retried_until_it_passes() {
        let (health, failures) = (Health::new(), Family::<TaskLabels, Counter>::default());
        let starts = Arc::new(Mutex::new(Vec::new()));
        let (h, f, s) = (health.clone(), failures.clone(), starts.clone());
        let t0 = Instant::now();
        tokio::spawn(supervise("remediation", h, f, never(), move |ready| {
            let s = s.clone();
            async move {
                let n = {
                    let mut s = s.lock().unwrap();
                    s.push(t0.elapsed().as_secs());
                    s.len()
                };
                if n <= 3 {
                    return Err("CRD remediationpolicies.memprof.dev not installed");
                }
                ready.set();
                std::future::pending().await
            }
        }));
        tokio::time::sleep(S / 2).await;
        assert_eq!(count(&failures, "remediation"), 1);
        let not_ready = health.readiness().unwrap_err();
        assert!(not_ready
            .to_string()
            .contains("remediation: failed, retrying in 1s: CRD"));
        tokio::time::sleep(10 * S).await;
        assert_eq!(*starts.lock().unwrap(), [0, 1, 3, 7], "backoff 1, 2, 4 s");
        assert_eq!(count(&failures, "remediation"), 3);
        assert_eq!(health.readiness(), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_that_returns_or_panics_is_a_failure_too() {
        let (health, failures) = (Health::new(), Family::<TaskLabels, Counter>::default());
        let calls = Arc::new(Mutex::new(0));
        let (h, f, c) = (health.clone(), failures.clone(), calls.clone());
        tokio::spawn(supervise("webhook", h, f, never(), move |ready| {
            let c = c.clone();
            async move {
                ready.set();
                let n = {
                    let mut c = c.lock().unwrap();
                    *c += 1;
                    *c
                };
                match n {
                    1 => Ok::<(), String>(()),
                    2 => panic!("a bug"),
                    _ => std::future::pending().await,
                }
            }
        }));
        tokio::time::sleep(S / 2).await;
        assert!(matches!(
            health.state("webhook"),
            Some(State::Failed { error, .. }) if error.contains("returned without being asked")
        ));
        tokio::time::sleep(S).await;
        assert!(matches!(
            health.state("webhook"),
            Some(State::Failed { error, .. }) if error.contains("panicked")
        ));
        assert_eq!(count(&failures, "webhook"), 2);
        tokio::time::sleep(3 * S).await;
        assert_eq!(health.state("webhook"), Some(State::Ready));
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_stopping_on_shutdown_is_not_a_failure() {
        let (health, failures) = (Health::new(), Family::<TaskLabels, Counter>::default());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let shutdown: Stop = rx.map(|_| ()).boxed().shared();
        let stop = shutdown.clone();
        let supervisor = tokio::spawn(supervise(
            "operator",
            health.clone(),
            failures.clone(),
            shutdown,
            move |ready| {
                let stop = stop.clone();
                async move {
                    ready.set();
                    stop.await;
                    Ok::<(), String>(())
                }
            },
        ));
        tokio::time::sleep(S).await;
        tx.send(()).unwrap();
        supervisor.await.unwrap();
        assert_eq!(count(&failures, "operator"), 0);
    }
}
