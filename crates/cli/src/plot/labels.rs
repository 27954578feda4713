//! Where labels go so that they never cover each other: the labels of
//! horizontal lines (stacked when two lines are close) and of vertical
//! marks (rows in a band above the plot).

use super::axis::Axis;

/// Baselines of the labels of horizontal lines at pixel heights `pys`
/// (11 px text, right-aligned at one x, so any vertical overlap is a
/// collision): each sits just above its line; one that would overlap the
/// label above it goes under its own line, or lower still.
pub(super) fn hline_label_baselines(pys: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..pys.len()).collect();
    order.sort_by(|&i, &j| pys[i].total_cmp(&pys[j]));
    let mut out = vec![0.0; pys.len()];
    let mut prev_bottom = f64::NEG_INFINITY;
    for i in order {
        let above = pys[i] - 4.0;
        let base = if above - LABEL_ASCENT < prev_bottom + 1.0 {
            (pys[i] + 4.0 + LABEL_ASCENT).max(prev_bottom + 1.0 + LABEL_ASCENT)
        } else {
            above
        };
        out[i] = base;
        prev_bottom = base + LABEL_DESCENT;
    }
    out
}

/// Extent of an 11 px label above and below its baseline.
pub(super) const LABEL_ASCENT: f64 = 10.0;
pub(super) const LABEL_DESCENT: f64 = 3.0;

/// Height of a row of mark labels.
pub(super) const MARK_ROW: f64 = 13.0;

/// Where each mark's label goes: its row in the band above the plot (the
/// first row where it overlaps no label already placed, at most 5 rows)
/// and its anchor (labels near the right edge end at their mark). None for
/// a mark with no finite position.
pub(super) fn mark_places(
    marks: &[super::Mark],
    x: &Axis,
    left: f64,
    right: f64,
) -> Vec<Option<(usize, &'static str)>> {
    let mut order: Vec<usize> = (0..marks.len())
        .filter(|&i| marks[i].x.is_finite())
        .collect();
    order.sort_by(|&i, &j| marks[i].x.total_cmp(&marks[j].x));
    let mut ends: Vec<f64> = vec![];
    let mut places = vec![None; marks.len()];
    for i in order {
        let px = left + x.frac(marks[i].x) * (right - left);
        let w = marks[i].label.chars().count() as f64 * 6.3 + 8.0;
        let (from, anchor) = if px + w > right {
            (px - w, "end")
        } else {
            (px, "start")
        };
        let row = match ends.iter().position(|e| *e < from) {
            Some(r) => r,
            None if ends.len() < 5 => {
                ends.push(f64::NEG_INFINITY);
                ends.len() - 1
            }
            None => (0..ends.len())
                .min_by(|&a, &b| ends[a].total_cmp(&ends[b]))
                .unwrap_or(0),
        };
        ends[row] = from + w;
        places[i] = Some((row, anchor));
    }
    places
}
