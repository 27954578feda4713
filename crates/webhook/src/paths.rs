//! Keeps the API server on the webhook's secret path.
//!
//! A review's `userInfo` is the cluster's word only if the API server sent
//! it; anyone who reaches the webhook's port can POST one claiming the Job
//! controller (marks.rs, [`Caller`](crate::marks::Caller)). The API server
//! is told a path no one else knows: `/mutate/<path token>`, a MAC of the
//! current admission key (`memprof_api::admission::path_token`), written
//! into every webhook of the operator's MutatingWebhookConfiguration, which
//! tenants cannot read. Every replica runs this (they read the same key, so
//! they write the same path); a `helm upgrade` puts the chart's `/mutate`
//! back, and the next pass, within [`REFRESH_EVERY`], restores the token
//! (meanwhile pods are injected but not marked).

use crate::certs::CertError;
use crate::keys::REFRESH_EVERY;
use k8s_openapi::api::admissionregistration::v1::{MutatingWebhook, MutatingWebhookConfiguration};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use memprof_api::admission::{path_token, Keys};
use serde_json::{json, Value};
use std::future::Future;
use std::time::Duration;

/// The path the API server is given, for `token`.
pub fn secret_path(token: &str) -> String {
    format!("{}{token}", crate::marks::MUTATE_WITH_TOKEN)
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

/// Puts every webhook of the configuration `name` on the secret path of
/// `token`. Returns whether anything changed. Strategic merge by webhook
/// name touches nothing else.
pub async fn sync_paths(client: &Client, name: &str, token: &str) -> Result<bool, CertError> {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let err = |verb| {
        move |source| CertError::WebhookConfig {
            verb,
            name: name.into(),
            source: Box::new(source),
        }
    };
    let mwc = api.get(name).await.map_err(err("read"))?;
    let path = secret_path(token);
    let changes: Vec<Value> = mwc
        .webhooks
        .iter()
        .flatten()
        .filter_map(|w| {
            path_change(w, &path).map(|cc| json!({ "name": w.name, "clientConfig": cc }))
        })
        .collect();
    if changes.is_empty() {
        return Ok(false);
    }
    let n = changes.len();
    let patch = json!({ "webhooks": changes });
    api.patch(name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .map_err(err("patch"))?;
    // The path itself is never logged.
    tracing::info!(webhook_config = name, webhooks = n, "webhook path set");
    Ok(true)
}

/// Keeps configuration `name` on the current key's path until `shutdown`:
/// once the key is loaded, then every [`REFRESH_EVERY`] (after a failure,
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
    let mut retry = Duration::from_secs(1);
    loop {
        let token = keys.ring().current().map(path_token);
        let wait = match token {
            None => REFRESH_EVERY,
            Some(token) => match sync_paths(&client, &name, &token).await {
                Ok(_) => {
                    retry = Duration::from_secs(1);
                    REFRESH_EVERY
                }
                Err(e) => {
                    tracing::error!(error = %e, retry_in = ?retry, "webhook path not set: pods are injected but not marked");
                    let wait = retry;
                    retry = (retry * 2).min(REFRESH_EVERY);
                    wait
                }
            },
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = &mut shutdown => return,
        }
    }
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
