//! Unit tests of the push format and its checks.

use super::*;

const G: u64 = 1 << 30;

fn device(index: u32) -> DeviceStats {
    DeviceStats {
        index,
        uuid: Some(format!("GPU-{index}")),
        allocated_bytes: 30 * G,
        reserved_bytes: 40 * G,
        active_bytes: Some(31 * G),
        inactive_split_bytes: Some(G),
        peak_allocated_bytes: Some(35 * G),
        peak_reserved_bytes: Some(40 * G),
        free_bytes: Some(39 * G),
        total_bytes: Some(80 * G),
        ..Default::default()
    }
}

fn push() -> Push {
    Push {
        version: VERSION,
        time: 1.8e9,
        step: Some(7),
        phase: Some("forward".into()),
        devices: vec![device(0), device(1)],
        ..Default::default()
    }
}

#[test]
fn a_documented_push_parses() {
    // The example of docs/agent-wire.md.
    let body = br#"{"version": 1, "kind": "sample", "time": 1795000000.5, "pid": 4242,
        "rank": 3, "step": 1200, "phase": "forward", "rssBytes": 5000000000,
        "devices": [{"index": 0, "uuid": "GPU-370fbfe4-cafa-4f4c-9b2e-000000000000",
          "allocatedBytes": 31000000000, "reservedBytes": 40000000000,
          "activeBytes": 31500000000, "inactiveSplitBytes": 900000000,
          "requestedBytes": 30900000000, "peakAllocatedBytes": 36000000000,
          "peakReservedBytes": 40000000000, "allocRetries": 0, "numOoms": 0,
          "freeBytes": 39000000000, "totalBytes": 85000000000}],
        "events": [{"t": 1795000000.1, "name": "eval", "note": "epoch 3"}],
        "someFutureField": true}"#;
    let p = parse(body).unwrap();
    assert_eq!(p.kind, PushKind::Sample);
    assert_eq!(p.devices[0].allocated_bytes, 31_000_000_000);
    assert_eq!(p.events[0].note.as_deref(), Some("epoch 3"));
    assert!(serde_json::to_vec(&p).unwrap().len() < 64 * 1024);
}

#[test]
fn the_old_flat_body_and_other_versions_are_refused_with_the_reason() {
    let old = br#"{"allocatedBytes": 30, "reservedBytes": 40}"#;
    assert!(matches!(parse(old), Err(Error::Parse(_))));
    let mut p = push();
    p.version = 2;
    assert_eq!(validate(&p), Err(Error::Version { got: 2 }));
    assert!(Error::Version { got: 2 }
        .to_string()
        .contains("speaks version 1"));
}

#[test]
fn allocator_invariants_are_checked() {
    type BreakIt = fn(&mut DeviceStats);
    let cases: [(BreakIt, &str); 8] = [
        (
            |d| d.peak_inactive_split_bytes = Some(G / 2),
            "inactiveSplitBytes exceeds peakInactiveSplitBytes",
        ),
        (
            |d| {
                d.peak_reserved_bytes = Some(40 * G);
                d.peak_inactive_split_bytes = Some(41 * G);
            },
            "peakInactiveSplitBytes exceeds peakReservedBytes",
        ),
        (
            |d| d.allocated_bytes = 41 * G,
            "allocatedBytes exceeds reservedBytes",
        ),
        (
            |d| d.inactive_split_bytes = Some(41 * G),
            "inactiveSplitBytes",
        ),
        (
            |d| d.peak_allocated_bytes = Some(G),
            "exceeds peakAllocatedBytes",
        ),
        (
            |d| d.free_bytes = Some(81 * G),
            "freeBytes exceeds totalBytes",
        ),
        (|d| d.total_bytes = Some(0), "totalBytes is 0"),
        (|d| d.total_bytes = None, "freeBytes without totalBytes"),
    ];
    for (break_it, expected) in cases {
        let mut p = push();
        break_it(&mut p.devices[1]);
        let err = validate(&p).unwrap_err().to_string();
        assert!(
            err.contains(expected) && err.starts_with("device 1"),
            "{err}"
        );
    }
    assert!(validate(&push()).is_ok());
}

#[test]
fn lists_strings_and_times_are_bounded() {
    let mut p = push();
    p.devices = (0..17).map(device).collect();
    assert!(matches!(
        validate(&p),
        Err(Error::TooMany { count: 17, .. })
    ));
    let mut p = push();
    p.devices[1].index = 0;
    assert_eq!(validate(&p), Err(Error::DuplicateDevice { index: 0 }));
    let mut p = push();
    p.phase = Some("x".repeat(MAX_NAME + 1));
    assert!(matches!(validate(&p), Err(Error::TooLong { .. })));
    let mut p = push();
    p.time = f64::NAN;
    assert!(matches!(validate(&p), Err(Error::NotFinite { .. })));
    let mut p = push();
    p.events = vec![
        Event {
            t: 1.0,
            name: "e".into(),
            ..Default::default()
        };
        MAX_EVENTS + 1
    ];
    assert!(matches!(validate(&p), Err(Error::TooMany { .. })));
}

/// A breakdown with every list and string at its bound.
fn largest_breakdown() -> Breakdown {
    Breakdown {
        step: Some(u64::MAX),
        total_parameters: u64::MAX,
        trainable_parameters: u64::MAX,
        static_bytes: u64::MAX,
        activations_peak_bytes: Some(u64::MAX),
        batch_size: Some(u64::MAX),
        by_module_type: crate::ModuleType::ALL
            .iter()
            .map(|t| ModuleTypeBytes {
                type_: t.as_str().into(),
                parameters: u64::MAX,
                parameters_bytes: u64::MAX,
                gradients_bytes: u64::MAX,
                optimizer_bytes: u64::MAX,
            })
            .collect(),
        flags: vec![
            Flag {
                kind: "large".into(),
                parameter: "p".repeat(MAX_PARAMETER_NAME),
                note: "n".repeat(MAX_FLAG_NOTE),
            };
            MAX_FLAGS
        ],
        phases: Some(vec![
            ModulePhase {
                module: "m".repeat(MAX_PARAMETER_NAME),
                forward_bytes: u64::MAX,
                backward_bytes: u64::MAX,
            };
            MAX_MODULE_PHASES
        ]),
        optimizer_step_peak_bytes: Some(u64::MAX),
        ..Default::default()
    }
}

/// An OOM snapshot with every list and string at its bound.
fn largest_oom() -> OomSnapshot {
    let frame = Frame {
        filename: "f".repeat(MAX_FRAME_TEXT),
        line: 1,
        name: "n".repeat(MAX_FRAME_TEXT),
    };
    let block = Block {
        size_bytes: G,
        count: Some(u64::MAX),
        requested_bytes: Some(G),
        state: "s".repeat(MAX_NAME),
        frames: vec![frame; MAX_FRAMES],
    };
    OomSnapshot {
        device: Some(0),
        requested_bytes: Some(G),
        message: "m".repeat(MAX_MESSAGE),
        source: SnapshotSource::History,
        blocks: vec![block; MAX_BLOCKS],
    }
}

/// The event list at its bounds.
fn largest_events() -> Vec<Event> {
    vec![
        Event {
            t: 1.0,
            name: "e".repeat(MAX_NAME),
            note: Some("n".repeat(MAX_NOTE)),
            phase: Some("p".repeat(MAX_NAME)),
            step: Some(u64::MAX),
            allocated_bytes: Some(u64::MAX),
            reserved_bytes: Some(u64::MAX),
            max_allocated_bytes: Some(u64::MAX),
            max_reserved_bytes: Some(u64::MAX),
            elapsed: Some(1e9),
            detail: Some(EventDetail {
                tensors: Some(u64::MAX),
                tensor_bytes: Some(u64::MAX),
                parameters: Some(u64::MAX),
                trainable_parameters: Some(u64::MAX),
            }),
        };
        MAX_EVENTS
    ]
}

/// The sites snapshot at its bounds (an OOM push may carry one the agent
/// had not sent), with `blocks`.
fn largest_sites(blocks: Vec<Block>) -> SitesSnapshot {
    SitesSnapshot {
        time: 1.0,
        level: crate::RiskLevel::Critical,
        source: SnapshotSource::History,
        blocks,
        unattributed_bytes: u64::MAX,
        history: Some(SitesHistory {
            on: true,
            entries: Some(u64::MAX),
            why: Some("w".repeat(MAX_NAME)),
        }),
        error: Some("e".repeat(MAX_MESSAGE)),
    }
}

/// An OOM push with every field at its bound: the largest valid push.
fn largest_oom_push() -> Push {
    let mut p = push();
    p.kind = PushKind::Oom;
    let oom = largest_oom();
    p.sites = Some(largest_sites(oom.blocks.clone()));
    p.oom = Some(oom);
    p.devices = (0..MAX_DEVICES as u32).map(device).collect();
    for d in &mut p.devices {
        d.name = Some("n".repeat(MAX_NAME));
        d.uuid = Some("u".repeat(MAX_UUID));
    }
    p.events = largest_events();
    p.phase = Some("p".repeat(MAX_NAME));
    p.breakdown = Some(largest_breakdown());
    extras::tests::at_bounds(&mut p);
    p.acks = vec![
        Ack {
            id: "i".repeat(MAX_DIRECTIVE_ID),
            action: "a".repeat(MAX_ACK_ACTION),
            ok: true,
        };
        MAX_ACKS
    ];
    p
}

#[test]
fn an_oom_push_carries_a_bounded_snapshot() {
    let mut p = push();
    p.kind = PushKind::Oom;
    assert_eq!(validate(&p), Err(Error::OomMismatch));
    let mut p = largest_oom_push();
    assert!(validate(&p).is_ok(), "{:?}", validate(&p));
    // The largest valid push fits the body cap.
    let size = serde_json::to_vec(&p).unwrap().len() as u64;
    eprintln!("largest valid push: {size} bytes");
    assert!(size < MAX_BODY_BYTES, "{size}");
    p.oom.as_mut().unwrap().blocks[3]
        .frames
        .push(Frame::default());
    let err = validate(&p).unwrap_err().to_string();
    assert!(err.contains("oom.blocks[3].frames has 9 entries"), "{err}");
    p.oom.as_mut().unwrap().blocks[3].frames.pop();
    let sites = p.sites.as_mut().unwrap();
    sites.blocks.push(Block::default());
    let err = validate(&p).unwrap_err().to_string();
    assert!(err.contains("sites.blocks has 17 entries"), "{err}");
}

#[test]
fn the_sites_history_and_error_the_agent_sends_are_read_and_bounded() {
    let body = br#"{"version": 1, "time": 1.8e9, "sites": {"time": 1.8e9, "level": "critical",
        "source": "none", "blocks": [], "unattributedBytes": 0, "error": "RuntimeError('no')",
        "history": {"on": true, "entries": 20000, "why": "the sidecar asked"}}}"#;
    let sites = parse(body).unwrap().sites.unwrap();
    assert_eq!(sites.error.as_deref(), Some("RuntimeError('no')"));
    let history = sites.history.clone().unwrap();
    assert!(history.on && history.entries == Some(20000));
    assert_eq!(history.why.as_deref(), Some("the sidecar asked"));
    let mut p = push();
    p.sites = Some(SitesSnapshot {
        time: 1.0,
        history: Some(SitesHistory {
            why: Some("w".repeat(MAX_NAME + 1)),
            ..Default::default()
        }),
        ..Default::default()
    });
    let err = validate(&p).unwrap_err().to_string();
    assert!(err.contains("sites.history.why"), "{err}");
    p.sites.as_mut().unwrap().history = None;
    p.sites.as_mut().unwrap().error = Some("e".repeat(MAX_MESSAGE + 1));
    let err = validate(&p).unwrap_err().to_string();
    assert!(err.contains("sites.error"), "{err}");
}

#[test]
fn a_snapshot_source_is_spelled_in_reports_as_on_the_wire() {
    for s in [
        SnapshotSource::History,
        SnapshotSource::Segments,
        SnapshotSource::None,
    ] {
        assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
    }
}
