//! `JobRollup` against the from-scratch roll-up: random sequences of
//! upserts, removals and parallelism changes (a seeded generator, so a
//! failure names the seed that reproduces it), compared after every step.

use super::*;
use jiff::{SignedDuration, Timestamp};
use memprof_api::{
    AllocationSite, AllocationSites, AllocatorStats, DataSource, MemoryBreakdown, MemoryGrowth,
    OomBlock, OomSnapshotSummary,
};
use std::collections::BTreeMap;

const G: u64 = 1 << 30;
const BASE: i64 = 1_800_000_000;

/// splitmix64: small, seeded, good enough to shuffle test cases.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    fn pick<T: Clone>(&mut self, v: &[T]) -> T {
        v[self.below(v.len() as u64) as usize].clone()
    }
}

fn at(s: i64) -> Timestamp {
    Timestamp::from_second(BASE + s).unwrap()
}

fn gpu(rng: &mut Rng, i: u32) -> GpuReport {
    let total = rng.pick(&[40 * G, 80 * G]);
    // Few distinct values, so ties (the hard part) are common.
    let peak = rng.pick(&[0, 10 * G, 30 * G, 40 * G]).min(total);
    let used = rng.pick(&[0, 5 * G, 10 * G, 30 * G]).min(total);
    GpuReport {
        index: i,
        uuid: format!("GPU-{}", rng.below(1000)),
        total_bytes: total,
        used_bytes: if rng.chance(3) { total + 1 } else { used },
        peak_bytes: peak,
        risk: rng.pick(&[
            RiskLevel::None,
            RiskLevel::Low,
            RiskLevel::Medium,
            RiskLevel::High,
            RiskLevel::Critical,
        ]),
        time_to_oom_seconds: rng.pick(&[None, Some(30.0), Some(120.0), Some(900.5)]),
        confidence: rng.pick(&[0.5, 0.9, 1.2]),
        growth_bytes_per_second: rng.pick(&[0.0, 1e6, -5e5]),
        leak_suspected: rng.chance(20),
        fragmentation: rng.pick(&[None, Some(0.1), Some(0.4)]),
        source: DataSource::Sim,
        ..Default::default()
    }
}

fn agent(rng: &mut Rng) -> AllocatorStats {
    AllocatorStats {
        growth: rng.pick(&[MemoryGrowth::None, MemoryGrowth::Cache, MemoryGrowth::Leak]),
        advice: rng.chance(30).then(|| format!("advice {}", rng.below(3))),
        steps_per_second: rng.pick(&[None, Some(2.0), Some(3.5)]),
        oom: rng.chance(30).then(|| OomSnapshotSummary {
            time: rng
                .pick(&["2027-01-15T08:00:00Z", "2027-01-15T08:00:01Z", "garbage"])
                .into(),
            message: "CUDA out of memory".into(),
            source: "segments".into(),
            blocks: vec![OomBlock {
                size_bytes: rng.below(4),
                count: None,
                frames: vec!["train.py:1".into(); 3],
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn breakdown(rng: &mut Rng) -> MemoryBreakdown {
    let static_bytes = rng.pick(&[100u64, 200]) * (1 << 20);
    MemoryBreakdown {
        total_parameters: 10,
        trainable_parameters: if rng.chance(10) { 11 } else { 10 },
        parameters_bytes: static_bytes / 2,
        static_bytes,
        activations_peak_bytes: rng.pick(&[None, Some(50 << 20)]),
        ..Default::default()
    }
}

fn sites(rng: &mut Rng) -> AllocationSites {
    // Few distinct sizes, so ties between ranks are common; sometimes more
    // sites than a report may carry, which the roll-up cuts.
    let n = rng.pick(&[0usize, 1, 3, 10]);
    AllocationSites {
        time: "2027-01-15T08:00:00Z".into(),
        // High or critical: only the latter are listed in `criticalAllocationSites`.
        level: rng.pick(&[RiskLevel::High, RiskLevel::Critical, RiskLevel::Critical]),
        source: "history".into(),
        sites: (0..n)
            .map(|i| AllocationSite {
                file: "train.py".into(),
                line: i as u32,
                bytes: rng.pick(&[G, 2 * G]),
                blocks: 1,
                ..Default::default()
            })
            .collect(),
        unattributed_bytes: 0,
    }
}

/// A random report of one of `pods` pods (so upserts often replace one).
fn spec(rng: &mut Rng, pods: u64, ranks: u64) -> (String, MemoryReportSpec, ReportMeta) {
    let pod = rng.below(pods);
    let gpus = (0..rng.below(4) as u32).map(|i| gpu(rng, i)).collect();
    let sampled = at(rng.below(300) as i64) + SignedDuration::from_millis(rng.pick(&[0, 1, 100]));
    let mut spec = MemoryReportSpec {
        pod_name: format!("train-{pod}"),
        node_name: rng.chance(80).then(|| format!("node-{}", pod / 2)),
        rank: (!rng.chance(10)).then(|| (pod % ranks) as u32),
        sampled_at: if rng.chance(2) {
            "yesterday".into()
        } else {
            sampled.to_string()
        },
        interval_ms: 1000,
        heartbeat_seconds: rng.pick(&[None, Some(10), Some(60)]),
        gpus,
        allocator: rng.chance(50).then(|| agent(rng)),
        breakdown: rng.chance(40).then(|| breakdown(rng)),
        allocation_sites: rng.chance(40).then(|| sites(rng)),
        ..Default::default()
    };
    spec.summary.risk = rng.pick(&[RiskLevel::Low, RiskLevel::High, RiskLevel::Critical]);
    let meta = ReportMeta {
        pod_created: rng.pick(&[None, Some(at(0)), Some(at(10))]),
        received: None,
    };
    (format!("train-{pod}"), spec, meta)
}

/// What the from-scratch path counts: trust::screen's rules 5 and 6 (one
/// report per rank, the newest; the newest `report_limit` of them), then
/// validation, in (rank, name) order.
struct Reference {
    counted: Vec<(String, MemoryReportSpec)>,
    rejected: Vec<String>,
    superseded: usize,
    over_limit: usize,
}

fn reference(
    live: &BTreeMap<String, (MemoryReportSpec, ReportMeta)>,
    expected: Option<u32>,
) -> Reference {
    type Key = (Option<Timestamp>, Timestamp, String);
    let key = |name: &String, (s, m): &(MemoryReportSpec, ReportMeta)| -> Key {
        let t = s.sampled_at.parse().unwrap_or(Timestamp::MIN);
        (m.pod_created, t, name.clone())
    };
    let mut by_rank: BTreeMap<Option<u32>, Vec<Key>> = BTreeMap::new();
    for (name, v) in live {
        by_rank.entry(v.0.rank).or_default().push(key(name, v));
    }
    let (mut kept, mut superseded) = (Vec::new(), 0);
    for (rank, mut group) in by_rank {
        group.sort_by(|a, b| b.cmp(a));
        if rank.is_none() {
            // Interchangeable pods: the newest `parallelism` count.
            let keep = expected.map_or(usize::MAX, |p| p as usize);
            superseded += group.len().saturating_sub(keep);
            kept.extend(group.into_iter().take(keep));
        } else {
            superseded += group.len() - 1;
            kept.push(group.swap_remove(0));
        }
    }
    kept.sort_by(|a, b| b.cmp(a));
    let limit = expected.map_or(usize::MAX, report_limit);
    let over_limit = kept.len().saturating_sub(limit);
    kept.truncate(limit);
    let mut counted: Vec<_> = kept
        .into_iter()
        .map(|k| (k.2.clone(), live[&k.2].0.clone()))
        .collect();
    counted.sort_by(|a, b| (a.1.rank, &a.0).cmp(&(b.1.rank, &b.0)));
    let rejected = counted
        .iter()
        .filter(|(_, s)| validate_report(s).is_err())
        .map(|(n, _)| n.clone())
        .collect();
    counted.retain(|(_, s)| validate_report(s).is_ok());
    Reference {
        counted,
        rejected,
        superseded,
        over_limit,
    }
}

/// The from-scratch status, with the time to OOM aged to `now` as
/// `JobRollup::status` ages it.
fn from_scratch(r: &Reference, expected: Option<u32>, now: Timestamp) -> MemoryProfileStatus {
    let inputs: Vec<_> = r
        .counted
        .iter()
        .map(|(_, spec)| RollupInput { spec })
        .collect();
    let mut st = rollup(&inputs, expected);
    let now_s = now.as_nanosecond() as f64 / 1e9;
    let aged = |spec: &MemoryReportSpec| {
        let t: Timestamp = spec.sampled_at.parse().unwrap();
        let worst = spec.gpus.iter().min_by(|a, b| severity(a, b))?;
        let at_s = t.as_nanosecond() as f64 / 1e9;
        Some((at_s + counted_tto(worst)? - now_s).max(0.0))
    };
    st.time_to_oom_seconds = r
        .counted
        .iter()
        .filter_map(|(_, s)| aged(s))
        .min_by(|a, b| a.total_cmp(b));
    st.time_to_oom = (st.risk >= RiskLevel::Medium)
        .then(|| st.time_to_oom_seconds.map(format_duration))
        .flatten();
    for top in &mut st.top_ranks {
        let (_, spec) = r
            .counted
            .iter()
            .find(|(_, s)| s.pod_name == top.location.pod && s.rank == top.location.rank)
            .unwrap();
        top.time_to_oom_seconds = aged(spec);
    }
    st
}

/// Limits under which nothing goes stale and no level is held.
fn timeless() -> RollupLimits {
    RollupLimits {
        stale_grace: SignedDuration::from_hours(24 * 365),
        risk_dwell: SignedDuration::ZERO,
        ..Default::default()
    }
}

fn run_sequence(seed: u64, steps: usize, pods: u64, ranks: u64) {
    let mut rng = Rng(seed);
    let mut expected = Some(ranks as u32);
    let mut inc = JobRollup::new(expected, timeless());
    let mut live = BTreeMap::new();
    let now = at(1000);
    for step in 0..steps {
        match rng.below(10) {
            0..=6 => {
                let (name, spec, meta) = spec(&mut rng, pods, ranks);
                inc.upsert_with(&name, &spec, meta);
                live.insert(name, (spec, meta));
            }
            7 | 8 => {
                let name = format!("train-{}", rng.below(pods));
                inc.remove(&name);
                live.remove(&name);
            }
            _ => {
                expected = rng.pick(&[None, Some(1), Some(2), Some(ranks as u32)]);
                inc.set_expected_ranks(expected);
            }
        }
        let r = reference(&live, expected);
        let want = from_scratch(&r, expected, now);
        let got = inc.status(now);
        assert_eq!(got, want, "seed {seed}, step {step}");
        let rejected: Vec<String> = inc.rejected().map(|(n, _)| n.to_string()).collect();
        assert_eq!(rejected, r.rejected, "seed {seed}, step {step}");
        assert_eq!(
            (inc.superseded(), inc.over_limit(), inc.len()),
            (r.superseded, r.over_limit, live.len()),
            "seed {seed}, step {step}"
        );
    }
}

#[test]
fn incremental_status_equals_the_from_scratch_roll_up_after_every_event() {
    for seed in 0..300 {
        run_sequence(seed, 60, 12, 6);
    }
}

#[test]
fn equal_on_long_sequences_with_many_ranks() {
    for seed in 1000..1010 {
        run_sequence(seed, 600, 64, 40);
    }
}
