//! The timeline of an export in the agent's format (`_timeline.export`).

use super::*;

const M: u64 = 1 << 20;

/// Two names, out of time order in the file (it is keyed by name); one
/// event without allocator numbers (recorded before CUDA was up).
fn export() -> String {
    serde_json::json!({
        "version": 1, "pid": 7, "startedAt": 0.0, "generatedAt": 1.0,
        "events": {
            "forward": [
                {"elapsed": 1.0, "step": 0, "allocatedBytes": 900 * M, "reservedBytes": 1024 * M,
                 "maxAllocatedBytes": 900 * M, "maxReservedBytes": 1024 * M, "timestamp": "x"},
                {"elapsed": 3.0, "step": 1, "allocatedBytes": 1000 * M, "reservedBytes": 1024 * M,
                 "maxAllocatedBytes": 1100 * M, "maxReservedBytes": 1024 * M, "timestamp": "x"}
            ],
            "start": [{"elapsed": 0.1, "note": "before cuda", "timestamp": "x"}],
            "model loaded": [
                {"elapsed": 0.5, "allocatedBytes": 400 * M, "reservedBytes": 512 * M,
                 "maxAllocatedBytes": 400 * M, "maxReservedBytes": 512 * M, "timestamp": "x"}
            ]
        },
        "summary": {}
    })
    .to_string()
}

#[test]
fn events_in_time_order_with_the_change_from_the_previous_and_the_largest_stage() {
    let events = parse(&export()).unwrap();
    let names: Vec<&str> = events.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["start", "model loaded", "forward", "forward"]);
    let text = render(&events);
    let row = |name: &str, n: usize| {
        text.lines()
            .filter(|l| l.contains(name))
            .nth(n)
            .unwrap_or_else(|| panic!("no {name} row in\n{text}"))
            .to_string()
    };
    assert!(row("start", 0).contains("before cuda"), "{text}");
    assert!(
        row("model loaded", 0).trim_end().ends_with('-'),
        "no delta yet: {text}"
    );
    assert!(row("forward", 0).contains("+500MiB"), "{text}");
    assert!(row("forward", 1).contains("+100MiB"), "{text}");
    assert!(
        text.contains("4 events; largest increase +500MiB at forward (1.000s, after model loaded)"),
        "{text}"
    );
}

#[test]
fn the_chart_has_the_four_lines_and_a_mark_per_event() {
    let c = chart(&parse(&export()).unwrap());
    let lens: Vec<(String, usize)> = c
        .series
        .iter()
        .map(|s| (s.name.clone(), s.points.len()))
        .collect();
    assert_eq!(
        lens,
        [
            ("allocated".to_string(), 3),
            ("reserved".to_string(), 3),
            ("max allocated".to_string(), 3),
            ("max reserved".to_string(), 3)
        ]
    );
    assert_eq!(c.marks.len(), 4);
    assert!(c.to_svg().contains("model loaded"));
}

#[test]
fn a_file_that_is_not_an_export_says_so() {
    assert!(parse("{\"gpus\": []}")
        .unwrap_err()
        .to_string()
        .contains("events"));
}
