//! The writer mark on MemoryReports (`memprof_api::writer`): a write the
//! API server authenticated with its own pod's bound service-account token
//! is marked as that pod's word; a write by another pod's bound token is
//! refused; any other write (a person, a controller, a legacy token) is let
//! through without a mark, and the operator will not count it.
//!
//! Marks are given and taken only on the secret path ([`Caller::ApiServer`]),
//! as pod marks are: anyone can POST a review claiming any `userInfo`.

use crate::config::MarkConfig;
use crate::marks::Caller;
use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, PatchOperation, RemoveOperation};
use memprof_api::writer::{self, bound_pod, spec_digest, Written, ANNOTATION_WRITER};
use memprof_api::MemoryReport;
use serde_json::Value;

/// The webhook that sees MemoryReport writes, on the secret path like
/// [`crate::marks::MARKS_WEBHOOK`].
pub const WRITERS_WEBHOOK: &str = "writers.memprof.dev";

/// Who writes, from the AdmissionRequest.
#[derive(Clone, Copy, Debug)]
pub struct Writer<'a> {
    /// `request.namespace`.
    pub namespace: &'a str,
    /// `request.userInfo.username`.
    pub username: Option<&'a str>,
    /// `userInfo.extra[authentication.kubernetes.io/pod-name]`.
    pub pod_names: &'a [String],
    /// `userInfo.extra[authentication.kubernetes.io/pod-uid]`.
    pub pod_uids: &'a [String],
    /// When the request is admitted.
    pub now: jiff::Timestamp,
    /// Who sent the review.
    pub caller: Caller,
}

/// What the webhook answers for one report write.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Verdict {
    /// Operations on the report's annotations.
    pub ops: Vec<PatchOperation>,
    /// Messages for the writer.
    pub warnings: Vec<String>,
    /// `Some(why)`: the write is refused.
    pub denied: Option<String>,
}

fn annotation_path() -> PointerBuf {
    PointerBuf::from_tokens(["metadata", "annotations", ANNOTATION_WRITER])
}

/// A write by no pod's bound token: let through unmarked (a planted mark
/// removed), and the writer told it will not count.
fn unvouched(name: &str, planted: bool) -> Verdict {
    let mut verdict = Verdict::default();
    if planted {
        verdict.ops.push(PatchOperation::Remove(RemoveOperation {
            path: annotation_path(),
        }));
    }
    verdict.warnings.push(format!(
        "memprof: MemoryReport {name} was not written with its pod's bound service-account \
         token: the operator will not count it (only a pod's own sidecar writes its report)"
    ));
    verdict
}

/// The mark for `report` when `writer` is its own pod's bound identity
/// (see the module docs).
pub fn review(report: &MemoryReport, writer: &Writer<'_>, cfg: &MarkConfig) -> Verdict {
    let mut verdict = Verdict::default();
    if writer.caller == Caller::Unverified {
        return verdict;
    }
    let name = report.metadata.name.as_deref().unwrap_or_default();
    let annotations = report.metadata.annotations.as_ref();
    let planted = annotations.is_some_and(|a| a.contains_key(ANNOTATION_WRITER));
    let Some((pod, pod_uid)) = bound_pod(
        writer.namespace,
        writer.username,
        writer.pod_names,
        writer.pod_uids,
    ) else {
        return unvouched(name, planted);
    };
    let owned = report
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "Pod" && o.uid == pod_uid);
    if name != pod || report.spec.pod_name != pod || !owned {
        verdict.denied = Some(format!(
            "memprof: pod {pod} may write only its own MemoryReport (named {pod}, spec.podName \
             {pod}, owned by the pod), not {name}"
        ));
        return verdict;
    }
    let ring = cfg.keys.ring();
    let Some(key) = ring.current() else {
        tracing::warn!(
            namespace = writer.namespace,
            "admission-mark key not loaded yet: this report is not marked and will not count"
        );
        return verdict;
    };
    let digest = spec_digest(&report.spec);
    let written = Written {
        namespace: writer.namespace,
        report: name,
        pod_uid,
        digest: &digest,
    };
    let mark = writer::sign(key, &written, writer.now);
    let (path, value) = match annotations {
        Some(_) => (annotation_path(), Value::String(mark)),
        None => (
            PointerBuf::from_tokens(["metadata", "annotations"]),
            serde_json::json!({ ANNOTATION_WRITER: mark }),
        ),
    };
    verdict
        .ops
        .push(PatchOperation::Add(AddOperation { path, value }));
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use memprof_api::admission::{Key, KeyRing, Keys};

    fn report(name: &str, owner_uid: &str) -> MemoryReport {
        let mut r = MemoryReport::new(name, Default::default());
        r.spec.pod_name = name.into();
        r.spec.sampled_at = "2027-01-15T08:00:00Z".into();
        r.metadata.owner_references = Some(vec![OwnerReference {
            kind: "Pod".into(),
            name: name.into(),
            uid: owner_uid.into(),
            api_version: "v1".into(),
            ..Default::default()
        }]);
        r
    }

    fn cfg(key: &Key) -> MarkConfig {
        MarkConfig {
            keys: Keys::of(KeyRing::new(key.clone())),
            ..Default::default()
        }
    }

    fn writer<'a>(names: &'a [String], uids: &'a [String], caller: Caller) -> Writer<'a> {
        Writer {
            namespace: "ml",
            username: Some("system:serviceaccount:ml:default"),
            pod_names: names,
            pod_uids: uids,
            now: jiff::Timestamp::from_second(1_800_000_000).unwrap(),
            caller,
        }
    }

    fn mark_of(v: &Verdict) -> Option<String> {
        v.ops.iter().find_map(|op| match op {
            PatchOperation::Add(a) => Some(match &a.value {
                Value::String(s) => s.clone(),
                other => other[ANNOTATION_WRITER].as_str()?.to_string(),
            }),
            _ => None,
        })
    }

    #[test]
    fn the_pods_own_bound_token_gets_a_mark_that_verifies_for_what_it_wrote() {
        let key = Key::generate();
        let r = report("train-0", "uid-0");
        let (names, uids) = (vec!["train-0".to_string()], vec!["uid-0".to_string()]);
        let v = review(&r, &writer(&names, &uids, Caller::ApiServer), &cfg(&key));
        assert_eq!(v.denied, None);
        let mark = mark_of(&v).expect("a mark");
        let digest = spec_digest(&r.spec);
        let written = Written {
            namespace: "ml",
            report: "train-0",
            pod_uid: "uid-0",
            digest: &digest,
        };
        let now = jiff::Timestamp::from_second(1_800_000_010).unwrap();
        assert_eq!(
            writer::verify(&KeyRing::new(key), Some(&mark), &written, now),
            Ok(())
        );
    }

    #[test]
    fn another_pod_under_the_same_service_account_is_refused() {
        let key = Key::generate();
        let victim = report("victim-0", "uid-victim");
        let (names, uids) = (vec!["evil".to_string()], vec!["uid-evil".to_string()]);
        let v = review(
            &victim,
            &writer(&names, &uids, Caller::ApiServer),
            &cfg(&key),
        );
        assert!(v.denied.is_some(), "{v:?}");
        assert_eq!(mark_of(&v), None);
    }

    #[test]
    fn a_write_without_a_pod_bound_token_is_unmarked_and_a_planted_mark_removed() {
        let key = Key::generate();
        let mut r = report("train-0", "uid-0");
        r.metadata.annotations = Some([(ANNOTATION_WRITER.to_string(), "v1.1.x".into())].into());
        let v = review(&r, &writer(&[], &[], Caller::ApiServer), &cfg(&key));
        assert_eq!(v.denied, None);
        assert!(
            matches!(v.ops.as_slice(), [PatchOperation::Remove(_)]),
            "{v:?}"
        );
        assert_eq!(v.warnings.len(), 1);
    }

    #[test]
    fn off_the_secret_path_nothing_is_given_or_taken() {
        let key = Key::generate();
        let r = report("train-0", "uid-0");
        let (names, uids) = (vec!["train-0".to_string()], vec!["uid-0".to_string()]);
        let v = review(&r, &writer(&names, &uids, Caller::Unverified), &cfg(&key));
        assert_eq!(v, Verdict::default());
    }
}
