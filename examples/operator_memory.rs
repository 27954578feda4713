//! Memory benchmark of the operator against hostile metadata (not a timed
//! test): the release `memprof-operator` run as a child
//! process watches `--objects` profiled Jobs and as many pods labelled with
//! their names, all labelled `memprof.dev/managed=true` (a tenant can set
//! that label: it is a filter for cost, not proof), first plain, then each
//! carrying ~250 KiB of tenant metadata (labels, and annotations with
//! `memprof.dev/*` keys among them). Prints the operator's RSS after each
//! set is in its caches, and the difference (goal: hostile within 16 MiB of
//! plain).
//!
//! ```text
//! eval "$(bash hack/local-cluster.sh env)"; export KUBECONFIG
//! cargo build --release --bin memprof-operator --example operator_memory
//! target/release/examples/operator_memory --objects 1000
//! ```
//!
//! With `--reports N` it measures refused reports instead:
//! N small MemoryReports that no pod wrote (no writer mark), then N of the
//! largest the CRD admits, all claiming one profiled Job; RSS after each set
//! is in the cache, and again after a restart of the operator with them in
//! place (goal: maximal within 16 MiB of small).

#[allow(dead_code)] // the operator child and its /proc numbers only
mod scale_support;
use scale_support::{measure, setup};

use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, PostParams};
use kube::Client;
use memprof::api::MemoryProfile;
use serde_json::{json, Map, Value};
use std::time::{Duration, Instant};

/// Goal: hostile objects cost at most this much more operator RSS than plain ones.
const GOAL_DELTA_KIB: i64 = 16 * 1024;

#[derive(Debug, Parser)]
struct Args {
    /// Jobs, and pods, of each set.
    #[arg(long, default_value_t = 1000)]
    objects: usize,
    /// Measure this many refused reports (small, then maximal) instead of Jobs.
    #[arg(long)]
    reports: Option<usize>,
    /// The operator binary; default: `memprof-operator` next to this example's directory.
    #[arg(long)]
    operator_bin: Option<std::path::PathBuf>,
}

/// ~125 KiB of labels: 1,000 keys with 63-character values, memprof.dev/* among them.
fn hostile_labels() -> Map<String, Value> {
    (0..1000)
        .map(|i| {
            let prefix = if i % 2 == 0 {
                "memprof.dev"
            } else {
                "team.example"
            };
            (format!("{prefix}/l{i:04}"), json!("v".repeat(63)))
        })
        .collect()
}

/// ~125 KiB of annotations (the API server allows 256 KiB in all),
/// memprof.dev/* keys among them, one of them a key memprof reads.
fn hostile_annotations() -> Map<String, Value> {
    let mut m: Map<String, Value> = (0..60)
        .map(|i| {
            let prefix = if i % 2 == 0 {
                "memprof.dev"
            } else {
                "note.example"
            };
            (format!("{prefix}/a{i:02}"), json!("a".repeat(2048)))
        })
        .collect();
    m.insert("memprof.dev/thresholds".into(), json!("t".repeat(4096)));
    m
}

fn metadata(name: &str, hostile: bool, labels: Map<String, Value>) -> Value {
    let (mut l, mut a) = if hostile {
        (hostile_labels(), hostile_annotations())
    } else {
        (Map::new(), Map::new())
    };
    l.extend(labels);
    l.insert("memprof.dev/managed".into(), json!("true"));
    a.insert("memprof.dev/enabled".into(), json!("true"));
    json!({"name": name, "labels": l, "annotations": a})
}

/// A profiled Job whose pods the Job controller cannot create (its
/// ServiceAccount does not exist): only the benchmark's pods name it.
fn job(name: &str, hostile: bool) -> Job {
    serde_json::from_value(json!({
        "metadata": metadata(name, hostile, Map::new()),
        "spec": {"parallelism": 1, "completions": 1, "template": {"spec": {
            "serviceAccountName": "memprof-bench-no-such-sa", "restartPolicy": "Never",
            "containers": [{"name": "trainer", "image": "trainer:bench"}]}}},
    }))
    .expect("a valid Job")
}

fn pod(name: &str, job: &str, hostile: bool) -> Pod {
    let labels = Map::from_iter([("job-name".to_string(), json!(job))]);
    serde_json::from_value(json!({
        "metadata": metadata(name, hostile, labels),
        // No token: the pods never run, and a namespace's default
        // ServiceAccount gets its token a moment after it appears, so pods
        // created right away would be refused (1.20 "No API token found").
        "spec": {"automountServiceAccountToken": false,
                 "containers": [{"name": "trainer", "image": "trainer:bench"}]},
    }))
    .expect("a valid Pod")
}

/// Creates the set in `ns`, 16 requests in flight.
async fn create(client: &Client, ns: &str, n: usize, hostile: bool) -> anyhow::Result<()> {
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    futures::stream::iter(0..n)
        .map(|i| {
            let (jobs, pods) = (jobs.clone(), pods.clone());
            async move {
                let name = format!("job-{i:05}");
                jobs.create(&PostParams::default(), &job(&name, hostile))
                    .await?;
                let p = pod(&format!("{name}-0"), &name, hostile);
                pods.create(&PostParams::default(), &p).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(())
}

/// Runs one set: the operator's RSS (KiB) once it made every Job's profile.
async fn one(
    client: &Client,
    bin: &std::path::Path,
    n: usize,
    hostile: bool,
) -> anyhow::Result<u64> {
    let ns = format!(
        "memprof-mem-{}-{}",
        std::process::id(),
        if hostile { "h" } else { "p" }
    );
    setup::create_namespace(client, &ns).await?;
    let op = setup::Operator::start(bin, &ns, &[])?;
    let result = async {
        let t = Instant::now();
        create(client, &ns, n, hostile).await?;
        let created = t.elapsed().as_secs_f64();
        let profiles: Api<MemoryProfile> = Api::namespaced(client.clone(), &ns);
        while profiles.list_metadata(&Default::default()).await?.items.len() < n {
            anyhow::ensure!(t.elapsed() < Duration::from_secs(600), "profiles not all made in 600 s");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        // Let the watches settle (pods, profiles' first statuses) before reading.
        tokio::time::sleep(Duration::from_secs(10)).await;
        let u = measure::proc_usage(&op.pid.to_string());
        println!(
            "  {:>7}: {n} Jobs + {n} pods created in {created:.0} s; operator RSS {:.1} MiB (peak {:.1} MiB)",
            if hostile { "hostile" } else { "plain" },
            u.rss_kib as f64 / 1024.0,
            u.hwm_kib as f64 / 1024.0
        );
        anyhow::Ok(u.rss_kib)
    }
    .await;
    op.stop().await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces.delete(&ns, &DeleteParams::background()).await?;
    result
}

/// The largest report the CRD admits, near enough: 16 GPUs, each with both
/// timelines full and its strings at their bounds; or a small one. Named
/// `name`, claiming Job `job`, with no writer mark (no pod vouches for it).
fn report(name: &str, job: &str, maximal: bool) -> memprof::api::MemoryReport {
    use memprof::api::{GpuReport, MemoryReportSpec, TimelinePoint, MAX_TIMELINE_POINTS};
    let points: Vec<TimelinePoint> = (0..MAX_TIMELINE_POINTS)
        .map(|i| TimelinePoint {
            t: 100_000_000_000 + i as i64,
            max: 999_999_000 + i as u64,
            min: 899_999_000 + i as u64,
        })
        .collect();
    let gpu = |i: u32| GpuReport {
        index: i,
        uuid: format!("GPU-{i:02}-{}", "u".repeat(88)),
        model: "M".repeat(96),
        total_bytes: 85_000_000_000,
        used_bytes: 1,
        peak_bytes: 1,
        timeline: points.clone(),
        legacy_timeline: points.clone(),
        ..Default::default()
    };
    let gpus = if maximal {
        (0..16).map(gpu).collect()
    } else {
        vec![]
    };
    let mut r = memprof::api::MemoryReport::new(
        name,
        MemoryReportSpec {
            pod_name: name.into(),
            sampled_at: "2027-01-15T08:00:00Z".into(),
            interval_ms: 1000,
            summary: memprof::api::ReportSummary {
                used: "1Gi".into(),
                peak: "1Gi".into(),
                ..Default::default()
            },
            gpus,
            ..Default::default()
        },
    );
    r.metadata.labels = Some([(memprof::api::LABEL_JOB.to_string(), job.to_string())].into());
    r
}

/// Creates `n` refused reports claiming Job `job-00000` in `ns`, 16 in flight.
async fn create_reports(
    client: &Client,
    ns: &str,
    n: usize,
    maximal: bool,
) -> anyhow::Result<usize> {
    let api: Api<memprof::api::MemoryReport> = Api::namespaced(client.clone(), ns);
    let bytes = serde_json::to_vec(&report("x", "job-00000", maximal))?.len();
    futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                let r = report(&format!("r-{i:05}"), "job-00000", maximal);
                api.create(&PostParams::default(), &r).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(bytes)
}

/// One set of refused reports: the operator's RSS (KiB) with them cached,
/// then after a restart with them in place.
async fn one_reports(
    client: &Client,
    bin: &std::path::Path,
    n: usize,
    maximal: bool,
) -> anyhow::Result<(u64, u64)> {
    let ns = format!(
        "memprof-rmem-{}-{}",
        std::process::id(),
        if maximal { "max" } else { "small" }
    );
    setup::create_namespace(client, &ns).await?;
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    jobs.create(&PostParams::default(), &job("job-00000", false))
        .await?;
    let op = setup::Operator::start(bin, &ns, &[])?;
    let result = async {
        let t = Instant::now();
        let bytes = create_reports(client, &ns, n, maximal).await?;
        let created = t.elapsed().as_secs_f64();
        tokio::time::sleep(Duration::from_secs(15)).await;
        let live = measure::proc_usage(&op.pid.to_string());
        anyhow::Ok((bytes, created, live))
    }
    .await;
    op.stop().await;
    let (bytes, created, live) = result?;
    // A restart lists them all at once: the peak that matters at a rollout.
    let op = setup::Operator::start(bin, &ns, &[])?;
    tokio::time::sleep(Duration::from_secs(20)).await;
    let restarted = measure::proc_usage(&op.pid.to_string());
    op.stop().await;
    println!(
        "  {:>7}: {n} reports of {:.1} KiB each created in {created:.0} s; operator RSS {:.1} MiB \
         (peak {:.1}); after a restart {:.1} MiB (peak {:.1})",
        if maximal { "maximal" } else { "small" },
        bytes as f64 / 1024.0,
        live.rss_kib as f64 / 1024.0,
        live.hwm_kib as f64 / 1024.0,
        restarted.rss_kib as f64 / 1024.0,
        restarted.hwm_kib as f64 / 1024.0,
    );
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces.delete(&ns, &DeleteParams::background()).await?;
    Ok((live.rss_kib, restarted.hwm_kib))
}

/// The refused-reports comparison (`--reports`).
async fn reports(client: &Client, bin: &std::path::Path, n: usize) -> anyhow::Result<()> {
    println!("operator_memory --reports: {n} refused reports, small then maximal");
    let small = one_reports(client, bin, n, false).await?;
    let maximal = one_reports(client, bin, n, true).await?;
    for (what, a, b) in [
        ("cached", small.0, maximal.0),
        ("restart peak", small.1, maximal.1),
    ] {
        let delta = b as i64 - a as i64;
        let verdict = if delta <= GOAL_DELTA_KIB {
            "met"
        } else {
            "MISSED"
        };
        println!(
            "  {what}: maximal - small {:+.1} MiB (goal: within 16 MiB: {verdict})",
            delta as f64 / 1024.0
        );
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let client = Client::try_default().await?;
    setup::install_crds(&client).await?;
    let bin = match &args.operator_bin {
        Some(b) => b.clone(),
        None => {
            let exe = std::env::current_exe()?;
            let target = exe.parent().and_then(|p| p.parent());
            target
                .map(|t| t.join("memprof-operator"))
                .ok_or_else(|| anyhow::anyhow!("no target dir"))?
        }
    };
    if let Some(n) = args.reports {
        return reports(&client, &bin, n).await;
    }
    println!(
        "operator_memory: {} Jobs and {} pods, plain then hostile (~250 KiB of metadata each)",
        args.objects, args.objects
    );
    let plain = one(&client, &bin, args.objects, false).await?;
    let hostile = one(&client, &bin, args.objects, true).await?;
    let delta = hostile as i64 - plain as i64;
    let verdict = if delta <= GOAL_DELTA_KIB {
        "met"
    } else {
        "MISSED"
    };
    println!(
        "  hostile - plain: {:+.1} MiB (goal: within 16 MiB: {verdict})",
        delta as f64 / 1024.0
    );
    Ok(())
}
