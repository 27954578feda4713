//! `MemoryReport`: one per pod, written by that pod's sidecar.
//!
//! Why the data sits in `spec` and there is no status subresource: the sidecar
//! is the only writer and the report is nothing but observations, so a single
//! server-side apply per update (not create + status patch) keeps the write
//! budget at one write per report, and the sidecar's RBAC needs only
//! `memoryreports`, not `memoryreports/status`.

use super::common::{Condition, DataSource, RiskLevel};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What one pod's sidecar saw of the pod's GPUs.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[kube(
    group = "memprof.dev",
    version = "v1alpha1",
    kind = "MemoryReport",
    namespaced,
    shortname = "mrep",
    category = "memprof",
    printcolumn = r#"{"name":"POD","type":"string","jsonPath":".spec.podName"}"#,
    printcolumn = r#"{"name":"RANK","type":"integer","jsonPath":".spec.rank"}"#,
    printcolumn = r#"{"name":"GPUS","type":"integer","jsonPath":".spec.summary.gpuCount"}"#,
    printcolumn = r#"{"name":"USED","type":"string","jsonPath":".spec.summary.used"}"#,
    printcolumn = r#"{"name":"PEAK","type":"string","jsonPath":".spec.summary.peak"}"#,
    printcolumn = r#"{"name":"RISK","type":"string","jsonPath":".spec.summary.risk"}"#,
    printcolumn = r#"{"name":"TTO","type":"string","jsonPath":".spec.summary.timeToOom"}"#,
    printcolumn = r#"{"name":"SOURCE","type":"string","jsonPath":".spec.summary.source"}"#,
    printcolumn = r#"{"name":"AGE","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct MemoryReportSpec {
    /// Name of the pod whose GPUs this report describes.
    #[schemars(length(min = 1, max = 253))]
    pub pod_name: String,
    /// Node the pod runs on, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub node_name: Option<String>,
    /// Job the pod belongs to, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub job_name: Option<String>,
    /// Rank of the pod in its job (completion index, `RANK`, or the pod name's ordinal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 1_000_000))]
    pub rank: Option<u32>,
    /// When the newest sample in this report was taken (RFC 3339). The operator
    /// ignores a report dated more than a minute in the future.
    #[schemars(length(min = 1, max = 64))]
    pub sampled_at: String,
    /// Sampling interval, in milliseconds.
    #[schemars(range(min = 1, max = 3_600_000))]
    pub interval_ms: u64,
    /// Roll-up of all GPUs of the pod (what `kubectl get memoryreports` shows).
    pub summary: ReportSummary,
    /// One entry per GPU visible to the pod. Empty when no GPU is visible;
    /// the `GpuVisible` condition then says why.
    #[schemars(length(max = 16))]
    #[serde(default)]
    pub gpus: Vec<GpuReport>,
    /// Allocator statistics pushed by the in-process agent, when it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocator: Option<AllocatorStats>,
    /// Conditions: `GpuVisible` (with the discovery method as reason).
    #[schemars(length(max = 8))]
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// Pod-level roll-up of a report.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ReportSummary {
    /// Number of GPUs reported.
    #[schemars(range(max = 16))]
    pub gpu_count: u32,
    /// Worst risk level among the pod's GPUs.
    pub risk: RiskLevel,
    /// Smallest predicted time to OOM among the pod's GPUs, for humans (e.g. `4m20s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub time_to_oom: Option<String>,
    /// Used memory of the fullest GPU, for humans (e.g. `61.2GiB (76%)`).
    #[schemars(length(max = 64))]
    pub used: String,
    /// Peak memory of the fullest GPU, for humans.
    #[schemars(length(max = 64))]
    pub peak: String,
    /// Where the numbers came from.
    pub source: DataSource,
}

/// What one GPU looked like.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GpuReport {
    /// NVML index of the GPU on its node.
    #[schemars(range(max = 64))]
    pub index: u32,
    /// GPU UUID (`GPU-…`), stable across reboots.
    #[schemars(length(max = 96))]
    pub uuid: String,
    /// Product name, e.g. `NVIDIA H100 80GB HBM3`.
    #[schemars(length(max = 96))]
    pub model: String,
    /// Total memory, in bytes.
    pub total_bytes: u64,
    /// Memory in use at the last sample, in bytes.
    pub used_bytes: u64,
    /// Highest used memory seen since the sidecar started, in bytes (tracked at every sample).
    pub peak_bytes: u64,
    /// GPU utilization in percent, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 100))]
    pub utilization_percent: Option<u32>,
    /// Growth rate of the upper memory envelope, in bytes per second (negative when shrinking).
    pub growth_bytes_per_second: f64,
    /// Predicted seconds until used memory reaches the total, when memory is growing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub time_to_oom_seconds: Option<f64>,
    /// OOM risk of this GPU.
    pub risk: RiskLevel,
    /// Confidence in the risk level, 0 to 1.
    #[schemars(range(min = 0.0, max = 1.0))]
    pub confidence: f64,
    /// The lower envelope (memory between steps) keeps growing: memory is being retained.
    pub leak_suspected: bool,
    /// A sudden jump of used memory was seen in the analysis window.
    pub spike_detected: bool,
    /// Fraction of reserved memory not allocated to tensors (0 to 1), when the agent reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub fragmentation: Option<f64>,
    /// Where the numbers came from.
    pub source: DataSource,
    /// Downsampled recent history: at most 60 points, oldest first.
    #[schemars(length(max = 60))]
    #[serde(default)]
    pub timeline: Vec<TimelinePoint>,
}

/// One downsampled point of a GPU's timeline.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
pub struct TimelinePoint {
    /// Seconds since the Unix epoch.
    #[schemars(range(min = 0))]
    pub t: i64,
    /// Highest used memory within the point's interval, in bytes.
    pub max: u64,
    /// Lowest used memory within the point's interval, in bytes.
    pub min: u64,
}

/// The trainer's allocator, as the in-process agent sees it (PyTorch's caching allocator).
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AllocatorStats {
    /// Bytes allocated to tensors.
    pub allocated_bytes: u64,
    /// Bytes reserved by the caching allocator.
    pub reserved_bytes: u64,
    /// Bytes in active blocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_bytes: Option<u64>,
    /// Bytes in inactive, split blocks (the fragmentation the allocator cannot return).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inactive_split_bytes: Option<u64>,
    /// Allocation retries after freeing cached blocks (a sign of pressure).
    #[serde(default)]
    pub alloc_retries: u64,
    /// CUDA OOMs the allocator raised.
    #[serde(default)]
    pub num_ooms: u64,
    /// Training step number last reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    /// Training phase last reported (e.g. `forward`, `backward`, `optimizer`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub phase: Option<String>,
}
