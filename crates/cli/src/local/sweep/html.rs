//! `--html`: one self-contained report (inline SVG and CSS, no script, no
//! network): the peak against each swept variable with the fitted line, the
//! device limit and the headroom target (OOM runs marked), the breakdown per
//! configuration, the memory/step-time trade-off and the results table.
//! Pure: a result in, a document out.

use crate::local::sweep::model::{Metric, Model};
use crate::local::sweep::output::SweepResult;
use crate::local::sweep::record::{parts, RunRecord, Status};
use crate::plot::{
    escape_xml as esc, palette, HLine, LineChart, LineOptions, Mark, Series, StackedBars, Style,
    Unit,
};
use memprof_api::format_bytes;
use std::fmt::Write as _;

/// Most groups (combinations of the other variables) drawn in one peak chart.
const MAX_GROUPS: usize = 4;

/// Most runs named one by one in the trade-off chart's legend.
const MAX_NAMED: usize = 12;

const CSS: &str = "body{font-family:sans-serif;margin:24px auto;max-width:1100px;color:#222}\
h1{font-size:22px}h2{font-size:18px;margin-top:32px}\
.note{background:#fff4d6;border:1px solid #e0c060;padding:8px 12px}\
pre{background:#f5f5f5;padding:10px;overflow-x:auto;font-size:13px}\
figure{margin:16px 0}figcaption{font-size:13px;color:#555}\
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}\
th{background:#eee}td.l{text-align:left}tr.oom td{background:#fde2e2}tr.timeout td,tr.failed td{background:#eee}\
svg{max-width:100%;height:auto}";

/// The whole document.
pub fn render(r: &SweepResult) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>memprof sweep</title><style>{CSS}</style></head><body>\n<h1>memprof sweep</h1>\n"
    );
    header(&mut out, r);
    recommendations(&mut out, r);
    let mut n = 0;
    for var in &r.variables {
        let ms: Vec<&Model> = r.models.iter().filter(|m| &m.variable == var).collect();
        if !ms.is_empty() {
            n += 1;
            let id = format!("plot-peak-{var}");
            figure(
                &mut out,
                &id,
                n,
                &peak_chart(r, var, &ms).to_svg_with(800.0, 450.0, &peak_options(&ms)),
                &peak_caption(&ms),
            );
        }
    }
    n += 1;
    let bars = breakdown_chart(r);
    let caption = match &bars {
        Some(_) => "Parameters, gradients (with per-sample gradients), optimizer state and the activation peak, from the agent's breakdown of each run.".to_string(),
        None => "No run's summary carried a breakdown (the agent takes it at the first steps): nothing to stack.".to_string(),
    };
    let svg = bars.unwrap_or_else(empty_bars).to_svg();
    figure(&mut out, "plot-breakdown", n, &svg, &caption);
    n += 1;
    figure(
        &mut out,
        "plot-tradeoff",
        n,
        &tradeoff_chart(r).to_svg(),
        &format!("Each run that ended ok with a step time ({}): lower and further left is better; the limit line is the headroom target.", label_key(&r.variables)),
    );
    table(&mut out, r);
    out.push_str("</body></html>\n");
    out
}

fn header(out: &mut String, r: &SweepResult) {
    if let Some(note) = &r.note {
        let _ = writeln!(out, "<p class=\"note\">{}</p>", esc(note));
    }
    let _ = writeln!(
        out,
        "<p>Command <code>{}</code>, started {}; {} configuration(s), step budget {}, timeout {} s, metric: peak {}, headroom {:.0}%{}.</p>",
        esc(&r.command.join(" ")),
        esc(&r.started_at),
        r.runs.len(),
        r.step_budget.map_or("none".into(), |s| s.to_string()),
        r.timeout_seconds,
        metric_word(r.metric),
        r.headroom * 100.0,
        if r.interrupted { "; interrupted before the end" } else { "" }
    );
}

fn recommendations(out: &mut String, r: &SweepResult) {
    out.push_str("<h2>Recommendation</h2>\n<pre>");
    if r.models.is_empty() {
        out.push_str("no model: vary a numeric variable over at least two values");
    }
    for (i, m) in r.models.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        for line in crate::local::sweep::model::describe(m) {
            let _ = writeln!(out, "{}", esc(&line));
        }
    }
    out.push_str("</pre>\n");
}

fn figure(out: &mut String, id: &str, n: usize, svg: &str, caption: &str) {
    let _ = writeln!(
        out,
        "<figure id=\"{}\">{svg}<figcaption>Figure {n}. {}</figcaption></figure>",
        esc(id),
        esc(caption)
    );
}

fn metric_word(m: Metric) -> &'static str {
    match m {
        Metric::Reserved => "reserved (allocator)",
        Metric::Allocated => "allocated (allocator)",
        Metric::Nvml => "used (NVML)",
    }
}

fn group_name(m: &Model) -> String {
    let fixed: Vec<String> = m.fixed.iter().map(|(k, v)| format!("{k}={v}")).collect();
    fixed.join(" ")
}

/// Peak against `var`: observed points and the fitted line per group, the
/// device total and the limit, a mark at each OOM.
fn peak_chart(r: &SweepResult, var: &str, ms: &[&Model]) -> LineChart {
    // Each group's line then its dots, so they sit together in the legend.
    let mut series = vec![];
    let mut ooms: Vec<(f64, Vec<String>)> = vec![];
    let mut oom_peaks = vec![];
    for (k, m) in ms.iter().take(MAX_GROUPS).enumerate() {
        // A group's line and dots share a colour.
        let col = palette(k);
        let g = group_name(m);
        let suffix = if g.is_empty() {
            String::new()
        } else {
            format!(" ({g})")
        };
        if let Some(f) = &m.fit {
            series.push(fit_series(f, var, &suffix, m).with_color(col));
        }
        series.push(
            Series::new(
                format!("observed{suffix}"),
                m.points.clone(),
                Style::Markers,
            )
            .with_color(col),
        );
        oom_peaks.extend(oom_points(r, var, m));
        for &x in &m.oom_values {
            match ooms.iter_mut().find(|(o, _)| *o == x) {
                Some((_, gs)) => gs.push(g.clone()),
                None => ooms.push((x, vec![g.clone()])),
            }
        }
    }
    if !oom_peaks.is_empty() {
        series.push(
            Series::new("OOM (observed peak)", oom_peaks, Style::Crosses).with_color(OOM_COLOR),
        );
    }
    let marks = ooms
        .into_iter()
        .map(|(x, gs)| {
            let gs: Vec<String> = gs.into_iter().filter(|g| !g.is_empty()).collect();
            let label = if gs.is_empty() {
                "OOM".to_string()
            } else {
                format!("OOM ({})", gs.join(", "))
            };
            Mark { x, label }
        })
        .collect();
    let total = ms
        .iter()
        .filter_map(|m| m.device_total_bytes)
        .fold(None, |a: Option<f64>, t| Some(a.map_or(t, |a| a.max(t))));
    let hlines = total.map_or(vec![], |t| limit_lines(t, r.headroom, true));
    LineChart {
        title: format!("Peak {} vs {var}", metric_word(r.metric)),
        x_label: var.to_string(),
        x_unit: Unit::Plain,
        y_label: "peak memory".into(),
        y_unit: Unit::Bytes,
        series,
        hlines,
        marks,
    }
}

/// The fitted curve, drawn over the data and the values the search tried,
/// as a polyline (a quadratic is not a straight line).
fn fit_series(f: &memprof_analysis::memmodel::Model, var: &str, suffix: &str, m: &Model) -> Series {
    let xs = m
        .points
        .iter()
        .map(|p| p.0)
        .chain(m.oom_values.iter().copied())
        .chain(m.predicted.map(|p| p.x));
    let lo = xs.clone().fold(f64::INFINITY, f64::min).min(0.0);
    let hi = xs.fold(f64::NEG_INFINITY, f64::max);
    let pts = (0..=40)
        .map(|i| lo + (hi - lo) * f64::from(i) / 40.0)
        .map(|x| (x, f.curve.at(x)))
        .collect();
    Series::new(
        format!("fit: {}{suffix}", f.curve.describe(var)),
        pts,
        Style::Dashed,
    )
}

/// Red, as the OOM marks.
const OOM_COLOR: &str = "#d62728";

/// `(value, observed peak)` of the runs of group `m` that hit an OOM and
/// reported a peak before dying.
fn oom_points(r: &SweepResult, var: &str, m: &Model) -> Vec<(f64, f64)> {
    r.runs
        .iter()
        .filter(|x| x.status == Some(Status::Oom))
        .filter(|x| m.fixed.iter().all(|(k, v)| x.values.get(k) == Some(v)))
        .filter_map(|x| {
            let v: f64 = x.values.get(var)?.parse().ok()?;
            Some((v, r.metric.of(x)? as f64))
        })
        .collect()
}

/// The y axis stops at 1.25 × the device total: a fit extrapolated to the
/// largest value tried would otherwise squeeze the measured region (under
/// the device total) into the bottom of the chart; the line is clipped.
fn peak_options(ms: &[&Model]) -> LineOptions {
    let total = ms
        .iter()
        .filter_map(|m| m.device_total_bytes)
        .reduce(f64::max);
    LineOptions {
        y_max: total.map(|t| t * 1.25),
    }
}

/// The device total (optionally) and the headroom target; the plot adds
/// each line's value to its label.
fn limit_lines(total: f64, headroom: f64, with_total: bool) -> Vec<HLine> {
    let mut v = vec![];
    if with_total {
        v.push(HLine {
            y: total,
            label: "device total".into(),
        });
    }
    v.push(HLine {
        y: total * (1.0 - headroom),
        label: format!("limit ({:.0}% headroom)", headroom * 100.0),
    });
    v
}

fn peak_caption(ms: &[&Model]) -> String {
    let mut c = "Dots: runs that ended ok; dashed: the least-squares line (same colour as its dots, cut off above 1.25 × the device total); red crosses: the observed peak of runs that hit a CUDA OOM, when they reported one; red marks: every value whose run hit an OOM.".to_string();
    if ms.len() > MAX_GROUPS {
        let _ = write!(
            c,
            " The first {MAX_GROUPS} of {} groups are drawn; the JSON has all.",
            ms.len()
        );
    }
    c
}

/// `BATCH_SIZE=8` for one variable, `8/512` (values in `--vary` order) for
/// several, so rotated axis labels stay short; `OOM` appended.
fn run_label(r: &RunRecord, variables: &[String]) -> String {
    let values: Vec<&str> = variables
        .iter()
        .filter_map(|k| r.values.get(k).map(String::as_str))
        .collect();
    let mut label = match (variables, values.as_slice()) {
        (_, []) => format!("run {}", r.index),
        ([k], [v]) => format!("{k}={v}"),
        (_, vs) => vs.join("/"),
    };
    if r.status == Some(Status::Oom) {
        label.push_str(" OOM");
    }
    label
}

/// What a run label is made of, for axis titles.
fn label_key(variables: &[String]) -> String {
    match variables {
        [_] | [] => "configuration".into(),
        vs => format!("configuration ({})", vs.join("/")),
    }
}

fn breakdown_chart(r: &SweepResult) -> Option<StackedBars> {
    let rows: Vec<(String, crate::local::sweep::record::Parts)> = r
        .runs
        .iter()
        .filter_map(|x| Some((run_label(x, &r.variables), parts(x.breakdown.as_ref()?)?)))
        .collect();
    if rows.is_empty() {
        return None;
    }
    let layer = |name: &str, f: fn(&crate::local::sweep::record::Parts) -> f64| {
        (
            name.to_string(),
            rows.iter().map(|(_, p)| f(p)).collect::<Vec<f64>>(),
        )
    };
    let total = r.runs.iter().filter_map(|x| x.device_total_bytes).max();
    Some(StackedBars {
        title: "Memory breakdown per configuration".into(),
        x_label: label_key(&r.variables),
        y_label: "memory".into(),
        y_unit: Unit::Bytes,
        categories: rows.iter().map(|(l, _)| l.clone()).collect(),
        layers: vec![
            layer("parameters", |p| p.parameters),
            layer("gradients", |p| p.gradients),
            layer("optimizer state", |p| p.optimizer),
            layer("activations (peak)", |p| p.activations),
        ],
        hlines: total
            .map(|t| {
                vec![HLine {
                    y: t as f64 * (1.0 - r.headroom),
                    label: format!("limit ({:.0}% headroom)", r.headroom * 100.0),
                }]
            })
            .unwrap_or_default(),
    })
}

fn empty_bars() -> StackedBars {
    StackedBars {
        title: "Memory breakdown per configuration (no breakdown recorded)".into(),
        x_label: "configuration".into(),
        y_label: "memory".into(),
        y_unit: Unit::Bytes,
        ..Default::default()
    }
}

fn tradeoff_chart(r: &SweepResult) -> LineChart {
    let pts: Vec<(String, (f64, f64))> = r
        .runs
        .iter()
        .filter(|x| x.status == Some(Status::Ok))
        .filter_map(|x| {
            Some((
                run_label(x, &r.variables),
                (x.step_seconds_median?, r.metric.of(x)? as f64),
            ))
        })
        .collect();
    let series = if pts.len() <= MAX_NAMED {
        pts.into_iter()
            .map(|(l, p)| Series::new(l, vec![p], Style::Markers))
            .collect()
    } else {
        vec![Series::new(
            "runs",
            pts.into_iter().map(|(_, p)| p).collect(),
            Style::Markers,
        )]
    };
    let total = r.runs.iter().filter_map(|x| x.device_total_bytes).max();
    LineChart {
        title: "Memory vs step time".into(),
        x_label: "median step time".into(),
        x_unit: Unit::Seconds,
        y_label: format!("peak {}", metric_word(r.metric)),
        y_unit: Unit::Bytes,
        series,
        hlines: total
            .map(|t| {
                vec![HLine {
                    y: t as f64 * (1.0 - r.headroom),
                    label: format!("limit ({:.0}% headroom)", r.headroom * 100.0),
                }]
            })
            .unwrap_or_default(),
        marks: vec![],
    }
}

fn table(out: &mut String, r: &SweepResult) {
    out.push_str("<h2>Runs</h2>\n<table id=\"results-table\"><thead><tr><th>#</th>");
    for v in &r.variables {
        let _ = write!(out, "<th>{}</th>", esc(v));
    }
    out.push_str("<th>status</th><th>exit</th><th>peak reserved</th><th>peak allocated</th><th>NVML peak</th><th>static</th><th>activations</th><th>s/step</th><th>tokens/s</th><th>samples/s</th><th>time</th><th class=\"l\">note</th></tr></thead><tbody>\n");
    let b = |v: Option<u64>| v.map_or("-".into(), format_bytes);
    let f = |v: Option<f64>, d: usize| v.map_or("-".into(), |x| format!("{x:.d$}"));
    for x in &r.runs {
        let status = x.status.map_or("-", Status::word);
        let _ = write!(out, "<tr class=\"{status}\"><td>{}</td>", x.index);
        for v in &r.variables {
            let _ = write!(
                out,
                "<td>{}</td>",
                esc(x.values.get(v).map_or("", String::as_str))
            );
        }
        let bd = |k: &str| {
            x.breakdown
                .as_ref()
                .and_then(|d| d.get(k))
                .and_then(serde_json::Value::as_u64)
        };
        let note = [
            x.oom_message.as_deref(),
            x.note.as_deref(),
            x.nvml_note.as_deref().filter(|_| r.nvml),
        ]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join("; ");
        let _ = writeln!(
            out,
            "<td>{status}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.1} s</td><td class=\"l\">{}</td></tr>",
            x.exit_code.map_or("-".into(), |c| c.to_string()),
            b(x.peak_reserved_bytes),
            b(x.peak_allocated_bytes),
            b(x.nvml_peak_bytes),
            b(bd("staticBytes")),
            b(bd("activationsPeakBytes")),
            f(x.step_seconds_median, 3),
            f(x.tokens_per_second, 0),
            f(x.samples_per_second, 1),
            x.duration_seconds,
            esc(&note)
        );
    }
    out.push_str("</tbody></table>\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::sweep::model::{models, Target};

    fn result(runs: Vec<RunRecord>) -> SweepResult {
        let variables = vec!["B".to_string()];
        let target = Target {
            metric: Metric::Reserved,
            headroom: 0.1,
            limit_override: None,
            ..Default::default()
        };
        SweepResult {
            kind: crate::local::sweep::output::KIND.into(),
            version: 1,
            started_at: "2026-11-22T20:00:00Z".into(),
            command: vec!["python".into(), "<train>.py".into()],
            models: models(&variables, &runs, &target),
            variables,
            step_budget: Some(5),
            timeout_seconds: 60.0,
            metric: Metric::Reserved,
            headroom: 0.1,
            limit_bytes: None,
            nvml: false,
            verify_runs: 0,
            interrupted: false,
            note: Some("a <fake> run".into()),
            runs,
        }
    }

    fn run(b: &str, status: Status, peak: Option<u64>) -> RunRecord {
        RunRecord {
            values: [("B".to_string(), b.to_string())].into(),
            status: Some(status),
            peak_reserved_bytes: peak,
            device_total_bytes: Some(16_000_000_000),
            ..Default::default()
        }
    }

    #[test]
    fn without_a_breakdown_the_figure_says_so_and_text_is_escaped() {
        let r = result(vec![
            run("1", Status::Ok, Some(3_000_000_000)),
            run("2", Status::Ok, Some(4_000_000_000)),
            run("32", Status::Oom, None),
        ]);
        let doc = render(&r);
        assert!(doc.contains("<figure id=\"plot-breakdown\">"));
        assert!(
            doc.contains("No run&apos;s summary carried a breakdown"),
            "{doc}"
        );
        assert!(doc.contains("a &lt;fake&gt; run"));
        assert!(doc.contains("<code>python &lt;train&gt;.py</code>"));
        assert!(doc.contains("<tr class=\"oom\">"));
        assert!(!doc.contains("<script"));
        assert_eq!(doc.matches("<svg").count(), 3, "peak, breakdown, trade-off");
    }

    #[test]
    fn a_group_fit_and_dots_share_a_colour_ooms_are_crossed_and_the_axis_is_capped() {
        let mut oom = run("64", Status::Oom, Some(15_000_000_000));
        oom.device_total_bytes = Some(16_000_000_000);
        let r = result(vec![
            run("1", Status::Ok, Some(3_000_000_000)),
            run("2", Status::Ok, Some(4_000_000_000)),
            oom,
        ]);
        let c = peak_chart(&r, "B", &r.models.iter().collect::<Vec<_>>());
        let colours: Vec<Option<&str>> = c.series.iter().map(|s| s.color.as_deref()).collect();
        assert!(colours[0].is_some());
        assert_eq!(colours[0], colours[1], "fit and dots of one group");
        assert_eq!(c.series[1].style, Style::Markers);
        let crosses = c.series.last().unwrap();
        assert_eq!(crosses.style, Style::Crosses);
        assert_eq!(crosses.points, vec![(64.0, 15e9)]);
        let y_max = peak_options(&r.models.iter().collect::<Vec<_>>()).y_max;
        assert_eq!(y_max, Some(16e9 * 1.25));
        // Three charts, three clip paths, no two alike.
        let doc = render(&r);
        let mut ids: Vec<&str> = doc
            .split("<clipPath id=\"")
            .skip(1)
            .map(|s| &s[..s.find('"').unwrap()])
            .collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), doc.matches("<clipPath").count());
    }
}
