//! The GPU memory to request per rank role (`status.recommendation`),
//! right-sized from what the roles' trainers measured, with the evidence it
//! rests on. Its own file because it is one computation's output
//! (`memprof_analysis::recommend`), read by `kubectl memprof recommend`
//! and printed there in each GPU-sharing scheduler's dialect.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Roles a profile recommends for (a Job has one; a JobSet or PyTorchJob a few).
pub const MAX_RECOMMENDED_ROLES: usize = 8;

/// The role of every rank of a plain Job.
pub const ROLE_WORKER: &str = "worker";

/// The GPU memory one rank of a role should request, and why.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RoleRecommendation {
    /// The rank role (`worker` for every rank of a plain Job).
    #[schemars(length(min = 1, max = 63))]
    pub role: String,
    /// GPU memory to request per GPU of one rank of this role, bytes:
    /// `peakBytes + contextBytes + marginBytes`, rounded up to `stepBytes`.
    /// Absent until the peak phases were seen (`basis`, `reason`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_bytes: Option<u64>,
    /// The highest peak need of any rank's own trainer process, bytes: the
    /// smaller of its caching allocator's reserved peak (at least its peak
    /// allocated) and its allocated + inactive split peaks (`basis.source`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_bytes: Option<u64>,
    /// Memory outside the allocator: the CUDA context (and NCCL's buffers
    /// when the Job has more than one rank), measured on the GPU
    /// (`bench/estimate/calibration.json`), bytes.
    pub context_bytes: u64,
    /// Added for what the run may do that it did not show: the larger of
    /// the spread across ranks, the growth of the trainer's cache over the
    /// later half of the run, and a floor, bytes.
    pub margin_bytes: u64,
    /// The rounding step `requestBytes` is a multiple of, bytes. The
    /// recommendation is written again only when its request rises by a
    /// step or falls by more than one.
    pub step_bytes: u64,
    /// What the value rests on.
    pub basis: RecommendationBasis,
    /// Why this value, or what evidence is missing.
    #[schemars(length(min = 1, max = 512))]
    pub reason: String,
}

/// The evidence behind a role's recommendation.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RecommendationBasis {
    /// `allocatorHeld` (every measured rank's need is the smaller of its
    /// reserved peak and its allocated + inactive split peaks),
    /// `allocatorReserved` (some rank's agent tells no split peak: its
    /// reserved peak) or `none`.
    #[schemars(length(max = 32))]
    pub source: String,
    /// Ranks of the role whose report counts.
    pub ranks: u32,
    /// Ranks of the role whose trainer's agent pushed allocator numbers.
    pub ranks_measured: u32,
    /// Training steps the least advanced measured rank had reached.
    pub steps: u64,
    /// Allocator samples the spread was judged on, over all measured ranks.
    pub samples: u32,
    /// Some rank ran an evaluation phase (`memprof_agent.phase` named
    /// `eval…` or `valid…`).
    pub evaluation_seen: bool,
    /// Some rank announced a checkpoint (agent event `checkpoint`, or a
    /// phase named `checkpoint…` or `save…`).
    pub checkpoint_seen: bool,
    /// The phases the recommendation waits for (the Job's annotation
    /// `memprof.dev/recommend-phases`; both by default).
    #[schemars(length(max = 2), inner(length(max = 16)))]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phases_required: Vec<String>,
}

/// A GPU-sharing scheduler a recommendation can be written for, on a pod
/// template (the NVIDIA DRA driver's MPS limit lives in a claim's
/// parameters, not in the pod template: `kubectl memprof recommend` prints
/// it, a remediation does not write it).
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum GpuScheduler {
    /// HAMi: container limit `nvidia.com/gpumem`, MiB.
    #[default]
    Hami,
    /// Volcano vGPU: container limit `volcano.sh/vgpu-memory`, MiB.
    Volcano,
    /// KAI-Scheduler: pod annotation `gpu-memory`, MiB.
    KaiScheduler,
    /// Run:ai: pod annotation `gpu-memory`, counted in 10^6-byte MB (its
    /// documentation does not say 10^6 or 2^20: the larger count is at
    /// least the request either way).
    Runai,
}

/// Where a scheduler reads the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestPlace {
    /// A resource limit of each GPU container, by this name.
    ContainerLimit(&'static str),
    /// A pod annotation, by this key.
    PodAnnotation(&'static str),
}

impl GpuScheduler {
    /// Where this scheduler reads the request.
    pub fn place(self) -> RequestPlace {
        match self {
            GpuScheduler::Hami => RequestPlace::ContainerLimit("nvidia.com/gpumem"),
            GpuScheduler::Volcano => RequestPlace::ContainerLimit("volcano.sh/vgpu-memory"),
            GpuScheduler::KaiScheduler | GpuScheduler::Runai => {
                RequestPlace::PodAnnotation("gpu-memory")
            }
        }
    }

    /// `bytes` in this scheduler's unit, rounded up (never below the request).
    pub fn amount(self, bytes: u64) -> u64 {
        match self {
            GpuScheduler::Runai => bytes.div_ceil(1_000_000),
            _ => bytes.div_ceil(1 << 20),
        }
    }
}
