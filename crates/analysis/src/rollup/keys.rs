//! Orders and multisets the incremental roll-up keeps its running figures in.
//!
//! Every "first among equals" of the from-scratch roll-up (which walks the
//! reports in (rank, report name) order and keeps the first of equal values)
//! becomes the first element of an ordered set whose key ends with that
//! order, so the incremental answer is the same report, not just the same value.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::sync::Arc;

/// An `f64` ordered by `total_cmp`, as the from-scratch roll-up compares.
#[derive(Clone, Copy, Debug)]
pub struct OrdF64(pub f64);

impl PartialEq for OrdF64 {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for OrdF64 {}
impl PartialOrd for OrdF64 {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for OrdF64 {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// Where a report comes in the from-scratch roll-up's walk: (rank, name).
pub type ReportOrder = (Option<u32>, Arc<str>);

/// Where a GPU comes in that walk: its report's place, then its position.
pub type GpuOrder = (ReportOrder, u8);

/// A counted multiset: the smallest and largest element in O(log n).
#[derive(Clone, Debug)]
pub struct Multiset<K: Ord>(BTreeMap<K, u32>);

impl<K: Ord> Default for Multiset<K> {
    fn default() -> Self {
        Multiset(BTreeMap::new())
    }
}

impl<K: Ord> Multiset<K> {
    /// Adds one `k`.
    pub fn insert(&mut self, k: K) {
        *self.0.entry(k).or_insert(0) += 1;
    }

    /// Removes one `k` (which must be there).
    pub fn remove(&mut self, k: &K) {
        if let Some(n) = self.0.get_mut(k) {
            *n -= 1;
            if *n == 0 {
                self.0.remove(k);
            }
        } else {
            debug_assert!(false, "removed an element that was never added");
        }
    }

    /// The smallest element.
    pub fn first(&self) -> Option<&K> {
        self.0.keys().next()
    }

    /// The largest element.
    pub fn last(&self) -> Option<&K> {
        self.0.keys().next_back()
    }

    /// Elements in ascending order, each as often as it was added.
    pub fn iter(&self) -> impl Iterator<Item = &K> {
        self.0
            .iter()
            .flat_map(|(k, n)| std::iter::repeat_n(k, *n as usize))
    }

    /// How many distinct elements (O(1)).
    pub fn distinct_len(&self) -> usize {
        self.0.len()
    }

    /// Each distinct element once, ascending.
    pub fn distinct_iter(&self) -> impl Iterator<Item = &K> {
        self.0.keys()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_multiset_counts_repeats_and_forgets_at_zero() {
        let mut m = Multiset::default();
        for k in [3, 1, 3, 2] {
            m.insert(k);
        }
        assert_eq!(m.iter().copied().collect::<Vec<_>>(), [1, 2, 3, 3]);
        m.remove(&3);
        assert_eq!((m.first(), m.last()), (Some(&1), Some(&3)));
        assert_eq!(m.distinct_iter().count(), 3);
        m.remove(&3);
        assert_eq!(m.last(), Some(&2));
    }

    #[test]
    fn floats_order_as_total_cmp() {
        let mut v = [OrdF64(2.0), OrdF64(f64::INFINITY), OrdF64(-1.0)];
        v.sort();
        assert_eq!(v.map(|x| x.0), [-1.0, 2.0, f64::INFINITY]);
    }
}
