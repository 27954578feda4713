//! The sweep's charts, each a [`Figure`] (an id, a file name, the SVG and
//! a caption) shared by the HTML report and `--plot-dir`: the peak against
//! each swept variable with the model's curve, the memory timeline per
//! configuration, the peak heatmap over two variables, one step's
//! forward/backward/optimizer timeline, the breakdown per configuration and
//! the memory/step-time trade-off. Pure.

use crate::local::sweep::model::{Metric, Model};
use crate::local::sweep::output::SweepResult;
use crate::local::sweep::pictures::{self, slug};
use crate::local::sweep::record::{parts, RunRecord, Status};
use crate::plot::{palette, HLine, LineChart, LineOptions, Mark, Series, StackedBars, Style, Unit};
use std::fmt::Write as _;

/// Most groups (combinations of the other variables) drawn in one peak chart.
const MAX_GROUPS: usize = 4;

/// Most runs named one by one in the trade-off chart's legend.
const MAX_NAMED: usize = 12;

/// One chart, ready to embed or write.
#[derive(Clone, Debug, PartialEq)]
pub struct Figure {
    /// The element id in the HTML report (`plot-peak-BATCH_SIZE`).
    pub id: String,
    /// The file name without extension (`peak-BATCH_SIZE`).
    pub file: String,
    /// The SVG document.
    pub svg: String,
    /// What it shows and how to read it.
    pub caption: String,
}

/// Every chart of a sweep, in report order.
pub fn figures(r: &SweepResult) -> Vec<Figure> {
    let mut out = vec![];
    for var in &r.variables {
        let ms: Vec<&Model> = r.models.iter().filter(|m| &m.variable == var).collect();
        if !ms.is_empty() {
            out.push(Figure {
                id: format!("plot-peak-{var}"),
                file: format!("peak-{}", slug(var)),
                svg: peak_chart(r, var, &ms).to_svg_with(800.0, 450.0, &peak_options(&ms)),
                caption: peak_caption(&ms),
            });
        }
    }
    if let Some((c, caption)) = pictures::timeline_chart(r) {
        out.push(figure("plot-timeline", "timeline", c.to_svg(), caption));
    }
    if let Some((c, opts, caption)) = pictures::heatmap(r) {
        out.push(figure(
            "plot-heatmap",
            "heatmap",
            c.to_svg_with(&opts),
            caption,
        ));
    }
    if let Some((c, caption)) = pictures::step_chart(r) {
        out.push(figure("plot-step", "step", c.to_svg(), caption));
    }
    let bars = breakdown_chart(r);
    let caption = match &bars {
        Some(_) => "Parameters, gradients (with per-sample gradients), optimizer state and the activation peak, from the agent's breakdown of each run.".to_string(),
        None => "No run's summary carried a breakdown (the agent takes it at the first steps): nothing to stack.".to_string(),
    };
    let svg = bars.unwrap_or_else(empty_bars).to_svg();
    out.push(figure("plot-breakdown", "breakdown", svg, caption));
    out.push(figure(
        "plot-tradeoff",
        "tradeoff",
        tradeoff_chart(r).to_svg(),
        format!("Each run that ended ok with a step time ({}): lower and further left is better; the limit line is the headroom target.", label_key(&r.variables)),
    ));
    out
}

fn figure(id: &str, file: &str, svg: String, caption: String) -> Figure {
    Figure {
        id: id.into(),
        file: file.into(),
        svg,
        caption,
    }
}

/// The metric in words.
pub fn metric_word(m: Metric) -> &'static str {
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
pub fn peak_chart(r: &SweepResult, var: &str, ms: &[&Model]) -> LineChart {
    // Each group's line then its dots, so they sit together in the legend.
    let mut series = vec![];
    let mut ooms: Vec<(f64, Vec<String>)> = vec![];
    let mut oom_peaks = vec![];
    let mut trial_points = vec![];
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
        // The verification's runs apart from the grid's: a reader sees
        // which values the search added.
        let (trials, grid): (Vec<_>, Vec<_>) =
            m.points.iter().partition(|p| m.trials.contains(&p.0));
        series.push(Series::new(format!("observed{suffix}"), grid, Style::Markers).with_color(col));
        trial_points.extend(trials);
        oom_peaks.extend(oom_points(r, var, m));
        for &x in &m.oom_values {
            match ooms.iter_mut().find(|(o, _)| *o == x) {
                Some((_, gs)) => gs.push(g.clone()),
                None => ooms.push((x, vec![g.clone()])),
            }
        }
    }
    if !trial_points.is_empty() {
        // One legend entry for all groups: each sits on its group's curve.
        series.push(
            Series::new("verification runs", trial_points, Style::Markers).with_color(TRIAL_COLOR),
        );
    }
    if !oom_peaks.is_empty() {
        series.push(
            Series::new("OOM (observed peak)", oom_peaks, Style::Crosses).with_color(OOM_COLOR),
        );
    }
    let marks = oom_marks(ooms);
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

/// A red mark per value that OOMed, naming the groups it OOMed in.
fn oom_marks(ooms: Vec<(f64, Vec<String>)>) -> Vec<Mark> {
    ooms.into_iter()
        .map(|(x, gs)| {
            let gs: Vec<String> = gs.into_iter().filter(|g| !g.is_empty()).collect();
            let label = if gs.is_empty() {
                "OOM".to_string()
            } else {
                format!("OOM ({})", gs.join(", "))
            };
            Mark { x, label }
        })
        .collect()
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

/// Black: the runs the verification search added.
const TRIAL_COLOR: &str = "#222222";

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
pub fn peak_options(ms: &[&Model]) -> LineOptions {
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
    let mut c = "Dots: runs of the grid that ended ok (black: runs the verification search added); dashed: the memory model (a line or a quadratic, chosen by how well it predicts held-out runs; same colour as its dots, cut off above 1.25 × the device total); red crosses: the observed peak of runs that hit a CUDA OOM, when they reported one; red marks: every value whose run hit an OOM.".to_string();
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
