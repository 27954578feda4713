//! The worst rank's allocation sites, for the profile: of the reports that
//! carry a snapshot, the one at the highest risk, then with the most bytes
//! attributed to code, then the lowest rank (so the choice is stable).
//!
//! Pure, over report specs; feeding it from the operator's roll-up is the
//! operator's (see docs/remediation.md, "Allocation sites").

use memprof_api::{
    format_bytes, truncate_utf8, AllocationSites, MemoryProfileStatus, MemoryReportSpec,
    RankAllocationSites, RiskLevel, MAX_REPORT_SITES, MAX_SITE_FILE, MAX_SITE_FUNCTION,
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

/// The `memprof report` section: the profile's sites, else the worst of the
/// reports' (so they show before the roll-up carries them); empty when none.
pub fn sites_section<'a>(
    status: Option<&MemoryProfileStatus>,
    reports: impl IntoIterator<Item = &'a MemoryReportSpec>,
) -> String {
    let Some(w) = status
        .and_then(|s| s.allocation_sites.clone())
        .or_else(|| worst_rank_sites(reports))
    else {
        return String::new();
    };
    let rank = w.rank.map_or("-".to_string(), |r| r.to_string());
    let s = &w.sites;
    let mut out = format!(
        "  allocation sites (rank {rank}, pod {}, at {} {}, {}):\n",
        w.pod, s.level, s.time, s.source
    );
    if s.sites.is_empty() {
        out.push_str(
            "    no frames: allocation history was not recorded when this memory was allocated\n",
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
            "    {:>9}  {:>5} blocks  {}:{}{function}",
            format_bytes(x.bytes),
            x.blocks,
            x.file,
            x.line
        );
    }
    if s.unattributed_bytes > 0 {
        let _ = writeln!(
            out,
            "    {:>9}  not attributed (allocated before recording began)",
            format_bytes(s.unattributed_bytes)
        );
    }
    out
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
