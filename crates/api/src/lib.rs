//! The `memprof.dev/v1alpha1` API: the custom resources the sidecar, the
//! operator and the CLI exchange. Every field carries a doc comment because
//! it becomes the `kubectl explain` text of the generated CRD.
//!
//! `memprof-api` holds every contract shared by more than one role (see the
//! README's "How it fits together"): the CRD types, the agent wire format
//! ([`agent`]), the analysis thresholds ([`thresholds`]), sampling intervals
//! ([`interval`]), the trace CSV ([`trace`]) and the environment the webhook
//! and the sidecar agree on ([`env`]). It depends on no other memprof crate.
#![forbid(unsafe_code)]

pub mod admission;
pub mod agent;
mod common;
pub mod env;
pub mod interval;
mod policy;
mod profile;
mod report;
pub mod thresholds;
pub mod trace;
pub mod writer;

pub use common::*;
pub use policy::*;
pub use profile::*;
pub use report::*;

use kube::CustomResourceExt;

/// API group of every memprof resource.
pub const GROUP: &str = "memprof.dev";
/// API version of every memprof resource.
pub const VERSION: &str = "v1alpha1";

/// Annotation that turns profiling on for a Job.
pub const ANNOTATION_ENABLED: &str = "memprof.dev/enabled";
/// Job annotation: the job's current OOM risk level.
pub const ANNOTATION_OOM_RISK: &str = "memprof.dev/oom-risk";
/// Job annotation: the job's smallest predicted time to OOM.
pub const ANNOTATION_TIME_TO_OOM: &str = "memprof.dev/time-to-oom";
/// Job annotation: max/mean of per-GPU peak memory across the job.
pub const ANNOTATION_IMBALANCE: &str = "memprof.dev/imbalance";
/// Job annotation: where the job will run out of memory first.
pub const ANNOTATION_BOTTLENECK: &str = "memprof.dev/bottleneck";
/// Label on a MemoryReport: the MemoryProfile it feeds.
pub const LABEL_PROFILE: &str = "memprof.dev/profile";
/// Label on a MemoryReport: the Job its pod belongs to.
pub const LABEL_JOB: &str = "memprof.dev/job";
/// Field manager of the sidecar's server-side applies.
pub const SIDECAR_MANAGER: &str = "memprof-sidecar";
/// Field manager of the operator's server-side applies.
pub const OPERATOR_MANAGER: &str = "memprof-operator";

/// The NVIDIA device plugin's resource name.
pub const DEFAULT_GPU_RESOURCE: &str = "nvidia.com/gpu";
/// Where the memprof image carries the Python agent tree (the Dockerfile
/// copies it there): what `memprof install-agent` copies from and the
/// webhook's `--agent-path` default.
pub const DEFAULT_AGENT_SOURCE: &str = "/opt/memprof/agent";
/// Fraction of the device a batch-size recommendation keeps free by default
/// (predicted peaks stay under 90 %), when the policy names no headroom.
pub const DEFAULT_HEADROOM_FRACTION: f64 = 0.10;

/// Upper bound on the GPUs one MemoryReport carries (a node has at most 16).
pub const MAX_GPUS_PER_REPORT: usize = 16;
/// Upper bound on the timeline points kept per GPU in a MemoryReport.
pub const MAX_TIMELINE_POINTS: usize = 60;
/// Upper bound on the ranks listed in a MemoryProfile's `topRanks`.
pub const MAX_TOP_RANKS: usize = 8;
/// Upper bound on OOM records and remediation records in a MemoryProfile.
pub const MAX_HISTORY: usize = 16;
/// Upper bound on conditions on one object.
pub const MAX_CONDITIONS: usize = 8;

/// Every CRD of the API, in a stable order.
pub fn crds(
) -> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>
{
    // Each kind with the part of it that has exactly one writer.
    let mut crds = vec![
        (MemoryProfile::crd(), "status"),
        (MemoryReport::crd(), "spec"),
        (RemediationPolicy::crd(), "status"),
    ];
    for (crd, single_writer) in &mut crds {
        for version in &mut crd.spec.versions {
            if let Some(schema) = version
                .schema
                .as_mut()
                .and_then(|s| s.open_api_v3_schema.as_mut())
            {
                drop_empty_string_defaults(schema);
                status_not_nullable(schema);
                atomic(schema, single_writer);
            }
        }
    }
    crds.into_iter().map(|(crd, _)| crd).collect()
}

/// Marks a top-level part `x-kubernetes-map-type: atomic`: the part one
/// writer owns whole (a profile's and a policy's status: the operator's
/// status writers, which always write all of it; a report's spec: its
/// sidecar). Server-side apply then tracks it as one field instead of one
/// per value: smaller `managedFields`, less work per write for the API
/// server (docs/benchmarks.md, "Single-writer parts"), and a value someone
/// else wrote there does not outlive the owner's next write.
fn atomic(
    schema: &mut k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaProps,
    part: &str,
) {
    if let Some(p) = schema.properties.as_mut().and_then(|p| p.get_mut(part)) {
        p.x_kubernetes_map_type = Some("atomic".into());
    }
}

/// Makes the top-level `status` not nullable (schemars marks an `Option`
/// nullable): a server that publishes only OpenAPI v2 (1.20) drops nullable
/// properties from it, so `kubectl explain <kind>.status` listed no field.
/// The status subresource never holds a null status: the API server prunes a
/// null field that is not nullable rather than store it.
fn status_not_nullable(
    schema: &mut k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaProps,
) {
    if let Some(status) = schema.properties.as_mut().and_then(|p| p.get_mut("status")) {
        status.nullable = None;
    }
}

/// Removes `default: ""` from a schema, everywhere in it: a 1.20 API server
/// reads an empty-string default as null and rejects the whole CRD ("must be
/// of type string"). An absent field deserializes to "" through serde's
/// `#[serde(default)]` all the same.
fn drop_empty_string_defaults(
    schema: &mut k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaProps,
) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaPropsOrArray;
    if matches!(&schema.default, Some(d) if d.0 == serde_json::Value::String(String::new())) {
        schema.default = None;
    }
    for p in schema.properties.iter_mut().flat_map(|m| m.values_mut()) {
        drop_empty_string_defaults(p);
    }
    match schema.items.as_mut() {
        Some(JSONSchemaPropsOrArray::Schema(s)) => drop_empty_string_defaults(s),
        Some(JSONSchemaPropsOrArray::Schemas(v)) => {
            v.iter_mut().for_each(drop_empty_string_defaults)
        }
        None => {}
    }
    for list in [&mut schema.all_of, &mut schema.any_of, &mut schema.one_of] {
        list.iter_mut()
            .flatten()
            .for_each(drop_empty_string_defaults);
    }
}

/// Every CRD as one YAML stream: what `memprof crd` prints and `crds/` holds.
pub fn crds_yaml() -> String {
    let mut out = String::new();
    for crd in crds() {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&crd).expect("a CRD always serializes to YAML"));
    }
    out
}
