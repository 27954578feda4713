//! The running figures of a Job's counted reports: each report adds to them
//! and takes its share back out in O(GPUs × log ranks), and the analysis
//! part of the status is read from them in O(top-K).
//!
//! Every figure is the one `super::rollup` computes from scratch over the
//! same reports walked in (rank, name) order, ties included (the property
//! tests in `job_tests.rs` hold the two to each other).

use super::entry::{seconds, Entry, Severity};
use super::keys::{GpuOrder, Multiset, OrdF64, ReportOrder};
use super::sites::{at_critical, critical_view, peak_key, SitesOrder};
use jiff::Timestamp;
use memprof_api::{
    format_bytes, AllocatorRollup, MemoryGrowth, MemoryProfileStatus, RankAllocationSites,
    RiskLevel, MAX_CRITICAL_SITE_RANKS, MAX_TOP_RANKS,
};
use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

/// Ranks listed in `leakRanks` and `allocator.cacheRanks`.
const MAX_LISTED_RANKS: usize = 8;

/// The running figures (see the module docs).
#[derive(Debug, Default)]
pub struct Aggregates {
    reports: usize,
    gpus: u64,
    /// Physical GPUs (`GpuReport::physical_key`): two reports naming one
    /// GPU count it once in `gpuCount`.
    physical: Multiset<String>,
    /// GPUs with a peak above 0, fullest first.
    peak_pct: BTreeSet<(Reverse<OrdF64>, GpuOrder)>,
    /// GPUs with some memory in use, fullest first.
    used_pct: BTreeSet<(Reverse<OrdF64>, GpuOrder)>,
    fragmentation: Multiset<OrdF64>,
    leak_gpus: u64,
    leak_ranks: Multiset<u32>,
    /// Sum and largest of per-GPU peaks, for the imbalance. Summed as
    /// integers: a running float sum would drift from the from-scratch one.
    peak_sum: u128,
    peak_max: Multiset<u64>,
    /// Each report's worst GPU, worst first.
    worst: BTreeSet<(Severity, ReportOrder)>,
    /// Each report's worst GPU's time to OOM.
    tto: Multiset<OrdF64>,
    /// Each report's worst GPU's predicted OOM instant (Unix seconds).
    oom_at: Multiset<OrdF64>,
    /// Reports by sample time, newest first.
    sampled: BTreeSet<(Reverse<Timestamp>, ReportOrder)>,
    agents: usize,
    growth: [usize; 3],
    cache_ranks: Multiset<u32>,
    advice: BTreeSet<ReportOrder>,
    slowest: BTreeSet<(OrdF64, ReportOrder)>,
    last_oom: BTreeSet<(Reverse<Timestamp>, ReportOrder)>,
    breakdown: BTreeSet<(Reverse<u64>, ReportOrder)>,
    /// Reports with allocation sites, the worst first (`sites::worst_rank_sites`).
    sites: BTreeSet<(SitesOrder, ReportOrder)>,
    /// Reports whose sites were taken at critical, the largest GPU peak
    /// first (`sites::critical_rank_sites`).
    critical_sites: BTreeSet<(Reverse<u64>, ReportOrder)>,
}

fn growth_slot(g: MemoryGrowth) -> usize {
    match g {
        MemoryGrowth::None => 0,
        MemoryGrowth::Cache => 1,
        MemoryGrowth::Leak => 2,
    }
}

fn oom_time(a: &AllocatorRollup) -> Option<Timestamp> {
    let oom = a.last_oom.as_ref()?;
    Some(oom.snapshot.time.parse().unwrap_or(Timestamp::MIN))
}

impl Aggregates {
    /// Adds (`add`) or takes back (`!add`) a valid, counted report.
    pub fn apply(&mut self, e: &Entry, add: bool) {
        self.apply_gpus(e, add);
        self.apply_rank(e, add);
        self.apply_agent(e, add);
    }

    /// Counted reports in the figures.
    pub fn reports(&self) -> usize {
        self.reports
    }

    fn apply_gpus(&mut self, e: &Entry, add: bool) {
        for (i, g) in e.gpus.iter().enumerate() {
            let at: GpuOrder = (e.order.clone(), i as u8);
            let peak = (g.peak > 0).then(|| (Reverse(OrdF64(g.peak_pct())), at.clone()));
            let used = (g.used > 0).then(|| (Reverse(OrdF64(g.used_pct())), at));
            if add {
                self.gpus += 1;
                self.peak_sum += u128::from(g.peak);
                self.leak_gpus += u64::from(g.leak);
            } else {
                self.gpus -= 1;
                self.peak_sum -= u128::from(g.peak);
                self.leak_gpus -= u64::from(g.leak);
            }
            count(&mut self.physical, Some(g.key.clone()), add);
            count(&mut self.peak_max, Some(g.peak), add);
            toggle(&mut self.peak_pct, peak, add);
            toggle(&mut self.used_pct, used, add);
            count(&mut self.fragmentation, g.fragmentation.map(OrdF64), add);
            count(&mut self.leak_ranks, e.rank().filter(|_| g.leak), add);
        }
    }

    fn apply_rank(&mut self, e: &Entry, add: bool) {
        if add {
            self.reports += 1;
        } else {
            self.reports -= 1;
        }
        toggle(
            &mut self.sampled,
            Some((Reverse(e.at), e.order.clone())),
            add,
        );
        if let Some(g) = e.worst_gpu() {
            toggle(&mut self.worst, Some((g.severity(), e.order.clone())), add);
            count(&mut self.tto, g.tto.map(OrdF64), add);
            count(&mut self.oom_at, e.oom_instant().map(OrdF64), add);
        }
    }

    fn apply_agent(&mut self, e: &Entry, add: bool) {
        let o = || e.order.clone();
        let weight = e.breakdown.as_ref().map(crate::breakdown::weight);
        toggle(&mut self.breakdown, weight.map(|w| (Reverse(w), o())), add);
        let sites = e.sites.as_ref().map(|(order, _)| (*order, o()));
        toggle(&mut self.sites, sites, add);
        let critical = e.sites.as_ref().filter(|(_, s)| at_critical(s));
        let peak = || peak_key(e.gpus.iter().map(|g| g.peak));
        toggle(
            &mut self.critical_sites,
            critical.map(|_| (peak(), o())),
            add,
        );
        let Some(a) = &e.agent else {
            return;
        };
        let sign = |n: &mut usize| if add { *n += 1 } else { *n -= 1 };
        sign(&mut self.agents);
        sign(&mut self.growth[growth_slot(a.growth)]);
        for r in &a.cache_ranks {
            count(&mut self.cache_ranks, Some(*r), add);
        }
        toggle(&mut self.advice, a.advice.as_ref().map(|_| o()), add);
        let sps = a.slowest_steps_per_second;
        toggle(&mut self.slowest, sps.map(|s| (OrdF64(s), o())), add);
        toggle(
            &mut self.last_oom,
            oom_time(a).map(|t| (Reverse(t), o())),
            add,
        );
    }

    /// Fills the analysis part of `st` as the from-scratch roll-up would,
    /// except `ranksReporting`/`ranks` (the caller knows which are stale) and
    /// the time to OOM, which is left un-aged. O(top-K + listed ranks).
    pub fn fill(&self, entries: &HashMap<Arc<str>, Entry>, st: &mut MemoryProfileStatus) {
        let entry = |o: &ReportOrder| &entries[&o.1];
        st.gpu_count = self.physical.distinct_len() as u32;
        if let Some((Reverse(OrdF64(pct)), (o, i))) = self.peak_pct.first() {
            let bytes = entry(o).gpus[*i as usize].peak;
            st.peak_percent = pct.min(100.0);
            st.peak_used_bytes = bytes;
            st.peak = format!("{} ({:.0}%)", format_bytes(bytes), pct);
        }
        if let Some((Reverse(OrdF64(pct)), (o, i))) = self.used_pct.first() {
            st.current_percent = pct.min(100.0);
            st.current_used_bytes = entry(o).gpus[*i as usize].used;
        }
        st.fragmentation = self.fragmentation.last().map(|f| 0.0f64.max(f.0));
        st.leak_suspected = self.leak_gpus > 0;
        st.leak_ranks = self
            .leak_ranks
            .distinct_iter()
            .take(MAX_LISTED_RANKS)
            .copied()
            .collect();
        if let Some((Reverse(at), o)) = self.sampled.first() {
            st.last_report_time = (*at != Timestamp::MIN).then(|| entry(o).sampled_at.clone());
        }
        if let Some((_, o)) = self.sampled.last() {
            st.oldest_report_time = Some(entry(o).sampled_at.clone());
        }
        self.fill_worst(entries, st);
        st.allocator = self.allocator(entries);
        st.breakdown = self.breakdown().map(|o| {
            entry(o)
                .breakdown
                .clone()
                .expect("only reports with a breakdown are indexed")
        });
        self.fill_sites(entries, st);
        st.imbalance = self.imbalance();
        st.imbalance_display = st.imbalance.map(|i| format!("{i:.2}"));
    }

    /// `allocationSites` and `criticalAllocationSites`: O(listed ranks).
    fn fill_sites(&self, entries: &HashMap<Arc<str>, Entry>, st: &mut MemoryProfileStatus) {
        let sites = |o: &ReportOrder| -> &RankAllocationSites {
            let (_, s) = entries[&o.1]
                .sites
                .as_ref()
                .expect("only reports with sites are indexed");
            s
        };
        st.allocation_sites = self.sites.first().map(|(_, o)| sites(o).clone());
        st.critical_allocation_sites = self
            .critical_sites
            .iter()
            .take(MAX_CRITICAL_SITE_RANKS)
            .map(|(_, o)| critical_view(sites(o)))
            .collect();
        let omitted = self
            .critical_sites
            .len()
            .saturating_sub(MAX_CRITICAL_SITE_RANKS);
        st.critical_ranks_with_sites_omitted = omitted as u32;
    }

    fn breakdown(&self) -> Option<&ReportOrder> {
        self.breakdown.first().map(|(_, o)| o)
    }

    fn fill_worst(&self, entries: &HashMap<Arc<str>, Entry>, st: &mut MemoryProfileStatus) {
        if let Some((_, o)) = self.worst.first() {
            let e = &entries[&o.1];
            let g = e.worst_gpu().expect("only reports with a GPU are indexed");
            st.risk = g.risk;
            st.confidence = g.confidence.clamp(0.0, 1.0);
            st.cause = g.cause.clone();
            st.bottleneck = Some(e.location(g));
        }
        st.time_to_oom_seconds = self.tto.first().map(|t| t.0);
        st.top_ranks = self
            .worst_entries(entries)
            .take(MAX_TOP_RANKS)
            .filter_map(Entry::summary)
            .collect();
    }

    /// The reports, closest to OOM first (reports without a GPU left out).
    pub fn worst_entries<'a>(
        &'a self,
        entries: &'a HashMap<Arc<str>, Entry>,
    ) -> impl Iterator<Item = &'a Entry> + 'a {
        self.worst.iter().map(|(_, o)| &entries[&o.1])
    }

    /// The worst risk of any counted report's GPU.
    pub fn worst_risk(&self) -> RiskLevel {
        self.worst
            .first()
            .map_or(RiskLevel::None, |((r, ..), _)| r.0)
    }

    /// The smallest predicted OOM instant of any rank's worst GPU (Unix seconds).
    pub fn first_oom_instant(&self) -> Option<f64> {
        self.oom_at.first().map(|t| t.0)
    }

    fn imbalance(&self) -> Option<f64> {
        let mean = self.peak_sum as f64 / self.gpus.max(1) as f64;
        if mean <= 0.0 {
            return None;
        }
        let max = self.peak_max.last().map_or(0.0, |m| *m as f64);
        let imbalance = ((max / mean) * 100.0).round() / 100.0;
        Some(imbalance.max(1.0))
    }

    fn allocator(&self, entries: &HashMap<Arc<str>, Entry>) -> Option<AllocatorRollup> {
        if self.agents == 0 {
            return None;
        }
        let agent = |o: &ReportOrder| entries[&o.1].agent.as_ref().expect("indexed agents");
        let growth = match self.growth {
            [_, _, leak] if leak > 0 => MemoryGrowth::Leak,
            [_, cache, _] if cache > 0 => MemoryGrowth::Cache,
            _ => MemoryGrowth::None,
        };
        let slowest = self.slowest.first();
        Some(AllocatorRollup {
            ranks_with_agent: self.agents as u32,
            growth,
            cache_ranks: self
                .cache_ranks
                .iter()
                .take(MAX_LISTED_RANKS)
                .copied()
                .collect(),
            advice: self.advice.first().and_then(|o| agent(o).advice.clone()),
            slowest_steps_per_second: slowest.map(|(s, _)| s.0),
            slowest_rank: slowest.and_then(|(_, o)| agent(o).slowest_rank),
            last_oom: self
                .last_oom
                .first()
                .and_then(|(_, o)| agent(o).last_oom.clone()),
        })
    }
}

/// Seconds from `now` to `instant` (Unix seconds), never below 0.
pub fn seconds_until(instant: f64, now: Timestamp) -> f64 {
    (instant - seconds(now)).max(0.0)
}

/// Adds `k` to or takes it from an ordered set, if there is one.
fn toggle<K: Ord>(set: &mut BTreeSet<K>, k: Option<K>, add: bool) {
    match k {
        Some(k) if add => {
            set.insert(k);
        }
        Some(k) => {
            set.remove(&k);
        }
        None => {}
    }
}

/// Adds one `k` to or takes one from a multiset, if there is one.
fn count<K: Ord>(m: &mut Multiset<K>, k: Option<K>, add: bool) {
    match k {
        Some(k) if add => m.insert(k),
        Some(k) => m.remove(&k),
        None => {}
    }
}
