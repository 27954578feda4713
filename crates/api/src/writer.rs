//! The writer mark on MemoryReports: what makes a report, and the
//! checkpoint and acknowledgements inside it, its own pod's word.
//!
//! Why: RBAC grants report writes to a service account, and anyone who may
//! create pods in a namespace may run a pod under any of its service
//! accounts, the victim Job's included. So "written by the reporter's
//! service account" proves nothing about which pod wrote. What the cluster
//! vouches for is the pod a *bound* service-account token was issued to:
//! the API server names it in the request's `userInfo.extra`
//! ([`EXTRA_POD_NAME`], [`EXTRA_POD_UID`]), which only admission sees. The
//! webhook (on its secret path, like the pod marks of [`crate::admission`])
//! turns that into this mark, an HMAC under the operator's key over the
//! report's identity, the uid of the pod that wrote it and a digest of the
//! spec it wrote:
//!
//! `memprof.dev/writer: v1.<issuedAt, unix seconds>.<base64url HMAC-SHA256>`
//!
//! The operator counts a report only when the mark verifies for the spec it
//! reads. A write the webhook did not see (it failed open, or was not
//! registered) carries no mark, or a mark for other content, and is
//! ignored and named in the profile's `ReportsValid` condition.

use crate::admission::{KeyRing, MAX_MARK_LEN};
use crate::MemoryReportSpec;
use base64::Engine as _;
use jiff::Timestamp;
use ring::digest::{digest, SHA256};

/// Report annotation holding the writer mark (set by the webhook only).
pub const ANNOTATION_WRITER: &str = "memprof.dev/writer";
/// `userInfo.extra` key naming the pod a bound service-account token was
/// issued to (set by the API server's token authenticator).
pub const EXTRA_POD_NAME: &str = "authentication.kubernetes.io/pod-name";
/// `userInfo.extra` key with that pod's uid.
pub const EXTRA_POD_UID: &str = "authentication.kubernetes.io/pod-uid";
const VERSION: &str = "v1";
const SERVICE_ACCOUNT_PREFIX: &str = "system:serviceaccount:";

/// What a writer mark is about: a report and the pod that wrote it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Written<'a> {
    /// Namespace of the report (and of its pod).
    pub namespace: &'a str,
    /// Name of the report (its pod's name).
    pub report: &'a str,
    /// uid of the pod whose bound token wrote it.
    pub pod_uid: &'a str,
    /// [`spec_digest`] of what it wrote.
    pub digest: &'a str,
}

impl Written<'_> {
    fn message(&self, issued: i64) -> String {
        let Written {
            namespace,
            report,
            pod_uid,
            digest,
        } = self;
        // Newline-separated: no name, uid or base64url digest holds one.
        format!(
            "memprof.dev/writer {VERSION}\n{namespace}\n{report}\n{pod_uid}\n{digest}\n{issued}"
        )
    }
}

/// SHA-256 (base64url) of the spec's JSON as this crate's types write it.
/// The webhook and the operator both decode the stored object into
/// [`MemoryReportSpec`] first, so both digest the same value whatever
/// number formatting or field order the API server used.
pub fn spec_digest(spec: &MemoryReportSpec) -> String {
    let json = serde_json::to_vec(spec).expect("a MemoryReportSpec always serialises");
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(digest(&SHA256, &json).as_ref())
}

/// The mark for `written`, issued at `issued`.
pub fn sign(key: &crate::admission::Key, written: &Written<'_>, issued: Timestamp) -> String {
    let secs = issued.as_second();
    let tag = key.mac(&written.message(secs));
    let mac = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(tag.as_ref());
    format!("{VERSION}.{secs}.{mac}")
}

/// Why a report's writer is not vouched for.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WriterError {
    /// No mark: the webhook did not see the write as its pod's own.
    #[error(
        "report {0} has no memprof.dev/writer mark: it was not written by its own pod's sidecar \
         (with the pod's bound service-account token) while the memprof webhook was serving; \
         it counts again from the sidecar's next write with the webhook up"
    )]
    Missing(String),
    /// Not of the form `v1.<seconds>.<mac>`.
    #[error("report {0} has a malformed memprof.dev/writer mark")]
    Malformed(String),
    /// No valid key signed this content for this report and pod.
    #[error(
        "report {0}'s memprof.dev/writer mark does not match its content and pod: it was \
         written by someone other than its pod's sidecar (or signed with a key rotated out)"
    )]
    Forged(String),
}

/// Checks `mark` for `written` under a key of `ring` valid at `now`.
/// O(1): at most two HMACs.
pub fn verify(
    ring: &KeyRing,
    mark: Option<&str>,
    written: &Written<'_>,
    now: Timestamp,
) -> Result<(), WriterError> {
    let name = || written.report.to_string();
    let mark = mark.ok_or_else(|| WriterError::Missing(name()))?;
    let malformed = || WriterError::Malformed(name());
    if mark.len() > MAX_MARK_LEN {
        return Err(malformed());
    }
    let mut parts = mark.split('.');
    let (Some(VERSION), Some(secs), Some(mac), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(malformed());
    };
    let secs: i64 = secs.parse().map_err(|_| malformed())?;
    let tag = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(mac)
        .map_err(|_| malformed())?;
    let message = written.message(secs);
    if !ring.valid(now).any(|k| k.verifies(&message, &tag)) {
        return Err(WriterError::Forged(name()));
    }
    Ok(())
}

/// The pod a request's identity is bound to: `(pod name, pod uid)` when
/// `username` is a service account of `namespace` and the API server put
/// exactly one pod name and uid in `extra` (a bound token). `None` for any
/// other identity: a user, a legacy token, another namespace's account.
pub fn bound_pod<'a>(
    namespace: &str,
    username: Option<&str>,
    pod_names: &'a [String],
    pod_uids: &'a [String],
) -> Option<(&'a str, &'a str)> {
    let account = username?.strip_prefix(SERVICE_ACCOUNT_PREFIX)?;
    let (sa_namespace, _) = account.split_once(':')?;
    if sa_namespace != namespace {
        return None;
    }
    match (pod_names, pod_uids) {
        ([name], [uid]) if !name.is_empty() && !uid.is_empty() => Some((name, uid)),
        _ => None,
    }
}

/// Marks `report` as written by its first Pod owner in `namespace`, as the
/// webhook marks a sidecar's write (tests that stand in for the webhook).
#[cfg(any(test, feature = "test-support"))]
pub fn mark_as_written(
    report: &mut crate::MemoryReport,
    key: &crate::admission::Key,
    namespace: &str,
) {
    let pod_uid = report
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "Pod")
        .map(|o| o.uid.clone())
        .unwrap_or_default();
    let digest = spec_digest(&report.spec);
    let written = Written {
        namespace,
        report: report.metadata.name.as_deref().unwrap_or_default(),
        pod_uid: &pod_uid,
        digest: &digest,
    };
    let mark = sign(key, &written, Timestamp::now());
    report
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(ANNOTATION_WRITER.into(), mark);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::Key;

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn spec(gpus: u32) -> MemoryReportSpec {
        MemoryReportSpec {
            pod_name: "train-0".into(),
            sampled_at: "2027-01-15T08:00:00Z".into(),
            interval_ms: 1000,
            summary: crate::ReportSummary {
                gpu_count: gpus,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn a_mark_verifies_only_for_its_report_pod_and_content() {
        let key = Key::generate();
        let ring = KeyRing::new(key.clone());
        let digest = spec_digest(&spec(1));
        let written = Written {
            namespace: "ml",
            report: "train-0",
            pod_uid: "uid-0",
            digest: &digest,
        };
        let mark = sign(&key, &written, ts(0));
        assert_eq!(verify(&ring, Some(&mark), &written, ts(10)), Ok(()));
        let other_content = spec_digest(&spec(2));
        for other in [
            Written {
                digest: &other_content,
                ..written
            },
            Written {
                pod_uid: "uid-1",
                ..written
            },
            Written {
                report: "train-1",
                ..written
            },
            Written {
                namespace: "other",
                ..written
            },
        ] {
            assert_eq!(
                verify(&ring, Some(&mark), &other, ts(10)),
                Err(WriterError::Forged(other.report.into())),
                "{other:?}"
            );
        }
        let stranger = KeyRing::new(Key::generate());
        assert!(matches!(
            verify(&stranger, Some(&mark), &written, ts(10)),
            Err(WriterError::Forged(_))
        ));
        assert!(matches!(
            verify(&ring, None, &written, ts(10)),
            Err(WriterError::Missing(_))
        ));
        assert!(matches!(
            verify(&ring, Some("v1.x.y"), &written, ts(10)),
            Err(WriterError::Malformed(_))
        ));
    }

    #[test]
    fn the_digest_is_the_same_for_the_same_value_however_the_json_was_written() {
        let mut s = spec(1);
        s.gpus.push(crate::GpuReport {
            growth_bytes_per_second: 2.0,
            confidence: 1.0,
            ..Default::default()
        });
        let ours = serde_json::to_string(&s).unwrap();
        // As Go's encoder writes integral floats, keys in another order.
        let theirs = ours
            .replace("\"growthBytesPerSecond\":2.0", "\"growthBytesPerSecond\":2")
            .replace("\"confidence\":1.0", "\"confidence\":1");
        assert_ne!(ours, theirs);
        let reread: MemoryReportSpec = serde_json::from_str(&theirs).unwrap();
        assert_eq!(spec_digest(&s), spec_digest(&reread));
        assert_ne!(spec_digest(&s), spec_digest(&spec(2)));
    }

    #[test]
    fn only_a_bound_token_of_the_namespace_names_a_pod() {
        let names = vec!["train-0".to_string()];
        let uids = vec!["uid-0".to_string()];
        let sa = Some("system:serviceaccount:ml:default");
        assert_eq!(
            bound_pod("ml", sa, &names, &uids),
            Some(("train-0", "uid-0"))
        );
        assert_eq!(bound_pod("other", sa, &names, &uids), None);
        assert_eq!(bound_pod("ml", sa, &[], &[]), None, "a legacy token");
        assert_eq!(bound_pod("ml", Some("alice"), &names, &uids), None);
        assert_eq!(bound_pod("ml", None, &names, &uids), None);
        let two = vec!["a".to_string(), "b".to_string()];
        assert_eq!(bound_pod("ml", sa, &two, &uids), None);
    }
}
