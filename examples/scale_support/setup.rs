//! What the benchmark needs before anything is timed: CRDs, a namespace, the
//! operator as a child process, the Jobs, and one real pod per rank.
//!
//! Why the benchmark creates the pods itself: the operator counts a report
//! only when its pod exists and is controlled by the Job (`crates/controller/src/operator/trust.rs`),
//! so every rank needs a real pod. The local Job controller would make them,
//! but at kube-controller-manager's default 20 requests/s: ~100 s for 2,048
//! pods, ~160 s for 3,200, during which it is busy for everyone else's tests
//! on the same control plane too. So the pods are created here, at the API
//! server's own pace, exactly as the Job controller labels and owns them
//! (`job-name`, `controller-uid`, a controlling ownerReference to the Job):
//! the Job controller counts them as its active pods. The benchmark runs no
//! webhook, so it marks them as the webhook marks the Job controller's pods
//! (`memprof.dev/admission`, under the key in the namespace's Secret that the
//! operator reads with `--webhook-namespace`): only marked pods count.
//!
//! And why it makes none of its own: the Job's pod template names a
//! ServiceAccount that does not exist, so the ServiceAccount admission plugin
//! refuses the Job controller's creates (a `FailedCreate` Event, retried with
//! backoff) until ours count as active, after which it has nothing to create.
//! Our pods use the namespace's `default` ServiceAccount. `parallelism` and
//! `completions` are the rank count, because the operator takes the expected
//! ranks and the report limit (2 × parallelism + 4) from `parallelism`.

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Container, Namespace, Pod, PodSpec, PodTemplateSpec, ServiceAccount,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, ResourceExt};
use memprof::api::admission::LABEL_MANAGED;
use memprof::api::admission::{sign, Key, Subject, ANNOTATION_ADMISSION, DEFAULT_KEY_SECRET};
use memprof::api::{crds, ANNOTATION_ENABLED};
use memprof::webhook::keys::{ensure_keys, KeyConfig};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

/// A ServiceAccount no namespace of the benchmark has: see the module docs.
pub const MISSING_SERVICE_ACCOUNT: &str = "memprof-bench-no-such-sa";
/// The glibc tunables the chart starts the operator with
/// (`charts/memprof/templates/deployment.yaml`, which says why;
/// `tests/chart_render.py` checks the two agree): the benchmarks measure
/// the operator as deployed.
pub const GLIBC_TUNABLES: &str = "glibc.malloc.mmap_threshold=131072";
/// Requests in flight while setting up (the API server shares 2 cores with everything).
const SETUP_CONCURRENCY: usize = 16;

/// The key and namespace the workload's reports are marked under (as the
/// webhook marks a pod's own writes: `memprof_api::writer`), once made.
/// Set again by each workload a run creates (`--workload jobset` makes two namespaces).
pub static WRITER_KEY: std::sync::RwLock<Option<(Key, String)>> = std::sync::RwLock::new(None);

/// Marks the load's writes under `key` in `ns` from now on.
pub fn set_writer_key(key: &Key, ns: &str) {
    *WRITER_KEY.write().unwrap_or_else(|e| e.into_inner()) = Some((key.clone(), ns.to_string()));
}

/// A pod standing for one rank: what its report names and is owned by.
#[derive(Clone, Debug)]
pub struct RankPod {
    /// Its profile (the Job, or the JobSet whose child Job made it), by index.
    pub job: usize,
    /// Its rank in that profile.
    pub rank: u32,
    /// The Job that controls it: its report's `memprof.dev/job` label.
    pub owner: String,
    pub name: String,
    pub uid: String,
}

/// Applies the memprof CRDs and waits until they are served.
pub async fn install_crds(client: &Client) -> anyhow::Result<()> {
    let crd_api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in crds() {
        let name = crd.name_any();
        let params = PatchParams::apply("memprof-bench").force();
        crd_api.patch(&name, &params, &Patch::Apply(&crd)).await?;
        await_condition(crd_api.clone(), &name, conditions::is_crd_established()).await?;
    }
    Ok(())
}

/// Creates namespace `ns` and waits for its `default` ServiceAccount (pods need it).
pub async fn create_namespace(client: &Client, ns: &str) -> anyhow::Result<()> {
    let mut namespace = Namespace::default();
    namespace.metadata.name = Some(ns.to_string());
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await?;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let deadline = Instant::now() + Duration::from_secs(60);
    while accounts.get_opt("default").await?.is_none() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "namespace {ns} has no default ServiceAccount after 60 s: is kube-controller-manager running?"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// The operator binary run as a child, so its RSS and CPU are its own.
pub struct Operator {
    child: tokio::process::Child,
    pub pid: u32,
    pub metrics_addr: String,
}

impl Operator {
    /// Starts `bin` for namespace `ns`: metrics on a free loopback port; no
    /// webhook (it would listen on every interface and write its certificate
    /// Secret outside the benchmark's namespace); remediation on, as deployed.
    /// `extra` flags go last (e.g. `--concurrency 16`).
    pub fn start(bin: &Path, ns: &str, extra: &[String]) -> anyhow::Result<Operator> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let metrics_addr = format!("127.0.0.1:{port}");
        let child = tokio::process::Command::new(bin)
            .args(["--namespace", ns, "--metrics-addr", &metrics_addr])
            .args(["--webhook-port", "0"])
            // The admission-mark key is the benchmark namespace's (create_workload marks pods with it).
            .args(["--webhook-namespace", ns])
            .args(extra)
            .env("RUST_LOG", "warn")
            .env("GLIBC_TUNABLES", GLIBC_TUNABLES)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| {
                anyhow::anyhow!(
                    "starting {}: {e}; build it with `cargo build --release --bin memprof-operator`",
                    bin.display()
                )
            })?;
        let pid = child.id().expect("a child that was just spawned has a PID");
        Ok(Operator {
            child,
            pid,
            metrics_addr,
        })
    }

    /// SIGTERM by PID, 10 s to stop, then SIGKILL.
    pub async fn stop(mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status();
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

/// The name of Job `i`.
pub fn job_name(i: usize) -> String {
    format!("bench-{i:03}")
}

fn job(name: &str, ranks: u32) -> Job {
    let mut job = Job {
        spec: Some(JobSpec {
            parallelism: Some(ranks as i32),
            completions: Some(ranks as i32),
            template: PodTemplateSpec {
                spec: Some(PodSpec {
                    service_account_name: Some(MISSING_SERVICE_ACCOUNT.into()),
                    restart_policy: Some("Never".into()),
                    containers: vec![trainer()],
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        }),
        ..Default::default()
    };
    job.metadata.name = Some(name.into());
    job.metadata.annotations = Some(BTreeMap::from([(ANNOTATION_ENABLED.into(), "true".into())]));
    // As the webhook stamps a profiled Job (contract D): the operator watches only those.
    job.metadata.labels = Some(BTreeMap::from([(LABEL_MANAGED.into(), "true".into())]));
    job
}

pub fn trainer() -> Container {
    Container {
        name: "trainer".into(),
        image: Some("busybox".into()),
        ..Default::default()
    }
}

/// A pod of Job `job_name` (uid `job_uid`) as the Job controller would make
/// it, marked as the webhook marks the Job controller's pods (the benchmark
/// runs no webhook; only marked pods count).
pub fn rank_pod(ns: &str, name: &str, job_name: &str, job_uid: &str, key: &Key) -> Pod {
    let mut pod = Pod {
        spec: Some(PodSpec {
            restart_policy: Some("Never".into()),
            containers: vec![trainer()],
            // No pod runs (no kubelet): without this, a 1.20 API server
            // refuses pods made in a fresh namespace until its service
            // account's token exists ("No API token found").
            automount_service_account_token: Some(false),
            ..Default::default()
        }),
        ..Default::default()
    };
    pod.metadata.name = Some(name.into());
    pod.metadata.labels = Some(BTreeMap::from([
        ("job-name".to_string(), job_name.to_string()),
        ("controller-uid".to_string(), job_uid.to_string()),
        (LABEL_MANAGED.to_string(), "true".to_string()),
    ]));
    pod.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "batch/v1".into(),
        kind: "Job".into(),
        name: job_name.into(),
        uid: job_uid.into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }]);
    // Issued now, just before the create: the API server stamps the pod
    // within the mark's window (docs/security.md, "Pod trust").
    let subject = Subject {
        namespace: ns,
        pod: name,
        job_uid,
    };
    let mark = sign(key, &subject, jiff::Timestamp::now());
    pod.metadata.annotations = Some(BTreeMap::from([(ANNOTATION_ADMISSION.to_string(), mark)]));
    pod
}

/// Creates `jobs` Jobs of `ranks` ranks and one pod per rank; returns the
/// pods, Job-major, once the Job controller counts every pod as active.
pub async fn create_workload(
    client: &Client,
    ns: &str,
    jobs: usize,
    ranks: u32,
) -> anyhow::Result<Vec<RankPod>> {
    let job_api: Api<Job> = Api::namespaced(client.clone(), ns);
    let uids: Vec<String> = futures::stream::iter(0..jobs)
        .map(|i| {
            let api = job_api.clone();
            async move {
                let created = api
                    .create(&PostParams::default(), &job(&job_name(i), ranks))
                    .await?;
                anyhow::Ok(created.uid().unwrap_or_default())
            }
        })
        .buffered(SETUP_CONCURRENCY)
        .try_collect()
        .await?;

    let key = admission_key(client, ns)
        .await?
        .current()
        .expect("ensure_keys returns a key")
        .clone();
    // The load signs its reports as the webhook marks a sidecar's writes.
    set_writer_key(&key, ns);
    let pod_api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let wanted = (0..jobs).flat_map(|j| (0..ranks).map(move |r| (j, r)));
    let pods: Vec<RankPod> = futures::stream::iter(wanted)
        .map(|(j, rank)| {
            let (api, job_uid, job) = (pod_api.clone(), uids[j].clone(), job_name(j));
            let key = key.clone();
            async move {
                let name = format!("{job}-{rank}");
                let pod = rank_pod(ns, &name, &job, &job_uid, &key);
                let created = api.create(&PostParams::default(), &pod).await?;
                anyhow::Ok(RankPod {
                    job: j,
                    rank,
                    owner: job_name(j),
                    name,
                    uid: created.uid().unwrap_or_default(),
                })
            }
        })
        .buffered(SETUP_CONCURRENCY)
        .try_collect()
        .await?;
    wait_active(&job_api, jobs, ranks).await?;
    Ok(pods)
}

/// The admission key ring of `ns`: the Secret the operator reads with
/// `--webhook-namespace`, created if missing.
pub async fn admission_key(
    client: &Client,
    ns: &str,
) -> anyhow::Result<memprof::api::admission::KeyRing> {
    let keys = KeyConfig {
        namespace: ns.into(),
        secret_name: DEFAULT_KEY_SECRET.into(),
        grace: jiff::SignedDuration::from_hours(1),
    };
    Ok(ensure_keys(client, &keys).await?)
}

/// Waits until the Job controller counts `ranks` active pods in every Job,
/// so that its own status writes are over before anything is timed: up to
/// 180 s, and 0.25 s more per Job (it writes each Job's status at its
/// 20 requests/s, after failing to create its pods: 2,048 Jobs of one pod
/// took over 3 minutes).
pub async fn wait_active(job_api: &Api<Job>, jobs: usize, ranks: u32) -> anyhow::Result<()> {
    let allowed = Duration::from_secs(180) + Duration::from_millis(250) * jobs as u32;
    let deadline = Instant::now() + allowed;
    loop {
        let listed = job_api.list(&ListParams::default()).await?;
        let settled = listed
            .items
            .iter()
            .filter(|j| j.status.as_ref().and_then(|s| s.active) == Some(ranks as i32))
            .count();
        if settled == jobs {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "after {} s the Job controller counts all {ranks} pods active in {settled} of {jobs} Jobs",
            allowed.as_secs()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
