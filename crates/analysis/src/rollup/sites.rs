//! The worst rank's allocation sites, for the profile: of the reports that
//! carry a snapshot, the one at the highest risk, then with the most bytes
//! attributed to code, then the lowest rank (so the choice is stable).
//!
//! Pure, over report specs; feeding it from the operator's roll-up is the
//! operator's (see docs/remediation.md, "Allocation sites").

use memprof_api::{
    format_bytes, truncate_utf8, AllocationSites, MemoryProfileStatus, MemoryReportSpec,
    RankAllocationSites, RiskLevel, MAX_CRITICAL_RANK_SITES, MAX_CRITICAL_SITE_RANKS,
    MAX_REPORT_SITES, MAX_SITE_FILE, MAX_SITE_FUNCTION,
};
use std::cmp::Reverse;
use std::fmt::Write;

/// How a report's sites rank: worst first (highest risk, then most bytes
/// attributed to code); the caller breaks ties by (rank, name).
pub(super) type SitesOrder = (Reverse<RiskLevel>, Reverse<u64>);

/// A report's sites as the profile holds them, bounded as the report's
/// schema says (a report is its pod's word: the API server's schema is not
/// taken on trust), and their order.
pub(super) fn rank_sites(spec: &MemoryReportSpec) -> Option<(SitesOrder, RankAllocationSites)> {
    let s = spec.allocation_sites.as_ref()?;
    let mut sites = AllocationSites {
        sites: s.sites.iter().take(MAX_REPORT_SITES).cloned().collect(),
        ..s.clone()
    };
    truncate_utf8(&mut sites.time, 64);
    truncate_utf8(&mut sites.source, 16);
    for x in &mut sites.sites {
        truncate_utf8(&mut x.file, MAX_SITE_FILE);
        truncate_utf8(&mut x.function, MAX_SITE_FUNCTION);
    }
    let bytes = sites
        .sites
        .iter()
        .map(|x| x.bytes)
        .fold(0u64, u64::saturating_add);
    let mut pod = spec.pod_name.clone();
    truncate_utf8(&mut pod, 253);
    let order = (Reverse(spec.summary.risk), Reverse(bytes));
    Some((
        order,
        RankAllocationSites {
            rank: spec.rank,
            pod,
            sites,
        },
    ))
}

/// The sites to show for a Job, from its ranks' reports (bounded as
/// [`rank_sites`] says). Among equals the lowest rank, then the first
/// report, wins (so the choice is stable).
pub fn worst_rank_sites<'a>(
    reports: impl IntoIterator<Item = &'a MemoryReportSpec>,
) -> Option<RankAllocationSites> {
    reports
        .into_iter()
        .filter_map(|r| rank_sites(r).map(|(order, s)| ((order, r.rank), s)))
        // min_by keeps the first of equals.
        .min_by(|a, b| a.0.cmp(&b.0))
        .map(|(_, s)| s)
}

/// Whether a report's sites were taken at critical (they then belong in
/// `criticalAllocationSites`).
pub(super) fn at_critical(s: &RankAllocationSites) -> bool {
    s.sites.level == RiskLevel::Critical
}

/// How a rank comes in `criticalAllocationSites`: the largest GPU peak
/// first; the caller breaks ties by (rank, name).
pub(super) fn peak_key(spec_peaks: impl IntoIterator<Item = u64>) -> Reverse<u64> {
    Reverse(spec_peaks.into_iter().max().unwrap_or(0))
}

/// A rank's line in `criticalAllocationSites`: its largest sites only (at
/// most [`MAX_CRITICAL_RANK_SITES`]; the report's own order is not trusted).
pub(super) fn critical_view(s: &RankAllocationSites) -> RankAllocationSites {
    let mut sites = s.sites.sites.clone();
    // Stable: equal sizes keep the report's order, in both roll-ups.
    sites.sort_by_key(|x| Reverse(x.bytes));
    sites.truncate(MAX_CRITICAL_RANK_SITES);
    RankAllocationSites {
        rank: s.rank,
        pod: s.pod.clone(),
        sites: AllocationSites {
            sites,
            ..s.sites.clone()
        },
    }
}

/// Every rank's sites taken at critical, from reports walked in (rank,
/// name) order: the largest GPU peak first, at most
/// [`MAX_CRITICAL_SITE_RANKS`], and how many were left out.
pub fn critical_rank_sites<'a>(
    reports: impl IntoIterator<Item = &'a MemoryReportSpec>,
) -> (Vec<RankAllocationSites>, u32) {
    let mut all: Vec<_> = reports
        .into_iter()
        .filter_map(|r| {
            let (_, s) = rank_sites(r)?;
            let peak = peak_key(r.gpus.iter().map(|g| g.peak_bytes));
            at_critical(&s).then_some((peak, s))
        })
        .collect();
    // Stable: among equal peaks the walk's (rank, name) order stays.
    all.sort_by_key(|(peak, _)| *peak);
    let omitted = all.len().saturating_sub(MAX_CRITICAL_SITE_RANKS) as u32;
    let listed = all
        .iter()
        .take(MAX_CRITICAL_SITE_RANKS)
        .map(|(_, s)| critical_view(s))
        .collect();
    (listed, omitted)
}

/// The `memprof report` sections: the worst rank's sites, then every rank's
/// taken at critical; the profile's, else those of the reports (so they show
/// before the roll-up carries them); empty when none.
pub fn sites_section<'a>(
    status: Option<&MemoryProfileStatus>,
    reports: impl IntoIterator<Item = &'a MemoryReportSpec> + Clone,
) -> String {
    let Some(w) = status
        .and_then(|s| s.allocation_sites.clone())
        .or_else(|| worst_rank_sites(reports.clone()))
    else {
        return String::new();
    };
    let mut out = format!("  allocation sites ({}):\n", rank_heading(&w));
    site_lines(&mut out, &w.sites, "    ");
    let (critical, omitted) = match status {
        Some(s) if !s.critical_allocation_sites.is_empty() => (
            s.critical_allocation_sites.clone(),
            s.critical_ranks_with_sites_omitted,
        ),
        _ => critical_rank_sites(reports),
    };
    out.push_str(&critical_section(&critical, omitted));
    out
}

/// "rank R, pod P, at LEVEL TIME SOURCE".
fn rank_heading(w: &RankAllocationSites) -> String {
    let rank = w.rank.map_or("-".to_string(), |r| r.to_string());
    let s = &w.sites;
    format!(
        "rank {rank}, pod {}, at {} {}, {}",
        w.pod, s.level, s.time, s.source
    )
}

/// Every rank's sites taken at critical, each under its heading, and how
/// many ranks the bound left out; empty when none.
fn critical_section(critical: &[RankAllocationSites], omitted: u32) -> String {
    if critical.is_empty() {
        return String::new();
    }
    let mut out = format!(
        "  allocation sites at critical, every rank (largest peak first, top {MAX_CRITICAL_RANK_SITES} each):\n"
    );
    for w in critical {
        let _ = writeln!(out, "    {}:", rank_heading(w));
        site_lines(&mut out, &w.sites, "      ");
    }
    if omitted > 0 {
        let _ = writeln!(
            out,
            "    {omitted} more ranks at critical not listed (at most {MAX_CRITICAL_SITE_RANKS})"
        );
    }
    out
}

/// One line per site, then the bytes no frame names.
fn site_lines(out: &mut String, s: &AllocationSites, indent: &str) {
    if s.sites.is_empty() {
        let _ = writeln!(
            out,
            "{indent}no frames: allocation history was not recorded when this memory was allocated"
        );
    }
    for x in &s.sites {
        let function = if x.function.is_empty() {
            String::new()
        } else {
            format!(" ({})", x.function)
        };
        let _ = writeln!(
            out,
            "{indent}{:>9}  {:>5} blocks  {}:{}{function}",
            format_bytes(x.bytes),
            x.blocks,
            x.file,
            x.line
        );
    }
    if s.unattributed_bytes > 0 {
        let _ = writeln!(
            out,
            "{indent}{:>9}  not attributed (allocated before recording began)",
            format_bytes(s.unattributed_bytes)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_api::{AllocationSite, AllocationSites, RiskLevel};

    fn report(rank: u32, risk: RiskLevel, bytes: Option<u64>) -> MemoryReportSpec {
        let mut r = MemoryReportSpec {
            pod_name: format!("train-{rank}"),
            rank: Some(rank),
            ..Default::default()
        };
        r.summary.risk = risk;
        r.allocation_sites = bytes.map(|b| AllocationSites {
            sites: vec![AllocationSite {
                file: "train.py".into(),
                line: rank,
                bytes: b,
                blocks: 1,
                ..Default::default()
            }],
            ..Default::default()
        });
        r
    }

    #[test]
    fn the_worst_rank_with_sites_is_shown() {
        use RiskLevel::{Critical, High};
        assert_eq!(worst_rank_sites(&[report(0, Critical, None)]), None);
        let rs = [
            report(0, High, Some(900)),
            report(1, Critical, Some(100)),
            report(2, Critical, Some(300)),
            report(3, Critical, None),
            report(4, Critical, Some(300)),
        ];
        let w = worst_rank_sites(&rs).unwrap();
        assert_eq!((w.rank, w.pod.as_str()), (Some(2), "train-2"));
        assert_eq!(w.sites.sites[0].line, 2);
        let text = sites_section(None, &rs);
        assert!(
            text.starts_with("  allocation sites (rank 2, pod train-2, at none , ):\n"),
            "{text}"
        );
        assert!(text.contains("  train.py:2\n"), "{text}");
        // The profile's choice wins over the reports'.
        let status = MemoryProfileStatus {
            allocation_sites: worst_rank_sites(&rs[..1]),
            ..Default::default()
        };
        assert!(sites_section(Some(&status), &rs).contains("(rank 0, pod train-0"));
        assert_eq!(sites_section(None, &rs[3..4]), "");
    }

    /// A report of `rank` whose agent took its sites at `level`, with a GPU
    /// peak of `peak` and sites of the given sizes (in the report's order).
    fn at(rank: u32, level: RiskLevel, peak: u64, sizes: &[u64]) -> MemoryReportSpec {
        let mut r = report(rank, RiskLevel::Critical, Some(1));
        r.gpus = vec![memprof_api::GpuReport {
            total_bytes: 100,
            peak_bytes: peak,
            ..Default::default()
        }];
        let s = r.allocation_sites.as_mut().unwrap();
        s.level = level;
        s.sites = sizes
            .iter()
            .enumerate()
            .map(|(i, b)| AllocationSite {
                file: format!("r{rank}.py"),
                line: i as u32,
                bytes: *b,
                ..Default::default()
            })
            .collect();
        r
    }

    #[test]
    fn every_rank_at_critical_is_listed_largest_peak_first_with_its_top_sites() {
        use RiskLevel::{Critical, High};
        let rs = [
            at(0, High, 99, &[5]),
            at(1, Critical, 10, &[1, 9, 3, 7, 5, 8]),
            at(2, Critical, 50, &[4]),
            report(3, Critical, None),
            at(4, Critical, 50, &[]),
        ];
        let (listed, omitted) = critical_rank_sites(&rs);
        assert_eq!(omitted, 0);
        let ranks: Vec<_> = listed.iter().map(|w| w.rank.unwrap()).collect();
        // Rank 0's sites were taken at high; 2 and 4 tie on peak: by rank.
        assert_eq!(ranks, [2, 4, 1]);
        let lines: Vec<_> = listed[2].sites.sites.iter().map(|x| x.line).collect();
        // The four largest, largest first, whatever order the report gave.
        assert_eq!(lines, [1, 5, 3, 4]);
        let text = sites_section(None, &rs);
        assert!(
            text.contains("  allocation sites at critical, every rank (largest peak first, top 4 each):\n    rank 2, pod train-2, at critical , :\n"),
            "{text}"
        );
        assert!(
            text.contains("    rank 4, pod train-4, at critical , :\n      no frames"),
            "{text}"
        );
        assert!(!text.contains("more ranks at critical"), "{text}");
    }

    #[test]
    fn ranks_at_critical_beyond_the_bound_are_counted_not_dropped() {
        let rs: Vec<_> = (0..20)
            .map(|r| at(r, RiskLevel::Critical, u64::from(r), &[1]))
            .collect();
        let (listed, omitted) = critical_rank_sites(&rs);
        assert_eq!((listed.len(), omitted), (MAX_CRITICAL_SITE_RANKS, 4));
        assert_eq!((listed[0].rank, listed[15].rank), (Some(19), Some(4)));
        let text = sites_section(None, &rs);
        assert!(
            text.contains("    4 more ranks at critical not listed (at most 16)\n"),
            "{text}"
        );
        // The profile's list wins over the reports'.
        let status = MemoryProfileStatus {
            allocation_sites: worst_rank_sites(&rs),
            critical_allocation_sites: listed[..1].to_vec(),
            critical_ranks_with_sites_omitted: 19,
            ..Default::default()
        };
        let text = sites_section(Some(&status), &rs);
        assert!(text.contains("    19 more ranks at critical"), "{text}");
        assert!(!text.contains("rank 18,"), "{text}");
    }

    #[test]
    fn the_roll_up_carries_the_worst_ranks_sites_bounded() {
        use crate::rollup::{rollup, RollupInput};
        let mut big = report(1, RiskLevel::Critical, Some(10));
        let s = big.allocation_sites.as_mut().unwrap();
        s.sites = (0..20)
            .map(|i| AllocationSite {
                file: "x".repeat(1000),
                line: i,
                bytes: 1,
                ..Default::default()
            })
            .collect();
        let rs = [report(0, RiskLevel::High, Some(1 << 30)), big];
        let inputs: Vec<_> = rs.iter().map(|spec| RollupInput { spec }).collect();
        let st = rollup(&inputs, None);
        let w = st.allocation_sites.expect("the critical rank's sites");
        assert_eq!(w.rank, Some(1));
        assert_eq!(w.sites.sites.len(), MAX_REPORT_SITES);
        assert!(w.sites.sites.iter().all(|x| x.file.len() <= MAX_SITE_FILE));
        assert_eq!(rollup(&inputs[..0], None).allocation_sites, None);
    }
}
