//! One report as the incremental roll-up keeps it: only what the profile
//! status can show, already in the status's form, so that adding or removing
//! it touches the running figures and nothing else.

use super::keys::{OrdF64, ReportOrder};
use super::sites::{rank_sites, SitesOrder};
use jiff::{SignedDuration, Timestamp};
use memprof_api::{
    AllocatorRollup, GpuLocation, GpuReport, MemoryBreakdown, MemoryReportSpec, NamedCause,
    RankAllocationSites, RankSummary, RiskLevel,
};
use std::cmp::Reverse;
use std::sync::Arc;

/// How the from-scratch roll-up orders GPUs from closest to OOM to farthest
/// (`super::severity`): risk, then time to OOM, then fullness.
pub type Severity = (Reverse<RiskLevel>, OrdF64, Reverse<OrdF64>);

/// Which report of a rank is the newest: the newer pod, then the newer
/// sample, then the name (as `trust::screen` ordered them).
pub type DedupKey = (Option<Timestamp>, Timestamp, Arc<str>);

/// What the roll-up keeps of one GPU.
#[derive(Clone, Debug)]
pub struct Gpu {
    /// Which physical GPU (`GpuReport::physical_key`).
    pub key: String,
    pub index: u32,
    pub uuid: String,
    pub total: u64,
    pub used: u64,
    pub peak: u64,
    pub risk: RiskLevel,
    pub tto: Option<f64>,
    pub confidence: f64,
    pub growth: f64,
    pub leak: bool,
    pub fragmentation: Option<f64>,
    pub cause: Option<NamedCause>,
}

impl Gpu {
    fn of(g: &GpuReport, pod: &str) -> Self {
        Gpu {
            key: g.physical_key(pod),
            index: g.index,
            uuid: g.uuid.clone(),
            total: g.total_bytes,
            used: g.used_bytes,
            peak: g.peak_bytes,
            risk: g.risk,
            tto: super::counted_tto(g),
            confidence: g.confidence,
            growth: g.counted_growth().unwrap_or(0.0),
            leak: g.leak_suspected,
            fragmentation: g.fragmentation,
            cause: g.cause.clone(),
        }
    }

    /// Its place from closest to OOM to farthest.
    pub fn severity(&self) -> Severity {
        let tto = self.tto.unwrap_or(f64::INFINITY);
        let frac = self.peak as f64 / self.total.max(1) as f64;
        (Reverse(self.risk), OrdF64(tto), Reverse(OrdF64(frac)))
    }

    /// Peak as a percentage of total (what `peakPercent` compares).
    pub fn peak_pct(&self) -> f64 {
        100.0 * self.peak as f64 / self.total.max(1) as f64
    }

    /// Use as a percentage of total (what `currentPercent` compares).
    pub fn used_pct(&self) -> f64 {
        100.0 * self.used as f64 / self.total.max(1) as f64
    }
}

/// What the roll-up keeps of one report.
#[derive(Clone, Debug)]
pub struct Entry {
    pub order: ReportOrder,
    pub pod: String,
    pub node: Option<String>,
    pub sampled_at: String,
    /// `sampledAt` as an instant; `Timestamp::MIN` when it does not parse
    /// (then the report is invalid and counts for nothing).
    pub at: Timestamp,
    pub key: DedupKey,
    /// Why the report cannot be used, when it cannot.
    pub invalid: Option<String>,
    /// After this instant the report is stale.
    pub stale_at: Timestamp,
    pub gpus: Vec<Gpu>,
    /// Position in `gpus` of the worst GPU (the first among equals).
    pub worst: Option<usize>,
    /// The report's allocator section, rolled up on its own.
    pub agent: Option<AllocatorRollup>,
    /// The report's breakdown in the profile's form (consistent ones only).
    pub breakdown: Option<MemoryBreakdown>,
    /// The report's allocation sites, bounded, and how they rank.
    pub sites: Option<(SitesOrder, RankAllocationSites)>,
    /// Approximate memory held, bytes.
    pub bytes: usize,
}

impl Entry {
    /// The entry for `spec`, reported as `name`; `stale_after` is how long
    /// it stays fresh.
    pub fn of(
        name: Arc<str>,
        spec: &MemoryReportSpec,
        pod_created: Option<Timestamp>,
        stale_after: SignedDuration,
    ) -> Self {
        let parsed = spec.sampled_at.parse::<Timestamp>().ok();
        let at = parsed.unwrap_or(Timestamp::MIN);
        let invalid = super::validate_report(spec).err().map(|e| e.to_string());
        let gpus: Vec<Gpu> = spec
            .gpus
            .iter()
            .map(|g| Gpu::of(g, &spec.pod_name))
            .collect();
        let worst = gpus
            .iter()
            .enumerate()
            .min_by_key(|(i, g)| (g.severity(), *i))
            .map(|(i, _)| i);
        let mut e = Entry {
            order: (spec.rank, name.clone()),
            pod: spec.pod_name.clone(),
            node: spec.node_name.clone(),
            sampled_at: spec.sampled_at.clone(),
            at,
            key: (pod_created, at, name),
            invalid,
            stale_at: at.checked_add(stale_after).unwrap_or(Timestamp::MAX),
            gpus,
            worst,
            agent: crate::allocator_rollup::rollup(std::iter::once(spec)),
            breakdown: crate::breakdown::rollup(std::iter::once(spec)),
            sites: rank_sites(spec),
            bytes: 0,
        };
        e.bytes = e.approx_bytes();
        e
    }

    /// The report's rank.
    pub fn rank(&self) -> Option<u32> {
        self.order.0
    }

    /// Whether it counts for anything: valid.
    pub fn valid(&self) -> bool {
        self.invalid.is_none()
    }

    /// The worst GPU.
    pub fn worst_gpu(&self) -> Option<&Gpu> {
        self.worst.map(|i| &self.gpus[i])
    }

    /// Its worst GPU's risk (`None` without GPUs).
    pub fn risk(&self) -> RiskLevel {
        self.worst_gpu().map(|g| g.risk).unwrap_or_default()
    }

    /// Where GPU `g` is.
    pub fn location(&self, g: &Gpu) -> GpuLocation {
        GpuLocation {
            rank: self.rank(),
            pod: self.pod.clone(),
            node: self.node.clone(),
            gpu_index: g.index,
            gpu_uuid: g.uuid.clone(),
        }
    }

    /// The rank's line in `topRanks` (its worst GPU), before any aging.
    pub fn summary(&self) -> Option<RankSummary> {
        let g = self.worst_gpu()?;
        Some(RankSummary {
            location: self.location(g),
            risk: g.risk,
            peak_bytes: g.peak,
            total_bytes: g.total,
            time_to_oom_seconds: g.tto,
            growth_bytes_per_second: g.growth,
            cause: g.cause.as_ref().map(|c| c.cause),
            last_report_time: Some(self.sampled_at.clone()),
            stale: false,
        })
    }

    /// Seconds since the Unix epoch at which its worst GPU is predicted to
    /// run out: its sample time plus its time to OOM.
    pub fn oom_instant(&self) -> Option<f64> {
        let tto = self.worst_gpu()?.tto?;
        Some(seconds(self.at) + tto)
    }

    fn approx_bytes(&self) -> usize {
        let strings = self.order.1.len() * 2
            + self.pod.len()
            + self.node.as_ref().map_or(0, String::len)
            + self.sampled_at.len()
            + self.invalid.as_ref().map_or(0, String::len);
        let gpus: usize = self
            .gpus
            .iter()
            .map(|g| {
                let evidence = g.cause.as_ref().map_or(0, |c| c.evidence.len());
                std::mem::size_of::<Gpu>() + g.uuid.len() + g.key.len() + evidence
            })
            .sum();
        let agent = self.agent.as_ref().map_or(0, |a| {
            let oom = a.last_oom.as_ref().map_or(0, |o| {
                let frames: usize = o
                    .snapshot
                    .blocks
                    .iter()
                    .flat_map(|b| &b.frames)
                    .map(String::len)
                    .sum();
                o.pod.len() + o.snapshot.message.len() + frames + o.snapshot.blocks.len() * 64
            });
            std::mem::size_of::<AllocatorRollup>() + a.advice.as_ref().map_or(0, String::len) + oom
        });
        // A breakdown is bounded by its schema (6 types, 16 flags, 32 phases);
        // its JSON length is a fair measure of what it holds.
        let breakdown = self
            .breakdown
            .as_ref()
            .map_or(0, |b| serde_json::to_vec(b).map_or(0, |v| v.len()));
        let sites = self.sites.as_ref().map_or(0, |(_, s)| {
            let strings: usize = s
                .sites
                .sites
                .iter()
                .map(|x| x.file.len() + x.function.len())
                .sum();
            std::mem::size_of::<RankAllocationSites>()
                + s.pod.len()
                + s.sites.time.len()
                + s.sites.source.len()
                + s.sites.sites.len() * std::mem::size_of::<memprof_api::AllocationSite>()
                + strings
        });
        // Each entry sits in about a dozen ordered indexes (one node slot each)
        // plus four per GPU.
        let index = (12 + 4 * self.gpus.len()) * 64;
        std::mem::size_of::<Self>() + strings + gpus + agent + breakdown + sites + index
    }
}

/// An instant as seconds since the Unix epoch.
pub fn seconds(t: Timestamp) -> f64 {
    t.as_nanosecond() as f64 / 1e9
}
