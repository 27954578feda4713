//! Where a value stands relative to the evidence, in words for outputs.

use super::num;
use serde::{Deserialize, Serialize};

/// Where a value stands relative to the evidence.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum Support {
    /// A fitted point.
    Measured,
    /// Between the smallest and the largest fitted value.
    Interpolated,
    /// Beyond the data, within the step its held-out check covered.
    Extrapolated {
        /// The nearest fitted value.
        from: f64,
        /// How far beyond it (positive above, negative below).
        distance: f64,
    },
    /// Beyond what the data supports: not a prediction to act on.
    Unsupported {
        /// The nearest fitted value.
        from: f64,
        /// How far beyond it.
        distance: f64,
    },
}

impl Support {
    /// Whether the evidence backs a prediction here.
    pub fn backed(&self) -> bool {
        !matches!(self, Support::Unsupported { .. })
    }

    /// In words, for outputs: `interpolated`, `1024 above the largest
    /// tested value 4096 (+25%)`.
    pub fn describe(&self) -> String {
        match *self {
            Support::Measured => "measured".into(),
            Support::Interpolated => "interpolated between measured values".into(),
            Support::Extrapolated { from, distance } => {
                format!("extrapolated {}", distance_words(from, distance))
            }
            Support::Unsupported { from, distance } => format!(
                "unsupported: {} is further than the data supports",
                distance_words(from, distance)
            ),
        }
    }
}

fn distance_words(from: f64, distance: f64) -> String {
    let (side, which) = if distance >= 0.0 {
        ("above", "largest")
    } else {
        ("below", "smallest")
    };
    let pct = if from != 0.0 {
        format!(" ({:+.0}%)", 100.0 * distance / from)
    } else {
        String::new()
    };
    format!(
        "{} {side} the {which} measured value {}{pct}",
        num(distance.abs()),
        num(from)
    )
}
