//! SVG drawing of the charts. Hand-written: a chart is a few dozen
//! elements, and no plotting crate would spare us the layout decisions.

use super::axis::{extent, format_value, Axis, Unit};
use super::{escape_xml as esc, finite, Heatmap, LineChart, StackedBars, Style};
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
const CHAR_W: f64 = 6.8;

fn color(i: usize) -> &'static str {
    PALETTE[i % PALETTE.len()]
}

/// The plot area inside the margins.
#[derive(Clone, Copy)]
struct Area {
    left: f64,
    top: f64,
    right: f64,
    bottom: f64,
}

impl Area {
    fn px(&self, x: &Axis, v: f64) -> f64 {
        self.left + x.frac(v) * (self.right - self.left)
    }
    fn py(&self, y: &Axis, v: f64) -> f64 {
        self.bottom - y.frac(v) * (self.bottom - self.top)
    }
}

fn open(out: &mut String, w: f64, h: f64, title: &str) {
    let _ = write!(
        out,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w:.0}" height="{h:.0}" viewBox="0 0 {w:.0} {h:.0}" font-family="sans-serif" font-size="12"><title>{t}</title><rect width="100%" height="100%" fill="#ffffff"/><text x="{cx:.1}" y="26" text-anchor="middle" font-size="17" font-weight="bold">{t}</text>"##,
        t = esc(title),
        cx = w / 2.0
    );
}

fn text(out: &mut String, x: f64, y: f64, anchor: &str, extra: &str, s: &str) {
    let _ = write!(
        out,
        r#"<text x="{x:.1}" y="{y:.1}" text-anchor="{anchor}"{extra}>{}</text>"#,
        esc(s)
    );
}

fn line(out: &mut String, (x1, y1): (f64, f64), (x2, y2): (f64, f64), style: &str) {
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
    color: &'static str,
    kind: Swatch,
}

#[derive(Clone, Copy)]
enum Swatch {
    Line,
    Dashed,
    Dot,
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
        let c = e.color;
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

pub fn line_chart(c: &LineChart, w: f64, h: f64) -> String {
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
    let (x0, x1) = extent(xs).unwrap_or((0.0, 1.0));
    let (y0, y1) = extent(ys).unwrap_or((0.0, 1.0));
    // Memory, time and percentages are read from zero.
    let y0 = if c.y_unit == Unit::Plain {
        y0
    } else {
        y0.min(0.0)
    };
    let x = Axis::new(x0, x1, c.x_unit, 8);
    let y = Axis::new(y0, y1 * 1.02, c.y_unit, 6);

    let mut entries: Vec<Entry> = c
        .series
        .iter()
        .enumerate()
        .map(|(i, s)| Entry {
            name: s.name.clone(),
            color: color(i),
            kind: match s.style {
                Style::Line => Swatch::Line,
                Style::Dashed => Swatch::Dashed,
                Style::Points => Swatch::Dot,
            },
        })
        .collect();
    entries.extend(c.hlines.iter().map(|l| Entry {
        name: l.label.clone(),
        color: HLINE,
        kind: Swatch::Dashed,
    }));
    let rows = legend_rows(&entries, w - 100.0);
    let a = Area {
        left: 78.0,
        top: 46.0,
        right: w - 24.0,
        bottom: h - 56.0 - rows as f64 * 18.0,
    };

    let mut out = String::new();
    open(&mut out, w, h, &c.title);
    let _ = write!(
        out,
        r#"<defs><clipPath id="plot"><rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}"/></clipPath></defs>"#,
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
    out.push_str(r#"<g clip-path="url(#plot)">"#);
    for l in &c.hlines {
        let py = a.py(&y, l.y);
        line(
            &mut out,
            (a.left, py),
            (a.right, py),
            &format!(r#"stroke="{HLINE}" stroke-width="1.5" stroke-dasharray="8 4""#),
        );
        let label = format!("{} {}", l.label, format_value(l.y, c.y_unit));
        text(
            &mut out,
            a.right - 4.0,
            py - 4.0,
            "end",
            r#" font-size="11""#,
            &label,
        );
    }
    for (i, s) in c.series.iter().enumerate() {
        let pts: Vec<(f64, f64)> = finite(&s.points)
            .map(|(px, py)| (a.px(&x, px), a.py(&y, py)))
            .collect();
        let col = color(i);
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
        }
    }
    for (i, m) in c.marks.iter().enumerate() {
        if !m.x.is_finite() {
            continue;
        }
        let px = a.px(&x, m.x);
        line(
            &mut out,
            (px, a.top),
            (px, a.bottom),
            &format!(r#"stroke="{MARK}" stroke-width="1.3" stroke-dasharray="4 3""#),
        );
        // Staggered in three rows, so transitions close in time stay legible.
        let ty = a.top + 14.0 + (i % 3) as f64 * 14.0;
        let (tx, anchor) = if px > a.left + 0.75 * (a.right - a.left) {
            (px - 3.0, "end")
        } else {
            (px + 3.0, "start")
        };
        text(
            &mut out,
            tx,
            ty,
            anchor,
            &format!(r#" fill="{MARK}" font-size="11""#),
            &m.label,
        );
    }
    out.push_str("</g>");
    legend(&mut out, &entries, a.left, a.bottom + 56.0, w - 100.0);
    out.push_str("</svg>\n");
    out
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
    let y = Axis::new(0.0, top * 1.02, c.y_unit, 6);
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
            color: color(i),
            kind: Swatch::Box,
        })
        .collect();
    entries.extend(c.hlines.iter().map(|l| Entry {
        name: l.label.clone(),
        color: HLINE,
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
    for l in &c.hlines {
        let py = a.py(&y, l.y);
        line(
            &mut out,
            (a.left, py),
            (a.right, py),
            &format!(r#"stroke="{HLINE}" stroke-width="1.5" stroke-dasharray="8 4""#),
        );
        let label = format!("{} {}", l.label, format_value(l.y, c.y_unit));
        text(
            &mut out,
            a.right - 4.0,
            py - 4.0,
            "end",
            r#" font-size="11""#,
            &label,
        );
    }
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

/// Viridis at five stops, for a sequential colour scale readable in grey.
const VIRIDIS: [(f64, f64, f64); 5] = [
    (68.0, 1.0, 84.0),
    (59.0, 82.0, 139.0),
    (33.0, 145.0, 140.0),
    (94.0, 201.0, 98.0),
    (253.0, 231.0, 37.0),
];

/// The colour of `f` in 0..1, and whether text on it should be white.
pub fn viridis(f: f64) -> (String, bool) {
    let f = if f.is_finite() {
        f.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let pos = f * 4.0;
    let i = (pos.floor() as usize).min(3);
    let t = pos - i as f64;
    let (a, b) = (VIRIDIS[i], VIRIDIS[i + 1]);
    let mix = |p: f64, q: f64| (p + (q - p) * t).round() as u8;
    (
        format!(
            "#{:02x}{:02x}{:02x}",
            mix(a.0, b.0),
            mix(a.1, b.1),
            mix(a.2, b.2)
        ),
        f < 0.55,
    )
}

/// Every `k`-th label, so that about `room / size` of them fit.
fn label_every(n: usize, size: f64, room: f64) -> usize {
    if size >= room {
        1
    } else {
        ((room / size).ceil() as usize).clamp(1, n.max(1))
    }
}

pub fn heatmap(c: &Heatmap) -> String {
    let (nr, nc) = (c.rows.len(), c.cols.len());
    let cell = |r: usize, k: usize| {
        c.values
            .get(r)
            .and_then(|row| row.get(k).copied().flatten())
            .filter(|v| v.is_finite())
    };
    let all = (0..nr).flat_map(|r| (0..nc).filter_map(move |k| cell(r, k)));
    let (lo, hi) = extent(all).unwrap_or((0.0, 1.0));
    let cw = (640.0 / nc.max(1) as f64).clamp(3.0, 90.0);
    let ch = (400.0 / nr.max(1) as f64).clamp(3.0, 34.0);
    let row_chars = c.rows.iter().map(|s| s.chars().count()).max().unwrap_or(0) as f64;
    let col_chars = c.cols.iter().map(|s| s.chars().count()).max().unwrap_or(0) as f64;
    let rotate = col_chars * CHAR_W > cw;
    let col_h = if rotate {
        (col_chars * CHAR_W * 0.6).min(110.0)
    } else {
        0.0
    };
    let left = 40.0 + (row_chars * CHAR_W).min(160.0);
    let a = Area {
        left,
        top: 46.0,
        right: left + cw * nc as f64,
        bottom: 46.0 + ch * nr as f64,
    };
    let w = (a.right + 130.0).max(420.0);
    let h = (a.bottom + col_h + 76.0).max(a.top + 230.0);
    let mut out = String::new();
    open(&mut out, w, h, &c.title);
    let show_values = cw >= 44.0 && ch >= 16.0;
    for r in 0..nr {
        for k in 0..nc {
            let (x0, y0) = (a.left + cw * k as f64, a.top + ch * r as f64);
            let v = cell(r, k);
            let (fill, white) = match v {
                Some(v) if hi > lo => viridis((v - lo) / (hi - lo)),
                Some(_) => viridis(1.0),
                None => ("#eeeeee".to_string(), false),
            };
            let tip = format!(
                "{} / {}: {}",
                c.rows[r],
                c.cols[k],
                v.map_or("missing".into(), |v| format_value(v, c.unit))
            );
            let _ = write!(
                out,
                r##"<rect x="{x0:.1}" y="{y0:.1}" width="{cw:.1}" height="{ch:.1}" fill="{fill}" stroke="#ffffff" stroke-width="{}"><title>{}</title></rect>"##,
                if cw > 8.0 && ch > 8.0 { 1 } else { 0 },
                esc(&tip)
            );
            if show_values {
                let label = v.map_or("–".into(), |v| format_value(v, c.unit));
                let fill = if white { "#ffffff" } else { "#000000" };
                text(
                    &mut out,
                    x0 + cw / 2.0,
                    y0 + ch / 2.0 + 4.0,
                    "middle",
                    &format!(r#" fill="{fill}" font-size="10""#),
                    &label,
                );
            }
        }
    }
    let every = label_every(nr, ch, 13.0);
    for (r, name) in c.rows.iter().enumerate().step_by(every) {
        text(
            &mut out,
            a.left - 5.0,
            a.top + ch * (r as f64 + 0.5) + 4.0,
            "end",
            "",
            name,
        );
    }
    let need = if rotate {
        13.0
    } else {
        col_chars * CHAR_W + 4.0
    };
    let every = label_every(nc, cw, need);
    for (k, name) in c.cols.iter().enumerate().step_by(every) {
        let cx = a.left + cw * (k as f64 + 0.5);
        let ty = a.bottom + 14.0;
        if rotate {
            text(
                &mut out,
                cx,
                ty,
                "end",
                &format!(r#" transform="rotate(-35 {cx:.1} {ty:.1})""#),
                name,
            );
        } else {
            text(&mut out, cx, ty, "middle", "", name);
        }
    }
    text(
        &mut out,
        (a.left + a.right) / 2.0,
        a.bottom + col_h + 34.0,
        "middle",
        r#" font-size="13""#,
        &c.x_label,
    );
    let cy = (a.top + a.bottom) / 2.0;
    text(
        &mut out,
        14.0,
        cy,
        "middle",
        &format!(r#" transform="rotate(-90 14 {cy:.1})" font-size="13""#),
        &c.y_label,
    );
    colour_bar(&mut out, a.right + 24.0, a.top, lo, hi, c.unit);
    out.push_str("</svg>\n");
    out
}

/// The legend of a heatmap: the colour scale from `lo` (bottom) to `hi`
/// (top), and the swatch of a missing cell.
fn colour_bar(out: &mut String, x: f64, top: f64, lo: f64, hi: f64, unit: Unit) {
    out.push_str(r#"<defs><linearGradient id="scale" x1="0" y1="1" x2="0" y2="0">"#);
    for k in 0..=4 {
        let f = k as f64 / 4.0;
        let _ = write!(out, r#"<stop offset="{f}" stop-color="{}"/>"#, viridis(f).0);
    }
    out.push_str("</linearGradient></defs>");
    let hgt = 150.0;
    let _ = write!(
        out,
        r##"<rect x="{x:.1}" y="{top:.1}" width="16" height="{hgt}" fill="url(#scale)" stroke="#888888"/>"##
    );
    text(
        out,
        x + 22.0,
        top + 10.0,
        "start",
        "",
        &format_value(hi, unit),
    );
    text(
        out,
        x + 22.0,
        top + hgt,
        "start",
        "",
        &format_value(lo, unit),
    );
    let my = top + hgt + 18.0;
    let _ = write!(
        out,
        r##"<rect x="{x:.1}" y="{my:.1}" width="16" height="12" fill="#eeeeee" stroke="#888888"/>"##
    );
    text(out, x + 22.0, my + 10.0, "start", "", "missing");
}
