//! The largest batch size that fits, computed from measurement.
//!
//! Training memory at batch `b` is modelled as `peak = static + perSample × b`:
//! weights, gradients, optimizer state and the CUDA context do not grow with
//! the batch, activations do (linearly, for a fixed sequence length). The
//! model comes from one of two kinds of evidence, in this order:
//!
//! 1. `twoBatchSizes`: NVML peaks observed while the Job ran at two or more
//!    batch sizes (kept across memprof's recreations of the Job), fitted by
//!    least squares; the residual says how well the line fits. Measured end
//!    to end, allocator cache and CUDA context included, so it comes first.
//! 2. `agentBreakdown`: the in-process agent's split of one step into static
//!    bytes and activations at a known batch: `perSample = activations /
//!    batch`. When an NVML peak at the current batch is known, the static
//!    part is anchored to it (`static = peak − perSample × current`), so
//!    what the allocator view misses (context, cache) still counts.
//!
//! Anything else is `insufficient`, with a reason naming what is missing.
//! A peak at ≥ 99.5 % of the device is censored (the run hit the ceiling:
//! the true peak is unknown) and never fitted.
//!
//! The recommendation is the largest `b ≥ 1` with `static + perSample × b ≤
//! limit × (1 − headroom)`; `headroom` defaults to [`DEFAULT_HEADROOM_FRACTION`]
//! (keep 10 % of the device free). Pure: no I/O, no clock.

use memprof_api::{
    format_bytes, BatchObservation, BatchRecommendation, MemoryBreakdown, DEFAULT_HEADROOM_FRACTION,
};
use std::fmt::Write;
/// Largest headroom a policy may ask for (the CRD's bound).
pub const MAX_HEADROOM_FRACTION: f64 = 0.9;
/// Batch sizes remembered per profile.
pub const MAX_OBSERVATIONS: usize = 8;
/// A peak at or above this fraction of the device hit the ceiling: censored.
pub const CENSORED_FRACTION: f64 = 0.995;
/// Default env var holding the batch size.
pub const DEFAULT_BATCH_ENV: &str = "BATCH_SIZE";
/// Job annotation naming the env var that holds the batch size.
pub const ANNOTATION_BATCH_ENV: &str = "memprof.dev/batch-env";
/// Method names of [`BatchRecommendation::method`].
pub const METHOD_TWO_BATCH_SIZES: &str = "twoBatchSizes";
/// See [`METHOD_TWO_BATCH_SIZES`].
pub const METHOD_AGENT_BREAKDOWN: &str = "agentBreakdown";
/// See [`METHOD_TWO_BATCH_SIZES`].
pub const METHOD_INSUFFICIENT: &str = "insufficient";
/// Batch sizes beyond this are not recommended (a per-sample slope of a few
/// bytes would otherwise "allow" absurd batches).
const MAX_BATCH: u64 = 1 << 20;

/// The agent's split of one measured step, as the fit uses it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AgentBreakdown {
    /// Parameters + gradients + optimizer state (+ per-sample gradients), bytes.
    pub static_bytes: u64,
    /// Peak allocated during the step minus the static part, bytes.
    pub activations_peak_bytes: Option<u64>,
    /// The batch of the measured step, when the trainer said.
    pub batch_size: Option<u64>,
}

impl AgentBreakdown {
    /// The split of the profile's `breakdown` (C-3). Per-sample gradients
    /// (Opacus) are in the agent's `staticBytes` but grow with the batch, so
    /// they move to the per-sample side here.
    pub fn of(b: &MemoryBreakdown) -> Self {
        let per_sample_grads = b.per_sample_gradients_bytes.unwrap_or(0);
        AgentBreakdown {
            static_bytes: b.static_bytes.saturating_sub(per_sample_grads),
            activations_peak_bytes: b
                .activations_peak_bytes
                .map(|a| a.saturating_add(per_sample_grads)),
            batch_size: b.batch_size,
        }
    }
}

/// `peak = static + perSample × batch`, in bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinearModel {
    /// Intercept, bytes (a fit may make it negative).
    pub static_bytes: f64,
    /// Slope, bytes per sample.
    pub per_sample_bytes: f64,
    /// Root mean square of the residuals, bytes.
    pub residual_bytes: f64,
}

impl LinearModel {
    /// Predicted peak at `batch`, bytes.
    pub fn at(&self, batch: u64) -> f64 {
        self.static_bytes + self.per_sample_bytes * batch as f64
    }

    /// The largest batch in `1..=MAX_BATCH` whose predicted peak is at most
    /// `target` bytes; `None` when not even one sample fits.
    pub fn largest_within(&self, target: f64) -> Option<u64> {
        let b = ((target - self.static_bytes) / self.per_sample_bytes).floor();
        // Floating point may put an exact fit one below the boundary's floor.
        let mut b = if b.is_finite() {
            b.min(MAX_BATCH as f64)
        } else {
            0.0
        } as u64;
        while b < MAX_BATCH && self.at(b + 1) <= target {
            b += 1;
        }
        while b > 0 && self.at(b) > target {
            b -= 1;
        }
        (b >= 1).then_some(b)
    }
}

/// Least squares over `(batch, peak bytes)` points with at least two
/// distinct batches. Errors say what is wrong, for the `reason`.
pub fn fit_peaks(points: &[(u64, u64)]) -> Result<LinearModel, String> {
    let n = points.len() as f64;
    let distinct = {
        let mut b: Vec<u64> = points.iter().map(|p| p.0).collect();
        b.sort_unstable();
        b.dedup();
        b.len()
    };
    if distinct < 2 {
        return Err(format!(
            "{distinct} batch size(s) observed, at least 2 needed"
        ));
    }
    let mx = points.iter().map(|p| p.0 as f64).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1 as f64).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 as f64 - mx).powi(2)).sum();
    let sxy: f64 = points
        .iter()
        .map(|p| (p.0 as f64 - mx) * (p.1 as f64 - my))
        .sum();
    let slope = sxy / sxx;
    let intercept = my - slope * mx;
    if !slope.is_finite() || !intercept.is_finite() {
        return Err("the fit gave non-finite numbers".into());
    }
    if slope <= 0.0 {
        return Err(format!(
            "peaks do not grow with the batch (slope {} per sample): something else drives memory",
            signed_bytes(slope)
        ));
    }
    let ss: f64 = points
        .iter()
        .map(|p| (p.1 as f64 - intercept - slope * p.0 as f64).powi(2))
        .sum();
    Ok(LinearModel {
        static_bytes: intercept,
        per_sample_bytes: slope,
        residual_bytes: (ss / n).sqrt(),
    })
}

/// What a recommendation is computed from.
#[derive(Clone, Debug)]
pub struct Evidence<'a> {
    /// Env var holding the batch size.
    pub env_var: &'a str,
    /// The Job's batch now, if it sets one literally.
    pub current: Option<u64>,
    /// Memory of the fullest GPU now, bytes (else the newest observation's is used).
    pub limit_bytes: Option<u64>,
    /// Fraction of the device to keep free (see [`DEFAULT_HEADROOM_FRACTION`]).
    pub headroom_fraction: f64,
    /// The agent's breakdown, if any rank pushes one.
    pub breakdown: Option<AgentBreakdown>,
    /// Peaks observed per batch size (see [`observe`]).
    pub observations: &'a [BatchObservation],
}

/// Remembers the peak seen at `batch` (the highest so far for that batch),
/// newest last, at most [`MAX_OBSERVATIONS`] batch sizes (least recently
/// seen dropped). A zero peak or total (no report yet) records nothing.
pub fn observe(
    previous: &[BatchObservation],
    batch: Option<u64>,
    peak_bytes: u64,
    total_bytes: u64,
) -> Vec<BatchObservation> {
    let mut out = previous.to_vec();
    let Some(batch) = batch.filter(|b| *b > 0 && peak_bytes > 0 && total_bytes > 0) else {
        return out;
    };
    let mut obs = BatchObservation {
        batch,
        peak_bytes,
        total_bytes,
    };
    if let Some(i) = out.iter().position(|o| o.batch == batch) {
        let old = out.remove(i);
        obs.peak_bytes = obs.peak_bytes.max(old.peak_bytes);
    }
    out.push(obs);
    let excess = out.len().saturating_sub(MAX_OBSERVATIONS);
    out.drain(..excess);
    out
}

/// Whether an observation hit the device's ceiling (its true peak is unknown).
pub fn censored(o: &BatchObservation) -> bool {
    o.peak_bytes as f64 >= CENSORED_FRACTION * o.total_bytes as f64
}

/// The model and its method, or what is missing.
fn model_of(e: &Evidence<'_>) -> Result<(LinearModel, &'static str, String), String> {
    let usable: Vec<(u64, u64)> = e
        .observations
        .iter()
        .filter(|o| !censored(o))
        .map(|o| (o.batch, o.peak_bytes))
        .collect();
    let n_censored = e.observations.len() - usable.len();
    let censored_note = if n_censored > 0 {
        format!(" ({n_censored} peak(s) at the device's ceiling left out)")
    } else {
        String::new()
    };
    let fit = fit_peaks(&usable);
    if let Ok(m) = fit {
        let why = format!(
            "NVML peaks at {} batch sizes{censored_note}, least squares (residual {})",
            usable.len(),
            format_bytes(m.residual_bytes as u64)
        );
        return Ok((m, METHOD_TWO_BATCH_SIZES, why));
    }
    let mut fit_gap = fit.err().unwrap_or_default();
    if e.current.is_none() && usable.is_empty() {
        fit_gap = format!(
            "the Job sets no literal integer env {} (name its batch variable with annotation {ANNOTATION_BATCH_ENV})",
            e.env_var
        );
    }
    let Some(b) = e.breakdown else {
        return Err(format!(
            "{fit_gap}{censored_note} and no agent breakdown: run the in-process agent \
             (annotation memprof.dev/agent: python) or let the Job run at a second batch size"
        ));
    };
    let Some(act) = b.activations_peak_bytes.filter(|a| *a > 0) else {
        return Err(format!(
            "{fit_gap}, and the agent breakdown has no activations peak yet (it is taken at a measured step)"
        ));
    };
    let Some(batch) = b.batch_size.or(e.current).filter(|b| *b > 0) else {
        return Err(format!(
            "{fit_gap}, and neither the agent breakdown nor the Job's {} says which batch the activations are of",
            e.env_var
        ));
    };
    let per_sample = act as f64 / batch as f64;
    let anchor = e
        .current
        .and_then(|c| usable.iter().find(|o| o.0 == c).map(|o| (c, o.1)));
    let (static_bytes, why) = match anchor {
        Some((c, peak)) => (
            peak as f64 - per_sample * c as f64,
            format!(
                "agent breakdown: activations {} at batch {batch}; static part anchored at the NVML peak {} at batch {c}",
                format_bytes(act),
                format_bytes(peak)
            ),
        ),
        None => (
            b.static_bytes as f64,
            format!(
                "agent breakdown: static {}, activations {} at batch {batch} (allocator view: the CUDA context is not in it)",
                format_bytes(b.static_bytes),
                format_bytes(act)
            ),
        ),
    };
    Ok((
        LinearModel {
            static_bytes,
            per_sample_bytes: per_sample,
            residual_bytes: 0.0,
        },
        METHOD_AGENT_BREAKDOWN,
        why,
    ))
}

/// The recommendation for the Job, always with a `reason`.
pub fn recommend(e: &Evidence<'_>) -> BatchRecommendation {
    let headroom = if e.headroom_fraction.is_finite() {
        e.headroom_fraction.clamp(0.0, MAX_HEADROOM_FRACTION)
    } else {
        DEFAULT_HEADROOM_FRACTION
    };
    let mut rec = BatchRecommendation {
        env_var: e.env_var.to_string(),
        current: e.current,
        headroom_fraction: headroom,
        method: METHOD_INSUFFICIENT.into(),
        observations: e.observations.to_vec(),
        limit_bytes: e
            .limit_bytes
            .or_else(|| e.observations.last().map(|o| o.total_bytes))
            .filter(|l| *l > 0),
        ..Default::default()
    };
    let Some(limit) = rec.limit_bytes else {
        rec.reason = "no GPU reported yet: the device's memory is unknown".into();
        return rec;
    };
    let (model, method, why) = match model_of(e) {
        Ok(m) => m,
        Err(missing) => {
            rec.reason = format!("too little evidence: {missing}");
            memprof_api::truncate_utf8(&mut rec.reason, 512);
            return rec;
        }
    };
    rec.method = method.into();
    rec.static_bytes = Some(model.static_bytes.round() as i64);
    rec.per_sample_bytes = Some(model.per_sample_bytes.round().max(1.0) as u64);
    rec.residual_bytes = (method == METHOD_TWO_BATCH_SIZES).then_some(model.residual_bytes as u64);
    let target = limit as f64 * (1.0 - headroom);
    rec.recommended = model.largest_within(target);
    let next = rec.recommended.map_or(1, |r| r + 1);
    rec.next_up = Some(next);
    rec.predicted_peak_bytes = rec.recommended.map(|r| model.at(r).max(0.0) as u64);
    rec.predicted_next_up_bytes = Some(model.at(next).max(0.0) as u64);
    rec.reason = match rec.recommended {
        Some(r) => format!(
            "{why}: {} + {}/sample × {r} = {} ≤ {} ({:.0}% of {})",
            signed_bytes(model.static_bytes),
            format_bytes(model.per_sample_bytes as u64),
            format_bytes(model.at(r).max(0.0) as u64),
            format_bytes(target as u64),
            100.0 * (1.0 - headroom),
            format_bytes(limit)
        ),
        None => format!(
            "{why}: even one sample is predicted at {}, over {} ({:.0}% of {}): no batch fits",
            format_bytes(model.at(1).max(0.0) as u64),
            format_bytes(target as u64),
            100.0 * (1.0 - headroom),
            format_bytes(limit)
        ),
    };
    memprof_api::truncate_utf8(&mut rec.reason, 512);
    rec
}

/// The model a recommendation carries, if it has one.
pub fn model_in(rec: &BatchRecommendation) -> Option<LinearModel> {
    if rec.method == METHOD_INSUFFICIENT {
        return None;
    }
    Some(LinearModel {
        static_bytes: rec.static_bytes? as f64,
        per_sample_bytes: rec.per_sample_bytes.filter(|p| *p > 0)? as f64,
        residual_bytes: rec.residual_bytes.unwrap_or(0) as f64,
    })
}

/// The value a `scaleBatch` with `mode: fit` sets, from a recommendation.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyFit {
    /// The value to set.
    pub value: u64,
    /// The arithmetic, short (for the plan's summary and the record).
    pub note: String,
}

/// The value for a policy: the largest batch under the policy's headroom,
/// rounded down to `round_to`, at least `minimum`. `Err` (with why) when the
/// recommendation has too little evidence or is for another env var.
pub fn policy_value(
    rec: Option<&BatchRecommendation>,
    env: &str,
    headroom_fraction: f64,
    minimum: u64,
    round_to: Option<u64>,
) -> Result<PolicyFit, String> {
    let Some(rec) = rec else {
        return Err("no batch recommendation in the MemoryProfile yet".into());
    };
    if rec.env_var != env {
        return Err(format!(
            "the recommendation is for env {}, the policy scales {env}: set annotation {ANNOTATION_BATCH_ENV}: {env} on the Job",
            rec.env_var
        ));
    }
    let (Some(model), Some(limit)) = (model_in(rec), rec.limit_bytes) else {
        let mut why = rec.reason.clone();
        memprof_api::truncate_utf8(&mut why, 160);
        return Err(why);
    };
    let headroom = headroom_fraction.clamp(0.0, MAX_HEADROOM_FRACTION);
    let target = limit as f64 * (1.0 - headroom);
    let largest = model.largest_within(target).unwrap_or(0);
    let mut value = largest;
    if let Some(r) = round_to.filter(|r| *r > 1) {
        value -= value % r;
    }
    let value = value.max(minimum);
    let note = format!(
        "fit {}: {} + {}/sample, ≤{} → {largest}",
        rec.method,
        signed_bytes(model.static_bytes),
        format_bytes(model.per_sample_bytes as u64),
        format_bytes(target as u64),
    );
    Ok(PolicyFit { value, note })
}

/// Bytes for humans, negative ones with a sign.
fn signed_bytes(v: f64) -> String {
    if v < 0.0 {
        format!("-{}", format_bytes((-v) as u64))
    } else {
        format_bytes(v as u64)
    }
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
                "largest safe {r} (predicted peak {})",
                format_bytes(rec.predicted_peak_bytes.unwrap_or(0)),
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
    let Some(model) = model_in(rec) else {
        return vec![format!("batch fit: too little evidence — {}", rec.reason)];
    };
    let limit = rec.limit_bytes.unwrap_or(0);
    let headroom = headroom_fraction.clamp(0.0, MAX_HEADROOM_FRACTION);
    let target = limit as f64 * (1.0 - headroom);
    let mut lines = vec![
        format!(
            "batch fit ({}): peak = static + per-sample × batch",
            rec.method
        ),
        format!(
            "  static {}, per-sample {}{}",
            signed_bytes(model.static_bytes),
            format_bytes(model.per_sample_bytes as u64),
            rec.residual_bytes
                .map(|r| format!(", residual {}", format_bytes(r)))
                .unwrap_or_default()
        ),
        format!(
            "  limit {}, headroom {:.0}% → target {}",
            format_bytes(limit),
            100.0 * headroom,
            format_bytes(target as u64)
        ),
    ];
    match model.largest_within(target) {
        Some(r) => {
            lines.push(format!(
                "  → recommended {} = {r} (predicted {}); next up {} predicted {}",
                rec.env_var,
                format_bytes(model.at(r).max(0.0) as u64),
                r + 1,
                format_bytes(model.at(r + 1).max(0.0) as u64)
            ));
        }
        None => lines.push(format!(
            "  → no batch fits: one sample is predicted at {}",
            format_bytes(model.at(1).max(0.0) as u64)
        )),
    }
    lines
}

#[cfg(test)]
#[path = "batchfit_tests.rs"]
mod tests;
