//! Fits or not, and by how much, never rounded in the user's disfavour: the
//! peak is the estimate widened by the worst under-estimate recorded in the
//! calibration, plus the measured constants; the peak shown is rounded up,
//! the spare rounded down and the shortfall rounded up (to 0.1 GiB).

use serde::Serialize;

const GIB: f64 = (1u64 << 30) as f64;

/// What the estimate adds up to, against the card.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Verdict {
    /// Whether the upper bound fits on the card.
    pub fits: bool,
    /// Modelled reserved peak + context + NCCL: the estimate itself.
    pub predicted_bytes: u64,
    /// The predicted peak with the reserved part widened by the calibration's
    /// worst under-estimate: what the verdict is judged on.
    pub upper_bound_bytes: u64,
    /// The card's memory.
    pub capacity_bytes: u64,
    /// capacity - upper bound when it fits, else 0.
    pub spare_bytes: u64,
    /// upper bound - capacity when it does not fit, else 0.
    pub short_bytes: u64,
    /// "fits with 12.3 GiB to spare" / "needs 4.5 GiB more".
    pub text: String,
}

/// GiB to one decimal, rounded up (for peaks and shortfalls).
pub fn gib_up(bytes: u64) -> String {
    format!("{:.1}", (bytes as f64 / GIB * 10.0).ceil() / 10.0)
}

/// GiB to one decimal, rounded down (for what is left).
pub fn gib_down(bytes: u64) -> String {
    format!("{:.1}", (bytes as f64 / GIB * 10.0).floor() / 10.0)
}

/// The reserved peak widened by `margin` (0.186 for an 18.6 % worst under-estimate), rounded up.
pub fn widened(reserved: u64, margin: f64) -> u64 {
    (reserved as f64 / (1.0 - margin.clamp(0.0, 0.9))).ceil() as u64
}

/// The largest modelled reserved peak whose verdict is "fits" (what a
/// `--vary` bisection compares each run with).
pub fn reserved_budget(capacity: u64, fixed: u64, margin: f64) -> u64 {
    let room = capacity.saturating_sub(fixed) as f64;
    (room * (1.0 - margin.clamp(0.0, 0.9))).floor() as u64
}

/// The verdict for a modelled `reserved` peak plus `fixed` measured bytes.
pub fn judge(reserved: u64, fixed: u64, margin: f64, capacity: u64) -> Verdict {
    let predicted = reserved + fixed;
    let upper = widened(reserved, margin) + fixed;
    let fits = upper <= capacity;
    let (spare, short) = if fits {
        (capacity - upper, 0)
    } else {
        (0, upper - capacity)
    };
    let text = if fits {
        format!("fits with {} GiB to spare", gib_down(spare))
    } else {
        format!("needs {} GiB more", gib_up(short))
    };
    Verdict {
        fits,
        predicted_bytes: predicted,
        upper_bound_bytes: upper,
        capacity_bytes: capacity,
        spare_bytes: spare,
        short_bytes: short,
        text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1 << 30;

    #[test]
    fn spare_rounds_down_and_shortfall_rounds_up() {
        // 80 GiB card, 70.06 GiB upper bound: 9.94 GiB spare shows as 9.9.
        let v = judge(70 * G + G / 16, 0, 0.0, 80 * G);
        assert!(v.fits);
        assert_eq!(v.text, "fits with 9.9 GiB to spare");
        // 0.01 GiB short shows as 0.1, never 0.0.
        let v = judge(80 * G + G / 100, 0, 0.0, 80 * G);
        assert!(!v.fits);
        assert_eq!(v.text, "needs 0.1 GiB more");
        assert_eq!(gib_up(G + 1), "1.1");
        assert_eq!(gib_down(2 * G - 1), "1.9");
    }

    #[test]
    fn the_margin_widens_the_reserved_part_only() {
        let v = judge(80 * G, 2 * G, 0.2, 200 * G);
        assert_eq!(v.predicted_bytes, 82 * G);
        assert_eq!(v.upper_bound_bytes, 100 * G + 2 * G);
    }

    #[test]
    fn a_peak_the_margin_pushes_over_the_card_does_not_fit() {
        // 75 GiB modelled fits an 80 GiB card, but not with a 10 % margin.
        assert!(judge(75 * G, 0, 0.0, 80 * G).fits);
        assert!(!judge(75 * G, 0, 0.1, 80 * G).fits);
    }

    #[test]
    fn the_budget_is_the_largest_reserved_peak_that_fits() {
        for margin in [0.0, 0.05, 0.186] {
            let (cap, fixed) = (80 * G + 12_345, 900 << 20);
            let b = reserved_budget(cap, fixed, margin);
            assert!(judge(b, fixed, margin, cap).fits, "{margin}");
            assert!(!judge(b + 4096, fixed, margin, cap).fits, "{margin}");
        }
    }
}
