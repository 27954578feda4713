//! Checks of contract C's push fields.

use super::super::{parse, validate, DeviceStats, Error, Push, PushKind, VERSION};
use super::*;

const G: u64 = 1 << 30;

fn device(index: u32) -> DeviceStats {
    DeviceStats {
        index,
        allocated_bytes: 30 * G,
        reserved_bytes: 40 * G,
        free_bytes: Some(39 * G),
        total_bytes: Some(80 * G),
        ..Default::default()
    }
}

fn push() -> Push {
    Push {
        version: VERSION,
        time: 1.8e9,
        devices: vec![device(0)],
        ..Default::default()
    }
}

/// Every contract C field with every list and string at its bound (used by
/// the whole-push size test in `agent::tests`).
pub(in crate::agent) fn at_bounds(p: &mut Push) {
    let name = "n".repeat(MAX_GRAD_NAME);
    p.host = Some(Host {
        rss_bytes: Some(u64::MAX),
        limit_bytes: Some(u64::MAX),
        cgroup_usage_bytes: Some(u64::MAX),
        working_set_bytes: Some(u64::MAX),
        cgroup: Some("v".repeat(MAX_TAG)),
    });
    p.grads = Some(Grads {
        step: Some(u64::MAX),
        every: Some(u64::MAX),
        checks: Some(u64::MAX),
        checked: Some(u64::MAX),
        at: Some(1.8e9),
        non_finite: vec![name.clone(); MAX_GRAD_NAMES],
        large: vec![name.clone(); MAX_GRAD_NAMES],
        vanishing: vec![name; MAX_GRAD_NAMES],
        non_finite_count: u64::MAX,
        large_count: u64::MAX,
        vanishing_count: u64::MAX,
        global_norm: Some(1e300),
        global_norm_median: Some(1e300),
        first_non_finite_step: Some(u64::MAX),
    });
    let full: Vec<(u64, u64)> = (9..9 + MAX_SIZE_BUCKETS as u32)
        .map(|k| (1u64 << k, u64::MAX))
        .collect();
    p.sizes = Some(Sizes {
        device: Some(u32::MAX),
        at: Some(1.8e9),
        source: SizesSource::Snapshot,
        buckets: full.clone(),
        free_buckets: Some(full.clone()),
        requests: Some(full),
        seconds: Some(1e9),
        inactive_splits: Some(u64::MAX),
        blocks: Some(u64::MAX),
        snapshot_seconds: Some(1e9),
    });
    p.tracking = Some(Tracking {
        from_step: Some(u64::MAX),
        to_step: Some(u64::MAX),
        seconds: Some(1e9),
        at: Some(1.8e9),
        site_source: Some("s".repeat(MAX_TAG)),
        scanned_objects: Some(u64::MAX),
        live_tensors: Some(u64::MAX),
        live_tensor_bytes: Some(u64::MAX),
        sample_seconds: Some(1e9),
        tensors: vec![
            TrackedTensors {
                device: "d".repeat(MAX_TAG),
                dtype: "t".repeat(MAX_TAG),
                shape: Some(vec![u64::MAX; MAX_SHAPE_DIMS]),
                site: Some("s".repeat(MAX_SITE)),
                count: i64::MIN,
                bytes: i64::MIN,
                live_count: u64::MAX,
                live_bytes: u64::MAX,
            };
            MAX_TRACKED
        ],
        objects: vec![
            TrackedType {
                type_: "t".repeat(MAX_TAG),
                count: i64::MIN,
                live: u64::MAX,
            };
            MAX_TRACKED
        ],
    });
    if p.kind == PushKind::Oom {
        p.pre_oom = Some(PreOom {
            source: PreOomSource::Peaks,
            time: 1.8e9,
            devices: p.devices.clone(),
        });
    }
}

#[test]
fn the_agents_contract_c_push_parses() {
    // As agent/python's _extras.py, _oom.py and _timeline.py send them (docs/agent.md).
    let body = br#"{"version": 1, "kind": "oom", "time": 1795000000.5, "pid": 7,
        "devices": [{"index": 0, "allocatedBytes": 81000000000, "reservedBytes": 83000000000,
          "totalBytes": 85000000000}],
        "events": [{"t": 1795000000.1, "name": "checkpoint", "note": "step=41", "elapsed": 12.5,
          "allocatedBytes": 1, "reservedBytes": 2, "maxAllocatedBytes": 3, "maxReservedBytes": 4,
          "detail": {"tensors": 2, "tensorBytes": 4096, "parameters": 10, "trainableParameters": 5}}],
        "oom": {"message": "CUDA out of memory", "source": "segments", "blocks": []},
        "preOom": {"source": "observer", "time": 1795000000.4, "devices": [{"index": 0,
          "allocatedBytes": 81000000000, "reservedBytes": 83000000000, "totalBytes": 85000000000}]},
        "host": {"rssBytes": 5000000000, "limitBytes": null, "cgroupUsageBytes": 6000000000,
          "workingSetBytes": 5500000000, "cgroup": "v2"},
        "grads": {"step": 40, "every": 50, "checks": 3, "checked": 120, "at": 1795000000.0,
          "nonFinite": ["layer.3.weight"], "large": [], "vanishing": [], "nonFiniteCount": 1,
          "largeCount": 0, "vanishingCount": 0, "globalNorm": null, "globalNormMedian": 1.5,
          "firstNonFiniteStep": 40},
        "sizes": {"device": 0, "at": 1795000000.0, "source": "snapshot",
          "buckets": [[1048576, 12], [1073741824, 3]], "freeBuckets": [[2097152, 40]],
          "requests": [[1048576, 900], [1099511627776, 30]], "seconds": 10.0,
          "inactiveSplits": 40, "blocks": 15, "snapshotSeconds": 0.004},
        "tracking": {"fromStep": 100, "toStep": 200, "seconds": 30.0, "at": 1795000000.0,
          "siteSource": "none", "scannedObjects": 90000, "liveTensors": 400,
          "liveTensorBytes": 9000000000, "sampleSeconds": 0.2,
          "tensors": [{"device": "cuda:0", "dtype": "torch.float32", "shape": [1024, 1024],
            "site": null, "count": 100, "bytes": 419430400, "liveCount": 300, "liveBytes": 1258291200}],
          "objects": [{"type": "builtins.list", "count": 3, "live": 900}]}}"#;
    let p = parse(body).unwrap();
    assert_eq!(p.pre_oom.as_ref().unwrap().source, PreOomSource::Observer);
    assert_eq!(p.host.as_ref().unwrap().limit_bytes, None);
    assert_eq!(p.sizes.as_ref().unwrap().buckets[1], (1 << 30, 3));
    assert_eq!(
        p.events[0].detail.as_ref().unwrap().tensor_bytes,
        Some(4096)
    );
    assert_eq!(p.tracking.as_ref().unwrap().tensors[0].count, 100);
    assert_eq!(p.grads.as_ref().unwrap().global_norm, None);
}

#[test]
fn contract_c_lists_and_strings_are_bounded() {
    type BreakIt = fn(&mut Push);
    let cases: [(BreakIt, &str); 9] = [
        (
            |p| p.grads.as_mut().unwrap().large.push("x".into()),
            "grads.large has 17 entries",
        ),
        (
            |p| p.grads.as_mut().unwrap().vanishing[0] = "x".repeat(MAX_GRAD_NAME + 1),
            "grads.vanishing[0] is 129 bytes",
        ),
        (
            |p| p.sizes.as_mut().unwrap().buckets.push((1 << 41, 1)),
            "sizes.buckets has 33 entries",
        ),
        (
            |p| p.sizes.as_mut().unwrap().buckets.swap(0, 1),
            "sizes.buckets[1]: bucket bounds must be ascending",
        ),
        (
            |p| p.tracking.as_mut().unwrap().tensors[2].site = Some("s".repeat(MAX_SITE + 1)),
            "tracking.tensors[2].site is 129 bytes",
        ),
        (
            |p| {
                p.tracking.as_mut().unwrap().tensors[0]
                    .shape
                    .as_mut()
                    .unwrap()
                    .push(1)
            },
            "tracking.tensors[0].shape has 9 entries",
        ),
        (
            |p| {
                p.tracking
                    .as_mut()
                    .unwrap()
                    .objects
                    .push(TrackedType::default())
            },
            "tracking.objects has 33 entries",
        ),
        (
            |p| p.host.as_mut().unwrap().cgroup = Some("v".repeat(MAX_TAG + 1)),
            "host.cgroup is 65 bytes",
        ),
        (
            |p| p.sizes.as_mut().unwrap().seconds = Some(f64::NAN),
            "sizes.seconds must be a finite number",
        ),
    ];
    for (break_it, expected) in cases {
        let mut p = push();
        at_bounds(&mut p);
        assert!(validate(&p).is_ok(), "{:?}", validate(&p));
        break_it(&mut p);
        let err = validate(&p).unwrap_err().to_string();
        assert!(err.contains(expected), "{err} (expected {expected:?})");
    }
}

#[test]
fn pre_oom_only_in_an_oom_push_and_with_valid_devices() {
    let mut p = push();
    p.pre_oom = Some(PreOom {
        time: 1.8e9,
        devices: vec![device(0)],
        ..Default::default()
    });
    assert_eq!(validate(&p), Err(Error::PreOomMismatch));
    p.kind = PushKind::Oom;
    p.oom = Some(Default::default());
    assert!(validate(&p).is_ok());
    p.pre_oom.as_mut().unwrap().devices[0].allocated_bytes = 41 * G;
    let err = validate(&p).unwrap_err().to_string();
    assert!(
        err.contains("allocatedBytes exceeds reservedBytes"),
        "{err}"
    );
    p.pre_oom.as_mut().unwrap().devices = vec![device(1), device(1)];
    assert_eq!(validate(&p), Err(Error::DuplicateDevice { index: 1 }));
    p.pre_oom.as_mut().unwrap().devices = vec![device(0)];
    p.pre_oom.as_mut().unwrap().time = -1.0;
    assert!(matches!(validate(&p), Err(Error::NotFinite { .. })));
}

#[test]
fn host_numbers_that_cannot_be_true_are_refused() {
    let mut p = push();
    p.host = Some(Host {
        cgroup_usage_bytes: Some(G),
        working_set_bytes: Some(2 * G),
        ..Default::default()
    });
    let err = validate(&p).unwrap_err().to_string();
    assert!(err.contains("workingSetBytes"), "{err}");
    let mut p = push();
    p.grads = Some(Grads {
        large: vec!["a".into(), "b".into()],
        large_count: 1,
        ..Default::default()
    });
    let err = validate(&p).unwrap_err().to_string();
    assert!(err.contains("grads.large lists 2 names"), "{err}");
}
