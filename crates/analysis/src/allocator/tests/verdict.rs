//! The verdict kept at an OOM, the ceiling, advice that names what it saw,
//! host memory, and the report section's bound.

use super::*;
use memprof_api::agent::{OomSnapshot, PushKind};

/// On the shape the H100 showed: a leak to a real OOM,
/// then the final push after the exception unwound (the step's tensors
/// freed: 0.1 % of reserved allocated, retries up). Before, the report said
/// `growth: cache`, fragmentation 0.999 and advised expandable_segments.
#[test]
fn the_verdict_kept_for_an_oom_is_the_one_from_before_it() {
    let th = Thresholds::default();
    let mut s = AgentState::new(&th);
    let rate = 1e9;
    let mut t = 0.0;
    let mut last = at(0.0, 0.0, 0.0);
    while t < 40.0 {
        let floor = 20.0 * GB + rate * t;
        last = at(floor, floor + 10.0 * GB, floor + 12.0 * GB);
        let mut p = push(t, Some(t as u64 * 10), None, last);
        p.pid = 7;
        s.observe(&p);
        t += 1.0;
    }
    assert_eq!(s.assess()[0].growth, MemoryGrowth::Leak);
    // The OOM push: `preOom` holds what the observer read before the unwinding.
    let mut oom = push(t, Some(400), None, last);
    oom.pid = 7;
    oom.kind = PushKind::Oom;
    oom.oom = Some(OomSnapshot::default());
    oom.pre_oom = Some(memprof_api::agent::PreOom {
        time: T0 + t,
        devices: oom.devices.clone(),
        ..Default::default()
    });
    // Its `devices` as an old agent sent them, after the unwinding.
    oom.devices[0].allocated_bytes = 60_000_000;
    oom.devices[0].peak_allocated_bytes = Some(60_000_000);
    s.observe(&oom);
    // The final push at exit: after the unwinding, retries climbed.
    let mut after = push(
        t + 1.0,
        Some(400),
        None,
        At {
            retries: 12,
            split: 40.0 * GB,
            ..at(0.06 * GB, 0.06 * GB, 72.0 * GB)
        },
    );
    after.pid = 7;
    s.observe(&after);
    let a = s.assess().remove(0);
    assert_eq!(a.growth, MemoryGrowth::Leak, "{a:?}");
    assert!(a.fragmentation.unwrap() < 0.25, "{a:?}");
    let advice = a.advice.clone().unwrap();
    assert!(
        advice.starts_with("leak:") && !advice.contains("expandable"),
        "{advice}"
    );
    let stats = s.stats().unwrap();
    assert!(stats.verdict_before_oom.is_some());
    assert_eq!(stats.num_ooms, 1, "an OOM push counts");
    assert!(
        stats.allocated_bytes > 50_000_000_000,
        "{}",
        stats.allocated_bytes
    );
    // Another process (a restart): a fresh history, no kept verdict.
    let mut restarted = push(t + 5.0, Some(1), None, training(0.0));
    restarted.pid = 8;
    s.observe(&restarted);
    let a = s.assess().remove(0);
    assert_ne!(a.growth, MemoryGrowth::Leak);
    assert!(s.stats().unwrap().verdict_before_oom.is_none());
}

/// The ceiling: reserved memory grows by segments, and the OOM comes when
/// the next one does not fit (the H100's leak100: 0.79 GB segments, the OOM
/// with the peak at 83.4 GB of a 84.2 GB limit).
#[test]
fn the_ceiling_is_the_last_segment_that_fits() {
    let th = Thresholds::default();
    let mut s = AgentState::new(&th);
    for (i, reserved) in [80.3, 80.3, 81.1, 81.1, 81.9].iter().enumerate() {
        s.observe(&Push {
            version: 1,
            time: T0 + i as f64,
            devices: vec![DeviceStats {
                index: 0,
                allocated_bytes: (75.0 * GB) as u64,
                reserved_bytes: (reserved * GB) as u64,
                free_bytes: Some(((84.2 - reserved) * GB) as u64),
                total_bytes: Some(TOTAL + 5_000_000_000),
                ..Default::default()
            }],
            ..Default::default()
        });
    }
    let ceiling = s.devices()[0].ceiling().unwrap();
    // 81.9 + 2 x 0.8 (the 2.3 GB free hold two more, not three).
    assert!((ceiling - 83.5 * GB).abs() < 0.05 * GB, "{ceiling}");
}

/// Fragmentation advice names the pattern it saw and sizes its cure; the
/// report carries the trend and the pattern.
#[test]
fn fragmentation_advice_names_the_size_pattern() {
    let th = Thresholds::default();
    let mut s = AgentState::new(&th);
    for i in 0..=120u64 {
        let mut p = push(
            i as f64,
            Some(i),
            None,
            At {
                retries: i / 10,
                split: 6.0 * GB,
                ..at(30.0 * GB, 30.0 * GB, 50.0 * GB)
            },
        );
        p.sizes = Some(memprof_api::agent::Sizes {
            device: Some(0),
            at: Some(T0 + (i / 10 * 10) as f64),
            source: memprof_api::agent::SizesSource::Snapshot,
            buckets: vec![
                (4096, 900),
                (1 << 20, 300),
                (8 << 20, 200),
                (64 << 20, 60),
                (256 << 20, 20),
                (1 << 30, 6),
                (2 << 30, 2),
            ],
            ..Default::default()
        });
        s.observe(&p);
    }
    let a = s.assess().remove(0);
    let advice = a.advice.clone().unwrap();
    assert!(
        advice.contains("(mixed sizes: 1488 live allocations"),
        "{advice}"
    );
    assert!(advice.contains("max_split_size_mb:1025"), "{advice}");
    let stats = s.stats().unwrap();
    assert!(stats
        .allocation_sizes
        .unwrap()
        .pattern
        .starts_with("mixed sizes"));
    let trend = &stats.fragmentation_trend;
    assert!(trend.len() >= 6 && trend.len() <= 30, "{}", trend.len());
    assert_eq!(trend.last().unwrap().alloc_retries, 12);
}

/// Through the agent's pushes: host memory in the report.
#[test]
fn host_memory_is_analysed_from_the_pushes() {
    let th = Thresholds::default();
    let mut s = AgentState::new(&th);
    for i in 0..=300u64 {
        let mut p = push(i as f64, Some(i), None, training(0.0));
        p.host = Some(memprof_api::agent::Host {
            rss_bytes: Some(6_000_000_000 + i * 2_000_000),
            limit_bytes: Some(32_000_000_000),
            working_set_bytes: Some(7_000_000_000 + i * 2_000_000),
            cgroup_usage_bytes: Some(8_000_000_000 + i * 2_000_000),
            cgroup: Some("v2".into()),
        });
        s.observe(&p);
    }
    let h = s.stats().unwrap().host.unwrap();
    assert!(h.leak_suspected, "{h:?}");
    assert!(
        (h.growth_bytes_per_second.unwrap() - 2e6).abs() < 0.2e6,
        "{h:?}"
    );
    assert!(h.time_to_limit_seconds.is_some());
    // A push with only the old top-level rssBytes still counts.
    let mut s = AgentState::new(&th);
    let mut p = push(0.0, None, None, training(0.0));
    p.rss_bytes = Some(5_000_000_000);
    s.observe(&p);
    let h = s.stats().unwrap().host.unwrap();
    assert_eq!(h.rss_bytes, Some(5_000_000_000));
}

/// The report's allocator section with every list and string at its bound
/// stays small: a MemoryReport is written whole at every update.
#[test]
fn the_allocator_section_at_its_bounds_stays_under_32_kib() {
    use memprof_api::*;
    let s = |n: usize| "x".repeat(n);
    let stats = AllocatorStats {
        allocated_bytes: u64::MAX,
        reserved_bytes: u64::MAX,
        active_bytes: Some(u64::MAX),
        inactive_split_bytes: Some(u64::MAX),
        phase: Some(s(64)),
        advice: Some(s(512)),
        phase_peaks: vec![
            PhasePeak {
                phase: s(64),
                allocated_bytes: u64::MAX
            };
            MAX_PHASES
        ],
        events: vec![
            AgentEvent {
                time: s(30),
                name: s(64),
                note: Some(s(256)),
                step: Some(u64::MAX),
                allocated_bytes: Some(u64::MAX)
            };
            MAX_REPORT_EVENTS
        ],
        oom: Some(OomSnapshotSummary {
            time: s(30),
            message: s(512),
            source: "history".into(),
            blocks: vec![
                OomBlock {
                    size_bytes: u64::MAX,
                    count: Some(u64::MAX),
                    frames: vec![s(256); MAX_REPORT_FRAMES]
                };
                MAX_REPORT_BLOCKS
            ],
            ..Default::default()
        }),
        verdict_before_oom: Some(s(30)),
        fragmentation_trend: vec![
            FragmentationPoint {
                t: i64::MAX,
                reserved_bytes: u64::MAX,
                allocated_bytes: u64::MAX,
                inactive_split_bytes: Some(u64::MAX),
                alloc_retries: u64::MAX
            };
            fragment::MAX_TREND_POINTS
        ],
        allocation_sizes: Some(AllocationSizes {
            source: "snapshot".into(),
            time: Some(s(30)),
            buckets: vec![
                SizeBucket {
                    upper_bytes: u64::MAX,
                    count: u64::MAX
                };
                32
            ],
            free_buckets: vec![
                SizeBucket {
                    upper_bytes: u64::MAX,
                    count: u64::MAX
                };
                32
            ],
            pattern: s(256),
            dominant_bytes: Some(u64::MAX),
        }),
        host: Some(HostMemory {
            rss_bytes: Some(u64::MAX),
            limit_bytes: Some(u64::MAX),
            working_set_bytes: Some(u64::MAX),
            usage_bytes: Some(u64::MAX),
            growth_bytes_per_second: Some(1e300),
            leak_suspected: true,
            time_to_limit_seconds: Some(1e300),
            advice: Some(s(512)),
        }),
        gradients: Some(GradientCheck {
            step: Some(u64::MAX),
            checked: Some(u64::MAX),
            non_finite: vec![s(128); carried::MAX_GRAD_NAMES],
            large: vec![s(128); carried::MAX_GRAD_NAMES],
            vanishing: vec![s(128); carried::MAX_GRAD_NAMES],
            global_norm: Some(1e300),
            global_norm_median: Some(1e300),
            ..Default::default()
        }),
        tracking: Some(TrackedGrowth {
            tensors: vec![
                TensorGrowth {
                    group: s(160),
                    site: Some(s(128)),
                    count: i64::MIN,
                    bytes: i64::MIN,
                };
                carried::MAX_GROWTHS
            ],
            objects: vec![
                ObjectGrowth {
                    type_: s(64),
                    count: i64::MIN,
                    live: u64::MAX,
                };
                carried::MAX_GROWTHS
            ],
            ..Default::default()
        }),
        ..Default::default()
    };
    let size = serde_json::to_vec(&stats).unwrap().len();
    // The OOM snapshot (8 blocks x 4 frames x 256 B) is a quarter of it.
    println!("allocator section at its bounds: {size} bytes");
    assert!(size < 32 * 1024, "{size}");
}
