//! The admission warning from measured history: a profiled workload (a
//! Job, JobSet, TrainJob or PyTorchJob: `ask.rs`) that names its family
//! (`memprof.dev/family`) is predicted from the memory model the roll-up
//! fitted for earlier workloads of that family in the same namespace (their
//! MemoryProfiles, labelled with the family by the operator), and warned
//! about when the prediction exceeds its GPU. A RemediationPolicy of the
//! namespace that selects the workload and sets `denyPredictedOom` turns
//! the warning into a denial; nothing else does.
//!
//! Admission must stay fast and never wait on the API server: one bounded
//! LIST per (namespace, family) with a short timeout, its answer kept
//! briefly; an error is a warning and the Job is admitted (fail open). Only
//! the Job's own namespace is ever read (tenant isolation).

use kube::api::ListParams;
use kube::{Api, Client};
use memprof_api::family::LABEL_FAMILY;
use memprof_api::{MemoryProfile, RemediationPolicy};
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub mod ask;
pub mod deny;
pub mod predict;

pub use ask::{ask_of, Ask};
pub use predict::{predict, Fitted, Outcome};

/// Longest wait for one LIST: the API server's webhook timeout is 5 s in
/// the chart, and the rest of the admission must fit in it too.
const LIST_TIMEOUT: Duration = Duration::from_secs(1);
/// How long an answer is kept: a new measurement shows within this.
const KEEP_ANSWER: Duration = Duration::from_secs(30);
/// How long a failed read is kept: an API server in trouble is not asked
/// again on every admission.
const KEEP_ERROR: Duration = Duration::from_secs(5);
/// Profiles (and policies) read per LIST, at most.
const LIST_LIMIT: u32 = 64;
/// Answers kept, at most (one per namespace and family).
const MAX_KEPT: usize = 1024;

/// Why the history could not be read: the Job is admitted with a warning.
#[derive(Clone, Debug, thiserror::Error)]
pub enum HistoryError {
    /// The API server answered with an error.
    #[error("cannot list {what} in namespace {namespace}: {message}; the operator's ServiceAccount needs list on them (the chart grants it)")]
    Api {
        /// `memoryprofiles` or `remediationpolicies`.
        what: &'static str,
        /// The Job's namespace.
        namespace: String,
        /// The API server's answer.
        message: String,
    },
    /// No answer within [`LIST_TIMEOUT`].
    #[error("no answer listing {what} within {LIST_TIMEOUT:?}; the API server is slow")]
    Timeout {
        /// `memoryprofiles` or `remediationpolicies`.
        what: &'static str,
    },
}

/// What the history adds to one admission.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Verdict {
    /// Admission warnings.
    pub warnings: Vec<String>,
    /// `Some(why)`: refused, by a policy's opt-in.
    pub denied: Option<String>,
}

type Kept<T> = HashMap<String, (Instant, Result<Arc<Vec<T>>, HistoryError>)>;

/// The profiles' fitted models and the policies, read from the API server
/// and kept briefly.
pub struct History {
    client: Client,
    fits: Mutex<Kept<Fitted>>,
    policies: Mutex<Kept<RemediationPolicy>>,
}

impl History {
    /// Reads through `client` (the operator's).
    pub fn new(client: Client) -> Self {
        History {
            client,
            fits: Mutex::default(),
            policies: Mutex::default(),
        }
    }

    /// The warnings (and the denial, where a policy opts in) for `ask`.
    pub async fn check(&self, ask: &Ask) -> Verdict {
        let fits = match self.fitted(&ask.namespace, &ask.family).await {
            Ok(fits) => fits,
            Err(e) => return Verdict::warn(unread(&ask.family, &e)),
        };
        let outcome = predict(&fits, &ask.env, ask.gpu);
        let mut verdict = Verdict {
            warnings: predict::warning(&outcome, ask.kind, &ask.family)
                .into_iter()
                .collect(),
            denied: None,
        };
        if let Outcome::Exceeds(p) = &outcome {
            match self.deny_policies(&ask.namespace).await {
                Ok(policies) => verdict.denied = deny::denial(&policies, ask, p),
                Err(e) => verdict.warnings.push(format!(
                    "memprof: not checked for a policy that denies it: {e}"
                )),
            }
        }
        verdict
    }

    async fn fitted(&self, ns: &str, family: &str) -> Result<Arc<Vec<Fitted>>, HistoryError> {
        let api = Api::<MemoryProfile>::namespaced(self.client.clone(), ns);
        let params = ListParams::default()
            .labels(&format!("{LABEL_FAMILY}={family}"))
            .limit(LIST_LIMIT);
        let list = async move {
            let list = api.list(&params).await?;
            Ok(list.items.iter().filter_map(Fitted::of).collect())
        };
        kept(
            &self.fits,
            format!("{ns}/{family}"),
            "memoryprofiles",
            ns,
            list,
        )
        .await
    }

    async fn deny_policies(&self, ns: &str) -> Result<Arc<Vec<RemediationPolicy>>, HistoryError> {
        let api = Api::<RemediationPolicy>::namespaced(self.client.clone(), ns);
        let params = ListParams::default().limit(LIST_LIMIT);
        let list = async move {
            let list = api.list(&params).await?;
            Ok(list
                .items
                .into_iter()
                .filter(|p| p.spec.deny_predicted_oom)
                .collect())
        };
        kept(
            &self.policies,
            ns.to_string(),
            "remediationpolicies",
            ns,
            list,
        )
        .await
    }
}

impl Verdict {
    fn warn(warning: String) -> Verdict {
        Verdict {
            warnings: vec![warning],
            denied: None,
        }
    }
}

fn unread(family: &str, e: &HistoryError) -> String {
    format!("memprof: the measured history of family {family} could not be read ({e}); no prediction from it")
}

/// The kept answer for `key`, or a fresh one from `list` (bounded by
/// [`LIST_TIMEOUT`]), kept for [`KEEP_ANSWER`] ([`KEEP_ERROR`] if it failed).
async fn kept<T>(
    cache: &Mutex<Kept<T>>,
    key: String,
    what: &'static str,
    namespace: &str,
    list: impl Future<Output = Result<Vec<T>, kube::Error>>,
) -> Result<Arc<Vec<T>>, HistoryError> {
    let now = Instant::now();
    let fresh = |(at, r): &(Instant, Result<Arc<Vec<T>>, HistoryError>)| {
        let keep = if r.is_ok() { KEEP_ANSWER } else { KEEP_ERROR };
        now.duration_since(*at) < keep
    };
    if let Some(hit) = lock(cache).get(&key).filter(|e| fresh(e)) {
        return hit.1.clone();
    }
    let answer = match tokio::time::timeout(LIST_TIMEOUT, list).await {
        Ok(Ok(items)) => Ok(Arc::new(items)),
        Ok(Err(e)) => Err(HistoryError::Api {
            what,
            namespace: namespace.to_string(),
            message: predict::clean(&e.to_string(), 300),
        }),
        Err(_) => Err(HistoryError::Timeout { what }),
    };
    let mut kept = lock(cache);
    if kept.len() >= MAX_KEPT {
        kept.retain(|_, e| fresh(e));
        if kept.len() >= MAX_KEPT {
            kept.clear();
        }
    }
    kept.insert(key, (Instant::now(), answer.clone()));
    answer
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests;
