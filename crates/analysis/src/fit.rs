//! Line fitting for envelopes.

/// A fitted line `y = slope * t + intercept` with its goodness of fit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinearFit {
    /// Slope, y units per second.
    pub slope: f64,
    /// Value of the line at `t = 0`.
    pub intercept: f64,
    /// Coefficient of determination of the least-squares fit (0 to 1).
    pub r2: f64,
    /// Time between the first and the last point.
    pub span: f64,
}

impl LinearFit {
    /// Value of the line at `t`.
    pub fn at(&self, t: f64) -> f64 {
        self.slope * t + self.intercept
    }
}

/// Fits a line through `points` (t, y): the slope is the Theil–Sen estimate
/// (median of pairwise slopes), which ignores a single allocator step such as
/// warm-up, where least squares would read a trend; `r2` is that of the
/// least-squares fit and measures how linear the data are. `None` with fewer
/// than 3 points or no time span.
pub fn theil_sen(points: &[(f64, f64)]) -> Option<LinearFit> {
    let n = points.len();
    if n < 3 {
        return None;
    }
    let span = points[n - 1].0 - points[0].0;
    if span <= 0.0 {
        return None;
    }
    let mut slopes = Vec::with_capacity(n * (n - 1) / 2);
    for i in 0..n {
        for j in (i + 1)..n {
            let dt = points[j].0 - points[i].0;
            if dt > 0.0 {
                slopes.push((points[j].1 - points[i].1) / dt);
            }
        }
    }
    if slopes.is_empty() {
        return None;
    }
    let slope = median(&mut slopes);
    let mut residuals: Vec<f64> = points.iter().map(|(t, y)| y - slope * t).collect();
    let intercept = median(&mut residuals);

    // r² of ordinary least squares: how much of the variance a line explains.
    let nf = n as f64;
    let mean_t = points.iter().map(|p| p.0).sum::<f64>() / nf;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / nf;
    let (mut stt, mut sty, mut syy) = (0.0, 0.0, 0.0);
    for (t, y) in points {
        stt += (t - mean_t) * (t - mean_t);
        sty += (t - mean_t) * (y - mean_y);
        syy += (y - mean_y) * (y - mean_y);
    }
    let r2 = if syy == 0.0 || stt == 0.0 {
        0.0
    } else {
        (sty * sty / (stt * syy)).clamp(0.0, 1.0)
    };
    Some(LinearFit {
        slope,
        intercept,
        r2,
        span,
    })
}

/// Least-squares slope through `points` (t, y); `None` with fewer than 2
/// points or no time span. Unlike [`theil_sen`], a staircase with long flat
/// treads still reads as growth: that is what "is it still growing?" needs.
pub fn least_squares_slope(points: &[(f64, f64)]) -> Option<f64> {
    let n = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let mean_t = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
    let (mut stt, mut sty) = (0.0, 0.0);
    for (t, y) in points {
        stt += (t - mean_t) * (t - mean_t);
        sty += (t - mean_t) * (y - mean_y);
    }
    (stt > 0.0).then(|| sty / stt)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovers_a_noisy_line() {
        let pts: Vec<_> = (0..30)
            .map(|i| {
                (
                    i as f64 * 10.0,
                    1000.0 + 5.0 * i as f64 * 10.0 + if i % 2 == 0 { 3.0 } else { -3.0 },
                )
            })
            .collect();
        let fit = theil_sen(&pts).unwrap();
        assert!((fit.slope - 5.0).abs() < 0.05, "slope {}", fit.slope);
        assert!(fit.r2 > 0.99);
        assert_eq!(fit.span, 290.0);
    }

    #[test]
    fn ignores_an_early_warm_up_step() {
        // Flat after a step in the first fifth of the window: no trend.
        let pts: Vec<_> = (0..30)
            .map(|i| (i as f64, if i < 6 { 10.0 } else { 50.0 }))
            .collect();
        let fit = theil_sen(&pts).unwrap();
        assert_eq!(fit.slope, 0.0);
    }

    #[test]
    fn least_squares_reads_a_staircase_with_long_treads_as_growth() {
        // Two treads of a staircase: most pairs lie on one tread, so the
        // Theil–Sen median is 0, but the memory did grow.
        let pts: Vec<_> = (0..7)
            .map(|i| (i as f64 * 10.0, if i < 2 { 68.2 } else { 72.4 }))
            .collect();
        assert_eq!(theil_sen(&pts).unwrap().slope, 0.0);
        assert!(least_squares_slope(&pts).unwrap() > 0.05);
        assert!(least_squares_slope(&[(1.0, 1.0)]).is_none());
    }

    #[test]
    fn needs_three_points_and_a_span() {
        assert!(theil_sen(&[(0.0, 1.0), (1.0, 2.0)]).is_none());
        assert!(theil_sen(&[(1.0, 1.0), (1.0, 2.0), (1.0, 3.0)]).is_none());
    }
}
