//! The start check: the memprof CRDs are served, in the scope watched.

use super::{Error, Result};
use k8s_openapi::NamespaceResourceScope;
use kube::api::{Api, ListParams};
use kube::{Client, Resource};
use memprof_api::{MemoryProfile, MemoryReport};
use serde::de::DeserializeOwned;
use std::fmt::Debug;

const PROFILE_CRD: &str = "memoryprofiles.memprof.dev";
const REPORT_CRD: &str = "memoryreports.memprof.dev";

/// Checks that both memprof CRDs are served, in the scope the operator watches.
pub async fn check_crds(client: &Client, namespace: &str) -> Result<()> {
    check_crd::<MemoryProfile>(client, namespace, PROFILE_CRD).await?;
    check_crd::<MemoryReport>(client, namespace, REPORT_CRD).await
}

async fn check_crd<K>(client: &Client, namespace: &str, crd: &'static str) -> Result<()>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Debug,
{
    let api: Api<K> = if namespace.is_empty() {
        Api::all(client.clone())
    } else {
        Api::namespaced(client.clone(), namespace)
    };
    // A LIST needs no more RBAC than the watch does, unlike reading the CRD object.
    match api.list_metadata(&ListParams::default().limit(1)).await {
        Ok(_) => Ok(()),
        // An unknown resource is a bare "404 page not found", not a NotFound Status.
        Err(kube::Error::Api(status)) if status.code == 404 => Err(Error::CrdMissing { crd }),
        Err(source) => Err(Error::CrdCheck { crd, source }),
    }
}
