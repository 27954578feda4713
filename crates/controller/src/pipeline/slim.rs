//! What the caches keep of each object: only what the pipeline reads, each
//! value bounded, so that what the operator holds per object is a constant
//! that no tenant-written metadata can grow (200 Jobs with
//! 250 KiB of labels each grew the operator by 142.5 MiB).
//!
//! Dropped on the way into the cache, never read: managedFields, every
//! annotation memprof does not read, values longer than memprof writes or
//! reads, a pod's spec and all its status but the containers' terminations,
//! a report's timelines, a profile's labels but those memprof compares (its
//! own and those its create or apply owns: [`profile`]). Bounded: a Job keeps at most
//! [`MAX_LABELS`] labels (policies select Jobs by label: a Job with more is
//! matched on the first ones by key, and a value longer than 63 characters,
//! which the API server refuses anyway, is dropped), a PyTorchJob only
//! those its profile copies ([`MAX_WORKLOAD_LABELS`]); a pod at most
//! [`MAX_CONTAINERS`] container statuses with messages cut to
//! [`MAX_MESSAGE`] bytes.

use crate::operator::reconcile::{slim_job, workload_labels, MAX_WORKLOAD_LABELS};
use crate::operator::trust::ANNOTATION_SPEC_DIGEST;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateTerminated, ContainerStatus, Pod, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use memprof_analysis::batchfit::ANNOTATION_BATCH_ENV;
use memprof_analysis::recommend::ANNOTATION_RECOMMEND_PHASES;
use memprof_api::admission::{KeyRing, ANNOTATION_ADMISSION, LABEL_MANAGED, MAX_MARK_LEN};
use memprof_api::thresholds::ANNOTATION_THRESHOLDS;
use memprof_api::writer::{self, spec_digest, Written, ANNOTATION_WRITER};
use memprof_api::OPERATOR_MANAGER;
use memprof_api::{
    truncate_utf8, MemoryProfile, MemoryReport, MemoryReportSpec, RemediationPolicy,
    ANNOTATION_BOTTLENECK, ANNOTATION_ENABLED, ANNOTATION_IMBALANCE, ANNOTATION_OOM_RISK,
    ANNOTATION_REMEDIATION, ANNOTATION_TIME_TO_OOM, LABEL_JOB,
};
use std::collections::{BTreeMap, BTreeSet};

/// Pod annotation of indexed Jobs: the pod's completion index (its rank).
const COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";
/// Label the Job controller puts on a Job's pods (1.20 and later).
pub(super) const LABEL_JOB_NAME: &str = "job-name";
/// Labels a Job keeps (what policies' selectors match).
pub const MAX_LABELS: usize = 32;
/// Longest label key (253 prefix + `/` + 63 name) and value the API server allows.
const MAX_LABEL_KEY: usize = 317;
const MAX_LABEL_VALUE: usize = 63;
/// Longest annotation value kept (memprof's own are far shorter), but the
/// thresholds': see [`thresholds_given`].
const MAX_ANNOTATION: usize = 512;
/// Container statuses a pod keeps (the OOM evidence).
pub const MAX_CONTAINERS: usize = 8;
/// Bytes of a termination message kept: its end, where a Python traceback
/// names the exception ("torch.OutOfMemoryError: CUDA out of memory…"); the
/// kubelet keeps up to 4 KiB.
pub const MAX_MESSAGE: usize = 512;

/// The Job annotations memprof reads (the workload mark: a JobSet's
/// child's link, `crate::workload`), but the thresholds ([`thresholds_given`]).
const JOB_KEYS: [&str; 10] = [
    memprof_api::workload_mark::ANNOTATION_WORKLOAD_MARK,
    // Copied onto the profile for the admission webhook's history.
    memprof_api::family::ANNOTATION_FAMILY,
    ANNOTATION_ENABLED,
    ANNOTATION_RECOMMEND_PHASES,
    ANNOTATION_REMEDIATION,
    ANNOTATION_BATCH_ENV,
    ANNOTATION_OOM_RISK,
    ANNOTATION_TIME_TO_OOM,
    ANNOTATION_IMBALANCE,
    ANNOTATION_BOTTLENECK,
];

/// Keeps of `map` only `keep`'s keys whose value is at most `max` bytes.
fn only(map: &mut Option<BTreeMap<String, String>>, keep: &[&str], max: usize) {
    if let Some(m) = map.as_mut() {
        m.retain(|k, v| keep.contains(&k.as_str()) && v.len() <= max);
    }
}

fn bounded_labels(meta: &mut ObjectMeta) {
    if let Some(labels) = meta.labels.take() {
        let kept: BTreeMap<String, String> = labels
            .into_iter()
            .filter(|(k, v)| k.len() <= MAX_LABEL_KEY && v.len() <= MAX_LABEL_VALUE)
            .take(MAX_LABELS)
            .collect();
        meta.labels = Some(kept);
    }
}

/// A Job: see [`slim_job`] (spec and status), then only the annotations
/// memprof reads and at most [`MAX_LABELS`] labels. Its thresholds
/// annotation is the one its sidecars were given ([`thresholds_given`]).
pub(super) fn job(j: &mut Job) {
    let template = j.spec.as_ref().and_then(|s| s.template.metadata.as_ref());
    let thresholds = thresholds_given([thresholds_of(Some(&j.metadata)), thresholds_of(template)]);
    slim_job(j);
    only(&mut j.metadata.annotations, &JOB_KEYS, MAX_ANNOTATION);
    keep_thresholds(&mut j.metadata, thresholds);
    bounded_labels(&mut j.metadata);
    j.metadata.finalizers = None;
}

/// The `memprof.dev/thresholds` value the sidecars were given, as the
/// profile's `status.thresholds` reads it (`operator::thresholds::in_effect`)
/// from the cached object's own annotations: the first of `given` (the
/// values where the webhook looks, in its order: the object's own, then its
/// pod template's, `annotation` in the webhook's `mutate.rs`), so a
/// template-only annotation shows as the sidecars use it. Bounded by what
/// the parser reads, not by [`MAX_ANNOTATION`]: a valid value of 600 bytes
/// is kept, and one over the parser's bound is kept as the marker the
/// parser refuses as too long ([`memprof_api::thresholds::bounded`]), so
/// the status says it was refused and the `InvalidThresholds` Warning
/// announces it; dropped, it would read as no annotation at all.
fn thresholds_given<'a>(given: impl IntoIterator<Item = Option<&'a str>>) -> Option<String> {
    let value = given.into_iter().flatten().next()?;
    Some(memprof_api::thresholds::bounded(value).to_string())
}

/// `meta`'s `memprof.dev/thresholds` value.
fn thresholds_of(meta: Option<&ObjectMeta>) -> Option<&str> {
    let annotations = meta?.annotations.as_ref()?;
    annotations.get(ANNOTATION_THRESHOLDS).map(String::as_str)
}

/// Puts `thresholds` ([`thresholds_given`]) among `meta`'s annotations.
fn keep_thresholds(meta: &mut ObjectMeta, thresholds: Option<String>) {
    if let Some(t) = thresholds {
        let annotations = meta.annotations.get_or_insert_with(BTreeMap::new);
        annotations.insert(ANNOTATION_THRESHOLDS.into(), t);
    }
}

/// A profile: its status and identity, and the labels the pipelines
/// compare with those they would apply (`profile_outdated`: a profile
/// lacking one is applied again, with the sidecars' RBAC, on every
/// reconcile). Those are the Job, kind and family labels, and the labels
/// the operator's own create or apply owns on it (its workload's copied
/// labels, `workload_labels`); labels anyone else wrote are neither compared nor
/// kept, however many. Nothing else is read. The operator's own apply
/// response is kept slimmed by this too (`rollup_stage.rs`).
pub(super) fn profile(p: &mut MemoryProfile) {
    let applied = labels_we_applied(p);
    p.managed_fields_mut().clear();
    p.annotations_mut().clear();
    let compared = |k: &String| PROFILE_LABELS.contains(&k.as_str()) || applied.contains(k);
    if let Some(labels) = p.metadata.labels.as_mut() {
        labels.retain(|k, v| compared(k) && v.len() <= MAX_LABEL_VALUE);
    }
    p.metadata.finalizers = None;
}

/// The labels memprof gives every profile (and reads: the KIND column, the
/// webhook's family history).
const PROFILE_LABELS: [&str; 3] = [
    LABEL_JOB,
    memprof_api::workload::LABEL_WORKLOAD_KIND,
    memprof_api::family::LABEL_FAMILY,
];

/// Keys of the other labels the operator owns on `p`, as its managedFields
/// say: those of its server-side apply, and those of its create (a profile
/// is made with a create, never an apply: `namesakes::write_profile`; the
/// API server records a create as an `Update`). Without the create's, a
/// profile just made looked unlabelled to the next reconcile, which applied
/// it again with the sidecars' RBAC: a second write of every new profile,
/// at whatever time that reconcile came. At most as many as it ever copies
/// ([`MAX_WORKLOAD_LABELS`]). The managedFields are input too (anyone who
/// may update the profile may rewrite them): a claim of more is cut, and a
/// label dropped that way only makes the next reconcile apply the profile
/// again, which rewrites the operator's entry.
fn labels_we_applied(p: &MemoryProfile) -> BTreeSet<String> {
    let keys = p
        .managed_fields()
        .iter()
        .filter(|e| e.manager.as_deref() == Some(OPERATOR_MANAGER))
        .filter(|e| matches!(e.operation.as_deref(), Some("Apply" | "Update")))
        .filter_map(|e| {
            e.fields_v1
                .as_ref()?
                .0
                .pointer("/f:metadata/f:labels")?
                .as_object()
        })
        .flat_map(|labels| labels.keys())
        .filter_map(|k| k.strip_prefix("f:"))
        .filter(|k| k.len() <= MAX_LABEL_KEY && !PROFILE_LABELS.contains(k));
    // Both entries name the same labels: counted once each.
    let mut owned = BTreeSet::new();
    for k in keys {
        if owned.len() == MAX_WORKLOAD_LABELS {
            break;
        }
        owned.insert(k.to_string());
    }
    owned
}

/// Owner references a report keeps (its pod's is the one that counts).
const MAX_REPORT_OWNERS: usize = 4;

/// A report: its writer mark and the digest of the spec as written (the
/// trust check verifies the one against the other, `trust::check`), of its
/// labels only the Job it claims, and of its spec what the roll-up reads.
/// A report whose mark does not verify under `ring` keeps only what names it
/// in the `ReportsValid` condition: what no pod vouched for costs the cache
/// a few hundred bytes, whatever its size. (The reports' watch starts once
/// the key is loaded; without one, nothing could be judged, and the report
/// is slimmed and judged when read.)
pub(super) fn report(r: &mut MemoryReport, ring: &KeyRing) {
    let digest = spec_digest(&r.spec);
    let mark = r
        .annotations()
        .get(ANNOTATION_WRITER)
        .filter(|m| m.len() <= MAX_MARK_LEN)
        .cloned();
    r.managed_fields_mut().clear();
    r.annotations_mut().clear();
    only(&mut r.metadata.labels, &[LABEL_JOB], MAX_LABEL_VALUE);
    r.metadata.finalizers = None;
    if let Some(refs) = r.metadata.owner_references.as_mut() {
        refs.retain(|o| o.kind == "Pod");
        refs.truncate(MAX_REPORT_OWNERS);
    }
    let vouched =
        ring.current().is_none() || written_by_an_owner(r, mark.as_deref(), &digest, ring);
    if vouched {
        report_spec(&mut r.spec);
    } else {
        r.spec = refused_spec(&r.spec);
    }
    let annotations = r.annotations_mut();
    annotations.insert(ANNOTATION_SPEC_DIGEST.into(), digest);
    if let Some(mark) = mark {
        annotations.insert(ANNOTATION_WRITER.into(), mark);
    }
}

/// Whether `mark` verifies for `r`'s content written by one of its owner pods.
fn written_by_an_owner(r: &MemoryReport, mark: Option<&str>, digest: &str, ring: &KeyRing) -> bool {
    let (namespace, name) = (
        r.metadata.namespace.as_deref().unwrap_or_default(),
        r.metadata.name.as_deref().unwrap_or_default(),
    );
    let now = jiff::Timestamp::now();
    r.owner_references().iter().any(|o| {
        let written = Written {
            namespace,
            report: name,
            pod_uid: &o.uid,
            digest,
        };
        writer::verify(ring, mark, &written, now).is_ok()
    })
}

/// What the roll-up reads of a report's spec: the timelines (most of its
/// bytes at 8 GPUs) are for `kubectl memprof plot`. (The rest is bounded by
/// the CRD's schema.)
fn report_spec(spec: &mut MemoryReportSpec) {
    for gpu in &mut spec.gpus {
        gpu.timeline = Vec::new();
        gpu.legacy_timeline = Vec::new();
    }
}

/// A refused report's spec: what names it (its pod, rank and time), each
/// bounded, nothing it claims.
fn refused_spec(spec: &MemoryReportSpec) -> MemoryReportSpec {
    let mut pod_name = spec.pod_name.clone();
    truncate_utf8(&mut pod_name, 253);
    let mut sampled_at = spec.sampled_at.clone();
    truncate_utf8(&mut sampled_at, 64);
    MemoryReportSpec {
        pod_name,
        sampled_at,
        rank: spec.rank,
        interval_ms: spec.interval_ms,
        ..Default::default()
    }
}

/// A pod: its identity and controller (whose reports count), its
/// completion index and admission mark, and its containers' terminations
/// (OOM evidence), each bounded.
pub(super) fn pod(p: &mut Pod) {
    let meta = &mut p.metadata;
    meta.managed_fields = None;
    meta.finalizers = None;
    only(
        &mut meta.annotations,
        &[COMPLETION_INDEX, ANNOTATION_ADMISSION],
        MAX_MARK_LEN,
    );
    only(
        &mut meta.labels,
        &[LABEL_JOB_NAME, LABEL_MANAGED],
        MAX_LABEL_VALUE,
    );
    if let Some(refs) = meta.owner_references.as_mut() {
        refs.retain(|o| o.controller == Some(true));
    }
    p.spec = None;
    terminations_only(p);
}

/// Keeps of a pod's status at most [`MAX_CONTAINERS`] container statuses,
/// each only its terminations ([`container`]): the OOM evidence, and what
/// tells a checkpoint wait that a trainer exited.
fn terminations_only(p: &mut Pod) {
    let statuses = p.status.take().and_then(|s| s.container_statuses);
    p.status = statuses.map(|c| PodStatus {
        container_statuses: Some(c.into_iter().take(MAX_CONTAINERS).map(container).collect()),
        ..Default::default()
    });
}

/// A container status: its name, restarts and terminations only.
fn container(c: ContainerStatus) -> ContainerStatus {
    let terminated = |s: Option<ContainerState>| {
        let t = s?.terminated?;
        let message = t.message.map(|m| tail(m, MAX_MESSAGE));
        let mut reason = t.reason;
        if let Some(r) = reason.as_mut() {
            truncate_utf8(r, 128);
        }
        Some(ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: t.exit_code,
                finished_at: t.finished_at,
                message,
                reason,
                ..Default::default()
            }),
            ..Default::default()
        })
    };
    let mut name = c.name;
    truncate_utf8(&mut name, 64);
    ContainerStatus {
        name,
        restart_count: c.restart_count,
        state: terminated(c.state),
        last_state: terminated(c.last_state),
        ..Default::default()
    }
}

/// The last `max` bytes of `s` (at a character boundary).
fn tail(s: String, max: usize) -> String {
    if s.len() <= max {
        return s;
    }
    let mut from = s.len() - max;
    while !s.is_char_boundary(from) {
        from += 1;
    }
    s[from..].to_string()
}

/// A policy: its spec (bounded by the CRD's schema, selector included) and
/// status. Any namespace editor writes policies, so neither their
/// annotations nor their labels, which nothing reads, are kept.
pub(super) fn policy(p: &mut RemediationPolicy) {
    p.managed_fields_mut().clear();
    p.annotations_mut().clear();
    p.labels_mut().clear();
    p.metadata.finalizers = None;
    p.metadata.owner_references = None;
}

/// A PyTorchJob (`pytorch_watch.rs`): its identity, the opt-in annotation,
/// the labels its profile copies (as the profile copies them, at most
/// [`MAX_WORKLOAD_LABELS`]), and of its spec only each
/// replica type's `replicas` and service account (its rank layout, and whom
/// the sidecars write as). Status, templates and everything else its
/// creator wrote are dropped.
pub(super) fn pytorchjob(o: &mut kube::api::DynamicObject) {
    let meta = &mut o.metadata;
    meta.managed_fields = None;
    meta.finalizers = None;
    meta.owner_references = None;
    if let Some(labels) = meta.labels.as_mut() {
        labels.retain(|k, v| k.len() <= MAX_LABEL_KEY && v.len() <= MAX_LABEL_VALUE);
    }
    // Copied from all of them, not from a Job's first [`MAX_LABELS`]: a
    // creator's `memprof.dev/` keys, sorted first, would crowd out its own.
    meta.labels = meta.labels.as_ref().map(workload_labels);
    // The opt-in, the phases its recommendation waits for, and its family
    // (copied onto its profile for the admission webhook's history); and
    // the thresholds its sidecars were given (shown in its profile's status).
    let family = memprof_api::family::ANNOTATION_FAMILY;
    let keep = [ANNOTATION_ENABLED, ANNOTATION_RECOMMEND_PHASES, family];
    let thresholds = pytorch_thresholds(meta, &o.data);
    only(&mut meta.annotations, &keep, MAX_ANNOTATION);
    keep_thresholds(meta, thresholds);
    let specs = &o.data["spec"]["pytorchReplicaSpecs"];
    let mut kept = serde_json::Map::new();
    for rtype in ["Master", "Worker"] {
        let Some(spec) = specs.get(rtype).filter(|s| s.is_object()) else {
            continue;
        };
        let replicas = spec.get("replicas").filter(|r| r.is_u64()).cloned();
        let sa = spec["template"]["spec"]["serviceAccountName"]
            .as_str()
            .filter(|s| s.len() <= MAX_LABEL_KEY);
        let mut slim = serde_json::json!({});
        if let Some(r) = replicas {
            slim["replicas"] = r;
        }
        if let Some(sa) = sa {
            slim["template"] = serde_json::json!({"spec": {"serviceAccountName": sa}});
        }
        kept.insert(rtype.to_string(), slim);
    }
    o.data = serde_json::json!({"spec": {"pytorchReplicaSpecs": kept}});
}

/// The thresholds a PyTorchJob's sidecars were given ([`thresholds_given`]):
/// its own annotation, else its replica templates' (the webhook injects
/// each replica from the PyTorchJob's, else from its own template's).
/// Replica templates that differ have one status: the first that carries
/// one shows (the Master's, else the Worker's).
fn pytorch_thresholds(meta: &ObjectMeta, data: &serde_json::Value) -> Option<String> {
    let template = |r: &str| {
        let t = &data["spec"]["pytorchReplicaSpecs"][r]["template"];
        t["metadata"]["annotations"][ANNOTATION_THRESHOLDS].as_str()
    };
    thresholds_given([
        thresholds_of(Some(meta)),
        template("Master"),
        template("Worker"),
    ])
}

/// A PyTorchJob's pod: its identity, controller, the labels its rank is
/// read from and its workload mark (`workload/pods.rs`), each bounded; no
/// spec; of its status only its containers' terminations, as a Job's pod
/// keeps them: a checkpoint wait sees a trainer exit by them, and a CUDA
/// OOM is read from them.
pub(super) fn pytorch_pod(p: &mut Pod) {
    let meta = &mut p.metadata;
    meta.managed_fields = None;
    meta.finalizers = None;
    only(
        &mut meta.annotations,
        &[memprof_api::workload_mark::ANNOTATION_WORKLOAD_MARK],
        MAX_MARK_LEN,
    );
    only(
        &mut meta.labels,
        &[
            memprof_api::workload::LABEL_TRAINING_JOB_NAME,
            memprof_api::workload::LABEL_PYTORCH_REPLICA_TYPE,
            memprof_api::workload::LABEL_PYTORCH_REPLICA_INDEX,
            LABEL_MANAGED,
        ],
        MAX_LABEL_VALUE,
    );
    if let Some(refs) = meta.owner_references.as_mut() {
        refs.retain(|o| o.controller == Some(true));
    }
    p.spec = None;
    terminations_only(p);
}

#[cfg(test)]
mod tests;
