//! The operator's directives for this pod's trainer, read from the pod's own
//! MemoryReport's `status.directives` and published to the answer
//! ([`crate::answer::Directives`] is implemented for the receiver).
//!
//! Why the status subresource: only the operator writes it (the reporter
//! Role grants `memoryreports`, not `memoryreports/status`), so neither this
//! pod nor another rank's can forge a directive. The sidecar watches one
//! object (field selector on its name). Where its Role lacks list/watch
//! (an operator that grants only create/get/patch), it reads the one object
//! with GET every [`POLL`] instead, and says so once.

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
use memprof_api::agent::Directive;
use memprof_api::{MemoryReport, MAX_REPORT_DIRECTIVES};
use std::time::Duration;
use tokio::sync::watch;

/// How often the report is read when it cannot be watched.
pub const POLL: Duration = Duration::from_secs(5);
/// Pause after a watch error that is not a refusal.
const RETRY: Duration = Duration::from_secs(2);

/// The directives of a report, bounded as the answer will bound them.
pub fn of(report: Option<&MemoryReport>) -> Vec<Directive> {
    let mut d: Vec<Directive> = report
        .and_then(|r| r.status.as_ref())
        .map(|s| s.directives.clone())
        .unwrap_or_default();
    d.truncate(MAX_REPORT_DIRECTIVES);
    d
}

/// Publishes report `name`'s directives into `tx` until the receiver goes.
pub async fn run(
    client: kube::Client,
    namespace: String,
    name: String,
    tx: watch::Sender<Vec<Directive>>,
) {
    let api: Api<MemoryReport> = Api::namespaced(client, &namespace);
    if watch_one(&api, &name, &tx).await == Ended::Forbidden {
        tracing::warn!(namespace = %namespace, "cannot watch memoryreports (forbidden); reading this pod's report every {}s for directives instead. Grant list/watch on memoryreports.memprof.dev to the reporter Role for prompt directives", POLL.as_secs());
        poll_one(&api, &name, &tx).await;
    }
}

#[derive(Debug, PartialEq)]
enum Ended {
    /// The receiver is gone.
    Closed,
    /// The API server refused the list/watch.
    Forbidden,
}

fn forbidden(e: &watcher::Error) -> bool {
    let api = |e: &kube::Error| matches!(e, kube::Error::Api(s) if s.is_forbidden());
    match e {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => api(e),
        watcher::Error::WatchError(s) => s.is_forbidden(),
        _ => false,
    }
}

async fn watch_one(
    api: &Api<MemoryReport>,
    name: &str,
    tx: &watch::Sender<Vec<Directive>>,
) -> Ended {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut stream = watcher::watcher(api.clone(), config).boxed();
    let mut listed: Option<MemoryReport> = None;
    while let Some(event) = stream.next().await {
        let directives = match event {
            Ok(Event::Init) => {
                listed = None;
                continue;
            }
            Ok(Event::InitApply(r)) => {
                listed = Some(r);
                continue;
            }
            Ok(Event::InitDone) => of(listed.take().as_ref()),
            Ok(Event::Apply(r)) => of(Some(&r)),
            Ok(Event::Delete(_)) => vec![],
            Err(e) if forbidden(&e) => return Ended::Forbidden,
            Err(e) => {
                tracing::debug!(error = %e, "watching this pod's report failed; retrying");
                tokio::time::sleep(RETRY).await;
                continue;
            }
        };
        if tx.is_closed() {
            return Ended::Closed;
        }
        tx.send_if_modified(|cur| {
            let changed = *cur != directives;
            *cur = directives;
            changed
        });
    }
    Ended::Closed
}

async fn poll_one(api: &Api<MemoryReport>, name: &str, tx: &watch::Sender<Vec<Directive>>) {
    while !tx.is_closed() {
        match api.get_opt(name).await {
            Ok(r) => {
                let directives = of(r.as_ref());
                tx.send_if_modified(|cur| {
                    let changed = *cur != directives;
                    *cur = directives;
                    changed
                });
            }
            Err(e) => tracing::debug!(error = %e, "reading this pod's report failed; retrying"),
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_api::agent::DirectiveKind;
    use memprof_api::{MemoryReportStatus, RiskLevel};

    #[test]
    fn directives_come_from_the_status_only_and_bounded() {
        let mut r = MemoryReport::new("p", Default::default());
        assert!(of(Some(&r)).is_empty());
        assert!(of(None).is_empty());
        let d = |i: usize| Directive {
            id: format!("d{i}"),
            kind: DirectiveKind::NotifyTrainer,
            level: RiskLevel::Critical,
            reason: "r".into(),
        };
        r.status = Some(MemoryReportStatus {
            directives: (0..20).map(d).collect(),
        });
        let got = of(Some(&r));
        assert_eq!(got.len(), MAX_REPORT_DIRECTIVES);
        assert_eq!(got[0], d(0));
    }
}
