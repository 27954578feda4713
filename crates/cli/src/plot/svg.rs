//! SVG drawing of the charts. Hand-written: a chart is a few dozen
//! elements, and no plotting crate would spare us the layout decisions.

use super::axis::{extent, format_value, Axis, Unit};
use super::labels::hline_label_baselines;
use super::{escape_xml as esc, StackedBars};
use std::fmt::Write as _;

mod line;
pub use line::line_chart;

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

pub fn stacked_bars(c: &StackedBars, w: f64, h: f64) -> String {
    let n = c.categories.len();
    let y = Axis::new(0.0, bars_top(c) * 1.02, c.y_unit, 8);
    let (rotate, label_h) = category_label_room(c, w);
    let entries = bar_entries(c);
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
        bar(&mut out, a, &y, c, (i, slot));
        category_label(&mut out, a, cat, a.left + slot * (i as f64 + 0.5), rotate);
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

/// Layer `layer`'s value in category `i`, when there is one to draw.
fn bar_value(layer: &[f64], i: usize) -> Option<f64> {
    layer.get(i).copied().filter(|v| v.is_finite() && *v > 0.0)
}

/// The highest bar or horizontal line (1 when there is none).
fn bars_top(c: &StackedBars) -> f64 {
    let totals: Vec<f64> = (0..c.categories.len())
        .map(|i| c.layers.iter().filter_map(|(_, l)| bar_value(l, i)).sum())
        .collect();
    extent(totals.iter().copied().chain(c.hlines.iter().map(|l| l.y))).map_or(1.0, |e| e.1)
}

/// Whether the category labels are turned (they would not fit side by
/// side in a chart `w` wide), and the height they then take.
fn category_label_room(c: &StackedBars, w: f64) -> (bool, f64) {
    let slot_guess = (w - 102.0) / c.categories.len().max(1) as f64;
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
    (rotate, label_h)
}

/// One legend box per layer, then one entry per horizontal line.
fn bar_entries(c: &StackedBars) -> Vec<Entry> {
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
    entries
}

/// Category `i`'s stack in its slot, each layer with its value as a tooltip.
fn bar(out: &mut String, a: Area, y: &Axis, c: &StackedBars, (i, slot): (usize, f64)) {
    let cat = &c.categories[i];
    let bx = a.left + slot * (i as f64 + 0.15);
    let mut base = 0.0;
    for (k, (name, layer)) in c.layers.iter().enumerate() {
        let Some(v) = bar_value(layer, i) else {
            continue;
        };
        let (y_top, y_bot) = (a.py(y, base + v), a.py(y, base));
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
}

/// A category's name under its bar, centred on `cx` (turned when `rotate`).
fn category_label(out: &mut String, a: Area, cat: &str, cx: f64, rotate: bool) {
    if rotate {
        let ty = a.bottom + 14.0;
        text(
            out,
            cx,
            ty,
            "end",
            &format!(r#" transform="rotate(-35 {cx:.1} {ty:.1})""#),
            cat,
        );
    } else {
        text(out, cx, a.bottom + 16.0, "middle", "", cat);
    }
}
