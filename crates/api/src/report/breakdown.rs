//! `MemoryBreakdown`: what holds a trainer's GPU memory (parameters,
//! gradients, optimizer state, activations, by module type), as a
//! MemoryReport carries it and a MemoryProfile repeats it. Its own file
//! because it is one measurement with its own vocabulary (module types,
//! parameter flags, module phases), independent of the rest of a report.

use crate::agent::{DpSgd, LayerRow, ParameterRow, RowsLeftOut};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

// Two types with the push's agent::Breakdown: why is said there.
/// What holds a trainer's GPU memory, measured by the in-process agent
/// (`memprof_agent.breakdown`): parameters, gradients, optimizer state,
/// per-sample gradients and the activations' peak above them, by module type.
/// Bounded: 6 module types, 16 flags, 32 module phases, 16 parameter rows
/// and 16 layer rows (with the totals of what they leave out).
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MemoryBreakdown {
    /// Pod the breakdown is of (in a MemoryProfile; a MemoryReport is the pod's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub pod: Option<String>,
    /// Rank: in a MemoryReport the trainer process's rank as the agent told it;
    /// in a MemoryProfile the pod's rank in its Job (as `bottleneck.rank`),
    /// else the process's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 1_000_000))]
    pub rank: Option<u32>,
    /// Process id of the trainer process measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// When the agent pushed it (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub time: Option<String>,
    /// Training step at which it was measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    /// Parameters of the model.
    pub total_parameters: u64,
    /// Parameters that require gradients.
    pub trainable_parameters: u64,
    /// Bytes held by parameters.
    pub parameters_bytes: u64,
    /// Bytes held by gradients (`.grad`).
    pub gradients_bytes: u64,
    /// Bytes held by optimizer state (e.g. Adam's two moments).
    pub optimizer_bytes: u64,
    /// Bytes held by per-sample gradients (Opacus `grad_sample`), when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_sample_gradients_bytes: Option<u64>,
    /// Bytes that do not depend on the batch: parameters + gradients +
    /// optimizer state (+ per-sample gradients).
    pub static_bytes: u64,
    /// Peak allocated bytes of the measured step above `staticBytes`: what
    /// activations (and temporaries) add, which grows with the batch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activations_peak_bytes: Option<u64>,
    /// Batch size (samples per step) of the measured step, when the trainer told it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_size: Option<u64>,
    /// Bytes per module type, recognised structurally (at most 6).
    #[schemars(length(max = 6))]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub by_module_type: Vec<ModuleTypeBytes>,
    /// Parameters holding NaN or Inf, or unusually large for their layer (at most 16).
    #[schemars(length(max = 16))]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flags: Vec<ParameterFlag>,
    /// Memory each top-level module adds in forward and backward
    /// (`memprof_agent.trace_modules`, opt-in; at most 32).
    #[schemars(length(max = 32))]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phases: Vec<ModulePhase>,
    /// Peak allocated bytes of the optimizer step above what it started with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimizer_step_peak_bytes: Option<u64>,
    /// The largest parameters by bytes: name, shape, dtype, bytes, trainable (at most 16).
    #[schemars(length(max = 16))]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parameter_rows: Vec<ParameterRow>,
    /// What the parameters left out of `parameterRows` add up to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters_left_out: Option<RowsLeftOut>,
    /// The largest layers by bytes (a block such as `model.layers.3`, or a
    /// module outside the blocks; at most 16).
    #[schemars(length(max = 16))]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layer_rows: Vec<LayerRow>,
    /// What the layers left out of `layerRows` add up to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layers_left_out: Option<RowsLeftOut>,
    /// DP-SGD's per-sample gradient norms and temporary matrices (Opacus).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dp_sgd: Option<DpSgd>,
}

/// A kind of module, recognised by its structure, not by one model's names.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ModuleType {
    /// Attention projections.
    Attention,
    /// Feed-forward (MLP) layers.
    Mlp,
    /// Embeddings.
    Embedding,
    /// Normalisation layers.
    Norm,
    /// LoRA adapters.
    Lora,
    /// Everything else.
    #[default]
    Other,
}

impl ModuleType {
    /// Every module type, in display order.
    pub const ALL: [ModuleType; 6] = [
        ModuleType::Attention,
        ModuleType::Mlp,
        ModuleType::Embedding,
        ModuleType::Norm,
        ModuleType::Lora,
        ModuleType::Other,
    ];

    /// The name on the wire (`attention`, `mlp`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            ModuleType::Attention => "attention",
            ModuleType::Mlp => "mlp",
            ModuleType::Embedding => "embedding",
            ModuleType::Norm => "norm",
            ModuleType::Lora => "lora",
            ModuleType::Other => "other",
        }
    }

    /// The module type named `s` on the wire.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }
}

/// Memory held by the parameters of one module type.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ModuleTypeBytes {
    /// The module type.
    #[serde(rename = "type")]
    pub type_: ModuleType,
    /// Parameters of modules of this type.
    pub parameters: u64,
    /// Bytes of those parameters.
    pub parameters_bytes: u64,
    /// Bytes of their gradients.
    pub gradients_bytes: u64,
    /// Bytes of their optimizer state.
    pub optimizer_bytes: u64,
}

/// What is wrong with a parameter.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum FlagKind {
    /// It holds NaN.
    #[default]
    Nan,
    /// It holds an infinity.
    Inf,
    /// It is unusually large for its layer.
    Large,
}

impl FlagKind {
    /// Every kind.
    pub const ALL: [FlagKind; 3] = [FlagKind::Nan, FlagKind::Inf, FlagKind::Large];

    /// The name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            FlagKind::Nan => "nan",
            FlagKind::Inf => "inf",
            FlagKind::Large => "large",
        }
    }

    /// The kind named `s` on the wire.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

// Two types with the push's agent::Flag: why is said there.
/// A parameter the agent flagged.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ParameterFlag {
    /// What is wrong.
    pub kind: FlagKind,
    /// The parameter's name (`named_parameters()`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 128))]
    pub parameter: String,
    /// Detail, e.g. its size against its layer's median.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 256))]
    pub note: String,
}

/// What one top-level module adds to allocated memory.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ModulePhase {
    /// The module's name (`named_children()`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 128))]
    pub module: String,
    /// Bytes its forward leaves allocated (after minus before, at least 0).
    pub forward_bytes: u64,
    /// Peak bytes its backward adds above the allocated bytes at its start.
    pub backward_bytes: u64,
}
