//! Pure planning: from a policy that fired and the Job as the API server
//! returned it, the concrete steps to carry out, with every value computed
//! up front (`BATCH_SIZE 32 -> 24`, not "× 0.75"), so that carrying out a
//! plan twice (after a crash) gives the same result as once.
//!
//! Jobs are handled as JSON (`serde_json::Value`), not as typed `Job`s: a
//! typed round trip would silently drop any field the client's k8s-openapi
//! version does not know, and the recreated Job must be the user's Job with
//! one env value changed, nothing less.

use memprof_api::{
    truncate_utf8, BatchRecommendation, NotifyLevel, NotifyTrainerAction, RemediationAction,
    RemediationPolicy, ANNOTATION_REMEDIATION_NONCE,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// Default reason of an `event` action.
pub const DEFAULT_EVENT_REASON: &str = "RemediationTriggered";
/// Event reason of a `scaleBatch` `mode: fit` that set the computed batch.
pub const REASON_BATCH_FIT: &str = "BatchFitApplied";
/// Event reason of a `scaleBatch` `mode: fit` that fell back to its factor.
pub const REASON_BATCH_FIT_FALLBACK: &str = "BatchFitFallback";

/// One env var change in one container.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EnvChange {
    /// Container name.
    pub container: String,
    /// Env var name.
    pub env: String,
    /// Value before.
    pub from: u64,
    /// Value after.
    pub to: u64,
    /// How `to` was chosen, when not by the plain factor (`mode: fit`, or its fallback).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// With `scaleBatch.accumulation`: the accumulation change keeping micro × accumulation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accumulation: Option<AccumulationChange>,
}

/// One concrete step of a plan.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Step {
    /// Set a Job annotation (merged into the manifest when the Job is recreated).
    Annotate {
        /// Key.
        key: String,
        /// Value.
        value: String,
    },
    /// Publish an Event on the Job.
    Event {
        /// CamelCase reason.
        reason: String,
        /// Message.
        message: String,
    },
    /// Write one ConfigMap key.
    #[serde(rename_all = "camelCase")]
    SetConfigMapKey {
        /// ConfigMap name.
        config_map: String,
        /// Key.
        key: String,
        /// Value before, if the key existed.
        from: Option<String>,
        /// Value to write.
        to: String,
    },
    /// Set `spec.suspend: true` (folded into the manifest when the Job is recreated).
    Suspend,
    /// Write a `notifyTrainer` directive (id: the plan's) into every counted rank's report status.
    NotifyTrainer {
        /// The level the trainers are to act at.
        level: NotifyLevel,
        /// Why, for the trainers' logs (at most 256 bytes).
        reason: String,
    },
    /// Suspend the top-level workload, set the changed environment in every
    /// pod template and `annotations` on it, resume it: never deleted (a
    /// Kueue-managed JobSet, TrainJob or PyTorchJob keeps its queue).
    SuspendPatchResume {
        /// The env changes to set.
        changes: Vec<EnvChange>,
        /// Annotations set on the workload with the environment.
        annotations: BTreeMap<String, String>,
    },
    /// Delete the Job and create `manifest` in its place.
    Recreate {
        /// The env changes baked into `manifest`.
        changes: Vec<EnvChange>,
        /// The Job to create: the old one, patched, server-set fields stripped.
        manifest: Value,
    },
}

/// Everything a remediation will do, decided once. Stored in a ConfigMap
/// before the first step so that a restarted controller finishes this plan
/// rather than planning again from a Job it may already have changed.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    /// Remediation id (also the record's id).
    pub id: String,
    /// Policy name.
    pub policy: String,
    /// Namespace of the Job.
    pub namespace: String,
    /// Job name (also the MemoryProfile's name).
    pub job: String,
    /// uid of the Job the plan was made for.
    pub job_uid: String,
    /// Trigger that fired, and why.
    pub why: String,
    /// Steps, in order.
    pub steps: Vec<Step>,
    /// Kind of the top-level workload the plan acts on (`JobSet`,
    /// `TrainJob`, `PyTorchJob`); absent for a batch/v1 Job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The wait for a checkpoint before the restart (`waitForCheckpoint`), decided with the plan.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<CheckpointGate>,
}

impl Plan {
    /// The plan for humans and for the record's `action` (at most 256 bytes),
    /// e.g. `scaleBatch BATCH_SIZE 32->24`.
    pub fn summary(&self) -> String {
        let mut parts = Vec::new();
        for s in &self.steps {
            parts.push(match s {
                Step::Annotate { key, value } => format!("annotate {key}={value}"),
                Step::Event { reason, .. } => format!("event {reason}"),
                Step::SetConfigMapKey {
                    config_map,
                    key,
                    from,
                    to,
                } => format!(
                    "setConfigMapKey {config_map}/{key} {}->{to}",
                    from.as_deref().unwrap_or("<unset>")
                ),
                Step::Suspend => "suspend".into(),
                Step::NotifyTrainer { level, .. } => {
                    format!("notifyTrainer {}", level.risk().as_str())
                }
                Step::Recreate { changes, .. } | Step::SuspendPatchResume { changes, .. } => {
                    let mut seen = Vec::new();
                    for c in changes {
                        let note = c
                            .note
                            .as_ref()
                            .map(|n| format!(" ({n})"))
                            .unwrap_or_default();
                        let s = match accum::describe(c) {
                            Some(d) => format!("{d}{note}"),
                            None => format!("scaleBatch {} {}->{}{note}", c.env, c.from, c.to),
                        };
                        if !seen.contains(&s) {
                            seen.push(s);
                        }
                    }
                    seen.join("; ")
                }
            });
        }
        let mut s = parts.join("; ");
        truncate_utf8(&mut s, 256);
        s
    }

    /// The recreation step, if the plan has one.
    pub fn recreate(&self) -> Option<(&[EnvChange], &Value)> {
        self.steps.iter().find_map(|s| match s {
            Step::Recreate { changes, manifest } => Some((changes.as_slice(), manifest)),
            _ => None,
        })
    }
}

/// What a plan is built from.
#[derive(Clone, Debug)]
pub struct PlanInput<'a> {
    /// The policy that fired.
    pub policy: &'a RemediationPolicy,
    /// The Job, as the API server returned it.
    pub job: &'a Value,
    /// Data of the ConfigMaps the policy's `setConfigMapKey` actions name (missing ones absent).
    pub config_maps: &'a BTreeMap<String, BTreeMap<String, String>>,
    /// ConfigMaps the actions name that exist but are not labelled
    /// `memprof.dev/remediable: "true"`: the operator must not write them.
    pub not_opted_in: &'a BTreeSet<String>,
    /// Remediation id.
    pub id: &'a str,
    /// Which trigger fired, and why.
    pub why: &'a str,
    /// The Job's MemoryProfile `batchRecommendation`, for `scaleBatch` `mode: fit`.
    pub batch_fit: Option<&'a BatchRecommendation>,
    /// The nonce a recreated Job carries (`memprof.dev/remediation-nonce`),
    /// by which a restarted controller tells its Job from one anybody could
    /// label with the id. Random, so the caller makes it: planning stays pure.
    pub nonce: &'a str,
}

/// The wait a plan carries: decided once, saved with the plan.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointGate {
    /// The decision's time (RFC 3339): a checkpoint must be newer than this.
    pub decided: String,
    /// When the wait ends at the latest (RFC 3339).
    pub deadline: String,
    /// The bound, seconds from the decision.
    pub bound_seconds: f64,
    /// What set it, e.g. `time to OOM 150 s - margin 30 s`.
    pub bound: String,
    /// Why there is no wait at all (an OOM observed, no time left).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_wait: Option<String>,
}

/// Builds the plan for `input.policy`'s actions on `input.job`.
pub fn build(input: &PlanInput<'_>) -> Result<Plan, PlanError> {
    let job = input.job;
    if let Some(owner) = controller_of(job).filter(|_| !input.policy.spec.allow_controlled_jobs) {
        return Err(PlanError::ControlledJob { owner });
    }
    let mut plan = empty_plan(input)?;
    let mut recreation = Recreation::default();
    for action in &input.policy.spec.actions {
        if let Some(step) = plan_action(input, &plan, action, &mut recreation)? {
            plan.steps.push(step);
        }
    }
    if !recreation.changes.is_empty() {
        // The recreated Job carries the annotations and the suspension, so
        // the separate steps would only touch the old Job about to go.
        plan.steps
            .retain(|s| !matches!(s, Step::Annotate { .. } | Step::Suspend));
        // The recreated Job is recognised by this nonce (the controller's
        // remediation::verify::created_from).
        let mut annotations = recreation.annotations;
        annotations.insert(ANNOTATION_REMEDIATION_NONCE.into(), input.nonce.to_string());
        let changes = recreation.changes;
        let manifest = recreated_job(job, &changes, input.id, &annotations, recreation.suspend);
        plan.steps.push(Step::Recreate { changes, manifest });
    }
    // After the recreation, so that the Event lands on the new Job.
    plan.steps.extend(recreation.fit_events);
    Ok(plan)
}

/// What the actions ask of a recreated Job, gathered over all of them.
#[derive(Default)]
struct Recreation {
    changes: Vec<EnvChange>,
    annotations: BTreeMap<String, String>,
    suspend: bool,
    fit_events: Vec<Step>,
}

/// The plan's identity (which Job, which policy, why), with no steps yet.
fn empty_plan(input: &PlanInput<'_>) -> Result<Plan, PlanError> {
    let meta = |f: &'static str| {
        input.job["metadata"][f]
            .as_str()
            .map(str::to_string)
            .ok_or(PlanError::MalformedJob(match f {
                "name" => "metadata.name",
                "namespace" => "metadata.namespace",
                _ => "metadata.uid",
            }))
    };
    Ok(Plan {
        id: input.id.to_string(),
        policy: input.policy.metadata.name.clone().unwrap_or_default(),
        namespace: meta("namespace")?,
        job: meta("name")?,
        job_uid: meta("uid")?,
        why: input.why.to_string(),
        steps: Vec::new(),
        kind: None,
        checkpoint: None,
    })
}

/// The step one action makes on its own, if any; what it asks of a
/// recreated Job goes into `recreation`.
fn plan_action(
    input: &PlanInput<'_>,
    plan: &Plan,
    action: &RemediationAction,
    recreation: &mut Recreation,
) -> Result<Option<Step>, PlanError> {
    if let Some(a) = &action.annotate {
        recreation
            .annotations
            .insert(a.key.clone(), a.value.clone());
        return Ok(Some(Step::Annotate {
            key: a.key.clone(),
            value: a.value.clone(),
        }));
    }
    if let Some(e) = &action.event {
        let mut message = e
            .message
            .clone()
            .unwrap_or_else(|| format!("RemediationPolicy {} fired: {}", plan.policy, plan.why));
        truncate_utf8(&mut message, 1024);
        let reason = e.reason.clone();
        return Ok(Some(Step::Event {
            reason: reason.unwrap_or_else(|| DEFAULT_EVENT_REASON.into()),
            message,
        }));
    }
    if let Some(s) = &action.scale_batch {
        let (mut scaled, event) = scale_batch(input.job, s, input.batch_fit)?;
        recreation.changes.append(&mut scaled);
        recreation.fit_events.extend(event);
        return Ok(None);
    }
    if let Some(c) = &action.set_config_map_key {
        return set_config_map_key_step(input, c).map(Some);
    }
    if action.suspend == Some(true) {
        recreation.suspend = true;
        return Ok(Some(Step::Suspend));
    }
    Ok(action.notify_trainer.as_ref().map(|n| notify_step(n, plan)))
}

/// The `notifyTrainer` step: the action's reason, else the policy and why it fired.
fn notify_step(n: &NotifyTrainerAction, plan: &Plan) -> Step {
    let mut reason = n
        .reason
        .clone()
        .unwrap_or_else(|| format!("RemediationPolicy {}: {}", plan.policy, plan.why));
    truncate_utf8(&mut reason, memprof_api::agent::MAX_DIRECTIVE_REASON);
    Step::NotifyTrainer {
        level: n.level,
        reason,
    }
}

/// `Kind/name` of the controller that owns a Job, if one does.
fn controller_of(job: &Value) -> Option<String> {
    job["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|o| o["controller"] == true)
        .map(|o| {
            format!(
                "{}/{}",
                o["kind"].as_str().unwrap_or("?"),
                o["name"].as_str().unwrap_or("?")
            )
        })
}

mod error;
pub use error::PlanError;

mod values;
pub use values::scale;
use values::set_config_map_key_step;

mod recreate;
pub use recreate::{original_annotation, recreated_job};

pub mod accum;
pub use accum::AccumulationChange;

mod fit;
mod gpu_request;
use fit::scale_batch;
pub use gpu_request::{asked_gpu_request, with_gpu_request, ANNOTATION_GPU_MEMORY_REQUEST};

#[cfg(test)]
mod tests;
