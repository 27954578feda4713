//! The job's batch-size recommendation (`status.batchRecommendation`): the
//! largest batch that fits, the fitted memory model and the observations it
//! rests on. Its own file because it is one computation's output, written by
//! the roll-up and read by `scaleBatch` with `mode: fit`, apart from the
//! status's risk figures.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The largest safe batch size of the job and the evidence it rests on.
/// Written by the roll-up; `scaleBatch` with `mode: fit` applies it.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BatchRecommendation {
    /// Env var holding the batch size (annotation `memprof.dev/batch-env`, default `BATCH_SIZE`).
    #[schemars(length(min = 1, max = 128))]
    pub env_var: String,
    /// The Job's batch size now (its env var's literal value), when it sets one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<u64>,
    /// Largest batch whose predicted peak stays under the headroom target; null when none fits or the evidence is too thin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recommended: Option<u64>,
    /// The next value up (recommended + 1), predicted to cross the target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_up: Option<u64>,
    /// Predicted peak at `recommended`, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_peak_bytes: Option<u64>,
    /// Predicted peak at `nextUp`, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_next_up_bytes: Option<u64>,
    /// Memory of the fullest GPU, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_bytes: Option<u64>,
    /// Fraction of `limitBytes` kept free (0.1: predicted peaks stay under 90 %).
    #[schemars(range(min = 0.0, max = 0.9))]
    pub headroom_fraction: f64,
    /// Memory that does not grow with the batch (weights, gradients, optimizer state, CUDA context), bytes; may be negative for a fit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub static_bytes: Option<i64>,
    /// Memory each sample of the batch adds, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_sample_bytes: Option<u64>,
    /// Root mean square of the fit's residuals, bytes (two batch sizes: 0, an exact line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub residual_bytes: Option<u64>,
    /// The memory model the values come from (the one `memprof sweep` uses):
    /// its curve, error margin and the batches the evidence backs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<BatchFitModel>,
    /// Where `recommended` stands relative to the evidence: `measured`,
    /// `interpolated between measured values`, or `extrapolated N below the
    /// smallest measured value M (-P%)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 160))]
    pub support: Option<String>,
    /// The batch the curve alone would allow when the evidence does not back
    /// it (further from the measured batches than a held-out check covered);
    /// shown, never acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unbacked: Option<u64>,
    /// `agentBreakdown`, `twoBatchSizes` or `insufficient`.
    #[schemars(length(min = 1, max = 32))]
    pub method: String,
    /// Why this value, or what evidence is missing.
    #[schemars(length(min = 1, max = 512))]
    pub reason: String,
    /// Peaks observed at each batch size, across the Job's recreations by memprof
    /// (at most 8, least recently seen dropped first).
    #[schemars(length(max = 8))]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub observations: Vec<BatchObservation>,
}

/// `peak = static + perSample × batch + perSampleSquared × batch²`, with
/// what backs it. Chosen by how well each candidate predicts a measured
/// batch it was not fitted on (leave-one-out); a curve with a negative
/// static part, or that under-predicts its largest batch when fitted on the
/// others, is refused.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BatchFitModel {
    /// `linear` or `quadratic`.
    #[schemars(length(max = 16))]
    pub family: String,
    /// Bytes at batch 0 (weights, gradients, optimizer state, context).
    pub static_bytes: i64,
    /// Bytes per sample.
    pub per_sample_bytes: f64,
    /// Bytes per sample squared (0 for a line).
    #[serde(default)]
    pub per_sample_squared_bytes: f64,
    /// Error allowed for in every prediction: the worst held-out error, at
    /// least the allocator's noise floor (doubled at a full step beyond the
    /// measured batches), bytes.
    pub margin_bytes: u64,
    /// Root mean square of the held-out errors, bytes; absent with two points.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_out_error_bytes: Option<u64>,
    /// Points fitted.
    pub points: u32,
    /// Smallest batch fitted (0: the agent breakdown's static part).
    pub measured_min: u64,
    /// Largest batch fitted.
    pub measured_max: u64,
    /// Smallest batch the evidence backs.
    pub backed_min: u64,
    /// Largest batch the evidence backs.
    pub backed_max: u64,
}

/// The highest GPU peak seen while the Job ran with one batch size.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BatchObservation {
    /// Batch size.
    pub batch: u64,
    /// Highest peak of the fullest GPU, bytes.
    pub peak_bytes: u64,
    /// That GPU's memory, bytes.
    pub total_bytes: u64,
}
