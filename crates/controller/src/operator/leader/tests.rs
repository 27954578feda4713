//! Unit tests of leader election's timing: pure arithmetic, and the renew
//! and lead loops on tokio's paused clock (no API server, no wall time).

use super::*;
use std::sync::{Arc, Mutex};

const S: Duration = Duration::from_secs(1);

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

#[test]
fn timing_keeps_client_gos_proportions() {
    let t = Timing::new(15 * S);
    assert_eq!(
        (t.lease, t.renew_deadline, t.retry),
        (15 * S, 10 * S, 3 * S)
    );
    assert_eq!(Timing::new(Duration::ZERO).lease, S, "at least one second");
}

#[test]
fn a_leader_stops_after_its_renew_deadline_and_before_a_standby_may_take_over() {
    let t0 = Instant::now();
    for lease in [1, 2, 4, 6, 15, 60, 137] {
        let t = Timing::new(lease * S);
        assert!(t.renew_deadline < t.lease);
        assert!(t.renew_by(t0) < t.stop_by(t0), "grace period for {lease}s");
        assert!(t.stop_by(t0) < t0 + t.lease, "margin for {lease}s");
    }
    let t = Timing::new(15 * S);
    assert_eq!(t.stop_by(t0) - t0, Duration::from_millis(12_500));
}

#[test]
fn no_renewal_starts_at_or_after_the_renew_deadline() {
    let t = Timing::new(15 * S);
    let t0 = Instant::now();
    assert_eq!(t.next_attempt(t0, t0, t0), Some(t0 + 3 * S));
    assert_eq!(t.next_attempt(t0, t0 + 6 * S, t0 + 6 * S), Some(t0 + 9 * S));
    assert_eq!(
        t.next_attempt(t0, t0 + 7 * S, t0 + 7 * S),
        None,
        "10 s is the deadline"
    );
    assert_eq!(
        t.next_attempt(t0 + 5 * S, t0 + 7 * S, t0 + 8 * S),
        Some(t0 + 10 * S)
    );
    // An attempt that took longer than the retry period: the next one at once.
    assert_eq!(t.next_attempt(t0, t0 + 3 * S, t0 + 8 * S), Some(t0 + 8 * S));
    // One that lasted until the deadline: none.
    assert_eq!(t.next_attempt(t0, t0 + 3 * S, t0 + 10 * S), None);
}

fn record(holder: Option<&str>) -> Observed {
    Observed {
        holder: holder.map(String::from),
        renew_time: None,
        duration: 15 * S,
    }
}

#[test]
fn a_standby_takes_over_only_a_free_or_expired_lease() {
    assert_eq!(decide(&record(Some("me")), 99 * S, "me"), Decision::Renew);
    assert_eq!(decide(&record(None), Duration::ZERO, "me"), Decision::Take);
    assert_eq!(decide(&record(Some("b")), 15 * S, "me"), Decision::Wait);
    assert_eq!(decide(&record(Some("b")), 16 * S, "me"), Decision::Take);
}

#[tokio::test(start_paused = true)]
async fn a_request_to_a_hung_server_ends_at_its_deadline() {
    let t0 = Instant::now();
    let hung = std::future::pending::<std::result::Result<(), kube::Error>>();
    let res = bounded("memprof-operator", "replace", t0 + 2 * S, hung).await;
    assert!(matches!(
        res,
        Err(LeaseError::Timeout { op: "replace", .. })
    ));
    assert_eq!(t0.elapsed(), 2 * S);
}

/// Renewals as a test scripts them.
struct Scripted<F>(F);

impl<F: AsyncFnMut(Instant) -> Result<bool>> Renew for Scripted<F> {
    async fn renew(&mut self, deadline: Instant) -> Result<bool> {
        (self.0)(deadline).await
    }
}

fn timeout() -> LeaseError {
    LeaseError::Timeout {
        name: "l".into(),
        op: "get",
    }
}

#[tokio::test(start_paused = true)]
async fn renewals_that_hang_end_the_term_at_the_renew_deadline() {
    let t = Timing::new(15 * S);
    let t0 = Instant::now();
    let deadlines = Arc::new(Mutex::new(Vec::new()));
    let seen = deadlines.clone();
    let stop_by = keep_with(
        t,
        t0,
        &mut Scripted(async |deadline| {
            seen.lock().unwrap().push(deadline - t0);
            // A frozen server: the request ends only because it is bounded.
            tokio::time::sleep_until(deadline).await;
            Err(timeout())
        }),
    )
    .await;
    assert_eq!(t0.elapsed(), 10 * S);
    assert_eq!(stop_by, t.stop_by(t0));
    assert_eq!(
        *deadlines.lock().unwrap(),
        vec![10 * S],
        "one attempt, bounded"
    );
}

#[tokio::test(start_paused = true)]
async fn renewals_that_fail_fast_end_the_term_at_the_renew_deadline_not_later() {
    let t = Timing::new(15 * S);
    let t0 = Instant::now();
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let seen = attempts.clone();
    keep_with(
        t,
        t0,
        &mut Scripted(async |_| {
            seen.lock().unwrap().push(secs(t0.elapsed()));
            Err(timeout())
        }),
    )
    .await;
    assert_eq!(*attempts.lock().unwrap(), vec![3.0, 6.0, 9.0]);
    assert_eq!(t0.elapsed(), 10 * S, "not at the next retry (12 s)");
}

#[tokio::test(start_paused = true)]
async fn a_term_lasts_while_renewals_succeed_and_counts_from_the_last_ones_start() {
    let t = Timing::new(15 * S);
    let t0 = Instant::now();
    let stop_by = keep_with(
        t,
        t0,
        &mut Scripted(async |deadline| {
            if t0.elapsed() < 60 * S {
                // Each renewal takes 1 s; the term counts from when it started.
                tokio::time::sleep(S).await;
                Ok(true)
            } else {
                tokio::time::sleep_until(deadline).await;
                Err(timeout())
            }
        }),
    )
    .await;
    // Renewals start every 3 s (at 3, 6, ..., 60); the one at 60 s hangs,
    // the last good one started at 57 s.
    assert_eq!(t0.elapsed(), 67 * S);
    assert_eq!(stop_by, t.stop_by(t0 + 57 * S));
}

#[tokio::test(start_paused = true)]
async fn a_lease_taken_by_another_replica_ends_the_term_at_once() {
    let t0 = Instant::now();
    keep_with(Timing::new(15 * S), t0, &mut Scripted(async |_| Ok(false))).await;
    assert_eq!(t0.elapsed(), 3 * S);
}

/// A candidate that wins at once the first time, loses its term after
/// `term`, and then never wins again.
struct Fake {
    term: Duration,
    timing: Timing,
    log: Arc<Mutex<Vec<(f64, &'static str)>>>,
    t0: Instant,
    campaigns: u32,
}

impl Fake {
    fn new(log: &Arc<Mutex<Vec<(f64, &'static str)>>>) -> Self {
        Fake {
            term: 10 * S,
            timing: Timing::new(15 * S),
            log: log.clone(),
            t0: Instant::now(),
            campaigns: 0,
        }
    }
    fn note(&self, what: &'static str) {
        self.log
            .lock()
            .unwrap()
            .push((secs(self.t0.elapsed()), what));
    }
}

impl Candidate for Fake {
    async fn campaign(&mut self) -> Instant {
        self.campaigns += 1;
        self.note("campaign");
        if self.campaigns > 1 {
            std::future::pending::<()>().await;
        }
        Instant::now()
    }
    async fn hold(&mut self, won_at: Instant) -> Instant {
        tokio::time::sleep_until(won_at + self.term).await;
        self.note("lost");
        self.timing.stop_by(won_at)
    }
    async fn resign(&mut self) {
        self.note("resign");
    }
}

/// Notes when it is dropped.
struct OnDrop(Arc<Mutex<Vec<(f64, &'static str)>>>, Instant, &'static str);
impl Drop for OnDrop {
    fn drop(&mut self) {
        self.0
            .lock()
            .unwrap()
            .push((secs(self.1.elapsed()), self.2));
    }
}

fn never() -> Stop {
    std::future::pending().boxed().shared()
}

#[tokio::test(start_paused = true)]
async fn work_that_ignores_the_stop_signal_is_dropped_before_a_standby_may_take_over() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let gauge = Gauge::default();
    let (l, g) = (log.clone(), gauge.clone());
    let lead = tokio::spawn(async move {
        let mut fake = Fake::new(&l);
        let t0 = fake.t0;
        lead_with(&mut fake, never(), g, |_stop| {
            let guard = OnDrop(l.clone(), t0, "work dropped");
            async move {
                let _guard = guard;
                // Stuck in a request to a frozen server: never looks at `stop`.
                std::future::pending::<std::result::Result<(), String>>().await
            }
        })
        .await
    });
    tokio::time::sleep(11 * S).await;
    assert_eq!(gauge.get(), 1, "still within the grace period");
    tokio::time::sleep(2 * S).await;
    assert_eq!(gauge.get(), 0);
    assert_eq!(
        *log.lock().unwrap(),
        vec![
            (0.0, "campaign"),
            (10.0, "lost"),
            (12.5, "work dropped"),
            (12.5, "campaign")
        ]
    );
    lead.abort();
}

#[tokio::test(start_paused = true)]
async fn work_that_stops_gracefully_finishes_its_step() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let gauge = Gauge::default();
    let (l, g) = (log.clone(), gauge.clone());
    let lead = tokio::spawn(async move {
        let mut fake = Fake::new(&l);
        let t0 = fake.t0;
        lead_with(&mut fake, never(), g, |stop| {
            let l = l.clone();
            async move {
                stop.await;
                tokio::time::sleep(S).await;
                OnDrop(l, t0, "work finished its step");
                Ok::<(), String>(())
            }
        })
        .await
    });
    tokio::time::sleep(20 * S).await;
    assert_eq!(gauge.get(), 0);
    assert_eq!(
        *log.lock().unwrap(),
        vec![
            (0.0, "campaign"),
            (10.0, "lost"),
            (11.0, "work finished its step"),
            (11.0, "campaign")
        ]
    );
    lead.abort();
}

#[tokio::test(start_paused = true)]
async fn shutdown_stops_the_work_and_releases_the_lease() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let gauge = Gauge::default();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let shutdown: Stop = rx.map(|_| ()).boxed().shared();
    let (l, g) = (log.clone(), gauge.clone());
    let lead = tokio::spawn(async move {
        let mut fake = Fake::new(&l);
        lead_with(&mut fake, shutdown, g, |stop| async move {
            stop.await;
            Ok::<(), String>(())
        })
        .await
    });
    tokio::time::sleep(5 * S).await;
    assert_eq!(gauge.get(), 1);
    tx.send(()).unwrap();
    lead.await.unwrap().unwrap();
    assert_eq!(gauge.get(), 0);
    assert_eq!(
        *log.lock().unwrap(),
        vec![(0.0, "campaign"), (5.0, "resign")]
    );
}

#[tokio::test(start_paused = true)]
async fn work_that_fails_is_returned_after_releasing_the_lease() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let gauge = Gauge::default();
    let mut fake = Fake::new(&log);
    let res = lead_with(&mut fake, never(), gauge.clone(), |_stop| async {
        tokio::time::sleep(S).await;
        Err::<(), _>("watch failed".to_string())
    })
    .await;
    assert_eq!(res, Err("watch failed".to_string()));
    assert_eq!(gauge.get(), 0);
    assert_eq!(
        *log.lock().unwrap(),
        vec![(0.0, "campaign"), (1.0, "resign")]
    );
}
