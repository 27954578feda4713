//! The sweep's pictures on small recorded results: what each draws, where.

use super::*;
use crate::local::sweep::model::Metric;

const GB: u64 = 1_000_000_000;

fn result(variables: &[&str], runs: Vec<RunRecord>) -> SweepResult {
    SweepResult {
        kind: crate::local::sweep::output::KIND.into(),
        version: 1,
        started_at: "2026-11-24T09:00:00Z".into(),
        command: vec!["python".into(), "train.py".into()],
        variables: variables.iter().map(|v| v.to_string()).collect(),
        models: vec![],
        step_budget: Some(3),
        timeout_seconds: 60.0,
        metric: Metric::Reserved,
        headroom: 0.1,
        limit_bytes: None,
        nvml: false,
        verify_runs: 0,
        agent_interval: "250ms".into(),
        interrupted: false,
        note: None,
        runs,
    }
}

fn run(values: &[(&str, &str)], status: Status, peak_gb: u64) -> RunRecord {
    RunRecord {
        values: values
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        status: Some(status),
        peak_reserved_bytes: Some(peak_gb * GB),
        device_total_bytes: Some(16 * GB),
        ..Default::default()
    }
}

fn point(t: f64, step: Option<u64>, allocated_gb: f64) -> TimelinePoint {
    TimelinePoint {
        t,
        step,
        phase: None,
        allocated_bytes: (allocated_gb * GB as f64) as u64,
        reserved_bytes: 0,
    }
}

#[test]
fn the_timeline_draws_each_run_over_its_steps_named_by_what_varies() {
    let mut a = run(&[("B", "1"), ("S", "128")], Status::Ok, 3);
    // Two pushes in step 1, one in step 2.
    a.timeline = vec![
        point(0.0, Some(1), 2.0),
        point(0.1, Some(1), 3.0),
        point(0.2, Some(2), 2.5),
    ];
    let mut b = run(&[("B", "2"), ("S", "128")], Status::Oom, 9);
    b.timeline = vec![point(0.0, None, 4.0), point(0.5, None, 8.0)];
    let none = run(&[("B", "4"), ("S", "128")], Status::Oom, 15);
    let r = result(&["B", "S"], vec![a, b, none]);
    let (chart, caption) = timeline_chart(&r).unwrap();
    let names: Vec<&str> = chart.series.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, vec!["B=1", "B=2 (OOM)"], "S is the same everywhere");
    assert_eq!(
        chart.series[0].points,
        vec![(1.0, 2e9), (1.5, 3e9), (2.0, 2.5e9)]
    );
    // A run without step() markers puts the whole chart on seconds.
    assert_eq!(chart.series[1].points, vec![(0.0, 4e9), (0.5, 8e9)]);
    assert_eq!(
        (chart.x_label.as_str(), chart.x_unit),
        ("time", Unit::Seconds)
    );
    assert!(
        caption.contains("every 250ms") && caption.contains("2 of 2"),
        "{caption}"
    );
    assert_eq!(chart.hlines[0].y, 16e9 * 0.9);
    assert!(timeline_chart(&result(&["B"], vec![run(&[("B", "1")], Status::Ok, 3)])).is_none());
}

#[test]
fn the_heatmap_puts_the_first_variable_across_the_largest_second_on_top_and_writes_oom() {
    let runs = vec![
        run(&[("B", "1"), ("S", "128"), ("X", "a")], Status::Ok, 3),
        run(&[("B", "2"), ("S", "128"), ("X", "a")], Status::Ok, 4),
        run(&[("B", "1"), ("S", "256"), ("X", "a")], Status::Ok, 6),
        run(&[("B", "2"), ("S", "256"), ("X", "a")], Status::Oom, 15),
    ];
    let mut trial = run(&[("B", "3"), ("S", "128"), ("X", "a")], Status::Ok, 5);
    trial.trial = Some("the model predicts …".into());
    let mut runs = runs;
    runs.push(trial);
    let r = result(&["B", "S", "X"], runs);
    let (h, opts, caption) = heatmap(&r).unwrap();
    assert_eq!(
        (h.cols.clone(), h.rows.clone()),
        (
            vec!["1".to_string(), "2".into()],
            vec!["256".to_string(), "128".into()]
        )
    );
    assert_eq!(
        h.values,
        vec![vec![Some(6e9), None], vec![Some(3e9), Some(4e9)]]
    );
    assert_eq!(opts.labels[0][1].as_deref(), Some("OOM"));
    assert!(opts.labels[1].iter().all(Option::is_none));
    assert!(!caption.contains("X="), "X takes one value: {caption}");
    assert!(h.to_svg_with(&opts).contains(">OOM</text>"));
    // One varied variable is the peak chart's business, not a heatmap's.
    let one = result(
        &["B", "S"],
        vec![
            run(&[("B", "1"), ("S", "128")], Status::Ok, 3),
            run(&[("B", "2"), ("S", "128")], Status::Ok, 4),
        ],
    );
    assert!(heatmap(&one).is_none());
}

#[test]
fn one_step_is_drawn_from_the_largest_run_with_trace_modules_numbers() {
    let phases = |scale: u64| {
        serde_json::json!({
            "staticBytes": 2 * GB,
            "optimizerStepPeakBytes": GB / 2,
            "phases": [
                {"module": "embed", "forwardBytes": scale, "backwardBytes": scale / 2},
                {"module": "head", "forwardBytes": 2 * scale, "backwardBytes": scale},
            ],
        })
    };
    let mut small = run(&[("B", "1")], Status::Ok, 5);
    small.breakdown = Some(phases(GB / 10));
    let mut big = run(&[("B", "2")], Status::Ok, 8);
    big.breakdown = Some(phases(GB));
    let mut oom = run(&[("B", "4")], Status::Oom, 15);
    oom.breakdown = Some(phases(3 * GB));
    let r = result(&["B"], vec![small, big, oom]);
    let (chart, caption) = step_chart(&r).unwrap();
    assert!(chart.title.ends_with("(B=2)"), "{}", chart.title);
    let g = |x: f64| x * 1e9;
    assert_eq!(
        chart.series[0].points,
        vec![
            (0.0, g(2.0)),
            (1.0, g(3.0)),
            (2.0, g(5.0)),
            // head's backward peaks 1 GB above the 5 GB it starts at, frees its 2 GB;
            (2.5, g(6.0)),
            (3.0, g(3.0)),
            // embed's 0.5 GB above 3 GB, frees its 1 GB;
            (3.5, g(3.5)),
            (4.0, g(2.0)),
            // the optimizer step's own peak, back to the static part.
            (4.5, g(2.5)),
            (5.0, g(2.0)),
        ]
    );
    let marks: Vec<(f64, &str)> = chart
        .marks
        .iter()
        .map(|m| (m.x, m.label.as_str()))
        .collect();
    assert_eq!(
        marks,
        vec![(0.0, "forward"), (2.0, "backward"), (4.0, "optimizer")]
    );
    assert!(caption.contains("embed, head"), "{caption}");
    let bare = result(&["B"], vec![run(&[("B", "1")], Status::Ok, 5)]);
    assert!(
        step_chart(&bare).is_none(),
        "no trace_modules numbers, no chart"
    );
}
