//! Lease-based leader election (`coordination.k8s.io/v1`), so that of several
//! operator replicas exactly one reconciles and the others stand by.
//!
//! The algorithm is client-go's: a candidate takes the Lease when it is free
//! or when its record has not changed for `leaseDurationSeconds` *as measured
//! on the candidate's own clock* (from when it first saw that record), so
//! clock skew between nodes does not matter. Every write carries the Lease's
//! resourceVersion, so two candidates cannot both win. On a graceful shutdown
//! the leader releases the Lease and a standby takes over at once.
//!
//! Why the leader cannot outlive its Lease, even when the API server hangs
//! (kube's client sets no read timeout, so a request to a frozen server
//! never returns by itself):
//! - a term starts when the winning attempt *started*: the standby saw the
//!   record later than that, so it cannot count from an earlier instant;
//! - the leader renews every `duration / 5`, and every request of a renewal
//!   (get, replace, create) is bounded by `tokio::time::timeout` at the
//!   renew deadline (`2/3 × duration` after the last renewal), so a hung
//!   request ends when leadership must end, not when the server answers;
//! - at the renew deadline the work is told to stop; whatever has not stopped
//!   halfway between the renew deadline and the lease's expiry
//!   (`5/6 × duration`) is dropped, so nothing works for this replica when a
//!   standby may take over (`duration` after it saw the last renewal);
//! - the replica then campaigns again: losing a term is no reason to exit.
//!
//! What no client can prevent: a write sent before the deadline, held by a
//! frozen server and applied after it resumes. The Lease write itself is
//! harmless (a standby sees the change and waits again); the operator's own
//! writes are guarded by resourceVersion preconditions.

use futures::FutureExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, PostParams};
use kube::Client;
use prometheus_client::metrics::gauge::Gauge;
use std::future::Future;
use std::pin::pin;
use std::time::Duration;
use tokio::time::Instant;
use tracing::{error, info, warn};

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

    /// Seconds without renewal after which a standby takes over (the leader
    /// stops working after 2/3 of it without a successful renewal).
    #[arg(long, env = "MEMPROF_LEASE_DURATION_SECONDS", default_value_t = 15)]
    pub lease_duration_seconds: u32,
}

/// Why a Lease request failed.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// The API server answered with an error (or the connection failed).
    #[error(
        "leader election Lease {name}: {op} failed: {source}; check the operator's RBAC \
         (coordination.k8s.io leases: get, create, update) and --leader-election-namespace"
    )]
    Request {
        /// Name of the Lease.
        name: String,
        /// `get`, `create` or `replace`.
        op: &'static str,
        /// What the API server (or the connection) said.
        #[source]
        source: kube::Error,
    },
    /// The API server did not answer before the deadline.
    #[error(
        "leader election Lease {name}: {op} got no answer before the renew deadline; \
         the API server hangs or is unreachable. A leader stops working before its \
         Lease can expire and campaigns again once the API server answers"
    )]
    Timeout {
        /// Name of the Lease.
        name: String,
        /// `get`, `create` or `replace`.
        op: &'static str,
    },
}

impl LeaseError {
    /// Whether retrying can help without someone changing RBAC or flags.
    fn is_transient(&self) -> bool {
        match self {
            LeaseError::Timeout { .. } => true,
            LeaseError::Request {
                source: kube::Error::Api(s),
                ..
            } => !matches!(s.code, 401 | 403 | 404 | 422),
            LeaseError::Request { .. } => true,
        }
    }
}

/// Result of the Lease requests.
pub type Result<T, E = LeaseError> = std::result::Result<T, E>;

/// The durations of leader election, all derived from the lease duration
/// in client-go's proportions (15 s lease, 10 s renew deadline, 3 s retry).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// A standby takes over after the record has not changed for this long.
    pub lease: Duration,
    /// The leader stops working when it has not renewed for this long.
    pub renew_deadline: Duration,
    /// Time between two attempts (renewals, or a standby's tries).
    pub retry: Duration,
}

impl Timing {
    /// Timing for a lease duration (at least 1 s).
    pub fn new(lease: Duration) -> Self {
        let lease = lease.max(Duration::from_secs(1));
        Timing {
            lease,
            renew_deadline: lease * 2 / 3,
            retry: lease / 5,
        }
    }

    /// Until when a leader whose last renewal started at `renewed` may renew.
    pub fn renew_by(&self, renewed: Instant) -> Instant {
        renewed + self.renew_deadline
    }

    /// When a leader that last renewed at `renewed` must have stopped all
    /// work: halfway between its renew deadline and the earliest instant a
    /// standby may take over, which leaves both a grace period to stop and a
    /// margin for two machines' clocks running at slightly different rates.
    pub fn stop_by(&self, renewed: Instant) -> Instant {
        renewed + self.renew_deadline + (self.lease - self.renew_deadline) / 2
    }

    /// When the next renewal starts: a retry period after the last attempt
    /// began (at once if that is past), or `None` when that is at or past
    /// the renew deadline (leadership is lost).
    pub fn next_attempt(
        &self,
        renewed: Instant,
        last_attempt: Instant,
        now: Instant,
    ) -> Option<Instant> {
        let at = (last_attempt + self.retry).max(now);
        (at < self.renew_by(renewed)).then_some(at)
    }
}

/// What a candidate last saw of the Lease.
#[derive(Clone, Debug, PartialEq)]
struct Observed {
    holder: Option<String>,
    renew_time: Option<MicroTime>,
    duration: Duration,
}

/// What a candidate may do with the Lease it read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Decision {
    /// We hold it: renew.
    Renew,
    /// Free, or unchanged for longer than its duration on our clock: take it.
    Take,
    /// Another replica holds it and renews it.
    Wait,
}

/// The pure decision: `record` as read, unchanged for `seen_for` on our clock.
fn decide(record: &Observed, seen_for: Duration, identity: &str) -> Decision {
    match record.holder.as_deref() {
        Some(h) if h == identity => Decision::Renew,
        None => Decision::Take,
        Some(_) if seen_for > record.duration => Decision::Take,
        Some(_) => Decision::Wait,
    }
}

/// Awaits `request`, but not past `deadline`.
async fn bounded<T>(
    name: &str,
    op: &'static str,
    deadline: Instant,
    request: impl Future<Output = std::result::Result<T, kube::Error>>,
) -> Result<std::result::Result<T, kube::Error>> {
    tokio::time::timeout_at(deadline, request)
        .await
        .map_err(|_| LeaseError::Timeout {
            name: name.to_string(),
            op,
        })
}

/// One candidate for one Lease.
pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    timing: Timing,
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
            timing: Timing::new(duration),
            observed: None,
        }
    }

    /// This candidate's timing.
    pub fn timing(&self) -> Timing {
        self.timing
    }

    fn request_error(&self, op: &'static str, source: kube::Error) -> LeaseError {
        LeaseError::Request {
            name: self.name.clone(),
            op,
            source,
        }
    }

    /// One attempt to take or renew the Lease, bounded by the renew
    /// deadline: `Ok(true)` when we hold it now.
    pub async fn try_acquire_or_renew(&mut self) -> Result<bool> {
        let deadline = Instant::now() + self.timing.renew_deadline;
        self.attempt(deadline).await
    }

    /// One attempt whose every request ends by `deadline`.
    async fn attempt(&mut self, deadline: Instant) -> Result<bool> {
        let now = MicroTime(jiff::Timestamp::now());
        let seconds = i32::try_from(self.timing.lease.as_secs()).unwrap_or(i32::MAX);
        let read = bounded(&self.name, "get", deadline, self.api.get_opt(&self.name)).await?;
        let Some(mut lease) = read.map_err(|e| self.request_error("get", e))? else {
            return self.create(deadline, now, seconds).await;
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
        let mine = match decide(&record, seen_for, &self.identity) {
            Decision::Wait => return Ok(false),
            Decision::Renew => true,
            Decision::Take => false,
        };
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
        let pp = PostParams::default();
        let replace = self.api.replace(&self.name, &pp, &lease);
        match bounded(&self.name, "replace", deadline, replace).await? {
            Ok(_) => {
                if !mine {
                    info!(lease = %self.name, identity = %self.identity, "became the leader");
                }
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.is_conflict() => Ok(false),
            Err(e) => Err(self.request_error("replace", e)),
        }
    }

    async fn create(&mut self, deadline: Instant, now: MicroTime, seconds: i32) -> Result<bool> {
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
        let pp = PostParams::default();
        let create = self.api.create(&pp, &lease);
        match bounded(&self.name, "create", deadline, create).await? {
            Ok(_) => {
                info!(lease = %self.name, identity = %self.identity, "became the leader");
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(false),
            Err(e) => Err(self.request_error("create", e)),
        }
    }

    /// Waits until this candidate holds the Lease; returns when the winning
    /// attempt started (the start of the term). Transient errors are retried;
    /// an error that needs someone to act (RBAC, a missing namespace) is returned.
    pub async fn acquire(&mut self) -> Result<Instant> {
        loop {
            let started = Instant::now();
            match self.attempt(started + self.timing.renew_deadline).await {
                Ok(true) => return Ok(started),
                Ok(false) => {}
                Err(e) if e.is_transient() => warn!(error = %e, "leader election: retrying"),
                Err(e) => return Err(e),
            }
            tokio::time::sleep(self.timing.retry).await;
        }
    }

    /// Renews the Lease of a term that started at `won_at` until a renewal
    /// fails to happen within the renew deadline (or another replica holds
    /// the Lease); returns the instant by which all work must have stopped.
    pub async fn keep(&mut self, won_at: Instant) -> Instant {
        let timing = self.timing;
        keep_with(timing, won_at, self).await
    }

    /// Gives the Lease up, if we hold it, so a standby takes over at once
    /// (bounded too: a hung server must not hold up a shutdown).
    pub async fn release(&mut self) -> Result<()> {
        let deadline = Instant::now() + self.timing.renew_deadline;
        let read = bounded(&self.name, "get", deadline, self.api.get_opt(&self.name)).await?;
        let Some(mut lease) = read.map_err(|e| self.request_error("get", e))? else {
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
        let pp = PostParams::default();
        let replace = self.api.replace(&self.name, &pp, &lease);
        match bounded(&self.name, "replace", deadline, replace).await? {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.is_conflict() => Ok(()),
            Err(e) => Err(self.request_error("replace", e)),
        }
    }
}

/// One renewal whose every request ends by `deadline`: a trait so that the
/// renew loop's timing is unit-tested without an API server. (Not an async
/// closure: rustc cannot prove their futures `Send` for `tokio::spawn`.)
trait Renew {
    async fn renew(&mut self, deadline: Instant) -> Result<bool>;
}

impl Renew for Elector {
    async fn renew(&mut self, deadline: Instant) -> Result<bool> {
        self.attempt(deadline).await
    }
}

/// The renew loop of a term that started at `won_at`.
async fn keep_with(timing: Timing, won_at: Instant, renewer: &mut impl Renew) -> Instant {
    let (mut renewed, mut last) = (won_at, won_at);
    loop {
        let Some(next) = timing.next_attempt(renewed, last, Instant::now()) else {
            tokio::time::sleep_until(timing.renew_by(renewed)).await;
            warn!(
                deadline = ?timing.renew_deadline,
                "could not renew the Lease within the renew deadline: stepping down"
            );
            return timing.stop_by(renewed);
        };
        tokio::time::sleep_until(next).await;
        last = Instant::now();
        match renewer.renew(timing.renew_by(renewed)).await {
            Ok(true) => renewed = last,
            Ok(false) => {
                warn!("another replica holds the Lease: stepping down");
                return timing.stop_by(renewed);
            }
            Err(e) => warn!(error = %e, "cannot renew the Lease"),
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

/// What [`lead`] needs of an elector: a trait so that the loop's timing is
/// unit-tested without an API server.
trait Candidate {
    /// Waits until we lead; returns when the term started.
    async fn campaign(&mut self) -> Instant;
    /// Renews until leadership is lost; returns when work must have stopped.
    async fn hold(&mut self, won_at: Instant) -> Instant;
    /// Gives leadership up.
    async fn resign(&mut self);
}

impl Candidate for Elector {
    async fn campaign(&mut self) -> Instant {
        loop {
            match self.acquire().await {
                Ok(won_at) => return won_at,
                // Someone must fix RBAC or the flags: say so loudly, keep trying.
                Err(e) => error!(error = %e, "leader election: cannot campaign"),
            }
            tokio::time::sleep(self.timing.retry).await;
        }
    }

    async fn hold(&mut self, won_at: Instant) -> Instant {
        self.keep(won_at).await
    }

    async fn resign(&mut self) {
        if let Err(e) = self.release().await {
            warn!(error = %e, "could not release the Lease; a standby takes over when it expires");
        }
    }
}

/// How one term of leadership ended.
enum Term<E> {
    /// Leadership was lost and the work stopped (or was dropped): campaign again.
    Lost,
    /// The work returned while we led (after a shutdown, or by itself).
    Ended(std::result::Result<(), E>),
}

/// Runs `work` only while holding the Lease, until `shutdown`: campaigns,
/// runs `work` with a stop signal that fires on shutdown or lost leadership,
/// drops it if it has not stopped by the time a standby may take over, and
/// campaigns again. `leader` is 1 exactly while work runs for this replica.
/// Returns after `shutdown` (releasing the Lease) or when `work` returns by
/// itself, with its result.
pub async fn lead<W, Fut, E>(
    mut elector: Elector,
    shutdown: Stop,
    leader: Gauge,
    work: W,
) -> std::result::Result<(), E>
where
    W: FnMut(Stop) -> Fut,
    Fut: Future<Output = std::result::Result<(), E>>,
    E: std::fmt::Display,
{
    info!(lease = %elector.name, identity = %elector.identity, "waiting to become the leader");
    lead_with(&mut elector, shutdown, leader, work).await
}

async fn lead_with<C, W, Fut, E>(
    candidate: &mut C,
    shutdown: Stop,
    leader: Gauge,
    mut work: W,
) -> std::result::Result<(), E>
where
    C: Candidate,
    W: FnMut(Stop) -> Fut,
    Fut: Future<Output = std::result::Result<(), E>>,
    E: std::fmt::Display,
{
    loop {
        let won_at = tokio::select! {
            biased;
            _ = shutdown.clone() => return Ok(()),
            won_at = candidate.campaign() => won_at,
        };
        leader.set(1);
        let term = serve_term(candidate, &shutdown, won_at, &mut work).await;
        leader.set(0);
        if let Term::Ended(result) = term {
            candidate.resign().await;
            return result;
        }
    }
}

/// One term: `work` runs while `candidate` holds the Lease.
async fn serve_term<C, W, Fut, E>(
    candidate: &mut C,
    shutdown: &Stop,
    won_at: Instant,
    work: &mut W,
) -> Term<E>
where
    C: Candidate,
    W: FnMut(Stop) -> Fut,
    Fut: Future<Output = std::result::Result<(), E>>,
    E: std::fmt::Display,
{
    let (lost, lost_rx) = tokio::sync::oneshot::channel::<()>();
    let stop = futures::future::select(shutdown.clone(), lost_rx)
        .map(|_| ())
        .boxed()
        .shared();
    let mut job = pin!(work(stop));
    // Renewing goes on while the work finishes after a shutdown.
    let stop_by = tokio::select! {
        result = &mut job => return Term::Ended(result),
        stop_by = candidate.hold(won_at) => stop_by,
    };
    let _ = lost.send(());
    match tokio::time::timeout_at(stop_by, &mut job).await {
        Ok(Ok(())) => info!("leadership lost: work stopped; campaigning again"),
        Ok(Err(e)) => {
            warn!(error = %e, "leadership lost: work stopped with an error; campaigning again")
        }
        Err(_) => {
            warn!("leadership lost: work did not stop before a standby may take over; cancelled it")
        }
    }
    Term::Lost
}

#[cfg(test)]
mod tests;
