//! SVG of a heatmap: a grid of cells on a sequential colour scale
//! (viridis, readable in grey), with its colour bar as the legend.

use super::axis::{format_value, Unit};
use super::svg::{open, text, Area, CHAR_W};
use super::{escape_xml as esc, Heatmap};
use std::fmt::Write as _;

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

/// Where the grid sits and how big its cells are.
struct Grid {
    a: Area,
    cw: f64,
    ch: f64,
    /// Column labels are rotated when wider than a cell.
    rotate: bool,
    col_chars: f64,
    /// Height the rotated column labels take below the grid.
    col_h: f64,
}

impl Grid {
    fn of(c: &Heatmap) -> Grid {
        let (nr, nc) = (c.rows.len(), c.cols.len());
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
        Grid {
            a,
            cw,
            ch,
            rotate,
            col_chars,
            col_h,
        }
    }
}

pub fn heatmap(c: &Heatmap) -> String {
    let g = Grid::of(c);
    let (lo, hi) = c.range();
    // Wide enough for the title (17 px bold: about 10.5 px a character),
    // which a narrow grid of few GPUs would otherwise clip at both ends.
    let title_w = c.title.chars().count() as f64 * 10.5 + 40.0;
    let w = (g.a.right + 130.0).max(420.0).max(title_w);
    let h = (g.a.bottom + g.col_h + 76.0).max(g.a.top + 230.0);
    let mut out = String::new();
    open(&mut out, w, h, &c.title);
    cells(&mut out, c, &g, lo, hi);
    labels(&mut out, c, &g);
    colour_bar(&mut out, g.a.right + 24.0, g.a.top, lo, hi, c.unit);
    out.push_str("</svg>\n");
    out
}

/// The cells, coloured from `lo` to `hi`, each with its value as a tooltip
/// (and as text when the cells are large enough).
fn cells(out: &mut String, c: &Heatmap, g: &Grid, lo: f64, hi: f64) {
    let (a, cw, ch) = (&g.a, g.cw, g.ch);
    let cell = |r: usize, k: usize| {
        c.values
            .get(r)
            .and_then(|row| row.get(k).copied().flatten())
            .filter(|v| v.is_finite())
    };
    let show_values = cw >= 44.0 && ch >= 16.0;
    for r in 0..c.rows.len() {
        for k in 0..c.cols.len() {
            let (x0, y0) = (a.left + cw * k as f64, a.top + ch * r as f64);
            let v = cell(r, k);
            let (fill, white) = match v {
                Some(v) if hi > lo => viridis((v - lo) / (hi - lo)),
                Some(_) => viridis(1.0),
                None => ("#eeeeee".to_string(), false),
            };
            let shown = v.map_or("missing".into(), |v| format_value(v, c.unit));
            let tip = format!("{} / {}: {shown}", c.rows[r], c.cols[k]);
            let _ = write!(
                out,
                r##"<rect x="{x0:.1}" y="{y0:.1}" width="{cw:.1}" height="{ch:.1}" fill="{fill}" stroke="#ffffff" stroke-width="{}"><title>{}</title></rect>"##,
                if cw > 8.0 && ch > 8.0 { 1 } else { 0 },
                esc(&tip)
            );
            if show_values {
                let label = v.map_or("–".into(), |v| format_value(v, c.unit));
                let fill = if white { "#ffffff" } else { "#000000" };
                let style = format!(r#" fill="{fill}" font-size="10""#);
                text(
                    out,
                    x0 + cw / 2.0,
                    y0 + ch / 2.0 + 4.0,
                    "middle",
                    &style,
                    &label,
                );
            }
        }
    }
}

/// Row and column labels (as many as fit), and both axis titles.
fn labels(out: &mut String, c: &Heatmap, g: &Grid) {
    let (a, cw, ch) = (&g.a, g.cw, g.ch);
    let every = label_every(c.rows.len(), ch, 13.0);
    for (r, name) in c.rows.iter().enumerate().step_by(every) {
        let y = a.top + ch * (r as f64 + 0.5) + 4.0;
        text(out, a.left - 5.0, y, "end", "", name);
    }
    let need = if g.rotate {
        13.0
    } else {
        g.col_chars * CHAR_W + 4.0
    };
    let every = label_every(c.cols.len(), cw, need);
    for (k, name) in c.cols.iter().enumerate().step_by(every) {
        let cx = a.left + cw * (k as f64 + 0.5);
        let ty = a.bottom + 14.0;
        if g.rotate {
            let turn = format!(r#" transform="rotate(-35 {cx:.1} {ty:.1})""#);
            text(out, cx, ty, "end", &turn, name);
        } else {
            text(out, cx, ty, "middle", "", name);
        }
    }
    let x = (a.left + a.right) / 2.0;
    let y = a.bottom + g.col_h + 34.0;
    text(out, x, y, "middle", r#" font-size="13""#, &c.x_label);
    let cy = (a.top + a.bottom) / 2.0;
    let turn = format!(r#" transform="rotate(-90 14 {cy:.1})" font-size="13""#);
    text(out, 14.0, cy, "middle", &turn, &c.y_label);
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
