//! Keeps the API server on the marks webhook's secret path.
//!
//! A review's `userInfo` is the cluster's word only if the API server sent
//! it; anyone who reaches the webhook's port can POST one claiming the Job
//! controller (marks.rs, [`Caller`](crate::marks::Caller)). The API server
//! is told a path no one else knows: `/mutate/<path token>`, a MAC of the
//! current admission key (`memprof_api::admission::path_token`), written
//! into the marks webhook ([`MARKS_WEBHOOK`]) of the operator's
//! MutatingWebhookConfiguration, which tenants cannot read. Only that
//! webhook: the API server puts a webhook's URL into the error it returns
//! to the creator when a `failurePolicy: Fail` webhook cannot be called,
//! so the path goes only to a webhook that fails open (the chart pins the
//! marks webhook to `Ignore`; one set to `Fail` is refused here, loudly).
//! Every replica runs this (they read the same key, so they write the same
//! path); a `helm upgrade` puts the chart's `/mutate` back, and the next
//! pass, within `retry::REFRESH_EVERY` (30 s), restores the token (meanwhile pods are
//! injected but not marked).

use crate::certs::{webhook_config_error, CertError};
use crate::marks::{MARKS_WEBHOOK, MUTATE_WITH_TOKEN};
use crate::writers::WRITERS_WEBHOOK;
use k8s_openapi::api::admissionregistration::v1::{MutatingWebhook, MutatingWebhookConfiguration};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use memprof_api::admission::{path_token, Keys};
use serde_json::{json, Value};
use std::future::Future;

/// Why the marks webhook was not put on the secret path.
#[derive(Debug, thiserror::Error)]
pub enum PathError {
    /// The configuration could not be read or patched.
    #[error(transparent)]
    Config(#[from] CertError),
    /// A webhook on the secret path fails closed: its URL would reach
    /// tenants in errors.
    #[error(
        "webhook {webhook} of MutatingWebhookConfiguration {config} has failurePolicy Fail: the \
         API server would return its URL, secret path included, to whoever's request it \
         failed; set it to Ignore (failing open is safe: an unmarked pod or report never \
         counts). Until then nothing is marked"
    )]
    FailsClosed {
        /// The configuration.
        config: String,
        /// The webhook in it.
        webhook: String,
    },
}

/// The path the API server is given, for `token`.
pub fn secret_path(token: &str) -> String {
    format!("{MUTATE_WITH_TOKEN}{token}")
}

/// The `clientConfig` change that puts webhook `w` on `path`, if it is not there.
fn path_change(w: &MutatingWebhook, path: &str) -> Option<Value> {
    let cc = &w.client_config;
    if let Some(service) = &cc.service {
        return (service.path.as_deref() != Some(path))
            .then(|| json!({ "service": { "path": path } }));
    }
    let url = cc.url.as_deref()?;
    let start = url.find("://").map_or(0, |i| i + 3);
    let base = match url[start..].find('/') {
        Some(i) => &url[..start + i],
        None => url,
    };
    let want = format!("{base}{path}");
    (url != want).then(|| json!({ "url": want }))
}

/// The webhooks the API server calls on the secret path: those whose
/// requests' `userInfo` becomes a mark (pods' creators, reports' writers,
/// the creators of a workload's links).
pub const SECRET_PATH_WEBHOOKS: [&str; 3] = [MARKS_WEBHOOK, WRITERS_WEBHOOK, WORKLOADS_WEBHOOK];

/// The webhook that marks a JobSet's child Jobs and a TrainJob's JobSet
/// (`workload_marks.rs`); a PyTorchJob's pods come through the marks webhook.
pub const WORKLOADS_WEBHOOK: &str = "workloads.memprof.dev";

/// Puts the secret-path webhooks ([`SECRET_PATH_WEBHOOKS`]) of configuration
/// `name` on the secret path of `token`. Returns whether anything changed.
/// A strategic merge by webhook name touches nothing else; none is moved
/// while any of them fails closed.
pub async fn sync_paths(client: &Client, name: &str, token: &str) -> Result<bool, PathError> {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let err = |verb| webhook_config_error(verb, name);
    let mwc = api.get(name).await.map_err(err("read"))?;
    let ours = mwc
        .webhooks
        .iter()
        .flatten()
        .filter(|w| SECRET_PATH_WEBHOOKS.contains(&w.name.as_str()));
    let mut changes = Vec::new();
    for w in ours {
        if w.failure_policy.as_deref() != Some("Ignore") {
            return Err(PathError::FailsClosed {
                config: name.into(),
                webhook: w.name.clone(),
            });
        }
        if let Some(cc) = path_change(w, &secret_path(token)) {
            changes.push(json!({ "name": w.name, "clientConfig": cc }));
        }
    }
    if changes.is_empty() {
        return Ok(false);
    }
    let patch = json!({ "webhooks": changes });
    api.patch(name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .map_err(err("patch"))?;
    // The path itself is never logged.
    tracing::info!(webhook_config = name, "secret-path webhooks' path set");
    Ok(true)
}

/// Keeps configuration `name` on the current key's path until `shutdown`:
/// once the key is loaded, then every 30 s (after a failure,
/// logged with what to do, 1 s doubling to that).
pub async fn keep_paths(
    client: Client,
    name: String,
    keys: Keys,
    shutdown: impl Future<Output = ()> + Send,
) {
    let mut shutdown = std::pin::pin!(shutdown);
    tokio::select! {
        () = keys.loaded() => {}
        () = &mut shutdown => return,
    }
    let sync = || async {
        match keys.ring().current().map(path_token) {
            Some(token) => sync_paths(&client, &name, &token).await.map(|_| ()),
            None => Ok(()),
        }
    };
    crate::retry::every_refresh(
        "marks webhook path not set: pods are injected but not marked",
        sync,
        shutdown,
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hook(client_config: Value) -> MutatingWebhook {
        serde_json::from_value(json!({
            "name": "marks.memprof.dev", "clientConfig": client_config,
            "sideEffects": "None", "admissionReviewVersions": ["v1"],
        }))
        .unwrap()
    }

    #[test]
    fn a_service_or_a_url_is_moved_to_the_secret_path_once() {
        let path = secret_path("tok");
        assert_eq!(path, "/mutate/tok");
        let svc =
            hook(json!({"service": {"name": "memprof", "namespace": "m", "path": "/mutate"}}));
        assert_eq!(
            path_change(&svc, &path),
            Some(json!({"service": {"path": "/mutate/tok"}}))
        );
        let done =
            hook(json!({"service": {"name": "memprof", "namespace": "m", "path": "/mutate/tok"}}));
        assert_eq!(path_change(&done, &path), None);
        let url = hook(json!({"url": "https://127.0.0.1:8443/mutate"}));
        assert_eq!(
            path_change(&url, &path),
            Some(json!({"url": "https://127.0.0.1:8443/mutate/tok"}))
        );
        let bare = hook(json!({"url": "https://127.0.0.1:8443"}));
        assert_eq!(
            path_change(&bare, &path),
            Some(json!({"url": "https://127.0.0.1:8443/mutate/tok"}))
        );
        let old = hook(json!({"url": "https://127.0.0.1:8443/mutate/old"}));
        assert_eq!(
            path_change(&old, &path),
            Some(json!({"url": "https://127.0.0.1:8443/mutate/tok"}))
        );
        let set = hook(json!({"url": "https://127.0.0.1:8443/mutate/tok"}));
        assert_eq!(path_change(&set, &path), None);
    }
}
