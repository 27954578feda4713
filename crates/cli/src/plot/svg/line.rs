//! The line chart: series, labelled horizontal lines and marked instants
//! over two axes. [`line_chart`] is the list of layers, drawn back to front;
//! each step below draws one.

use super::super::axis::{extent, Axis, Unit};
use super::super::labels::{mark_places, MARK_ROW};
use super::super::{finite, LineChart, LineOptions, Series, Style};
use super::{
    color, cross, frame, hlines, legend, legend_rows, line, open, text, x_axis, y_axis, Area,
    Entry, Swatch, HLINE, MARK, MARKER_R,
};
use std::fmt::Write as _;

/// Where each mark's label goes: its row above the plot and its anchor.
type Places = [Option<(usize, &'static str)>];

pub fn line_chart(c: &LineChart, w: f64, h: f64, opts: &LineOptions) -> String {
    let (x, y) = axes(c, opts);
    let entries = legend_entries(c);
    let rows = legend_rows(&entries, w - 100.0);
    let (left, right) = (78.0, w - 24.0);
    let places = mark_places(&c.marks, &x, left, right);
    let bands = places.iter().flatten().map(|p| p.0 + 1).max().unwrap_or(0);
    let a = Area {
        left,
        top: 46.0 + bands as f64 * MARK_ROW,
        right,
        bottom: h - 56.0 - rows as f64 * 18.0,
    };

    let mut out = String::new();
    open(&mut out, w, h, &c.title);
    clip_path(&mut out, a);
    y_axis(&mut out, a, &y, &c.y_label);
    x_axis(&mut out, a, &x, &c.x_label);
    frame(&mut out, a);
    if !c.series.iter().any(|s| finite(&s.points).next().is_some()) {
        no_data(&mut out, a);
    }
    let _ = write!(out, r#"<g clip-path="url(#{CLIP_ID})">"#);
    hlines(&mut out, a, &y, &c.hlines, c.y_unit);
    for (i, s) in c.series.iter().enumerate() {
        series(&mut out, a, (&x, &y), s, i);
    }
    mark_lines(&mut out, a, &x, c, &places);
    out.push_str("</g>");
    mark_labels(&mut out, a, &x, c, &places);
    legend(&mut out, &entries, a.left, a.bottom + 56.0, w - 100.0);
    out.push_str("</svg>\n");
    let id = format!("plot-{:016x}", fnv1a(&out));
    out.replace(CLIP_ID, &id)
}

/// The x and y axes: the data's extent (marks and horizontal lines
/// included), y from zero for memory, time and percentages, capped at
/// `opts.y_max`, padded where markers would sit on the frame.
fn axes(c: &LineChart, opts: &LineOptions) -> (Axis, Axis) {
    let xs = c
        .series
        .iter()
        .flat_map(|s| finite(&s.points).map(|p| p.0))
        .chain(c.marks.iter().map(|m| m.x));
    let ys = c
        .series
        .iter()
        .flat_map(|s| finite(&s.points).map(|p| p.1))
        .chain(c.hlines.iter().map(|l| l.y));
    let (mut x0, mut x1) = extent(xs).unwrap_or((0.0, 1.0));
    let (y0, mut y1) = extent(ys).unwrap_or((0.0, 1.0));
    // Memory, time and percentages are read from zero.
    let mut y0 = if c.y_unit == Unit::Plain {
        y0
    } else {
        y0.min(0.0)
    };
    if let Some(m) = opts.y_max.filter(|m| m.is_finite() && *m > y0) {
        y1 = y1.min(m);
    }
    // Big markers on the frame would be cut in half; line charts keep their
    // tight x range (time from the first to the last sample).
    if c.series.iter().any(|s| {
        matches!(s.style, Style::Markers | Style::Crosses)
            || (s.style == Style::Points && c.series.iter().all(|t| t.style.is_points()))
    }) {
        (x0, x1) = pad(x0, x1, 0.04);
        (y0, y1) = pad(y0, y1, 0.04);
    }
    let x = Axis::new(x0, x1, c.x_unit, 8);
    let y = Axis::new(y0, y1 + (y1 - y0) * 0.02, c.y_unit, 8);
    (x, y)
}

/// One legend entry per series, in its colour and style, then one per
/// horizontal line.
fn legend_entries(c: &LineChart) -> Vec<Entry> {
    let mut entries: Vec<Entry> = c
        .series
        .iter()
        .enumerate()
        .map(|(i, s)| Entry {
            name: s.name.clone(),
            color: series_color(s, i),
            kind: match s.style {
                Style::Line => Swatch::Line,
                Style::Dashed => Swatch::Dashed,
                Style::Points | Style::Markers => Swatch::Dot,
                Style::Crosses => Swatch::Cross,
            },
        })
        .collect();
    entries.extend(c.hlines.iter().map(|l| Entry {
        name: l.label.clone(),
        color: HLINE.into(),
        kind: Swatch::Dashed,
    }));
    entries
}

/// The clip path that keeps data inside the plot area (its id is fixed
/// once the chart is complete: [`CLIP_ID`]).
fn clip_path(out: &mut String, a: Area) {
    let _ = write!(
        out,
        r#"<defs><clipPath id="{CLIP_ID}"><rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}"/></clipPath></defs>"#,
        a.left,
        a.top,
        a.right - a.left,
        a.bottom - a.top
    );
}

/// "no data" in the middle of an empty plot.
fn no_data(out: &mut String, a: Area) {
    text(
        out,
        (a.left + a.right) / 2.0,
        (a.top + a.bottom) / 2.0,
        "middle",
        r##" fill="#888888" font-size="15""##,
        "no data",
    );
}

/// One series in its style, thinned per pixel column.
fn series(out: &mut String, a: Area, (x, y): (&Axis, &Axis), s: &Series, i: usize) {
    let pts: Vec<(f64, f64)> = finite(&s.points)
        .map(|(px, py)| (a.px(x, px), a.py(y, py)))
        .collect();
    let col = series_color(s, i);
    match s.style {
        Style::Line => path(
            out,
            &decimate(&pts),
            &format!(r#"stroke="{col}" stroke-width="1.8" stroke-linejoin="round""#),
        ),
        Style::Dashed => path(
            out,
            &decimate(&pts),
            &format!(r#"stroke="{col}" stroke-width="2" stroke-dasharray="7 4""#),
        ),
        Style::Points => {
            for (px, py) in decimate(&pts) {
                let _ = write!(
                    out,
                    r#"<circle cx="{px:.1}" cy="{py:.1}" r="1.6" fill="{col}"/>"#
                );
            }
        }
        Style::Markers => {
            for (px, py) in decimate(&pts) {
                let _ = write!(
                    out,
                    r##"<circle cx="{px:.1}" cy="{py:.1}" r="{MARKER_R}" fill="{col}" stroke="#ffffff" stroke-width="1"/>"##
                );
            }
        }
        Style::Crosses => {
            for p in decimate(&pts) {
                cross(out, p, MARKER_R, &col);
            }
        }
    }
}

/// A dashed vertical line at each placed mark, inside the clip.
fn mark_lines(out: &mut String, a: Area, x: &Axis, c: &LineChart, places: &Places) {
    for (m, place) in c.marks.iter().zip(places) {
        if place.is_some() {
            let px = a.px(x, m.x);
            line(
                out,
                (px, a.top),
                (px, a.bottom),
                &format!(r#"stroke="{MARK}" stroke-width="1.3" stroke-dasharray="4 3""#),
            );
        }
    }
}

/// Each mark's label in a band above the plot, so it covers neither data
/// nor lines, with a faint leader down to the plot.
fn mark_labels(out: &mut String, a: Area, x: &Axis, c: &LineChart, places: &Places) {
    for (m, place) in c.marks.iter().zip(places) {
        let Some((row, anchor)) = place else { continue };
        let px = a.px(x, m.x);
        let tx = if *anchor == "end" { px - 3.0 } else { px + 3.0 };
        let ty = 46.0 + (*row as f64 + 1.0) * MARK_ROW - 3.0;
        line(
            out,
            (px, ty - 9.0),
            (px, a.top),
            &format!(r#"stroke="{MARK}" stroke-width="1" stroke-opacity="0.5""#),
        );
        text(
            out,
            tx,
            ty,
            anchor,
            &format!(r#" fill="{MARK}" font-size="11""#),
            &m.label,
        );
    }
}

fn series_color(s: &Series, i: usize) -> String {
    s.color.clone().unwrap_or_else(|| color(i).to_string())
}

fn path(out: &mut String, pts: &[(f64, f64)], style: &str) {
    if pts.is_empty() {
        return;
    }
    let mut d = String::new();
    for (k, (x, y)) in pts.iter().enumerate() {
        let _ = write!(d, "{}{x:.1},{y:.1}", if k == 0 { "M" } else { " L" });
    }
    let _ = write!(out, r#"<path d="{d}" fill="none" {style}/>"#);
}

/// Stands for the clip path's id until the chart is complete; control
/// characters never survive escaping, so no user text can contain it.
const CLIP_ID: &str = "\u{1}clip";

/// A 64-bit FNV-1a hash: the clip id follows the chart's content, so two
/// different charts in one HTML page never share one, and the same chart
/// always gets the same id (reproducible files).
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// `lo..hi` widened by `frac` of its length on each side (not below 0 when
/// it started at or above 0), so markers stay off the frame.
fn pad(lo: f64, hi: f64, frac: f64) -> (f64, f64) {
    let p = (hi - lo).abs().max(hi.abs() * 0.05) * frac;
    let new_lo = if lo >= 0.0 { (lo - p).max(0.0) } else { lo - p };
    (new_lo, hi + p)
}

/// Keeps, per pixel column, the first, lowest, highest and last point: the
/// drawn line is the same, the file stays small for long traces.
fn decimate(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let mut out: Vec<(f64, f64)> = Vec::new();
    let mut i = 0;
    while i < points.len() {
        let col = points[i].0.round();
        let mut j = i;
        while j < points.len() && points[j].0.round() == col {
            j += 1;
        }
        let group = &points[i..j];
        // Pixel y grows downwards: the lowest value has the largest y.
        let low = group
            .iter()
            .copied()
            .fold(group[0], |a, p| if p.1 > a.1 { p } else { a });
        let high = group
            .iter()
            .copied()
            .fold(group[0], |a, p| if p.1 < a.1 { p } else { a });
        for p in [group[0], low, high, group[group.len() - 1]] {
            if out.last() != Some(&p) {
                out.push(p);
            }
        }
        i = j;
    }
    out
}
