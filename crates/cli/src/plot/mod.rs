//! Charts shared by every command: line charts (memory over time), stacked
//! bars (breakdowns) and heatmaps (peaks across ranks), drawn as SVG or as
//! text for a terminal. Pure functions, no I/O.
//!
//! The SVG names only the generic `sans-serif` font family, so it renders
//! wherever it is opened, with no font installed by us; every chart has a
//! title, axis labels with units and a legend. All text is XML-escaped.
//!
//! Kept by hand rather than on `plotters`: one layout draws both the SVG and
//! the terminal text, the output is byte-stable for the tests and the docs'
//! captured charts, and three chart kinds need none of plotters' backends
//! (resvg only rasterises the SVG to PNG).

mod axis;
mod heat;
mod image;
mod labels;
mod svg;
#[cfg(test)]
mod tests;
mod text;

pub use axis::{format_value, Unit};
pub use heat::viridis;
pub use image::{
    check_image_path, fonts_available, svg_to_png, write_image, ImageError, ImageFormat, PNG_SCALE,
};

/// How a series is drawn.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Style {
    /// A solid line through the points.
    #[default]
    Line,
    /// A dashed line (fits, predictions).
    Dashed,
    /// Small dots only (raw samples: thousands of them).
    Points,
    /// Large dots (a handful of runs, each worth seeing).
    Markers,
    /// Large crosses (runs that failed, e.g. an OOM at its observed peak).
    Crosses,
}

impl Style {
    /// Whether the series is drawn as separate points (no line).
    pub fn is_points(self) -> bool {
        matches!(self, Style::Points | Style::Markers | Style::Crosses)
    }
}

/// The colour of the `i`-th series when none is given (cycling), for a
/// caller that wants two series in one colour (a fit and its dots).
pub fn palette(i: usize) -> &'static str {
    svg::PALETTE[i % svg::PALETTE.len()]
}

/// One named series of `(x, y)` points. Non-finite points are skipped.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Series {
    /// Shown in the legend.
    pub name: String,
    /// The points, in the x order to draw them.
    pub points: Vec<(f64, f64)>,
    /// How to draw it.
    pub style: Style,
    /// An SVG colour (`#1f77b4`, see [`palette`]); None: the next colour of
    /// the palette by the series' position.
    pub color: Option<String>,
}

impl Series {
    /// A series drawn in `style`.
    pub fn new(name: impl Into<String>, points: Vec<(f64, f64)>, style: Style) -> Self {
        Series {
            name: name.into(),
            points,
            style,
            color: None,
        }
    }
    /// The same series drawn in `color` (an SVG colour).
    pub fn with_color(mut self, color: impl Into<String>) -> Self {
        self.color = Some(color.into());
        self
    }
}

/// A horizontal line across the plot: total memory, a limit, a target.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HLine {
    /// Height, in the y axis' unit (bytes for a memory chart).
    pub y: f64,
    /// Written on the line and in the legend.
    pub label: String,
}

/// A vertical mark: an OOM, a risk transition.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Mark {
    /// Position, in the x axis' unit.
    pub x: f64,
    /// Written at the top of the mark.
    pub label: String,
}

/// Lines over an x axis (usually time).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LineChart {
    /// Title above the chart.
    pub title: String,
    /// X axis label, without the unit (the unit is added).
    pub x_label: String,
    /// Unit of x values.
    pub x_unit: Unit,
    /// Y axis label, without the unit.
    pub y_label: String,
    /// Unit of y values.
    pub y_unit: Unit,
    /// The series.
    pub series: Vec<Series>,
    /// Horizontal lines.
    pub hlines: Vec<HLine>,
    /// Vertical marks.
    pub marks: Vec<Mark>,
}

/// Bars per category, each split into stacked layers.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StackedBars {
    /// Title above the chart.
    pub title: String,
    /// Label under the categories.
    pub x_label: String,
    /// Y axis label, without the unit.
    pub y_label: String,
    /// Unit of the values.
    pub y_unit: Unit,
    /// One bar per category, left to right.
    pub categories: Vec<String>,
    /// `(layer name, value per category)`, bottom layer first. Missing or
    /// non-finite values count as 0.
    pub layers: Vec<(String, Vec<f64>)>,
    /// Horizontal lines (device limit, headroom target).
    pub hlines: Vec<HLine>,
}

/// A grid of values (rows × columns); `None` cells are drawn as missing.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Heatmap {
    /// Title above the chart.
    pub title: String,
    /// Label under the columns.
    pub x_label: String,
    /// Label beside the rows.
    pub y_label: String,
    /// Column names, left to right.
    pub cols: Vec<String>,
    /// Row names, top to bottom.
    pub rows: Vec<String>,
    /// `values[row][col]`; short rows are padded with `None`.
    pub values: Vec<Vec<Option<f64>>>,
    /// Unit of the values.
    pub unit: Unit,
    /// The colour scale's ends, e.g. `(0, device total)` for memory, so that
    /// 38 and 58 GiB of 80 look as far apart as they are, not as empty and
    /// full; `None`: the values' own smallest and largest. Values outside
    /// widen it.
    pub scale: Option<(f64, f64)>,
}

impl Heatmap {
    /// The ends of the colour scale: [`Heatmap::scale`] widened to every
    /// finite value, else the values' extent, else `(0, 1)`.
    pub fn range(&self) -> (f64, f64) {
        let vals = self
            .values
            .iter()
            .flatten()
            .flatten()
            .copied()
            .filter(|v| v.is_finite());
        let seen = axis::extent(vals);
        match (
            self.scale
                .filter(|(a, b)| a.is_finite() && b.is_finite() && b > a),
            seen,
        ) {
            (Some((a, b)), Some((lo, hi))) => (a.min(lo), b.max(hi)),
            (Some(s), None) => s,
            (None, Some(e)) => e,
            (None, None) => (0.0, 1.0),
        }
    }
}

/// Drawing options of a [`LineChart`] beyond its data (kept out of the
/// chart so that adding one changes no caller).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LineOptions {
    /// Highest y shown: a line running past it (a fit extrapolated far out)
    /// is clipped at the frame instead of squeezing the data into the bottom
    /// of the chart. Ignored when it is not above the lowest value shown.
    pub y_max: Option<f64>,
}

impl LineChart {
    /// The chart as a standalone SVG document, 800 × 450.
    pub fn to_svg(&self) -> String {
        self.to_svg_sized(800.0, 450.0)
    }
    /// The chart as SVG at a given size in pixels.
    pub fn to_svg_sized(&self, width: f64, height: f64) -> String {
        svg::line_chart(self, width, height, &LineOptions::default())
    }
    /// The chart as SVG at a given size with drawing options.
    pub fn to_svg_with(&self, width: f64, height: f64, opts: &LineOptions) -> String {
        svg::line_chart(self, width, height, opts)
    }
    /// The chart drawn with braille dots in `cols` × `rows` characters.
    pub fn to_text(&self, cols: usize, rows: usize) -> String {
        text::line_chart(self, cols, rows)
    }
}

impl StackedBars {
    /// The chart as a standalone SVG document, 800 × 450.
    pub fn to_svg(&self) -> String {
        self.to_svg_sized(800.0, 450.0)
    }
    /// The chart as SVG at a given size in pixels.
    pub fn to_svg_sized(&self, width: f64, height: f64) -> String {
        svg::stacked_bars(self, width, height)
    }
    /// One horizontal bar per category, `cols` characters wide (`rows` caps
    /// the number of lines).
    pub fn to_text(&self, cols: usize, rows: usize) -> String {
        text::stacked_bars(self, cols, rows)
    }
}

/// Drawing options of a [`Heatmap`] beyond its data (kept out of the
/// chart so that adding one changes no caller).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HeatOptions {
    /// `labels[row][col]`: a word written in the cell instead of its value
    /// (a sweep's `OOM`); the cell keeps its colour, or the missing grey.
    pub labels: Vec<Vec<Option<String>>>,
}

impl Heatmap {
    /// The chart as a standalone SVG document (its size follows the grid).
    pub fn to_svg(&self) -> String {
        heat::heatmap(self, &HeatOptions::default())
    }
    /// The chart as SVG with drawing options.
    pub fn to_svg_with(&self, opts: &HeatOptions) -> String {
        heat::heatmap(self, opts)
    }
    /// The grid as shaded cells, `cols` characters wide at most (`rows`
    /// caps the number of lines).
    pub fn to_text(&self, cols: usize, rows: usize) -> String {
        text::heatmap(self, cols, rows)
    }
}

/// Eight levels of a bar, lowest first.
const SPARKS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// One character per value, scaled between the values' minimum and maximum
/// (`▁` to `█`); a non-finite value is a space, an empty input is "".
pub fn sparkline(values: &[f64]) -> String {
    let finite = || values.iter().copied().filter(|v| v.is_finite());
    let lo = finite().fold(f64::INFINITY, f64::min);
    let hi = finite().fold(f64::NEG_INFINITY, f64::max);
    values
        .iter()
        .map(|&v| {
            if !v.is_finite() {
                ' '
            } else if hi <= lo {
                SPARKS[0]
            } else {
                let k = ((v - lo) / (hi - lo) * 7.0).round() as usize;
                SPARKS[k.min(7)]
            }
        })
        .collect()
}

/// Text made safe to put into SVG/XML content or attributes.
pub fn escape_xml(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // Control characters are not allowed in XML 1.0 at all.
            c if (c as u32) < 0x20 && c != '\n' && c != '\t' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// The finite points of a series.
fn finite(points: &[(f64, f64)]) -> impl Iterator<Item = (f64, f64)> + '_ {
    points
        .iter()
        .copied()
        .filter(|(x, y)| x.is_finite() && y.is_finite())
}
