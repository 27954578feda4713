//! The job's allocator numbers: from every rank's report with an agent
//! section to one bounded [`AllocatorRollup`] in the MemoryProfile.

use memprof_api::{
    truncate_utf8, AgentOomRecord, AllocatorRollup, AllocatorStats, MemoryGrowth, MemoryReportSpec,
    OomSnapshotSummary,
};

/// Ranks listed per list.
const MAX_RANKS: usize = 8;
/// OOM blocks kept in the profile.
const MAX_BLOCKS: usize = 4;
/// Frames per OOM block kept in the profile.
const MAX_FRAMES: usize = 2;

fn severity(g: MemoryGrowth) -> u8 {
    match g {
        MemoryGrowth::None => 0,
        MemoryGrowth::Cache => 1,
        MemoryGrowth::Leak => 2,
    }
}

/// Rolls the reports' allocator sections up; `None` when no rank has one.
/// The size does not depend on the number of reports.
pub fn rollup<'a>(
    reports: impl IntoIterator<Item = &'a MemoryReportSpec>,
) -> Option<AllocatorRollup> {
    let mut out = AllocatorRollup::default();
    let mut newest_oom: Option<(jiff::Timestamp, AgentOomRecord)> = None;
    for spec in reports {
        let Some(a) = &spec.allocator else {
            continue;
        };
        out.ranks_with_agent += 1;
        if severity(a.growth) > severity(out.growth) {
            out.growth = a.growth;
        }
        if a.growth == MemoryGrowth::Cache {
            if let Some(rank) = spec.rank {
                out.cache_ranks.push(rank);
            }
        }
        if out.advice.is_none() {
            out.advice = advice(spec, a);
        }
        if let Some(sps) = a.steps_per_second.filter(|s| s.is_finite()) {
            if out.slowest_steps_per_second.is_none_or(|s| sps < s) {
                out.slowest_steps_per_second = Some(sps);
                out.slowest_rank = spec.rank;
            }
        }
        if let Some(oom) = &a.oom {
            // Compared as instants; a snapshot without a readable time counts as oldest.
            let at = oom.time.parse().unwrap_or(jiff::Timestamp::MIN);
            if newest_oom.as_ref().is_none_or(|(t, _)| at > *t) {
                newest_oom = Some((at, oom_record(spec, oom)));
            }
        }
    }
    if out.ranks_with_agent == 0 {
        return None;
    }
    out.cache_ranks.sort_unstable();
    out.cache_ranks.truncate(MAX_RANKS);
    out.last_oom = newest_oom.map(|(_, r)| r);
    Some(out)
}

/// A rank's advice, saying whose it is (bounded).
fn advice(spec: &MemoryReportSpec, a: &AllocatorStats) -> Option<String> {
    let advice = a.advice.as_ref()?;
    let who = spec
        .rank
        .map_or(spec.pod_name.clone(), |r| format!("rank {r}"));
    let mut text = format!("{who}: {advice}");
    truncate_utf8(&mut text, 600);
    Some(text)
}

/// A rank's OOM snapshot as the profile keeps it (bounded).
fn oom_record(spec: &MemoryReportSpec, oom: &OomSnapshotSummary) -> AgentOomRecord {
    let mut snapshot = oom.clone();
    snapshot.blocks.truncate(MAX_BLOCKS);
    for b in &mut snapshot.blocks {
        b.frames.truncate(MAX_FRAMES);
    }
    truncate_utf8(&mut snapshot.message, 256);
    AgentOomRecord {
        pod: spec.pod_name.clone(),
        rank: spec.rank,
        snapshot,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_api::{AllocatorStats, OomBlock, OomSnapshotSummary};

    fn report(rank: u32, a: Option<AllocatorStats>) -> MemoryReportSpec {
        MemoryReportSpec {
            pod_name: format!("train-{rank}"),
            rank: Some(rank),
            allocator: a,
            ..Default::default()
        }
    }

    fn oom(time: &str, size: u64) -> OomSnapshotSummary {
        OomSnapshotSummary {
            time: time.into(),
            message: "m".repeat(512),
            source: "history".into(),
            blocks: vec![
                OomBlock {
                    size_bytes: size,
                    count: None,
                    frames: vec!["train.py:42 leak".into(); 4],
                };
                8
            ],
            ..Default::default()
        }
    }

    #[test]
    fn worst_growth_cache_ranks_first_advice_slowest_rank_newest_oom() {
        let specs = vec![
            report(0, None),
            report(
                1,
                Some(AllocatorStats {
                    growth: MemoryGrowth::Cache,
                    steps_per_second: Some(3.0),
                    advice: Some("fragmentation: …".into()),
                    oom: Some(oom("2026-11-22T10:00:09.5Z", 1)),
                    ..Default::default()
                }),
            ),
            report(
                2,
                Some(AllocatorStats {
                    growth: MemoryGrowth::Leak,
                    steps_per_second: Some(2.5),
                    oom: Some(oom("2026-11-22T10:00:10Z", 2)),
                    ..Default::default()
                }),
            ),
            report(
                3,
                Some(AllocatorStats {
                    growth: MemoryGrowth::Cache,
                    ..Default::default()
                }),
            ),
        ];
        let r = rollup(&specs).unwrap();
        assert_eq!(r.ranks_with_agent, 3);
        assert_eq!(r.growth, MemoryGrowth::Leak);
        assert_eq!(r.cache_ranks, vec![1, 3]);
        assert_eq!(r.advice.as_deref(), Some("rank 1: fragmentation: …"));
        assert_eq!(
            (r.slowest_steps_per_second, r.slowest_rank),
            (Some(2.5), Some(2))
        );
        let o = r.last_oom.unwrap();
        assert_eq!((o.pod.as_str(), o.rank), ("train-2", Some(2)));
        assert_eq!(o.snapshot.blocks.len(), 4);
        assert_eq!(o.snapshot.blocks[0].frames.len(), 2);
        assert_eq!(o.snapshot.blocks[0].size_bytes, 2);
        assert!(o.snapshot.message.len() <= 256);
    }

    #[test]
    fn no_agent_no_section_and_bounded_whatever_the_rank_count() {
        assert!(rollup(&[report(0, None)]).is_none());
        let specs: Vec<_> = (0..2048)
            .map(|r| {
                report(
                    r,
                    Some(AllocatorStats {
                        growth: MemoryGrowth::Cache,
                        advice: Some("x".repeat(512)),
                        oom: Some(oom("2026-11-22T10:00:10Z", r as u64)),
                        ..Default::default()
                    }),
                )
            })
            .collect();
        let r = rollup(&specs).unwrap();
        assert_eq!(r.cache_ranks.len(), 8);
        assert!(serde_json::to_vec(&r).unwrap().len() < 2 * 1024);
    }
}
