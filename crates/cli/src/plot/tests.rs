use super::axis::{nice_step, Axis};
use super::*;

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// Parses `svg` as XML (panics with the parser's message when malformed)
/// and returns every text node, joined.
fn texts(svg: &str) -> String {
    let doc = roxmltree::Document::parse(svg).unwrap_or_else(|e| panic!("{e}\n{svg}"));
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    doc.descendants()
        .filter(|n| n.is_text())
        .filter_map(|n| n.text())
        .collect::<Vec<_>>()
        .join("\n")
}

fn memory_chart() -> LineChart {
    let ramp = |k: f64| {
        (0..600)
            .map(|i| (i as f64, (20.0 + k * i as f64 / 60.0) * GIB))
            .collect()
    };
    LineChart {
        title: "GPU memory <train & eval>".into(),
        x_label: "time".into(),
        x_unit: Unit::Seconds,
        y_label: "used memory".into(),
        y_unit: Unit::Bytes,
        series: vec![
            Series::new("GPU 0", ramp(2.0), Style::Line),
            Series::new("GPU 1", ramp(5.0), Style::Points),
            Series::new(
                "trend",
                vec![(0.0, 20.0 * GIB), (900.0, 80.0 * GIB)],
                Style::Dashed,
            ),
        ],
        hlines: vec![HLine {
            y: 80.0 * GIB,
            label: "total".into(),
        }],
        marks: vec![
            Mark {
                x: 300.0,
                label: "high".into(),
            },
            Mark {
                x: 590.0,
                label: "OOM".into(),
            },
        ],
    }
}

#[test]
fn line_chart_svg_is_well_formed_with_title_axes_legend_total_and_marks() {
    let t = texts(&memory_chart().to_svg());
    for want in [
        "GPU memory <train & eval>",
        "GPU 0",
        "GPU 1",
        "trend",
        "used memory (GiB)",
        "time (min)",
        "total 80 GiB",
        "high",
        "OOM",
    ] {
        assert!(t.contains(want), "{want:?} missing from {t}");
    }
}

#[test]
fn svg_names_only_a_generic_font_family() {
    let svg = memory_chart().to_svg();
    assert!(svg.contains(r#"font-family="sans-serif""#));
    assert_eq!(svg.matches("font-family").count(), 1);
}

#[test]
fn hostile_text_is_escaped() {
    let mut c = memory_chart();
    c.series[0].name = r#"</text><script>"x"'</script>"#.into();
    c.hlines[0].label = "a\u{1}b".into();
    let t = texts(&c.to_svg());
    assert!(t.contains(r#"</text><script>"x"'</script>"#));
    assert!(!c.to_svg().contains("<script>"));
}

#[test]
fn degenerate_inputs_never_panic_and_stay_well_formed() {
    let nan = f64::NAN;
    let cases = [
        vec![],
        vec![Series::new("empty", vec![], Style::Line)],
        vec![Series::new("one", vec![(5.0, 3.0)], Style::Line)],
        vec![Series::new(
            "flat",
            vec![(0.0, 0.0), (0.0, 0.0)],
            Style::Dashed,
        )],
        vec![Series::new(
            "nan",
            vec![(nan, 1.0), (1.0, nan), (f64::INFINITY, 2.0)],
            Style::Points,
        )],
        vec![Series::new(
            "mixed",
            vec![(0.0, 1.0), (nan, nan), (2.0, 3.0)],
            Style::Line,
        )],
    ];
    for series in cases {
        for unit in [Unit::Bytes, Unit::Seconds, Unit::Percent, Unit::Plain] {
            let c = LineChart {
                title: "t".into(),
                y_unit: unit,
                x_unit: unit,
                series: series.clone(),
                hlines: vec![HLine {
                    y: nan,
                    label: "nan line".into(),
                }],
                marks: vec![Mark {
                    x: nan,
                    label: "nan mark".into(),
                }],
                ..Default::default()
            };
            texts(&c.to_svg());
            c.to_text(40, 12);
            c.to_text(0, 0);
        }
    }
    let bars = StackedBars {
        categories: vec!["a".into()],
        layers: vec![("x".into(), vec![nan, 1.0])],
        ..Default::default()
    };
    texts(&bars.to_svg());
    bars.to_text(0, 0);
    texts(&StackedBars::default().to_svg());
    let heat = Heatmap {
        cols: vec!["c".into()],
        rows: vec!["r".into(), "s".into()],
        values: vec![vec![Some(nan)]],
        ..Default::default()
    };
    texts(&heat.to_svg());
    heat.to_text(0, 0);
    texts(&Heatmap::default().to_svg());
    Heatmap::default().to_text(80, 20);
}

#[test]
fn empty_chart_says_no_data() {
    let c = LineChart {
        title: "nothing".into(),
        ..Default::default()
    };
    assert!(texts(&c.to_svg()).contains("no data"));
}

#[test]
fn long_traces_are_thinned_per_pixel_column() {
    let many: Vec<(f64, f64)> = (0..100_000).map(|i| (i as f64, (i % 7) as f64)).collect();
    let c = LineChart {
        series: vec![Series::new("s", many, Style::Line)],
        ..Default::default()
    };
    let svg = c.to_svg();
    assert!(svg.len() < 100_000, "{} bytes", svg.len());
}

#[test]
fn ticks_are_nice_and_units_follow_the_range() {
    assert_eq!(nice_step(10.0, 5), 2.0);
    assert_eq!(nice_step(80.0, 4), 20.0);
    assert_eq!(
        nice_step(82.0, 8),
        10.0,
        "not 20, which would run the axis to 100"
    );
    assert_eq!(nice_step(0.9, 4), 0.2);
    let a = Axis::new(0.0, 80.0 * GIB, Unit::Bytes, 4);
    assert_eq!(a.unit_name, "GiB");
    assert_eq!(a.label(a.ticks[1]), "20");
    let a = Axis::new(0.0, 600.0, Unit::Seconds, 5);
    assert_eq!((a.unit_name, a.label(a.ticks[1]).as_str()), ("min", "2"));
    let a = Axis::new(0.0, 30.0, Unit::Seconds, 6);
    assert_eq!(a.title("time"), "time (s)");
    let a = Axis::new(0.0, 300.0 * 1024.0 * 1024.0, Unit::Bytes, 6);
    assert_eq!(a.unit_name, "MiB");
    assert_eq!(format_value(61.26 * GIB, Unit::Bytes), "61.3 GiB");
    assert_eq!(format_value(90.0, Unit::Seconds), "90 s");
    assert_eq!(format_value(f64::NAN, Unit::Bytes), "-");
}

#[test]
fn text_chart_fits_its_box_and_keys_every_series() {
    let t = memory_chart().to_text(72, 20);
    let lines: Vec<&str> = t.lines().collect();
    assert!(lines.len() <= 20, "{t}");
    assert!(lines.iter().all(|l| l.chars().count() <= 72), "{t}");
    for want in [
        "A: GPU 0",
        "B: GPU 1",
        "C: trend",
        "total 80 GiB",
        "used memory (GiB)",
        "time (min)",
    ] {
        assert!(t.contains(want), "{want:?} missing from\n{t}");
    }
    assert!(
        t.chars().any(|c| ('\u{2801}'..='\u{28ff}').contains(&c)),
        "{t}"
    );
}

#[test]
fn stacked_bars_show_every_layer_category_and_limit() {
    let c = StackedBars {
        title: "Memory by configuration".into(),
        x_label: "batch size".into(),
        y_label: "peak memory".into(),
        y_unit: Unit::Bytes,
        categories: vec!["8".into(), "16".into(), "32".into()],
        layers: vec![
            ("parameters".into(), vec![4.0 * GIB; 3]),
            (
                "activations".into(),
                vec![8.0 * GIB, 16.0 * GIB, 32.0 * GIB],
            ),
        ],
        hlines: vec![HLine {
            y: 40.0 * GIB,
            label: "device limit".into(),
        }],
    };
    let t = texts(&c.to_svg());
    for want in [
        "parameters",
        "activations",
        "16",
        "batch size",
        "peak memory (GiB)",
        "device limit",
    ] {
        assert!(t.contains(want), "{want:?} missing from {t}");
    }
    let text = c.to_text(60, 10);
    assert!(
        text.contains("█ parameters") && text.contains("▓ activations"),
        "{text}"
    );
    assert!(text.contains("36 GiB"), "{text}");
}

#[test]
fn heatmap_shows_rows_columns_and_scale() {
    let c = Heatmap {
        title: "Peak per GPU".into(),
        x_label: "GPU".into(),
        y_label: "node".into(),
        cols: (0..8).map(|i| format!("gpu{i}")).collect(),
        rows: vec!["node-a".into(), "node-b".into()],
        values: vec![
            (0..8).map(|i| Some((40 + i) as f64 * GIB)).collect(),
            vec![Some(70.0 * GIB), None],
        ],
        unit: Unit::Bytes,
        scale: None,
    };
    let t = texts(&c.to_svg());
    for want in [
        "Peak per GPU",
        "gpu7",
        "node-b",
        "70 GiB",
        "missing",
        "40 GiB",
    ] {
        assert!(t.contains(want), "{want:?} missing from {t}");
    }
    let text = c.to_text(120, 10);
    assert!(text.contains("node-a") && text.contains("47 GiB"), "{text}");
    let narrow = c.to_text(30, 10);
    assert!(narrow.lines().all(|l| l.chars().count() <= 30), "{narrow}");
}

#[test]
fn sparkline_scales_between_min_and_max() {
    assert_eq!(sparkline(&[]), "");
    assert_eq!(sparkline(&[1.0, 8.0]), "▁█");
    assert_eq!(sparkline(&[3.0, 3.0]), "▁▁");
    assert_eq!(sparkline(&[0.0, f64::NAN, 7.0]), "▁ █");
    assert_eq!(sparkline(&[f64::NAN]), " ");
}

/// Writes one chart of each kind into `MEMPROF_PLOT_GALLERY` (a directory),
/// to look at after a change: `MEMPROF_PLOT_GALLERY=/tmp/g cargo test -p
/// memprof --lib plot::tests::gallery -- --ignored`.
#[test]
#[ignore = "writes files; run by hand to look at the charts"]
fn gallery() {
    let dir = std::env::var("MEMPROF_PLOT_GALLERY").expect("MEMPROF_PLOT_GALLERY");
    let write = |name: &str, s: String| std::fs::write(format!("{dir}/{name}"), s).unwrap();
    write("line.svg", memory_chart().to_svg());
    write("line.txt", memory_chart().to_text(100, 28));
    let bars = StackedBars {
        title: "Peak memory by batch size".into(),
        x_label: "BATCH_SIZE".into(),
        y_label: "peak memory".into(),
        y_unit: Unit::Bytes,
        categories: ["8", "16", "32", "64"].map(String::from).to_vec(),
        layers: vec![
            ("parameters".into(), vec![14.0 * GIB; 4]),
            ("gradients".into(), vec![1.0 * GIB; 4]),
            ("optimizer".into(), vec![2.0 * GIB; 4]),
            (
                "activations".into(),
                vec![7.0 * GIB, 14.0 * GIB, 28.0 * GIB, 56.0 * GIB],
            ),
        ],
        hlines: vec![HLine {
            y: 79.1 * GIB,
            label: "device total".into(),
        }],
    };
    write("bars.svg", bars.to_svg());
    write("bars.txt", bars.to_text(80, 20));
    let heat = Heatmap {
        title: "Peak memory per GPU".into(),
        x_label: "GPU index".into(),
        y_label: "node".into(),
        cols: (0..8).map(|i| i.to_string()).collect(),
        rows: (0..4).map(|i| format!("gpu-node-{i}")).collect(),
        values: (0..4)
            .map(|r| {
                (0..8)
                    .map(|k| (r * 8 + k != 13).then(|| (50 + (r * 7 + k * 3) % 29) as f64 * GIB))
                    .collect()
            })
            .collect(),
        unit: Unit::Bytes,
        scale: Some((0.0, 80.0 * GIB)),
    };
    write("heat.svg", heat.to_svg());
    // A sweep's peak chart: few runs as markers, a fit in their colour
    // running far past the device, OOM crosses, two close limit lines.
    let total = 79.2 * GIB;
    let sweep = LineChart {
        title: "Peak reserved vs BATCH_SIZE".into(),
        x_label: "BATCH_SIZE".into(),
        y_label: "peak memory".into(),
        y_unit: Unit::Bytes,
        series: vec![
            Series::new(
                "fit",
                vec![(0.0, 2.1 * GIB), (64.0, 340.0 * GIB)],
                Style::Dashed,
            )
            .with_color(palette(0)),
            Series::new(
                "observed",
                vec![(2.0, 12.7 * GIB), (4.0, 23.2 * GIB), (8.0, 44.3 * GIB)],
                Style::Markers,
            )
            .with_color(palette(0)),
            Series::new(
                "OOM (observed peak)",
                vec![(16.0, 78.4 * GIB), (32.0, 78.0 * GIB), (64.0, 77.9 * GIB)],
                Style::Crosses,
            )
            .with_color("#d62728"),
        ],
        hlines: vec![
            HLine {
                y: total,
                label: "device total".into(),
            },
            HLine {
                y: total * 0.97,
                label: "limit (3% headroom)".into(),
            },
        ],
        marks: [16.0, 32.0, 64.0]
            .map(|x| Mark {
                x,
                label: "OOM".into(),
            })
            .to_vec(),
        ..Default::default()
    };
    let capped = LineOptions {
        y_max: Some(total * 1.25),
    };
    write("sweep.svg", sweep.to_svg_with(800.0, 450.0, &capped));
    write("scatter.svg", few_runs(Style::Markers).to_svg());
    write("heat.txt", heat.to_text(100, 20));
}

/// The plot frame of a line chart: (left, top, right, bottom).
fn frame_of(svg: &str) -> (f64, f64, f64, f64) {
    let doc = roxmltree::Document::parse(svg).unwrap();
    let r = doc
        .descendants()
        .find(|n| n.has_tag_name("rect") && n.attribute("stroke") == Some("#888888"))
        .expect("frame");
    let f = |k: &str| r.attribute(k).unwrap().parse::<f64>().unwrap();
    (f("x"), f("y"), f("x") + f("width"), f("y") + f("height"))
}

fn few_runs(style: Style) -> LineChart {
    LineChart {
        title: "Memory vs step time".into(),
        x_label: "median step time".into(),
        x_unit: Unit::Seconds,
        y_label: "peak".into(),
        y_unit: Unit::Bytes,
        series: vec![Series::new(
            "runs",
            vec![(0.2, 10.0 * GIB), (0.3, 20.0 * GIB), (0.4, 40.0 * GIB)],
            style,
        )],
        ..Default::default()
    }
}

#[test]
fn each_chart_clips_to_its_own_id_so_charts_share_a_page() {
    let a = memory_chart().to_svg();
    let mut other = memory_chart();
    other.title = "another chart".into();
    let b = other.to_svg();
    let id = |svg: &str| {
        let doc = roxmltree::Document::parse(svg).unwrap();
        let clip = doc
            .descendants()
            .find(|n| n.has_tag_name("clipPath"))
            .and_then(|n| n.attribute("id"))
            .unwrap()
            .to_string();
        let users: Vec<String> = doc
            .descendants()
            .filter_map(|n| n.attribute("clip-path"))
            .map(String::from)
            .collect();
        assert_eq!(users, vec![format!("url(#{clip})")], "{svg}");
        clip
    };
    assert_ne!(id(&a), id(&b));
    assert_ne!(id(&a), "plot");
    assert_eq!(a, memory_chart().to_svg(), "the same chart, the same file");
}

#[test]
fn markers_are_big_dots_points_stay_small() {
    let radii = |svg: &str| -> Vec<String> {
        let doc = roxmltree::Document::parse(svg).unwrap();
        doc.descendants()
            .filter(|n| n.has_tag_name("circle") && n.attribute("r") != Some("3.5"))
            .map(|n| n.attribute("r").unwrap().to_string())
            .collect()
    };
    assert_eq!(radii(&few_runs(Style::Markers).to_svg()), ["5"; 3]);
    assert_eq!(radii(&few_runs(Style::Points).to_svg()), ["1.6"; 3]);
    let crosses = few_runs(Style::Crosses).to_svg();
    assert!(radii(&crosses).is_empty());
    // Two strokes per cross, plus the legend's.
    assert!(crosses.matches("stroke-linecap=\"round\"").count() >= 6);
}

#[test]
fn a_series_given_a_colour_is_drawn_and_keyed_in_it() {
    let mut c = few_runs(Style::Markers);
    c.series.push(
        Series::new(
            "fit",
            vec![(0.2, 10.0 * GIB), (0.4, 40.0 * GIB)],
            Style::Dashed,
        )
        .with_color(palette(0)),
    );
    let svg = c.to_svg();
    // Both series (and their legend swatches) in the first palette colour,
    // none in the second, which the fit would get by position.
    assert!(svg.matches(palette(0)).count() >= 5, "{svg}");
    assert!(!svg.contains(palette(1)), "{svg}");
}

#[test]
fn y_max_caps_the_axis_and_the_line_is_clipped() {
    let c = LineChart {
        title: "Peak reserved vs BATCH_SIZE".into(),
        x_label: "BATCH_SIZE".into(),
        y_label: "peak memory".into(),
        y_unit: Unit::Bytes,
        series: vec![Series::new(
            "fit",
            vec![(0.0, 10.0 * GIB), (64.0, 350.0 * GIB)],
            Style::Dashed,
        )],
        hlines: vec![HLine {
            y: 79.2 * GIB,
            label: "device total".into(),
        }],
        ..Default::default()
    };
    let capped = c.to_svg_with(
        800.0,
        450.0,
        &LineOptions {
            y_max: Some(99.0 * GIB),
        },
    );
    let ticks = |svg: &str| texts(svg).lines().any(|l| l == "300");
    assert!(ticks(&c.to_svg()), "uncapped reaches 350 GiB");
    assert!(!ticks(&capped), "{capped}");
    assert!(texts(&capped).lines().any(|l| l == "100"));
    assert!(capped.contains("clip-path"));
}

#[test]
fn close_hline_labels_never_overlap() {
    let c = LineChart {
        title: "two close limits".into(),
        y_unit: Unit::Bytes,
        series: vec![Series::new(
            "x",
            vec![(0.0, 10.0 * GIB), (9.0, 350.0 * GIB)],
            Style::Line,
        )],
        hlines: vec![
            HLine {
                y: 79.2 * GIB,
                label: "device total".into(),
            },
            HLine {
                y: 71.3 * GIB,
                label: "limit (10% headroom)".into(),
            },
        ],
        ..Default::default()
    };
    let svg = c.to_svg();
    let doc = roxmltree::Document::parse(&svg).unwrap();
    let y_of = |label: &str| {
        doc.descendants()
            .find(|n| n.has_tag_name("text") && n.text().is_some_and(|t| t.starts_with(label)))
            .and_then(|n| n.attribute("y"))
            .unwrap()
            .parse::<f64>()
            .unwrap()
    };
    // Right-aligned at one x: boxes overlap unless their heights do not.
    let h = super::labels::LABEL_ASCENT + super::labels::LABEL_DESCENT;
    let (a, b) = (y_of("device total"), y_of("limit (10%"));
    assert!((a - b).abs() >= h, "{a} {b}\n{svg}");
    // The same for any spacing, including equal lines.
    for gap in [0.0, 2.0, 5.0, 9.0, 14.0, 30.0] {
        let pys = [100.0 + gap, 100.0, 100.0 + gap / 2.0];
        let mut bases = super::labels::hline_label_baselines(&pys);
        bases.sort_by(f64::total_cmp);
        assert!(
            bases.windows(2).all(|w| w[1] - w[0] >= h),
            "{gap}: {bases:?}"
        );
    }
    // Far-apart lines keep their labels just above them.
    assert_eq!(
        super::labels::hline_label_baselines(&[50.0, 200.0]),
        vec![46.0, 196.0]
    );
}

#[test]
fn markers_stay_off_the_frame_lines_keep_a_tight_x_range() {
    let svg = few_runs(Style::Markers).to_svg();
    let (left, top, right, bottom) = frame_of(&svg);
    let doc = roxmltree::Document::parse(&svg).unwrap();
    for c in doc
        .descendants()
        .filter(|n| n.has_tag_name("circle") && n.attribute("r") == Some("5"))
    {
        let cx: f64 = c.attribute("cx").unwrap().parse().unwrap();
        let cy: f64 = c.attribute("cy").unwrap().parse().unwrap();
        assert!(cx - 5.0 > left && cx + 5.0 < right, "{cx} {left} {right}");
        assert!(cy - 5.0 > top && cy + 5.0 < bottom, "{cy} {top} {bottom}");
    }
    let line = few_runs(Style::Line).to_svg();
    let (left, _, right, _) = frame_of(&line);
    let d = roxmltree::Document::parse(&line)
        .unwrap()
        .descendants()
        .find(|n| n.has_tag_name("path"))
        .and_then(|n| n.attribute("d").map(String::from))
        .unwrap();
    let xs: Vec<f64> = d
        .split(['M', 'L'])
        .filter_map(|p| p.trim().split(',').next()?.parse().ok())
        .collect();
    assert!((xs[0] - left).abs() < 0.11, "{d}");
    assert!((xs[xs.len() - 1] - right).abs() < 0.11, "{d}");
}
