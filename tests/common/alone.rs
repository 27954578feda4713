//! Who may use the shared control plane at the same time. Every test that
//! reaches it through `common::cluster` shares it; a test that would disturb
//! the others (an operator watching every namespace profiles and remediates
//! their Jobs too) takes it [`alone`]. The tests of the one test binary run
//! side by side, so this is what keeps such a test apart from all others.

use std::cell::RefCell;
use std::sync::Arc;
use tokio::sync::{OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock};

/// Shares of a resource held by tests, and one test's turn alone.
pub struct Gate(std::sync::LazyLock<Arc<RwLock<()>>>);

thread_local! {
    /// The shares held by the test running on this thread, by gate. libtest
    /// runs each test on a thread of its own, so they are given back when the
    /// test's thread ends, however the test ends (panics included), without
    /// a guard at every call site of `cluster()`.
    static SHARES: RefCell<Vec<(usize, OwnedRwLockReadGuard<()>)>> = const { RefCell::new(Vec::new()) };
}

impl Gate {
    pub const fn new() -> Self {
        Gate(std::sync::LazyLock::new(|| Arc::new(RwLock::new(()))))
    }

    fn id(&self) -> usize {
        Arc::as_ptr(&self.0) as usize
    }

    /// Takes this test's share (waits while a test has the gate alone).
    pub async fn share(&self) {
        let id = self.id();
        if SHARES.with(|s| s.borrow().iter().any(|(g, _)| *g == id)) {
            return;
        }
        let guard = self.0.clone().read_owned().await;
        SHARES.with(|s| s.borrow_mut().push((id, guard)));
    }

    /// This test alone: waits until every other test's share is given back,
    /// and keeps new shares waiting until the guard is dropped. Tokio's lock
    /// is fair, so tests that start later cannot starve it.
    pub async fn alone(&self) -> OwnedRwLockWriteGuard<()> {
        let id = self.id();
        // This test's own share would wait for itself.
        let own = SHARES.with(|s| {
            let mut s = s.borrow_mut();
            s.iter().position(|(g, _)| *g == id).map(|i| s.remove(i))
        });
        drop(own);
        self.0.clone().write_owned().await
    }
}

/// The shared control plane of `hack/local-cluster.sh`.
pub static CLUSTER: Gate = Gate::new();

/// The cluster for this test alone, until the guard is dropped.
#[must_use = "the cluster is this test's alone only while the guard lives"]
pub async fn alone() -> OwnedRwLockWriteGuard<()> {
    CLUSTER.alone().await
}

#[cfg(test)]
mod tests {
    use super::Gate;
    use std::sync::mpsc;
    use std::time::Duration;

    /// Long enough for a waiter that is not held back to get through; the
    /// verdict never depends on it (a waiter held back never gets through).
    const SETTLE: Duration = Duration::from_millis(300);
    const LONG: Duration = Duration::from_secs(60);

    fn on_thread(f: impl std::future::Future<Output = ()> + Send + 'static) {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[tokio::test]
    async fn alone_waits_for_every_share_which_ends_with_its_test_s_thread() {
        static GATE: Gate = Gate::new();
        let (shared, end) = (mpsc::channel(), mpsc::channel::<()>());
        let (tx_shared, rx_end) = (shared.0, end.1);
        let test = std::thread::spawn(move || {
            on_thread(GATE.share());
            tx_shared.send(()).unwrap();
            rx_end.recv().unwrap();
            panic!("a test that fails still gives its share back");
        });
        shared.1.recv().unwrap();
        let waiting = tokio::spawn(GATE.alone());
        tokio::time::sleep(SETTLE).await;
        assert!(!waiting.is_finished(), "alone while another test shares");
        end.0.send(()).unwrap();
        assert!(test.join().is_err());
        let guard = tokio::time::timeout(LONG, waiting)
            .await
            .expect("alone once the other test ended")
            .unwrap();

        // While alone, a new share waits; it gets in once the guard goes.
        let (tx, rx) = mpsc::channel();
        let later = std::thread::spawn(move || {
            on_thread(GATE.share());
            tx.send(()).unwrap();
        });
        assert!(rx.recv_timeout(SETTLE).is_err(), "shared while alone");
        drop(guard);
        rx.recv_timeout(LONG).expect("shared once alone ended");
        later.join().unwrap();
    }

    #[tokio::test]
    async fn a_test_that_shares_can_still_take_the_gate_alone() {
        static GATE: Gate = Gate::new();
        GATE.share().await;
        let guard = tokio::time::timeout(LONG, GATE.alone()).await;
        assert!(guard.is_ok(), "its own share held it back");
    }
}
