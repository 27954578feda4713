//! `MemoryProfile`: one per profiled workload, status written by the operator only.
//!
//! Its size is bounded whatever the rank count: the status keeps aggregates,
//! the bottleneck and the top-K ranks, never one entry per rank (etcd caps an
//! object at 1.5 MiB and rewrites all of it on every write).

use super::common::{Condition, RiskLevel};
// The CRD kinds are generated only with the `crd` feature (see lib.rs).
#[cfg(any(test, feature = "crd"))]
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

mod acks;
mod batch;
mod history;
mod ranks;
mod recommendation;
pub use acks::{Acknowledgements, MAX_ACK_RANKS};
pub use batch::{BatchFitModel, BatchObservation, BatchRecommendation};
pub use history::{
    OomRecord, RemediationRecord, RemediationTotal, ANNOTATION_GPU_OOM, REASON_GPU_OUT_OF_MEMORY,
};
pub use ranks::{
    AgentOomRecord, AllocatorRollup, GpuLocation, RankAllocationSites, RankSummary, StaleRank,
};
pub use recommendation::{
    GpuScheduler, RecommendationBasis, RequestPlace, RoleRecommendation, MAX_RECOMMENDED_ROLES,
    ROLE_WORKER,
};

/// A profiled workload and what memprof concluded about its GPU memory.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[cfg_attr(
    any(test, feature = "crd"),
    derive(CustomResource),
    kube(
        group = "memprof.dev",
        version = "v1alpha1",
        kind = "MemoryProfile",
        namespaced,
        shortname = "mprof",
        category = "memprof",
        status = "MemoryProfileStatus",
        // The kind of workload (Job, JobSet, TrainJob) the profile is named after.
        printcolumn = r#"{"name":"KIND","type":"string","jsonPath":".metadata.labels.memprof\\.dev/workload-kind"}"#,
        printcolumn = r#"{"name":"JOB","type":"string","jsonPath":".spec.jobName"}"#,
        printcolumn = r#"{"name":"RANKS","type":"string","jsonPath":".status.ranks"}"#,
        printcolumn = r#"{"name":"GPUS","type":"integer","jsonPath":".status.gpuCount"}"#,
        printcolumn = r#"{"name":"PEAK","type":"string","jsonPath":".status.peak"}"#,
        printcolumn = r#"{"name":"RISK","type":"string","jsonPath":".status.risk"}"#,
        printcolumn = r#"{"name":"TTO","type":"string","jsonPath":".status.timeToOom"}"#,
        printcolumn = r#"{"name":"CAUSE","type":"string","jsonPath":".status.cause.cause"}"#,
        printcolumn = r#"{"name":"IMBALANCE","type":"string","jsonPath":".status.imbalanceDisplay"}"#,
        printcolumn = r#"{"name":"OOMS","type":"integer","jsonPath":".status.oomCount"}"#,
        printcolumn = r#"{"name":"ACTION","type":"string","jsonPath":".status.lastAction"}"#,
        printcolumn = r#"{"name":"AGE","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    // `kubectl get memoryprofiles -o wide` (priority 1): where, how sure, how fresh.
    printcolumn = r#"{"name":"BOTTLENECK","type":"string","jsonPath":".status.bottleneck.pod","priority":1}"#,
    printcolumn = r#"{"name":"CONFIDENCE","type":"number","jsonPath":".status.confidence","priority":1}"#,
    printcolumn = r#"{"name":"NOW%","type":"number","jsonPath":".status.currentPercent","priority":1}"#,
    printcolumn = r#"{"name":"LEAK","type":"boolean","jsonPath":".status.leakSuspected","priority":1}"#,
    printcolumn = r#"{"name":"STALE","type":"integer","jsonPath":".status.ranksStale","priority":1}"#,
    printcolumn = r#"{"name":"LAST REPORT","type":"date","jsonPath":".status.lastReportTime","priority":1}"#
    )
)]
#[serde(rename_all = "camelCase")]
pub struct MemoryProfileSpec {
    /// Name of the Job this profile describes (in the profile's namespace).
    #[schemars(length(min = 1, max = 253))]
    pub job_name: String,
    /// Number of ranks (pods) expected to report: the Job's parallelism.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 1_000_000))]
    pub expected_ranks: Option<u32>,
}

/// What the operator concluded from the job's MemoryReports.
// No field of the status is nullable in the CRD (`not_nullable`): the API
// server publishes a nullable field to OpenAPI v2 without its type, so
// `kubectl explain memoryprofile.status` showed `<>` for each. Every
// optional field is left out when empty (`skip_serializing_if`), never
// written as `null`, so the schema says no more than the JSON does.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = schemars::transform::RecursiveTransform(not_nullable))]
pub struct MemoryProfileStatus {
    /// Ranks whose report counts and is fresh (not stale: see `ranksStale`).
    pub ranks_reporting: u32,
    /// Ranks whose report counts but is stale: older than two of its
    /// sidecar's heartbeats plus 30 s (150 s by default). Their last report
    /// stays in every figure of this status (risk included), marked stale.
    #[serde(default)]
    pub ranks_stale: u32,
    /// Stale ranks, worst risk first, then longest silent (at most 8).
    #[schemars(length(max = 8))]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stale_ranks: Vec<StaleRank>,
    /// Ranks expected (the Job's parallelism), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ranks_expected: Option<u32>,
    /// `reporting/expected`, for humans, with ` (N stale)` when ranks are stale.
    #[schemars(length(max = 32))]
    pub ranks: String,
    /// GPUs reported across all ranks.
    pub gpu_count: u32,
    /// Highest peak of any GPU, in bytes.
    pub peak_used_bytes: u64,
    /// Peak of the fullest GPU as a percentage of its total memory.
    #[schemars(range(min = 0.0, max = 100.0))]
    pub peak_percent: f64,
    /// Highest current usage of any GPU, in bytes.
    pub current_used_bytes: u64,
    /// Current usage of the fullest GPU as a percentage of its total memory.
    #[schemars(range(min = 0.0, max = 100.0))]
    pub current_percent: f64,
    /// Peak for humans, e.g. `61.2GiB (76%)`.
    #[schemars(length(max = 64))]
    pub peak: String,
    /// Worst risk level of any GPU of the job, held for a dwell time (60 s)
    /// after the evidence for it ended: it rises at once and falls only when
    /// the lower level has lasted (see `riskHeldUntil`).
    pub risk: RiskLevel,
    /// While `risk` is held above what the ranks report now: when it may
    /// fall, unless a report renews it (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub risk_held_until: Option<String>,
    /// Confidence of that risk level, 0 to 1.
    #[schemars(range(min = 0.0, max = 1.0))]
    pub confidence: f64,
    /// Smallest predicted time to OOM of any rank's worst GPU, in seconds,
    /// as of when this status was computed: each report's prediction less
    /// the report's age (never below 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub time_to_oom_seconds: Option<f64>,
    /// Smallest time to OOM, for humans.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub time_to_oom: Option<String>,
    /// What would cause the OOM `risk` is about: the cause the bottleneck
    /// GPU's verdict names, with its evidence (absent when it names none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<crate::NamedCause>,
    /// Some GPU's memory keeps growing between steps.
    pub leak_suspected: bool,
    /// Ranks with a suspected leak (at most 8).
    #[schemars(length(max = 8))]
    #[serde(default)]
    pub leak_ranks: Vec<u32>,
    /// Highest fragmentation reported by an in-process agent (0 to 1), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub fragmentation: Option<f64>,
    /// What the in-process agents' allocator numbers add, when an agent runs in some rank.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocator: Option<AllocatorRollup>,
    /// What holds the memory of the rank with the largest static + activation
    /// bytes (its agent's `memprof_agent.breakdown`), with `pod` and `rank` set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breakdown: Option<super::MemoryBreakdown>,
    /// Max over mean of per-GPU peak memory across the job (1 = perfectly balanced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1.0))]
    pub imbalance: Option<f64>,
    /// Imbalance for humans, e.g. `1.42`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub imbalance_display: Option<String>,
    /// The GPU that will run out of memory first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bottleneck: Option<GpuLocation>,
    /// The ranks closest to OOM, worst first (at most 8).
    #[schemars(length(max = 8))]
    #[serde(default)]
    pub top_ranks: Vec<RankSummary>,
    /// GPU OOMs observed (at most 16, newest last).
    #[schemars(length(max = 16))]
    #[serde(default)]
    pub ooms: Vec<OomRecord>,
    /// GPU OOMs recorded in all, including those no longer in `ooms` (the
    /// `OOMS` column). Absent until the first one; counted by the
    /// remediation stage in the edit that adds the record to `ooms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom_count: Option<u32>,
    /// Where the worst rank's live GPU memory was allocated (file and line),
    /// from its agent's snapshot at critical, before any OOM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation_sites: Option<RankAllocationSites>,
    /// Every counted rank whose agent's snapshot was taken at critical, each
    /// with its top 4 sites: the ranks with the largest GPU peak first (then
    /// by rank), at most 16 (`criticalRanksWithSitesOmitted` counts the rest).
    #[schemars(length(max = 16))]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub critical_allocation_sites: Vec<RankAllocationSites>,
    /// Ranks with sites taken at critical left out of
    /// `criticalAllocationSites` by its bound (absent when none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub critical_ranks_with_sites_omitted: u32,
    /// Remediations performed (at most 16, newest last).
    #[schemars(length(max = 16))]
    #[serde(default)]
    pub remediations: Vec<RemediationRecord>,
    /// Per policy, every remediation that changed this workload, however old: what
    /// `maxRemediations` and the cooldown count, since `remediations` keeps only the
    /// newest 16 (at most 32 policies, least recent dropped first).
    #[schemars(length(max = 32))]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remediation_totals: Vec<RemediationTotal>,
    /// Last action taken on the job, for humans.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub last_action: Option<String>,
    /// Newest `sampledAt` among the job's reports (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub last_report_time: Option<String>,
    /// Oldest `sampledAt` among the counted ranks' reports (RFC 3339): now
    /// minus this is how long the quietest rank has been silent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub oldest_report_time: Option<String>,
    /// Conditions: `Ready`, `ReportsValid`, `ReportsCounted`, `RanksStale`.
    #[schemars(length(max = 8))]
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The analysis thresholds the Job's sidecars use, and where they come
    /// from (see docs/observability.md, "Thresholds").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thresholds: Option<ThresholdsInEffect>,
    /// The largest batch size that fits under the headroom target, computed
    /// from measurement (see `analysis::batchfit` and docs/remediation.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_recommendation: Option<BatchRecommendation>,
    /// The GPU memory to request per rank role, from what the trainers
    /// measured (see `memprof_analysis::recommend` and docs/recommend.md).
    #[schemars(length(max = 8))]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recommendation: Vec<RoleRecommendation>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The schema of an `Option<T>` field as the schema of `T` (applied to
/// every subschema of the status; see [`MemoryProfileStatus`]'s comment):
/// `null` dropped from `type` and from `anyOf`, no `nullable`.
fn not_nullable(schema: &mut schemars::Schema) {
    use serde_json::Value;
    let Some(obj) = schema.as_object_mut() else {
        return;
    };
    obj.remove("nullable");
    if let Some(Value::Array(types)) = obj.get_mut("type") {
        types.retain(|t| t != "null");
        if let [only] = types.as_slice() {
            let only = only.clone();
            obj.insert("type".into(), only);
        }
    }
    let is_null = |v: &Value| {
        v.get("type").is_some_and(|t| t == "null")
            || v.get("enum")
                .is_some_and(|e| *e == Value::Array(vec![Value::Null]))
            || v.get("const").is_some_and(Value::is_null)
    };
    let Some(Value::Array(any_of)) = obj.get_mut("anyOf") else {
        return;
    };
    any_of.retain(|v| !is_null(v));
    if let [Value::Object(only)] = any_of.as_slice() {
        let only = only.clone();
        obj.remove("anyOf");
        for (k, v) in only {
            obj.entry(k).or_insert(v);
        }
    }
}

/// The analysis thresholds in effect for a profiled workload (a Job, a
/// JobSet, a TrainJob, a PyTorchJob): what its sidecars were given.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ThresholdsInEffect {
    /// `default` (built in), `chart` (the cluster-wide `--default-thresholds`)
    /// or `annotation` (the workload's `memprof.dev/thresholds`: a Job's or
    /// PyTorchJob's own, a JobSet's or TrainJob's on its child Jobs).
    #[schemars(length(max = 16))]
    pub source: String,
    /// Every threshold by its camelCase name (`highTtoSeconds`, ...).
    #[schemars(length(max = 32))]
    pub values: std::collections::BTreeMap<String, f64>,
    /// Why the workload's annotation was ignored, when it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub message: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The schema says no status field is nullable (`not_nullable`): true
    /// only while no field is ever written as `null`. Every optional object
    /// and list entry of the status, filled with its defaults, writes none.
    #[test]
    fn no_status_field_is_written_as_null() {
        fn nulls(path: &str, v: &serde_json::Value, found: &mut Vec<String>) {
            match v {
                serde_json::Value::Null => found.push(path.to_string()),
                serde_json::Value::Array(a) => {
                    a.iter().for_each(|x| nulls(&format!("{path}[]"), x, found))
                }
                serde_json::Value::Object(o) => o
                    .iter()
                    .for_each(|(k, x)| nulls(&format!("{path}.{k}"), x, found)),
                _ => {}
            }
        }
        let status = MemoryProfileStatus {
            stale_ranks: vec![Default::default()],
            allocator: Some(AllocatorRollup {
                last_oom: Some(Default::default()),
                ..Default::default()
            }),
            breakdown: Some(Default::default()),
            bottleneck: Some(Default::default()),
            top_ranks: vec![Default::default()],
            ooms: vec![Default::default()],
            allocation_sites: Some(Default::default()),
            critical_allocation_sites: vec![Default::default()],
            remediations: vec![RemediationRecord {
                acknowledged: Some(Default::default()),
                checkpoint: Some(crate::CheckpointOutcome {
                    kept: Some(Default::default()),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            remediation_totals: vec![Default::default()],
            conditions: vec![Default::default()],
            thresholds: Some(Default::default()),
            batch_recommendation: Some(BatchRecommendation {
                model: Some(Default::default()),
                ..Default::default()
            }),
            recommendation: vec![Default::default()],
            ..Default::default()
        };
        let mut found = vec![];
        nulls(
            ".status",
            &serde_json::to_value(&status).unwrap(),
            &mut found,
        );
        assert!(found.is_empty(), "written as null: {found:?}");
    }

    #[test]
    fn the_profile_lists_ooms_in_a_printer_column() {
        use kube::CustomResourceExt;
        let crd = serde_json::to_value(MemoryProfile::crd()).unwrap();
        let cols = &crd["spec"]["versions"][0]["additionalPrinterColumns"];
        let ooms = cols
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "OOMS")
            .expect("an OOMS column");
        assert_eq!(ooms["jsonPath"], ".status.oomCount");
        // Absent until the first OOM, so the roll-up's status applies never own it.
        let status = serde_json::to_value(MemoryProfileStatus::default()).unwrap();
        assert!(status.get("oomCount").is_none(), "{status}");
    }
}
