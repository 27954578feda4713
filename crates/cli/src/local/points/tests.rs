//! Unit tests of `points.rs`: keys, the estimate-then-measure cycle, and
//! what a report without the agent adds.

use super::*;
use memprof_api::{AllocatorStats, FragmentationPoint, GpuReport};

const G: u64 = 1 << 30;

fn words(s: &str) -> Vec<String> {
    s.split_whitespace().map(String::from).collect()
}

fn entry(command: &str, reserved: u64) -> Entry {
    Entry {
        command: command.into(),
        world_size: 1,
        gpu: "H100-80GB".into(),
        estimate: Peaks {
            allocated_bytes: reserved - G,
            reserved_bytes: reserved,
        },
        measured: None,
    }
}

fn report(reserved_now: u64, trend_max: u64, peak_allocated: u64) -> MemoryReportSpec {
    MemoryReportSpec {
        gpus: vec![GpuReport {
            model: "NVIDIA H200".into(),
            ..Default::default()
        }],
        allocator: Some(AllocatorStats {
            reserved_bytes: reserved_now,
            allocated_bytes: G,
            peak_allocated_bytes: Some(peak_allocated),
            fragmentation_trend: vec![FragmentationPoint {
                reserved_bytes: trend_max,
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
fn a_configuration_is_its_command_without_the_interpreter_and_its_ranks() {
    assert_eq!(
        key(&words("python3 train.py --lr 3e-4"), None),
        ("train.py --lr 3e-4".to_string(), 1)
    );
    assert_eq!(
        key(&words("train.py --lr 3e-4"), None).0,
        "train.py --lr 3e-4"
    );
    assert_eq!(
        key(&words("torchrun --nproc_per_node 2 train.py"), None),
        ("train.py".to_string(), 2)
    );
    assert_eq!(key(&words("train.py"), Some(4)).1, 4, "--world-size wins");
}

/// The reserved peak is the highest the run showed (the trend's, when the
/// cache shrank since), never below the allocated peak; no agent, no point.
#[test]
fn the_measurement_is_the_trainers_allocator_peaks() {
    let m = measured(&report(10 * G, 12 * G, 11 * G)).unwrap();
    assert_eq!(
        (m.peaks.allocated_bytes, m.peaks.reserved_bytes),
        (11 * G, 12 * G)
    );
    assert_eq!(m.on, "NVIDIA H200");
    let m = measured(&report(10 * G, 0, 13 * G)).unwrap();
    assert_eq!(m.peaks.reserved_bytes, 13 * G);
    let mut no_agent = report(1, 1, 1);
    no_agent.allocator = None;
    assert_eq!(measured(&no_agent), None);
}

/// Estimate, profile, point: the profiled run's measurement lands on the
/// newest estimate of its configuration; a later estimate of a measured
/// configuration is a new entry, of a pending one replaces it.
#[test]
fn a_profiled_run_turns_the_estimate_of_its_command_into_a_point() {
    let mut p = Points::default();
    p.estimated(entry("train.py", 20 * G));
    p.estimated(entry("other.py", 5 * G));
    p.estimated(entry("train.py", 21 * G)); // pending: replaced
    assert_eq!(p.entries.len(), 2);
    assert!(p.entries.iter().all(|e| e.measured.is_none()));
    let m = measured(&report(22 * G, 22 * G, 20 * G)).unwrap();
    assert_eq!(p.profiled(("absent.py", 1), m.clone()), None);
    assert_eq!(p.profiled(("train.py", 2), m.clone()), None, "other ranks");
    let e = p.profiled(("train.py", 1), m).unwrap();
    assert_eq!(e.estimate.reserved_bytes, 21 * G);
    let measured: Vec<_> = p
        .entries
        .iter()
        .filter_map(|e| e.measured.as_ref())
        .collect();
    assert_eq!(measured.len(), 1);
    assert_eq!(measured[0].peaks.reserved_bytes, 22 * G);
    p.estimated(entry("train.py", 23 * G)); // measured: a new entry
    assert_eq!(p.entries.len(), 3);
    let kept = p.entries.iter().filter(|e| e.measured.is_some()).count();
    assert_eq!(kept, 1, "the point stays");
}

#[test]
fn the_file_is_written_whole_and_read_back() {
    let dir = std::env::temp_dir().join(format!("memprof-points-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("points.json");
    assert!(load(&path).unwrap().entries.is_empty(), "missing: empty");
    let mut p = Points::default();
    p.estimated(entry("train.py", 20 * G));
    save(&path, &p).unwrap();
    let back = load(&path).unwrap();
    assert_eq!(
        (back.kind.as_str(), back.entries.clone()),
        ("memprofPoints", p.entries)
    );
    let said = add_profiled(
        &path,
        &words("python3 train.py"),
        &report(22 * G, 0, 20 * G),
    );
    let said = said.unwrap();
    assert!(
        said.contains("point added") && said.contains("-9.1%"),
        "{said}"
    );
    assert!(load(&path).unwrap().entries[0].measured.is_some());
    let none = add_profiled(&path, &words("python3 x.py"), &report(1, 1, 1)).unwrap();
    assert!(none.contains("no estimate of `x.py`"), "{none}");
    std::fs::write(&path, "{").unwrap();
    let err = load(&path).unwrap_err().to_string();
    assert!(err.contains("memprof estimate --points"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
