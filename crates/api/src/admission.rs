//! The admission mark (contract D): what the webhook writes on a pod the
//! Job controller created, and the only thing that makes a pod's reports
//! and OOMs count for a Job.
//!
//! Why a mark: a pod's `ownerReferences`, labels, annotations and
//! managedFields are written by whoever creates the pod, and the API server
//! checks none of them against the Job. The one fact about a pod's creation
//! the cluster vouches for is the creating identity, which only admission
//! sees (`AdmissionRequest.userInfo`). The webhook turns it into this mark,
//! an HMAC under a key only the operator holds (a Secret in its namespace),
//! over what identifies the pod and its Job:
//!
//! `memprof.dev/admission: v1.<issuedAt, unix seconds>.<base64url HMAC-SHA256>`
//!
//! over (namespace, pod name, controller Job uid, issuedAt). A mark copied
//! onto another pod names the wrong pod or Job; copied onto a later pod of
//! the same name (the original deleted), it is older than that pod's
//! `creationTimestamp` allows ([`MARK_LATE`]). Pure functions; the key's
//! Secret is read and written by `memprof_webhook::keys`.
//!
//! `userInfo` is only the cluster's word when the API server sent the
//! review: anyone who can reach the webhook's port can POST a review that
//! claims the Job controller. So marks are issued only for reviews that
//! arrive on the webhook's secret path, `/mutate/<`[`path_token`]`>`, a MAC
//! of the current key that the operator writes into its
//! MutatingWebhookConfiguration, which no tenant can read; a review on any
//! other path gets its injection and no mark.

use base64::Engine as _;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::ByteString;
use ring::hmac;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Label on profiled Jobs, their pod templates and the pods the webhook
/// admits for profiling. A filter for the operator's watches, never proof:
/// anyone who creates an object can set it.
pub const LABEL_MANAGED: &str = "memprof.dev/managed";
/// Pod annotation holding the admission mark.
pub const ANNOTATION_ADMISSION: &str = "memprof.dev/admission";
/// Identities the Job controller creates pods as: its own service account
/// (`--use-service-account-credentials`, the default of kubeadm and managed
/// clusters), else kube-controller-manager's.
pub const DEFAULT_CONTROLLER_IDENTITIES: [&str; 2] = [
    "system:serviceaccount:kube-system:job-controller",
    "system:kube-controller-manager",
];
/// Name of the Secret (in the operator's namespace) holding the key.
pub const DEFAULT_KEY_SECRET: &str = "memprof-admission-key";
/// Secret data key of the current key (32 random bytes).
pub const SECRET_KEY: &str = "key";
/// Secret data key of the previous key, accepted until
/// [`ANNOTATION_PREVIOUS_UNTIL`] after a rotation.
pub const SECRET_PREVIOUS_KEY: &str = "previous";
/// Secret annotation: until when the previous key is accepted (RFC 3339).
pub const ANNOTATION_PREVIOUS_UNTIL: &str = "memprof.dev/previous-key-until";
/// Secret annotation an administrator sets to ask for a new key.
pub const ANNOTATION_ROTATE: &str = "memprof.dev/rotate-key";
/// Bytes of a key.
pub const KEY_BYTES: usize = 32;
/// Latest a pod's `creationTimestamp` may be after its mark's issue time.
/// The API server stamps the time after the mutating webhooks have run, so
/// the gap is admission latency plus clock skew between the operator and
/// the API server; the bound is what a copied mark can be replayed within.
pub const MARK_LATE: SignedDuration = SignedDuration::from_secs(10);
/// Earliest, for an API server whose clock is behind the operator's
/// (`creationTimestamp` also drops the fraction of a second).
pub const MARK_EARLY: SignedDuration = SignedDuration::from_secs(5);
/// Longest mark read (a genuine one is 3 + 11 + 43 characters): what a
/// cache keeps of the annotation.
pub const MAX_MARK_LEN: usize = 96;
const VERSION: &str = "v1";

/// An HMAC key. Its bytes are never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Key([u8; KEY_BYTES]);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(<redacted>)")
    }
}

impl Key {
    /// A new random key from the operating system's generator.
    pub fn generate() -> Key {
        use ring::rand::SecureRandom as _;
        let mut bytes = [0u8; KEY_BYTES];
        ring::rand::SystemRandom::new()
            .fill(&mut bytes)
            .expect("the operating system's random generator works");
        Key(bytes)
    }

    /// The key stored as `bytes`, if they are one.
    pub fn from_bytes(bytes: &[u8]) -> Option<Key> {
        Some(Key(bytes.try_into().ok()?))
    }

    /// The bytes to store.
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }

    pub(crate) fn mac(&self, message: &str) -> hmac::Tag {
        hmac::sign(
            &hmac::Key::new(hmac::HMAC_SHA256, &self.0),
            message.as_bytes(),
        )
    }

    pub(crate) fn verifies(&self, message: &str, tag: &[u8]) -> bool {
        let key = hmac::Key::new(hmac::HMAC_SHA256, &self.0);
        hmac::verify(&key, message.as_bytes(), tag).is_ok()
    }
}

/// The keys marks are checked with: the current one, and the previous one
/// until it expires (a rotation keeps running pods trusted for a while).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyRing {
    current: Option<Key>,
    previous: Option<(Key, Timestamp)>,
}

impl KeyRing {
    /// A ring of one key.
    pub fn new(current: Key) -> KeyRing {
        KeyRing {
            current: Some(current),
            previous: None,
        }
    }

    /// This ring, also accepting `previous` until `until`.
    pub fn with_previous(mut self, previous: Key, until: Timestamp) -> KeyRing {
        self.previous = Some((previous, until));
        self
    }

    /// The key new marks are signed with (`None`: not loaded yet).
    pub fn current(&self) -> Option<&Key> {
        self.current.as_ref()
    }

    /// The previous key and until when it is accepted.
    pub fn previous(&self) -> Option<&(Key, Timestamp)> {
        self.previous.as_ref()
    }

    /// The keys that verify at `now`.
    pub(crate) fn valid(&self, now: Timestamp) -> impl Iterator<Item = &Key> {
        let previous = self.previous.iter().filter(move |(_, until)| now < *until);
        self.current.iter().chain(previous.map(|(k, _)| k))
    }

    /// The ring a key Secret's data and annotations hold (`None`: no valid current key).
    pub fn from_secret(
        data: Option<&BTreeMap<String, ByteString>>,
        annotations: Option<&BTreeMap<String, String>>,
    ) -> Option<KeyRing> {
        let data = data?;
        let current = Key::from_bytes(&data.get(SECRET_KEY)?.0)?;
        let ring = KeyRing::new(current);
        let previous = data
            .get(SECRET_PREVIOUS_KEY)
            .and_then(|b| Key::from_bytes(&b.0));
        let until = annotations
            .and_then(|a| a.get(ANNOTATION_PREVIOUS_UNTIL))
            .and_then(|t| t.parse::<Timestamp>().ok());
        Some(match (previous, until) {
            (Some(p), Some(u)) => ring.with_previous(p, u),
            _ => ring,
        })
    }
}

/// What a mark is about: the pod and the Job that controls it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Subject<'a> {
    /// Namespace of the pod (and of its Job).
    pub namespace: &'a str,
    /// Name of the pod.
    pub pod: &'a str,
    /// uid of the Job named as the pod's controller.
    pub job_uid: &'a str,
}

impl Subject<'_> {
    /// What is signed: every field, newline-separated (no Kubernetes name
    /// or uid holds a newline, so no two subjects sign the same text).
    fn message(&self, issued: i64) -> String {
        let Subject {
            namespace,
            pod,
            job_uid,
        } = self;
        format!("memprof.dev/admission {VERSION}\n{namespace}\n{pod}\n{job_uid}\n{issued}")
    }
}

/// The mark for `subject`, issued at `issued` (whole seconds).
pub fn sign(key: &Key, subject: &Subject<'_>, issued: Timestamp) -> String {
    let secs = issued.as_second();
    let tag = key.mac(&subject.message(secs));
    let mac = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(tag.as_ref());
    format!("{VERSION}.{secs}.{mac}")
}

/// What a path token is a MAC of (never a mark's message, which starts with the version).
const PATH_TOKEN_CONTEXT: &str = "memprof.dev/webhook-path";

/// The secret path segment of `key`: the API server calls
/// `/mutate/<token>`, and only reviews on that path are marked.
pub fn path_token(key: &Key) -> String {
    let tag = key.mac(PATH_TOKEN_CONTEXT);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(tag.as_ref())
}

/// Whether `token` is the path token of a key of `ring` valid at `now`
/// (the previous key's too, so a rotation does not stop marks while the
/// configuration catches up). Checked as a MAC (constant time).
pub fn path_token_verifies(ring: &KeyRing, token: &str, now: Timestamp) -> bool {
    let Ok(tag) = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(token) else {
        return false;
    };
    ring.valid(now)
        .any(|k| k.verifies(PATH_TOKEN_CONTEXT, &tag))
}

/// Why a mark does not make its pod count.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MarkError {
    /// No mark: created by someone other than the Job controller, or while
    /// the webhook was off or failing.
    #[error(
        "pod {0} has no memprof.dev/admission mark: it was not created by the Job controller \
         while the memprof webhook was serving (recreate the Job with the webhook up)"
    )]
    Missing(String),
    /// Not of the form `v1.<seconds>.<mac>`.
    #[error("pod {0} has a malformed memprof.dev/admission mark")]
    Malformed(String),
    /// No key of the ring verifies it for this pod and Job.
    #[error(
        "pod {0}'s memprof.dev/admission mark was not issued for this pod and Job by this \
         operator (copied, edited, or signed with a key rotated out)"
    )]
    Forged(String),
    /// Genuine, but issued too long before (or after) the pod was created:
    /// a copy of another pod's mark.
    #[error(
        "pod {pod} was created at {created}, outside the window of its memprof.dev/admission \
         mark issued at {issued}: a mark copied from an earlier pod of that name"
    )]
    Replayed {
        /// The pod.
        pod: String,
        /// Its `creationTimestamp`.
        created: Timestamp,
        /// The mark's issue time.
        issued: Timestamp,
    },
}

/// Checks `mark` for `subject`, a pod created at `created`: a key of `ring`
/// valid at `now` signed it, and the pod was created within
/// [`MARK_EARLY`]..[`MARK_LATE`] of its issue time. O(1): at most two HMACs.
pub fn verify(
    ring: &KeyRing,
    mark: Option<&str>,
    subject: &Subject<'_>,
    created: Timestamp,
    now: Timestamp,
) -> Result<(), MarkError> {
    let pod = || subject.pod.to_string();
    let mark = mark.ok_or_else(|| MarkError::Missing(pod()))?;
    let malformed = || MarkError::Malformed(pod());
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
    let issued = Timestamp::from_second(secs).map_err(|_| malformed())?;
    let tag = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(mac)
        .map_err(|_| malformed())?;
    let message = subject.message(secs);
    if !ring.valid(now).any(|k| k.verifies(&message, &tag)) {
        return Err(MarkError::Forged(pod()));
    }
    if created < issued - MARK_EARLY || created > issued + MARK_LATE {
        return Err(MarkError::Replayed {
            pod: pod(),
            created,
            issued,
        });
    }
    Ok(())
}

/// The operator's key ring, shared by the webhook (signs) and the
/// controllers (verify), kept fresh by one task (`memprof_webhook::keys`).
/// Until it is loaded, nothing verifies.
#[derive(Clone, Debug)]
pub struct Keys(Arc<tokio::sync::watch::Sender<Arc<KeyRing>>>);

impl Default for Keys {
    fn default() -> Self {
        Keys(Arc::new(tokio::sync::watch::Sender::new(Arc::default())))
    }
}

/// Two handles are equal when they hold the same ring now.
impl PartialEq for Keys {
    fn eq(&self, other: &Keys) -> bool {
        self.ring() == other.ring()
    }
}

impl Keys {
    /// A handle already holding `ring` (tests, one-off tools).
    pub fn of(ring: KeyRing) -> Keys {
        let keys = Keys::default();
        keys.set(ring);
        keys
    }

    /// The ring now (empty until loaded).
    pub fn ring(&self) -> Arc<KeyRing> {
        self.0.borrow().clone()
    }

    /// Replaces the ring (after reading the Secret).
    pub fn set(&self, ring: KeyRing) {
        self.0.send_if_modified(|old| {
            let changed = **old != ring;
            if changed {
                *old = Arc::new(ring);
            }
            changed
        });
    }

    /// Waits until a current key is loaded.
    pub async fn loaded(&self) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|r| r.current().is_some()).await;
    }
}

#[cfg(test)]
mod path_tests {
    use super::*;

    #[test]
    fn only_the_path_token_of_a_valid_key_verifies() {
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let (old, new, other) = (Key::generate(), Key::generate(), Key::generate());
        let ring = KeyRing::new(new.clone())
            .with_previous(old.clone(), now + SignedDuration::from_hours(1));
        assert!(path_token_verifies(&ring, &path_token(&new), now));
        assert!(
            path_token_verifies(&ring, &path_token(&old), now),
            "the previous key, in its grace"
        );
        let later = now + SignedDuration::from_hours(2);
        assert!(
            !path_token_verifies(&ring, &path_token(&old), later),
            "the previous key, past its grace"
        );
        assert!(!path_token_verifies(&ring, &path_token(&other), now));
        assert!(!path_token_verifies(&ring, "", now));
        assert!(!path_token_verifies(&ring, "not base64!", now));
        assert!(!path_token_verifies(
            &KeyRing::default(),
            &path_token(&new),
            now
        ));
        // URL-safe, and not a prefix of anything else the server routes.
        assert!(path_token(&new)
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
        assert_ne!(path_token(&new), path_token(&old));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    const SUBJECT: Subject<'static> = Subject {
        namespace: "team-a",
        pod: "train-x7k2p",
        job_uid: "job-uid",
    };

    #[test]
    fn a_mark_verifies_for_its_pod_only_and_within_its_window() {
        let key = Key::generate();
        let ring = KeyRing::new(key.clone());
        let mark = sign(&key, &SUBJECT, ts(0));
        assert!(mark.starts_with("v1.1800000000."), "{mark}");
        assert_eq!(mark.len(), 3 + 11 + 43);
        let ok = |s: &Subject<'_>, created| verify(&ring, Some(&mark), s, created, ts(100));
        assert_eq!(ok(&SUBJECT, ts(0)), Ok(()));
        assert_eq!(ok(&SUBJECT, ts(10)), Ok(()));
        assert_eq!(ok(&SUBJECT, ts(-5)), Ok(()));
        // Another pod, Job or namespace: forged.
        for other in [
            Subject {
                pod: "train-other",
                ..SUBJECT
            },
            Subject {
                job_uid: "other-job",
                ..SUBJECT
            },
            Subject {
                namespace: "team-b",
                ..SUBJECT
            },
        ] {
            assert!(matches!(ok(&other, ts(0)), Err(MarkError::Forged(_))));
        }
        // The same name, created later: a replay.
        assert!(matches!(
            ok(&SUBJECT, ts(11)),
            Err(MarkError::Replayed { .. })
        ));
        assert!(matches!(
            ok(&SUBJECT, ts(-6)),
            Err(MarkError::Replayed { .. })
        ));
        // Another key: forged.
        let other = KeyRing::new(Key::generate());
        assert!(matches!(
            verify(&other, Some(&mark), &SUBJECT, ts(0), ts(100)),
            Err(MarkError::Forged(_))
        ));
        // An empty ring (not loaded) verifies nothing.
        assert!(verify(&KeyRing::default(), Some(&mark), &SUBJECT, ts(0), ts(1)).is_err());
    }

    #[test]
    fn edited_or_malformed_marks_are_refused() {
        let key = Key::generate();
        let ring = KeyRing::new(key.clone());
        let mark = sign(&key, &SUBJECT, ts(0));
        let check = |m: &str| verify(&ring, Some(m), &SUBJECT, ts(0), ts(100));
        // A later issue time on the same MAC (to widen the window): forged.
        let moved = mark.replace("1800000000", "1800000008");
        assert!(matches!(check(&moved), Err(MarkError::Forged(_))));
        for bad in [
            "",
            "v1",
            "v2.1800000000.abc",
            "v1.x.abc",
            "v1.1800000000.!!",
            "v1.1.2.3",
            &"v1.1800000000.".repeat(10),
        ] {
            assert!(matches!(check(bad), Err(MarkError::Malformed(_))), "{bad}");
        }
        assert!(matches!(
            verify(&ring, None, &SUBJECT, ts(0), ts(1)),
            Err(MarkError::Missing(_))
        ));
    }

    #[test]
    fn the_previous_key_verifies_until_it_expires() {
        let (old, new) = (Key::generate(), Key::generate());
        let mark = sign(&old, &SUBJECT, ts(0));
        let ring = KeyRing::new(new).with_previous(old, ts(1000));
        assert_eq!(verify(&ring, Some(&mark), &SUBJECT, ts(0), ts(999)), Ok(()));
        assert!(matches!(
            verify(&ring, Some(&mark), &SUBJECT, ts(0), ts(1000)),
            Err(MarkError::Forged(_))
        ));
    }

    #[test]
    fn rings_round_trip_through_secret_data() {
        let (cur, prev) = (Key::generate(), Key::generate());
        let data = BTreeMap::from([
            (SECRET_KEY.to_string(), ByteString(cur.bytes().to_vec())),
            (
                SECRET_PREVIOUS_KEY.to_string(),
                ByteString(prev.bytes().to_vec()),
            ),
        ]);
        let ann = BTreeMap::from([(ANNOTATION_PREVIOUS_UNTIL.to_string(), ts(5).to_string())]);
        let ring = KeyRing::from_secret(Some(&data), Some(&ann)).unwrap();
        assert_eq!(ring, KeyRing::new(cur.clone()).with_previous(prev, ts(5)));
        assert_eq!(
            KeyRing::from_secret(Some(&data), None),
            Some(KeyRing::new(cur))
        );
        let short = BTreeMap::from([(SECRET_KEY.to_string(), ByteString(vec![1; 16]))]);
        assert_eq!(KeyRing::from_secret(Some(&short), None), None);
        assert_eq!(format!("{:?}", Key::generate()), "Key(<redacted>)");
    }
}
