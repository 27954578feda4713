//! Leader election on a `coordination.k8s.io/v1` Lease, so that of several
//! operator replicas exactly one remediates (two would race to delete and
//! recreate the same Job).
//!
//! How it stays safe without trusting clocks: a candidate never compares the
//! holder's `renewTime` with its own clock. It notes when it first saw the
//! lease's current `resourceVersion` and takes over only after the lease has
//! not changed for a full lease duration (15 s) by its own monotonic clock.
//! The holder renews every 5 s and steps down by itself when it could not
//! renew for 10 s, well before anyone may take over. Every write carries the
//! `resourceVersion` it was decided on (optimistic concurrency), so of two
//! candidates acting on the same observation one gets 409 and stays follower.
//!
//! A restarted process with the same identity (same pod name) takes its
//! lease back at once instead of waiting for it to expire.

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use std::future::Future;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tracing::{info, warn};

/// What to do with the lease, given what was observed.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Nobody holds it, or the holder stopped renewing: take it.
    Acquire,
    /// We hold it: renew it.
    Renew,
    /// Someone else holds it and renews it: wait.
    Follow {
        /// The holder.
        holder: String,
        /// How long until it counts as expired if it is not renewed.
        remaining: Duration,
    },
}

/// The pure decision: `holder` of the lease as observed, the lease duration,
/// how long the lease has gone unchanged by our clock, and our identity.
pub fn decide(
    holder: Option<&str>,
    lease_duration: Duration,
    unchanged_for: Duration,
    identity: &str,
) -> Decision {
    match holder.filter(|h| !h.is_empty()) {
        None => Decision::Acquire,
        Some(h) if h == identity => Decision::Renew,
        Some(_) if unchanged_for >= lease_duration => Decision::Acquire,
        Some(h) => Decision::Follow {
            holder: h.to_string(),
            remaining: lease_duration - unchanged_for,
        },
    }
}

/// Whether a leader that last renewed `since_renew` ago must step down.
pub fn must_step_down(since_renew: Duration, renew_deadline: Duration) -> bool {
    since_renew >= renew_deadline
}

/// A default identity: the pod name (`HOSTNAME`) in a cluster, else host and pid.
pub fn default_identity() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| format!("memprof-{}", std::process::id()))
}

/// Campaigns for a Lease and publishes whether we lead.
#[derive(Clone)]
pub struct LeaderElector {
    client: Client,
    namespace: String,
    name: String,
    identity: String,
    /// How long a lease lasts without renewal (15 s).
    pub lease_duration: Duration,
    /// How often the leader renews (5 s).
    pub renew_interval: Duration,
    /// After this long without a successful renewal the leader steps down (10 s).
    pub renew_deadline: Duration,
    /// How often a follower looks at the lease (2 s).
    pub retry_interval: Duration,
}

impl LeaderElector {
    /// An elector for Lease `namespace/name` with the default timings.
    pub fn new(client: Client, namespace: &str, name: &str, identity: &str) -> Self {
        LeaderElector {
            client,
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_interval: Duration::from_secs(5),
            renew_deadline: Duration::from_secs(10),
            retry_interval: Duration::from_secs(2),
        }
    }

    /// Campaigns in the background until `shutdown`, then releases the lease
    /// if held. The receiver says whether we lead right now.
    pub fn spawn(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> (watch::Receiver<bool>, tokio::task::JoinHandle<()>) {
        let (tx, rx) = watch::channel(false);
        let task = tokio::spawn(self.run(tx, shutdown));
        (rx, task)
    }

    async fn run(self, tx: watch::Sender<bool>, shutdown: impl Future<Output = ()> + Send) {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), &self.namespace);
        let mut observed: Option<(String, Instant)> = None;
        let mut last_renew: Option<Instant> = None;
        tokio::pin!(shutdown);
        loop {
            let leading = match self.campaign(&api, &mut observed).await {
                Ok(leading) => {
                    last_renew = leading.then(Instant::now);
                    leading
                }
                Err(e) => {
                    warn!(lease = %self.name, error = %e, "cannot read or write the leader Lease: check RBAC (coordination.k8s.io leases: get, create, update)");
                    last_renew.is_some_and(|t| !must_step_down(t.elapsed(), self.renew_deadline))
                }
            };
            tx.send_if_modified(|was| {
                if *was != leading {
                    info!(lease = %self.name, identity = %self.identity, leading, "leadership changed");
                    *was = leading;
                    true
                } else {
                    false
                }
            });
            let wait = if leading {
                self.renew_interval
            } else {
                self.retry_interval
            };
            tokio::select! {
                _ = &mut shutdown => break,
                _ = tokio::time::sleep(wait) => {}
            }
        }
        if *tx.borrow() {
            let _ = tx.send(false);
            if let Err(e) = self.release(&api).await {
                warn!(error = %e, "could not release the leader Lease; it expires by itself");
            }
        }
    }

    fn spec(&self, now: Timestamp, acquired: Option<MicroTime>, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.lease_duration.as_secs() as i32),
            acquire_time: Some(acquired.unwrap_or(MicroTime(now))),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    /// One round: read the lease, decide, write. `Ok(true)` when we lead.
    async fn campaign(
        &self,
        api: &Api<Lease>,
        observed: &mut Option<(String, Instant)>,
    ) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        let Some(mut lease) = api.get_opt(&self.name).await? else {
            let mut lease = Lease::default();
            lease.metadata.name = Some(self.name.clone());
            lease.spec = Some(self.spec(now, None, 0));
            return match api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.is_conflict() || s.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let rv = lease.resource_version().unwrap_or_default();
        let since = match observed {
            Some((seen, at)) if *seen == rv => *at,
            _ => {
                *observed = Some((rv.clone(), Instant::now()));
                Instant::now()
            }
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let duration = spec
            .lease_duration_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map_or(self.lease_duration, Duration::from_secs);
        let transitions = spec.lease_transitions.unwrap_or(0);
        let next = match decide(
            spec.holder_identity.as_deref(),
            duration,
            since.elapsed(),
            &self.identity,
        ) {
            Decision::Follow { .. } => return Ok(false),
            Decision::Renew => self.spec(now, spec.acquire_time, transitions),
            Decision::Acquire => self.spec(now, None, transitions + 1),
        };
        lease.spec = Some(next);
        // `replace` sends our resourceVersion: someone else's write in between is a 409.
        match api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Gives the lease up so that a successor need not wait for it to expire.
    async fn release(&self, api: &Api<Lease>) -> Result<(), kube::Error> {
        let mut lease = api.get(&self.name).await?;
        let spec = lease.spec.get_or_insert_with(Default::default);
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        api.replace(&self.name, &PostParams::default(), &lease)
            .await
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Duration = Duration::from_secs(15);

    #[test]
    fn free_or_expired_leases_are_taken_and_ours_renewed() {
        assert_eq!(decide(None, D, Duration::ZERO, "a"), Decision::Acquire);
        assert_eq!(decide(Some(""), D, Duration::ZERO, "a"), Decision::Acquire);
        assert_eq!(decide(Some("a"), D, Duration::ZERO, "a"), Decision::Renew);
        // Our own lease after a restart: no need to wait for it to expire.
        assert_eq!(
            decide(Some("a"), D, Duration::from_secs(60), "a"),
            Decision::Renew
        );
        assert_eq!(
            decide(Some("b"), D, Duration::from_secs(4), "a"),
            Decision::Follow {
                holder: "b".into(),
                remaining: Duration::from_secs(11)
            }
        );
        assert_eq!(decide(Some("b"), D, D, "a"), Decision::Acquire);
    }

    #[test]
    fn a_leader_steps_down_before_anyone_may_take_over() {
        let deadline = Duration::from_secs(10);
        assert!(!must_step_down(Duration::from_secs(9), deadline));
        assert!(must_step_down(Duration::from_secs(10), deadline));
        assert!(deadline < D);
    }
}
