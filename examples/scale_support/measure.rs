//! What is measured, and how: report → status latency from a watch on the
//! profiles, the operator's /proc numbers, and its /metrics counters.
//!
//! Latency, exactly: every write of a Job carries a GPU peak above all its
//! Job's earlier writes (`load::Clock`), so a profile's `peakUsedBytes`
//! names the newest write w* it took in, and the write's rank becomes the
//! top rank, a change the operator writes at once. (Not `lastReportTime`:
//! a change of it alone is written at most every 30 s.) The operator reads reports from one watch,
//! delivered in resourceVersion order, so a roll-up that holds w* also holds
//! every report written before it (resourceVersion ≤ w*'s). A write w is
//! therefore reflected by the first status of its Job whose w* has a
//! resourceVersion ≥ w's. That holds with many writes in flight at once,
//! and errs late, never early (the roll-up may hold newer writes than w*).
//! The clock starts when the write's response arrives and stops when the
//! status arrives at this process's watch.

use super::load::Write;
use futures::StreamExt;
use kube::api::Api;
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use memprof::api::MemoryProfile;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the profiles' statuses showed, as this process's watch saw them.
#[derive(Default)]
pub struct Seen {
    /// Per profile (= Job name): when each `peakUsedBytes` arrived, in arrival order.
    pub shown: HashMap<String, Vec<(Instant, String)>>,
    /// Largest status seen, as JSON bytes.
    pub max_status_bytes: usize,
}

/// Watches every profile of `api` into a shared `Seen` until aborted.
pub fn watch_profiles(api: Api<MemoryProfile>) -> (Arc<Mutex<Seen>>, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let into = seen.clone();
    let task = tokio::spawn(async move {
        let mut stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .applied_objects()
            .boxed();
        while let Some(event) = stream.next().await {
            let Ok(p) = event else { continue };
            let now = Instant::now();
            let Some(st) = p.status.as_ref() else {
                continue;
            };
            let bytes = serde_json::to_vec(st).map_or(0, |v| v.len());
            let mut s = into.lock().unwrap_or_else(|e| e.into_inner());
            s.max_status_bytes = s.max_status_bytes.max(bytes);
            s.shown
                .entry(p.name_any())
                .or_default()
                .push((now, st.peak_used_bytes.to_string()));
        }
    });
    (seen, task)
}

/// The resourceVersion of each write, by the peak it carried (unique per
/// write of a Job; the Job is the profile the status is read from).
pub fn versions(writes: &[Write]) -> HashMap<(usize, String), u64> {
    writes
        .iter()
        .map(|w| ((w.job, w.peak.to_string()), w.rv))
        .collect()
}

/// For one profile: when it first reflected each higher resourceVersion.
fn reflected(
    shown: &[(Instant, String)],
    rv_of: &HashMap<(usize, String), u64>,
    job: usize,
) -> Vec<(Instant, u64)> {
    let mut best = 0;
    let mut out = Vec::new();
    for (at, ts) in shown {
        if let Some(&rv) = rv_of.get(&(job, ts.clone())) {
            if rv > best {
                best = rv;
                out.push((*at, rv));
            }
        }
    }
    out
}

/// Milliseconds from each write's response to the first status of its Job
/// that reflects it (module docs); `None` for a write not reflected yet.
pub fn latencies(
    seen: &Seen,
    writes: &[Write],
    rv_of: &HashMap<(usize, String), u64>,
    names: &[String],
) -> Vec<Option<f64>> {
    let by_job: HashMap<usize, Vec<(Instant, u64)>> = writes
        .iter()
        .map(|w| w.job)
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .map(|j| {
            let shown = seen.shown.get(&names[j]).map_or(&[][..], |v| v.as_slice());
            (j, reflected(shown, rv_of, j))
        })
        .collect();
    writes
        .iter()
        .map(|w| {
            let steps = &by_job[&w.job];
            let i = steps.partition_point(|(_, rv)| *rv < w.rv);
            steps
                .get(i)
                .map(|(at, _)| at.saturating_duration_since(w.done).as_secs_f64() * 1000.0)
        })
        .collect()
}

/// Waits until every write is reflected; each write's Job and latency (ms).
pub async fn wait_reflected(
    seen: &Mutex<Seen>,
    writes: &[Write],
    rv_of: &HashMap<(usize, String), u64>,
    names: &[String],
    timeout: Duration,
) -> anyhow::Result<Vec<(usize, f64)>> {
    let deadline = Instant::now() + timeout;
    loop {
        let lat = latencies(
            &seen.lock().unwrap_or_else(|e| e.into_inner()),
            writes,
            rv_of,
            names,
        );
        let missing = lat.iter().filter(|l| l.is_none()).count();
        if missing == 0 {
            let jobs = writes.iter().map(|w| w.job);
            return Ok(jobs.zip(lat.into_iter().flatten()).collect());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{missing} of {} report writes not reflected in their profile's status after {timeout:?}",
            writes.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Latencies alone, sorted.
pub fn sorted(latencies: &[(usize, f64)]) -> Vec<f64> {
    let mut v: Vec<f64> = latencies.iter().map(|(_, ms)| *ms).collect();
    v.sort_by(f64::total_cmp);
    v
}

/// Each Job's median latency, sorted: equal when the operator serves Jobs
/// fairly, spread out when some wait while others are served.
pub fn job_medians(latencies: &[(usize, f64)]) -> Vec<f64> {
    let mut by_job: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
    for (job, ms) in latencies {
        by_job.entry(*job).or_default().push(*ms);
    }
    let mut medians: Vec<f64> = by_job
        .into_values()
        .map(|mut v| {
            v.sort_by(f64::total_cmp);
            percentile(&v, 0.5)
        })
        .collect();
    medians.sort_by(f64::total_cmp);
    medians
}

/// The p-quantile (0..=1) of sorted values, nearest rank.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or(f64::NAN)
}

/// A process's memory and CPU, from /proc.
#[derive(Clone, Copy, Debug, Default)]
pub struct Usage {
    pub rss_kib: u64,
    pub hwm_kib: u64,
    pub cpu_seconds: f64,
}

/// VmRSS, VmHWM and user + system CPU seconds of process `pid` (`self` for this one).
pub fn proc_usage(pid: &str) -> Usage {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = |key: &str| {
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
    // utime and stime are fields 14 and 15 of stat, 11 and 12 after the name.
    Usage {
        rss_kib: kib("VmRSS:"),
        hwm_kib: kib("VmHWM:"),
        cpu_seconds: (ticks(11) + ticks(12)) / clock_ticks(),
    }
}

fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .unwrap_or(100.0)
}

/// The operator's `memprof_*` counters and gauges, summed over labels.
pub async fn scrape(addr: &str) -> BTreeMap<String, f64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else {
        return BTreeMap::new();
    };
    let req = "GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n";
    let _ = s.write_all(req.as_bytes()).await;
    let mut out = String::new();
    let _ = s.read_to_string(&mut out).await;
    let mut sums = BTreeMap::new();
    for line in out.lines().filter(|l| l.starts_with("memprof_")) {
        let name = line.split(['{', ' ']).next().unwrap_or_default();
        let value = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok());
        if let Some(v) = value {
            *sums.entry(name.to_string()).or_insert(0.0) += v;
        }
    }
    sums
}

/// The operator's writes to the API server, by kind, between two scrapes.
pub fn writes_between(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
) -> Vec<(&'static str, f64)> {
    let delta =
        |k: &str| after.get(k).copied().unwrap_or(0.0) - before.get(k).copied().unwrap_or(0.0);
    vec![
        ("status writes", delta("memprof_status_writes_total")),
        (
            "status conflicts (409, retried)",
            delta("memprof_status_conflicts_total"),
        ),
        (
            "annotation patches",
            delta("memprof_annotation_patches_total"),
        ),
        (
            "Events",
            delta("memprof_events_total") + delta("memprof_event_errors_total"),
        ),
    ]
}
