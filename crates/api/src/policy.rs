//! `RemediationPolicy`: what memprof may do to a profiled Job when its GPU
//! memory gets dangerous, written by users, status written by the
//! remediation controller (field manager `memprof-remediation`).
//!
//! Why the triggers and actions are lists of single-key objects rather than
//! tagged enums: the CRD must stay a structural schema that a 1.20 API server
//! enforces without CEL, so "exactly one kind per entry" is expressed as
//! `minProperties: 1, maxProperties: 1` and every bound (factor range, level
//! enum, required env) is plain OpenAPI. Invalid policies are then rejected
//! by the API server itself, with a message naming the field.

use super::common::{Condition, RiskLevel};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
// The CRD kinds are generated only with the `crd` feature (see lib.rs).
#[cfg(any(test, feature = "crd"))]
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Field manager of the remediation controller's writes (profile `ooms`,
/// `remediations`, `lastAction`; policy status).
pub const REMEDIATION_MANAGER: &str = "memprof-remediation";
/// Annotation on a Job recreated by a remediation: the remediation's id.
pub const ANNOTATION_REMEDIATION: &str = "memprof.dev/remediation";
/// Annotation on a Job recreated by a remediation: a random value kept in
/// the plan (in the operator's namespace) until the Job exists, so that a
/// Job someone else created under the same name and id is not taken for it.
pub const ANNOTATION_REMEDIATION_NONCE: &str = "memprof.dev/remediation-nonce";
/// Prefix of the annotation keeping an env var's value from before the first
/// remediation, e.g. `memprof.dev/original-batch_size: "32"`.
pub const ANNOTATION_ORIGINAL_PREFIX: &str = "memprof.dev/original-";
/// Label on the ConfigMap holding a pending remediation's plan: its id.
pub const LABEL_REMEDIATION: &str = "memprof.dev/remediation";
/// Label a ConfigMap must carry (`"true"`) for a `setConfigMapKey` action to
/// write it: the operator writes a tenant's ConfigMap only where the tenant opted in.
pub const LABEL_REMEDIABLE: &str = "memprof.dev/remediable";
/// Default `cooldownSeconds`.
pub const DEFAULT_COOLDOWN_SECONDS: u32 = 600;
/// Default `maxRemediations`.
pub const DEFAULT_MAX_REMEDIATIONS: u32 = 3;
/// Upper bound on the Jobs and actions listed in a policy's status.
pub const MAX_POLICY_STATUS_ITEMS: usize = 16;

fn default_cooldown() -> u32 {
    DEFAULT_COOLDOWN_SECONDS
}

fn default_max_remediations() -> u32 {
    DEFAULT_MAX_REMEDIATIONS
}

fn default_minimum() -> u32 {
    1
}

/// Kubernetes' label selector, bounded: policies are written by any
/// namespace editor and cached by the operator, so what it holds is bounded
/// by this schema, not by what a tenant writes (32 labels, 16 expressions
/// of 64 values; the API server's own limits on key and value lengths).
fn bounded_selector(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "properties": {
            "matchLabels": {
                "description": "Labels a Job must carry, all of them.",
                "type": "object",
                "maxProperties": 32,
                "additionalProperties": { "type": "string", "maxLength": 63 }
            },
            "matchExpressions": {
                "description": "Requirements a Job's labels must meet, all of them.",
                "type": "array",
                "maxItems": 16,
                "items": {
                    "type": "object",
                    "required": ["key", "operator"],
                    "properties": {
                        "key": { "description": "The label key.", "type": "string", "maxLength": 317 },
                        "operator": { "description": "In, NotIn, Exists or DoesNotExist.", "type": "string", "maxLength": 16 },
                        "values": {
                            "description": "Values for In and NotIn.",
                            "type": "array",
                            "maxItems": 64,
                            "items": { "type": "string", "maxLength": 63 }
                        }
                    }
                }
            }
        }
    })
}

/// When and how memprof remediates profiled Jobs that run out of GPU memory.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[cfg_attr(
    any(test, feature = "crd"),
    derive(CustomResource),
    kube(
        group = "memprof.dev",
        version = "v1alpha1",
        kind = "RemediationPolicy",
        namespaced,
        shortname = "rpol",
        category = "memprof",
        status = "RemediationPolicyStatus",
        printcolumn = r#"{"name":"SELECTOR","type":"string","jsonPath":".status.selector"}"#,
        printcolumn = r#"{"name":"TRIGGERS","type":"string","jsonPath":".status.triggers"}"#,
        printcolumn = r#"{"name":"DRYRUN","type":"boolean","jsonPath":".spec.dryRun"}"#,
        printcolumn = r#"{"name":"MATCHED","type":"integer","jsonPath":".status.matchedCount"}"#,
        printcolumn = r#"{"name":"ACTIONS","type":"integer","jsonPath":".status.actionCount"}"#,
        printcolumn = r#"{"name":"AGE","type":"date","jsonPath":".metadata.creationTimestamp"}"#
    )
)]
#[serde(rename_all = "camelCase")]
pub struct RemediationPolicySpec {
    /// Labels of the Jobs (not of their pods) this policy applies to. Empty
    /// matches every profiled Job of the namespace.
    #[serde(default)]
    #[schemars(schema_with = "bounded_selector")]
    pub selector: LabelSelector,
    /// What fires the policy: any one trigger is enough. Each entry has exactly one key.
    #[schemars(length(min = 1, max = 8))]
    pub triggers: Vec<Trigger>,
    /// What to do when it fires, in order. Each entry has exactly one key.
    #[schemars(length(min = 1, max = 8))]
    pub actions: Vec<RemediationAction>,
    /// Minimum seconds between two remediations of one Job by this policy
    /// (counted from the remediation recorded in the Job's MemoryProfile).
    #[serde(default = "default_cooldown")]
    #[schemars(range(min = 0, max = 604_800))]
    pub cooldown_seconds: u32,
    /// Remediations of one Job (across its recreations) after which this policy stops acting.
    #[serde(default = "default_max_remediations")]
    #[schemars(range(min = 1, max = 100))]
    pub max_remediations: u32,
    /// Record what would be done (a `DryRun` remediation record) without doing it.
    #[serde(default)]
    pub dry_run: bool,
    /// Also act on Jobs that another controller owns (a CronJob, a JobSet, …).
    /// Off by default: recreating or changing such a Job fights its owner,
    /// which would make the Job again from its own template.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_controlled_jobs: bool,
    /// Before an action that restarts the Job (`scaleBatch`), wait for the
    /// trainer's next checkpoint, bounded by the predicted time to OOM; only
    /// for trainers that announce checkpoints (docs/remediation.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_for_checkpoint: Option<CheckpointWait>,
    /// Refuse to create a selected workload (a profiled Job, JobSet or
    /// PyTorchJob, or a TrainJob) whose peak, predicted from its family's
    /// measured history in this namespace (annotation `memprof.dev/family`
    /// on the workload itself), exceeds its GPU; the admission webhook
    /// answers with what to change. Off by default: such a workload is only
    /// warned about (docs/estimate.md, "At admission").
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deny_predicted_oom: bool,
}

/// How long a restart waits for the trainer's next checkpoint.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointWait {
    /// Longest wait, seconds from the decision.
    #[serde(default = "default_checkpoint_max")]
    #[schemars(range(min = 1, max = 86_400))]
    pub max_seconds: u32,
    /// Seconds kept between the end of the wait and the predicted OOM: the
    /// wait ends by `timeToOomSeconds - marginSeconds` when that is sooner.
    #[serde(default = "default_checkpoint_margin")]
    #[schemars(range(min = 0, max = 3_600))]
    pub margin_seconds: u32,
}

impl Default for CheckpointWait {
    fn default() -> Self {
        CheckpointWait {
            max_seconds: default_checkpoint_max(),
            margin_seconds: default_checkpoint_margin(),
        }
    }
}

fn default_checkpoint_max() -> u32 {
    600
}

fn default_checkpoint_margin() -> u32 {
    30
}

impl Default for RemediationPolicySpec {
    /// The defaults the API server fills in, so policies built in code behave like applied ones.
    fn default() -> Self {
        RemediationPolicySpec {
            selector: LabelSelector::default(),
            triggers: Vec::new(),
            actions: Vec::new(),
            cooldown_seconds: DEFAULT_COOLDOWN_SECONDS,
            max_remediations: DEFAULT_MAX_REMEDIATIONS,
            dry_run: false,
            allow_controlled_jobs: false,
            wait_for_checkpoint: None,
            deny_predicted_oom: false,
        }
    }
}

/// One trigger: set exactly one field.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("minProperties" = 1, "maxProperties" = 1))]
pub struct Trigger {
    /// Fires when the job's OOM risk has been at least `level` for `forSeconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub risk_at_least: Option<RiskTrigger>,
    /// Fires when the job's predicted time to OOM is below this many seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1.0, max = 86_400.0))]
    pub time_to_oom_below_seconds: Option<f64>,
    /// Fires when a GPU OOM of the job was observed since this policy last acted on it. Only `true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = [true]))]
    pub oom_observed: Option<bool>,
    /// Fires when max/mean of per-GPU peak memory exceeds this (1 is perfect balance).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1.0, max = 1000.0))]
    pub imbalance_above: Option<f64>,
}

/// A risk level held for some time.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RiskTrigger {
    /// Lowest risk level that fires: none, low, medium, high or critical.
    pub level: RiskLevel,
    /// Seconds the risk must stay at or above `level` before the trigger fires.
    #[serde(default)]
    #[schemars(range(min = 0, max = 86_400))]
    pub for_seconds: u32,
}

/// One action: set exactly one field.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("minProperties" = 1, "maxProperties" = 1))]
pub struct RemediationAction {
    /// Set an annotation on the Job (kept on a recreated Job).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotate: Option<AnnotateAction>,
    /// Publish an Event on the Job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<EventAction>,
    /// Recreate the Job with a smaller numeric env var (e.g. `BATCH_SIZE`):
    /// a Job's pod template is immutable, so the Job is deleted and created again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_batch: Option<ScaleBatchAction>,
    /// Write a ConfigMap key the trainer re-reads: a live change, no restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_config_map_key: Option<SetConfigMapKeyAction>,
    /// Suspend the Job (`spec.suspend`, Kubernetes 1.21+). Only `true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = [true]))]
    pub suspend: Option<bool>,
    /// Tell every counted rank's trainer to act at `level` now, in-process
    /// and without a restart: a directive in each rank's MemoryReport status,
    /// relayed by its sidecar to the agent's `on_risk` callbacks; the record
    /// tallies their acknowledgements.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notify_trainer: Option<NotifyTrainerAction>,
}

/// Run the trainers' `on_risk` callbacks at a level.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NotifyTrainerAction {
    /// `high` (the ready-made helpers checkpoint) or `critical` (they halve
    /// the micro-batch and double accumulation, keeping the global batch).
    pub level: NotifyLevel,
    /// Why, for the trainer's log (default: the policy and the trigger that fired).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub reason: Option<String>,
}

/// The levels a trainer can be told to act at.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum NotifyLevel {
    /// Act soon (e.g. checkpoint).
    High,
    /// OOM imminent (e.g. split the micro-batch).
    #[default]
    Critical,
}

impl NotifyLevel {
    /// The risk level the directive carries.
    pub fn risk(self) -> RiskLevel {
        match self {
            NotifyLevel::High => RiskLevel::High,
            NotifyLevel::Critical => RiskLevel::Critical,
        }
    }
}

/// Annotation to set.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AnnotateAction {
    /// Annotation key, e.g. `example.com/oom-risk`.
    #[schemars(length(min = 1, max = 317))]
    #[schemars(regex(
        pattern = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
    ))]
    pub key: String,
    /// Annotation value.
    #[schemars(length(max = 1024))]
    pub value: String,
}

/// Event to publish.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EventAction {
    /// CamelCase reason (default `RemediationTriggered`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128), regex(pattern = r"^[A-Z][A-Za-z0-9]*$"))]
    pub reason: Option<String>,
    /// Message (default: which trigger fired and why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub message: Option<String>,
}

/// Scale a numeric env var of the Job's containers down.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ScaleBatchAction {
    /// Env var holding the batch size, e.g. `BATCH_SIZE`; its value must be a literal integer.
    #[schemars(
        length(min = 1, max = 128),
        regex(pattern = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
    )]
    pub env: String,
    /// New value = old × factor, strictly between 0 and 1 (e.g. 0.75: 32 becomes 24).
    #[schemars(
        range(min = 0.0, max = 1.0),
        extend("exclusiveMinimum" = true, "exclusiveMaximum" = true)
    )]
    pub factor: f64,
    /// The value never goes below this; a Job already there is left alone.
    #[serde(default = "default_minimum")]
    #[schemars(range(min = 1))]
    pub minimum: u32,
    /// Round the new value down to a multiple of this (e.g. 8), never below `minimum`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub round_to: Option<u32>,
    /// Only this container; by default every container that sets `env`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub container: Option<String>,
    /// `factor` (the default): new = old × factor. `fit`: the largest batch
    /// whose predicted peak stays under the headroom target, from the
    /// MemoryProfile's `batchRecommendation` (still at least `minimum`, rounded
    /// down to `roundTo`); with too little evidence it falls back to `factor` and says so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<ScaleMode>,
    /// With `mode: fit`: percent of the GPU's memory to keep free (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 90))]
    pub headroom_percent: Option<u32>,
    /// Keep the global batch: the env var holding the gradient-accumulation
    /// steps (e.g. `GRAD_ACCUM_STEPS`). The micro-batch (`env`) goes down and
    /// accumulation goes up so that micro × accumulation × ranks stays what it
    /// was: exactly when a micro-batch that divides it is available, otherwise
    /// the nearest value above it (the record says so).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accumulation: Option<AccumulationEnv>,
    /// Also give the recreated Job's pods the GPU memory the MemoryProfile
    /// recommends (`status.recommendation`, the largest request of any
    /// role), in this scheduler's terms: `hami`, `volcano`, `kaiScheduler`
    /// or `runai`. A request the pod template already makes is never
    /// lowered; without a recommendation nothing is set (the record says so).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_memory_request: Option<crate::GpuScheduler>,
}

/// The env var a trainer reads its gradient-accumulation steps from.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AccumulationEnv {
    /// Env var name, e.g. `GRAD_ACCUM_STEPS`; a literal integer (an absent
    /// var counts as 1 and is added to the recreated Job's container).
    #[schemars(
        length(min = 1, max = 128),
        regex(pattern = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
    )]
    pub env: String,
}

/// How `scaleBatch` picks the new value.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum ScaleMode {
    /// new = old × factor.
    #[default]
    Factor,
    /// The largest batch that fits, computed from measurement.
    Fit,
}

impl ScaleBatchAction {
    /// Fraction of the GPU's memory a `fit` keeps free.
    pub fn headroom_fraction(&self) -> f64 {
        self.headroom_percent
            .map_or(super::DEFAULT_HEADROOM_FRACTION, |p| {
                f64::from(p.min(90)) / 100.0
            })
    }
}

/// Write one key of a ConfigMap in the Job's namespace: set exactly one of `value` and `scale`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("oneOf" = [{"required": ["value"]}, {"required": ["scale"]}]))]
pub struct SetConfigMapKeyAction {
    /// ConfigMap name (it must exist).
    #[schemars(length(min = 1, max = 253))]
    pub config_map: String,
    /// Key to write.
    #[schemars(length(min = 1, max = 253), regex(pattern = r"^[-._a-zA-Z0-9]+$"))]
    pub key: String,
    /// Literal value to write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    pub value: Option<String>,
    /// Scale the key's current integer value instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale: Option<ScaleValue>,
}

/// Integer scaling: new = old × factor, rounded down to `roundTo`, at least `minimum`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ScaleValue {
    /// Factor strictly between 0 and 1.
    #[schemars(
        range(min = 0.0, max = 1.0),
        extend("exclusiveMinimum" = true, "exclusiveMaximum" = true)
    )]
    pub factor: f64,
    /// The value never goes below this.
    #[serde(default = "default_minimum")]
    #[schemars(range(min = 1))]
    pub minimum: u32,
    /// Round down to a multiple of this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub round_to: Option<u32>,
}

/// What the remediation controller did with the policy.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RemediationPolicyStatus {
    /// Generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The selector, for humans (`<all>` when empty).
    #[schemars(length(max = 256))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// The triggers, for humans, e.g. `risk>=critical/60s,oom`.
    #[schemars(length(max = 256))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub triggers: Option<String>,
    /// Profiled Jobs the selector matches now.
    #[serde(default)]
    pub matched_count: u32,
    /// Names of matched Jobs (at most 16).
    #[schemars(length(max = 16), inner(length(max = 253)))]
    #[serde(default)]
    pub matched_jobs: Vec<String>,
    /// Remediations performed or pending (not dry-run, not skipped) on the matched Jobs.
    #[serde(default)]
    pub action_count: u32,
    /// The newest remediation records of this policy across Jobs (at most 16, newest last).
    #[schemars(length(max = 16))]
    #[serde(default)]
    pub actions: Vec<PolicyAction>,
    /// Conditions: `Ready`, `ActionsApplicable`, `Unsupported`.
    #[schemars(length(max = 8))]
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// A remediation record of this policy, as seen in a Job's MemoryProfile.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PolicyAction {
    /// The Job.
    #[schemars(length(max = 253))]
    pub job: String,
    /// Id of the remediation record.
    #[schemars(length(max = 128))]
    pub id: String,
    /// What was (or would have been) done.
    #[schemars(length(max = 256))]
    pub action: String,
    /// `Pending`, `Done`, `Skipped`, `Failed` or `DryRun`.
    #[schemars(length(max = 32))]
    pub phase: String,
    /// When it was decided (RFC 3339).
    #[schemars(length(max = 64))]
    pub time: String,
    /// Why, or what went wrong.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub message: Option<String>,
}

// Shared by the unit tests of the controller and the CLI (feature `test-support`, on in their dev-dependencies).
#[cfg(any(test, feature = "test-support"))]
impl RemediationPolicy {
    /// A policy for unit tests: Jobs labelled `team=<team>`, triggered by risk
    /// critical for `for_seconds` or an observed OOM, acting by
    /// `scaleBatch BATCH_SIZE ×0.75` down to `minimum`.
    pub fn test(name: &str, team: &str, for_seconds: u32, minimum: u32) -> Self {
        let mut p = RemediationPolicy::new(
            name,
            RemediationPolicySpec {
                triggers: vec![
                    Trigger {
                        risk_at_least: Some(RiskTrigger {
                            level: RiskLevel::Critical,
                            for_seconds,
                        }),
                        ..Default::default()
                    },
                    Trigger {
                        oom_observed: Some(true),
                        ..Default::default()
                    },
                ],
                actions: vec![RemediationAction {
                    scale_batch: Some(ScaleBatchAction {
                        env: "BATCH_SIZE".into(),
                        factor: 0.75,
                        minimum,
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            },
        );
        p.spec
            .selector
            .match_labels
            .get_or_insert_with(Default::default)
            .insert("team".into(), team.into());
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fit_keeps_free_the_policys_headroom_percent_else_ten_and_at_most_ninety() {
        let s = |p| ScaleBatchAction {
            headroom_percent: p,
            ..Default::default()
        };
        assert_eq!(s(None).headroom_fraction(), 0.10);
        assert_eq!(s(Some(20)).headroom_fraction(), 0.20);
        assert_eq!(s(Some(0)).headroom_fraction(), 0.0);
        assert_eq!(s(Some(95)).headroom_fraction(), 0.90);
    }
}
