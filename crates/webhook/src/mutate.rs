//! The admission decision and the JSON patch that injects the sidecar.
//!
//! Pure functions on plain values: [`injection_patch`] takes the object as
//! JSON and returns RFC 6902 operations, [`admit_review`] answers a whole
//! AdmissionReview body. Nothing here may fail a request: anything
//! unexpected becomes "allowed, no patch" plus a warning the user sees in
//! `kubectl`.
//!
//! The patch is a list of explicit `add` operations rather than a diff of the
//! re-serialised object: the API server may hold fields this crate's
//! k8s-openapi version does not know (or knows under newer defaults), and a
//! diff of two typed round trips would be correct only by accident.
//!
//! `terminationMessagePolicy`: the API server applies defaults *before*
//! mutating admission, so a container the user left alone arrives with
//! `File`, indistinguishable from an explicit `File`. Both are replaced by
//! `FallbackToLogsOnError`, which still reports the termination-log file when
//! the trainer writes one and only adds the log tail when it does not and the
//! container failed (how a CUDA OOM is recognised). Set the annotation
//! `memprof.dev/termination-message-policy: keep` to opt out.

use super::config::InjectionConfig;
use super::marks::Caller;
use super::sidecar::{self, Overrides, SidecarContext};
use super::{
    ANNOTATION_INJECTED, ANNOTATION_INTERVAL, ANNOTATION_PORT, ANNOTATION_SIDECAR_IMAGE,
    ANNOTATION_TERMINATION_MESSAGE, LABEL_INJECT, LABEL_INJECTED, SIDECAR_CONTAINER,
};
use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, PodSpec, PodTemplateSpec, Volume};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::GroupVersionKind;
use memprof_api::admission::LABEL_MANAGED;
use memprof_api::interval::parse_interval;
use memprof_api::ANNOTATION_ENABLED;
use serde::Deserialize as _;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// Why an object that asked for injection could not be read. Never fails the
/// admission: it becomes a warning.
#[derive(Debug, thiserror::Error)]
pub enum MutateError {
    /// The request carried no object (a CREATE always does).
    #[error("the admission request has no object; nothing to inject into")]
    NoObject,
    /// The object is not a valid Job or Pod.
    #[error(
        "could not read the {kind}: {source}; check the manifest against `kubectl explain {kind}`"
    )]
    Decode {
        /// `Job` or `Pod`.
        kind: &'static str,
        /// What serde found wrong.
        source: serde_json::Error,
    },
    /// A Job without `spec.template.spec`.
    #[error("the Job has no spec.template.spec; the API server should have rejected it")]
    NoPodSpec,
    /// The AdmissionReview itself could not be parsed.
    #[error("malformed AdmissionReview ({0}); is the webhook registered with admissionReviewVersions [v1]?")]
    Review(serde_json::Error),
}

/// The kinds the webhook injects into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// `batch/v1` Job with `memprof.dev/enabled: "true"`: the pod template is patched.
    Job,
    /// `v1` Pod labelled `memprof.dev/inject=true`: the pod itself is patched.
    Pod,
    /// `kubeflow.org/v1` PyTorchJob with `memprof.dev/enabled: "true"`:
    /// each replica type's pod template is patched as a Job's is.
    PyTorchJob,
}

impl Target {
    /// The target for a request's kind, if it is one the webhook mutates.
    pub fn of(kind: &GroupVersionKind) -> Option<Target> {
        match (
            kind.group.as_str(),
            kind.version.as_str(),
            kind.kind.as_str(),
        ) {
            ("batch", "v1", "Job") => Some(Target::Job),
            ("", "v1", "Pod") => Some(Target::Pod),
            ("kubeflow.org", "v1", "PyTorchJob") => Some(Target::PyTorchJob),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Target::Job => "Job",
            Target::Pod => "Pod",
            Target::PyTorchJob => "PyTorchJob",
        }
    }
}

/// The outcome of looking at one object.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Injection {
    /// Operations to apply; `None` when the object is left as it is.
    pub patch: Option<Patch>,
    /// Messages for the user (bad overrides, port clashes), returned as
    /// admission warnings.
    pub warnings: Vec<String>,
}

/// The pod-template view of a Job or a Pod, and where it sits in the object.
struct View<'a> {
    /// JSON-pointer tokens from the object root to the pod template (or pod).
    prefix: &'static [&'static str],
    /// The object's own metadata (where overrides are read first).
    meta: &'a ObjectMeta,
    /// The template's metadata (`None` when absent from a Job's template).
    template_meta: Option<&'a ObjectMeta>,
    spec: &'a PodSpec,
    ctx: SidecarContext,
}

fn is_true(map: &Option<BTreeMap<String, String>>, key: &str) -> bool {
    map.as_ref()
        .and_then(|m| m.get(key))
        .is_some_and(|v| v == "true")
}

fn ptr(prefix: &[&str], rest: &[&str]) -> PointerBuf {
    PointerBuf::from_tokens(prefix.iter().chain(rest).copied())
}

fn add(path: PointerBuf, value: Value) -> PatchOperation {
    PatchOperation::Add(AddOperation { path, value })
}

fn to_json<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).expect("k8s-openapi types always serialise")
}

/// Reads an annotation from the object first, then from its pod template.
fn annotation<'a>(view: &View<'a>, key: &str) -> Option<&'a str> {
    [Some(view.meta), view.template_meta]
        .into_iter()
        .flatten()
        .find_map(|m| m.annotations.as_ref()?.get(key))
        .map(String::as_str)
}

fn overrides(view: &View<'_>, cfg: &InjectionConfig, warnings: &mut Vec<String>) -> Overrides {
    let mut ov = Overrides::default();
    if let Some(image) = annotation(view, ANNOTATION_SIDECAR_IMAGE) {
        if image.is_empty() || image.contains(char::is_whitespace) {
            warnings.push(format!(
                "memprof: ignoring {ANNOTATION_SIDECAR_IMAGE}={image:?}: not an image reference"
            ));
        } else {
            ov.image = Some(image.to_string());
        }
    }
    if let Some(s) = annotation(view, ANNOTATION_INTERVAL) {
        match parse_interval(s) {
            Ok(d) => ov.interval = Some(d),
            Err(e) => warnings.push(format!("memprof: ignoring {ANNOTATION_INTERVAL}: {e}")),
        }
    }
    let thresholds = memprof_api::thresholds::resolve(
        &cfg.thresholds,
        annotation(view, memprof_api::thresholds::ANNOTATION_THRESHOLDS),
    );
    if let Some(e) = &thresholds.error {
        warnings.push(format!("memprof: {e}; the cluster-wide thresholds apply"));
    }
    ov.thresholds = thresholds.env();
    if let Some(s) = annotation(view, ANNOTATION_PORT) {
        match s.parse::<u16>() {
            Ok(p) if p > 0 => ov.port = Some(p),
            _ => warnings.push(format!(
                "memprof: ignoring {ANNOTATION_PORT}={s:?}: want a port number 1-65535"
            )),
        }
    }
    ov
}

fn view_of<'a>(
    target: Target,
    job: &'a Option<Job>,
    pod: &'a Option<Pod>,
) -> Result<Option<View<'a>>, MutateError> {
    Ok(match target {
        Target::Job => {
            let job = job.as_ref().expect("decoded for Target::Job");
            if !is_true(&job.metadata.annotations, ANNOTATION_ENABLED) {
                return Ok(None);
            }
            let spec = job.spec.as_ref().ok_or(MutateError::NoPodSpec)?;
            let pod_spec = spec.template.spec.as_ref().ok_or(MutateError::NoPodSpec)?;
            Some(View {
                prefix: &["spec", "template"],
                meta: &job.metadata,
                template_meta: spec.template.metadata.as_ref(),
                spec: pod_spec,
                ctx: SidecarContext {
                    job_name: job.metadata.name.clone().filter(|n| !n.is_empty()),
                    is_job: true,
                    parallelism: spec.parallelism,
                    indexed: spec.completion_mode.as_deref() == Some("Indexed"),
                    token_not_mounted: pod_spec.automount_service_account_token == Some(false),
                },
            })
        }
        // Its replicas' views are `pytorchjob_patch`'s.
        Target::PyTorchJob => None,
        Target::Pod => {
            let pod = pod.as_ref().expect("decoded for Target::Pod");
            if !is_true(&pod.metadata.labels, LABEL_INJECT) {
                return Ok(None);
            }
            let spec = pod.spec.as_ref().ok_or(MutateError::NoPodSpec)?;
            Some(View {
                prefix: &[],
                meta: &pod.metadata,
                template_meta: None,
                spec,
                ctx: SidecarContext {
                    token_not_mounted: spec.automount_service_account_token == Some(false),
                    ..Default::default()
                },
            })
        }
    })
}

/// The JSON patch that injects the sidecar into `object` (a Job or a Pod as
/// sent by the API server), or no patch when the object did not ask for it
/// or already has a `memprof-sidecar` container.
pub fn injection_patch(
    target: Target,
    object: &Value,
    cfg: &InjectionConfig,
) -> Result<Injection, MutateError> {
    let decode = |source| MutateError::Decode {
        kind: target.name(),
        source,
    };
    let (mut job, mut pod) = (None, None);
    match target {
        Target::Job => job = Some(Job::deserialize(object).map_err(decode)?),
        Target::Pod => pod = Some(Pod::deserialize(object).map_err(decode)?),
        Target::PyTorchJob => return pytorchjob_patch(object, cfg),
    }
    let Some(view) = view_of(target, &job, &pod)? else {
        return Ok(Injection::default());
    };
    Ok(inject(target, &view, cfg))
}

/// Where each replica type's pod template sits in a PyTorchJob.
const PYTORCH_TEMPLATES: [&[&str]; 2] = [
    &["spec", "pytorchReplicaSpecs", "Master", "template"],
    &["spec", "pytorchReplicaSpecs", "Worker", "template"],
];

/// A PyTorchJob's patch: each replica type's template injected as a Job's
/// (the same [`inject`]), the sidecar told the PyTorchJob's name
/// (`MEMPROF_JOB_NAME`): its reports then claim the PyTorchJob, whose
/// profile the operator rolls them up in.
fn pytorchjob_patch(object: &Value, cfg: &InjectionConfig) -> Result<Injection, MutateError> {
    let decode = |source| MutateError::Decode {
        kind: "PyTorchJob",
        source,
    };
    let meta = object_meta(object).map_err(decode)?;
    if !is_true(&meta.annotations, ANNOTATION_ENABLED) {
        return Ok(Injection::default());
    }
    let (mut ops, mut warnings) = (Vec::new(), Vec::new());
    for prefix in PYTORCH_TEMPLATES {
        let at = PointerBuf::from_tokens(prefix.iter().copied());
        let Ok(template) = at.resolve(object) else {
            continue;
        };
        let template = PodTemplateSpec::deserialize(template).map_err(decode)?;
        let spec = template.spec.as_ref().ok_or(MutateError::NoPodSpec)?;
        let view = View {
            prefix,
            meta: &meta,
            template_meta: template.metadata.as_ref(),
            spec,
            ctx: SidecarContext {
                job_name: meta.name.clone().filter(|n| !n.is_empty()),
                token_not_mounted: spec.automount_service_account_token == Some(false),
                ..Default::default()
            },
        };
        let one = inject(Target::PyTorchJob, &view, cfg);
        ops.extend(one.patch.map(|p| p.0).unwrap_or_default());
        warnings.extend(one.warnings);
    }
    Ok(Injection {
        patch: (!ops.is_empty()).then_some(Patch(ops)),
        warnings,
    })
}

/// The injection into one pod template (or pod): nothing when it has a
/// `memprof-sidecar` already.
fn inject(target: Target, view: &View<'_>, cfg: &InjectionConfig) -> Injection {
    let spec = view.spec;
    if has_sidecar(spec) {
        return Injection::default();
    }

    let mut warnings = vec![];
    if target == Target::Job {
        // Said to whoever creates the Job (pods are the Job controller's).
        warnings.extend(super::prediction::warning(|k| annotation(view, k)));
    }
    let ov = overrides(view, cfg, &mut warnings);
    // GPU tenancy and the sidecar image (docs/security.md): the sidecar learns
    // the pod's GPU request from its spec, and build() ignores an image
    // override the operator does not allow, with a warning.
    let parts = sidecar::build(cfg, &ov, &view.ctx, &sidecar::PodGpus::of(spec));
    warnings.extend(parts.warnings.iter().cloned());
    let port = ov.port.unwrap_or(cfg.port);
    warnings.extend(port_clash(spec, port));

    let ops = operations(view, cfg, &parts, port, &mut warnings);
    Injection {
        patch: Some(Patch(ops)),
        warnings,
    }
}

/// The patch's operations, in order: labels and annotations, termination
/// messages, volumes, the sidecar, then the agent (which may append to the
/// arrays the sidecar's operations create).
fn operations(
    view: &View<'_>,
    cfg: &InjectionConfig,
    parts: &sidecar::SidecarParts,
    port: u16,
    warnings: &mut Vec<String>,
) -> Vec<PatchOperation> {
    let mut ops = vec![];
    label_and_annotate(view, &mut ops);
    if annotation(view, ANNOTATION_TERMINATION_MESSAGE) != Some("keep") {
        termination_messages(view, &mut ops);
    }
    add_volumes(view, &parts.volumes, &mut ops);
    add_sidecar(
        view,
        to_json(&parts.container),
        cfg.native_sidecar,
        &mut ops,
    );
    let agent = super::agent::Request {
        value: annotation(view, super::agent::ANNOTATION_AGENT),
        prefix: view.prefix,
        spec: view.spec,
        sidecar: &parts.container,
        port,
    };
    super::agent::inject(&agent, &cfg.agent, &mut ops, warnings);
    ops
}

/// Whether the pod already has a `memprof-sidecar` container (a second
/// admission, or the user's own): then nothing is injected.
fn has_sidecar(spec: &PodSpec) -> bool {
    let init = spec.init_containers.as_deref().unwrap_or_default();
    spec.containers
        .iter()
        .chain(init)
        .any(|c| c.name == SIDECAR_CONTAINER)
}

/// A warning when another container uses the sidecar's port. Containers of
/// a pod share one network namespace: the sidecar could not bind. Injecting
/// anyway keeps GPU sampling; only the endpoint fails.
fn port_clash(spec: &PodSpec, port: u16) -> Option<String> {
    let c = spec.containers.iter().find(|c| {
        c.ports
            .iter()
            .flatten()
            .any(|p| p.container_port == i32::from(port))
    })?;
    Some(format!(
        "memprof: container {:?} also uses port {port}; set {ANNOTATION_PORT} to a free port",
        c.name
    ))
}

/// Every container whose termination message is the default file gets
/// `FallbackToLogsOnError`, so a CUDA OOM's last log lines reach the
/// operator (docs/remediation.md).
fn termination_messages(view: &View<'_>, ops: &mut Vec<PatchOperation>) {
    for (i, c) in view.spec.containers.iter().enumerate() {
        if matches!(c.termination_message_policy.as_deref(), None | Some("File")) {
            let path = [
                "spec",
                "containers",
                &i.to_string(),
                "terminationMessagePolicy",
            ];
            ops.push(add(ptr(view.prefix, &path), json!("FallbackToLogsOnError")));
        }
    }
}

/// The sidecar's volumes the pod does not have yet.
fn add_volumes(view: &View<'_>, volumes: &[Volume], ops: &mut Vec<PatchOperation>) {
    let (p, spec) = (view.prefix, view.spec);
    let existing: Vec<&str> = spec
        .volumes
        .iter()
        .flatten()
        .map(|v| v.name.as_str())
        .collect();
    let new_volumes: Vec<Value> = volumes
        .iter()
        .filter(|v| !existing.contains(&v.name.as_str()))
        .map(to_json)
        .collect();
    if new_volumes.is_empty() {
        return;
    }
    if spec.volumes.is_none() {
        ops.push(add(ptr(p, &["spec", "volumes"]), Value::Array(new_volumes)));
    } else {
        for v in new_volumes {
            ops.push(add(ptr(p, &["spec", "volumes", "-"]), v));
        }
    }
}

/// The sidecar container: a native sidecar (an init container with
/// `restartPolicy: Always`) or a regular container.
fn add_sidecar(view: &View<'_>, container: Value, native: bool, ops: &mut Vec<PatchOperation>) {
    let p = view.prefix;
    match (native, view.spec.init_containers.is_some()) {
        // Appended after the user's init containers: those (data download,
        // rendezvous) run undisturbed, and the sidecar is up before the trainers.
        (true, true) => ops.push(add(ptr(p, &["spec", "initContainers", "-"]), container)),
        (true, false) => ops.push(add(ptr(p, &["spec", "initContainers"]), json!([container]))),
        (false, _) => ops.push(add(ptr(p, &["spec", "containers", "-"]), container)),
    }
}

/// Marks the template (or the pod), creating metadata/labels/annotations
/// when absent. `injected` is for the chart's PodMonitor (it selects on
/// labels only); `managed` for the operator's watches and the pod webhook's
/// selector (a filter, not proof: `memprof_api::admission`).
fn label_and_annotate(view: &View<'_>, ops: &mut Vec<PatchOperation>) {
    let p = view.prefix;
    let injected = json!({ ANNOTATION_INJECTED: "true" });
    let labelled = json!({ LABEL_INJECTED: "true", LABEL_MANAGED: "true" });
    if !p.is_empty() {
        // The Job itself carries `managed` too.
        ops.push(match view.meta.labels {
            None => add(
                ptr(&[], &["metadata", "labels"]),
                json!({ LABEL_MANAGED: "true" }),
            ),
            Some(_) => add(
                ptr(&[], &["metadata", "labels", LABEL_MANAGED]),
                json!("true"),
            ),
        });
    }
    match view.template_meta_or_pod() {
        None => ops.push(add(
            ptr(p, &["metadata"]),
            json!({ "labels": labelled, "annotations": injected }),
        )),
        Some(m) => {
            match m.labels {
                None => ops.push(add(ptr(p, &["metadata", "labels"]), labelled)),
                Some(_) => {
                    for key in [LABEL_INJECTED, LABEL_MANAGED] {
                        ops.push(add(ptr(p, &["metadata", "labels", key]), json!("true")));
                    }
                }
            }
            ops.push(match m.annotations {
                None => add(ptr(p, &["metadata", "annotations"]), injected),
                Some(_) => add(
                    ptr(p, &["metadata", "annotations", ANNOTATION_INJECTED]),
                    json!("true"),
                ),
            });
        }
    }
}

impl View<'_> {
    /// The metadata that gets the `injected` mark: the template's for a Job,
    /// the pod's own for a Pod.
    fn template_meta_or_pod(&self) -> Option<&ObjectMeta> {
        if self.prefix.is_empty() {
            Some(self.meta)
        } else {
            self.template_meta
        }
    }
}

/// The parts of an `admission.k8s.io/v1` AdmissionReview the webhook reads.
/// Not kube's `AdmissionReview<DynamicObject>`: its `#[serde(flatten)]`
/// fields make serde buffer the whole object, and the object would then be
/// converted twice more before it reaches the typed Job; this parses once.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireReview {
    api_version: Option<String>,
    request: Option<WireRequest>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireRequest {
    uid: String,
    kind: GroupVersionKind,
    operation: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    object: Option<Value>,
    /// Who asks: the Job controller's pods are marked (marks.rs).
    #[serde(default)]
    user_info: WireUser,
}

#[derive(Default, serde::Deserialize)]
struct WireUser {
    #[serde(default)]
    username: Option<String>,
    /// The API server's extra facts about the identity: for a bound
    /// service-account token, the pod it was issued to (writers.rs).
    #[serde(default)]
    extra: BTreeMap<String, Vec<String>>,
}

const REVIEW_API_VERSION: &str = "admission.k8s.io/v1";

/// The patch and warnings for one request. Never fails: what cannot be read
/// becomes a warning.
/// What the webhook answers for one request.
#[derive(Debug, Default)]
struct Answer {
    patch: Option<Patch>,
    warnings: Vec<String>,
    /// `Some(why)`: refused (only a report written by another pod is).
    denied: Option<String>,
}

impl Answer {
    fn warn(warning: String) -> Answer {
        Answer {
            warnings: vec![warning],
            ..Default::default()
        }
    }
}

/// The answer for one request. Never fails: what cannot be read becomes a
/// warning.
fn decide(req: &WireRequest, cfg: &InjectionConfig, caller: Caller) -> Answer {
    if req.kind.group == memprof_api::GROUP && req.kind.kind == "MemoryReport" {
        return write_of_report(req, cfg, caller);
    }
    if req.kind.group == "jobset.x-k8s.io" && req.kind.kind == "JobSet" {
        return workload_link(req, cfg, caller);
    }
    let Some(target) = Target::of(&req.kind) else {
        return Answer::default();
    };
    if req.operation != "CREATE" {
        return Answer::default();
    }
    let result = req
        .object
        .as_ref()
        .ok_or(MutateError::NoObject)
        .and_then(|obj| {
            let injection = injection_patch(target, obj, cfg)?;
            match target {
                Target::Pod => mark(obj, req, cfg, caller, injection),
                Target::Job => mark_job(obj, req, cfg, caller, injection),
                // Its pods are marked when the training operator creates them.
                Target::PyTorchJob => Ok(injection),
            }
        });
    match result {
        Ok(Injection { patch, warnings }) => {
            if patch.is_some() {
                tracing::info!(
                    kind = target.name(),
                    namespace = req.namespace.as_deref().unwrap_or(""),
                    name = %req.name,
                    "injected memprof-sidecar or marked the pod"
                );
            }
            Answer {
                patch,
                warnings,
                denied: None,
            }
        }
        Err(e) => {
            tracing::warn!(kind = target.name(), name = %req.name, error = %e, "not injected");
            Answer::warn(format!("memprof: sidecar not injected: {e}"))
        }
    }
}

/// Whether a MemoryReport write is its pod's own (writers.rs): the mark, or a
/// refusal, which `admit_review` sends as a denial.
fn write_of_report(req: &WireRequest, cfg: &InjectionConfig, caller: Caller) -> Answer {
    let Some(obj) = req.object.as_ref() else {
        return Answer::default();
    };
    let report = match memprof_api::MemoryReport::deserialize(obj) {
        Ok(r) => r,
        // The API server validated it against the CRD; a report this
        // version cannot read is left unmarked, and so does not count.
        Err(e) => return Answer::warn(format!("memprof: MemoryReport not marked: {e}")),
    };
    let none = Vec::new();
    let extra = |k: &str| req.user_info.extra.get(k).unwrap_or(&none).as_slice();
    let writer = super::writers::Writer {
        namespace: req.namespace.as_deref().unwrap_or_default(),
        username: req.user_info.username.as_deref(),
        pod_names: extra(memprof_api::writer::EXTRA_POD_NAME),
        pod_uids: extra(memprof_api::writer::EXTRA_POD_UID),
        now: jiff::Timestamp::now(),
        caller,
    };
    let verdict = super::writers::review(&report, &writer, &cfg.marks);
    if let Some(why) = &verdict.denied {
        tracing::warn!(namespace = writer.namespace, name = %req.name, "{why}");
    }
    Answer {
        patch: (!verdict.ops.is_empty()).then_some(Patch(verdict.ops)),
        warnings: verdict.warnings,
        denied: verdict.denied,
    }
}

/// `injection` plus the pod's admission mark (or the removal of a planted
/// one): marks.rs.
fn mark(
    obj: &Value,
    req: &WireRequest,
    cfg: &InjectionConfig,
    caller: Caller,
    injection: Injection,
) -> Result<Injection, MutateError> {
    let pod = Pod::deserialize(obj).map_err(|source| MutateError::Decode {
        kind: "Pod",
        source,
    })?;
    let Injection {
        patch,
        mut warnings,
    } = injection;
    let mut ops = patch.map(|p| p.0).unwrap_or_default();
    let creation = super::marks::Creation {
        namespace: req.namespace.as_deref().unwrap_or_default(),
        username: req.user_info.username.as_deref(),
        now: jiff::Timestamp::now(),
        caller,
    };
    super::marks::mark_pod(&pod, &creation, &cfg.marks, &mut ops, &mut warnings);
    let (what, keys) = (super::workload_marks::Marked::Pod, &cfg.marks.keys);
    super::workload_marks::mark_link(
        what,
        &pod.metadata,
        &creation,
        &cfg.workloads,
        keys,
        &mut ops,
        &mut warnings,
    );
    Ok(Injection {
        patch: (!ops.is_empty()).then_some(Patch(ops)),
        warnings,
    })
}

/// Who creates the object under review, as the request says.
fn creation_of<'r>(req: &'r WireRequest, caller: Caller) -> super::marks::Creation<'r> {
    super::marks::Creation {
        namespace: req.namespace.as_deref().unwrap_or_default(),
        username: req.user_info.username.as_deref(),
        now: jiff::Timestamp::now(),
        caller,
    }
}

/// `injection` plus a JobSet child Job's workload mark (workload_marks.rs).
fn mark_job(
    obj: &Value,
    req: &WireRequest,
    cfg: &InjectionConfig,
    caller: Caller,
    injection: Injection,
) -> Result<Injection, MutateError> {
    let meta = object_meta(obj).map_err(|source| MutateError::Decode {
        kind: "Job",
        source,
    })?;
    let Injection {
        patch,
        mut warnings,
    } = injection;
    let mut ops = patch.map(|p| p.0).unwrap_or_default();
    let (what, keys) = (super::workload_marks::Marked::Job, &cfg.marks.keys);
    let creation = creation_of(req, caller);
    super::workload_marks::mark_link(
        what,
        &meta,
        &creation,
        &cfg.workloads,
        keys,
        &mut ops,
        &mut warnings,
    );
    Ok(Injection {
        patch: (!ops.is_empty()).then_some(Patch(ops)),
        warnings,
    })
}

/// A TrainJob's JobSet: only its workload mark (nothing is injected into a JobSet).
fn workload_link(req: &WireRequest, cfg: &InjectionConfig, caller: Caller) -> Answer {
    let Some(meta) = req.object.as_ref().and_then(|o| object_meta(o).ok()) else {
        return Answer::default();
    };
    if req.operation != "CREATE" {
        return Answer::default();
    }
    let (mut ops, mut warnings) = (Vec::new(), Vec::new());
    let (what, keys) = (super::workload_marks::Marked::JobSet, &cfg.marks.keys);
    let creation = creation_of(req, caller);
    super::workload_marks::mark_link(
        what,
        &meta,
        &creation,
        &cfg.workloads,
        keys,
        &mut ops,
        &mut warnings,
    );
    Answer {
        patch: (!ops.is_empty()).then_some(Patch(ops)),
        warnings,
        denied: None,
    }
}

/// The metadata of any object under review.
fn object_meta(obj: &Value) -> Result<ObjectMeta, serde_json::Error> {
    ObjectMeta::deserialize(obj.get("metadata").unwrap_or(&Value::Null))
}

/// A review read, not yet answered: what [`read_review`] parsed, for the
/// server to look up what the answer needs (history.rs) before
/// [`answer_review`].
pub struct Review {
    api_version: Option<String>,
    uid: String,
    request: Result<WireRequest, MutateError>,
}

/// Reads a raw AdmissionReview body. A body that is not a review still gets
/// an allowing answer (with the request's uid when one can be found).
pub fn read_review(body: &[u8]) -> Review {
    match serde_json::from_slice::<WireReview>(body) {
        Ok(WireReview {
            api_version,
            request: Some(req),
        }) => Review {
            api_version,
            uid: req.uid.clone(),
            request: Ok(req),
        },
        parsed => {
            let e = match parsed {
                Err(e) => MutateError::Review(e),
                Ok(_) => MutateError::Review(serde::de::Error::missing_field("request")),
            };
            let v = serde_json::from_slice::<Value>(body).ok();
            let field = |p: &str| v.as_ref()?.pointer(p)?.as_str().map(str::to_string);
            Review {
                api_version: field("/apiVersion"),
                uid: field("/request/uid").unwrap_or_default(),
                request: Err(e),
            }
        }
    }
}

impl Review {
    /// What the review's object asks of the measured history: a profiled
    /// workload (a Job, JobSet, TrainJob or PyTorchJob) being created that
    /// names its family (history.rs); `Err` is a warning about the family
    /// itself.
    pub fn history_ask(
        &self,
    ) -> Option<Result<super::history::Ask, memprof_api::family::FamilyError>> {
        let req = self.request.as_ref().ok()?;
        let api_version = match req.kind.group.as_str() {
            "" => req.kind.version.clone(),
            group => format!("{group}/{}", req.kind.version),
        };
        let kind = memprof_api::workload::WorkloadKind::of(&api_version, &req.kind.kind)?;
        if req.operation != "CREATE" {
            return None;
        }
        super::history::ask_of(kind, req.namespace.as_deref()?, req.object.as_ref()?)
    }
}

/// Answers a raw AdmissionReview body: the JSON `POST /mutate` returns.
/// Allows all but a MemoryReport written by another pod (writers.rs). Marks
/// only when `caller` is the API server (marks.rs).
pub fn admit_review(body: &[u8], cfg: &InjectionConfig, caller: Caller) -> Value {
    answer_review(read_review(body), cfg, caller, Default::default())
}

/// The answer to a read review, with what the measured history adds
/// (`history`: its warnings, and a denial where a policy opts in).
///
/// `patch` is written as base64, as Go encodes `[]byte` (kube's
/// `AdmissionResponse` writes a JSON array of numbers, 2-3x larger).
pub fn answer_review(
    review: Review,
    cfg: &InjectionConfig,
    caller: Caller,
    history: super::history::Verdict,
) -> Value {
    use base64::Engine as _;
    let Review {
        api_version,
        uid,
        request,
    } = review;
    let mut answer = match request {
        Ok(req) => decide(&req, cfg, caller),
        Err(e) => {
            tracing::warn!(error = %e, "malformed admission review");
            Answer::warn(format!("memprof: {e}"))
        }
    };
    answer.warnings.extend(history.warnings);
    if answer.denied.is_none() && history.denied.is_some() {
        // Refused: nothing to inject.
        answer = Answer {
            patch: None,
            denied: history.denied,
            ..answer
        };
    }
    let Answer {
        patch,
        warnings,
        denied,
    } = answer;
    let mut response = json!({ "uid": uid, "allowed": denied.is_none() });
    if let Some(why) = denied {
        response["status"] = json!({ "code": 403, "reason": "Forbidden", "message": why });
    }
    if let Some(patch) = patch {
        let bytes = serde_json::to_vec(&patch).expect("a JSON patch always serialises");
        response["patchType"] = json!("JSONPatch");
        response["patch"] = json!(base64::engine::general_purpose::STANDARD.encode(bytes));
    }
    if !warnings.is_empty() {
        response["warnings"] = json!(warnings);
    }
    json!({
        "apiVersion": api_version.unwrap_or_else(|| REVIEW_API_VERSION.into()),
        "kind": "AdmissionReview",
        "response": response,
    })
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod marks_tests;
