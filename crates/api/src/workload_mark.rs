//! The workload mark: what makes one link of a workload's chain the
//! cluster's word rather than its creator's claim.
//!
//! Why: an owner reference is written by whoever creates the object, and
//! the API server checks only that the named owner exists. A tenant who may
//! create Jobs in a namespace can create one whose controller is another
//! team's JobSet (its uid is readable); the real Job controller then creates
//! that Job's pods, which get the pod admission mark like any Job's
//! (`crate::admission`). Counting them in the JobSet's profile would let the
//! tenant steer it. What the cluster vouches for is who created each link,
//! which only admission sees. So the webhook marks:
//!
//! - a Job whose controller is a JobSet, created by the JobSet controller's
//!   identity, with the replicated job and job index its labels name;
//! - a JobSet whose controller is a TrainJob, created by Kubeflow Trainer's
//!   identity;
//! - a pod whose controller is a PyTorchJob, created by the training
//!   operator's identity, with the replica type and index its labels name;
//!
//! `memprof.dev/workload-mark: v1.<issuedAt, unix seconds>.<base64url HMAC-SHA256>`
//!
//! over (namespace, the object's kind and name, its controller's uid, its
//! rank identity, issuedAt), under the operator's key (the one the pod
//! marks use). The rank identity is part of what is signed, so the labels
//! a rank is computed from are the ones the controller set at creation:
//! relabelling the object afterwards (anyone who may patch it can) makes
//! its mark fail. The window against a copied mark is the pod mark's.

use crate::admission::{KeyRing, MAX_MARK_LEN};
pub use crate::admission::{MARK_EARLY, MARK_LATE};
use base64::Engine as _;
use jiff::Timestamp;

/// Annotation holding the workload mark (set by the webhook only).
pub const ANNOTATION_WORKLOAD_MARK: &str = "memprof.dev/workload-mark";
const VERSION: &str = "v1";

/// What a workload mark is about: one object and the controller it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Link<'a> {
    /// Namespace of the object (and of its controller).
    pub namespace: &'a str,
    /// Kind of the object: `Job`, `JobSet`, `Pod`.
    pub kind: &'a str,
    /// Name of the object.
    pub name: &'a str,
    /// uid of the controller its owner reference names.
    pub controller_uid: &'a str,
    /// Its rank identity (`crate::workload::jobset_identity`, …), empty when none.
    pub identity: &'a str,
}

impl Link<'_> {
    /// Every field newline-separated, after a context no other mark starts
    /// with (no Kubernetes name, kind or uid holds a newline; an identity
    /// is checked for none before signing).
    fn message(&self, issued: i64) -> String {
        let Link {
            namespace,
            kind,
            name,
            controller_uid,
            identity,
        } = self;
        format!(
            "memprof.dev/workload-mark {VERSION}\n{namespace}\n{kind}\n{name}\n{controller_uid}\n{identity}\n{issued}"
        )
    }
}

/// The mark for `link`, issued at `issued` (whole seconds). `None` for an
/// identity holding a newline (no label value does).
pub fn sign(key: &crate::admission::Key, link: &Link<'_>, issued: Timestamp) -> Option<String> {
    if link.identity.contains('\n') {
        return None;
    }
    let secs = issued.as_second();
    let tag = key.mac(&link.message(secs));
    let mac = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(tag.as_ref());
    Some(format!("{VERSION}.{secs}.{mac}"))
}

/// Why a link of a workload's chain is not the cluster's word.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    /// No mark.
    #[error(
        "{kind} {name} has no memprof.dev/workload-mark: it was not created by its \
         controller's identity while the memprof webhook was serving (recreate the \
         workload with the webhook up; check the identities in the chart's `workloads` values)"
    )]
    Missing {
        /// Kind of the object.
        kind: String,
        /// Its name.
        name: String,
    },
    /// Not of the form `v1.<seconds>.<mac>`.
    #[error("{kind} {name} has a malformed memprof.dev/workload-mark")]
    Malformed {
        /// Kind of the object.
        kind: String,
        /// Its name.
        name: String,
    },
    /// No key verifies it for this object, controller and rank identity.
    #[error(
        "{kind} {name}'s memprof.dev/workload-mark was not issued for this object, controller \
         and rank labels by this operator (copied, relabelled, or signed with a key rotated out)"
    )]
    Forged {
        /// Kind of the object.
        kind: String,
        /// Its name.
        name: String,
    },
    /// Genuine but issued outside the object's creation window: a copy.
    #[error(
        "{kind} {name} was created at {created}, outside the window of its \
         memprof.dev/workload-mark issued at {issued}: a mark copied from an earlier object"
    )]
    Replayed {
        /// Kind of the object.
        kind: String,
        /// Its name.
        name: String,
        /// Its `creationTimestamp`.
        created: Timestamp,
        /// The mark's issue time.
        issued: Timestamp,
    },
}

/// Checks `mark` for `link`, an object created at `created`: a key of
/// `ring` valid at `now` signed it, within the creation window. O(1).
pub fn verify(
    ring: &KeyRing,
    mark: Option<&str>,
    link: &Link<'_>,
    created: Timestamp,
    now: Timestamp,
) -> Result<(), LinkError> {
    let (kind, name) = (link.kind.to_string(), link.name.to_string());
    let Some(mark) = mark else {
        return Err(LinkError::Missing { kind, name });
    };
    let parsed = parse(mark);
    let Some((secs, tag)) = parsed else {
        return Err(LinkError::Malformed { kind, name });
    };
    let Ok(issued) = Timestamp::from_second(secs) else {
        return Err(LinkError::Malformed { kind, name });
    };
    let message = link.message(secs);
    if link.identity.contains('\n') || !ring.valid(now).any(|k| k.verifies(&message, &tag)) {
        return Err(LinkError::Forged { kind, name });
    }
    if created < issued - MARK_EARLY || created > issued + MARK_LATE {
        return Err(LinkError::Replayed {
            kind,
            name,
            created,
            issued,
        });
    }
    Ok(())
}

/// `v1.<secs>.<mac>` → (secs, MAC bytes).
fn parse(mark: &str) -> Option<(i64, Vec<u8>)> {
    if mark.len() > MAX_MARK_LEN {
        return None;
    }
    let mut parts = mark.split('.');
    let (Some(VERSION), Some(secs), Some(mac), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    let tag = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(mac)
        .ok()?;
    Some((secs.parse().ok()?, tag))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::{sign as sign_pod, Key, Subject};

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    const LINK: Link<'static> = Link {
        namespace: "team-a",
        kind: "Job",
        name: "train-workers-0",
        controller_uid: "jobset-uid",
        identity: "workers/0",
    };

    #[test]
    fn a_workload_mark_verifies_for_its_link_and_rank_labels_only() {
        let key = Key::generate();
        let ring = KeyRing::new(key.clone());
        let mark = sign(&key, &LINK, ts(0)).unwrap();
        let check = |l: &Link<'_>, created| verify(&ring, Some(&mark), l, created, ts(100));
        assert_eq!(check(&LINK, ts(3)), Ok(()));
        for other in [
            Link {
                namespace: "team-b",
                ..LINK
            },
            Link {
                kind: "Pod",
                ..LINK
            },
            Link {
                name: "train-workers-1",
                ..LINK
            },
            Link {
                controller_uid: "other-jobset",
                ..LINK
            },
            // Relabelled after creation: another rank.
            Link {
                identity: "workers/1",
                ..LINK
            },
            Link {
                identity: "",
                ..LINK
            },
        ] {
            assert!(
                matches!(check(&other, ts(0)), Err(LinkError::Forged { .. })),
                "{other:?}"
            );
        }
        assert!(matches!(
            check(&LINK, ts(11)),
            Err(LinkError::Replayed { .. })
        ));
        assert!(matches!(
            verify(&ring, None, &LINK, ts(0), ts(1)),
            Err(LinkError::Missing { .. })
        ));
        for bad in ["", "v1.x.abc", "v2.1800000000.abc", "v1.1.2.3"] {
            assert!(
                matches!(
                    verify(&ring, Some(bad), &LINK, ts(0), ts(1)),
                    Err(LinkError::Malformed { .. })
                ),
                "{bad}"
            );
        }
        assert_eq!(
            sign(
                &key,
                &Link {
                    identity: "a\nb",
                    ..LINK
                },
                ts(0)
            ),
            None
        );
    }

    #[test]
    fn a_pod_admission_mark_is_not_a_workload_mark() {
        // The same key signs both: a pod's admission mark, copied onto a
        // Job whose name and controller uid match its subject, is refused.
        let key = Key::generate();
        let ring = KeyRing::new(key.clone());
        let subject = Subject {
            namespace: LINK.namespace,
            pod: LINK.name,
            job_uid: LINK.controller_uid,
        };
        let pod_mark = sign_pod(&key, &subject, ts(0));
        let link = Link {
            identity: "",
            ..LINK
        };
        assert!(matches!(
            verify(&ring, Some(&pod_mark), &link, ts(0), ts(1)),
            Err(LinkError::Forged { .. })
        ));
    }
}
