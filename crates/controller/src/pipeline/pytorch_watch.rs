//! The PyTorchJob watches (`pytorchjobs.rs` rolls them up): the profiled
//! PyTorchJobs and their pods, each slimmed on the way into its cache
//! (`slim.rs`), and what each event is about: the PyTorchJob's key, and
//! for a pod its name too (its report is screened again by name, as a
//! Job's pod's is: the roll-up is kept between reconciles).
//!
//! The kind is optional: the watches start once the PyTorchJob API is
//! served (looked for again every [`LOOK_AGAIN`] until it is); meanwhile
//! the caches count as listed, empty, and the operator works without it.
//! Apart from `watch.rs`, whose watches are always there.

use super::slim;
use super::watch::{Change, Changes};
use crate::key::JobKey;
use crate::workload::read::api_resource;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, ListParams};
use kube::runtime::reflector::{store::Writer, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Resource};
use memprof_api::admission::LABEL_MANAGED;
use memprof_api::workload::{WorkloadKind, LABEL_TRAINING_JOB_NAME};
use std::time::Duration;
use tokio::sync::watch;
use tracing::{info, warn};

/// How often the operator looks again for a PyTorchJob API not served.
const LOOK_AGAIN: Duration = Duration::from_secs(60);

/// What the PyTorchJob watches keep.
pub(super) struct Caches {
    /// Profiled PyTorchJobs (labelled `memprof.dev/managed`).
    pub jobs: Store<DynamicObject>,
    /// Their pods (labelled with a PyTorchJob's name and managed).
    pub pods: Store<Pod>,
    /// One per cache: true once its first full list is in (or the kind is
    /// not served).
    pub ready: Vec<watch::Receiver<bool>>,
}

/// Waits until the PyTorchJob API is served in `api`'s scope; until then
/// the caches are marked listed (empty is the truth).
async fn served(api: &Api<DynamicObject>, ready: &[watch::Sender<bool>]) {
    let mut said = false;
    loop {
        match api.list_metadata(&ListParams::default().limit(1)).await {
            Ok(_) => return,
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(error) if !said => {
                warn!(%error, "cannot list PyTorchJobs: none is profiled until this works (the chart grants get/list/watch on pytorchjobs.kubeflow.org)");
                said = true;
            }
            Err(_) => {}
        }
        for r in ready {
            r.send_replace(true);
        }
        tokio::time::sleep(LOOK_AGAIN).await;
    }
}

/// Starts the watches of `ns` (all namespaces when empty): the caches, and
/// what each change is about.
pub(super) fn start(client: &Client, ns: &str) -> (Caches, Changes) {
    let ar = api_resource(WorkloadKind::PyTorchJob);
    let (jobs_api, pods_api): (Api<DynamicObject>, Api<Pod>) = if ns.is_empty() {
        (Api::all_with(client.clone(), &ar), Api::all(client.clone()))
    } else {
        (
            Api::namespaced_with(client.clone(), ns, &ar),
            Api::namespaced(client.clone(), ns),
        )
    };
    let (jobs_writer, pods_writer) = (Writer::new(ar), Writer::<Pod>::default());
    let (ready, ready_rx): (Vec<_>, Vec<_>) = (0..2).map(|_| watch::channel(false)).unzip();
    let caches = Caches {
        jobs: jobs_writer.as_reader(),
        pods: pods_writer.as_reader(),
        ready: ready_rx,
    };
    let changes = futures::stream::once(async move {
        served(&jobs_api, &ready).await;
        info!("the PyTorchJob API is served: profiling PyTorchJobs");
        let [jobs_ready, pods_ready] = <[_; 2]>::try_from(ready).expect("two channels");
        // Only what memprof manages (the webhook labels a profiled
        // PyTorchJob and its templates): a filter for cost, never proof.
        let managed = format!("{LABEL_MANAGED}=true");
        let cfg = watcher::Config::default().labels(&managed);
        let jobs = watcher(jobs_api, cfg)
            .default_backoff()
            .modify(slim::pytorchjob)
            .reflect(jobs_writer);
        let cfg =
            watcher::Config::default().labels(&format!("{LABEL_TRAINING_JOB_NAME},{managed}"));
        let pods = watcher(pods_api, cfg)
            .default_backoff()
            .modify(slim::pytorch_pod)
            .reflect(pods_writer);
        futures::stream::select(
            keyed(jobs, jobs_ready, "PyTorchJob", |o| {
                JobKey::of(o).map(Change::Workload)
            }),
            keyed(pods, pods_ready, "Pod", |p: &Pod| {
                let key = JobKey::from_label(p, LABEL_TRAINING_JOB_NAME)?;
                Some(Change::Pod(key, p.metadata.name.clone()?))
            }),
        )
    })
    .flatten()
    .boxed();
    (caches, changes)
}

/// What each object an event is about (applied, listed or deleted)
/// changed, as `change` names it; `ready` marked once the first list is
/// in, errors logged.
fn keyed<K: Resource + Send + 'static>(
    events: impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static,
    ready: watch::Sender<bool>,
    kind: &'static str,
    change: impl Fn(&K) -> Option<Change> + Send + Sync + 'static,
) -> Changes {
    events
        .filter_map(move |ev| {
            let about = match ev {
                Ok(
                    watcher::Event::Apply(o)
                    | watcher::Event::InitApply(o)
                    | watcher::Event::Delete(o),
                ) => change(&o),
                Ok(watcher::Event::InitDone) => {
                    ready.send_replace(true);
                    None
                }
                Ok(watcher::Event::Init) => None,
                Err(error) => {
                    warn!(kind, %error, "watch error; the watch retries with backoff");
                    None
                }
            };
            async move { about }
        })
        .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// An API server that serves nothing: every request is a 404, as for
    /// a kind whose CRD is not installed. Returns its URL and the paths asked.
    async fn serving_nothing() -> (String, tokio::sync::mpsc::UnboundedReceiver<String>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (asked, paths) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut buf = vec![0u8; 16 * 1024];
                let n = conn.read(&mut buf).await.unwrap_or(0);
                let head = String::from_utf8_lossy(&buf[..n]).to_string();
                let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
                let _ = asked.send(path);
                let body = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the server could not find the requested resource","reason":"NotFound","code":404}"#;
                let reply = format!(
                    "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(reply.as_bytes()).await;
            }
        });
        (url, paths)
    }

    #[tokio::test]
    async fn without_the_pytorchjob_api_the_caches_count_as_listed_and_nothing_is_watched() {
        let (url, mut paths) = serving_nothing().await;
        let client = Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
        let (caches, mut keys) = start(&client, "ml");
        tokio::spawn(async move { keys.next().await });
        for mut ready in caches.ready {
            let listed = tokio::time::timeout(Duration::from_secs(10), ready.wait_for(|r| *r));
            assert!(
                listed.await.is_ok(),
                "the operator's workers would wait forever"
            );
        }
        assert!(caches.jobs.state().is_empty() && caches.pods.state().is_empty());
        let asked = paths.recv().await.unwrap();
        assert!(
            asked.starts_with("/apis/kubeflow.org/v1/namespaces/ml/pytorchjobs?"),
            "{asked}"
        );
        assert!(paths.try_recv().is_err(), "no watch started: {asked}");
    }
}
