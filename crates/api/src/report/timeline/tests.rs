//! The packed timeline: what the sidecar writes decodes to the same
//! envelope (MiB granular, never narrower), fits the CRD's bounds, and a
//! malformed string is an error naming the point.

use super::*;

const GIB: u64 = 1 << 30;

fn points(n: i64, t0: i64, step: i64) -> Vec<TimelinePoint> {
    (0..n)
        .map(|k| TimelinePoint {
            t: t0 + k * step,
            max: 30 * GIB + k as u64 * 12_345_678 + 1,
            min: 15 * GIB + k as u64 * 7_654_321 + 1,
        })
        .collect()
}

#[test]
fn a_packed_timeline_round_trips_to_the_mib_and_never_narrows_the_envelope() {
    let original = points(60, 1_790_000_000, 10);
    let decoded = unpack(&pack(&original)).unwrap();
    assert_eq!(decoded.len(), 60);
    for (o, d) in original.iter().zip(&decoded) {
        assert_eq!(o.t, d.t);
        assert!(d.max >= o.max && d.max - o.max < MIB, "{o:?} {d:?}");
        assert!(d.min <= o.min && o.min - d.min < MIB, "{o:?} {d:?}");
    }
    // Whole MiB values come back exactly.
    let exact = vec![TimelinePoint {
        t: 5,
        max: 3 * MIB,
        min: MIB,
    }];
    assert_eq!(unpack(&pack(&exact)).unwrap(), exact);
}

#[test]
fn times_are_deltas_and_may_go_back() {
    let p = vec![
        TimelinePoint {
            t: 1_790_000_000,
            max: MIB,
            min: 0,
        },
        TimelinePoint {
            t: 1_790_000_010,
            max: 2 * MIB,
            min: MIB,
        },
        TimelinePoint {
            t: 1_790_000_005,
            max: 2 * MIB,
            min: MIB,
        },
    ];
    assert_eq!(pack(&p), "1790000000:1:0 10:2:1 -5:2:1");
    assert_eq!(unpack(&pack(&p)).unwrap(), p);
    assert_eq!(pack(&[]), "");
    assert_eq!(unpack("").unwrap(), vec![]);
}

#[test]
fn the_widest_timeline_the_sidecar_writes_fits_the_crd_bounds() {
    // 60 points, a 10-digit start, gaps of a day, 953 TiB in MiB (9 digits).
    let wide: Vec<TimelinePoint> = (0..60)
        .map(|k| TimelinePoint {
            t: 9_999_999_999 - (59 - k) * 86_400,
            max: 999_999_999 * MIB,
            min: 999_999_999 * MIB,
        })
        .collect();
    let packed = pack(&wide);
    assert!(packed.len() <= MAX_PACKED_TIMELINE, "{}", packed.len());
    let pattern = regex::Regex::new(PACKED_TIMELINE_PATTERN).unwrap();
    assert!(pattern.is_match(&packed));
    assert!(pattern.is_match(&pack(&points(1, 0, 1))));
    for bad in [
        "",
        "1:2",
        "1:2:3 ",
        "1:2:3  4:5:6",
        "a:1:1",
        "1:1:1:1",
        "1:-1:0",
    ] {
        assert!(!pattern.is_match(bad), "{bad:?} should not match");
    }
}

#[test]
fn a_malformed_point_is_an_error_that_names_it() {
    let e = unpack("1790000000:1:0 10:x:1").unwrap_err();
    assert_eq!(e.index, 1);
    assert_eq!(e.point, "10:x:1");
    assert!(e.to_string().contains("T:MAX_MIB:MIN_MIB"), "{e}");
    assert!(unpack("1:2").is_err());
    assert!(unpack("1:2:3:4").is_err());
    assert!(
        unpack("9223372036854775807:1:1 1:1:1").is_err(),
        "time overflow"
    );
    assert!(
        unpack(&format!("0:{}:0", u64::MAX)).is_err(),
        "bytes overflow"
    );
}
