//! Which of a Job's genuine reports count, kept as reports come and go:
//! 1. one per rank: a retried pod's leftover report (an earlier pod of the
//!    same rank) is superseded by the newest pod's; of the reports without
//!    a rank (a Job that is not Indexed: its pods are interchangeable), the
//!    newest `parallelism` pods' count, so a failed attempt's report is
//!    superseded by its replacement's, as a rank's is;
//! 2. at most `limit` of them, the newest first, so a Job cannot be made to
//!    carry more ranks than it can have.
//!
//! The rules `trust::screen` applied to the whole list at every reconcile,
//! here in O(log n) per report event. Every change of whether a report
//! counts is handed back, so the caller adds it to or takes it out of the
//! running figures.

use super::entry::DedupKey;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

/// A report started (`true`) or stopped (`false`) counting.
pub type Change = (Arc<str>, bool);

/// Most reports counted for a Job of `parallelism` pods: retries and
/// restarts briefly leave more pods than `parallelism`, never many more.
pub fn report_limit(parallelism: u32) -> usize {
    (parallelism as usize).saturating_mul(2).saturating_add(4)
}

/// The membership (see the module docs).
#[derive(Debug)]
pub struct Members {
    /// Every report of each rank, newest last.
    by_rank: HashMap<u32, BTreeSet<DedupKey>>,
    /// The newest report of each rank and every report without one, split
    /// at the limit: every key in `counted` is newer than every key in `excess`.
    counted: BTreeSet<DedupKey>,
    excess: BTreeSet<DedupKey>,
    limit: usize,
    /// Reports without a rank: the newest `rankless_keep` (in the pool of
    /// `counted` and `excess`), and the older ones, superseded.
    rankless_in: BTreeSet<DedupKey>,
    rankless_out: BTreeSet<DedupKey>,
    rankless_keep: usize,
    superseded: usize,
}

impl Members {
    /// No reports, for a Job of `parallelism` pods (`None`: unknown).
    pub fn for_parallelism(parallelism: Option<u32>) -> Self {
        let mut m = Members::new(parallelism.map_or(usize::MAX, report_limit));
        m.rankless_keep = parallelism.map_or(usize::MAX, |p| p as usize);
        m
    }

    /// The Job's parallelism changed (`None`: unknown).
    pub fn set_parallelism(&mut self, parallelism: Option<u32>, out: &mut Vec<Change>) {
        self.set_limit(parallelism.map_or(usize::MAX, report_limit), out);
        self.set_rankless_keep(parallelism.map_or(usize::MAX, |p| p as usize), out);
    }

    /// No reports; at most `limit` counted.
    pub fn new(limit: usize) -> Self {
        Members {
            by_rank: HashMap::new(),
            counted: BTreeSet::new(),
            excess: BTreeSet::new(),
            limit,
            rankless_in: BTreeSet::new(),
            rankless_out: BTreeSet::new(),
            rankless_keep: usize::MAX,
            superseded: 0,
        }
    }

    /// Reports counted.
    #[cfg(test)]
    pub fn counted(&self) -> usize {
        self.counted.len()
    }

    /// Genuine reports of a rank that has a newer one.
    pub fn superseded(&self) -> usize {
        self.superseded
    }

    /// Reports beyond the limit.
    pub fn over_limit(&self) -> usize {
        self.excess.len()
    }

    /// Adds a report of `rank`.
    pub fn insert(&mut self, key: DedupKey, rank: Option<u32>, out: &mut Vec<Change>) {
        let Some(rank) = rank else {
            return self.insert_rankless(key, out);
        };
        let reports = self.by_rank.entry(rank).or_default();
        let newest = reports.last().cloned();
        reports.insert(key.clone());
        match newest {
            Some(old) if old > key => self.superseded += 1,
            Some(old) => {
                self.superseded += 1;
                self.leave(&old, out);
                self.enter(key, out);
            }
            None => self.enter(key, out),
        }
    }

    /// Removes a report of `rank` (which must be there).
    pub fn remove(&mut self, key: &DedupKey, rank: Option<u32>, out: &mut Vec<Change>) {
        let Some(rank) = rank else {
            return self.remove_rankless(key, out);
        };
        let Some(reports) = self.by_rank.get_mut(&rank) else {
            return debug_assert!(false, "removed a report that was never added");
        };
        let was_newest = reports.last() == Some(key);
        reports.remove(key);
        let next = reports.last().cloned();
        if reports.is_empty() {
            self.by_rank.remove(&rank);
        }
        if !was_newest {
            self.superseded -= 1;
            return;
        }
        self.leave(key, out);
        if let Some(next) = next {
            self.superseded -= 1;
            self.enter(next, out);
        }
    }

    /// Counts at most `limit` reports from now on.
    pub fn set_limit(&mut self, limit: usize, out: &mut Vec<Change>) {
        self.limit = limit;
        self.rebalance(out);
    }

    /// Counts the newest `keep` reports without a rank from now on (the
    /// Job's parallelism; `usize::MAX`: every one).
    pub fn set_rankless_keep(&mut self, keep: usize, out: &mut Vec<Change>) {
        self.rankless_keep = keep;
        while self.rankless_in.len() > keep {
            let oldest = self.rankless_in.pop_first().expect("more than kept");
            self.supersede(oldest, out);
        }
        while self.rankless_in.len() < keep {
            let Some(newest) = self.rankless_out.pop_last() else {
                break;
            };
            self.superseded -= 1;
            self.rankless_in.insert(newest.clone());
            self.enter(newest, out);
        }
    }

    fn insert_rankless(&mut self, key: DedupKey, out: &mut Vec<Change>) {
        let full = self.rankless_in.len() >= self.rankless_keep;
        match self.rankless_in.first() {
            Some(oldest) if full && *oldest > key => {
                self.superseded += 1;
                self.rankless_out.insert(key);
                return;
            }
            _ if full => {
                let oldest = self.rankless_in.pop_first().expect("full, so not empty");
                self.supersede(oldest, out);
            }
            _ => {}
        }
        self.rankless_in.insert(key.clone());
        self.enter(key, out);
    }

    fn remove_rankless(&mut self, key: &DedupKey, out: &mut Vec<Change>) {
        if self.rankless_out.remove(key) {
            self.superseded -= 1;
            return;
        }
        self.rankless_in.remove(key);
        self.leave(key, out);
        if let Some(next) = self.rankless_out.pop_last() {
            self.superseded -= 1;
            self.rankless_in.insert(next.clone());
            self.enter(next, out);
        }
    }

    /// Takes a counted report without a rank out, superseded by a newer one.
    fn supersede(&mut self, key: DedupKey, out: &mut Vec<Change>) {
        self.leave(&key, out);
        self.superseded += 1;
        self.rankless_out.insert(key);
    }

    fn enter(&mut self, key: DedupKey, out: &mut Vec<Change>) {
        if self.excess.last().is_some_and(|e| *e > key) {
            self.excess.insert(key);
        } else {
            out.push((key.2.clone(), true));
            self.counted.insert(key);
        }
        self.rebalance(out);
    }

    fn leave(&mut self, key: &DedupKey, out: &mut Vec<Change>) {
        if self.counted.remove(key) {
            out.push((key.2.clone(), false));
        } else {
            self.excess.remove(key);
        }
        self.rebalance(out);
    }

    /// Keeps `counted` at the limit with the newest reports.
    fn rebalance(&mut self, out: &mut Vec<Change>) {
        while self.counted.len() > self.limit {
            let oldest = self.counted.pop_first().expect("more than the limit");
            out.push((oldest.2.clone(), false));
            self.excess.insert(oldest);
        }
        while self.counted.len() < self.limit {
            let Some(newest) = self.excess.pop_last() else {
                break;
            };
            out.push((newest.2.clone(), true));
            self.counted.insert(newest);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::Timestamp;

    fn key(created: i64, sampled: i64, name: &str) -> DedupKey {
        let t = |s| Some(Timestamp::from_second(1_800_000_000 + s).unwrap());
        (t(created), t(sampled).unwrap(), Arc::from(name))
    }

    fn names(out: &[Change]) -> Vec<(String, bool)> {
        out.iter().map(|(n, c)| (n.to_string(), *c)).collect()
    }

    #[test]
    fn the_newest_pod_of_a_rank_supersedes_its_predecessors_leftover() {
        let mut m = Members::new(10);
        let mut out = vec![];
        let old = key(0, 95, "train-0-a");
        let new = key(50, 90, "train-0-b");
        m.insert(old.clone(), Some(0), &mut out);
        m.insert(new.clone(), Some(0), &mut out);
        assert_eq!(
            names(&out),
            [
                ("train-0-a".into(), true),
                ("train-0-a".into(), false),
                ("train-0-b".into(), true)
            ]
        );
        assert_eq!((m.counted(), m.superseded()), (1, 1));
        // The newer pod goes away: the leftover counts again.
        out.clear();
        m.remove(&new, Some(0), &mut out);
        assert_eq!(
            names(&out),
            [("train-0-b".into(), false), ("train-0-a".into(), true)]
        );
        assert_eq!((m.counted(), m.superseded()), (1, 0));
    }

    /// A Job that is not Indexed, parallelism 1 (backoffLimit 3): pod A
    /// OOMs and is kept as Failed, pod B replaces it. Only B counts; B gone,
    /// A counts again; two at parallelism 2.
    #[test]
    fn without_ranks_the_newest_parallelism_pods_count() {
        let mut m = Members::for_parallelism(Some(1));
        let mut out = vec![];
        let (a, b) = (key(0, 95, "train-a"), key(50, 90, "train-b"));
        m.insert(a.clone(), None, &mut out);
        m.insert(b.clone(), None, &mut out);
        assert_eq!(
            names(&out),
            [
                ("train-a".into(), true),
                ("train-a".into(), false),
                ("train-b".into(), true)
            ]
        );
        assert_eq!((m.counted(), m.superseded()), (1, 1));
        // A late report of the failed attempt does not count either.
        out.clear();
        m.remove(&a, None, &mut out);
        let a2 = key(0, 99, "train-a");
        m.insert(a2.clone(), None, &mut out);
        assert!(out.is_empty(), "{out:?}");
        assert_eq!((m.counted(), m.superseded()), (1, 1));
        out.clear();
        m.set_parallelism(Some(2), &mut out);
        assert_eq!(names(&out), [("train-a".into(), true)]);
        assert_eq!((m.counted(), m.superseded()), (2, 0));
        out.clear();
        m.set_parallelism(Some(1), &mut out);
        m.remove(&b, None, &mut out);
        assert_eq!(
            names(&out),
            [
                ("train-a".into(), false),
                ("train-b".into(), false),
                ("train-a".into(), true)
            ]
        );
        assert_eq!((m.counted(), m.superseded()), (1, 0));
    }

    #[test]
    fn beyond_the_limit_the_newest_count_and_the_limit_can_move() {
        let mut m = Members::new(2);
        let mut out = vec![];
        for i in 0..4 {
            m.insert(key(i, 90, &format!("p{i}")), Some(i as u32), &mut out);
        }
        assert_eq!((m.counted(), m.over_limit()), (2, 2));
        out.clear();
        m.set_limit(3, &mut out);
        assert_eq!(names(&out), [("p1".into(), true)]);
        out.clear();
        m.remove(&key(3, 90, "p3"), Some(3), &mut out);
        assert_eq!(names(&out), [("p3".into(), false), ("p0".into(), true)]);
        assert_eq!(report_limit(1), 6);
    }
}
