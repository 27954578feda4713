//! `MemoryReport`: one per pod, written by that pod's sidecar.
//!
//! Why the data sits in `spec`: the sidecar is the only writer of the
//! observations, so a single server-side apply per update (not create +
//! status patch) keeps the write budget at one write per report, and the
//! sidecar's RBAC needs only `memoryreports`, not `memoryreports/status`.
//! The status subresource is the other direction: the operator's
//! `directives` for the pod's trainer, which the pod itself cannot write.

use super::common::{Condition, DataSource, RiskLevel};
// The CRD kinds are generated only with the `crd` feature (see lib.rs).
#[cfg(any(test, feature = "crd"))]
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

mod allocator;
mod analysis;
mod breakdown;
mod cause;
mod checkpoint;
mod sites;
pub mod timeline;
pub use allocator::{
    AgentEvent, AllocatorStats, MemoryGrowth, OomBlock, OomSnapshotSummary, PhasePeak,
};
pub use analysis::{
    AllocationSizes, FragmentationPoint, GradientCheck, HostMemory, ObjectGrowth, SizeBucket,
    TensorGrowth, TrackedGrowth,
};
pub use breakdown::{
    FlagKind, MemoryBreakdown, ModulePhase, ModuleType, ModuleTypeBytes, ParameterFlag,
};
pub use cause::{Cause, NamedCause, MAX_EVIDENCE};
pub use checkpoint::{
    step_in, Checkpoint, CheckpointOutcome, CHECKPOINT_EVENT, MAX_CHECKPOINT_NOTE,
};
pub use sites::{
    AllocationSite, AllocationSites, MemoryReportStatus, MAX_CRITICAL_RANK_SITES,
    MAX_CRITICAL_SITE_RANKS, MAX_REPORT_DIRECTIVES, MAX_REPORT_SITES, MAX_SITE_FILE,
    MAX_SITE_FUNCTION,
};
pub use timeline::{TimelinePoint, MAX_PACKED_TIMELINE, PACKED_TIMELINE_PATTERN};

/// What one pod's sidecar saw of the pod's GPUs.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[cfg_attr(
    any(test, feature = "crd"),
    derive(CustomResource),
    kube(
        group = "memprof.dev",
        version = "v1alpha1",
        kind = "MemoryReport",
        namespaced,
        shortname = "mrep",
        category = "memprof",
        status = "MemoryReportStatus",
        printcolumn = r#"{"name":"POD","type":"string","jsonPath":".spec.podName"}"#,
        printcolumn = r#"{"name":"RANK","type":"integer","jsonPath":".spec.rank"}"#,
        printcolumn = r#"{"name":"GPUS","type":"integer","jsonPath":".spec.summary.gpuCount"}"#,
        printcolumn = r#"{"name":"USED","type":"string","jsonPath":".spec.summary.used"}"#,
        printcolumn = r#"{"name":"PEAK","type":"string","jsonPath":".spec.summary.peak"}"#,
        printcolumn = r#"{"name":"RISK","type":"string","jsonPath":".spec.summary.risk"}"#,
        printcolumn = r#"{"name":"TTO","type":"string","jsonPath":".spec.summary.timeToOom"}"#,
        printcolumn = r#"{"name":"SOURCE","type":"string","jsonPath":".spec.summary.source"}"#,
        printcolumn = r#"{"name":"AGE","type":"date","jsonPath":".metadata.creationTimestamp"}"#
    )
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
    /// The sidecar's heartbeat: while it runs, it writes this report at
    /// least this often (seconds, rounded up) even when nothing changes. The
    /// operator calls a rank stale when its report is older than two
    /// heartbeats plus 30 s (60 s assumed when absent; at most 600 s believed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 86_400))]
    pub heartbeat_seconds: Option<u64>,
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
    /// What holds the memory (`memprof_agent.breakdown`), as the in-process
    /// agent last pushed it: of the pod's trainer process with the largest
    /// static + activation bytes when the pod runs several.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breakdown: Option<MemoryBreakdown>,
    /// Conditions: `GpuVisible` (with the discovery method as reason).
    #[schemars(length(max = 8))]
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The newest acknowledgements of directives by the pod's trainer
    /// processes (contract B), at most 16, oldest first, one per directive
    /// id and process.
    #[schemars(length(max = 16))]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub agent_acks: Vec<AgentAck>,
    /// Where the trainer's live GPU memory was allocated (file and line), from
    /// the agent's snapshot at critical; the newest one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation_sites: Option<AllocationSites>,
    /// The newest checkpoint the pod's trainer announced (agent event
    /// `checkpoint`), its time never later than the push that carried it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_checkpoint: Option<Checkpoint>,
}

/// A trainer process's acknowledgement of a directive, as its agent pushed it.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AgentAck {
    /// The directive's id.
    #[schemars(length(min = 1, max = 64))]
    pub id: String,
    /// What the trainer did, in its own words.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 128))]
    pub action: String,
    /// Whether it did what was asked.
    pub ok: bool,
    /// When the sidecar received it (RFC 3339).
    #[schemars(length(max = 64))]
    pub time: String,
    /// The trainer process's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// The trainer process's rank, as its agent told it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 1_000_000))]
    pub rank: Option<u32>,
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
    /// What would cause the OOM this risk is about, with its evidence, when
    /// the verdict names one (`leak`, `growingDemand`, `neighbour`,
    /// `fragmentation`, `spike`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<NamedCause>,
    /// While `risk` is held above what this GPU's evidence calls for now
    /// (its time to OOM, confidence and usage): when it may fall, if the
    /// evidence stays lower (RFC 3339). A level rises at once and falls only
    /// once the lower evidence has lasted `levelHoldSeconds`, so a held
    /// level may carry a time to OOM or confidence that alone would call
    /// for less; this field says so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub risk_held_until: Option<String>,
    /// Where the numbers came from.
    pub source: DataSource,
    /// Where the risk, growth, time to OOM and leak flag came from when not
    /// from `source`: `agent` when the in-process agent's allocator numbers
    /// (allocated memory against the allocator's real limit) replaced NVML's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assessed_from: Option<DataSource>,
    /// Downsampled recent history, oldest first, packed: points `T:MAX:MIN`
    /// separated by spaces, `T` the first point's start in Unix seconds then
    /// seconds since the previous point, `MAX`/`MIN` the highest and lowest
    /// use in MiB (e.g. `1790000000:30721:15360 10:30722:15360`). The sidecar
    /// writes at most 60 points. One string, not 60 objects, because the API
    /// server checks a report value by value (docs/benchmarks.md, "Report writes").
    #[serde(
        default,
        rename = "packedTimeline",
        with = "timeline::packed",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(with = "String", length(max = timeline::MAX_PACKED_TIMELINE))]
    #[schemars(regex(pattern = timeline::PACKED_TIMELINE_PATTERN))]
    pub timeline: Vec<TimelinePoint>,
    /// Deprecated: the timeline as objects, as sidecars before
    /// `packedTimeline` wrote it; still accepted so that a sidecar injected
    /// before an upgrade goes on reporting. Readers take `packedTimeline`
    /// when a report has both.
    #[schemars(length(max = 60))]
    #[serde(default, rename = "timeline", skip_serializing_if = "Vec::is_empty")]
    pub legacy_timeline: Vec<TimelinePoint>,
}

impl GpuReport {
    /// The GPU's time to OOM as every view shows it and the roll-up counts
    /// it: at medium risk or above. Below, it is a trend too young or too
    /// irregular to act on (the report's summary does not show it, and a
    /// policy's `timeToOomBelowSeconds` must not act on it).
    pub fn counted_tto(&self) -> Option<f64> {
        self.time_to_oom_seconds
            .filter(|t| t.is_finite() && *t >= 0.0)
            .filter(|_| self.risk >= RiskLevel::Medium)
    }

    /// [`GpuReport::counted_tto`] for a table cell: `-` when there is none.
    pub fn tto_text(&self) -> String {
        self.counted_tto()
            .map_or_else(|| "-".into(), crate::format_duration)
    }

    /// The GPU's growth as every view shows it: where the verdict stands
    /// behind a trend (medium risk or above, or a leak flag). Below, the
    /// slope of a few noisy seconds (1 s sampling of a steady trainer's
    /// saw-tooth reads as +200 MiB/s) is not a growth to show.
    pub fn counted_growth(&self) -> Option<f64> {
        Some(self.growth_bytes_per_second)
            .filter(|g| g.is_finite())
            .filter(|_| self.risk >= RiskLevel::Medium || self.leak_suspected)
    }

    /// [`GpuReport::counted_growth`] for a table cell: `-` when there is none.
    pub fn growth_text(&self) -> String {
        self.counted_growth()
            .map_or_else(|| "-".into(), crate::format_rate)
    }

    /// The GPU's risk for a table cell: `critical (held)` while the level
    /// is held above its evidence ([`GpuReport::risk_held_until`]), so that
    /// a view never shows a level its own time to OOM and confidence
    /// contradict without saying why.
    pub fn risk_text(&self) -> String {
        match self.risk_held_until {
            Some(_) => format!("{} (held)", self.risk),
            None => self.risk.to_string(),
        }
    }

    /// The cause the verdict names, for a table cell: `-` when none.
    pub fn cause_text(&self) -> &'static str {
        self.cause.as_ref().map_or("-", |c| c.cause.as_str())
    }

    /// Which physical GPU this is, for counting GPUs across reports: its
    /// UUID when it has a real one (`GPU-…`, `MIG-…`: two reports naming the
    /// same UUID are one GPU), else the reporting pod's own index (a
    /// `cuda:0` the agent could not name is only that pod's).
    pub fn physical_key(&self, pod: &str) -> String {
        let real = ["GPU-", "MIG-"].iter().any(|p| {
            self.uuid
                .get(..4)
                .is_some_and(|u| u.eq_ignore_ascii_case(p))
        });
        if real {
            self.uuid.to_ascii_uppercase()
        } else {
            format!("{pod}/{}/{}", self.index, self.uuid)
        }
    }

    /// The GPU's timeline points, from whichever form the report carries.
    pub fn points(&self) -> &[TimelinePoint] {
        if self.timeline.is_empty() {
            &self.legacy_timeline
        } else {
            &self.timeline
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_risk_reads_held_in_every_table() {
        let mut g = GpuReport {
            risk: RiskLevel::Critical,
            ..Default::default()
        };
        assert_eq!(g.risk_text(), "critical");
        g.risk_held_until = Some("2026-11-28T21:00:30Z".into());
        assert_eq!(g.risk_text(), "critical (held)");
    }
}
