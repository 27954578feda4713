//! Shared harness of the integration tests against a real control plane
//! (`hack/local-cluster.sh up`): connect or skip, install the CRDs, one
//! temporary namespace per test (deleted even when the test panics), an
//! in-process operator that can be stopped and restarted, polling helpers.
#![allow(dead_code)] // not every helper is used by every module

pub mod alone;

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Container, Namespace, Pod, PodSpec, PodTemplateSpec, ServiceAccount,
};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, ResourceExt};
use memprof::api::admission::{KeyRing, LABEL_MANAGED};
use memprof::api::{
    GpuReport, MemoryReport, MemoryReportSpec, ReportSummary, RiskLevel, ANNOTATION_ENABLED,
    LABEL_JOB, LABEL_PROFILE, SIDECAR_MANAGER,
};
use memprof::operator::{self, Metrics, Options};
use memprof::pipeline::Setup;
use std::collections::BTreeMap;
use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long any awaited state may take before the test fails: a margin a
/// loaded 2-core machine honours (a passing test never waits it out). 60 s
/// was not: with four builds beside them (load average 4), the JobSet
/// remediation twins and five Job remediation tests timed out and passed
/// alone; a bound only a failing test reaches costs nothing when they pass.
pub const TIMEOUT: Duration = Duration::from_secs(180);
pub const GIB: u64 = 1 << 30;

/// A client for the test cluster, or `None` (after saying so) when there is
/// none and none is required. With `MEMPROF_REQUIRE_CLUSTER=1`, not reaching
/// the cluster fails the test.
pub async fn cluster() -> Option<Client> {
    let required = std::env::var("MEMPROF_REQUIRE_CLUSTER").is_ok_and(|v| v == "1");
    let skip = |why: String| {
        assert!(!required, "MEMPROF_REQUIRE_CLUSTER=1 but {why}");
        eprintln!(
            "SKIPPED: {why}. To run: eval \"$(bash hack/local-cluster.sh env)\" && \
             MEMPROF_REQUIRE_CLUSTER=1 cargo test --test integration"
        );
        None
    };
    // `RUST_LOG=memprof=debug cargo test ... -- --nocapture` shows the operator's logs.
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .try_init();
    if std::env::var_os("KUBECONFIG").is_none() && !required {
        return skip("KUBECONFIG is not set".into());
    }
    let client = match Client::try_default().await {
        Ok(c) => c,
        Err(e) => return skip(format!("no Kubernetes client could be configured: {e}")),
    };
    if let Err(e) = client.apiserver_version().await {
        return skip(format!("the API server does not answer: {e}"));
    }
    // Once per test binary (every test after the first finds them served);
    // a failed install is tried again by the next test.
    static CRDS: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    CRDS.get_or_init(|| install_crds(&client)).await;
    alone::CLUSTER.share().await;
    Some(client)
}

/// Server-side applies the CRDs generated from `memprof::api` and waits until they are served.
pub async fn install_crds(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply("memprof-tests").force();
    for crd in memprof::api::crds() {
        let name = crd.name_any();
        crds.patch(&name, &params, &Patch::Apply(&crd))
            .await
            .unwrap_or_else(|e| panic!("installing CRD {name}: {e}"));
        let established = await_condition(crds.clone(), &name, conditions::is_crd_established());
        tokio::time::timeout(TIMEOUT, established)
            .await
            .unwrap_or_else(|_| panic!("CRD {name} not established within {TIMEOUT:?}"))
            .unwrap();
    }
}

/// A random suffix for names (no extra dependency: std's hasher keys are random).
pub fn random_suffix() -> String {
    format!("{:08x}", RandomState::new().hash_one(Instant::now()) as u32)
}

/// A namespace `memprof-test-<random>` that is deleted when dropped, panics included.
pub struct TestNamespace {
    pub name: String,
}

impl TestNamespace {
    pub async fn create(client: &Client) -> Self {
        let name = format!("memprof-test-{}", random_suffix());
        let mut ns = Namespace::default();
        ns.metadata.name = Some(name.clone());
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("creating namespace {name}: {e}"));
        pods_may_be_created(client, &name).await;
        TestNamespace { name }
    }
}

/// Waits until the namespace's `default` service account has its token:
/// until then kube-apiserver v1.20 (the local control plane's) refuses a
/// pod created directly, "No API token found for service account
/// default" (500). The token controller takes ~0.1 s idle, seconds on a
/// loaded 2-core machine, where a test that created pods at once failed.
async fn pods_may_be_created(client: &Client, ns: &str) {
    let accounts = Api::<ServiceAccount>::namespaced(client.clone(), ns);
    let start = Instant::now();
    loop {
        let account = accounts.get_opt("default").await.ok().flatten();
        if account.is_some_and(|a| a.secrets.is_some_and(|s| !s.is_empty())) {
            return;
        }
        assert!(
            start.elapsed() < TIMEOUT,
            "namespace {ns}: no token for its default service account within {TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs `request`, with a client of its own, on a thread and runtime of
/// its own, and waits for it: the clean-up a guard's `Drop` sends, when
/// the test's runtime may be unwinding or gone. Its error or the client's;
/// a panic on that thread has printed its own message and counts as done.
pub fn from_drop<F, Fut>(request: F) -> Result<(), String>
where
    F: FnOnce(Client) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), String>>,
{
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a current-thread runtime");
        rt.block_on(async {
            let client = Client::try_default().await.map_err(|e| e.to_string())?;
            request(client).await
        })
    })
    .join()
    .unwrap_or(Ok(()))
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Waits for the request, not for the deletion.
        let deleted = from_drop(move |client| async move {
            Api::<Namespace>::all(client)
                .delete(&name, &DeleteParams::background())
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        });
        if let Err(e) = deleted {
            eprintln!(
                "warning: could not delete test namespace {}: {e}",
                self.name
            );
        }
    }
}

/// The operator (the one controller: roll-up and remediation) running
/// in-process, scoped to one namespace.
pub struct RunningOperator {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<operator::Result<()>>>,
    pub metrics: Arc<Metrics>,
    pub remediation_metrics: Arc<memprof::remediation::Metrics>,
}

pub fn start_operator(client: &Client, namespace: &str) -> RunningOperator {
    start_operator_with(client, Options::for_namespace(namespace))
}

/// The operator in-process with these options (remediation on, plans kept
/// in the watched namespace). Unless `opts.admission` holds a key already,
/// it gets the key of its namespace ([`admission_keys`]), the one
/// [`job_pods`] marks pods with.
pub fn start_operator_with(client: &Client, opts: Options) -> RunningOperator {
    let mut setup = Setup::for_namespace(&opts.namespace);
    setup.options = opts;
    start_controller(client, setup)
}

/// The controller in-process as `setup` says.
pub fn start_controller(client: &Client, setup: Setup) -> RunningOperator {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (metrics, remediation_metrics) = (setup.metrics.clone(), setup.remediation_metrics.clone());
    let c = client.clone();
    let task = tokio::spawn(async move {
        let keys = &setup.options.admission;
        if keys.ring().current().is_none() {
            keys.set(admission_keys(&setup.options.namespace).await);
        }
        memprof::pipeline::run(c, setup, async move {
            let _ = stopped.await;
        })
        .await
    });
    RunningOperator {
        stop: Some(stop),
        task: Some(task),
        metrics,
        remediation_metrics,
    }
}

impl RunningOperator {
    /// Stops gracefully and waits for it; fails the test if it errored.
    pub async fn stop(mut self) {
        let _ = self.stop.take().expect("not stopped yet").send(());
        let task = self.task.take().expect("not stopped yet");
        tokio::time::timeout(TIMEOUT, task)
            .await
            .expect("operator did not stop in time")
            .expect("operator task panicked")
            .expect("operator returned an error");
    }
}

impl Drop for RunningOperator {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Polls `check` every 100 ms until it returns `Ok`; fails with its last
/// `Err` (a description of what was seen) after [`TIMEOUT`].
pub async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    eventually_within(TIMEOUT, what, check).await
}

/// How long garbage collection may take. kube-controller-manager 1.20's
/// garbage collector learns of a newly installed CRD only at its next
/// discovery resync (every 30 s, not configurable), so on a fresh cluster the
/// first deletions of profiles and reports by ownerReference can wait that long.
pub const GC_TIMEOUT: Duration = Duration::from_secs(120);

/// [`eventually`] with its own timeout.
pub async fn eventually_within<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        match check().await {
            Ok(v) => return v,
            Err(seen) if Instant::now() > deadline => {
                panic!("timed out after {timeout:?} waiting for {what}; last seen: {seen}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Creates a Job; its pods stay Pending (no scheduler, no kubelet).
pub async fn create_job(
    client: &Client,
    ns: &str,
    name: &str,
    parallelism: i32,
    profiled: bool,
) -> Job {
    let mut job = Job {
        spec: Some(JobSpec {
            parallelism: Some(parallelism),
            completions: Some(parallelism),
            template: PodTemplateSpec {
                spec: Some(PodSpec {
                    restart_policy: Some("Never".into()),
                    containers: vec![Container {
                        name: "trainer".into(),
                        image: Some("busybox".into()),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        }),
        ..Default::default()
    };
    job.metadata.name = Some(name.into());
    if profiled {
        job.metadata.annotations = Some(BTreeMap::from([(
            ANNOTATION_ENABLED.to_string(),
            "true".to_string(),
        )]));
        mark_managed(&mut job);
    }
    Api::<Job>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &job)
        .await
        .unwrap_or_else(|e| panic!("creating Job {name}: {e}"))
}

/// Labels `job` and its pod template `memprof.dev/managed=true`, as the
/// webhook stamps a profiled Job (contract D): the operator watches only those.
pub fn mark_managed(job: &mut Job) {
    let managed = BTreeMap::from([(LABEL_MANAGED.to_string(), "true".to_string())]);
    job.metadata.labels = Some(managed.clone());
    if let Some(spec) = job.spec.as_mut() {
        spec.template.metadata = Some(ObjectMeta {
            labels: Some(managed),
            ..Default::default()
        });
    }
}

/// One GPU of a simulated rank.
pub fn gpu(
    rank: u32,
    used_gib: u64,
    peak_gib: u64,
    risk: RiskLevel,
    tto: Option<f64>,
) -> GpuReport {
    GpuReport {
        index: 0,
        uuid: format!("GPU-sim-{rank:04}"),
        model: "NVIDIA H100 80GB HBM3".into(),
        total_bytes: 80 * GIB,
        used_bytes: used_gib * GIB,
        peak_bytes: peak_gib * GIB,
        utilization_percent: Some(90),
        growth_bytes_per_second: if tto.is_some() { 1.0e8 } else { 0.0 },
        time_to_oom_seconds: tto,
        risk,
        confidence: 0.9,
        leak_suspected: tto.is_some(),
        source: memprof::api::DataSource::Sim,
        ..Default::default()
    }
}

/// The MemoryReport a rank's sidecar would write.
pub fn report(job: &str, rank: u32, sampled_at: &str, gpus: Vec<GpuReport>) -> MemoryReport {
    let worst = gpus.iter().map(|g| g.risk).max().unwrap_or_default();
    let mut r = MemoryReport::new(
        &format!("{job}-{rank}"),
        MemoryReportSpec {
            pod_name: format!("{job}-{rank}"),
            node_name: Some(format!("node-{rank}")),
            job_name: Some(job.into()),
            rank: Some(rank),
            sampled_at: sampled_at.into(),
            interval_ms: 1000,
            // Long enough that `at()`'s times in the past are not stale.
            heartbeat_seconds: Some(600),
            summary: ReportSummary {
                gpu_count: gpus.len() as u32,
                risk: worst,
                used: "-".into(),
                peak: "-".into(),
                source: memprof::api::DataSource::Sim,
                ..Default::default()
            },
            gpus,
            ..Default::default()
        },
    );
    r.metadata.labels = Some(BTreeMap::from([
        (LABEL_JOB.to_string(), job.to_string()),
        (LABEL_PROFILE.to_string(), job.to_string()),
    ]));
    r
}

/// Writes a report the way the sidecar does: server-side apply as
/// `memprof-sidecar`, marked as its pod's own write as the webhook marks it
/// (the tests' cluster has no webhook unless a test registers one; see
/// tests/report_trust.rs for the real one), under `ns`'s key.
pub async fn apply_report(client: &Client, ns: &str, report: &MemoryReport) {
    let name = report.name_any();
    let ring = admission_keys(ns).await;
    let mut report = report.clone();
    memprof::api::writer::mark_as_written(&mut report, ring.current().expect("a key"), ns);
    let api = Api::<MemoryReport>::namespaced(client.clone(), ns);
    let params = PatchParams::apply(SIDECAR_MANAGER).force();
    // As the sidecar's writer does, a write RBAC refuses is tried again: the
    // operator grants a Job's service account leave to write its reports when
    // it first sees the Job, which a pod's first write can precede.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        match api.patch(&name, &params, &Patch::Apply(&report)).await {
            Ok(_) => return,
            Err(kube::Error::Api(e))
                if e.code == 403
                    && e.message.contains("cannot patch resource")
                    && std::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(250)).await
            }
            Err(e) => panic!("applying MemoryReport {name}: {e}"),
        }
    }
}

/// RFC 3339 timestamp `offset` seconds after a base an hour before this
/// process started (the operator ignores reports dated in the future, so the
/// base must lie in the past). Whole seconds keep every timestamp the same
/// width, as a sidecar's are.
pub fn at(offset: u64) -> String {
    // Per test, not per process: one test binary runs every module for
    // longer than a base stays fresh (each test runs on a thread of its own).
    thread_local! {
        static BASE: std::cell::OnceCell<i64> = const { std::cell::OnceCell::new() };
    }
    // Ten minutes ago: in the past (the operator refuses reports from the
    // future) and, with the 600 s heartbeat `report` claims, not stale for
    // another ten minutes (stale after 2 heartbeats + 30 s: JobRollup).
    let base = BASE.with(|b| *b.get_or_init(|| jiff::Timestamp::now().as_second() - 600));
    jiff::Timestamp::from_second(base + offset as i64)
        .unwrap()
        .to_string()
}

/// The admission-mark key of `ns` (the Secret `memprof-admission-key` the
/// operator binary reads with `--webhook-namespace ns`), created if missing,
/// read with the test's admin credentials (whatever identity the controller
/// under test runs as). The tests' operators run in the namespace they
/// watch, so it stands in for the operator's namespace.
pub async fn admission_keys(ns: &str) -> KeyRing {
    let client = Client::try_default().await.expect("the test's kubeconfig");
    admission_keys_in(&client, ns).await
}

/// [`admission_keys`] on the cluster `client` talks to (tests/faults.rs runs
/// control planes of its own).
pub async fn admission_keys_in(client: &Client, ns: &str) -> KeyRing {
    let cfg = memprof::webhook::keys::KeyConfig {
        namespace: if ns.is_empty() { "default" } else { ns }.to_string(),
        secret_name: memprof::api::admission::DEFAULT_KEY_SECRET.into(),
        grace: jiff::SignedDuration::from_hours(1),
    };
    memprof::webhook::keys::ensure_keys(client, &cfg)
        .await
        .unwrap_or_else(|e| panic!("the admission key of {ns}: {e}"))
}

/// Marks `pod` as the webhook marks a pod the Job controller created (the
/// tests' cluster has no webhook unless a test registers one): the mark
/// under `ns`'s key, issued at the pod's creation. tests/pod_trust.rs runs
/// the real webhook instead, and pods nobody marks.
pub async fn mark_as_admitted(pod: &Pod) -> Pod {
    let admin = Client::try_default().await.expect("the test's kubeconfig");
    mark_as_admitted_in(&admin, pod).await
}

/// [`mark_as_admitted`] on the cluster `admin` talks to, as that identity.
pub async fn mark_as_admitted_in(admin: &Client, pod: &Pod) -> Pod {
    use memprof::api::admission::{sign, Subject, ANNOTATION_ADMISSION};
    let ns = pod.namespace().unwrap_or_default();
    let Some(job_uid) = pod
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true))
    else {
        return pod.clone();
    };
    let ring = admission_keys_in(admin, &ns).await;
    let subject = Subject {
        namespace: &ns,
        pod: &pod.name_any(),
        job_uid: &job_uid.uid,
    };
    let created = pod.creation_timestamp().expect("a created pod").0;
    let mark = sign(ring.current().expect("a key"), &subject, created);
    if pod.annotations().get(ANNOTATION_ADMISSION) == Some(&mark) {
        return pod.clone();
    }
    let patch = serde_json::json!({"metadata": {"annotations": {ANNOTATION_ADMISSION: mark}}});
    // As the webhook would, whoever the test's `client` is.
    Api::<Pod>::namespaced(admin.clone(), &ns)
        .patch(
            &pod.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .unwrap_or_else(|e| panic!("marking pod {}: {e}", pod.name_any()))
}

/// The pods the Job controller made for the current Job `job` (by its uid),
/// sorted by name, marked as admitted ([`mark_as_admitted`]); waits until
/// there are at least `n`.
pub async fn job_pods(client: &Client, ns: &str, job: &str, n: usize) -> Vec<Pod> {
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pods = eventually(&format!("{n} pod(s) of Job {job}"), || async {
        let uid = jobs
            .get_opt(job)
            .await
            .map_err(|e| e.to_string())?
            .and_then(|j| j.uid())
            .ok_or("no such Job")?;
        let mut list: Vec<Pod> = api
            .list(&ListParams::default().labels(&format!("controller-uid={uid}")))
            .await
            .map_err(|e| e.to_string())?
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        list.sort_by_key(|p| p.name_any());
        if list.len() >= n {
            Ok(list)
        } else {
            Err(format!("{} pod(s)", list.len()))
        }
    })
    .await;
    let mut marked = Vec::with_capacity(pods.len());
    for p in &pods {
        marked.push(mark_as_admitted(p).await);
    }
    marked
}

/// The report the sidecar of `pod` writes: named after the pod, owned by it.
pub fn pod_report(
    pod: &Pod,
    job: &str,
    rank: u32,
    sampled_at: &str,
    gpus: Vec<GpuReport>,
) -> MemoryReport {
    let mut r = report(job, rank, sampled_at, gpus);
    let name = pod.name_any();
    r.metadata.name = Some(name.clone());
    r.spec.pod_name = name.clone();
    r.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name,
        uid: pod.uid().unwrap_or_default(),
        ..Default::default()
    }]);
    r
}

/// The genuine report of rank `rank` of Job `job`: the rank-th of its pods
/// (by name) reporting, as its sidecar would.
pub async fn rank_report(
    client: &Client,
    ns: &str,
    job: &str,
    rank: u32,
    sampled_at: &str,
    gpus: Vec<GpuReport>,
) -> MemoryReport {
    // All of the Job's pods first: ranks follow name order, which must not
    // shift as late pods appear.
    let parallelism = Api::<Job>::namespaced(client.clone(), ns)
        .get(job)
        .await
        .ok()
        .and_then(|j| j.spec?.parallelism)
        .unwrap_or(1)
        .max(rank as i32 + 1) as usize;
    let pods = job_pods(client, ns, job, parallelism).await;
    pod_report(&pods[rank as usize], job, rank, sampled_at, gpus)
}

/// The Events in `ns` with `reason`.
async fn events_with(client: &Client, ns: &str, reason: &str) -> Vec<Event> {
    Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .expect("listing events")
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect()
}

/// Whether `event` regards the object `name`.
fn regards(event: &Event, name: &str) -> bool {
    event.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
}

/// Events with `reason` regarding the object `name`, counting repeats of a series.
pub async fn count_events(client: &Client, ns: &str, reason: &str, regarding: &str) -> i32 {
    events_with(client, ns, reason)
        .await
        .iter()
        .filter(|e| regards(e, regarding))
        .map(|e| e.series.as_ref().map_or(1, |s| s.count))
        .sum()
}

/// The first Event with `reason` in `ns`, once exactly one (a series
/// counting its repeats) regards the object `regarding`.
pub async fn the_one_event(client: &Client, ns: &str, reason: &str, regarding: &str) -> Event {
    eventually(&format!("one {reason} Event on {regarding}"), || async {
        match count_events(client, ns, reason, regarding).await {
            1 => Ok(()),
            n => Err(format!("{n} event(s)")),
        }
    })
    .await;
    let first = events_with(client, ns, reason).await.into_iter().next();
    first.unwrap_or_else(|| panic!("no {reason} Event in {ns}"))
}

/// The notes of Events with `reason` regarding the object `name`.
pub async fn event_notes(client: &Client, ns: &str, reason: &str, regarding: &str) -> Vec<String> {
    events_with(client, ns, reason)
        .await
        .into_iter()
        .filter(|e| regards(e, regarding))
        .filter_map(|e| e.note)
        .collect()
}

/// `memprof-sidecar`, a binary of another package of the workspace:
/// `MEMPROF_SIDECAR_BIN`, else next to `memprof` (hack/test.sh builds the
/// workspace first).
pub fn sidecar_binary() -> std::path::PathBuf {
    if let Ok(p) = std::env::var("MEMPROF_SIDECAR_BIN") {
        return p.into();
    }
    let p = std::path::Path::new(env!("CARGO_BIN_EXE_memprof")).with_file_name("memprof-sidecar");
    assert!(
        p.exists(),
        "{} is missing: run `cargo build -p memprof-sidecar` first (or set MEMPROF_SIDECAR_BIN)",
        p.display()
    );
    p
}

/// A sidecar's agent socket in a directory of its own (mode 0700, like the
/// pod's private emptyDir), removed with the directory when dropped.
pub struct AgentSocket(std::path::PathBuf);

impl AgentSocket {
    /// A new private directory under the temp dir.
    pub fn new() -> AgentSocket {
        use std::os::unix::fs::DirBuilderExt;
        let dir = std::env::temp_dir().join(format!("memprof-sock-{}", random_suffix()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .expect("a private directory for the agent socket");
        AgentSocket(dir)
    }

    /// The socket's path (what `--agent-socket` / `MEMPROF_AGENT_SOCKET` take).
    pub fn path(&self) -> std::path::PathBuf {
        self.0.join("agent.sock")
    }
}

impl Drop for AgentSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One HTTP/1.1 request over a Unix socket (the sidecar's agent socket):
/// the status (0 when nothing answers) and the whole response.
pub async fn socket_request(
    socket: &std::path::Path,
    method: &str,
    path: &str,
    body: &str,
) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut s) = tokio::net::UnixStream::connect(socket).await else {
        return (0, String::new());
    };
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    if s.write_all(req.as_bytes()).await.is_err() {
        return (0, String::new());
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out).await;
    let code = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, out)
}

/// A kubeconfig for the pod `pod` (uid `uid`) of `ns`: the test cluster's,
/// with its user replaced by a token of the namespace's `default` service
/// account bound to that pod (TokenRequest), as a kubelet mounts one. The
/// API server then names the pod in every request it authenticates with it
/// (`userInfo.extra`), which the webhook turns into a report's writer mark.
/// The file is the caller's to remove.
pub async fn kubeconfig_bound_to(
    admin: &Client,
    ns: &str,
    pod: &str,
    uid: &str,
) -> std::path::PathBuf {
    let base = std::env::var("KUBECONFIG").expect("KUBECONFIG");
    kubeconfig_bound_to_in(std::path::Path::new(&base), admin, ns, pod, uid).await
}

/// [`kubeconfig_bound_to`] for the cluster of kubeconfig `base`
/// (tests/faults.rs runs control planes of its own).
pub async fn kubeconfig_bound_to_in(
    base: &std::path::Path,
    admin: &Client,
    ns: &str,
    pod: &str,
    uid: &str,
) -> std::path::PathBuf {
    use k8s_openapi::api::authentication::v1::{
        BoundObjectReference, TokenRequest, TokenRequestSpec,
    };
    use k8s_openapi::api::core::v1::ServiceAccount;
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(pod.into()),
                uid: Some(uid.into()),
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let token = eventually("a token bound to the pod", || async {
        Api::<ServiceAccount>::namespaced(admin.clone(), ns)
            .create_token_request("default", &PostParams::default(), &request)
            .await
            .map_err(|e| e.to_string())?
            .status
            .map(|s| s.token)
            .ok_or_else(|| "no token in the answer".to_string())
    })
    .await;
    let mut cfg: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(base).unwrap()).unwrap();
    for u in cfg["users"].as_sequence_mut().unwrap() {
        // Only the token: a client certificate beside it would authenticate first.
        u["user"] = serde_yaml::to_value(BTreeMap::from([("token", token.clone())])).unwrap();
    }
    let out = std::env::temp_dir().join(format!("memprof-kubeconfig-{}", random_suffix()));
    std::fs::write(&out, serde_yaml::to_string(&cfg).unwrap()).unwrap();
    out
}

/// A client acting as pod `pod` (uid `uid`) of `ns`: a token bound to the
/// pod ([`kubeconfig_bound_to`]), as its sidecar has.
pub async fn client_as_pod(admin: &Client, ns: &str, pod: &str, uid: &str) -> Client {
    let path = kubeconfig_bound_to(admin, ns, pod, uid).await;
    let kc = kube::config::Kubeconfig::read_from(&path).expect("the pod's kubeconfig");
    let _ = std::fs::remove_file(&path);
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("a config from the pod's kubeconfig");
    Client::try_from(cfg).expect("a client as the pod")
}
