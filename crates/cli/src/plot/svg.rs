//! SVG drawing of the charts. Hand-written: a chart is a few dozen
//! elements, and no plotting crate would spare us the layout decisions.

use super::axis::{extent, format_value, Axis, Unit};
use super::labels::{hline_label_baselines, mark_places, MARK_ROW};
use super::{escape_xml as esc, finite, LineChart, LineOptions, StackedBars, Style};
use std::fmt::Write as _;

/// Series colours (Tableau 10 without its red, which marks events).
pub const PALETTE: [&str; 9] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
    "#7f7f7f",
];
const MARK: &str = "#d62728";
const HLINE: &str = "#333333";
const GRID: &str = "#e6e6e6";
/// Width of a character of the 12 px labels, for layout.
pub(super) const CHAR_W: f64 = 6.8;

fn color(i: usize) -> &'static str {
    PALETTE[i % PALETTE.len()]
}

/// The plot area inside the margins.
#[derive(Clone, Copy)]
pub(super) struct Area {
    pub left: f64,
    pub top: f64,
    pub right: f64,
    pub bottom: f64,
}

impl Area {
    fn px(&self, x: &Axis, v: f64) -> f64 {
        self.left + x.frac(v) * (self.right - self.left)
    }
    fn py(&self, y: &Axis, v: f64) -> f64 {
        self.bottom - y.frac(v) * (self.bottom - self.top)
    }
}

pub(super) fn open(out: &mut String, w: f64, h: f64, title: &str) {
    let _ = write!(
        out,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w:.0}" height="{h:.0}" viewBox="0 0 {w:.0} {h:.0}" font-family="sans-serif" font-size="12"><title>{t}</title><rect width="100%" height="100%" fill="#ffffff"/><text x="{cx:.1}" y="26" text-anchor="middle" font-size="17" font-weight="bold">{t}</text>"##,
        t = esc(title),
        cx = w / 2.0
    );
}

pub(super) fn text(out: &mut String, x: f64, y: f64, anchor: &str, extra: &str, s: &str) {
    let _ = write!(
        out,
        r#"<text x="{x:.1}" y="{y:.1}" text-anchor="{anchor}"{extra}>{}</text>"#,
        esc(s)
    );
}

pub(super) fn line(out: &mut String, (x1, y1): (f64, f64), (x2, y2): (f64, f64), style: &str) {
    let _ = write!(
        out,
        r#"<line x1="{x1:.1}" y1="{y1:.1}" x2="{x2:.1}" y2="{y2:.1}" {style}/>"#
    );
}

/// Y grid, tick labels and the rotated axis title.
fn y_axis(out: &mut String, a: Area, y: &Axis, label: &str) {
    for &t in &y.ticks {
        let py = a.py(y, t);
        line(
            out,
            (a.left, py),
            (a.right, py),
            &format!(r#"stroke="{GRID}""#),
        );
        text(out, a.left - 6.0, py + 4.0, "end", "", &y.label(t));
    }
    let cy = (a.top + a.bottom) / 2.0;
    text(
        out,
        16.0,
        cy,
        "middle",
        &format!(r#" transform="rotate(-90 16 {cy:.1})" font-size="13""#),
        &y.title(label),
    );
}

/// X tick labels and the axis title under the plot.
fn x_axis(out: &mut String, a: Area, x: &Axis, label: &str) {
    for &t in &x.ticks {
        let px = a.px(x, t);
        line(
            out,
            (px, a.top),
            (px, a.bottom),
            &format!(r#"stroke="{GRID}""#),
        );
        text(out, px, a.bottom + 16.0, "middle", "", &x.label(t));
    }
    let cx = (a.left + a.right) / 2.0;
    text(
        out,
        cx,
        a.bottom + 34.0,
        "middle",
        r#" font-size="13""#,
        &x.title(label),
    );
}

fn frame(out: &mut String, a: Area) {
    let _ = write!(
        out,
        r##"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="none" stroke="#888888"/>"##,
        a.left,
        a.top,
        a.right - a.left,
        a.bottom - a.top
    );
}

/// A legend entry: a swatch (line, dashes, dot or box) and its name.
struct Entry {
    name: String,
    color: String,
    kind: Swatch,
}

#[derive(Clone, Copy)]
enum Swatch {
    Line,
    Dashed,
    Dot,
    Cross,
    Box,
}

fn entry_width(e: &Entry) -> f64 {
    34.0 + e.name.chars().count() as f64 * CHAR_W + 18.0
}

/// How many legend rows `entries` take in `width`.
fn legend_rows(entries: &[Entry], width: f64) -> usize {
    let mut rows = usize::from(!entries.is_empty());
    let mut x = 0.0;
    for e in entries {
        let w = entry_width(e);
        if x > 0.0 && x + w > width {
            rows += 1;
            x = 0.0;
        }
        x += w;
    }
    rows
}

fn legend(out: &mut String, entries: &[Entry], left: f64, top: f64, width: f64) {
    let (mut x, mut y) = (0.0, top);
    for e in entries {
        let w = entry_width(e);
        if x > 0.0 && x + w > width {
            x = 0.0;
            y += 18.0;
        }
        let sx = left + x;
        let c = &e.color;
        match e.kind {
            Swatch::Line => line(
                out,
                (sx, y - 4.0),
                (sx + 26.0, y - 4.0),
                &format!(r#"stroke="{c}" stroke-width="2.5""#),
            ),
            Swatch::Dashed => line(
                out,
                (sx, y - 4.0),
                (sx + 26.0, y - 4.0),
                &format!(r#"stroke="{c}" stroke-width="2" stroke-dasharray="6 3""#),
            ),
            Swatch::Dot => {
                let _ = write!(
                    out,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{c}"/>"#,
                    sx + 13.0,
                    y - 4.0
                );
            }
            Swatch::Cross => cross(out, (sx + 13.0, y - 4.0), 4.0, c),
            Swatch::Box => {
                let _ = write!(
                    out,
                    r#"<rect x="{:.1}" y="{:.1}" width="18" height="11" fill="{c}"/>"#,
                    sx + 4.0,
                    y - 10.0
                );
            }
        }
        text(out, sx + 32.0, y, "start", "", &e.name);
        x += w;
    }
}

/// An "x" of half-width `r` centred on `(cx, cy)`.
fn cross(out: &mut String, (cx, cy): (f64, f64), r: f64, color: &str) {
    let style = format!(r#"stroke="{color}" stroke-width="2.5" stroke-linecap="round""#);
    line(out, (cx - r, cy - r), (cx + r, cy + r), &style);
    line(out, (cx - r, cy + r), (cx + r, cy - r), &style);
}

/// Radius of a [`Style::Markers`] dot and half-width of a cross, pixels.
pub(super) const MARKER_R: f64 = 5.0;

/// The labelled horizontal lines, labels kept apart.
fn hlines(out: &mut String, a: Area, y: &Axis, lines: &[super::HLine], unit: Unit) {
    let pys: Vec<f64> = lines.iter().map(|l| a.py(y, l.y)).collect();
    let bases = hline_label_baselines(&pys);
    for ((l, py), base) in lines.iter().zip(pys).zip(bases) {
        line(
            out,
            (a.left, py),
            (a.right, py),
            &format!(r#"stroke="{HLINE}" stroke-width="1.5" stroke-dasharray="8 4""#),
        );
        let label = format!("{} {}", l.label, format_value(l.y, unit));
        // A white halo keeps the label readable over marks and data.
        text(
            out,
            a.right - 4.0,
            base,
            "end",
            r##" font-size="11" stroke="#ffffff" stroke-width="3" paint-order="stroke""##,
            &label,
        );
    }
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

pub fn line_chart(c: &LineChart, w: f64, h: f64, opts: &LineOptions) -> String {
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
    let has_data = c.series.iter().any(|s| finite(&s.points).next().is_some());
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
    let _ = write!(
        out,
        r#"<defs><clipPath id="{CLIP_ID}"><rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}"/></clipPath></defs>"#,
        a.left,
        a.top,
        a.right - a.left,
        a.bottom - a.top
    );
    y_axis(&mut out, a, &y, &c.y_label);
    x_axis(&mut out, a, &x, &c.x_label);
    frame(&mut out, a);
    if !has_data {
        text(
            &mut out,
            (a.left + a.right) / 2.0,
            (a.top + a.bottom) / 2.0,
            "middle",
            r##" fill="#888888" font-size="15""##,
            "no data",
        );
    }
    let _ = write!(out, r#"<g clip-path="url(#{CLIP_ID})">"#);
    hlines(&mut out, a, &y, &c.hlines, c.y_unit);
    for (i, s) in c.series.iter().enumerate() {
        let pts: Vec<(f64, f64)> = finite(&s.points)
            .map(|(px, py)| (a.px(&x, px), a.py(&y, py)))
            .collect();
        let col = series_color(s, i);
        match s.style {
            Style::Line => path(
                &mut out,
                &decimate(&pts),
                &format!(r#"stroke="{col}" stroke-width="1.8" stroke-linejoin="round""#),
            ),
            Style::Dashed => path(
                &mut out,
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
                    cross(&mut out, p, MARKER_R, &col);
                }
            }
        }
    }
    for (m, place) in c.marks.iter().zip(&places) {
        if place.is_some() {
            let px = a.px(&x, m.x);
            line(
                &mut out,
                (px, a.top),
                (px, a.bottom),
                &format!(r#"stroke="{MARK}" stroke-width="1.3" stroke-dasharray="4 3""#),
            );
        }
    }
    out.push_str("</g>");
    // Labels in a band above the plot, so they cover neither data nor lines.
    for (m, place) in c.marks.iter().zip(&places) {
        let Some((row, anchor)) = place else { continue };
        let px = a.px(&x, m.x);
        let tx = if *anchor == "end" { px - 3.0 } else { px + 3.0 };
        let ty = 46.0 + (*row as f64 + 1.0) * MARK_ROW - 3.0;
        line(
            &mut out,
            (px, ty - 9.0),
            (px, a.top),
            &format!(r#"stroke="{MARK}" stroke-width="1" stroke-opacity="0.5""#),
        );
        text(
            &mut out,
            tx,
            ty,
            anchor,
            &format!(r#" fill="{MARK}" font-size="11""#),
            &m.label,
        );
    }
    legend(&mut out, &entries, a.left, a.bottom + 56.0, w - 100.0);
    out.push_str("</svg>\n");
    let id = format!("plot-{:016x}", fnv1a(&out));
    out.replace(CLIP_ID, &id)
}

fn series_color(s: &super::Series, i: usize) -> String {
    s.color.clone().unwrap_or_else(|| color(i).to_string())
}

pub fn stacked_bars(c: &StackedBars, w: f64, h: f64) -> String {
    let n = c.categories.len();
    let value =
        |layer: &[f64], i: usize| layer.get(i).copied().filter(|v| v.is_finite() && *v > 0.0);
    let totals: Vec<f64> = (0..n)
        .map(|i| c.layers.iter().filter_map(|(_, l)| value(l, i)).sum())
        .collect();
    let top =
        extent(totals.iter().copied().chain(c.hlines.iter().map(|l| l.y))).map_or(1.0, |e| e.1);
    let y = Axis::new(0.0, top * 1.02, c.y_unit, 8);
    let slot_guess = (w - 102.0) / n.max(1) as f64;
    let longest = c
        .categories
        .iter()
        .map(|s| s.chars().count())
        .max()
        .unwrap_or(0) as f64;
    let rotate = longest * CHAR_W > slot_guess;
    let label_h = if rotate {
        (longest * CHAR_W * 0.6).min(110.0)
    } else {
        0.0
    };
    let mut entries: Vec<Entry> = c
        .layers
        .iter()
        .enumerate()
        .map(|(i, (name, _))| Entry {
            name: name.clone(),
            color: color(i).into(),
            kind: Swatch::Box,
        })
        .collect();
    entries.extend(c.hlines.iter().map(|l| Entry {
        name: l.label.clone(),
        color: HLINE.into(),
        kind: Swatch::Dashed,
    }));
    let rows = legend_rows(&entries, w - 100.0);
    let a = Area {
        left: 78.0,
        top: 46.0,
        right: w - 24.0,
        bottom: h - 56.0 - label_h - rows as f64 * 18.0,
    };
    let mut out = String::new();
    open(&mut out, w, h, &c.title);
    y_axis(&mut out, a, &y, &c.y_label);
    frame(&mut out, a);
    let slot = (a.right - a.left) / n.max(1) as f64;
    for (i, cat) in c.categories.iter().enumerate() {
        let bx = a.left + slot * (i as f64 + 0.15);
        let mut base = 0.0;
        for (k, (name, layer)) in c.layers.iter().enumerate() {
            let Some(v) = value(layer, i) else { continue };
            let (y_top, y_bot) = (a.py(&y, base + v), a.py(&y, base));
            let _ = write!(
                out,
                r#"<rect x="{bx:.1}" y="{y_top:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{}</title></rect>"#,
                slot * 0.7,
                (y_bot - y_top).max(0.0),
                color(k),
                esc(&format!("{cat}: {name} {}", format_value(v, c.y_unit)))
            );
            base += v;
        }
        let cx = a.left + slot * (i as f64 + 0.5);
        if rotate {
            let ty = a.bottom + 14.0;
            text(
                &mut out,
                cx,
                ty,
                "end",
                &format!(r#" transform="rotate(-35 {cx:.1} {ty:.1})""#),
                cat,
            );
        } else {
            text(&mut out, cx, a.bottom + 16.0, "middle", "", cat);
        }
    }
    hlines(&mut out, a, &y, &c.hlines, c.y_unit);
    let cx = (a.left + a.right) / 2.0;
    text(
        &mut out,
        cx,
        a.bottom + label_h + 34.0,
        "middle",
        r#" font-size="13""#,
        &c.x_label,
    );
    legend(
        &mut out,
        &entries,
        a.left,
        a.bottom + label_h + 56.0,
        w - 100.0,
    );
    out.push_str("</svg>\n");
    out
}
