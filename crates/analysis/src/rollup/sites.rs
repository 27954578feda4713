//! The worst rank's allocation sites, for the profile: of the reports that
//! carry a snapshot, the one at the highest risk, then with the most bytes
//! attributed to code, then the lowest rank (so the choice is stable).
//!
//! Pure, over report specs; feeding it from the operator's roll-up is the
//! operator's (see docs/remediation.md, "Allocation sites").

use memprof_api::{format_bytes, MemoryProfileStatus, MemoryReportSpec, RankAllocationSites};
use std::fmt::Write;

/// The sites to show for a Job, from its ranks' reports.
pub fn worst_rank_sites<'a>(
    reports: impl IntoIterator<Item = &'a MemoryReportSpec>,
) -> Option<RankAllocationSites> {
    reports
        .into_iter()
        .filter_map(|r| r.allocation_sites.as_ref().map(|s| (r, s)))
        .max_by(|(a, sa), (b, sb)| {
            let bytes = |s: &memprof_api::AllocationSites| {
                s.sites
                    .iter()
                    .map(|x| x.bytes)
                    .fold(0u64, u64::saturating_add)
            };
            a.summary
                .risk
                .cmp(&b.summary.risk)
                .then(bytes(sa).cmp(&bytes(sb)))
                // Lower rank wins a tie: max_by keeps the last maximum, so reverse.
                .then(b.rank.cmp(&a.rank))
        })
        .map(|(r, s)| RankAllocationSites {
            rank: r.rank,
            pod: r.pod_name.clone(),
            sites: s.clone(),
        })
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
}
