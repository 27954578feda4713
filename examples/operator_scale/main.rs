//! Scale benchmark of the operator against the local control plane (not a
//! timed test): one Job with `--ranks` pods, one MemoryReport per rank, then
//! rounds of report updates. Measures report write → profile status shows it
//! (through a watch on the profile), the status size, and the operator's RSS
//! and CPU time, read from /proc of the operator run as a child process.
//!
//! ```text
//! eval "$(bash hack/local-cluster.sh env)"
//! cargo build --release --bin memprof-operator --example operator_scale
//! target/release/examples/operator_scale --ranks 256 --rounds 5
//! ```
//!
//! Reports are written one after another, so the API server's order is the
//! write order: when the status shows report i's `sampledAt` (the newest of
//! all), every earlier report is in the roll-up too.

use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{Container, Namespace, PodSpec, PodTemplateSpec};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, ResourceExt};
use memprof::api::*;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const GIB: u64 = 1 << 30;

#[derive(Debug, Parser)]
struct Args {
    /// Ranks (Job parallelism), one GPU and one MemoryReport each.
    #[arg(long, default_value_t = 256)]
    ranks: u32,
    /// Rounds in which every rank's report is rewritten back to back.
    #[arg(long, default_value_t = 5)]
    rounds: u32,
    /// Writes per second of the paced phase (a sidecar fleet in steady state writes less).
    #[arg(long, default_value_t = 20.0)]
    paced_rate: f64,
    /// The operator binary; default: next to this example's directory.
    #[arg(long)]
    operator_bin: Option<std::path::PathBuf>,
}

/// When each `lastReportTime` was first seen in the profile's status, and the largest status.
#[derive(Default)]
struct Seen {
    first_seen: BTreeMap<String, Instant>,
    max_status_bytes: usize,
}

/// Whole seconds, so every timestamp has the same width: `lastReportTime` is
/// the lexicographic maximum of the reports' `sampledAt`.
fn at(seq: u64) -> String {
    jiff::Timestamp::from_second(1_800_000_000 + seq as i64)
        .unwrap()
        .to_string()
}

fn report(job: &str, rank: u32, seq: u64, used_gib: u64) -> MemoryReport {
    let leaking = rank == 7;
    let gpu = GpuReport {
        uuid: format!("GPU-bench-{rank:05}"),
        model: "NVIDIA H100 80GB HBM3".into(),
        total_bytes: 80 * GIB,
        used_bytes: used_gib * GIB,
        peak_bytes: used_gib * GIB,
        growth_bytes_per_second: if leaking { 1e8 } else { 0.0 },
        time_to_oom_seconds: leaking.then_some(400.0),
        risk: if leaking {
            RiskLevel::High
        } else {
            RiskLevel::Low
        },
        confidence: 0.9,
        source: DataSource::Sim,
        // A full timeline, as a real sidecar sends: the operator must not keep it.
        timeline: (0..MAX_TIMELINE_POINTS as i64)
            .map(|i| TimelinePoint {
                t: 1_800_000_000 + i * 10,
                max: used_gib * GIB,
                min: used_gib * GIB / 2,
            })
            .collect(),
        ..Default::default()
    };
    let mut r = MemoryReport::new(
        &format!("{job}-{rank}"),
        MemoryReportSpec {
            pod_name: format!("{job}-{rank}"),
            node_name: Some(format!("node-{}", rank / 8)),
            job_name: Some(job.into()),
            rank: Some(rank),
            sampled_at: at(seq),
            interval_ms: 1000,
            summary: ReportSummary {
                gpu_count: 1,
                risk: gpu.risk,
                used: format_bytes(gpu.used_bytes),
                peak: format_bytes(gpu.peak_bytes),
                source: DataSource::Sim,
                ..Default::default()
            },
            gpus: vec![gpu],
            ..Default::default()
        },
    );
    r.metadata.labels = Some(BTreeMap::from([
        (LABEL_JOB.to_string(), job.to_string()),
        (LABEL_PROFILE.to_string(), job.to_string()),
    ]));
    r
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or(f64::NAN)
}

/// VmRSS and VmHWM (kB) and CPU seconds (user + system) of a process.
fn proc_usage(pid: u32) -> (u64, u64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name, which is in parentheses and may hold spaces.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    let hz = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .unwrap_or(100.0);
    // utime and stime are fields 14 and 15 of stat, 11 and 12 after the name.
    (kb("VmRSS:"), kb("VmHWM:"), (ticks(11) + ticks(12)) / hz)
}

async fn scrape(addr: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else {
        return String::new();
    };
    let req = "GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n";
    let _ = s.write_all(req.as_bytes()).await;
    let mut out = String::new();
    let _ = s.read_to_string(&mut out).await;
    out.lines()
        .filter(|l| l.starts_with("memprof_") && !l.contains("_bucket"))
        .map(|l| format!("  {l}\n"))
        .collect()
}

/// Writes `reports` one by one, returning when each write completed and the `sampledAt` it carried.
async fn write_all(
    api: &Api<MemoryReport>,
    reports: Vec<MemoryReport>,
    pace: Option<Duration>,
) -> Vec<(String, Instant)> {
    let params = PatchParams::apply(SIDECAR_MANAGER).force();
    let mut done = Vec::with_capacity(reports.len());
    for r in reports {
        let started = Instant::now();
        api.patch(&r.name_any(), &params, &Patch::Apply(&r))
            .await
            .expect("writing a report");
        done.push((r.spec.sampled_at.clone(), Instant::now()));
        if let Some(p) = pace {
            tokio::time::sleep(p.saturating_sub(started.elapsed())).await;
        }
    }
    done
}

async fn wait_seen(seen: &Mutex<Seen>, ts: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if seen
            .lock()
            .unwrap()
            .first_seen
            .keys()
            .any(|k| k.as_str() >= ts)
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the profile never showed sampledAt {ts}");
}

/// Latency of each write: first time a status showed its `sampledAt` or a later one.
fn latencies(seen: &Mutex<Seen>, writes: &[(String, Instant)]) -> Vec<f64> {
    let seen = seen.lock().unwrap();
    let mut out: Vec<f64> = writes
        .iter()
        .map(|(ts, done)| {
            let first = seen
                .first_seen
                .range(ts.clone()..)
                .map(|(_, t)| *t)
                .min()
                .expect("waited for it");
            first.saturating_duration_since(*done).as_secs_f64() * 1000.0
        })
        .collect();
    out.sort_by(f64::total_cmp);
    out
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let client = Client::try_default().await?;
    let crd_api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in crds() {
        let name = crd.name_any();
        let params = PatchParams::apply("memprof-bench").force();
        crd_api.patch(&name, &params, &Patch::Apply(&crd)).await?;
        await_condition(crd_api.clone(), &name, conditions::is_crd_established()).await?;
    }
    let ns = format!("memprof-bench-{}", std::process::id());
    let mut namespace = Namespace::default();
    namespace.metadata.name = Some(ns.clone());
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(&PostParams::default(), &namespace)
        .await?;

    let bin = args.operator_bin.clone().unwrap_or_else(|| {
        let exe = std::env::current_exe().expect("current exe");
        exe.parent()
            .and_then(|p| p.parent())
            .expect("target dir")
            .join("memprof-operator")
    });
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let metrics_addr = format!("127.0.0.1:{port}");
    let mut child = tokio::process::Command::new(&bin)
        .args(["--namespace", &ns, "--metrics-addr", &metrics_addr])
        .env("RUST_LOG", "warn")
        .spawn()
        .map_err(|e| {
            anyhow::anyhow!(
                "starting {}: {e}; build it with `cargo build --release --bin memprof-operator`",
                bin.display()
            )
        })?;
    let pid = child.id().expect("running child");
    let result = bench(&client, &ns, &args, pid, &metrics_addr).await;

    // Clean up whatever happened: the child by its PID, then the namespace.
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let _ = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
    let _ = child.kill().await;
    namespaces.delete(&ns, &DeleteParams::background()).await?;
    result
}

async fn bench(
    client: &Client,
    ns: &str,
    args: &Args,
    pid: u32,
    metrics_addr: &str,
) -> anyhow::Result<()> {
    let job_name = "bench";
    let mut job = Job {
        spec: Some(JobSpec {
            parallelism: Some(args.ranks as i32),
            completions: Some(args.ranks as i32),
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
    job.metadata.name = Some(job_name.into());
    job.metadata.annotations = Some(BTreeMap::from([(ANNOTATION_ENABLED.into(), "true".into())]));
    Api::<Job>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &job)
        .await?;

    let seen = Arc::new(Mutex::new(Seen::default()));
    let profiles: Api<MemoryProfile> = Api::namespaced(client.clone(), ns);
    let watch_seen = seen.clone();
    let watch = tokio::spawn(async move {
        let cfg = watcher::Config::default().fields(&format!("metadata.name={job_name}"));
        let mut stream = watcher(profiles, cfg).applied_objects().boxed();
        while let Some(Ok(p)) = stream.next().await {
            let now = Instant::now();
            let Some(st) = p.status else { continue };
            let mut s = watch_seen.lock().unwrap();
            s.max_status_bytes = s
                .max_status_bytes
                .max(serde_json::to_vec(&st).unwrap().len());
            if let Some(t) = st.last_report_time {
                s.first_seen.entry(t).or_insert(now);
            }
        }
    });

    let reports: Api<MemoryReport> = Api::namespaced(client.clone(), ns);
    let (rss0, _, cpu0) = proc_usage(pid);
    let mut seq = 0;
    let mut burst = Vec::new();
    let started = Instant::now();
    for round in 0..=args.rounds {
        let batch: Vec<_> = (0..args.ranks)
            .map(|rank| {
                seq += 1;
                report(job_name, rank, seq, 20 + (rank as u64 + round as u64) % 50)
            })
            .collect();
        let writes = write_all(&reports, batch, None).await;
        wait_seen(&seen, &writes.last().unwrap().0).await;
        // Round 0 creates the reports (and the profile may still be new): not measured.
        if round > 0 {
            burst.extend(latencies(&seen, &writes));
        }
    }
    let burst_secs = started.elapsed().as_secs_f64();
    burst.sort_by(f64::total_cmp);

    let pace = Duration::from_secs_f64(1.0 / args.paced_rate);
    let batch: Vec<_> = (0..args.ranks)
        .map(|rank| {
            seq += 1;
            report(job_name, rank, seq, 30)
        })
        .collect();
    let writes = write_all(&reports, batch, Some(pace)).await;
    wait_seen(&seen, &writes.last().unwrap().0).await;
    let paced = latencies(&seen, &writes);

    let (rss, hwm, cpu) = proc_usage(pid);
    let max_status = seen.lock().unwrap().max_status_bytes;
    watch.abort();
    let stored = Api::<MemoryProfile>::namespaced(client.clone(), ns)
        .get(job_name)
        .await?;
    let st = stored.status.clone().unwrap_or_default();
    let n_burst = args.rounds as usize * args.ranks as usize;
    println!("operator_scale: {} ranks, 1 GPU each", args.ranks);
    println!(
        "  burst ({} rounds x {} back-to-back writes, {:.0} writes/s): report -> status latency p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        args.rounds, args.ranks, n_burst as f64 / burst_secs,
        percentile(&burst, 0.5), percentile(&burst, 0.99), percentile(&burst, 1.0)
    );
    println!(
        "  paced ({} writes at {}/s): report -> status latency p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        paced.len(), args.paced_rate,
        percentile(&paced, 0.5), percentile(&paced, 0.99), percentile(&paced, 1.0)
    );
    println!(
        "  profile status: {} bytes max seen (limit 16384); final ranks {}, risk {}, imbalance {}",
        max_status,
        st.ranks,
        st.risk,
        st.imbalance_display.unwrap_or_default()
    );
    println!(
        "  operator: RSS {} KiB at start of rounds, {} KiB at end (peak {} KiB); CPU {:.2} s during the run ({:.2} s total)",
        rss0, rss, hwm, cpu - cpu0, cpu
    );
    print!("{}", scrape(metrics_addr).await);
    anyhow::ensure!(max_status <= 16 * 1024, "status exceeds 16 KiB");
    Ok(())
}
