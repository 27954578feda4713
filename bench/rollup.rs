//! CPU per report event of the operator's roll-up, incremental against from
//! scratch, in one run:
//!
//!     cargo bench -p memprof-analysis --bench rollup [-- --events N]
//!
//! Shapes: 2,048 ranks × 1 GPU and 256 ranks × 8 GPUs (the goal: at
//! most 1 ms of CPU per report event). An event is one rank's new report
//! (new sample time, memory moved, now and then a new risk level or time to
//! OOM), as the watch delivers it. "new" is `JobRollup::upsert` then
//! `JobRollup::status` (what the controller does per event at most);
//! "old" is what a reconcile did per event before: sort the Job's reports,
//! validate each, `rollup` them all. Prints median, p99 and mean per event
//! of the thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`: time the thread was
//! preempted does not count, so the figures hold on a shared machine), and
//! the wall-clock median and p99 beside them. Pure CPU, one thread, no I/O.

use jiff::{SignedDuration, Timestamp};
use memprof_analysis::{rollup, validate_report, JobRollup, RollupInput, RollupLimits};
use memprof_api::{
    AllocatorStats, DataSource, GpuReport, MemoryGrowth, MemoryReportSpec, RiskLevel,
};
use std::hint::black_box;
use std::time::{Duration, Instant};

/// This thread's CPU time so far.
fn cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the pointer it is given.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// A timed section: CPU and wall-clock.
#[derive(Default)]
struct Samples {
    cpu: Vec<Duration>,
    wall: Vec<Duration>,
}

impl Samples {
    fn time<T>(&mut self, f: impl FnOnce() -> T) -> T {
        let (c, w) = (cpu(), Instant::now());
        let out = f();
        self.wall.push(w.elapsed());
        self.cpu.push(cpu() - c);
        out
    }
}

const G: u64 = 1 << 30;

/// splitmix64, seeded: the same events every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn report(rng: &mut Rng, rank: u32, gpus: u32, at: Timestamp) -> MemoryReportSpec {
    let gpus = (0..gpus)
        .map(|i| {
            let peak = 40 * G + rng.below(30 * G);
            let risky = rng.below(100) < 3;
            GpuReport {
                index: i,
                uuid: format!("GPU-{rank:05}-{i}"),
                model: "NVIDIA H100 80GB HBM3".into(),
                total_bytes: 80 * G,
                used_bytes: peak - rng.below(10 * G),
                peak_bytes: peak,
                utilization_percent: Some(90),
                growth_bytes_per_second: rng.below(1 << 20) as f64,
                time_to_oom_seconds: risky.then(|| 100.0 + rng.below(1000) as f64),
                risk: if risky {
                    RiskLevel::High
                } else {
                    RiskLevel::Low
                },
                confidence: 0.9,
                fragmentation: Some(rng.below(30) as f64 / 100.0),
                source: DataSource::Nvml,
                ..Default::default()
            }
        })
        .collect();
    MemoryReportSpec {
        pod_name: format!("train-{rank}"),
        node_name: Some(format!("node-{}", rank / 8)),
        job_name: Some("train".into()),
        rank: Some(rank),
        sampled_at: at.to_string(),
        interval_ms: 1000,
        gpus,
        allocator: Some(AllocatorStats {
            allocated_bytes: 30 * G,
            reserved_bytes: 40 * G,
            growth: MemoryGrowth::None,
            steps_per_second: Some(2.0 + rng.below(100) as f64 / 100.0),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn sorted(mut t: Vec<Duration>) -> impl Fn(f64) -> Duration {
    t.sort();
    move |p: f64| t[((t.len() as f64 * p) as usize).min(t.len() - 1)]
}

/// Prints one line; returns the CPU (median, p99).
fn percentiles(what: &str, s: Samples) -> (Duration, Duration) {
    let n = s.cpu.len();
    let mean = s.cpu.iter().sum::<Duration>() / n as u32;
    let (cpu, wall) = (sorted(s.cpu), sorted(s.wall));
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "  {what:<30} CPU median {:>7.1} µs  p99 {:>8.1} µs  mean {:>7.1} µs | wall median {:>7.1} µs  p99 {:>8.1} µs  ({n} events)",
        us(cpu(0.5)),
        us(cpu(0.99)),
        us(mean),
        us(wall(0.5)),
        us(wall(0.99)),
    );
    (cpu(0.5), cpu(0.99))
}

/// The old per-event work: sort, validate, roll up every report.
fn from_scratch(reports: &[(String, MemoryReportSpec)], expected: u32) -> MemoryProfileStatusSize {
    let mut sorted: Vec<&(String, MemoryReportSpec)> = reports.iter().collect();
    sorted.sort_by(|a, b| (a.1.rank, &a.0).cmp(&(b.1.rank, &b.0)));
    let valid: Vec<RollupInput<'_>> = sorted
        .iter()
        .filter(|r| validate_report(&r.1).is_ok())
        .map(|r| RollupInput { spec: &r.1 })
        .collect();
    rollup(&valid, Some(expected)).gpu_count
}

type MemoryProfileStatusSize = u32;

fn shape(ranks: u32, gpus: u32, events: usize) {
    println!("== {ranks} ranks × {gpus} GPU(s), {events} report events");
    let mut rng = Rng(42);
    let t0 = Timestamp::from_second(1_800_000_000).expect("a time");
    let mut reports: Vec<(String, MemoryReportSpec)> = (0..ranks)
        .map(|r| (format!("train-{r}"), report(&mut rng, r, gpus, t0)))
        .collect();
    let started = Instant::now();
    let mut inc = JobRollup::new(Some(ranks), RollupLimits::default());
    for (name, spec) in &reports {
        inc.upsert(name, spec);
    }
    println!(
        "  built from {ranks} reports in {:.1} ms; holds ~{:.1} MiB",
        started.elapsed().as_secs_f64() * 1e3,
        inc.approx_bytes() as f64 / (1 << 20) as f64
    );
    let batch = steady_events(&mut rng, (ranks, gpus), events, t0);
    let (mut upsert, mut status, mut both) =
        (Samples::default(), Samples::default(), Samples::default());
    for (r, now, spec) in &batch {
        let name = &reports[*r].0;
        both.time(|| {
            upsert.time(|| inc.upsert(name, spec));
            status.time(|| black_box(inc.status(*now)));
        });
    }
    // The old path is slow: a tenth of the events, enough for a p99.
    let mut old = Samples::default();
    for (r, _, spec) in batch.iter().take((events / 10).max(100)) {
        reports[*r].1 = spec.clone();
        old.time(|| black_box(from_scratch(&reports, ranks)));
    }
    let stale = inc.status(batch.last().map_or(t0, |b| b.1)).ranks_stale;
    assert_eq!(
        stale, 0,
        "a rank went stale: the events do not model the steady state"
    );
    percentiles("new: upsert", upsert);
    percentiles("new: status", status);
    let new = percentiles("new: upsert + status", both);
    let old = percentiles("old: sort+validate+rollup", old);
    println!(
        "  CPU median speed-up {:.0}×, p99 {:.0}×; goal ≤ 1 ms of CPU per event (p99): {}",
        old.0.as_secs_f64() / new.0.as_secs_f64(),
        old.1.as_secs_f64() / new.1.as_secs_f64(),
        if new.1 <= Duration::from_millis(1) {
            "met"
        } else {
            "MISSED"
        }
    );
}

/// The events, made before timing: every rank writes once per 60 s (the
/// sidecar's heartbeat, its steady state), in a shuffled order, so the
/// Job sees ranks / 60 reports a second and no rank goes stale.
fn steady_events(
    rng: &mut Rng,
    (ranks, gpus): (u32, u32),
    events: usize,
    t0: Timestamp,
) -> Vec<(usize, Timestamp, MemoryReportSpec)> {
    let mut order: Vec<u32> = (0..ranks).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let step = SignedDuration::from_secs(60) / ranks as i32;
    (0..events)
        .map(|i| {
            let r = order[i % order.len()];
            let at = t0 + step * (i as i32 + 1);
            (r as usize, at, report(rng, r, gpus, at))
        })
        .collect()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut events = 5000;
    while let Some(a) = args.next() {
        if a == "--events" {
            events = args.next().and_then(|n| n.parse().ok()).unwrap_or(events);
        }
    }
    shape(2048, 1, events);
    shape(256, 8, events);
}
