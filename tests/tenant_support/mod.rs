//! Identities of the adversarial tests (on top of `tests/common`): a user
//! impersonated by the test's admin, namespaced Roles granted to it, a
//! tenant with `edit`'s rules, and a pod's service account with the
//! reporter Role.
#![allow(dead_code)]

use crate::common::eventually;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, PostParams};
use kube::Client;
use serde_json::json;

/// A client acting as `user` in `groups` (the test's admin impersonates it).
pub async fn as_user(user: &str, groups: &[&str]) -> Client {
    let mut cfg = kube::Config::infer().await.expect("kubeconfig");
    cfg.auth_info.impersonate = Some(user.into());
    cfg.auth_info.impersonate_groups = Some(groups.iter().map(|g| g.to_string()).collect());
    Client::try_from(cfg).expect("impersonating client")
}

/// A Role named `name` in `ns` with these rules, bound to `user`.
pub async fn grant(admin: &Client, ns: &str, name: &str, user: &str, rules: serde_json::Value) {
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": name}, "rules": rules}))
    .unwrap();
    Api::<Role>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &role)
        .await
        .expect("creating a Role");
    let rb: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &rb)
        .await
        .expect("binding a Role");
}

/// `user` (in `system:authenticated`) with `rules` in `ns`, once the
/// authorizer has seen the binding (`probe` must be allowed by the rules).
pub async fn user_with(admin: &Client, ns: &str, user: &str, rules: serde_json::Value) -> Client {
    grant(admin, ns, user, user, rules).await;
    let client = as_user(user, &["system:authenticated"]).await;
    // RBAC changes reach the authorizer's cache a moment later.
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    eventually("the user's Role in effect", || async {
        jobs.list(&Default::default())
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .await;
    client
}

/// A tenant with what the built-in `edit` grants, in `ns` only. (The local
/// control plane runs no clusterrole-aggregation controller, so its `edit`
/// ClusterRole is empty: the Role spells out `edit`'s rules on the kinds
/// these attacks use.)
pub async fn tenant(admin: &Client, ns: &str) -> Client {
    let all = [
        "create",
        "delete",
        "deletecollection",
        "get",
        "list",
        "patch",
        "update",
        "watch",
    ];
    let rules = json!([
        {"apiGroups": [""], "resources": ["configmaps", "pods", "secrets", "serviceaccounts"], "verbs": all},
        {"apiGroups": ["batch"], "resources": ["jobs", "cronjobs"], "verbs": all},
    ]);
    user_with(admin, ns, &format!("tenant-{ns}"), rules).await
}

/// Someone who may create (and read) pods in `ns` but not create, patch or
/// delete Jobs: what a tenant attacking another's Job has.
pub async fn pod_creator(admin: &Client, ns: &str) -> Client {
    let rules = json!([
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "watch"]},
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "watch"]},
    ]);
    user_with(admin, ns, &format!("pod-creator-{ns}"), rules).await
}

/// A pod's service account with the reporter Role (what the operator grants).
pub async fn pod_identity(admin: &Client, ns: &str) -> Client {
    memprof::operator::ensure_reporter_rbac(admin, ns, "default")
        .await
        .expect("reporter RBAC");
    let sa = format!("system:serviceaccount:{ns}:default");
    let group = format!("system:serviceaccounts:{ns}");
    as_user(
        &sa,
        &["system:serviceaccounts", &group, "system:authenticated"],
    )
    .await
}
