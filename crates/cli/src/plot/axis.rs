//! Axes: the range a chart shows, tick positions at "nice" steps
//! (1, 2, 2.5, 5 × 10^k in the shown unit) and units a person reads:
//! bytes in B/KiB/MiB/GiB/TiB, seconds in s/min/h.

/// What the values of an axis measure.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Unit {
    /// Bytes, shown in KiB/MiB/GiB/TiB.
    Bytes,
    /// Seconds, shown in s, min or h.
    Seconds,
    /// Percent (values 0 to 100).
    Percent,
    /// A plain number.
    #[default]
    Plain,
}

const KIB: f64 = 1024.0;

/// The display unit for values up to `max` (absolute): its divisor and name.
pub fn scale(unit: Unit, max: f64) -> (f64, &'static str) {
    let m = if max.is_finite() { max.abs() } else { 0.0 };
    match unit {
        Unit::Bytes => [
            (KIB.powi(4), "TiB"),
            (KIB.powi(3), "GiB"),
            (KIB.powi(2), "MiB"),
            (KIB, "KiB"),
        ]
        .into_iter()
        .find(|(d, _)| m >= *d)
        .unwrap_or((1.0, "B")),
        Unit::Seconds if m >= 7200.0 => (3600.0, "h"),
        Unit::Seconds if m >= 120.0 => (60.0, "min"),
        Unit::Seconds => (1.0, "s"),
        Unit::Percent => (1.0, "%"),
        Unit::Plain => (1.0, ""),
    }
}

/// One value for a person: `61.2 GiB`, `4.5 min`, `37 %`, `1.25`.
pub fn format_value(v: f64, unit: Unit) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    let (div, name) = scale(unit, v);
    let x = v / div;
    let digits = if x.abs() >= 100.0 || x == x.trunc() {
        0
    } else if x.abs() >= 10.0 {
        1
    } else {
        2
    };
    let num = format!("{x:.digits$}");
    if name.is_empty() {
        num
    } else {
        format!("{num} {name}")
    }
}

/// An axis: the shown range (in raw units), its ticks and display unit.
#[derive(Clone, Debug, PartialEq)]
pub struct Axis {
    /// Lowest value shown.
    pub lo: f64,
    /// Highest value shown.
    pub hi: f64,
    /// Tick positions, raw units.
    pub ticks: Vec<f64>,
    /// Divisor of the display unit.
    pub div: f64,
    /// Name of the display unit ("" for plain numbers).
    pub unit_name: &'static str,
    /// Decimals of the tick labels.
    decimals: usize,
}

impl Axis {
    /// An axis covering `lo..hi` (non-finite or empty ranges become 0..1)
    /// with about `target` ticks, widened to whole tick steps.
    pub fn new(lo: f64, hi: f64, unit: Unit, target: usize) -> Axis {
        let (mut lo, mut hi) = if lo.is_finite() && hi.is_finite() && lo <= hi {
            (lo, hi)
        } else {
            (0.0, 1.0)
        };
        if hi - lo <= f64::EPSILON * hi.abs().max(1.0) {
            let pad = if hi == 0.0 { 1.0 } else { hi.abs() * 0.1 };
            lo -= pad;
            hi += pad;
            if lo < 0.0 && unit != Unit::Plain {
                lo = 0.0;
            }
        }
        let (div, unit_name) = scale(unit, lo.abs().max(hi.abs()));
        let step = nice_step((hi - lo) / div, target.max(2)) * div;
        let lo = (lo / step).floor() * step;
        let hi = (hi / step).ceil() * step;
        let n = ((hi - lo) / step).round() as usize;
        let ticks = (0..=n.min(50)).map(|i| lo + i as f64 * step).collect();
        let decimals = decimals_for(step / div);
        Axis {
            lo,
            hi,
            ticks,
            div,
            unit_name,
            decimals,
        }
    }

    /// A tick's label, in the display unit without the unit name.
    pub fn label(&self, v: f64) -> String {
        let x = v / self.div;
        // No "-0".
        let x = if x.abs() < 1e-12 { 0.0 } else { x };
        format!("{x:.*}", self.decimals)
    }

    /// `label (unit)`, or `label` for plain numbers.
    pub fn title(&self, label: &str) -> String {
        if self.unit_name.is_empty() {
            label.to_string()
        } else {
            format!("{label} ({})", self.unit_name)
        }
    }

    /// Where `v` falls, 0 at `lo` to 1 at `hi`.
    pub fn frac(&self, v: f64) -> f64 {
        (v - self.lo) / (self.hi - self.lo)
    }
}

/// A step of 1, 2, 2.5 or 5 × 10^k that cuts `range` into about `target`
/// parts (or somewhat more).
pub fn nice_step(range: f64, target: usize) -> f64 {
    let raw = range / target as f64;
    if !(raw.is_finite() && raw > 0.0) {
        return 1.0;
    }
    let mag = 10f64.powf(raw.log10().floor());
    let norm = raw / mag;
    // The step may be a little finer than asked (up to 1/0.7 more ticks):
    // rounding up instead would turn 0..82 into 0..100 in steps of 20.
    let nice = [1.0, 2.0, 2.5, 5.0, 10.0]
        .into_iter()
        .find(|n| *n >= 0.7 * norm - 1e-9)
        .unwrap_or(10.0);
    nice * mag
}

fn decimals_for(step: f64) -> usize {
    (0..4)
        .find(|d| {
            let m = 10f64.powi(*d as i32) * step;
            (m - m.round()).abs() < 1e-6
        })
        .unwrap_or(4)
}

/// The range of `values`, or None when none is finite.
pub fn extent(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    values
        .filter(|v| v.is_finite())
        .fold(None, |acc, v| match acc {
            None => Some((v, v)),
            Some((lo, hi)) => Some((lo.min(v), hi.max(v))),
        })
}
