//! The largest batch size that fits, computed from measurement with the one
//! memory model of [`crate::memmodel`] (shared with `memprof sweep` and
//! `memprof policy explain`).
//!
//! The model comes from one of two kinds of evidence, in this order:
//!
//! 1. `twoBatchSizes`: NVML peaks observed while the Job ran at two or more
//!    batch sizes (kept across memprof's recreations of the Job). Measured
//!    end to end, allocator cache and CUDA context included, so it comes
//!    first.
//! 2. `agentBreakdown`: the in-process agent's split of one step into
//!    static bytes and activations at a known batch: two points, the static
//!    part at batch 0 and the peak at the measured batch. When an NVML peak
//!    at the current batch is known, the static part is anchored to it
//!    (`static = peak − perSample × current`), so what the allocator view
//!    misses (context, cache) still counts.
//!
//! Anything else is `insufficient`, with a reason naming what is missing.
//! A peak at ≥ 99.5 % of the device is censored (the run hit the ceiling:
//! the true peak is unknown): never fitted, and no batch at or above it is
//! recommended.
//!
//! The recommendation is the largest `b ≥ 1` whose predicted peak plus the
//! model's margin stays at or under `limit × (1 − headroom)` AND that the
//! evidence backs: a measured batch, one between measured batches, or one at
//! most a held-out step beyond them. What the curve alone would allow beyond
//! that is shown (`unbacked`) and never acted on. `headroom` defaults to
//! [`DEFAULT_HEADROOM_FRACTION`]. Pure: no I/O, no clock.

pub use crate::memmodel::Support;
use crate::memmodel::{self, Curve, Family, Model};
use memprof_api::{
    format_bytes, BatchFitModel, BatchObservation, BatchRecommendation, MemoryBreakdown,
    DEFAULT_HEADROOM_FRACTION,
};

mod text;
pub use text::{explain_lines, render};
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

/// `(batch, peak)` of the observations under the ceiling.
fn usable(observations: &[BatchObservation]) -> Vec<(f64, f64)> {
    observations
        .iter()
        .filter(|o| !censored(o))
        .map(|o| (o.batch as f64, o.peak_bytes as f64))
        .collect()
}

/// The smallest batch whose peak hit the ceiling: nothing at or above it fits.
fn ceiling_batch(observations: &[BatchObservation]) -> Option<u64> {
    observations
        .iter()
        .filter(|o| censored(o))
        .map(|o| o.batch)
        .min()
}

/// The points to fit, the method, and the method in words.
type Points = (Vec<(f64, f64)>, &'static str, String);

/// What the NVML peaks lack for a fit of their own.
#[derive(Debug)]
enum Gap {
    /// Fewer than two batch sizes observed.
    BatchSizes(usize),
    /// Nothing observed, and no batch variable to vary.
    NoBatchVar(String),
}

impl std::fmt::Display for Gap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Gap::BatchSizes(n) => write!(f, "{n} batch size(s) observed, at least 2 needed"),
            Gap::NoBatchVar(var) => write!(
                f,
                "the Job sets no literal integer env {var} (name its batch variable with annotation {ANNOTATION_BATCH_ENV})"
            ),
        }
    }
}

/// Why no memory law can be fitted yet: the recommendation's reason, saying
/// what would give the evidence.
#[derive(Debug, thiserror::Error)]
enum TooLittle {
    #[error(
        "{gap}{censored} and no agent breakdown: run the in-process agent \
         (annotation memprof.dev/agent: python) or let the Job run at a second batch size"
    )]
    Unmeasured { gap: Gap, censored: String },
    #[error("{gap}, and the agent breakdown has no activations peak yet (it is taken at a measured step)")]
    ActivationsPending { gap: Gap },
    #[error("{gap}, and neither the agent breakdown nor the Job's {env_var} says which batch the activations are of")]
    ActivationsBatchUnknown { gap: Gap, env_var: String },
    #[error("{why}, and they are no memory law: {no_law}")]
    NotALaw {
        why: String,
        no_law: memmodel::NoModel,
    },
}

/// The points to fit, the method and its words, or what is missing.
fn points_of(e: &Evidence<'_>) -> Result<Points, TooLittle> {
    let usable = usable(e.observations);
    let n_censored = e.observations.len() - usable.len();
    let censored_note = if n_censored > 0 {
        format!(" ({n_censored} peak(s) at the device's ceiling left out)")
    } else {
        String::new()
    };
    let mut batches: Vec<u64> = usable.iter().map(|p| p.0 as u64).collect();
    batches.dedup();
    if batches.len() >= 2 {
        let why = format!("NVML peaks at {} batch sizes{censored_note}", usable.len());
        return Ok((usable, METHOD_TWO_BATCH_SIZES, why));
    }
    let gap = if e.current.is_none() && usable.is_empty() {
        Gap::NoBatchVar(e.env_var.to_owned())
    } else {
        Gap::BatchSizes(batches.len())
    };
    breakdown_points(e, &usable, gap, censored_note)
}

/// The agent breakdown's two points: the static part at batch 0 and the
/// peak at the measured batch.
fn breakdown_points(
    e: &Evidence<'_>,
    usable: &[(f64, f64)],
    gap: Gap,
    censored: String,
) -> Result<Points, TooLittle> {
    let Some(b) = e.breakdown else {
        return Err(TooLittle::Unmeasured { gap, censored });
    };
    let Some(act) = b.activations_peak_bytes.filter(|a| *a > 0) else {
        return Err(TooLittle::ActivationsPending { gap });
    };
    let Some(batch) = b.batch_size.or(e.current).filter(|b| *b > 0) else {
        let env_var = e.env_var.to_owned();
        return Err(TooLittle::ActivationsBatchUnknown { gap, env_var });
    };
    let per_sample = act as f64 / batch as f64;
    let anchor = e
        .current
        .and_then(|c| usable.iter().find(|p| p.0 == c as f64).map(|p| (c, p.1)));
    Ok(match anchor {
        Some((c, peak)) => (
            vec![(0.0, peak - per_sample * c as f64), (c as f64, peak)],
            METHOD_AGENT_BREAKDOWN,
            format!(
                "agent breakdown: activations {} at batch {batch}; static part anchored at the NVML peak {} at batch {c}",
                format_bytes(act),
                format_bytes(peak as u64)
            ),
        ),
        None => (
            vec![
                (0.0, b.static_bytes as f64),
                (batch as f64, (b.static_bytes + act) as f64),
            ],
            METHOD_AGENT_BREAKDOWN,
            format!(
                "agent breakdown: static {}, activations {} at batch {batch} (allocator view: the CUDA context is not in it)",
                format_bytes(b.static_bytes),
                format_bytes(act)
            ),
        ),
    })
}

/// What the status keeps of a model.
fn keep(m: &Model) -> BatchFitModel {
    BatchFitModel {
        family: m.curve.family.word().into(),
        static_bytes: m.curve.static_bytes.round() as i64,
        per_sample_bytes: m.curve.per_unit_bytes,
        per_sample_squared_bytes: m.curve.per_unit_squared_bytes,
        margin_bytes: m.margin_bytes.round() as u64,
        held_out_error_bytes: m.held_out_rms_bytes.map(|e| e.round() as u64),
        points: m.n as u32,
        measured_min: m.x_min as u64,
        measured_max: m.x_max as u64,
        backed_min: m.support_min.ceil() as u64,
        backed_max: m.support_max.floor() as u64,
    }
}

/// The model a recommendation carries, if it has one.
pub fn model_in(rec: &BatchRecommendation) -> Option<Model> {
    let k = rec.model.as_ref()?;
    let family = match k.family.as_str() {
        "quadratic" => Family::Quadratic,
        _ => Family::Linear,
    };
    let curve = Curve {
        family,
        static_bytes: k.static_bytes as f64,
        per_unit_bytes: k.per_sample_bytes,
        per_unit_squared_bytes: k.per_sample_squared_bytes,
    };
    let all_finite = [curve.per_unit_bytes, curve.per_unit_squared_bytes]
        .iter()
        .all(|v| v.is_finite());
    all_finite.then(|| {
        Model::from_parts(
            curve,
            k.points as usize,
            (k.measured_min as f64, k.measured_max as f64),
            k.margin_bytes as f64,
            (k.backed_min as f64, k.backed_max as f64),
        )
    })
}

/// The recommendation for the Job, always with a `reason`.
pub fn recommend(e: &Evidence<'_>) -> BatchRecommendation {
    let headroom = clamp_headroom(e.headroom_fraction);
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
    let fitted = points_of(e).and_then(|(pts, method, why)| {
        memmodel::fit(&pts)
            .map(|m| (m, method, why.clone()))
            .map_err(|no_law| TooLittle::NotALaw { why, no_law })
    });
    let (model, method, why) = match fitted {
        Ok(x) => x,
        Err(missing) => {
            rec.reason = format!("too little evidence: {missing}");
            memprof_api::truncate_utf8(&mut rec.reason, 512);
            return rec;
        }
    };
    rec.method = method.into();
    rec.static_bytes = Some(model.curve.static_bytes.round() as i64);
    rec.per_sample_bytes = Some(model.curve.per_unit_bytes.round().max(1.0) as u64);
    rec.residual_bytes =
        (method == METHOD_TWO_BATCH_SIZES).then_some(model.rms_residual_bytes as u64);
    rec.model = Some(keep(&model));
    let target = limit as f64 * (1.0 - headroom);
    fill(&mut rec, &model, e.observations, target);
    rec.reason = text::reason(&rec, &model, &why, target);
    memprof_api::truncate_utf8(&mut rec.reason, 512);
    rec
}

fn clamp_headroom(h: f64) -> f64 {
    if h.is_finite() {
        h.clamp(0.0, MAX_HEADROOM_FRACTION)
    } else {
        DEFAULT_HEADROOM_FRACTION
    }
}

/// Recommended, next up, support and the unbacked value.
fn fill(
    rec: &mut BatchRecommendation,
    model: &Model,
    observations: &[BatchObservation],
    target: f64,
) {
    let measured = measured_of(observations);
    let highest = highest_batch(observations, MAX_BATCH);
    let best = model.largest_fitting(1.0, highest, target, 1.0, &measured);
    let tried = model.largest_to_try(1.0, highest, target, 1.0, &measured);
    rec.recommended = best.map(|p| p.x as u64);
    rec.support = best.map(|p| p.support.describe());
    rec.predicted_peak_bytes = best.map(|p| p.peak_bytes.max(0.0) as u64);
    rec.unbacked = tried
        .filter(|t| best.is_none_or(|b| t.x > b.x))
        .map(|t| t.x as u64);
    let next = rec.recommended.map_or(1, |r| r + 1);
    rec.next_up = Some(next);
    rec.predicted_next_up_bytes = Some(model.curve.at(next as f64).max(0.0) as u64);
}

fn measured_of(observations: &[BatchObservation]) -> impl Fn(f64) -> Option<f64> + '_ {
    move |x| {
        observations
            .iter()
            .filter(|o| !censored(o) && o.batch as f64 == x)
            .map(|o| o.peak_bytes as f64)
            .reduce(f64::max)
    }
}

/// The largest batch worth considering: below the smallest ceiling peak.
fn highest_batch(observations: &[BatchObservation], at_most: u64) -> f64 {
    let below_ceiling = ceiling_batch(observations).map_or(u64::MAX, |c| c.saturating_sub(1));
    at_most.min(below_ceiling).min(MAX_BATCH) as f64
}

/// The answer of [`largest_fitting`].
#[derive(Clone, Debug, PartialEq)]
pub struct Fitting {
    /// The largest batch ≤ `at_most` predicted to fit (the backed one when
    /// there is one).
    pub value: u64,
    /// Its predicted peak (at a measured batch: the higher of the prediction
    /// and the measurement), bytes.
    pub predicted_peak_bytes: u64,
    /// The error allowed for there, bytes (peak + margin ≤ target).
    pub margin_bytes: u64,
    /// `limit × (1 − headroom)`, bytes.
    pub target_bytes: u64,
    /// Where `value` stands relative to the measured batches.
    pub support: Support,
    /// Whether the evidence backs `value` (act only then).
    pub backed: bool,
    /// The arithmetic, short: `fit twoBatchSizes: 66.5GiB + 205MiB × B,
    /// ≤72.0GiB → 27 (interpolated …)`.
    pub note: String,
}

/// The largest batch ≤ `at_most` whose predicted peak plus margin stays
/// under `limit × (1 − headroom_fraction)`, from the profile's
/// recommendation: the largest the evidence backs, or, when none does, the
/// largest the curve alone allows with `backed: false`. Every smaller batch
/// fits too (memory does not grow when the batch shrinks). `Err` (with why)
/// when there is no usable model, it is for another env var, or not even
/// one sample fits.
pub fn largest_fitting(
    rec: Option<&BatchRecommendation>,
    env: &str,
    at_most: u64,
    headroom_fraction: f64,
) -> Result<Fitting, NoFit> {
    let Some(rec) = rec else {
        return Err(NoFit::NoRecommendation);
    };
    if rec.env_var != env {
        return Err(NoFit::OtherEnv {
            recommended: rec.env_var.clone(),
            env: env.to_string(),
        });
    }
    let (Some(model), Some(limit)) = (model_in(rec), rec.limit_bytes) else {
        let mut why = rec.reason.clone();
        memprof_api::truncate_utf8(&mut why, 160);
        return Err(NoFit::NoModel(why));
    };
    let target = limit as f64 * (1.0 - clamp_headroom(headroom_fraction));
    let measured = measured_of(&rec.observations);
    let highest = highest_batch(&rec.observations, at_most);
    let found = model
        .largest_fitting(1.0, highest, target, 1.0, &measured)
        .or_else(|| model.largest_to_try(1.0, highest, target, 1.0, &measured));
    let Some(p) = found else {
        return Err(NoFit::NothingFits {
            at_most,
            one_sample: format_bytes(model.curve.at(1.0).max(0.0) as u64),
            target: format_bytes(target as u64),
        });
    };
    let value = p.x as u64;
    Ok(Fitting {
        value,
        predicted_peak_bytes: p.peak_bytes.max(0.0) as u64,
        margin_bytes: p.margin_bytes as u64,
        target_bytes: target as u64,
        support: p.support,
        backed: p.support.backed(),
        note: format!(
            "fit {}: {}, ≤{} → {value} ({})",
            rec.method,
            model.curve.describe("B"),
            format_bytes(target as u64),
            p.support.describe()
        ),
    })
}

/// Why no batch is computed from a recommendation (the policy then falls
/// back to its factor, saying this).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum NoFit {
    /// The roll-up has not written one.
    #[error("no batch recommendation in the MemoryProfile yet")]
    NoRecommendation,
    /// The recommendation models another variable than the policy scales.
    #[error(
        "the recommendation is for env {recommended}, the policy scales {env}: set annotation {annotation}: {env} on the Job",
        annotation = ANNOTATION_BATCH_ENV
    )]
    OtherEnv {
        /// The variable the recommendation models.
        recommended: String,
        /// The variable the policy scales.
        env: String,
    },
    /// The recommendation has no usable model: its own reason, bounded.
    #[error("{0}")]
    NoModel(String),
    /// Not even one sample fits under the target.
    #[error(
        "no batch up to {at_most} fits: one sample is predicted at {one_sample}, over {target}"
    )]
    NothingFits {
        /// The largest batch considered.
        at_most: u64,
        /// One sample's predicted peak, formatted.
        one_sample: String,
        /// The target, formatted.
        target: String,
    },
    /// The only fitting value is one the measured batches do not back.
    #[error("not backed: the curve would allow {value}, but that is {support}; the evidence backs no batch that fits")]
    NotBacked {
        /// What the curve would allow.
        value: u64,
        /// How far it is from the measured batches, in words.
        support: String,
    },
}

impl NoFit {
    /// In a few words, for the record's note.
    pub fn kind(&self) -> &'static str {
        match self {
            NoFit::NotBacked { .. } => "not backed by the measured batches",
            NoFit::NoModel(why) if why.starts_with("too little evidence") => "too little evidence",
            _ => "no usable recommendation",
        }
    }
}

/// The value a `scaleBatch` with `mode: fit` sets, from a recommendation.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyFit {
    /// The value to set.
    pub value: u64,
    /// The arithmetic, short (for the plan's summary and the record).
    pub note: String,
}

/// The value for a policy: the largest backed batch ≤ `at_most` under the
/// policy's headroom, rounded down to `round_to`, at least `minimum`. `Err`
/// (with why) when there is no usable recommendation, or the only fitting
/// value is one the evidence does not back (never acted on).
pub fn policy_value(
    rec: Option<&BatchRecommendation>,
    env: &str,
    headroom_fraction: f64,
    minimum: u64,
    round_to: Option<u64>,
    at_most: u64,
) -> Result<PolicyFit, NoFit> {
    let f = largest_fitting(rec, env, at_most, headroom_fraction)?;
    if !f.backed {
        return Err(NoFit::NotBacked {
            value: f.value,
            support: f.support.describe(),
        });
    }
    let mut value = f.value;
    if let Some(r) = round_to.filter(|r| *r > 1) {
        value -= value % r;
    }
    Ok(PolicyFit {
        value: value.max(minimum),
        note: f.note,
    })
}

#[cfg(test)]
mod tests;
