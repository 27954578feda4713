//! The pictures the seed tools drew for a sweep: memory
//! over the steps of each configuration, the peak over two swept variables
//! as a heatmap, and one step's forward/backward/optimizer timeline from the
//! agent's `trace_modules()` numbers. Pure: a result in, charts out.

use crate::local::sweep::output::SweepResult;
use crate::local::sweep::record::{RunRecord, Status, TimelinePoint};
use crate::plot::{HLine, HeatOptions, Heatmap, LineChart, Mark, Series, Style, Unit};

/// Most configurations drawn in one timeline chart (a line each).
pub const MAX_TIMELINES: usize = 12;

/// `BATCH_SIZE=8 SEQ_LEN=512`: the run's values in `--vary` order, of the
/// variables that take more than one value in the sweep (a value every run
/// shares says nothing in a legend); `run N` when none does.
pub fn config_label(r: &RunRecord, sweep: &SweepResult) -> String {
    let parts: Vec<String> = sweep
        .variables
        .iter()
        .filter(|v| values_of(sweep, v).len() > 1)
        .filter_map(|v| r.values.get(v).map(|x| format!("{v}={x}")))
        .collect();
    if parts.is_empty() {
        format!("run {}", r.index)
    } else {
        parts.join(" ")
    }
}

/// x of each point: the step it was in, spread evenly over the points of
/// that step (`4.0, 4.25, 4.5, …` for step 4); seconds when a point has no
/// step. Returns the positions and whether they are steps.
fn positions(points: &[TimelinePoint]) -> (Vec<f64>, bool) {
    if points.iter().any(|p| p.step.is_none()) {
        return (points.iter().map(|p| p.t).collect(), false);
    }
    let mut out = Vec::with_capacity(points.len());
    let mut i = 0;
    while i < points.len() {
        let step = points[i].step;
        let n = points[i..].iter().take_while(|p| p.step == step).count();
        let base = step.unwrap_or(0) as f64;
        out.extend((0..n).map(|k| base + k as f64 / n as f64));
        i += n;
    }
    (out, true)
}

/// Allocated memory over the steps of each configuration that left a
/// timeline, one line each (the first [`MAX_TIMELINES`]); the limit line.
/// None when no run has a timeline.
pub fn timeline_chart(r: &SweepResult) -> Option<(LineChart, String)> {
    let runs: Vec<&RunRecord> = r.runs.iter().filter(|x| !x.timeline.is_empty()).collect();
    if runs.is_empty() {
        return None;
    }
    let mut by_step = true;
    let series: Vec<Series> = runs
        .iter()
        .take(MAX_TIMELINES)
        .map(|x| {
            let (xs, steps) = positions(&x.timeline);
            by_step &= steps;
            let pts = xs
                .into_iter()
                .zip(&x.timeline)
                .map(|(p, t)| (p, t.allocated_bytes as f64))
                .collect();
            let mut name = config_label(x, r);
            if x.status == Some(Status::Oom) {
                name.push_str(" (OOM)");
            }
            Series::new(name, pts, Style::Line)
        })
        .collect();
    let mut caption = format!(
        "Allocated memory over each run, one point per agent push (every {}): forward climbs, backward and the optimizer step release. {} of {} configurations.",
        if r.agent_interval.is_empty() { "push" } else { &r.agent_interval },
        series.len(),
        runs.len()
    );
    if !by_step {
        caption.push_str(" A run without step() markers is drawn over seconds.");
    }
    let chart = LineChart {
        title: "Memory over the run, per configuration".into(),
        x_label: if by_step { "step" } else { "time" }.into(),
        x_unit: if by_step { Unit::Plain } else { Unit::Seconds },
        y_label: "allocated".into(),
        y_unit: Unit::Bytes,
        series,
        hlines: limit_line(r),
        marks: vec![],
    };
    Some((chart, caption))
}

fn limit_line(r: &SweepResult) -> Vec<HLine> {
    let total = r
        .limit_bytes
        .or_else(|| r.runs.iter().filter_map(|x| x.device_total_bytes).max());
    total
        .map(|t| {
            vec![HLine {
                y: t as f64 * (1.0 - r.headroom),
                label: format!("limit ({:.0}% headroom)", r.headroom * 100.0),
            }]
        })
        .unwrap_or_default()
}

/// The values of `var` in the runs, in numeric order when they are numbers.
fn values_of(r: &SweepResult, var: &str) -> Vec<String> {
    values_in(r.runs.iter(), var)
}

/// The values of `var` in the grid's runs (no verification run).
fn grid_values(r: &SweepResult, var: &str) -> Vec<String> {
    values_in(r.runs.iter().filter(|x| x.trial.is_none()), var)
}

fn values_in<'a>(runs: impl Iterator<Item = &'a RunRecord>, var: &str) -> Vec<String> {
    let mut v: Vec<String> = vec![];
    for x in runs {
        if let Some(s) = x.values.get(var) {
            if !v.contains(s) {
                v.push(s.clone());
            }
        }
    }
    if v.iter().all(|s| s.parse::<f64>().is_ok()) {
        v.sort_by(|a, b| {
            let (a, b): (f64, f64) = (a.parse().unwrap_or(0.0), b.parse().unwrap_or(0.0));
            a.total_cmp(&b)
        });
    }
    v
}

/// The peak over the first two swept variables that take two values or
/// more in the grid (columns: the first, rows: the second, largest on top), `OOM`
/// written where a run hit one; the other varied variables at their first
/// value. None without two such variables (one row is the peak chart).
pub fn heatmap(r: &SweepResult) -> Option<(Heatmap, HeatOptions, String)> {
    let varied: Vec<&String> = r
        .variables
        .iter()
        .filter(|v| grid_values(r, v).len() > 1)
        .collect();
    let [a, b, more @ ..] = varied.as_slice() else {
        return None;
    };
    let fixed: Vec<(String, String)> = more
        .iter()
        .filter_map(|v| grid_values(r, v).first().map(|x| ((*v).clone(), x.clone())))
        .collect();
    let cols = grid_values(r, a);
    let mut rows = grid_values(r, b);
    rows.reverse();
    let (values, labels) = cells(r, (a, &cols), (b, &rows), &fixed);
    let mut caption = format!(
        "Peak {} per {a} (columns) and {b} (rows); OOM where the run hit one; the grid's runs only (the verification runs are in the peak charts).",
        metric_word(r)
    );
    if !fixed.is_empty() {
        let f: Vec<String> = fixed.iter().map(|(k, v)| format!("{k}={v}")).collect();
        caption.push_str(&format!(" Other variables at {}.", f.join(" ")));
    }
    let chart = Heatmap {
        title: format!("Peak memory over {a} and {b}"),
        x_label: (*a).clone(),
        y_label: (*b).clone(),
        cols,
        rows,
        values,
        unit: Unit::Bytes,
        scale: None,
    };
    Some((chart, HeatOptions { labels }, caption))
}

/// A heatmap's values and the words written instead of some, per row.
type Cells = (Vec<Vec<Option<f64>>>, Vec<Vec<Option<String>>>);

/// Each cell: the peak of the grid's run that ran, `OOM` or the status word
/// of one that did not, nothing where none ran.
fn cells(
    r: &SweepResult,
    (a, cols): (&str, &[String]),
    (b, rows): (&str, &[String]),
    fixed: &[(String, String)],
) -> Cells {
    let find = |ca: &str, rb: &str| {
        r.runs.iter().rev().filter(|x| x.trial.is_none()).find(|x| {
            x.values.get(a).map(String::as_str) == Some(ca)
                && x.values.get(b).map(String::as_str) == Some(rb)
                && fixed.iter().all(|(k, v)| x.values.get(k) == Some(v))
        })
    };
    rows.iter()
        .map(|rb| {
            cols.iter()
                .map(|ca| match find(ca, rb) {
                    Some(x) if x.status == Some(Status::Oom) => (None, Some("OOM".to_string())),
                    Some(x) if x.status == Some(Status::Ok) => {
                        (r.metric.of(x).map(|p| p as f64), None)
                    }
                    Some(x) => (None, x.status.map(|s| s.word().to_string())),
                    None => (None, None),
                })
                .unzip()
        })
        .unzip()
}

fn metric_word(r: &SweepResult) -> &'static str {
    match r.metric {
        crate::local::sweep::model::Metric::Reserved => "reserved",
        crate::local::sweep::model::Metric::Allocated => "allocated",
        crate::local::sweep::model::Metric::Nvml => "used (NVML)",
    }
}

/// One module's numbers from `trace_modules()` (the breakdown's `phases`).
struct Phase {
    module: String,
    forward: f64,
    backward: f64,
}

fn phases_of(b: &serde_json::Value) -> Option<(Vec<Phase>, f64, f64)> {
    let list = b.get("phases")?.as_array()?;
    let phases: Vec<Phase> = list
        .iter()
        .filter_map(|p| {
            Some(Phase {
                module: p.get("module")?.as_str()?.to_string(),
                forward: p.get("forwardBytes")?.as_f64()?.max(0.0),
                backward: p.get("backwardBytes")?.as_f64()?.max(0.0),
            })
        })
        .collect();
    let static_bytes = b.get("staticBytes")?.as_f64()?;
    let optimizer = b
        .get("optimizerStepPeakBytes")
        .and_then(serde_json::Value::as_f64)
        .unwrap_or(0.0);
    (!phases.is_empty()).then_some((phases, static_bytes, optimizer))
}

/// One step of the largest configuration that ran with `trace_modules()`
/// numbers: allocated memory after each module's forward, at each module's
/// backward peak (in reverse order), and at the optimizer step's peak.
pub fn step_chart(r: &SweepResult) -> Option<(LineChart, String)> {
    let run = r
        .runs
        .iter()
        .filter(|x| x.status == Some(Status::Ok))
        .filter(|x| x.breakdown.as_ref().and_then(phases_of).is_some())
        .max_by_key(|x| r.metric.of(x).unwrap_or(0))?;
    let (phases, base, optimizer) = run.breakdown.as_ref().and_then(phases_of)?;
    let n = phases.len() as f64;
    let mut pts = vec![(0.0, base)];
    let mut now = base;
    for (i, p) in phases.iter().enumerate() {
        now += p.forward;
        pts.push((i as f64 + 1.0, now));
    }
    for (i, p) in phases.iter().enumerate().rev() {
        let x = 2.0 * n - i as f64;
        pts.push((x - 0.5, now + p.backward));
        now -= p.forward;
        pts.push((x, now));
    }
    pts.push((2.0 * n + 0.5, base + optimizer));
    pts.push((2.0 * n + 1.0, base));
    let order: Vec<&str> = phases.iter().map(|p| p.module.as_str()).collect();
    let caption = format!(
        "One training step of {} reconstructed from the agent's trace_modules() numbers (not sampled over time): from the static part ({}), each module's forward adds what it keeps, backward (modules in reverse) peaks at what each module's backward needs above its start and frees that module's activations, then the optimizer step's own peak. x: module boundaries in order ({}), not seconds.",
        config_label(run, r),
        memprof_api::format_bytes(base as u64),
        order.join(", ")
    );
    let chart = LineChart {
        title: format!(
            "One step, forward / backward / optimizer ({})",
            config_label(run, r)
        ),
        x_label: "module boundary".into(),
        x_unit: Unit::Plain,
        y_label: "allocated".into(),
        y_unit: Unit::Bytes,
        series: vec![Series::new("allocated", pts, Style::Line)],
        hlines: limit_line(r),
        marks: vec![
            Mark {
                x: 0.0,
                label: "forward".into(),
            },
            Mark {
                x: n,
                label: "backward".into(),
            },
            Mark {
                x: 2.0 * n,
                label: "optimizer".into(),
            },
        ],
    };
    Some((chart, caption))
}

/// A value for a file name: `BATCH_SIZE-8`.
pub fn slug(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests;
