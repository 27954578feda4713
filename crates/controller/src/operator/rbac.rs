//! Namespaced RBAC for the sidecars: a Role `memprof-reporter` that may
//! create, read and patch `memoryreports`, bound to the service account the
//! profiled Job's pods run as. Never `memoryreports/status`: that is where
//! the operator writes `notifyTrainer` directives (the operator's
//! ClusterRole, in the chart, has it), so no pod can order a trainer.
//!
//! Why per namespace and not one ClusterRoleBinding: a ClusterRoleBinding to
//! every service account that runs a profiled Job would let any pod of those
//! accounts write reports in every namespace. The operator can grant exactly
//! these verbs only because its own ClusterRole holds them (the RBAC
//! escalation check), which the chart provides.

use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use memprof_api::{GROUP, OPERATOR_MANAGER};
use std::collections::BTreeMap;

/// Name of the Role and of the RoleBinding prefix.
pub const REPORTER_ROLE: &str = "memprof-reporter";
/// Verbs the sidecar needs: server-side apply is a `patch` (and a `create`
/// the first time); `get` lets it read back its own report after a restart.
pub const REPORTER_VERBS: [&str; 3] = ["create", "get", "patch"];

/// Errors of the RBAC step.
#[derive(Debug, thiserror::Error)]
pub enum RbacError {
    /// The API server refused the apply.
    #[error(
        "cannot apply {kind} {namespace}/{name}: {source}; the operator's ClusterRole needs \
         roles/rolebindings get/create/patch and memoryreports create/get/patch (see the Helm chart)"
    )]
    Apply {
        /// `Role` or `RoleBinding`.
        kind: &'static str,
        /// Namespace of the object.
        namespace: String,
        /// Name of the object.
        name: String,
        /// The API error.
        source: Box<kube::Error>,
    },
}

fn labels() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".into(), "memprof".into()),
        ("app.kubernetes.io/component".into(), "reporter".into()),
        (
            "app.kubernetes.io/managed-by".into(),
            OPERATOR_MANAGER.into(),
        ),
    ])
}

/// The Role: exactly create, get, patch on `memoryreports.memprof.dev`.
pub fn reporter_role(namespace: &str) -> Role {
    Role {
        metadata: ObjectMeta {
            name: Some(REPORTER_ROLE.into()),
            namespace: Some(namespace.into()),
            labels: Some(labels()),
            ..Default::default()
        },
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![GROUP.into()]),
            resources: Some(vec!["memoryreports".into()]),
            verbs: REPORTER_VERBS.iter().map(|v| v.to_string()).collect(),
            ..Default::default()
        }]),
    }
}

/// Name of the binding for one service account. One binding per account
/// (rather than one binding listing all subjects) so that concurrent applies
/// for different accounts never fight over the `subjects` list.
pub fn binding_name(service_account: &str) -> String {
    // Service-account names are DNS subdomains (<= 253); the result stays valid.
    let name = format!("{REPORTER_ROLE}-{service_account}");
    name.chars().take(253).collect()
}

/// The RoleBinding of the reporter Role to `service_account` (`default` when empty).
pub fn reporter_binding(namespace: &str, service_account: &str) -> RoleBinding {
    let sa = if service_account.is_empty() {
        "default"
    } else {
        service_account
    };
    RoleBinding {
        metadata: ObjectMeta {
            name: Some(binding_name(sa)),
            namespace: Some(namespace.into()),
            labels: Some(labels()),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: REPORTER_ROLE.into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: sa.into(),
            namespace: Some(namespace.into()),
            ..Default::default()
        }]),
    }
}

/// Applies the Role and the RoleBinding for `service_account` in `namespace`
/// with server-side apply (field manager `memprof-operator`). Idempotent:
/// call it whenever an annotated Job is seen.
pub async fn ensure_reporter_rbac(
    client: &Client,
    namespace: &str,
    service_account: &str,
) -> Result<(), RbacError> {
    let pp = PatchParams::apply(OPERATOR_MANAGER).force();
    let role = reporter_role(namespace);
    Api::<Role>::namespaced(client.clone(), namespace)
        .patch(REPORTER_ROLE, &pp, &Patch::Apply(with_types(&role, "Role")))
        .await
        .map_err(|source| RbacError::Apply {
            kind: "Role",
            namespace: namespace.into(),
            name: REPORTER_ROLE.into(),
            source: Box::new(source),
        })?;
    let binding = reporter_binding(namespace, service_account);
    let name = binding.metadata.name.clone().unwrap_or_default();
    Api::<RoleBinding>::namespaced(client.clone(), namespace)
        .patch(
            &name,
            &pp,
            &Patch::Apply(with_types(&binding, "RoleBinding")),
        )
        .await
        .map_err(|source| RbacError::Apply {
            kind: "RoleBinding",
            namespace: namespace.into(),
            name: name.clone(),
            source: Box::new(source),
        })?;
    Ok(())
}

/// Server-side apply needs `apiVersion` and `kind` in the body, which the
/// k8s-openapi structs do not serialise.
fn with_types<T: serde::Serialize>(obj: &T, kind: &str) -> serde_json::Value {
    let mut v = serde_json::to_value(obj).expect("k8s-openapi types always serialise");
    v["apiVersion"] = "rbac.authorization.k8s.io/v1".into();
    v["kind"] = kind.into();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_grants_exactly_the_reporter_verbs() {
        let role = reporter_role("ml");
        let rules = role.rules.unwrap();
        assert_eq!(rules.len(), 1);
        assert_eq!(
            rules[0].api_groups.as_deref(),
            Some(&["memprof.dev".to_string()][..])
        );
        assert_eq!(
            rules[0].resources.as_deref(),
            Some(&["memoryreports".to_string()][..])
        );
        assert_eq!(rules[0].verbs, ["create", "get", "patch"]);
        assert_eq!(role.metadata.namespace.as_deref(), Some("ml"));
        // Directives live in the status: a pod must not write them.
        let resources = rules.iter().flat_map(|r| r.resources.iter().flatten());
        assert!(
            resources.clone().all(|r| !r.contains('/')),
            "no subresource"
        );
    }

    #[test]
    fn binding_defaults_to_the_default_service_account() {
        let b = reporter_binding("ml", "");
        assert_eq!(b.metadata.name.as_deref(), Some("memprof-reporter-default"));
        let s = &b.subjects.unwrap()[0];
        assert_eq!(
            (s.kind.as_str(), s.name.as_str()),
            ("ServiceAccount", "default")
        );
        assert_eq!(s.namespace.as_deref(), Some("ml"));
        assert_eq!(b.role_ref.name, REPORTER_ROLE);

        let b = reporter_binding("ml", "trainer");
        assert_eq!(b.metadata.name.as_deref(), Some("memprof-reporter-trainer"));
    }

    #[test]
    fn apply_body_carries_types() {
        let v = with_types(&reporter_role("ml"), "Role");
        assert_eq!(v["apiVersion"], "rbac.authorization.k8s.io/v1");
        assert_eq!(v["kind"], "Role");
    }
}
