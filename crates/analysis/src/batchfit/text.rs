//! The batch recommendation in words: its `reason`, `memprof report`'s
//! lines and `memprof policy explain`'s arithmetic.

use super::{censored, clamp_headroom, model_in, MAX_HEADROOM_FRACTION};
use crate::memmodel::Model;
use memprof_api::{format_bytes, BatchRecommendation};
use std::fmt::Write;

/// The recommendation's `reason`: evidence, curve, the value and where it
/// stands, and what the curve alone would allow when that is not backed.
pub(super) fn reason(rec: &BatchRecommendation, model: &Model, why: &str, target: f64) -> String {
    let limit = rec.limit_bytes.unwrap_or(0);
    let pct = 100.0 * (1.0 - rec.headroom_fraction);
    let curve = format!(
        "{} ({}, margin {})",
        model.curve.describe("B"),
        model.curve.family.word(),
        format_bytes(model.margin_bytes as u64)
    );
    let mut s = match (rec.recommended, rec.predicted_peak_bytes) {
        (Some(r), Some(p)) => format!(
            "{why}: {curve}: {r} predicted {} ≤ {} ({pct:.0}% of {}), {}",
            format_bytes(p),
            format_bytes(target as u64),
            format_bytes(limit),
            rec.support.as_deref().unwrap_or("-")
        ),
        _ => format!(
            "{why}: {curve}: no batch the evidence backs stays under {} ({pct:.0}% of {})",
            format_bytes(target as u64),
            format_bytes(limit)
        ),
    };
    if let Some(u) = rec.unbacked {
        let _ = write!(
            s,
            "; the curve alone would allow {u}, {}: not backed, never acted on",
            model.predict(u as f64, None).support.describe()
        );
    }
    s
}

/// The recommendation for `memprof report` (indented as the report's other lines).
pub fn render(rec: &BatchRecommendation) -> String {
    let mut out = String::new();
    let current = rec
        .current
        .map_or_else(|| "-".to_string(), |c| c.to_string());
    let _ = write!(out, "  batch size: {} = {current} now; ", rec.env_var);
    match rec.recommended {
        Some(r) => {
            let _ = write!(
                out,
                "largest safe {r} (predicted peak {}; {})",
                format_bytes(rec.predicted_peak_bytes.unwrap_or(0)),
                rec.support.as_deref().unwrap_or("-")
            );
            if let (Some(n), Some(p)) = (rec.next_up, rec.predicted_next_up_bytes) {
                let _ = write!(out, ", {n} predicted at {}", format_bytes(p));
            }
            let _ = writeln!(out);
        }
        None => {
            let _ = writeln!(out, "no recommendation");
        }
    }
    let _ = writeln!(out, "    {}: {}", rec.method, rec.reason);
    if !rec.observations.is_empty() {
        let seen: Vec<String> = rec
            .observations
            .iter()
            .map(|o| {
                format!(
                    "{} -> {}{}",
                    o.batch,
                    format_bytes(o.peak_bytes),
                    if censored(o) { " (at the ceiling)" } else { "" }
                )
            })
            .collect();
        let _ = writeln!(out, "    peaks seen: {}", seen.join(", "));
    }
    out
}

/// The arithmetic, line by line, for `memprof policy explain`.
pub fn explain_lines(rec: &BatchRecommendation, headroom_fraction: f64) -> Vec<String> {
    let (Some(model), Some(k)) = (model_in(rec), rec.model.as_ref()) else {
        return vec![format!("batch fit: too little evidence — {}", rec.reason)];
    };
    let limit = rec.limit_bytes.unwrap_or(0);
    let headroom = clamp_headroom(headroom_fraction).min(MAX_HEADROOM_FRACTION);
    let target = limit as f64 * (1.0 - headroom);
    let mut lines = vec![
        format!(
            "batch fit ({}, {}): peak = {}",
            rec.method,
            k.family,
            model.curve.describe("B")
        ),
        format!(
            "  {} point(s) at batches {}..{}; held-out error {}; margin {}",
            k.points,
            k.measured_min,
            k.measured_max,
            k.held_out_error_bytes
                .map_or("- (two points: nothing to hold out)".into(), format_bytes),
            format_bytes(k.margin_bytes)
        ),
        format!(
            "  backed for batches {}..{} (between measured batches, or one held-out step beyond)",
            k.backed_min, k.backed_max
        ),
        format!(
            "  limit {}, headroom {:.0}% → target {}",
            format_bytes(limit),
            100.0 * headroom,
            format_bytes(target as u64)
        ),
    ];
    let at_most = rec.current.unwrap_or(super::MAX_BATCH);
    match super::largest_fitting(Some(rec), &rec.env_var, at_most, headroom) {
        Ok(f) if f.backed => lines.push(format!(
            "  → {} = {} (predicted {} + margin {} ≤ target; {}); next up {} predicted {}",
            rec.env_var,
            f.value,
            format_bytes(f.predicted_peak_bytes),
            format_bytes(f.margin_bytes),
            f.support.describe(),
            f.value + 1,
            format_bytes(model.curve.at((f.value + 1) as f64).max(0.0) as u64)
        )),
        Ok(f) => lines.push(format!(
            "  → not backed: the curve would allow {} = {}, but that is {}: the factor applies",
            rec.env_var,
            f.value,
            f.support.describe()
        )),
        Err(why) => lines.push(format!("  → {why}")),
    }
    lines
}
