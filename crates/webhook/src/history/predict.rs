//! The prediction from history, pure: a new Job's peak at its batch, from the
//! memory model the roll-up fitted for an earlier Job of the same family
//! (`status.batchRecommendation.model`, the one `scaleBatch` with
//! `mode: fit` applies), and the warning or denial it leads to.

use memprof_api::{format_bytes, BatchFitModel, MemoryProfile};
use std::collections::BTreeMap;

/// One profile's fitted memory model, as the webhook keeps it.
#[derive(Clone, Debug, PartialEq)]
pub struct Fitted {
    /// The MemoryProfile's name (its Job's).
    pub profile: String,
    /// The env var holding the batch size that the model is a function of.
    pub env_var: String,
    /// The model.
    pub model: BatchFitModel,
    /// Memory of the fullest GPU the profile measured, bytes.
    pub gpu_bytes: Option<u64>,
    /// The largest batch the profile recommends, if any.
    pub recommended: Option<u64>,
}

impl Fitted {
    /// The fitted model of `profile`, when its status carries one.
    pub fn of(profile: &MemoryProfile) -> Option<Fitted> {
        let rec = profile.status.as_ref()?.batch_recommendation.as_ref()?;
        let model = rec.model.clone()?;
        let observed = rec.observations.iter().map(|o| o.total_bytes).max();
        Some(Fitted {
            profile: profile.metadata.name.clone().unwrap_or_default(),
            env_var: rec.env_var.clone(),
            model,
            gpu_bytes: rec.limit_bytes.or(observed).filter(|&b| b > 0),
            recommended: rec.recommended,
        })
    }

    /// Predicted peak at `batch`, bytes, rounded up.
    pub fn peak_at(&self, batch: u64) -> u64 {
        let (m, b) = (&self.model, batch as f64);
        let peak =
            m.static_bytes as f64 + m.per_sample_bytes * b + m.per_sample_squared_bytes * b * b;
        peak.max(0.0).ceil().min(u64::MAX as f64) as u64
    }
}

/// Where the GPU's memory came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuBasis {
    /// The Job's `memprof.dev/gpu-memory` annotation.
    Annotation,
    /// What the history's profile measured.
    Measured,
}

/// A prediction of a new Job's peak from one profile of its family.
#[derive(Clone, Debug, PartialEq)]
pub struct Prediction {
    /// The profile whose model predicts.
    pub basis: Fitted,
    /// Profiles of the family with a fitted model (the one with the most
    /// measured points is used).
    pub profiles: usize,
    /// The Job's batch.
    pub batch: u64,
    /// Predicted peak per rank, bytes.
    pub peak: u64,
    /// The GPU's memory, bytes.
    pub gpu: u64,
    /// Where `gpu` came from.
    pub gpu_basis: GpuBasis,
}

impl Prediction {
    /// The peak allowing for the model's error margin.
    pub fn upper(&self) -> u64 {
        self.peak.saturating_add(self.basis.model.margin_bytes)
    }
}

/// What the history says of a new Job.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// No profile of the family carries a fitted model yet.
    NoHistory,
    /// The Job sets no literal numeric value for the model's env var.
    NoBatch {
        /// The env var the model is a function of.
        env_var: String,
    },
    /// Neither the annotation nor the history says the GPU's memory.
    NoGpu,
    /// The peak, margin included, stays under the GPU.
    Fits(Prediction),
    /// Only the margin crosses the GPU: it may run out.
    MayExceed(Prediction),
    /// The predicted peak itself is above the GPU.
    Exceeds(Prediction),
}

/// Predicts the Job's peak from `fits` (its family's profiles in its
/// namespace), its literal env values and its annotated GPU memory.
pub fn predict(fits: &[Fitted], env: &BTreeMap<String, String>, gpu: Option<u64>) -> Outcome {
    // The most measured points, then the name: the same answer every time.
    let Some(basis) = fits
        .iter()
        .max_by(|a, b| (a.model.points, &b.profile).cmp(&(b.model.points, &a.profile)))
    else {
        return Outcome::NoHistory;
    };
    let batch = env
        .get(&basis.env_var)
        .and_then(|v| v.trim().parse::<u64>().ok());
    let Some(batch) = batch else {
        let env_var = basis.env_var.clone();
        return Outcome::NoBatch { env_var };
    };
    let (gpu, gpu_basis) = match (gpu, basis.gpu_bytes) {
        (Some(g), _) => (g, GpuBasis::Annotation),
        (None, Some(g)) => (g, GpuBasis::Measured),
        (None, None) => return Outcome::NoGpu,
    };
    let p = Prediction {
        basis: basis.clone(),
        profiles: fits.len(),
        batch,
        peak: basis.peak_at(batch),
        gpu,
        gpu_basis,
    };
    match (p.peak > gpu, p.upper() > gpu) {
        (true, _) => Outcome::Exceeds(p),
        (false, true) => Outcome::MayExceed(p),
        (false, false) => Outcome::Fits(p),
    }
}

/// Drops control characters (line breaks, escapes) from text said back to
/// the user, and bounds it.
pub fn clean(text: &str, max: usize) -> String {
    text.chars().filter(|c| !c.is_control()).take(max).collect()
}

/// The basis in words: which profile, how many points, how sure.
pub fn basis_words(p: &Prediction, family: &str) -> String {
    let m = &p.basis.model;
    let others = match p.profiles {
        1 => String::new(),
        n => format!(" (the most measured of {n} profiles of the family)"),
    };
    let held_out = m
        .held_out_error_bytes
        .map(|e| format!(", held-out error {}", format_bytes(e)))
        .unwrap_or_default();
    let reach = if (m.backed_min..=m.backed_max).contains(&p.batch) {
        ""
    } else {
        ", extrapolated beyond the batches the measurements back"
    };
    format!(
        "measured history of family {family} in this namespace: MemoryProfile {}{others}, a {}fit \
         of {} measured points at batches {}..{}, error margin {}{held_out}{reach}; GPU memory {}",
        clean(&p.basis.profile, 253),
        match clean(&m.family, 16) {
            f if f.is_empty() => f,
            f => f + " ",
        },
        m.points,
        m.measured_min,
        m.measured_max,
        format_bytes(m.margin_bytes),
        match p.gpu_basis {
            GpuBasis::Annotation => "from memprof.dev/gpu-memory",
            GpuBasis::Measured => "as the profile measured it",
        },
    )
}

/// The admission warning for an outcome of a `kind` (`Job`, `JobSet`,
/// `TrainJob`, `PyTorchJob`), None when there is nothing to say.
pub fn warning(outcome: &Outcome, kind: &str, family: &str) -> Option<String> {
    let (p, verdict) = match outcome {
        Outcome::Exceeds(p) => (p, "is expected to run out of GPU memory"),
        Outcome::MayExceed(p) => (p, "may run out of GPU memory (within the model's error)"),
        Outcome::NoBatch { env_var } => {
            return Some(format!(
                "memprof: {} is set but the {kind} sets no numeric {} in its containers' env; \
                 no prediction from the family's measured history",
                memprof_api::family::ANNOTATION_FAMILY,
                clean(env_var, 128),
            ))
        }
        Outcome::NoHistory | Outcome::NoGpu | Outcome::Fits(_) => return None,
    };
    let env_var = clean(&p.basis.env_var, 128);
    Some(format!(
        "memprof: predicted peak {} per rank at {env_var}={} (up to {} with the model's margin) \
         against the GPU's {} ({}): this {kind} {verdict}; {}",
        format_bytes(p.peak),
        p.batch,
        format_bytes(p.upper()),
        format_bytes(p.gpu),
        basis_words(p, family),
        advice(p),
    ))
}

/// What to change, in words.
pub fn advice(p: &Prediction) -> String {
    let env_var = clean(&p.basis.env_var, 128);
    match p.basis.recommended {
        Some(r) if r < p.batch => format!(
            "lower {env_var} (MemoryProfile {} recommends at most {r})",
            clean(&p.basis.profile, 253)
        ),
        _ => format!("lower {env_var}, or give each rank a larger GPU"),
    }
}

#[cfg(test)]
mod tests;
