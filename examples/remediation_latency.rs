//! How long from a rank's critical MemoryReport to the Job existing again
//! with the smaller batch size: the operator's roll-up, the remediation
//! controller's decision, the Pending record, the plan ConfigMap, the
//! orphaning delete (garbage collector included) and the create.
//!
//!     eval "$(bash hack/local-cluster.sh env)"
//!     cargo run --release --example remediation_latency -- 20 [SETTLE_MS]
//!
//!     cargo run --release --example remediation_latency -- 20 0 [HOSTILE_JOBS]
//!
//! With a third argument the operator watches every namespace, and a
//! hostile tenant runs beside the timed one in a namespace of its own
//!: `HOSTILE_JOBS` profiled Jobs that run nothing
//! (parallelism 0) and a policy firing at risk `none` with no cooldown,
//! rewritten every 2 s. `0` is the baseline with the same operator. The API
//! server's own read latency (a GET of the timed namespace's Jobs, twice a
//! second) is printed beside the remediations'.
//!
//! `SETTLE_MS` (default 0) waits that long between the profile's first
//! status and the critical report: 1100 lets the operator's per-Job write
//! spacing (`--min-write-interval-ms`, 1 s) pass before the report, so the
//! roll-up's write of the critical status goes at once (the remediation's
//! Pending record, a status write too, still keeps the spacing).
//!
//! Runs the operator (roll-up and remediation, one controller) in-process against the
//! cluster in KUBECONFIG, in a temporary namespace it deletes afterwards.
//! Each Job's rank 0 is a real pod, made and marked as in `operator_scale`
//! (`scale_support/setup.rs`): the operator counts only reports of pods
//! the Job controls and the webhook admitted.
//! Time is measured on this machine's monotonic clock, from just before the
//! report's server-side apply to the watch event of the new Job (so it
//! includes the watch latency of both ends).

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, ResourceExt};
use memprof::api::admission::LABEL_MANAGED;
use memprof::api::{
    DataSource, GpuReport, MemoryProfile, MemoryReport, MemoryReportSpec, ReportSummary, RiskLevel,
    LABEL_JOB, LABEL_PROFILE, SIDECAR_MANAGER,
};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

#[allow(dead_code)] // the set-up helpers only, not the operator child
mod scale_support;
use scale_support::setup;

const GIB: u64 = 1 << 30;

/// The report of Job `job`'s rank 0, owned by its pod (`pod_uid`) as a
/// sidecar's is.
fn report(job: &str, pod_uid: &str, risk: RiskLevel, used_gib: u64, seq: u64) -> MemoryReport {
    let sampled_at =
        (jiff::Timestamp::now() + jiff::SignedDuration::from_millis(seq as i64)).to_string();
    let mut r = MemoryReport::new(
        &format!("{job}-0"),
        MemoryReportSpec {
            pod_name: format!("{job}-0"),
            job_name: Some(job.into()),
            rank: Some(0),
            sampled_at,
            interval_ms: 1000,
            summary: ReportSummary {
                gpu_count: 1,
                risk,
                used: format!("{used_gib}GiB"),
                peak: format!("{used_gib}GiB"),
                source: DataSource::Sim,
                ..Default::default()
            },
            gpus: vec![GpuReport {
                uuid: "GPU-bench-0".into(),
                model: "sim".into(),
                total_bytes: 80 * GIB,
                used_bytes: used_gib * GIB,
                peak_bytes: used_gib * GIB,
                risk,
                time_to_oom_seconds: (risk == RiskLevel::Critical).then_some(5.0),
                confidence: 0.9,
                source: DataSource::Sim,
                ..Default::default()
            }],
            ..Default::default()
        },
    );
    r.metadata.labels = Some(BTreeMap::from([
        (LABEL_JOB.to_string(), job.to_string()),
        (LABEL_PROFILE.to_string(), job.to_string()),
    ]));
    r.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: format!("{job}-0"),
        uid: pod_uid.into(),
        ..Default::default()
    }]);
    r
}

/// Writes `r` as its pod's sidecar does, marked as the webhook marks such a
/// write (one HMAC and one SHA-256, microseconds, inside the timed span).
async fn apply_report(
    client: &Client,
    ns: &str,
    r: &MemoryReport,
    key: &memprof::api::admission::Key,
) -> anyhow::Result<()> {
    let mut r = r.clone();
    memprof::api::writer::mark_as_written(&mut r, key, ns);
    Api::<MemoryReport>::namespaced(client.clone(), ns)
        .patch(
            &r.name_any(),
            &PatchParams::apply(SIDECAR_MANAGER).force(),
            &Patch::Apply(&r),
        )
        .await?;
    Ok(())
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let runs: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(10);
    let settle: u64 = std::env::args()
        .nth(2)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(0);
    let hostile: Option<usize> = std::env::args().nth(3).map(|s| s.parse()).transpose()?;
    let client = Client::try_default().await?;
    setup::install_crds(&client).await?;
    let ns = format!("memprof-bench-{}", std::process::id());
    // Waits for the default ServiceAccount: rank 0's pod runs as it.
    setup::create_namespace(&client, &ns).await?;
    let tenant = format!("{ns}-hostile");
    if hostile.is_some() {
        setup::create_namespace(&client, &tenant).await?;
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let result = bench(
        &client,
        &ns,
        runs,
        Duration::from_millis(settle),
        hostile.map(|n| (tenant.as_str(), n)),
    )
    .await;
    namespaces.delete(&ns, &DeleteParams::background()).await?;
    if hostile.is_some() {
        namespaces
            .delete(&tenant, &DeleteParams::background())
            .await?;
    }
    result
}

/// The hostile tenant of `ns`: `jobs` profiled Jobs that run nothing, and
/// a policy at risk `none` with no cooldown, rewritten every 2 s until `stop`.
async fn hostile_tenant(
    client: Client,
    ns: String,
    jobs: usize,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let api: Api<Job> = Api::namespaced(client.clone(), &ns);
    for i in 0..jobs {
        let job: Job = serde_json::from_value(json!({
            "metadata": {"name": format!("idle-{i}"), "labels": {(LABEL_MANAGED): "true"},
                         "annotations": {"memprof.dev/enabled": "true"}},
            "spec": {"parallelism": 0, "template": {"spec": {"restartPolicy": "Never", "containers": [
                {"name": "trainer", "image": "busybox", "env": [{"name": "BATCH_SIZE", "value": "32"}]}]}}},
        }))?;
        api.create(&PostParams::default(), &job).await?;
    }
    let policies = Api::<memprof::api::RemediationPolicy>::namespaced(client, &ns);
    for generation in 0u32.. {
        let policy = json!({
            "apiVersion": "memprof.dev/v1alpha1", "kind": "RemediationPolicy",
            "metadata": {"name": "any"},
            "spec": {"selector": {}, "triggers": [{"riskAtLeast": {"level": "none"}}],
                     "actions": [{"scaleBatch": {"env": "BATCH_SIZE", "factor": 0.5}}],
                     "cooldownSeconds": 0, "maxRemediations": 1 + generation % 90},
        });
        policies
            .patch(
                "any",
                &PatchParams::apply("memprof-bench"),
                &Patch::Apply(&policy),
            )
            .await?;
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return Ok(()),
            () = tokio::time::sleep(Duration::from_secs(2)) => {}
        }
    }
    Ok(())
}

/// The API server's own read latency: a GET of `ns`'s Jobs twice a second
/// until `stop`; the sorted samples.
async fn read_latency(
    client: Client,
    ns: String,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Vec<Duration> {
    let api: Api<Job> = Api::namespaced(client, &ns);
    let mut samples = Vec::new();
    loop {
        let t = Instant::now();
        if api.list(&Default::default()).await.is_ok() {
            samples.push(t.elapsed());
        }
        tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            () = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
    samples.sort();
    samples
}

/// New Jobs as a watch sees them: (name, uid, when).
type Seen = mpsc::UnboundedReceiver<(String, String, Instant)>;

async fn bench(
    client: &Client,
    ns: &str,
    runs: usize,
    settle: Duration,
    hostile: Option<(&str, usize)>,
) -> anyhow::Result<()> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let ring = setup::admission_key(client, ns).await?;
    let key = ring.current().expect("ensure_keys returns a key").clone();
    // Beside a tenant, the operator watches every namespace (baseline too).
    let watched = if hostile.is_some() { "" } else { ns };
    let operator = spawn_operator(client, watched, ns, ring, stop_rx.clone());
    let tenant = hostile.map(|(t, n)| {
        tokio::spawn(hostile_tenant(
            client.clone(),
            t.to_string(),
            n,
            stop_rx.clone(),
        ))
    });
    let reads = tokio::spawn(read_latency(client.clone(), ns.to_string(), stop_rx));
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    let (watch, mut seen) = watch_new_jobs(jobs.clone());
    apply_policy(client, ns).await?;
    let mut latencies = Vec::with_capacity(runs);
    for i in 0..runs {
        let name = format!("bench-{i}");
        let latency = one_run(client, ns, &jobs, &mut seen, &name, &key, settle).await?;
        println!("run {i:>3}: {:>7.1} ms", latency.as_secs_f64() * 1e3);
        latencies.push(latency);
    }
    print_summary(&mut latencies);
    let _ = stop_tx.send(true);
    let reads = reads.await?;
    if let Some(t) = tenant {
        t.await??;
    }
    if !reads.is_empty() {
        println!(
            "API server read latency (GET Jobs, {} samples): p50 {:.1} ms, p90 {:.1} ms",
            reads.len(),
            percentile(&reads, 0.5).as_secs_f64() * 1e3,
            percentile(&reads, 0.9).as_secs_f64() * 1e3
        );
    }
    watch.abort();
    let _ = operator.await;
    Ok(())
}

/// The operator in-process (roll-up and remediation), watching `ns` (all
/// namespaces when empty), its plans in `plans`, until `stop`.
fn spawn_operator(
    client: &Client,
    ns: &str,
    plans: &str,
    ring: memprof::api::admission::KeyRing,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<memprof::operator::Result<()>> {
    let client = client.clone();
    let mut setup = memprof::pipeline::Setup::for_namespace(ns);
    setup.remediation.plan_namespace = Some(plans.to_string());
    setup.options.admission.set(ring);
    let stop = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    tokio::spawn(async move { memprof::pipeline::run(client, setup, stop).await })
}

/// Watches the Jobs of `jobs`: each applied Job's name, uid and arrival.
fn watch_new_jobs(jobs: Api<Job>) -> (tokio::task::JoinHandle<()>, Seen) {
    let (seen_tx, seen) = mpsc::unbounded_channel();
    let watch = tokio::spawn(
        watcher(jobs, watcher::Config::default())
            .applied_objects()
            .for_each(move |j| {
                if let Ok(j) = j {
                    let _ =
                        seen_tx.send((j.name_any(), j.uid().unwrap_or_default(), Instant::now()));
                }
                futures::future::ready(())
            }),
    );
    (watch, seen)
}

/// The policy every run triggers: critical risk → batch size × 0.75.
async fn apply_policy(client: &Client, ns: &str) -> anyhow::Result<()> {
    let policy = json!({
        "apiVersion": "memprof.dev/v1alpha1", "kind": "RemediationPolicy",
        "metadata": {"name": "shrink"},
        "spec": {
            "selector": {"matchLabels": {"bench": "remediation"}},
            "triggers": [{"riskAtLeast": {"level": "critical"}}],
            "actions": [{"scaleBatch": {"env": "BATCH_SIZE", "factor": 0.75}}],
        },
    });
    Api::<memprof::api::RemediationPolicy>::namespaced(client.clone(), ns)
        .patch(
            "shrink",
            &PatchParams::apply("memprof-bench"),
            &Patch::Apply(&policy),
        )
        .await?;
    Ok(())
}

/// One Job: created, its first status awaited (not timed), then a critical
/// report; the time from that report to the recreated Job's arrival.
async fn one_run(
    client: &Client,
    ns: &str,
    jobs: &Api<Job>,
    seen: &mut Seen,
    name: &str,
    key: &memprof::api::admission::Key,
    settle: Duration,
) -> anyhow::Result<Duration> {
    // Managed as the webhook stamps a profiled Job; the template names a
    // ServiceAccount that does not exist, so the Job controller makes no
    // pods of its own (scale_support/setup.rs) and rank 0 is ours.
    let job: Job = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"bench": "remediation", (LABEL_MANAGED): "true"},
                     "annotations": {"memprof.dev/enabled": "true"}},
        "spec": {"template": {"spec": {"restartPolicy": "Never",
                                       "serviceAccountName": setup::MISSING_SERVICE_ACCOUNT, "containers": [
            {"name": "trainer", "image": "busybox", "env": [{"name": "BATCH_SIZE", "value": "32"}]}
        ]}}},
    }))?;
    let old_uid = jobs
        .create(&PostParams::default(), &job)
        .await?
        .uid()
        .unwrap_or_default();
    let pod = setup::rank_pod(ns, &format!("{name}-0"), name, &old_uid, key);
    let pod_uid = Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await?
        .uid()
        .unwrap_or_default();
    let low = report(name, &pod_uid, RiskLevel::Low, 30, 0);
    apply_report(client, ns, &low, key).await?;
    wait_first_status(&Api::namespaced(client.clone(), ns), name).await?;
    tokio::time::sleep(settle).await;
    let start = Instant::now();
    let critical = report(name, &pod_uid, RiskLevel::Critical, 79, 1);
    apply_report(client, ns, &critical, key).await?;
    loop {
        let (n, uid, at) = tokio::time::timeout(Duration::from_secs(60), seen.recv())
            .await?
            .ok_or_else(|| anyhow::anyhow!("the Job watch ended"))?;
        if n == name && uid != old_uid && at >= start {
            return Ok(at - start);
        }
    }
}

/// Waits for the operator's first status, so only the remediation path is timed.
async fn wait_first_status(profiles: &Api<MemoryProfile>, name: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while profiles
        .get_opt(name)
        .await?
        .and_then(|p| p.status)
        .is_none()
    {
        anyhow::ensure!(
            Instant::now() < deadline,
            "no MemoryProfile status for {name}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

fn print_summary(latencies: &mut [Duration]) {
    latencies.sort();
    let mean = latencies.iter().sum::<Duration>() / latencies.len().max(1) as u32;
    println!(
        "report -> recreated Job over {} runs: p50 {:.1} ms, p90 {:.1} ms, max {:.1} ms, mean {:.1} ms",
        latencies.len(),
        percentile(latencies, 0.5).as_secs_f64() * 1e3,
        percentile(latencies, 0.9).as_secs_f64() * 1e3,
        latencies.last().copied().unwrap_or_default().as_secs_f64() * 1e3,
        mean.as_secs_f64() * 1e3,
    );
}
