//! Writes the MemoryReport with server-side apply, from one task.
//!
//! The sampling loop hands reports over through a `watch` channel, which holds
//! only the newest value: while the API server is unreachable nothing queues
//! up, and the next successful write carries the latest state. Failures back
//! off exponentially ([`backoff`]: 1 s to 60 s); a forbidden write says how
//! to fix RBAC.
//! Nothing here can take the training pod down: errors are logged and counted.

use crate::budget::Reason;
use crate::metrics::Metrics;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, Patch, PatchParams};
use memprof_api::{MemoryReport, MemoryReportSpec, LABEL_JOB, LABEL_PROFILE, SIDECAR_MANAGER};
use memprof_runtime::backoff::REPORT_WRITE;
use std::time::Duration;
use tokio::sync::watch;

/// Where the report goes.
#[derive(Clone, Debug)]
pub struct Target {
    /// Namespace of the pod.
    pub namespace: String,
    /// Name of the report (the pod's name).
    pub name: String,
    /// The pod's UID, for the owner reference (garbage collection with the pod).
    pub pod_uid: Option<String>,
}

/// The object applied for `spec`: labels tie it to its job and profile, the
/// owner reference to its pod.
pub fn build(target: &Target, spec: MemoryReportSpec) -> MemoryReport {
    let mut report = MemoryReport::new(&target.name, spec);
    if let Some(job) = report.spec.job_name.clone() {
        report.metadata.labels = Some(
            [
                (LABEL_JOB.to_string(), job.clone()),
                (LABEL_PROFILE.to_string(), job),
            ]
            .into(),
        );
    }
    if let Some(uid) = &target.pod_uid {
        report.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Pod".into(),
            name: report.spec.pod_name.clone(),
            uid: uid.clone(),
            ..Default::default()
        }]);
    }
    report
}

/// What one write attempt came to.
enum Outcome {
    /// Written: wait for the next report.
    Written,
    /// Refused for good (the object itself is invalid): wait for the next report.
    Dropped,
    /// Worth retrying after a backoff.
    Retry,
}

/// Runs until the channel closes: applies the newest report each time one arrives.
pub async fn run(
    client: kube::Client,
    target: Target,
    mut rx: watch::Receiver<Option<(Reason, MemoryReportSpec)>>,
    metrics: Metrics,
) {
    let api: Api<MemoryReport> = Api::namespaced(client, &target.namespace);
    let mut delays = REPORT_WRITE.delays();
    let mut pending: Option<(Reason, MemoryReportSpec)> = None;
    loop {
        if pending.is_none() {
            if rx.changed().await.is_err() {
                return;
            }
            pending = rx.borrow_and_update().clone();
        }
        let Some((reason, spec)) = pending.clone() else {
            continue;
        };
        match write_once(&api, &target, reason, spec, &metrics).await {
            Outcome::Written | Outcome::Dropped => {
                delays = REPORT_WRITE.delays();
                pending = None;
            }
            Outcome::Retry => {
                // `without_max_times`: the iterator never ends.
                let delay = delays.next().unwrap_or(REPORT_WRITE.max());
                tokio::time::sleep(delay).await;
                // A newer report replaces the one that failed.
                if rx.has_changed().unwrap_or(false) {
                    pending = rx.borrow_and_update().clone();
                }
            }
        }
    }
}

/// One server-side apply of the report, its outcome logged and counted.
async fn write_once(
    api: &Api<MemoryReport>,
    target: &Target,
    reason: Reason,
    spec: MemoryReportSpec,
    metrics: &Metrics,
) -> Outcome {
    let obj = build(target, spec);
    let params = PatchParams::apply(SIDECAR_MANAGER).force();
    let res = tokio::time::timeout(
        Duration::from_secs(10),
        api.patch(&target.name, &params, &Patch::Apply(&obj)),
    )
    .await;
    let (kind, outcome) = match res {
        Ok(Ok(_)) => {
            metrics.written(reason.as_str());
            return Outcome::Written;
        }
        Ok(Err(e)) => failure(&e, &target.namespace),
        Err(_) => {
            tracing::warn!("MemoryReport write timed out after 10 s; retrying with backoff");
            ("timeout", Outcome::Retry)
        }
    };
    metrics.write_failed(kind);
    outcome
}

/// What a failed write means, said once in the log with what to do.
fn failure(e: &kube::Error, namespace: &str) -> (&'static str, Outcome) {
    match e {
        kube::Error::Api(s) if s.code == 403 => {
            tracing::error!(namespace = %namespace, "cannot write MemoryReport: forbidden ({}). The pod's service account needs create/get/patch on memoryreports.memprof.dev in this namespace; the operator grants it with the Role memprof-reporter", s.message);
            ("forbidden", Outcome::Retry)
        }
        kube::Error::Api(s) if s.code == 404 => {
            tracing::error!(
                "cannot write MemoryReport: {} — is the CRD installed? `kubectl apply -f crds/`",
                s.message
            );
            ("not_found", Outcome::Retry)
        }
        kube::Error::Api(s) if s.code == 422 || s.code == 400 => {
            // The server rejected our object: retrying the same one is pointless.
            tracing::error!("MemoryReport rejected by the API server: {}", s.message);
            ("invalid", Outcome::Dropped)
        }
        other => {
            tracing::warn!(error = %other, "MemoryReport write failed; retrying with backoff");
            ("api", Outcome::Retry)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_is_labelled_for_its_job_and_owned_by_its_pod() {
        let t = Target {
            namespace: "ns".into(),
            name: "train-0".into(),
            pod_uid: Some("uid-1".into()),
        };
        let spec = MemoryReportSpec {
            pod_name: "train-0".into(),
            job_name: Some("train".into()),
            ..Default::default()
        };
        let r = build(&t, spec);
        let labels = r.metadata.labels.unwrap();
        assert_eq!(labels[LABEL_JOB], "train");
        assert_eq!(labels[LABEL_PROFILE], "train");
        let owner = &r.metadata.owner_references.unwrap()[0];
        assert_eq!((owner.kind.as_str(), owner.uid.as_str()), ("Pod", "uid-1"));
    }
}
