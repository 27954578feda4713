//! A fair work queue of keys, shared by the controller's reconciles and the
//! status writer (client-go's workqueue, with its delaying queue).
//!
//! Why not kube-runtime's Controller scheduler: with every slot busy it
//! parks triggered objects in a `HashSet` and serves them in hash order, so
//! at 200 Jobs some waited 20–40 s while others were served at once. Here:
//! - **fair across groups, first in, first out within one**: keys are
//!   grouped (the controller groups Jobs by namespace, so by tenant), the
//!   groups with keys waiting take turns, and within a group a key
//!   triggered earlier is served earlier. A tenant with 200 Jobs queued
//!   delays another tenant's Job by one turn per busy group, not by 200;
//!   with one group (the default) this is a plain FIFO;
//! - **coalescing**: a key is in the queue at most once, however often it
//!   is triggered before it is served;
//! - **never twice at once**: a key triggered while it is being served is
//!   marked dirty and queued again (at the back) when that ends;
//! - **delays**: `add_after` serves a key no earlier than asked (the earliest
//!   of several delays wins), without holding a slot meanwhile.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// The queue; clone an `Arc` of it for every producer and worker.
#[derive(Debug)]
pub struct WorkQueue<K> {
    inner: Mutex<Inner<K>>,
    wake: Notify,
}

struct Inner<K> {
    /// Each group's keys waiting now, oldest first (no empty lane is kept).
    lanes: HashMap<String, VecDeque<K>>,
    /// The groups with keys waiting, in turn order.
    turns: VecDeque<String>,
    /// Keys in all lanes.
    waiting: usize,
    group: fn(&K) -> String,
    queued: HashSet<K>,
    running: HashSet<K>,
    dirty: HashSet<K>,
    /// Delayed keys by (due, sequence), and each key's earliest due.
    delayed: BTreeMap<(Instant, u64), K>,
    due: HashMap<K, (Instant, u64)>,
    seq: u64,
    closed: bool,
}

impl<K> std::fmt::Debug for Inner<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("waiting", &self.waiting)
            .field("groups", &self.turns.len())
            .finish_non_exhaustive()
    }
}

impl<K> Default for WorkQueue<K> {
    /// One group: a plain FIFO.
    fn default() -> Self {
        WorkQueue::grouped(|_| String::new())
    }
}

impl<K> WorkQueue<K> {
    /// A queue whose groups (`group` of each key) take turns.
    pub fn grouped(group: fn(&K) -> String) -> Self {
        WorkQueue {
            inner: Mutex::new(Inner {
                lanes: HashMap::new(),
                turns: VecDeque::new(),
                waiting: 0,
                group,
                queued: HashSet::new(),
                running: HashSet::new(),
                dirty: HashSet::new(),
                delayed: BTreeMap::new(),
                due: HashMap::new(),
                seq: 0,
                closed: false,
            }),
            wake: Notify::new(),
        }
    }
}

impl<K: Clone + Eq + Hash> Inner<K> {
    fn add(&mut self, key: K) -> bool {
        if self.running.contains(&key) {
            self.dirty.insert(key);
            return false;
        }
        if !self.queued.insert(key.clone()) {
            return false;
        }
        let group = (self.group)(&key);
        let lane = self.lanes.entry(group.clone()).or_default();
        if lane.is_empty() {
            self.turns.push_back(group);
        }
        lane.push_back(key);
        self.waiting += 1;
        true
    }

    /// The oldest key of the group whose turn it is; that group goes to
    /// the back of the turns while it has keys left.
    fn pop(&mut self) -> Option<K> {
        let group = self.turns.pop_front()?;
        let lane = self.lanes.get_mut(&group)?;
        let key = lane.pop_front();
        if lane.is_empty() {
            self.lanes.remove(&group);
        } else {
            self.turns.push_back(group);
        }
        self.waiting -= usize::from(key.is_some());
        key
    }

    /// Moves the keys that are due into the FIFO (in the order they fell due).
    fn promote(&mut self, now: Instant) {
        while let Some(entry) = self.delayed.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let key = entry.remove();
            self.due.remove(&key);
            self.add(key);
        }
    }
}

impl<K: Clone + Eq + Hash> WorkQueue<K> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<K>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `key` now (a no-op when it is queued already).
    pub fn add(&self, key: K) {
        if self.lock().add(key) {
            self.wake.notify_one();
        }
    }

    /// Queues `key` once `delay` has passed, unless it is due earlier already.
    pub fn add_after(&self, key: K, delay: Duration) {
        let at = Instant::now() + delay;
        let mut inner = self.lock();
        if let Some(&(due, seq)) = inner.due.get(&key) {
            if due <= at {
                return;
            }
            inner.delayed.remove(&(due, seq));
        }
        inner.seq += 1;
        let slot = (at, inner.seq);
        inner.delayed.insert(slot, key.clone());
        inner.due.insert(key, slot);
        drop(inner);
        // A worker asleep until a later due time must look again.
        self.wake.notify_one();
    }

    /// The next key to serve, marked running until [`Self::done`]; waits
    /// for one. `None` once the queue is closed.
    pub async fn next(&self) -> Option<K> {
        loop {
            let wait_until = {
                let mut inner = self.lock();
                if inner.closed {
                    return None;
                }
                inner.promote(Instant::now());
                if let Some(key) = inner.pop() {
                    inner.queued.remove(&key);
                    inner.running.insert(key.clone());
                    return Some(key);
                }
                inner.delayed.first_key_value().map(|((at, _), _)| *at)
            };
            let woken = self.wake.notified();
            match wait_until {
                Some(at) => {
                    tokio::select! {
                        () = woken => {}
                        () = tokio::time::sleep_until(at) => {}
                    }
                }
                None => woken.await,
            }
        }
    }

    /// Ends serving `key`: queued again at once if it was triggered meanwhile.
    pub fn done(&self, key: &K) {
        let mut inner = self.lock();
        inner.running.remove(key);
        if inner.dirty.remove(key) && inner.add(key.clone()) {
            drop(inner);
            self.wake.notify_one();
        }
    }

    /// Drops any delay of `key` (a key whose object is gone).
    pub fn forget(&self, key: &K) {
        let mut inner = self.lock();
        if let Some(slot) = inner.due.remove(key) {
            inner.delayed.remove(&slot);
        }
    }

    /// Keys waiting to be served now (for a gauge).
    pub fn len(&self) -> usize {
        self.lock().waiting
    }

    /// Whether no key waits to be served now.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keys waiting for a delay to pass.
    pub fn delayed(&self) -> usize {
        self.lock().delayed.len()
    }

    /// Wakes every worker with `None`: the queue is shutting down.
    pub fn close(&self) {
        self.lock().closed = true;
        self.wake.notify_waiters();
        // A worker between its check and its wait holds no waiter yet: a
        // stored permit reaches it.
        self.wake.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A hostile tenant queues 200 keys, then a quiet one queues one: the
    /// quiet key is served second (one turn), not 201st; within a tenant,
    /// first in, first out.
    #[tokio::test]
    async fn one_groups_load_delays_another_by_one_turn() {
        let q: WorkQueue<(String, u32)> = WorkQueue::grouped(|k| k.0.clone());
        for i in 0..200 {
            q.add(("hostile".to_string(), i));
        }
        q.add(("quiet".to_string(), 0));
        let first = q.next().await.unwrap();
        let second = q.next().await.unwrap();
        assert_eq!(first, ("hostile".to_string(), 0));
        assert_eq!(second, ("quiet".to_string(), 0));
        for i in 1..200 {
            assert_eq!(q.next().await.unwrap(), ("hostile".to_string(), i));
        }
        assert!(q.is_empty());
    }

    async fn take(q: &WorkQueue<&'static str>) -> &'static str {
        tokio::time::timeout(Duration::from_secs(3600), q.next())
            .await
            .expect("a key in time")
            .expect("open")
    }

    #[tokio::test(start_paused = true)]
    async fn keys_are_served_first_in_first_out_and_once_however_often_triggered() {
        let q = WorkQueue::default();
        for k in ["b", "a", "b", "c", "a", "b"] {
            q.add(k);
        }
        assert_eq!(q.len(), 3);
        let order = [take(&q).await, take(&q).await, take(&q).await];
        assert_eq!(order, ["b", "a", "c"]);
        assert!(q.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_triggered_while_served_runs_again_after_not_beside() {
        let q = WorkQueue::default();
        q.add("a");
        q.add("b");
        assert_eq!(take(&q).await, "a");
        q.add("a");
        q.add("a");
        // "a" is running: not served a second time at once.
        assert_eq!(take(&q).await, "b");
        assert!(q.is_empty());
        q.done(&"a");
        assert_eq!(take(&q).await, "a", "queued again once done, once");
        q.done(&"a");
        assert!(q.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn delays_hold_a_key_back_and_the_earliest_wins() {
        let q = Arc::new(WorkQueue::default());
        let t0 = Instant::now();
        q.add_after("late", Duration::from_secs(10));
        q.add_after("soon", Duration::from_secs(5));
        q.add_after("soon", Duration::from_secs(8));
        q.add_after("late", Duration::from_secs(2));
        assert_eq!(q.delayed(), 2);
        assert_eq!(take(&q).await, "late");
        assert_eq!(t0.elapsed(), Duration::from_secs(2));
        assert_eq!(take(&q).await, "soon");
        assert_eq!(t0.elapsed(), Duration::from_secs(5));
        q.add_after("x", Duration::from_secs(1));
        q.forget(&"x");
        q.add("y");
        assert_eq!(take(&q).await, "y");
        assert_eq!(q.delayed(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_sleeping_worker_wakes_for_new_work_and_for_close() {
        let q = Arc::new(WorkQueue::default());
        q.add_after("later", Duration::from_secs(3600));
        let worker = tokio::spawn({
            let q = q.clone();
            async move { q.next().await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        q.add("now");
        assert_eq!(worker.await.unwrap(), Some("now"));
        let idle = tokio::spawn({
            let q = q.clone();
            async move { (q.next().await, q.next().await) }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        q.close();
        assert_eq!(idle.await.unwrap(), (None, None));
    }
}
