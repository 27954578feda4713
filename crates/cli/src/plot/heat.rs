//! SVG of a heatmap: a grid of cells on a sequential colour scale
//! (viridis, readable in grey), with its colour bar as the legend.

use super::axis::{extent, format_value, Unit};
use super::svg::{open, text, Area, CHAR_W};
use super::{escape_xml as esc, HeatOptions, Heatmap};
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

pub fn heatmap(c: &Heatmap, opts: &HeatOptions) -> String {
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
            let word = opts
                .labels
                .get(r)
                .and_then(|row| row.get(k).cloned().flatten());
            let shown = word
                .clone()
                .unwrap_or_else(|| v.map_or("–".into(), |v| format_value(v, c.unit)));
            let tip = format!(
                "{} / {}: {}",
                c.rows[r],
                c.cols[k],
                word.unwrap_or_else(|| v.map_or("missing".into(), |v| format_value(v, c.unit)))
            );
            let _ = write!(
                out,
                r##"<rect x="{x0:.1}" y="{y0:.1}" width="{cw:.1}" height="{ch:.1}" fill="{fill}" stroke="#ffffff" stroke-width="{}"><title>{}</title></rect>"##,
                if cw > 8.0 && ch > 8.0 { 1 } else { 0 },
                esc(&tip)
            );
            if show_values {
                let label = shown;
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
