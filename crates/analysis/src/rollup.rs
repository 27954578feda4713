//! Job roll-up: from every rank's report to one bounded profile status.
//!
//! [`JobRollup`] keeps a Job's roll-up up to date report by report (what the
//! operator uses); [`rollup`] computes the same from scratch over a list of
//! reports (the reference the property tests hold `JobRollup` to, and what
//! one-shot tools use).

mod aggregate;
mod entry;
mod hold;
mod job;
#[cfg(test)]
mod job_tests;
mod keys;
mod members;
mod sites;

pub use job::{JobRollup, ReportMeta, RollupLimits, MAX_STALE_LISTED};
pub use members::report_limit;
pub use sites::{critical_rank_sites, sites_section, worst_rank_sites};

use memprof_api::{
    format_bytes, format_duration, DataSource, GpuLocation, GpuReport, MemoryProfileStatus,
    MemoryReportSpec, RankSummary, ReportSummary, RiskLevel, MAX_TOP_RANKS,
};
use std::cmp::Ordering;

/// One report as the roll-up sees it.
#[derive(Clone, Debug)]
pub struct RollupInput<'a> {
    /// The report's spec.
    pub spec: &'a MemoryReportSpec,
}

/// Why a report cannot be used. The API server's schema already rejects
/// negative numbers and unknown enums; these are the cross-field checks a
/// schema on a 1.20 server cannot express. Each message names the field, so
/// the sidecar or agent that wrote it can be fixed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidReport {
    /// `sampledAt` is not a time.
    #[error("sampledAt {0:?} is not an RFC 3339 time")]
    SampledAt(String),
    /// A GPU of no memory.
    #[error("gpu {0}: totalBytes is 0")]
    NoTotal(u32),
    /// More used (or peak) than the GPU has.
    #[error("gpu {gpu}: {field} {bytes} exceeds totalBytes {total}")]
    OverTotal {
        /// The GPU's index.
        gpu: u32,
        /// `usedBytes` or `peakBytes`.
        field: &'static str,
        /// Its value.
        bytes: u64,
        /// The GPU's total.
        total: u64,
    },
    /// NaN or infinite growth or confidence.
    #[error("gpu {0}: growth and confidence must be finite numbers")]
    NotFinite(u32),
}

/// Checks a report for what the schema cannot ([`InvalidReport`]).
pub fn validate_report(spec: &MemoryReportSpec) -> Result<(), InvalidReport> {
    if spec.sampled_at.parse::<jiff::Timestamp>().is_err() {
        return Err(InvalidReport::SampledAt(spec.sampled_at.clone()));
    }
    for g in &spec.gpus {
        let over = |field, bytes| InvalidReport::OverTotal {
            gpu: g.index,
            field,
            bytes,
            total: g.total_bytes,
        };
        if g.total_bytes == 0 {
            return Err(InvalidReport::NoTotal(g.index));
        }
        if g.used_bytes > g.total_bytes {
            return Err(over("usedBytes", g.used_bytes));
        }
        if g.peak_bytes > g.total_bytes {
            return Err(over("peakBytes", g.peak_bytes));
        }
        if !g.growth_bytes_per_second.is_finite() || !g.confidence.is_finite() {
            return Err(InvalidReport::NotFinite(g.index));
        }
    }
    Ok(())
}

/// A GPU's time to OOM as the roll-up counts it: at medium risk or above.
/// Below, it is a trend too young or too irregular to trust (the sidecar's
/// own summary does not show it), and `timeToOomSeconds`, which a policy's
/// `timeToOomBelowSeconds` acts on, must not carry it.
pub fn counted_tto(g: &GpuReport) -> Option<f64> {
    g.counted_tto()
}

/// Orders GPUs from closest to OOM to farthest: risk, then time to OOM, then fullness.
fn severity(a: &GpuReport, b: &GpuReport) -> Ordering {
    let tto = |g: &GpuReport| counted_tto(g).unwrap_or(f64::INFINITY);
    let frac = |g: &GpuReport| g.peak_bytes as f64 / g.total_bytes.max(1) as f64;
    b.risk
        .cmp(&a.risk)
        .then(tto(a).total_cmp(&tto(b)))
        .then(frac(b).total_cmp(&frac(a)))
}

/// The GPU closest to OOM (the first among equals): the one whose risk,
/// time to OOM and cause a report's summary, a rank's line and the
/// profile's bottleneck all show, so no view pairs one GPU's risk with
/// another's time to OOM.
pub fn worst_gpu(gpus: &[GpuReport]) -> Option<&GpuReport> {
    gpus.iter().min_by(|a, b| severity(a, b))
}

/// A report's summary of its GPUs: the risk and time to OOM of one GPU, the
/// worst (as the roll-up takes a rank's), so the summary never pairs one
/// GPU's risk with another's time to OOM; use and peak of the fullest.
pub fn summarize(gpus: &[GpuReport], source: DataSource) -> ReportSummary {
    let fullest = gpus.iter().max_by(|a, b| {
        gpu_frac(a.used_bytes, a.total_bytes).total_cmp(&gpu_frac(b.used_bytes, b.total_bytes))
    });
    let peakiest = gpus.iter().max_by(|a, b| {
        gpu_frac(a.peak_bytes, a.total_bytes).total_cmp(&gpu_frac(b.peak_bytes, b.total_bytes))
    });
    let human = |used: u64, total: u64| {
        format!(
            "{} ({:.0}%)",
            format_bytes(used),
            100.0 * gpu_frac(used, total)
        )
    };
    let worst = worst_gpu(gpus);
    ReportSummary {
        gpu_count: gpus.len() as u32,
        risk: worst.map(|g| g.risk).unwrap_or_default(),
        time_to_oom: worst.and_then(GpuReport::counted_tto).map(format_duration),
        used: fullest.map_or("-".into(), |g| human(g.used_bytes, g.total_bytes)),
        peak: peakiest.map_or("-".into(), |g| human(g.peak_bytes, g.total_bytes)),
        source,
    }
}

fn gpu_frac(used: u64, total: u64) -> f64 {
    used as f64 / total.max(1) as f64
}

fn location(spec: &MemoryReportSpec, g: &GpuReport) -> GpuLocation {
    GpuLocation {
        rank: spec.rank,
        pod: spec.pod_name.clone(),
        node: spec.node_name.clone(),
        gpu_index: g.index,
        gpu_uuid: g.uuid.clone(),
    }
}

/// Rolls valid reports up into the analysis part of a profile status
/// (ranks, peaks, risk, time to OOM, leak, imbalance, bottleneck, top ranks).
/// Fields the operator owns otherwise (OOMs, remediations, conditions) are left
/// empty for the caller to carry over. The result's size does not depend on
/// the number of reports.
pub fn rollup(reports: &[RollupInput<'_>], expected_ranks: Option<u32>) -> MemoryProfileStatus {
    let mut st = MemoryProfileStatus {
        ranks_expected: expected_ranks,
        ..Default::default()
    };
    st.ranks_reporting = reports.len() as u32;
    st.ranks = match expected_ranks {
        Some(e) => format!("{}/{}", reports.len(), e),
        None => reports.len().to_string(),
    };
    let specs = || reports.iter().map(|r| r.spec);
    report_times(specs(), &mut st);
    let peaks = gpu_figures(specs(), &mut st);
    st.allocator = super::allocator_rollup::rollup(specs());
    st.breakdown = super::breakdown::rollup(specs());
    st.allocation_sites = worst_rank_sites(specs());
    (
        st.critical_allocation_sites,
        st.critical_ranks_with_sites_omitted,
    ) = critical_rank_sites(specs());
    worst_ranks(specs(), &mut st);
    let mean = peaks.iter().sum::<f64>() / peaks.len().max(1) as f64;
    if mean > 0.0 {
        let max = peaks.iter().cloned().fold(0.0, f64::max);
        let imbalance = ((max / mean) * 100.0).round() / 100.0;
        st.imbalance = Some(imbalance.max(1.0));
        st.imbalance_display = Some(format!("{:.2}", imbalance.max(1.0)));
    }
    if st.peak.is_empty() {
        // A 1.20 API server rejects "" in a required string field.
        st.peak = "-".into();
    }
    st
}

/// `lastReportTime` and `oldestReportTime`.
fn report_times<'a>(
    specs: impl Iterator<Item = &'a MemoryReportSpec>,
    st: &mut MemoryProfileStatus,
) {
    let mut newest: Option<jiff::Timestamp> = None;
    let mut oldest: Option<jiff::Timestamp> = None;
    for spec in specs {
        // Compared as instants, not strings: RFC 3339 text with fractional
        // seconds of different lengths does not sort by time.
        let at = spec.sampled_at.parse::<jiff::Timestamp>().ok();
        if at.is_some() && at > newest {
            newest = at;
            st.last_report_time = Some(spec.sampled_at.clone());
        }
        // The last of equals, as an ordered index's largest element is.
        if at.is_some() && (oldest.is_none() || at <= oldest) {
            oldest = at;
            st.oldest_report_time = Some(spec.sampled_at.clone());
        }
    }
}

/// The per-GPU figures (GPU count, peak, current use, fragmentation, leak
/// and its ranks); returns every GPU's peak, for the imbalance.
fn gpu_figures<'a>(
    specs: impl Iterator<Item = &'a MemoryReportSpec>,
    st: &mut MemoryProfileStatus,
) -> Vec<f64> {
    let mut peaks = Vec::new();
    let mut leak_ranks = Vec::new();
    let mut physical = std::collections::BTreeSet::new();
    for spec in specs {
        for g in &spec.gpus {
            physical.insert(g.physical_key(&spec.pod_name));
            st.gpu_count = physical.len() as u32;
            peaks.push(g.peak_bytes as f64);
            let peak_pct = 100.0 * g.peak_bytes as f64 / g.total_bytes.max(1) as f64;
            if peak_pct > st.peak_percent || st.peak == "-" {
                st.peak_percent = peak_pct.min(100.0);
                st.peak_used_bytes = g.peak_bytes;
                st.peak = format!("{} ({:.0}%)", format_bytes(g.peak_bytes), peak_pct);
            }
            let cur_pct = 100.0 * g.used_bytes as f64 / g.total_bytes.max(1) as f64;
            if cur_pct > st.current_percent || st.current_used_bytes == 0 {
                st.current_percent = cur_pct.min(100.0);
                st.current_used_bytes = g.used_bytes;
            }
            if let Some(f) = g.fragmentation {
                st.fragmentation = Some(st.fragmentation.unwrap_or(0.0).max(f));
            }
            if g.leak_suspected {
                st.leak_suspected = true;
                if let Some(rank) = spec.rank.filter(|r| !leak_ranks.contains(r)) {
                    leak_ranks.push(rank);
                }
            }
        }
    }
    leak_ranks.sort_unstable();
    leak_ranks.truncate(8);
    st.leak_ranks = leak_ranks;
    peaks
}

/// Risk, confidence, bottleneck, time to OOM and top ranks, from each
/// rank's worst GPU.
fn worst_ranks<'a>(
    specs: impl Iterator<Item = &'a MemoryReportSpec>,
    st: &mut MemoryProfileStatus,
) {
    let mut worst_per_rank: Vec<(&MemoryReportSpec, &GpuReport)> = specs
        .filter_map(|spec| Some((spec, worst_gpu(&spec.gpus)?)))
        .collect();
    worst_per_rank.sort_by(|a, b| severity(a.1, b.1));
    if let Some((spec, g)) = worst_per_rank.first() {
        st.risk = g.risk;
        st.confidence = g.confidence.clamp(0.0, 1.0);
        st.cause = g.cause.clone();
        st.bottleneck = Some(location(spec, g));
    }
    st.time_to_oom_seconds = worst_per_rank
        .iter()
        .filter_map(|(_, g)| counted_tto(g))
        .min_by(|a, b| a.total_cmp(b));
    // A time to OOM is shown only when it matters: at medium risk or above.
    if st.risk >= RiskLevel::Medium {
        st.time_to_oom = st.time_to_oom_seconds.map(format_duration);
    }
    st.top_ranks = worst_per_rank
        .iter()
        .take(MAX_TOP_RANKS)
        .map(|(spec, g)| RankSummary {
            location: location(spec, g),
            risk: g.risk,
            peak_bytes: g.peak_bytes,
            total_bytes: g.total_bytes,
            time_to_oom_seconds: counted_tto(g),
            growth_bytes_per_second: g.counted_growth().unwrap_or(0.0),
            cause: g.cause.as_ref().map(|c| c.cause),
            last_report_time: Some(spec.sampled_at.clone()),
            stale: false,
        })
        .collect();
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_api::DataSource;

    const G: u64 = 1 << 30;

    fn report(rank: u32, peak_gib: u64, risk: RiskLevel, tto: Option<f64>) -> MemoryReportSpec {
        MemoryReportSpec {
            pod_name: format!("train-{rank}"),
            node_name: Some(format!("node-{}", rank / 2)),
            rank: Some(rank),
            sampled_at: format!("2026-11-22T10:00:0{rank}Z"),
            interval_ms: 1000,
            gpus: vec![GpuReport {
                index: 0,
                uuid: format!("GPU-{rank}"),
                total_bytes: 80 * G,
                used_bytes: peak_gib * G,
                peak_bytes: peak_gib * G,
                risk,
                time_to_oom_seconds: tto,
                confidence: 0.9,
                source: DataSource::Sim,
                leak_suspected: tto.is_some(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    /// Two regular rises 5 s apart give a time to OOM of ~30 s at low risk
    /// (a pace watched too briefly to trust: the sidecar's summary hides it).
    /// It is not the Job's `timeToOomSeconds`, which `timeToOomBelowSeconds`
    /// policies act on; at medium risk it is, in both roll-ups.
    #[test]
    fn a_time_to_oom_below_medium_risk_is_not_counted() {
        let low = [
            report(0, 70, RiskLevel::Low, Some(30.0)),
            report(1, 40, RiskLevel::None, None),
        ];
        let inputs: Vec<_> = low.iter().map(|spec| RollupInput { spec }).collect();
        let st = rollup(&inputs, Some(2));
        assert_eq!(
            (st.time_to_oom_seconds, st.time_to_oom.as_deref()),
            (None, None)
        );
        assert!(st.top_ranks.iter().all(|r| r.time_to_oom_seconds.is_none()));
        let mut inc = JobRollup::new(Some(2), RollupLimits::default());
        for (i, spec) in low.iter().enumerate() {
            inc.upsert(&format!("r{i}"), spec);
        }
        let now: jiff::Timestamp = low[0].sampled_at.parse().unwrap();
        assert_eq!(inc.status(now).time_to_oom_seconds, None);

        let medium = [
            report(0, 70, RiskLevel::Medium, Some(30.0)),
            report(1, 40, RiskLevel::None, None),
        ];
        let inputs: Vec<_> = medium.iter().map(|spec| RollupInput { spec }).collect();
        assert_eq!(rollup(&inputs, Some(2)).time_to_oom_seconds, Some(30.0));
        inc.upsert("r0", &medium[0]);
        let now: jiff::Timestamp = medium[0].sampled_at.parse().unwrap();
        assert_eq!(inc.status(now).time_to_oom_seconds, Some(30.0));
    }

    /// Two reports naming one GPU (ranks sharing a card, or a rank that
    /// also reported its neighbour's GPU) count it once, in both roll-ups;
    /// a `cuda:0` the agent could not name stays each pod's own.
    #[test]
    fn a_gpu_two_reports_name_is_one_gpu() {
        let mut specs = [
            report(0, 40, RiskLevel::Low, None),
            report(1, 40, RiskLevel::Low, None),
            report(2, 40, RiskLevel::Low, None),
            report(3, 40, RiskLevel::Low, None),
        ];
        specs[1].gpus.push(GpuReport {
            uuid: "gpu-0".into(),
            ..specs[0].gpus[0].clone()
        });
        specs[2].gpus[0].uuid = "cuda:0".into();
        specs[3].gpus[0].uuid = "cuda:0".into();
        let inputs: Vec<_> = specs.iter().map(|spec| RollupInput { spec }).collect();
        assert_eq!(rollup(&inputs, Some(4)).gpu_count, 4);
        let mut inc = JobRollup::new(Some(4), RollupLimits::default());
        for (i, spec) in specs.iter().enumerate() {
            inc.upsert(&format!("r{i}"), spec);
        }
        let now: jiff::Timestamp = specs[3].sampled_at.parse().unwrap();
        assert_eq!(inc.status(now).gpu_count, 4);
        inc.remove("r1");
        assert_eq!(inc.status(now).gpu_count, 3);
    }

    #[test]
    fn rolls_up_worst_risk_smallest_tto_imbalance_and_bottleneck() {
        let specs = [
            report(0, 40, RiskLevel::Low, None),
            report(1, 40, RiskLevel::Low, None),
            report(2, 60, RiskLevel::Medium, None),
            report(3, 50, RiskLevel::High, Some(300.0)),
        ];
        let inputs: Vec<_> = specs.iter().map(|spec| RollupInput { spec }).collect();
        let st = rollup(&inputs, Some(4));
        assert_eq!(st.ranks, "4/4");
        assert_eq!(st.gpu_count, 4);
        assert_eq!(st.risk, RiskLevel::High);
        assert_eq!(st.time_to_oom_seconds, Some(300.0));
        assert_eq!(st.time_to_oom.as_deref(), Some("5m0s"));
        assert_eq!(st.imbalance, Some(1.26)); // 60 / 47.5
        let b = st.bottleneck.unwrap();
        assert_eq!(
            (b.rank, b.pod.as_str(), b.node.as_deref()),
            (Some(3), "train-3", Some("node-1"))
        );
        assert_eq!(st.peak_used_bytes, 60 * G);
        assert_eq!(st.top_ranks[0].location.rank, Some(3));
        assert_eq!(st.top_ranks[1].location.rank, Some(2));
        assert_eq!(st.leak_ranks, vec![3]);
        assert_eq!(st.last_report_time.as_deref(), Some("2026-11-22T10:00:03Z"));
    }

    #[test]
    fn the_newest_report_time_is_compared_as_an_instant_not_as_text() {
        let mut a = report(0, 40, RiskLevel::Low, None);
        let mut b = report(1, 40, RiskLevel::Low, None);
        // As text "…00.1Z" sorts after "…00.101Z", though it is earlier.
        a.sampled_at = "2026-11-22T10:00:00.1Z".into();
        b.sampled_at = "2026-11-22T10:00:00.101Z".into();
        let st = rollup(&[RollupInput { spec: &a }, RollupInput { spec: &b }], None);
        assert_eq!(
            st.last_report_time.as_deref(),
            Some("2026-11-22T10:00:00.101Z")
        );
    }

    #[test]
    fn status_size_is_bounded_whatever_the_rank_count() {
        let specs: Vec<_> = (0..2048)
            .map(|r| {
                report(
                    r,
                    10 + (r % 60) as u64,
                    RiskLevel::Medium,
                    Some(1000.0 + r as f64),
                )
            })
            .collect();
        let inputs: Vec<_> = specs.iter().map(|spec| RollupInput { spec }).collect();
        let st = rollup(&inputs, Some(2048));
        assert_eq!(st.top_ranks.len(), MAX_TOP_RANKS);
        assert_eq!(st.leak_ranks.len(), 8);
        assert!(serde_json::to_vec(&st).unwrap().len() < 16 * 1024);
    }

    #[test]
    fn no_reports_gives_no_risk_and_no_imbalance() {
        let st = rollup(&[], Some(4));
        assert_eq!(st.risk, RiskLevel::None);
        assert_eq!(st.ranks, "0/4");
        assert!(st.imbalance.is_none());
        assert!(st.bottleneck.is_none());
    }

    #[test]
    fn impossible_values_are_named() {
        let mut r = report(0, 40, RiskLevel::Low, None);
        assert!(validate_report(&r).is_ok());
        r.gpus[0].used_bytes = 81 * G;
        assert!(validate_report(&r)
            .unwrap_err()
            .to_string()
            .contains("usedBytes"));
    }
}
