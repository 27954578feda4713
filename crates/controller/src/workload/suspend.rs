//! Suspend, patch the environment, resume (`action.rs` decides when):
//! the I/O of the least disruptive change, on the top-level object only.
//!
//! Each step is one request the API server orders: the suspend switch by a
//! merge patch, the environment by a replace at the resourceVersion just
//! read (a concurrent edit, the workload's controller's or a person's, is
//! a conflict to read again, never overwritten), resume by a merge patch.
//! The object keeps its name, uid and labels (its Kueue queue); its own
//! controller removes and recreates the pods on suspend and resume.

use super::action::{set_env, suspend_patch};
use super::read::api_resource;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::Client;
use memprof_api::workload::WorkloadKind;

/// Why the change could not be made.
#[derive(Debug, thiserror::Error)]
pub enum SuspendError {
    /// The kind has no suspend switch memprof uses.
    #[error("{0} is not suspended by memprof: it is recreated instead (docs/remediation.md)")]
    NotSuspendable(&'static str),
    /// A request failed.
    #[error(
        "{step} {kind} {name} failed: {source}; check the operator may patch and update \
         {plural} (the chart grants it) and that the object still exists"
    )]
    Request {
        /// Which step.
        step: &'static str,
        /// Kind of the object.
        kind: &'static str,
        /// Its name.
        name: String,
        /// Its plural.
        plural: &'static str,
        /// The API server's answer.
        source: Box<kube::Error>,
    },
}

/// What the change did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Suspended {
    /// uid of the object (unchanged by the change: it was never deleted).
    pub uid: String,
    /// Env lists changed (0: already as asked; it was still suspended and resumed).
    pub env_lists: usize,
}

/// Suspends `kind` `name`, sets `vars` in every pod template, resumes it.
pub async fn suspend_patch_resume(
    client: &Client,
    namespace: &str,
    kind: WorkloadKind,
    name: &str,
    vars: &[(&str, &str)],
) -> Result<Suspended, SuspendError> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &api_resource(kind));
    let fail = |step: &'static str| {
        move |source| SuspendError::Request {
            step,
            kind: kind.kind(),
            name: name.to_string(),
            plural: kind.plural(),
            source: Box::new(source),
        }
    };
    let switch =
        |on: bool| suspend_patch(kind, on).ok_or(SuspendError::NotSuspendable(kind.kind()));
    let pp = PatchParams::default();
    api.patch(name, &pp, &Patch::Merge(&switch(true)?))
        .await
        .map_err(fail("suspending"))?;
    let mut obj = api.get(name).await.map_err(fail("reading"))?;
    let mut data = serde_json::to_value(&obj).expect("a DynamicObject always serialises");
    let env_lists = set_env(kind, &mut data, vars);
    if env_lists > 0 {
        obj = serde_json::from_value(data).expect("the object it came from");
        obj = api
            .replace(name, &PostParams::default(), &obj)
            .await
            .map_err(fail("patching the environment of"))?;
    }
    api.patch(name, &pp, &Patch::Merge(&switch(false)?))
        .await
        .map_err(fail("resuming"))?;
    Ok(Suspended {
        uid: obj.metadata.uid.unwrap_or_default(),
        env_lists,
    })
}
