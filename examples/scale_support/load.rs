//! The load: MemoryReports as the sidecar writes them (server-side apply,
//! field manager `memprof-sidecar`, labels `memprof.dev/job` and
//! `memprof.dev/profile`, an ownerReference to the pod), in bursts or paced.

use super::setup::RankPod;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, Patch, PatchParams};
use kube::ResourceExt;
use memprof::api::*;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
/// The rank of every Job whose GPU leaks (high risk, a time to OOM).
pub const LEAKING_RANK: u32 = 7;
/// A write's GPU 0 peak: this much, plus 1 MiB per write of its Job so far.
const PEAK_BASE: u64 = 40 * GIB;

/// The `sampledAt` of each write: 30 s before it is built, as a sidecar's
/// report is a moment old when written (in the past: the operator refuses
/// reports from the future, `trust.rs`; recent: older than two heartbeats
/// plus 30 s, a rank is stale).
///
/// It also hands each write of a Job a peak 1 MiB above the Job's previous
/// write's: the written rank becomes the Job's top rank among the ranks of
/// its risk, which a user sees (`topRanks`), and the status's
/// `peakUsedBytes` names the newest write it took in. Every timed write must
/// change something a user sees, or the operator rightly waits (a change of
/// `lastReportTime` or of a peak under an unchanged text alone waits up to
/// 30 s, `operator/reconcile/write.rs`) and the latency measured is the
/// benchmark's: so the write that follows each batch is rank 1's or 2's by
/// turns, never the rank the next batch starts with nor the last batch's
/// (with fewer than 3 ranks that cannot hold), and the writes of the leaking rank
/// ([`LEAKING_RANK`], first by risk whatever its peak: a higher peak moves
/// nothing a user sees) are written but not timed.
pub struct Clock {
    peaks: std::collections::HashMap<usize, u64>,
}

impl Clock {
    /// A clock for `writes` writes.
    pub fn for_writes(_writes: usize) -> Clock {
        Clock {
            peaks: Default::default(),
        }
    }

    fn tick(&mut self) -> i64 {
        jiff::Timestamp::now().as_second() - 30
    }

    /// The next write of Job `job`: its `sampledAt` second and GPU 0 peak.
    fn next_write(&mut self, job: usize) -> (i64, u64) {
        let n = self.peaks.entry(job).or_default();
        *n += 1;
        let peak = PEAK_BASE + *n * MIB;
        (self.tick(), peak)
    }
}

/// One completed write: which Job, the peak it carried (unique per Job), the
/// resourceVersion the API server gave it, and when its response arrived.
#[derive(Clone, Debug)]
pub struct Write {
    pub job: usize,
    /// Whether its latency counts: it changes what a user sees ([`Clock`]).
    pub timed: bool,
    pub peak: u64,
    pub rv: u64,
    pub done: Instant,
    /// The write's round trip, ms (the API server's queueing shows here).
    pub rtt_ms: f64,
}

/// How a round shapes a rank's numbers.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub gpus_per_rank: u32,
    pub round: u32,
}

/// The report of `pod` at `second`: one rank per pod, `gpus_per_rank` GPUs,
/// each with a full timeline as a real sidecar sends (the operator drops it
/// on the way into its cache, but the API server and the watch carry it).
/// Rank [`LEAKING_RANK`] of every Job leaks, so every profile has a high risk and a TTO.
/// GPU 0's peak and use are `peak` (see [`Clock`]).
pub fn report(pod: &RankPod, (second, peak): (i64, u64), shape: Shape) -> MemoryReport {
    let used_gib = 20 + (pod.rank as u64 + shape.round as u64) % 20;
    let gpus = (0..shape.gpus_per_rank)
        .map(|index| {
            let used = if index == 0 { peak } else { used_gib * GIB };
            gpu(pod, index, second, used)
        })
        .collect::<Vec<_>>();
    let worst = gpus.iter().map(|g| g.risk).max().unwrap_or_default();
    let job = pod.owner.clone();
    let mut r = MemoryReport::new(
        &pod.name,
        MemoryReportSpec {
            pod_name: pod.name.clone(),
            node_name: Some(format!("node-{}", pod.rank / 8)),
            job_name: Some(job.clone()),
            rank: Some(pod.rank),
            sampled_at: jiff::Timestamp::from_second(second)
                .expect("a second near now")
                .to_string(),
            interval_ms: 1000,
            summary: ReportSummary {
                gpu_count: shape.gpus_per_rank,
                risk: worst,
                used: format_bytes(peak),
                peak: format_bytes(peak),
                source: DataSource::Sim,
                ..Default::default()
            },
            gpus,
            ..Default::default()
        },
    );
    // What the sidecar's writer sets (crates/sidecar/src/writer.rs `build`).
    r.metadata.labels = Some(BTreeMap::from([
        (LABEL_JOB.to_string(), job.clone()),
        (LABEL_PROFILE.to_string(), job),
    ]));
    r.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: pod.name.clone(),
        uid: pod.uid.clone(),
        ..Default::default()
    }]);
    r
}

fn gpu(pod: &RankPod, index: u32, second: i64, used: u64) -> GpuReport {
    let leaking = pod.rank == LEAKING_RANK;
    GpuReport {
        index,
        uuid: format!("GPU-bench-{:03}-{:05}-{index}", pod.job, pod.rank),
        model: "NVIDIA H100 80GB HBM3".into(),
        total_bytes: 80 * GIB,
        used_bytes: used,
        peak_bytes: used,
        growth_bytes_per_second: if leaking { 1e8 } else { 0.0 },
        time_to_oom_seconds: leaking.then_some(400.0),
        risk: if leaking {
            RiskLevel::High
        } else {
            RiskLevel::Low
        },
        confidence: 0.9,
        source: DataSource::Sim,
        // The minute before the sample, never after it.
        timeline: (0..MAX_TIMELINE_POINTS as i64)
            .map(|i| TimelinePoint {
                t: second - (MAX_TIMELINE_POINTS as i64 - 1 - i) * 10,
                max: used,
                min: used / 2,
            })
            .collect(),
        ..Default::default()
    }
}

/// The order of one round: rank-major across Jobs, so that every Job is
/// written "at once" rather than one Job after another.
pub fn round_order(pods: &[RankPod]) -> Vec<&RankPod> {
    let mut order: Vec<&RankPod> = pods.iter().collect();
    order.sort_by_key(|p| (p.rank, p.job));
    order
}

async fn write(api: &Api<MemoryReport>, mut r: MemoryReport, job: usize) -> anyhow::Result<Write> {
    let params = PatchParams::apply(SIDECAR_MANAGER).force();
    // Marked as the webhook marks a pod's own write, before the clock starts.
    let writer = super::setup::WRITER_KEY
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    if let Some((key, ns)) = writer {
        memprof::api::writer::mark_as_written(&mut r, &key, &ns);
    }
    let started = Instant::now();
    let written = api.patch(&r.name_any(), &params, &Patch::Apply(&r)).await?;
    let done = Instant::now();
    // On this API server (etcd 3) resourceVersions are etcd revisions: integers
    // that grow in the order the operator's single report watch delivers them.
    let rv = written
        .resource_version()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("report {} has no numeric resourceVersion", r.name_any()))?;
    Ok(Write {
        job,
        timed: r.spec.rank != Some(LEAKING_RANK),
        peak: r.spec.gpus.first().map_or(0, |g| g.peak_bytes),
        rv,
        done,
        rtt_ms: done.duration_since(started).as_secs_f64() * 1000.0,
    })
}

/// Writes one report per pod in `order`, `lanes` at a time, as fast as the
/// API server takes them.
pub async fn burst(
    api: &Api<MemoryReport>,
    order: &[&RankPod],
    clock: &mut Clock,
    shape: Shape,
    lanes: usize,
) -> anyhow::Result<Vec<Write>> {
    let reports: Vec<(MemoryReport, usize)> = order
        .iter()
        .map(|p| (report(p, clock.next_write(p.job), shape), p.job))
        .collect();
    futures::stream::iter(reports)
        .map(|(r, job)| write(api, r, job))
        .buffer_unordered(lanes)
        .try_collect()
        .await
}

/// Writes one report per pod in `order`, started `rate` per second whatever
/// the API server's latency (up to 64 in flight), as a fleet of sidecars would.
pub async fn paced(
    api: &Api<MemoryReport>,
    order: &[&RankPod],
    clock: &mut Clock,
    shape: Shape,
    rate: f64,
) -> anyhow::Result<Vec<Write>> {
    let start = tokio::time::Instant::now();
    let scheduled: Vec<(Duration, &RankPod, (i64, u64))> = order
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let at = Duration::from_secs_f64(i as f64 / rate);
            (at, *p, clock.next_write(p.job))
        })
        .collect();
    futures::stream::iter(scheduled)
        .then(|(at, pod, write)| async move {
            tokio::time::sleep_until(start + at).await;
            (report(pod, write, shape), pod.job)
        })
        .map(|(r, job)| write(api, r, job))
        .buffer_unordered(64)
        .try_collect()
        .await
}
