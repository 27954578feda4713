//! What the API server itself passes per second, with no operator running
//! (not a timed test): `--lanes` writes in flight, each lane looping over
//! its own objects, for each kind of write the roll-up's benchmark makes.
//!
//! ```text
//! eval "$(bash hack/local-cluster.sh env)"; export KUBECONFIG
//! cargo build --release --example api_write_loop
//! target/release/examples/api_write_loop --apiserver-pid "$(bash hack/local-cluster.sh pid kube-apiserver)"
//! ```
//!
//! Variants, interleaved (every variant × lane count runs once per round,
//! `--rounds` rounds, so load from elsewhere on the machine hits all alike):
//! - `report-apply`: a sidecar's MemoryReport (1 GPU, a 60-point packed
//!   timeline), server-side apply of the whole report (what `operator_scale`
//!   writes); `report-apply-objects`: the same with the timeline as 60
//!   objects (`timeline`, sidecars before `packedTimeline`);
//!   `report-apply-bare`: without a timeline; `report-apply-8`,
//!   `-8-objects`, `-8-bare`: the same at 8 GPUs;
//! - `status-apply`: a MemoryProfile status of a 16-rank Job, server-side
//!   apply of the whole status with the resourceVersion precondition (the
//!   status writer's `--status-write=apply`);
//! - `status-merge`: the same status change as a JSON merge patch of the
//!   fields that changed, with the precondition (`--status-write=merge`);
//! - `status-merge-whole`: a merge patch of the whole status, to tell the
//!   cost of server-side apply from the cost of the bytes;
//! - `status-apply-notop`, `status-apply-bare`: `status-apply` without
//!   `topRanks`, and without `topRanks` and `conditions`, to tell what each
//!   part of a status costs the API server; `status-apply-top4`: 4 ranks in
//!   `topRanks` instead of 8; `status-apply-slimtop`: 8 ranks without what
//!   each rank's report already says (node, GPU UUID, growth, report time;
//!   a UUID of `-` and a zero growth are still written, as the type wants).
//!
//! Prints writes/s and the round trip's p50/p99 per variant, the API
//! server's CPU over the variant's windows and the load average. Deletes
//! its namespace at the end, also on failure.

use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, Resource, ResourceExt};
use memprof::api::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

#[allow(dead_code)] // the CRD and namespace helpers only
mod scale_support;
use scale_support::setup;

#[derive(Debug, Parser)]
struct Args {
    /// Objects of each kind (one per Job or rank).
    #[arg(long, default_value_t = 200)]
    objects: usize,
    /// Writes in flight, one run per value.
    #[arg(long, value_delimiter = ',', default_values_t = [8, 16, 32])]
    lanes: Vec<usize>,
    /// Seconds of each variant's window.
    #[arg(long, default_value_t = 8)]
    secs: u64,
    /// Rounds over every variant and lane count.
    #[arg(long, default_value_t = 2)]
    rounds: u32,
    /// Only these variants (by name, comma-separated); all by default.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// PID of the local kube-apiserver, to report its CPU per variant.
    #[arg(long)]
    apiserver_pid: Option<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Variant {
    ReportApply,
    ReportApplyObjects,
    ReportApplyBare,
    ReportApply8,
    ReportApply8Objects,
    ReportApply8Bare,
    StatusApply,
    StatusMerge,
    StatusMergeWhole,
    StatusApplyNoTop,
    StatusApplyBare,
    StatusApplyTop4,
    StatusApplySlimTop,
}

const VARIANTS: [Variant; 13] = [
    Variant::ReportApply,
    Variant::ReportApplyObjects,
    Variant::ReportApplyBare,
    Variant::ReportApply8,
    Variant::ReportApply8Objects,
    Variant::ReportApply8Bare,
    Variant::StatusApply,
    Variant::StatusMerge,
    Variant::StatusMergeWhole,
    Variant::StatusApplyNoTop,
    Variant::StatusApplyBare,
    Variant::StatusApplyTop4,
    Variant::StatusApplySlimTop,
];

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::ReportApply => "report-apply",
            Variant::ReportApplyObjects => "report-apply-objects",
            Variant::ReportApplyBare => "report-apply-bare",
            Variant::ReportApply8 => "report-apply-8",
            Variant::ReportApply8Objects => "report-apply-8-objects",
            Variant::ReportApply8Bare => "report-apply-8-bare",
            Variant::StatusApply => "status-apply",
            Variant::StatusMerge => "status-merge",
            Variant::StatusMergeWhole => "status-merge-whole",
            Variant::StatusApplyNoTop => "status-apply-notop",
            Variant::StatusApplyBare => "status-apply-bare",
            Variant::StatusApplyTop4 => "status-apply-top4",
            Variant::StatusApplySlimTop => "status-apply-slimtop",
        }
    }
}

/// What one window measured.
#[derive(Default)]
struct Tally {
    rtts_ms: Vec<f64>,
    secs: f64,
    apiserver_cpu: f64,
    conflicts: usize,
    body_bytes: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let client = Client::try_default().await?;
    setup::install_crds(&client).await?;
    let ns = format!("memprof-writeloop-{}", std::process::id());
    setup::create_namespace(&client, &ns).await?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let result = tokio::select! {
        r = run(&client, &ns, &args) => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
    };
    namespaces.delete(&ns, &DeleteParams::background()).await?;
    result
}

async fn run(client: &Client, ns: &str, args: &Args) -> anyhow::Result<()> {
    let reports: Api<MemoryReport> = Api::namespaced(client.clone(), ns);
    let profiles: Api<MemoryProfile> = Api::namespaced(client.clone(), ns);
    let mut rvs = create_objects(&reports, &profiles, args.objects).await?;
    let status_bytes = serde_json::to_vec(&status(0))?.len();
    let mut tallies: BTreeMap<(Variant, usize), Tally> = BTreeMap::new();
    let load0 = loadavg();
    for round in 0..args.rounds {
        for &lanes in &args.lanes {
            let chosen = VARIANTS
                .into_iter()
                .filter(|v| args.only.is_empty() || args.only.iter().any(|o| o == v.name()));
            for variant in chosen {
                let t = tallies.entry((variant, lanes)).or_default();
                let cpu0 = cpu_seconds(args.apiserver_pid);
                let started = Instant::now();
                let lane_loops = (0..lanes).map(|lane| {
                    let mine: Vec<usize> = (lane..args.objects).step_by(lanes).collect();
                    let window = Duration::from_secs(args.secs);
                    let versions: Vec<String> = mine.iter().map(|&i| rvs[i].clone()).collect();
                    lane_loop(&reports, &profiles, variant, mine, versions, round, window)
                });
                let results = futures::future::join_all(lane_loops).await;
                t.secs += started.elapsed().as_secs_f64();
                t.apiserver_cpu += cpu_seconds(args.apiserver_pid) - cpu0;
                for r in results {
                    let r = r?;
                    t.rtts_ms.extend(r.rtts_ms);
                    t.conflicts += r.conflicts;
                    t.body_bytes = t.body_bytes.max(r.body_bytes);
                    for (i, rv) in r.versions {
                        rvs[i] = rv;
                    }
                }
            }
        }
    }
    print(args, status_bytes, &tallies, &load0);
    Ok(())
}

fn print(
    args: &Args,
    status_bytes: usize,
    tallies: &BTreeMap<(Variant, usize), Tally>,
    load0: &str,
) {
    println!(
        "api_write_loop: {} objects of each kind, {} s windows, {} rounds interleaved; whole status {status_bytes} B; \
         2 cores shared by the API server, etcd and this load generator",
        args.objects, args.secs, args.rounds
    );
    for ((variant, lanes), t) in tallies {
        let mut rtts = t.rtts_ms.clone();
        rtts.sort_by(f64::total_cmp);
        let pct = |p: f64| {
            let i = ((rtts.len() as f64 - 1.0) * p).round() as usize;
            rtts.get(i).copied().unwrap_or(f64::NAN)
        };
        println!(
            "  {:<19} {lanes:>2} in flight: {:>6.1} writes/s, round trip p50 {:>4.0} ms, p99 {:>4.0} ms; body {:>5} B; \
             kube-apiserver {:>3.0} % of a core; {} conflicts",
            variant.name(),
            rtts.len() as f64 / t.secs,
            pct(0.5),
            pct(0.99),
            t.body_bytes,
            100.0 * t.apiserver_cpu / t.secs,
            t.conflicts
        );
    }
    println!(
        "  1-minute load average: {load0} at the start, {} at the end",
        loadavg()
    );
}

/// Creates `n` reports and `n` profiles with a status; each profile's resourceVersion.
async fn create_objects(
    reports: &Api<MemoryReport>,
    profiles: &Api<MemoryProfile>,
    n: usize,
) -> anyhow::Result<Vec<String>> {
    let created = futures::stream::iter(0..n)
        .map(|i| async move {
            let params = PatchParams::apply("memprof-bench").force();
            reports
                .patch(
                    &name(i),
                    &params,
                    &Patch::Apply(&report(i, 0, 8, Form::Objects)),
                )
                .await?;
            let mut p = MemoryProfile::new(
                &name(i),
                MemoryProfileSpec {
                    job_name: name(i),
                    expected_ranks: Some(16),
                },
            );
            p.metadata.resource_version = None;
            profiles.create(&PostParams::default(), &p).await?;
            let body = serde_json::json!({ "status": status(0) });
            let written = profiles
                .patch_status(&name(i), &PatchParams::default(), &Patch::Merge(&body))
                .await?;
            anyhow::Ok(written.resource_version().unwrap_or_default())
        })
        .buffered(16)
        .collect::<Vec<_>>()
        .await;
    created.into_iter().collect()
}

fn name(i: usize) -> String {
    format!("bench-{i:05}")
}

/// What one lane measured, and the profiles' newest resourceVersions.
struct LaneResult {
    rtts_ms: Vec<f64>,
    conflicts: usize,
    body_bytes: usize,
    versions: Vec<(usize, String)>,
}

/// Writes `variant` to its objects in turn until `window` is over.
async fn lane_loop(
    reports: &Api<MemoryReport>,
    profiles: &Api<MemoryProfile>,
    variant: Variant,
    mine: Vec<usize>,
    mut versions: Vec<String>,
    round: u32,
    window: Duration,
) -> anyhow::Result<LaneResult> {
    let started = Instant::now();
    let mut out = LaneResult {
        rtts_ms: Vec::new(),
        conflicts: 0,
        body_bytes: 0,
        versions: Vec::new(),
    };
    let mut n = 0usize;
    while started.elapsed() < window && !mine.is_empty() {
        let k = n % mine.len();
        let step = (round as u64 + 1) * 1_000_000 + n as u64;
        let t = Instant::now();
        let written = write(reports, profiles, variant, mine[k], &versions[k], step).await;
        out.rtts_ms.push(t.elapsed().as_secs_f64() * 1000.0);
        match written {
            Ok((rv, bytes)) => {
                versions[k] = rv;
                out.body_bytes = out.body_bytes.max(bytes);
            }
            Err(kube::Error::Api(s)) if s.is_conflict() => out.conflicts += 1,
            Err(e) => return Err(e.into()),
        }
        n += 1;
    }
    out.versions = mine.into_iter().zip(versions).collect();
    Ok(out)
}

/// One write of `variant` to object `i`; the new resourceVersion and the body's size.
async fn write(
    reports: &Api<MemoryReport>,
    profiles: &Api<MemoryProfile>,
    variant: Variant,
    i: usize,
    rv: &str,
    step: u64,
) -> kube::Result<(String, usize)> {
    let apply = PatchParams::apply(OPERATOR_MANAGER).force();
    let merge = PatchParams {
        field_manager: Some(OPERATOR_MANAGER.into()),
        ..Default::default()
    };
    let (old, new) = (status(step - 1), status(step));
    let meta = serde_json::json!({ "name": name(i), "resourceVersion": rv });
    let (body, written) = match variant {
        Variant::StatusApply
        | Variant::StatusApplyNoTop
        | Variant::StatusApplyBare
        | Variant::StatusApplyTop4
        | Variant::StatusApplySlimTop => {
            let new = trimmed(new, variant);
            let body = serde_json::json!({
                "apiVersion": MemoryProfile::api_version(&()),
                "kind": MemoryProfile::kind(&()),
                "metadata": meta, "status": new,
            });
            let w = profiles
                .patch_status(&name(i), &apply, &Patch::Apply(&body))
                .await;
            (body, w)
        }
        Variant::StatusMerge => {
            let diff = memprof::status::merge_diff(&to_value(&old), &to_value(&new));
            let body = serde_json::json!({ "metadata": meta, "status": diff });
            let w = profiles
                .patch_status(&name(i), &merge, &Patch::Merge(&body))
                .await;
            (body, w)
        }
        Variant::StatusMergeWhole => {
            let body = serde_json::json!({ "metadata": meta, "status": new });
            let w = profiles
                .patch_status(&name(i), &merge, &Patch::Merge(&body))
                .await;
            (body, w)
        }
        report_variant => {
            // Reports carry no precondition: the profile's version stays.
            let bytes = write_report(reports, report_variant, i, step).await?;
            return Ok((rv.to_string(), bytes));
        }
    };
    let bytes = serde_json::to_vec(&body).map_or(0, |v| v.len());
    Ok((written?.resource_version().unwrap_or_default(), bytes))
}

/// One write of a report variant to report `i`; the body's size.
async fn write_report(
    reports: &Api<MemoryReport>,
    variant: Variant,
    i: usize,
    step: u64,
) -> kube::Result<usize> {
    let (gpus, form) = match variant {
        Variant::ReportApply => (1, Form::Packed),
        Variant::ReportApplyObjects => (1, Form::Objects),
        Variant::ReportApplyBare => (1, Form::None),
        Variant::ReportApply8 => (8, Form::Packed),
        Variant::ReportApply8Objects => (8, Form::Objects),
        _ => (8, Form::None),
    };
    let r = report(i, step, gpus, form);
    let bytes = serde_json::to_vec(&r).map_or(0, |v| v.len());
    let params = PatchParams::apply(SIDECAR_MANAGER).force();
    reports.patch(&name(i), &params, &Patch::Apply(&r)).await?;
    Ok(bytes)
}

fn to_value(st: &MemoryProfileStatus) -> Value {
    serde_json::to_value(st).unwrap_or(Value::Null)
}

const GIB: u64 = 1 << 30;

/// `status` as a `status-apply*` variant writes it.
fn trimmed(mut st: MemoryProfileStatus, variant: Variant) -> MemoryProfileStatus {
    match variant {
        Variant::StatusApplyNoTop => st.top_ranks.clear(),
        Variant::StatusApplyBare => {
            st.top_ranks.clear();
            st.conditions.clear();
        }
        Variant::StatusApplyTop4 => st.top_ranks.truncate(4),
        Variant::StatusApplySlimTop => {
            // What a rank's report already says: node, GPU, growth, time.
            for r in &mut st.top_ranks {
                r.location.node = None;
                // Required; "" reads as null to a 1.20 API server.
                r.location.gpu_uuid = "-".into();
                r.growth_bytes_per_second = 0.0;
                r.last_report_time = None;
            }
        }
        _ => {}
    }
    st
}

/// A 16-rank Job's status as the roll-up writes it, at write `step`: the
/// top rank's peak and the report time move, as in `operator_scale`.
fn status(step: u64) -> MemoryProfileStatus {
    // Under the CRD's bounds (percentages ≤ 100) whatever the step.
    let peak = 40 * GIB + (step % 1024) * (1 << 20);
    let rank = |r: u32| RankSummary {
        location: GpuLocation {
            pod: format!("bench-job-{r:05}-abcde"),
            rank: Some(r),
            node: Some(format!("node-{}", r / 8)),
            gpu_index: 0,
            gpu_uuid: format!("GPU-bench-000-{r:05}-0"),
        },
        risk: if r == 7 {
            RiskLevel::High
        } else {
            RiskLevel::Low
        },
        peak_bytes: if r == (step % 16) as u32 {
            peak
        } else {
            30 * GIB
        },
        total_bytes: 80 * GIB,
        time_to_oom_seconds: (r == 7).then_some(400.0),
        growth_bytes_per_second: if r == 7 { 1e8 } else { 0.0 },
        cause: (r == 7).then_some(Cause::Leak),
        last_report_time: Some(timestamp(step)),
        stale: false,
    };
    let top = (0..8).map(|i| rank(((step + i) % 16) as u32)).collect();
    MemoryProfileStatus {
        ranks_reporting: 16,
        ranks_expected: Some(16),
        ranks: "16/16".into(),
        gpu_count: 16,
        peak_used_bytes: peak,
        peak_percent: 100.0 * peak as f64 / (80 * GIB) as f64,
        current_used_bytes: peak,
        current_percent: 100.0 * peak as f64 / (80 * GIB) as f64,
        peak: format_bytes(peak),
        risk: RiskLevel::High,
        confidence: 0.9,
        time_to_oom_seconds: Some(400.0),
        time_to_oom: Some("6m40s".into()),
        leak_suspected: true,
        leak_ranks: vec![7],
        top_ranks: top,
        last_report_time: Some(timestamp(step)),
        oldest_report_time: Some(timestamp(0)),
        conditions: ["Ready", "ReportsValid", "ReportsCounted", "RanksStale"]
            .into_iter()
            .map(|c| Condition::new(c, c != "RanksStale", "Bench", "16 of 16 ranks report"))
            .collect(),
        ..Default::default()
    }
}

fn timestamp(step: u64) -> String {
    jiff::Timestamp::from_second(1_790_000_000 + (step % 1_000_000) as i64)
        .expect("a second near now")
        .to_string()
}

/// How a report carries its timelines.
#[derive(Clone, Copy, PartialEq)]
enum Form {
    /// `packedTimeline`, as the sidecar writes it.
    Packed,
    /// `timeline`, 60 objects per GPU, as sidecars before it wrote it.
    Objects,
    /// No timeline at all: the floor.
    None,
}

/// A sidecar's report of rank `i`: `gpus` GPUs, each with a full 60-point
/// timeline in `form`.
fn report(i: usize, step: u64, gpus: u32, form: Form) -> MemoryReport {
    let used = 30 * GIB + step % 1024 * (1 << 20);
    let second = 1_790_000_000 + (step % 1_000_000) as i64;
    let points = if form == Form::None {
        0
    } else {
        MAX_TIMELINE_POINTS as i64
    };
    let gpu = |g: u32| GpuReport {
        index: g,
        uuid: format!("GPU-bench-{i:05}-{g}"),
        model: "NVIDIA H100 80GB HBM3".into(),
        total_bytes: 80 * GIB,
        used_bytes: used,
        peak_bytes: used,
        confidence: 0.9,
        source: DataSource::Sim,
        timeline: (0..points)
            .map(|k| TimelinePoint {
                t: second - (points - 1 - k) * 10,
                max: used,
                min: used / 2,
            })
            .collect(),
        ..Default::default()
    };
    let gpu = |g: u32| {
        let mut gpu = gpu(g);
        if form == Form::Objects {
            gpu.legacy_timeline = std::mem::take(&mut gpu.timeline);
        }
        gpu
    };
    MemoryReport::new(
        &name(i),
        MemoryReportSpec {
            pod_name: name(i),
            rank: Some(i as u32),
            sampled_at: timestamp(step),
            interval_ms: 1000,
            summary: ReportSummary {
                gpu_count: gpus,
                used: format_bytes(used),
                peak: format_bytes(used),
                source: DataSource::Sim,
                ..Default::default()
            },
            gpus: (0..gpus).map(gpu).collect(),
            ..Default::default()
        },
    )
}

fn cpu_seconds(pid: Option<u32>) -> f64 {
    let Some(pid) = pid else { return 0.0 };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime, fields 14 and 15 of stat; 100 ticks a second on Linux.
    (ticks(11) + ticks(12)) / 100.0
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}
