//! The charts drawn with characters, for a terminal: braille dots (2 × 4
//! per character) for lines, block shades for bars and heatmaps. No colour
//! codes, so the output reads the same in a pipe or a log.

use super::axis::{extent, format_value, Axis, Unit};
use super::{finite, Heatmap, LineChart, StackedBars, Style};

/// Braille dot bits of a cell, by (column, row) within it.
const DOTS: [[u32; 4]; 2] = [[0x01, 0x02, 0x04, 0x40], [0x08, 0x10, 0x20, 0x80]];

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else if n == 0 {
        String::new()
    } else {
        let mut t: String = s.chars().take(n - 1).collect();
        t.push('…');
        t
    }
}

fn pad_left(s: &str, n: usize) -> String {
    format!("{}{s}", " ".repeat(n.saturating_sub(s.chars().count())))
}

/// Wraps `items` into lines of at most `width` characters.
fn wrap(items: &[String], width: usize) -> Vec<String> {
    let mut lines: Vec<String> = vec![];
    for it in items {
        let it = truncate(it, width);
        match lines.last_mut() {
            Some(l) if l.chars().count() + 2 + it.chars().count() <= width => {
                l.push_str("  ");
                l.push_str(&it);
            }
            _ => lines.push(it),
        }
    }
    lines
}

/// A braille canvas of `w` × `h` characters.
struct Canvas {
    w: usize,
    h: usize,
    bits: Vec<u32>,
    over: Vec<Option<char>>,
}

impl Canvas {
    fn new(w: usize, h: usize) -> Self {
        Canvas {
            w,
            h,
            bits: vec![0; w * h],
            over: vec![None; w * h],
        }
    }
    /// Sets the dot at (`x`, `y`), dot coordinates, y = 0 at the top.
    fn dot(&mut self, x: i64, y: i64) {
        if x < 0 || y < 0 || x >= 2 * self.w as i64 || y >= 4 * self.h as i64 {
            return;
        }
        let (cx, cy) = (x as usize / 2, y as usize / 4);
        self.bits[cy * self.w + cx] |= DOTS[x as usize % 2][y as usize % 4];
    }
    /// A line of dots; `dashed` leaves every other run of 3 dots out.
    fn segment(&mut self, (x0, y0): (i64, i64), (x1, y1): (i64, i64), dashed: bool) {
        let n = (x1 - x0).abs().max((y1 - y0).abs()).clamp(1, 4000);
        for k in 0..=n {
            if dashed && (k / 3) % 2 == 1 {
                continue;
            }
            let x = x0 + (x1 - x0) * k / n;
            let y = y0 + (y1 - y0) * k / n;
            self.dot(x, y);
        }
    }
    /// Puts `c` at cell (`cx`, `cy`) where no dot is, or always when `force`.
    fn put(&mut self, cx: usize, cy: usize, c: char, force: bool) {
        if cx < self.w && cy < self.h && (force || self.bits[cy * self.w + cx] == 0) {
            self.over[cy * self.w + cx] = Some(c);
        }
    }
    fn row(&self, cy: usize) -> String {
        (0..self.w)
            .map(|cx| {
                let i = cy * self.w + cx;
                self.over[i].unwrap_or_else(|| char::from_u32(0x2800 + self.bits[i]).unwrap_or(' '))
            })
            .map(|c| if c == '\u{2800}' { ' ' } else { c })
            .collect()
    }
}

/// Letters that tag each series' last point when there are several.
fn tag(i: usize) -> char {
    (b'A' + (i % 26) as u8) as char
}

pub fn line_chart(c: &LineChart, cols: usize, rows: usize) -> String {
    let cols = cols.max(20);
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
    let (x0, x1) = extent(xs).unwrap_or((0.0, 1.0));
    let (y0, y1) = extent(ys).unwrap_or((0.0, 1.0));
    let y0 = if c.y_unit == Unit::Plain {
        y0
    } else {
        y0.min(0.0)
    };
    let legend = wrap(&legend_of(c), cols);
    let plot_rows = rows.saturating_sub(5 + legend.len()).max(3);
    let y = Axis::new(
        y0,
        y1 + (y1 - y0) * 0.02,
        c.y_unit,
        (plot_rows / 3).clamp(2, 6),
    );
    let label_w = y.ticks.iter().map(|t| y.label(*t).len()).max().unwrap_or(1);
    let plot_cols = cols.saturating_sub(label_w + 1).max(8);
    let x = Axis::new(x0, x1, c.x_unit, (plot_cols / 12).clamp(2, 8));

    let mut cv = Canvas::new(plot_cols, plot_rows);
    let dx = |v: f64| (x.frac(v) * (2 * plot_cols - 1) as f64).round() as i64;
    let dy = |v: f64| ((1.0 - y.frac(v)) * (4 * plot_rows - 1) as f64).round() as i64;
    draw_lines(&mut cv, c, &dx, &dy);

    let mut out = vec![truncate(&c.title, cols)];
    out.push(truncate(&format!("{}↑", y.title(&c.y_label)), cols));
    let tick_rows: Vec<(usize, String)> = y
        .ticks
        .iter()
        .map(|t| ((dy(*t).max(0) / 4) as usize, y.label(*t)))
        .collect();
    for cy in 0..plot_rows {
        let label = tick_rows
            .iter()
            .find(|(r, _)| *r == cy)
            .map_or(String::new(), |(_, l)| l.clone());
        let axis = if label.is_empty() { '│' } else { '┤' };
        out.push(format!("{}{axis}{}", pad_left(&label, label_w), cv.row(cy)));
    }
    out.push(format!("{}└{}", " ".repeat(label_w), "─".repeat(plot_cols)));
    out.push(x_ticks(&x, label_w, plot_cols, &dx));
    let xt = format!("{} →", x.title(&c.x_label));
    out.push(pad_left(&xt, (cols + xt.chars().count()) / 2));
    out.extend(legend);
    out.join("\n") + "\n"
}

/// The legend's entries: each series (tagged `A:`, `B:` when several), the
/// horizontal lines with their values, the marks.
fn legend_of(c: &LineChart) -> Vec<String> {
    let many = c.series.len() > 1;
    let mut legend: Vec<String> = c
        .series
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let key = match (many, s.style) {
                (true, _) => format!("{}:", tag(i)),
                (false, Style::Dashed) => "┄".into(),
                (false, _) => "⣀".into(),
            };
            let dashed = if many && s.style == Style::Dashed {
                " (dashed)"
            } else {
                ""
            };
            format!("{key} {}{dashed}", s.name)
        })
        .collect();
    legend.extend(
        c.hlines
            .iter()
            .map(|l| format!("─ {} {}", l.label, format_value(l.y, c.y_unit))),
    );
    legend.extend(c.marks.iter().map(|m| format!("│ {}", m.label)));
    legend
}

/// The series, horizontal lines and marks on the canvas; `dx`/`dy` map
/// values to dot coordinates.
fn draw_lines(cv: &mut Canvas, c: &LineChart, dx: &dyn Fn(f64) -> i64, dy: &dyn Fn(f64) -> i64) {
    for s in &c.series {
        let pts: Vec<(i64, i64)> = finite(&s.points).map(|(a, b)| (dx(a), dy(b))).collect();
        match s.style {
            st if st.is_points() => pts.iter().for_each(|&(a, b)| cv.dot(a, b)),
            style => {
                if let [only] = pts[..] {
                    cv.dot(only.0, only.1);
                }
                for w in pts.windows(2) {
                    cv.segment(w[0], w[1], style == Style::Dashed);
                }
            }
        }
    }
    for l in &c.hlines {
        let cy = (dy(l.y).max(0) / 4) as usize;
        (0..cv.w).for_each(|cx| cv.put(cx, cy, '─', false));
    }
    for m in &c.marks {
        let cx = (dx(m.x).max(0) / 2) as usize;
        (0..cv.h).for_each(|cy| cv.put(cx, cy, '│', false));
    }
    if c.series.len() > 1 {
        for (i, s) in c.series.iter().enumerate() {
            if let Some((a, b)) = finite(&s.points).last() {
                let (px, py) = (dx(a).max(0) as usize / 2, dy(b).max(0) as usize / 4);
                cv.put(px, py, tag(i), true);
            }
        }
    }
}

/// The x axis' tick labels under their ticks, never overlapping.
fn x_ticks(x: &Axis, label_w: usize, plot_cols: usize, dx: &dyn Fn(f64) -> i64) -> String {
    let mut ticks = vec![' '; plot_cols + label_w + 1];
    let mut free_from = 0;
    for t in &x.ticks {
        let l = x.label(*t);
        let centre = label_w + 1 + (dx(*t).max(0) / 2) as usize;
        let start = centre.saturating_sub(l.len() / 2).max(free_from);
        if start + l.len() > ticks.len() {
            continue;
        }
        for (k, ch) in l.chars().enumerate() {
            ticks[start + k] = ch;
        }
        free_from = start + l.len() + 1;
    }
    ticks.into_iter().collect::<String>().trim_end().to_string()
}

/// Layer fills, bottom layer first.
const FILLS: [char; 8] = ['█', '▓', '▒', '░', '#', '=', '+', ':'];

pub fn stacked_bars(c: &StackedBars, cols: usize, rows: usize) -> String {
    let cols = cols.max(20);
    let n = c.categories.len();
    let totals: Vec<f64> = (0..n)
        .map(|i| c.layers.iter().filter_map(|(_, l)| bar_value(l, i)).sum())
        .collect();
    let top = extent(totals.iter().copied().chain(c.hlines.iter().map(|l| l.y)))
        .map_or(1.0, |e| e.1)
        .max(f64::MIN_POSITIVE);
    let name_w = c
        .categories
        .iter()
        .map(|s| s.chars().count())
        .max()
        .unwrap_or(0)
        .min(cols / 3);
    let bar_w = cols.saturating_sub(name_w + 13).max(5);
    let mut out = vec![truncate(&c.title, cols)];
    let legend = wrap(&bar_legend(c), cols);
    let room = rows.saturating_sub(3 + legend.len()).max(1);
    out.push(truncate(&format!("{} by {}", c.y_label, c.x_label), cols));
    for (i, cat) in c.categories.iter().enumerate().take(room) {
        let name = pad_left(&truncate(cat, name_w), name_w);
        let bar = bar_chars(c, i, top, bar_w);
        out.push(format!(
            "{name} │{bar} {}",
            format_value(totals[i], c.y_unit)
        ));
    }
    if n > room {
        out.push(format!("… {} more", n - room));
    }
    out.extend(legend);
    out.join("\n") + "\n"
}

/// Layer `l`'s value in category `i`, when there is one to draw.
fn bar_value(l: &[f64], i: usize) -> Option<f64> {
    l.get(i).copied().filter(|v| v.is_finite() && *v > 0.0)
}

/// One key per layer (its fill), then one per horizontal line.
fn bar_legend(c: &StackedBars) -> Vec<String> {
    let mut legend: Vec<String> = c
        .layers
        .iter()
        .enumerate()
        .map(|(k, (name, _))| format!("{} {name}", FILLS[k % FILLS.len()]))
        .collect();
    legend.extend(
        c.hlines
            .iter()
            .map(|l| format!("┆ {} {}", l.label, format_value(l.y, c.y_unit))),
    );
    legend
}

/// Category `i`'s bar, `bar_w` characters for `top`: each layer in its
/// fill, the horizontal lines where no layer covers them.
fn bar_chars(c: &StackedBars, i: usize, top: f64, bar_w: usize) -> String {
    let mut bar: Vec<char> = vec![' '; bar_w];
    let mut base = 0.0;
    for (k, (_, l)) in c.layers.iter().enumerate() {
        let Some(v) = bar_value(l, i) else { continue };
        let from = (base / top * bar_w as f64).round() as usize;
        let to = ((base + v) / top * bar_w as f64).round() as usize;
        (from..to.min(bar_w)).for_each(|j| bar[j] = FILLS[k % FILLS.len()]);
        base += v;
    }
    for l in &c.hlines {
        let j = ((l.y / top * bar_w as f64).round() as usize).min(bar_w - 1);
        if bar[j] == ' ' {
            bar[j] = '┆';
        }
    }
    bar.into_iter().collect()
}

/// Shades from low to high.
const SHADES: [char; 5] = ['·', '░', '▒', '▓', '█'];

pub fn heatmap(c: &Heatmap, cols: usize, rows: usize) -> String {
    let cols = cols.max(20);
    let nr = c.rows.len();
    let g = HeatGrid::of(c, cols);
    let mut out = vec![truncate(&c.title, cols)];
    out.push(truncate(
        &format!("{} (rows) × {} (columns)", c.y_label, c.x_label),
        cols,
    ));
    if g.values {
        let header: Vec<String> = c.cols[..g.shown_cols]
            .iter()
            .map(|h| pad_left(&truncate(h, g.cell_w), g.cell_w))
            .collect();
        out.push(format!("{} {}", " ".repeat(g.name_w), header.join(" ")));
    }
    let room = rows.saturating_sub(out.len() + 2).max(1);
    for r in 0..nr.min(room) {
        out.push(g.row(c, r));
    }
    if nr > room {
        out.push(format!("… {} more rows", nr - room));
    }
    out.push(truncate(&heat_foot(c, &g), cols));
    out.join("\n") + "\n"
}

/// How a heatmap's cells fit in `cols` characters.
struct HeatGrid {
    /// Width of the row names.
    name_w: usize,
    /// Width of a cell.
    cell_w: usize,
    /// Values where they fit, shades otherwise.
    values: bool,
    /// Columns that fit.
    shown_cols: usize,
    /// The range the shades span.
    lo: f64,
    hi: f64,
}

impl HeatGrid {
    fn of(c: &Heatmap, cols: usize) -> Self {
        let nc = c.cols.len();
        let (lo, hi) = c.range();
        let name_w = c
            .rows
            .iter()
            .map(|s| s.chars().count())
            .max()
            .unwrap_or(0)
            .min(cols / 3);
        let avail = cols.saturating_sub(name_w + 2);
        let values_w = 10;
        let (cell_w, values) = if nc * (values_w + 1) <= avail {
            (values_w, true)
        } else {
            ((avail / nc.max(1)).clamp(1, 3), false)
        };
        let shown_cols = (avail / (cell_w + usize::from(values)))
            .clamp(1, nc.max(1))
            .min(nc);
        HeatGrid {
            name_w,
            cell_w,
            values,
            shown_cols,
            lo,
            hi,
        }
    }

    /// Row `r`: its name, then each shown cell as a value or a shade.
    fn row(&self, c: &Heatmap, r: usize) -> String {
        let (lo, hi, cell_w) = (self.lo, self.hi, self.cell_w);
        let cell = |k: usize| {
            c.values
                .get(r)
                .and_then(|row| row.get(k).copied().flatten())
                .filter(|v| v.is_finite())
        };
        let name = pad_left(&truncate(&c.rows[r], self.name_w), self.name_w);
        let cells: Vec<String> = (0..self.shown_cols)
            .map(|k| match (cell(k), self.values) {
                (Some(v), true) => pad_left(&format_value(v, c.unit), cell_w),
                (None, true) => pad_left("-", cell_w),
                (Some(v), false) => {
                    let f = if hi > lo { (v - lo) / (hi - lo) } else { 1.0 };
                    let s = 1 + ((f * 3.0).round() as usize).min(3);
                    SHADES[s].to_string().repeat(cell_w)
                }
                (None, false) => " ".repeat(cell_w),
            })
            .collect();
        let sep = if self.values { " " } else { "" };
        format!("{name} {}", cells.join(sep))
    }
}

/// The scale, and how many columns were left out.
fn heat_foot(c: &Heatmap, g: &HeatGrid) -> String {
    let (lo, hi, shown_cols) = (g.lo, g.hi, g.shown_cols);
    let nc = c.cols.len();
    let mut foot = format!(
        "{} {} to {} {}",
        SHADES[1],
        format_value(lo, c.unit),
        SHADES[4],
        format_value(hi, c.unit)
    );
    if shown_cols < nc {
        foot.push_str(&format!("; {} of {} columns shown", shown_cols, nc));
    }
    foot
}
