//! The admission-mark key (`memprof_api::admission`): a Secret in the
//! operator's namespace, created by the first replica that starts, read by
//! all of them, rotated on request.
//!
//! Only the operator holds it: the Secret lives where tenants have no rights
//! (the chart's Role gives the operator get/update on it by name), and
//! nothing else reads it. Whoever can read it can mint marks: the same
//! people who could replace the operator.
//!
//! Rotation: an administrator annotates the Secret `memprof.dev/rotate-key`
//! (any value). The next refresh (within [`REFRESH_EVERY`]) moves the key to
//! `previous`, accepted for `grace` more, and writes a new one. Pods marked
//! under the old key stop counting when the grace ends: a key is rotated
//! because it leaked, so the grace is a choice between running Jobs and
//! exposure (docs/security.md). Replicas race like the certificate's do:
//! create (409) and replace with resourceVersion (409) decide the winner.

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;
use kube::api::PostParams;
use kube::{Api, Client};
use memprof_api::admission::{
    Key, KeyRing, Keys, ANNOTATION_PREVIOUS_UNTIL, ANNOTATION_ROTATE, SECRET_KEY,
    SECRET_PREVIOUS_KEY,
};
use std::collections::BTreeMap;
use std::future::Future;

/// How often every replica re-reads the Secret (a rotation reaches the
/// webhook and the controllers of all replicas within this).
pub use crate::retry::REFRESH_EVERY;

/// Errors of the key step.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// Reading or writing the Secret failed.
    #[error(
        "cannot {verb} Secret {namespace}/{name} (the admission-mark key): {source}; the operator \
         needs get/update on it and create on secrets in its own namespace (see the Helm chart's Role)"
    )]
    Secret {
        /// What was attempted.
        verb: &'static str,
        /// Namespace of the Secret.
        namespace: String,
        /// Name of the Secret.
        name: String,
        /// The API error.
        source: Box<kube::Error>,
    },
    /// Another writer kept changing the Secret.
    #[error(
        "Secret {0} keeps changing under the operator; is another memprof release writing it?"
    )]
    Contended(String),
}

/// Where the key lives and how long a rotated-out key stays valid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyConfig {
    /// The operator's namespace.
    pub namespace: String,
    /// Name of the Secret.
    pub secret_name: String,
    /// How long the previous key verifies after a rotation.
    pub grace: SignedDuration,
}

/// The Secret holding `ring`.
pub fn secret_for(cfg: &KeyConfig, ring: &KeyRing) -> Secret {
    let mut data = BTreeMap::new();
    let mut annotations = BTreeMap::new();
    if let Some(key) = ring.current() {
        data.insert(SECRET_KEY.to_string(), ByteString(key.bytes().to_vec()));
    }
    if let Some((prev, until)) = ring.previous() {
        data.insert(
            SECRET_PREVIOUS_KEY.to_string(),
            ByteString(prev.bytes().to_vec()),
        );
        annotations.insert(ANNOTATION_PREVIOUS_UNTIL.to_string(), until.to_string());
    }
    Secret {
        metadata: ObjectMeta {
            name: Some(cfg.secret_name.clone()),
            namespace: Some(cfg.namespace.clone()),
            annotations: Some(annotations),
            labels: Some(BTreeMap::from([
                ("app.kubernetes.io/name".into(), "memprof".into()),
                ("app.kubernetes.io/component".into(), "admission-key".into()),
            ])),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        data: Some(data),
        ..Default::default()
    }
}

/// What the Secret should become at `now`, if it must change: a new key when
/// it holds none or a rotation was asked for, the previous key dropped once
/// its grace is over. `None`: keep it as it is.
pub fn next_ring(old: &Secret, now: Timestamp, grace: SignedDuration) -> Option<KeyRing> {
    let annotations = old.metadata.annotations.as_ref();
    let ring = KeyRing::from_secret(old.data.as_ref(), annotations);
    let rotate = annotations.is_some_and(|a| a.contains_key(ANNOTATION_ROTATE));
    match ring {
        None => Some(KeyRing::new(Key::generate())),
        Some(ring) if rotate => {
            let current = ring
                .current()
                .expect("from_secret has a current key")
                .clone();
            Some(KeyRing::new(Key::generate()).with_previous(current, now + grace))
        }
        Some(ring) if ring.previous().is_some_and(|(_, until)| *until <= now) => {
            Some(KeyRing::new(ring.current().expect("loaded").clone()))
        }
        Some(_) => None,
    }
}

/// Returns the key ring from the Secret, creating, rotating or pruning it
/// first when needed. Safe to call from every replica at once.
pub async fn ensure_keys(client: &Client, cfg: &KeyConfig) -> Result<KeyRing, KeyError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), &cfg.namespace);
    let err = |verb| {
        let (namespace, name) = (cfg.namespace.clone(), cfg.secret_name.clone());
        move |source| KeyError::Secret {
            verb,
            namespace,
            name,
            source: Box::new(source),
        }
    };
    for _attempt in 0..5 {
        let now = Timestamp::now();
        let existing = api.get_opt(&cfg.secret_name).await.map_err(err("read"))?;
        let written = match &existing {
            None => {
                let ring = KeyRing::new(Key::generate());
                let created = api
                    .create(&PostParams::default(), &secret_for(cfg, &ring))
                    .await;
                tracing::info!(secret = %cfg.secret_name, "creating the admission-mark key");
                created
            }
            Some(old) => match next_ring(old, now, cfg.grace) {
                None => {
                    let ring =
                        KeyRing::from_secret(old.data.as_ref(), old.metadata.annotations.as_ref());
                    return Ok(ring.expect("next_ring found a key"));
                }
                Some(ring) => {
                    let mut secret = secret_for(cfg, &ring);
                    secret.metadata.resource_version = old.metadata.resource_version.clone();
                    tracing::info!(secret = %cfg.secret_name, rotated = ring.previous().is_some(), "updating the admission-mark key");
                    api.replace(&cfg.secret_name, &PostParams::default(), &secret)
                        .await
                }
            },
        };
        match written {
            Ok(s) => {
                let ring = KeyRing::from_secret(s.data.as_ref(), s.metadata.annotations.as_ref());
                if let Some(ring) = ring {
                    return Ok(ring);
                }
            }
            // Another replica wrote first: read what it wrote.
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => {
                let verb = if existing.is_some() {
                    "update"
                } else {
                    "create"
                };
                return Err(err(verb)(e));
            }
        }
    }
    Err(KeyError::Contended(cfg.secret_name.clone()))
}

/// Keeps `keys` loaded from the Secret until `shutdown`: at once, then every
/// [`REFRESH_EVERY`], retrying failures (logged with what to do) after 1 s
/// doubling to [`REFRESH_EVERY`]. A failed refresh keeps the ring it had.
pub async fn maintain(
    client: Client,
    cfg: KeyConfig,
    keys: Keys,
    shutdown: impl Future<Output = ()> + Send,
) {
    let refresh = || async { ensure_keys(&client, &cfg).await.map(|ring| keys.set(ring)) };
    crate::retry::every_refresh("admission-mark key not refreshed", refresh, shutdown).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> KeyConfig {
        KeyConfig {
            namespace: "memprof-system".into(),
            secret_name: "memprof-admission-key".into(),
            grace: SignedDuration::from_hours(24),
        }
    }

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn ring_of(s: &Secret) -> Option<KeyRing> {
        KeyRing::from_secret(s.data.as_ref(), s.metadata.annotations.as_ref())
    }

    #[test]
    fn a_secret_without_a_key_gets_one_and_a_good_one_is_kept() {
        let empty = Secret::default();
        let ring = next_ring(&empty, ts(0), cfg().grace).expect("a new key");
        assert!(ring.current().is_some() && ring.previous().is_none());
        let s = secret_for(&cfg(), &ring);
        assert_eq!(ring_of(&s), Some(ring));
        assert_eq!(next_ring(&s, ts(0), cfg().grace), None);
    }

    #[test]
    fn rotation_keeps_the_old_key_for_the_grace_then_drops_it() {
        let old = KeyRing::new(Key::generate());
        let mut s = secret_for(&cfg(), &old);
        s.metadata
            .annotations
            .get_or_insert_default()
            .insert(ANNOTATION_ROTATE.into(), "now".into());
        let rotated = next_ring(&s, ts(0), cfg().grace).expect("rotated");
        assert_ne!(rotated.current(), old.current());
        assert_eq!(
            rotated.previous(),
            Some(&(old.current().unwrap().clone(), ts(0) + cfg().grace))
        );
        // The request annotation is not carried over: one rotation per request.
        let s = secret_for(&cfg(), &rotated);
        assert!(!s
            .metadata
            .annotations
            .as_ref()
            .unwrap()
            .contains_key(ANNOTATION_ROTATE));
        assert_eq!(next_ring(&s, ts(100), cfg().grace), None);
        let pruned = next_ring(&s, ts(0) + cfg().grace, cfg().grace).expect("pruned");
        assert_eq!(pruned, KeyRing::new(rotated.current().unwrap().clone()));
    }
}
