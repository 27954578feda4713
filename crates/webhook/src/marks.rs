//! The admission mark on pods (contract D, `memprof_api::admission`): the
//! webhook sees every profiled pod's creation, and the request names who
//! creates it. A pod the Job controller's identity creates, with a Job as
//! its controller, gets the mark; any other pod that arrives with one has it
//! removed (a copy of a genuine pod's mark is worthless on another pod, and
//! this also closes most of the window in which a copy onto a new pod of the
//! same name would verify).
//!
//! The mark binds the pod's name, so a pod created with `generateName` (the
//! Job controller's always are) gets its name here rather than from the API
//! server, which generates one only when `metadata.name` is empty: 5
//! characters of the API server's own alphabet after the prefix. A clash is
//! answered as the API server answers its own (a retryable error, and the
//! Job controller retries).

use crate::config::MarkConfig;
use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, PatchOperation, RemoveOperation};
use k8s_openapi::api::core::v1::Pod;
use memprof_api::admission::{path_token_verifies, sign, Subject, ANNOTATION_ADMISSION};
use serde_json::{json, Value};

/// The API server's name generator: its alphabet (no vowels, no look-alikes),
/// its suffix length, and the longest prefix it keeps.
pub(crate) const NAME_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
const NAME_SUFFIX: usize = 5;
const MAX_PREFIX: usize = 63 - NAME_SUFFIX;

/// The API server's path for the marks webhook: `/mutate/<path token>` (`paths.rs` writes it).
pub const MUTATE_WITH_TOKEN: &str = "/mutate/";
/// The webhook that marks the pods of profiled Jobs, the one on the secret path.
pub const MARKS_WEBHOOK: &str = "marks.memprof.dev";

/// Who sent the review. `userInfo` is the cluster's word only when the API
/// server sent it: anyone who reaches the webhook's port can POST a review
/// claiming the Job controller. The API server is the caller that knows the
/// secret path (`memprof_api::admission::path_token`), which the operator
/// keeps in its MutatingWebhookConfiguration (`paths.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caller {
    /// The review came on `/mutate/<token>` with a token of a valid key.
    ApiServer,
    /// Any other path: injected as asked; marks neither given nor taken.
    Unverified,
}

impl MarkConfig {
    /// The caller of a review sent to `/mutate/<token>`.
    pub fn caller(&self, token: &str) -> Caller {
        match path_token_verifies(&self.keys.ring(), token, jiff::Timestamp::now()) {
            true => Caller::ApiServer,
            false => Caller::Unverified,
        }
    }
}

/// Who asks for the pod, from the AdmissionRequest.
#[derive(Clone, Copy, Debug)]
pub struct Creation<'a> {
    /// `request.namespace`.
    pub namespace: &'a str,
    /// `request.userInfo.username` (`None`: not given).
    pub username: Option<&'a str>,
    /// When the request is admitted.
    pub now: jiff::Timestamp,
    /// Who sent the review: only the API server's word about `username` counts.
    pub caller: Caller,
}

/// `generateName` plus a random suffix, as the API server makes names.
pub fn generate_name(prefix: &str) -> String {
    use ring::rand::SecureRandom as _;
    let mut prefix = prefix.to_string();
    if prefix.len() > MAX_PREFIX {
        let mut end = MAX_PREFIX;
        while !prefix.is_char_boundary(end) {
            end -= 1;
        }
        prefix.truncate(end);
    }
    let rng = ring::rand::SystemRandom::new();
    let mut name = prefix;
    let mut added = 0;
    while added < NAME_SUFFIX {
        let mut b = [0u8; 1];
        rng.fill(&mut b)
            .expect("the operating system's random generator works");
        // Rejection sampling: 243 = 9 × 27, so every letter is equally likely.
        if b[0] < 243 {
            name.push(char::from(
                NAME_ALPHABET[usize::from(b[0]) % NAME_ALPHABET.len()],
            ));
            added += 1;
        }
    }
    name
}

fn ptr(tokens: &[&str]) -> PointerBuf {
    PointerBuf::from_tokens(tokens.iter().copied())
}

/// Adds `key: value` to the map at `/metadata/<map>`, creating the map when
/// neither the object nor an earlier operation in `ops` has it.
pub(crate) fn add_to_metadata_map(
    ops: &mut Vec<PatchOperation>,
    had: bool,
    map: &str,
    key: &str,
    value: &str,
) {
    let whole = ptr(&["metadata", map]);
    let created = ops
        .iter()
        .any(|op| matches!(op, PatchOperation::Add(a) if a.path == whole));
    let (path, value) = if had || created {
        (ptr(&["metadata", map, key]), json!(value))
    } else {
        (whole, json!({ key: value }))
    };
    ops.push(PatchOperation::Add(AddOperation { path, value }));
}

/// The uid of the Job named as the pod's controller.
fn controller_job(pod: &Pod) -> Option<&str> {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true) && o.kind == "Job" && o.api_version == "batch/v1")
        .map(|o| o.uid.as_str())
}

/// The pod's name: its own, or one made from `generateName` here (added to
/// `ops`), so that the mark can bind it.
fn bound_name(pod: &Pod, ops: &mut Vec<PatchOperation>) -> Option<String> {
    if let Some(n) = pod.metadata.name.as_deref().filter(|n| !n.is_empty()) {
        return Some(n.to_string());
    }
    let prefix = pod
        .metadata
        .generate_name
        .as_deref()
        .filter(|g| !g.is_empty())?;
    let name = generate_name(prefix);
    ops.push(PatchOperation::Add(AddOperation {
        path: ptr(&["metadata", "name"]),
        value: Value::String(name.clone()),
    }));
    Some(name)
}

/// Appends to `ops` what marks `pod` (see the module docs), after the
/// injection's operations (which may have created the annotation map).
pub fn mark_pod(
    pod: &Pod,
    creation: &Creation<'_>,
    cfg: &MarkConfig,
    ops: &mut Vec<PatchOperation>,
    warnings: &mut Vec<String>,
) {
    if creation.caller == Caller::Unverified {
        // Not the marks webhook's path: marks are given and taken there only,
        // so whichever order the webhooks run in, none undoes another's.
        return;
    }
    let annotations = pod.metadata.annotations.as_ref();
    let planted = annotations.is_some_and(|a| a.contains_key(ANNOTATION_ADMISSION));
    let by_controller = creation
        .username
        .is_some_and(|u| cfg.controllers.iter().any(|c| c == u));
    let job_uid = controller_job(pod).filter(|_| by_controller);
    let ring = cfg.keys.ring();
    let (Some(job_uid), Some(key)) = (job_uid, ring.current()) else {
        if planted {
            ops.push(PatchOperation::Remove(RemoveOperation {
                path: ptr(&["metadata", "annotations", ANNOTATION_ADMISSION]),
            }));
            warnings.push(format!(
                "memprof: removed {ANNOTATION_ADMISSION}: only the Job controller's pods are marked"
            ));
        }
        if job_uid.is_some() {
            tracing::warn!(
                namespace = creation.namespace,
                "admission-mark key not loaded yet: this pod is not marked and will not count"
            );
        }
        return;
    };
    let Some(name) = bound_name(pod, ops) else {
        return; // The API server refuses a pod with neither name nor generateName.
    };
    let subject = Subject {
        namespace: creation.namespace,
        pod: &name,
        job_uid,
    };
    let mark = sign(key, &subject, creation.now);
    add_to_metadata_map(
        ops,
        annotations.is_some(),
        "annotations",
        ANNOTATION_ADMISSION,
        &mark,
    );
}
