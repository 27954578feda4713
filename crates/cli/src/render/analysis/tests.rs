//! The analysis sections as a person reads them.

use super::*;
use memprof_api::{MemoryReportSpec, ObjectGrowth, SizeBucket, TensorGrowth};

const M: u64 = 1 << 20;
const G: u64 = 1 << 30;

fn point(t: i64, reserved: u64, allocated: u64, retries: u64) -> FragmentationPoint {
    FragmentationPoint {
        t,
        reserved_bytes: reserved,
        allocated_bytes: allocated,
        inactive_split_bytes: Some(reserved - allocated),
        alloc_retries: retries,
    }
}

fn stats() -> AllocatorStats {
    AllocatorStats {
        allocated_bytes: 4 * G,
        reserved_bytes: 10 * G,
        verdict_before_oom: Some("2026-11-22T10:00:05Z".into()),
        fragmentation_trend: vec![
            point(1_000, 10 * G, 9 * G, 0),
            point(1_060, 10 * G, 6 * G, 1),
            point(1_120, 10 * G, 4 * G, 5),
        ],
        allocation_sizes: Some(AllocationSizes {
            source: "snapshot".into(),
            pattern: "mixed sizes: live allocations spread over 3 size classes".into(),
            dominant_bytes: Some(512 * M),
            buckets: vec![
                SizeBucket {
                    upper_bytes: M,
                    count: 40,
                },
                SizeBucket {
                    upper_bytes: 512 * M,
                    count: 6,
                },
            ],
            free_buckets: vec![SizeBucket {
                upper_bytes: 2 * M,
                count: 300,
            }],
            ..Default::default()
        }),
        host: Some(HostMemory {
            rss_bytes: Some(3 * G),
            limit_bytes: Some(16 * G),
            working_set_bytes: Some(5 * G),
            growth_bytes_per_second: Some(20.0 * M as f64),
            leak_suspected: true,
            time_to_limit_seconds: Some(563.0),
            advice: Some("a Python list keeps CPU tensors".into()),
            ..Default::default()
        }),
        gradients: Some(GradientCheck {
            step: Some(40),
            checked: Some(12),
            non_finite: vec!["fc.weight".into()],
            non_finite_count: 3,
            global_norm: None,
            first_non_finite_step: Some(38),
            ..Default::default()
        }),
        tracking: Some(TrackedGrowth {
            from_step: Some(10),
            to_step: Some(20),
            seconds: Some(30.0),
            live_tensors: Some(900),
            live_tensor_bytes: Some(2 * G),
            tensors: vec![TensorGrowth {
                group: "cuda:0 torch.float32 [1024, 1024]".into(),
                site: Some("train.py:41".into()),
                count: 10,
                bytes: 40 * M as i64,
            }],
            objects: vec![ObjectGrowth {
                type_: "builtins.list".into(),
                count: 3,
                live: 70,
            }],
        }),
        ..Default::default()
    }
}

#[test]
fn a_reports_analysis_reads_as_words_in_the_details() {
    let spec = MemoryReportSpec {
        allocator: Some(stats()),
        ..Default::default()
    };
    let mut out = String::new();
    crate::render::details::render(&mut out, &spec);
    for want in [
        "verdict kept from before the CUDA OOM at 2026-11-22T10:00:05Z",
        "fragmentation over 2m0s (3 points, 0-100%):",
        "10% -> 60%, worst 60%; retries 0 -> 5",
        "inactive split blocks now 6.0GiB of 10.0GiB reserved",
        "allocation sizes (snapshot): mixed sizes: live allocations spread over 3 size classes; most live bytes in blocks up to 512MiB",
        "live blocks by size: <=1.0MiB x40  <=512MiB x6",
        "free blocks by size: <=2.0MiB x300",
        "host memory: RSS 3.0GiB, working set 5.0GiB, limit 16.0GiB, growth +20.0MiB/s; LEAK suspected; limit reached in 9m23s",
        "advice: a Python list keeps CPU tensors",
        "gradients (step 40, 12 checked): 3 non-finite (fc.weight, +2); first non-finite at step 38",
        "grew between steps 10 to 20, 30s; 900 live tensors, 2.0GiB:",
        "+10 tensors +40.0MiB  cuda:0 torch.float32 [1024, 1024]  at train.py:41",
        "+3 builtins.list (live 70)",
    ] {
        assert!(out.contains(want), "{want:?} not in\n{out}");
    }
    // The host section replaces the bare RSS line.
    assert!(!out.contains("host memory (RSS)"), "{out}");
}

#[test]
fn the_trend_is_drawn_to_an_absolute_scale_and_healthy_gradients_say_so() {
    let mut flat = String::new();
    trend(
        &mut flat,
        &[point(0, 10 * G, 4 * G, 0), point(60, 10 * G, 4 * G, 0)],
    );
    // 60 % cached throughout: both cells at the same, mid-high level, not
    // the lowest cell a self-scaled sparkline would draw for a flat line.
    let spark: Vec<char> = flat.split("): ").nth(1).unwrap().chars().take(2).collect();
    assert_eq!(spark[0], spark[1], "{flat}");
    assert!(!matches!(spark[0], '▁' | '▂'), "{flat}");

    let mut one = String::new();
    trend(&mut one, &[point(0, 10 * G, 4 * G, 0)]);
    assert_eq!(
        one,
        "    fragmentation over the run: one interval so far, largest cache 60% of reserved\n"
    );

    let mut g = String::new();
    gradients(
        &mut g,
        &GradientCheck {
            step: Some(5),
            global_norm: Some(1.5),
            global_norm_median: Some(1.4),
            ..Default::default()
        },
    );
    assert!(
        g.contains("gradients (step 5): all finite, none unusually large or vanishing; global norm 1.500e0 (median 1.400e0)"),
        "{g}"
    );
}
