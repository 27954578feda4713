//! Least squares of a polynomial of degree 1 or 2, by the normal
//! equations on x scaled to [0, 1] (a sequence length squared would
//! otherwise swamp them), solved with partial pivoting.

use super::{Curve, Family};

/// How many different x the points have (`pts` sorted by x).
pub(super) fn distinct_x(pts: &[(f64, f64)]) -> usize {
    let mut xs: Vec<f64> = pts.iter().map(|p| p.0).collect();
    xs.dedup();
    xs.len()
}

/// Least squares for `family`; None when the points do not determine it.
/// x is scaled to [0, 1] first so that x² of a sequence length does not
/// swamp the normal equations.
pub fn least_squares(pts: &[(f64, f64)], family: Family) -> Option<Curve> {
    let k = family.params();
    if distinct_x(&sorted(pts)) < k {
        return None;
    }
    let scale = pts.iter().map(|p| p.0.abs()).fold(0.0, f64::max).max(1e-12);
    let mut a = [[0.0f64; 4]; 3];
    for &(x, y) in pts {
        let u = x / scale;
        let powers = [1.0, u, u * u];
        for i in 0..k {
            for j in 0..k {
                a[i][j] += powers[i] * powers[j];
            }
            a[i][k] += powers[i] * y;
        }
    }
    let c = solve(&mut a, k)?;
    let curve = Curve {
        family,
        static_bytes: c[0],
        per_unit_bytes: c[1] / scale,
        per_unit_squared_bytes: if k == 3 { c[2] / (scale * scale) } else { 0.0 },
    };
    [
        curve.static_bytes,
        curve.per_unit_bytes,
        curve.per_unit_squared_bytes,
    ]
    .iter()
    .all(|v| v.is_finite())
    .then_some(curve)
}

fn sorted(pts: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let mut v = pts.to_vec();
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    v
}

/// Gaussian elimination with partial pivoting on a k × (k+1) system.
fn solve(a: &mut [[f64; 4]; 3], k: usize) -> Option<[f64; 3]> {
    for col in 0..k {
        let pivot = (col..k).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[pivot][col].abs() < 1e-12 {
            return None;
        }
        a.swap(col, pivot);
        let pivot_row = a[col];
        for (row, r) in a.iter_mut().enumerate().take(k) {
            if row != col {
                let f = r[col] / pivot_row[col];
                for (v, p) in r.iter_mut().zip(pivot_row).take(k + 1).skip(col) {
                    *v -= f * p;
                }
            }
        }
    }
    let mut out = [0.0; 3];
    for (i, o) in out.iter_mut().enumerate().take(k) {
        *o = a[i][k] / a[i][i];
    }
    Some(out)
}
