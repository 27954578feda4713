//! `memprof analyze --plot`: one GPU of a trace with its samples, its upper
//! and lower envelopes (max and min per analysis bucket), the analysis's
//! prediction at the moment the risk first became high (the time to OOM its
//! risk table prints, drawn to where memory reaches the total: the
//! predicted OOM), and the risk transitions.

use crate::plot::{HLine, LineChart, Mark, Series, Style, Unit};
use memprof_api::format_duration;
use memprof_api::thresholds::Thresholds;
use memprof_api::trace::TraceRow;
use serde_json::Value;
use std::collections::BTreeMap;

/// `(bucket middle, min, max)` of consecutive `bucket`-second windows.
pub fn envelopes(rows: &[&TraceRow], bucket: f64) -> Vec<(f64, f64, f64)> {
    let mut out: BTreeMap<i64, (f64, f64)> = BTreeMap::new();
    let origin = rows.first().map_or(0.0, |r| r.t);
    for r in rows {
        let k = ((r.t - origin) / bucket).floor() as i64;
        let v = r.used_bytes as f64;
        let e = out.entry(k).or_insert((v, v));
        *e = (e.0.min(v), e.1.max(v));
    }
    out.into_iter()
        .map(|(k, (lo, hi))| (origin + (k as f64 + 0.5) * bucket, lo, hi))
        .collect()
}

/// The GPU to draw: the asked one, else the one that reached the worst risk
/// (then the highest peak).
pub fn pick_gpu(rows: &[TraceRow], lines: &[Value], asked: Option<u32>) -> Option<u32> {
    if asked.is_some() {
        return asked;
    }
    let rank = |r: &str| {
        ["none", "low", "medium", "high", "critical"]
            .iter()
            .position(|x| *x == r)
    };
    let mut best: BTreeMap<u32, (usize, u64)> = BTreeMap::new();
    for r in rows {
        let e = best.entry(r.gpu).or_default();
        e.1 = e.1.max(r.used_bytes);
    }
    for l in lines.iter().filter(|l| l["event"] == "risk") {
        let (Some(g), Some(k)) = (l["gpu"].as_u64(), l["risk"].as_str().and_then(rank)) else {
            continue;
        };
        if let Some(e) = best.get_mut(&(g as u32)) {
            e.0 = e.0.max(k);
        }
    }
    best.into_iter().max_by_key(|(_, v)| *v).map(|(g, _)| g)
}

/// The chart of `gpu` (`lines` are those `analyze` emitted over `rows`).
pub fn chart(
    rows: &[TraceRow],
    lines: &[Value],
    th: &Thresholds,
    gpu: u32,
    name: &str,
) -> LineChart {
    let mine: Vec<&TraceRow> = rows.iter().filter(|r| r.gpu == gpu).collect();
    let total = mine.iter().map(|r| r.total_bytes).max().unwrap_or(0) as f64;
    let env = envelopes(&mine, th.bucket_seconds);
    let transitions = risk_transitions(lines, gpu);
    let span = (
        mine.first().map_or(0.0, |r| r.t),
        mine.last().map_or(0.0, |r| r.t),
    );
    let mut series = measured_series(&mine, &env, th.bucket_seconds);
    let mut marks: Vec<Mark> = transitions
        .iter()
        .map(|(t, r)| Mark {
            x: *t,
            label: format!("risk {r}"),
        })
        .collect();
    if let Some((line, oom)) = trend(lines, gpu, span, total) {
        series.push(line);
        marks.extend(oom);
    }
    marks.extend(ceiling_mark(lines, gpu));
    LineChart {
        title: format!("GPU {gpu} of {name}: envelope, trend and predicted OOM"),
        x_label: "trace time".into(),
        x_unit: Unit::Seconds,
        y_label: "used memory".into(),
        y_unit: Unit::Bytes,
        series,
        hlines: vec![HLine {
            y: total,
            label: "total memory".into(),
        }],
        marks,
    }
}

/// `(t, level)` of each risk transition `analyze` emitted for `gpu`.
fn risk_transitions(lines: &[Value], gpu: u32) -> Vec<(f64, String)> {
    lines
        .iter()
        .filter(|l| l["event"] == "risk" && l["gpu"].as_u64() == Some(u64::from(gpu)))
        .filter_map(|l| Some((l["t"].as_f64()?, l["risk"].as_str()?.to_string())))
        .collect()
}

/// The samples and both envelopes.
fn measured_series(mine: &[&TraceRow], env: &[(f64, f64, f64)], bucket: f64) -> Vec<Series> {
    vec![
        Series::new(
            "samples",
            mine.iter().map(|r| (r.t, r.used_bytes as f64)).collect(),
            Style::Points,
        ),
        Series::new(
            format!("upper envelope (max per {bucket} s)"),
            env.iter().map(|e| (e.0, e.2)).collect(),
            Style::Line,
        ),
        Series::new(
            format!("lower envelope (min per {bucket} s)"),
            env.iter().map(|e| (e.0, e.1)).collect(),
            Style::Line,
        ),
    ]
}

/// The analysis's own prediction for `gpu`, as its risk table prints it:
/// the line where the risk first became high (or critical), else the last
/// line at medium or above; `(t, used bytes, time to OOM)`.
fn prediction(lines: &[Value], gpu: u32) -> Option<(f64, f64, f64)> {
    let mine: Vec<&Value> = lines
        .iter()
        .filter(|l| l["event"] == "risk" && l["gpu"].as_u64() == Some(u64::from(gpu)))
        .collect();
    let alarm = |l: &&&Value| matches!(l["risk"].as_str(), Some("high" | "critical"));
    let warn = |l: &&&Value| matches!(l["risk"].as_str(), Some("medium" | "high" | "critical"));
    let line = mine
        .iter()
        .find(alarm)
        .or_else(|| mine.iter().rev().find(warn))?;
    Some((
        line["t"].as_f64()?,
        line["usedBytes"].as_f64()?,
        line["timeToOomSeconds"].as_f64()?,
    ))
}

/// The analysis's prediction drawn: from the memory in use when it was made
/// to total memory at the predicted OOM, labelled with the very time to OOM
/// the risk table prints (one number, not a second fit of the plot's own);
/// the predicted OOM is marked when it falls within one more trace length
/// of the end. None when the analysis predicted no OOM.
fn trend(
    lines: &[Value],
    gpu: u32,
    (start, end): (f64, f64),
    total: f64,
) -> Option<(Series, Option<Mark>)> {
    let (at, used, tto) = prediction(lines, gpu)?;
    let oom_at = at + tto;
    let limit = end.max(at) + (end - start).max(1.0);
    let label = format!(
        "trend at t={} (predicts OOM {} later)",
        format_duration(at),
        format_duration(tto)
    );
    let to = oom_at.min(limit);
    let y = |x: f64| used + (total - used) * (x - at) / tto.max(f64::MIN_POSITIVE);
    let line = Series::new(label, vec![(at, used), (to, y(to))], Style::Dashed);
    let oom = (oom_at <= limit).then(|| Mark {
        x: oom_at,
        label: "predicted OOM".into(),
    });
    Some((line, oom))
}

/// Where `analyze` saw `gpu` reach its memory ceiling, when it did.
fn ceiling_mark(lines: &[Value], gpu: u32) -> Option<Mark> {
    let c = lines
        .iter()
        .find(|l| l["event"] == "summary" && l["gpu"].as_u64() == Some(u64::from(gpu)))
        .and_then(|l| l["ceilingAt"].as_f64())?;
    Some(Mark {
        x: c,
        label: "ceiling reached".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::analyze::{analyze, Options};

    fn fixture(name: &str) -> Vec<TraceRow> {
        let path = format!(
            "{}/../../tests/fixtures/traces/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        memprof_api::trace::read_trace(&path).expect("fixture")
    }

    fn lines(rows: &[TraceRow]) -> Vec<Value> {
        let mut v = vec![];
        analyze(rows, &Options::default(), |l| v.push(l));
        v
    }

    #[test]
    fn a_leak_is_drawn_with_envelopes_and_a_trend_to_the_predicted_oom_near_the_real_one() {
        let rows = fixture("leak300_h100.csv");
        let lines = lines(&rows);
        let gpu = pick_gpu(&rows, &lines, None).expect("a GPU");
        let c = chart(
            &rows,
            &lines,
            &Thresholds::default(),
            gpu,
            "leak300_h100.csv",
        );
        let names: Vec<&str> = c.series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names[..3],
            [
                "samples",
                "upper envelope (max per 10 s)",
                "lower envelope (min per 10 s)"
            ]
        );
        assert!(names[3].starts_with("trend at t="), "{names:?}");
        assert!(names[3].contains("predicts OOM"), "{names:?}");
        let labels: Vec<&str> = c.marks.iter().map(|m| m.label.as_str()).collect();
        // The staircase's pace may go straight from medium to critical.
        assert!(
            labels.contains(&"predicted OOM")
                && (labels.contains(&"risk high") || labels.contains(&"risk critical")),
            "{labels:?}"
        );
        // The recorded trainer died (memory back to 0) at 2m57s, below the
        // 99% ceiling: the prediction made at the first alarm lands near it.
        let predicted = c
            .marks
            .iter()
            .find(|m| m.label == "predicted OOM")
            .unwrap()
            .x;
        let died = rows.iter().rev().find(|r| r.used_bytes > 0).unwrap().t;
        assert!(
            (predicted - died).abs() < 30.0,
            "predicted {predicted} s, died {died} s"
        );
        assert_eq!(c.hlines[0].label, "total memory");
    }

    /// One number: the legend's time to OOM is the one the risk table
    /// prints on the row where the risk became high, and the predicted OOM
    /// is marked that long after it (the plot fitted its own trend before
    /// and said 1m10s where the table said 1m37s).
    #[test]
    fn the_plot_states_the_time_to_oom_the_table_prints() {
        for name in ["leak300_h100.csv", "leak1000_h100.csv"] {
            let rows = fixture(name);
            let lines = lines(&rows);
            let gpu = pick_gpu(&rows, &lines, None).unwrap();
            let c = chart(&rows, &lines, &Thresholds::default(), gpu, name);
            let first_high = lines
                .iter()
                .find(|l| {
                    l["event"] == "risk" && matches!(l["risk"].as_str(), Some("high" | "critical"))
                })
                .unwrap();
            let (t, tto) = (
                first_high["t"].as_f64().unwrap(),
                first_high["timeToOomSeconds"].as_f64().unwrap(),
            );
            let table =
                crate::local::analyze::render(&lines, crate::output::Format::Table, name, &rows);
            let row = table
                .lines()
                .find(|l| l.starts_with(&format_duration(t)))
                .unwrap_or_else(|| panic!("no row at {t}:\n{table}"));
            assert!(row.contains(&format_duration(tto)), "{row}");
            let legend = &c.series[3].name;
            assert!(
                legend.contains(&format!("predicts OOM {} later", format_duration(tto))),
                "{legend} vs {row}"
            );
            let mark = c.marks.iter().find(|m| m.label == "predicted OOM").unwrap();
            assert!((mark.x - (t + tto)).abs() < 1e-6);
        }
    }

    #[test]
    fn steady_training_predicts_no_oom() {
        let rows = fixture("steady_h100.csv");
        let lines = lines(&rows);
        let c = chart(&rows, &lines, &Thresholds::default(), 0, "steady");
        assert!(
            c.marks.iter().all(|m| m.label != "predicted OOM"),
            "{:?}",
            c.marks
        );
    }

    /// Writes the chart of every fixture into `MEMPROF_PLOT_GALLERY`, to look at.
    #[test]
    #[ignore = "writes files; run by hand to look at the charts"]
    fn gallery() {
        let dir = std::env::var("MEMPROF_PLOT_GALLERY").expect("MEMPROF_PLOT_GALLERY");
        for name in [
            "leak300_h100.csv",
            "steady_h100.csv",
            "spike_h100.csv",
            "leak1000_h100.csv",
        ] {
            let rows = fixture(name);
            let lines = lines(&rows);
            let gpu = pick_gpu(&rows, &lines, None).unwrap();
            let c = chart(&rows, &lines, &Thresholds::default(), gpu, name);
            std::fs::write(format!("{dir}/analyze-{name}.svg"), c.to_svg()).unwrap();
            std::fs::write(format!("{dir}/analyze-{name}.txt"), c.to_text(100, 30)).unwrap();
            let table =
                crate::local::analyze::render(&lines, crate::output::Format::Table, name, &rows);
            std::fs::write(format!("{dir}/analyze-{name}.table"), table).unwrap();
        }
    }
}
