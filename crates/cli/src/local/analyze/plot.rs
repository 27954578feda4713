//! `memprof analyze --plot`: one GPU of a trace with its samples, its upper
//! and lower envelopes (max and min per analysis bucket), the trend fitted
//! the way the analysis fits it (Theil–Sen over the upper envelope in the
//! fit window) at the moment the risk first became high, extended to where
//! it crosses total memory (the predicted OOM), and the risk transitions.

use crate::plot::{HLine, LineChart, Mark, Series, Style, Unit};
use memprof_analysis::theil_sen;
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
    // The prediction that mattered: when the risk first became high (or
    // critical); without one, at the end of the trace.
    let fit_at = transitions
        .iter()
        .find(|(_, r)| r == "high" || r == "critical")
        .map_or(span.1, |(t, _)| *t);
    let mut series = measured_series(&mine, &env, th.bucket_seconds);
    let mut marks: Vec<Mark> = transitions
        .iter()
        .map(|(t, r)| Mark {
            x: *t,
            label: format!("risk {r}"),
        })
        .collect();
    if let Some((line, oom)) = trend(&env, th.fit_window_seconds, fit_at, span, total) {
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

/// The trend fitted over the upper envelope in the `window` seconds up to
/// `fit_at`, drawn to where it crosses `total` (when that is within one
/// more trace length of the end, `span` being the trace's first and last
/// time), and the predicted OOM there; None without points to fit.
fn trend(
    env: &[(f64, f64, f64)],
    window: f64,
    fit_at: f64,
    (start, end): (f64, f64),
    total: f64,
) -> Option<(Series, Option<Mark>)> {
    let points: Vec<(f64, f64)> = env
        .iter()
        .filter(|e| e.0 <= fit_at && e.0 > fit_at - window)
        .map(|e| (e.0, e.2))
        .collect();
    let (fit, first) = (theil_sen(&points)?, points.first()?);
    let crossing = (fit.slope > 0.0).then(|| (total - fit.intercept) / fit.slope);
    let span = (end - start).max(1.0);
    let limit = end.max(fit_at) + span;
    let to = crossing
        .filter(|c| *c <= limit && *c >= first.0)
        .unwrap_or(fit_at.max(first.0));
    let label = match crossing {
        Some(c) => format!(
            "trend at t={} (predicts OOM {} later)",
            format_duration(fit_at),
            format_duration(c - fit_at)
        ),
        None => format!("trend at t={} (no OOM predicted)", format_duration(fit_at)),
    };
    let line = Series::new(
        label,
        vec![(first.0, fit.at(first.0)), (to, fit.at(to))],
        Style::Dashed,
    );
    let oom = crossing.filter(|c| *c <= limit).map(|c| Mark {
        x: c,
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
