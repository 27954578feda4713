//! `resolve.rs`'s steps with every object read from the API server (a
//! `get` by kind and name, never a cache a watch filled from objects a
//! tenant may have written since): what a pod's workload is, now.

use super::resolve::{accept, first, resolved, step, ResolveError, Resolved, Step, Workload};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::core::GroupVersionKind;
use kube::Client;
use memprof_api::admission::KeyRing;
use memprof_api::workload::WorkloadKind;

/// A Job's resolved workload as last read (the pipeline keeps one per Job
/// and reads again after a while: `pipeline/workloads.rs`).
#[derive(Clone, Debug)]
pub struct Membership {
    /// uid of the Job it was resolved for.
    pub job_uid: String,
    /// When it was read.
    pub read: std::time::Instant,
    /// Its workload when that is not the Job itself, with its JobSet's
    /// rank layout as read then.
    pub resolved: Option<(Resolved, super::rank::JobSetShape)>,
}

/// Why the workload could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// A `get` failed (not a 404, which is an answer).
    #[error(
        "could not read {kind} {name}: {source}; check that the operator may get {plural} \
         (the chart's ClusterRole grants it) and that their CRD is installed"
    )]
    Get {
        /// Kind read.
        kind: &'static str,
        /// Name read.
        name: String,
        /// Its resource's plural.
        plural: &'static str,
        /// The API server's answer.
        source: Box<kube::Error>,
    },
    /// The chain's own rules refused it.
    #[error(transparent)]
    Resolve(#[from] ResolveError),
}

/// The API resource of `kind`.
pub fn api_resource(kind: WorkloadKind) -> ApiResource {
    let (group, version) = kind
        .api_version()
        .rsplit_once('/')
        .unwrap_or(("", kind.api_version()));
    let gvk = GroupVersionKind::gvk(group, version, kind.kind());
    ApiResource::from_gvk_with_plural(&gvk, kind.plural())
}

/// The metadata of `kind` `name` in `namespace`, `None` when there is none.
pub async fn read_meta(
    client: &Client,
    namespace: &str,
    kind: WorkloadKind,
    name: &str,
) -> Result<Option<ObjectMeta>, ReadError> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &api_resource(kind));
    let got = api.get_opt(name).await.map_err(|source| ReadError::Get {
        kind: kind.kind(),
        name: name.to_string(),
        plural: kind.plural(),
        source: Box::new(source),
    })?;
    Ok(got.map(|o| o.metadata))
}

/// The workload above `start` (a pod's controller), each object read from
/// the API server: at most `MAX_CHAIN` gets.
pub async fn resolve_live(
    client: &Client,
    namespace: &str,
    start: Workload,
    keys: &KeyRing,
) -> Result<Resolved, ReadError> {
    let mut meta = first(
        &start,
        read_meta(client, namespace, start.kind, &start.name).await?,
    )?;
    let mut chain = vec![start];
    loop {
        let here = chain.last().expect("the chain starts with one object");
        match step(namespace, here, &meta, chain.len(), keys, Timestamp::now()) {
            Step::Top => return Ok(resolved(chain, None, &meta)),
            Step::Unproven(why) => return Ok(resolved(chain, Some(why), &meta)),
            Step::Up(parent) => {
                let read = read_meta(client, namespace, parent.kind, &parent.name).await?;
                match accept(&parent, read) {
                    Ok(up) => {
                        chain.push(parent);
                        meta = up;
                    }
                    Err(why) => return Ok(resolved(chain, Some(why), &meta)),
                }
            }
        }
    }
}
