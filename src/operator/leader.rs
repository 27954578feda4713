//! Lease-based leader election (`coordination.k8s.io/v1`), so that of several
//! operator replicas exactly one reconciles and the others stand by.
//!
//! The algorithm is client-go's: a candidate takes the Lease when it is free
//! or when its record has not changed for `leaseDurationSeconds` *as measured
//! on the candidate's own clock* (from when it first saw that record), so
//! clock skew between nodes does not matter. The leader renews every
//! `duration / 5` and stops working when it could not renew for
//! `2/3 × duration`, before any standby may take over. Every write carries the
//! Lease's resourceVersion, so two candidates cannot both win. On a graceful
//! shutdown the leader releases the Lease and a standby takes over at once.

use super::{Error, Result};
use futures::future::{select, Either};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, PostParams};
use kube::Client;
use std::future::Future;
use std::pin::pin;
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// Flags of leader election (the chart enables it when it runs several replicas).
#[derive(Clone, Debug, clap::Args)]
pub struct LeaderOptions {
    /// Run for leadership with a Lease, so that only one replica reconciles.
    #[arg(long, env = "MEMPROF_LEADER_ELECT", default_value_t = false)]
    pub leader_elect: bool,

    /// Namespace of the Lease; empty: the client's namespace (in a pod, the
    /// service account's, i.e. the release namespace).
    #[arg(long, env = "MEMPROF_LEADER_ELECTION_NAMESPACE", default_value = "")]
    pub leader_election_namespace: String,

    /// Name of the Lease.
    #[arg(
        long,
        env = "MEMPROF_LEADER_ELECTION_LEASE",
        default_value = "memprof-operator"
    )]
    pub leader_election_lease: String,

    /// Seconds without renewal after which a standby takes over.
    #[arg(long, env = "MEMPROF_LEASE_DURATION_SECONDS", default_value_t = 15)]
    pub lease_duration_seconds: u32,
}

/// What a candidate last saw of the Lease, and when it first saw it.
#[derive(Clone, Debug, PartialEq)]
struct Observed {
    holder: Option<String>,
    renew_time: Option<MicroTime>,
    duration: Duration,
}

/// One candidate for one Lease.
pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
    observed: Option<(Observed, Instant)>,
}

impl Elector {
    /// A candidate `identity` (unique per replica: the pod name) for Lease
    /// `namespace/name`; an empty namespace means the client's default one.
    pub fn new(
        client: Client,
        namespace: &str,
        name: &str,
        identity: &str,
        duration: Duration,
    ) -> Self {
        let api = if namespace.is_empty() {
            Api::default_namespaced(client)
        } else {
            Api::namespaced(client, namespace)
        };
        Elector {
            api,
            name: name.to_string(),
            identity: identity.to_string(),
            duration: duration.max(Duration::from_secs(1)),
            observed: None,
        }
    }

    fn retry_period(&self) -> Duration {
        self.duration / 5
    }

    fn lease_error(&self, source: kube::Error) -> Error {
        Error::Lease {
            name: self.name.clone(),
            source,
        }
    }

    /// One attempt to take or renew the Lease: `Ok(true)` when we hold it now.
    pub async fn try_acquire_or_renew(&mut self) -> Result<bool> {
        let now = MicroTime(jiff::Timestamp::now());
        let seconds = i32::try_from(self.duration.as_secs()).unwrap_or(i32::MAX);
        let Some(mut lease) = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(|e| self.lease_error(e))?
        else {
            let mut lease = Lease {
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(seconds),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
                ..Default::default()
            };
            lease.metadata.name = Some(self.name.clone());
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => {
                    info!(lease = %self.name, identity = %self.identity, "became the leader");
                    Ok(true)
                }
                Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(false),
                Err(e) => Err(self.lease_error(e)),
            };
        };

        let spec = lease.spec.clone().unwrap_or_default();
        let record = Observed {
            holder: spec.holder_identity.clone().filter(|h| !h.is_empty()),
            renew_time: spec.renew_time.clone(),
            duration: Duration::from_secs(spec.lease_duration_seconds.unwrap_or(0).max(0) as u64),
        };
        if self.observed.as_ref().map(|(r, _)| r) != Some(&record) {
            self.observed = Some((record.clone(), Instant::now()));
        }
        let seen_for = self
            .observed
            .as_ref()
            .map_or(Duration::ZERO, |(_, t)| t.elapsed());
        let mine = record.holder.as_deref() == Some(self.identity.as_str());
        let free = record.holder.is_none() || seen_for > record.duration;
        if !mine && !free {
            return Ok(false);
        }
        lease.spec = Some(LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(seconds),
            acquire_time: if mine {
                spec.acquire_time
            } else {
                Some(now.clone())
            },
            renew_time: Some(now),
            lease_transitions: Some(spec.lease_transitions.unwrap_or(0) + i32::from(!mine)),
            ..spec
        });
        // `replace` sends the resourceVersion we read: whoever writes first wins.
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => {
                if !mine {
                    info!(lease = %self.name, identity = %self.identity, "became the leader");
                }
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.is_conflict() => Ok(false),
            Err(e) => Err(self.lease_error(e)),
        }
    }

    /// Waits until this candidate holds the Lease.
    pub async fn acquire(&mut self) -> Result<()> {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => warn!(error = %e, "leader election: retrying"),
            }
            tokio::time::sleep(self.retry_period()).await;
        }
    }

    /// Renews until a renewal has failed for `2/3 × duration`, then returns:
    /// leadership is lost (or about to be) and the work must stop.
    pub async fn keep(&mut self) {
        let deadline = self.duration * 2 / 3;
        let mut renewed = Instant::now();
        loop {
            tokio::time::sleep(self.retry_period()).await;
            match self.try_acquire_or_renew().await {
                Ok(true) => renewed = Instant::now(),
                Ok(false) => warn!(lease = %self.name, "another replica took the lease"),
                Err(e) => warn!(error = %e, "cannot renew the lease"),
            }
            if renewed.elapsed() >= deadline {
                return;
            }
        }
    }

    /// Gives the Lease up, if we hold it, so a standby takes over at once.
    pub async fn release(&mut self) -> Result<()> {
        let Some(mut lease) = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(|e| self.lease_error(e))?
        else {
            return Ok(());
        };
        let Some(spec) = lease.spec.as_mut() else {
            return Ok(());
        };
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(jiff::Timestamp::now()));
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.is_conflict() => Ok(()),
            Err(e) => Err(self.lease_error(e)),
        }
    }
}

/// The stop signal `work` gets: shutdown requested or leadership lost.
pub type Stop = futures::future::Shared<futures::future::BoxFuture<'static, ()>>;

/// A default candidate identity: the host name (the pod name in a pod) and the process id.
pub fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "memprof-operator".into());
    format!("{host}_{}", std::process::id())
}

/// Runs `work` only while holding the Lease: waits for it (or for
/// `shutdown`), runs `work` with a stop signal that fires on `shutdown` or on
/// lost leadership, then releases the Lease. Losing it is an error, so the
/// process exits and restarts as a standby rather than keep reconciling.
pub async fn run_elected<W, Fut>(
    mut elector: Elector,
    shutdown: impl Future<Output = ()> + Send + 'static,
    work: W,
) -> Result<()>
where
    W: FnOnce(Stop) -> Fut,
    Fut: Future<Output = Result<()>>,
{
    use futures::FutureExt;
    let shutdown = shutdown.boxed().shared();
    info!(lease = %elector.name, identity = %elector.identity, "waiting to become the leader");
    match select(pin!(elector.acquire()), shutdown.clone()).await {
        Either::Left((acquired, _)) => acquired?,
        Either::Right(_) => return Ok(()),
    }
    let (lost_tx, lost_rx) = tokio::sync::oneshot::channel::<()>();
    let (stop_keeping, keeping_stopped) = tokio::sync::oneshot::channel::<()>();
    let keeper = tokio::spawn(async move {
        let lost = match select(pin!(elector.keep()), keeping_stopped).await {
            Either::Left(_) => true,
            Either::Right(_) => false,
        };
        if lost {
            let _ = lost_tx.send(());
        } else if let Err(e) = elector.release().await {
            warn!(error = %e, "could not release the lease; a standby takes over when it expires");
        }
        lost
    });
    let stop = select(shutdown, lost_rx).map(|_| ()).boxed().shared();
    let result = work(stop).await;
    let _ = stop_keeping.send(());
    let lost = keeper.await.unwrap_or(true);
    result?;
    if lost {
        return Err(Error::LeadershipLost);
    }
    Ok(())
}
