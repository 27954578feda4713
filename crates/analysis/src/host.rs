//! Host memory (seed 000's `leak` covered host memory too):
//! the trainer process's RSS and its container's cgroup, as the agent pushes
//! them (`host`). A host-memory leak (a growing Python list of CPU tensors,
//! a DataLoader whose workers hoard) gets the GPU's treatment: sustained
//! growth, a MB/min threshold (`hostLeakBytesPerSecond`, seed 000's
//! `--threshold`), time to the container's limit, advice.
//!
//! The memory that must fit under the limit is the cgroup's working set
//! (usage minus inactive file pages, what the kubelet evicts on), else its
//! usage, else the process's RSS; DataLoader workers count in the cgroup,
//! not in the RSS, so both are read. A leak: the lower envelope (10 s
//! buckets by default: the user's `bucketSeconds`) grows faster than the
//! threshold, linearly (r² ≥ 0.8) for at least the trust span, still grows
//! in the recent half of the window, and by at least [`MIN_GROWTH_BYTES`]
//! (a Python process's caches drift by a few MB).
//!
//! Pure: time comes with the pushes.

use crate::{least_squares_slope, theil_sen, GpuSeries, Sample};
use memprof_api::agent::Host;
use memprof_api::thresholds::Thresholds;
use memprof_api::{format_bytes, format_duration, HostMemory};

/// Growth below this over the window is not a leak, bytes (64 MiB).
pub const MIN_GROWTH_BYTES: f64 = 64.0 * 1024.0 * 1024.0;
/// r² the lower envelope needs.
const MIN_R2: f64 = 0.8;

/// The host memory of one trainer process and its container.
#[derive(Clone, Debug)]
pub struct HostState {
    th: Thresholds,
    rss: GpuSeries,
    container: GpuSeries,
    last: Option<Host>,
}

/// What one series says.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Growth {
    slope: f64,
    leaks: bool,
}

impl HostState {
    /// Nothing pushed yet.
    pub fn new(th: &Thresholds) -> Self {
        HostState {
            th: th.clone(),
            rss: GpuSeries::new(th),
            container: GpuSeries::new(th),
            last: None,
        }
    }

    /// Takes a push's `host` (or its bare `rssBytes`) at time `t`.
    pub fn observe(&mut self, t: f64, h: &Host) {
        // The series' "total" only scales what a GPU series calls idle and
        // a rise; host memory has neither, so the largest value goes in.
        let total = u64::MAX;
        if let Some(rss) = h.rss_bytes {
            self.rss.push(Sample {
                t,
                used: rss,
                total,
            });
        }
        if let Some(c) = h.working_set_bytes.or(h.cgroup_usage_bytes) {
            self.container.push(Sample { t, used: c, total });
        }
        self.last = Some(h.clone());
    }

    fn growth(&self, s: &GpuSeries) -> Option<Growth> {
        let th = &self.th;
        let (_, lower) = s.envelopes(th.fit_window_seconds);
        let fit = theil_sen(&lower)?;
        let recent = least_squares_slope(&lower[lower.len() / 2..]).unwrap_or(0.0);
        let thr = th.host_leak_bytes_per_second;
        Some(Growth {
            slope: fit.slope,
            leaks: fit.slope > thr
                && fit.r2 >= MIN_R2
                && fit.span >= th.trust_span_seconds.min(th.fit_window_seconds / 2.0)
                && recent > thr / 2.0
                && fit.slope * fit.span >= MIN_GROWTH_BYTES,
        })
    }

    /// The report's host section, once a push carried host numbers.
    pub fn report(&self) -> Option<HostMemory> {
        let h = self.last.as_ref()?;
        let container = self.growth(&self.container);
        let rss = self.growth(&self.rss);
        // What must fit under the limit: the container's memory when known.
        let main = container.or(rss);
        let leak = container.is_some_and(|g| g.leaks) || rss.is_some_and(|g| g.leaks);
        let now = h.working_set_bytes.or(h.cgroup_usage_bytes).or(h.rss_bytes);
        let growth = main.map(|g| g.slope).filter(|g| g.is_finite());
        let time_to_limit = match (h.limit_bytes, now, growth) {
            (Some(limit), Some(now), Some(g)) if g > 0.0 && leak => {
                Some((limit.saturating_sub(now) as f64 / g).max(0.0))
            }
            _ => None,
        };
        Some(HostMemory {
            rss_bytes: h.rss_bytes,
            limit_bytes: h.limit_bytes,
            working_set_bytes: h.working_set_bytes,
            usage_bytes: h.cgroup_usage_bytes,
            growth_bytes_per_second: growth,
            leak_suspected: leak,
            time_to_limit_seconds: time_to_limit,
            advice: leak.then(|| advice(growth.unwrap_or(0.0), h, time_to_limit)),
        })
    }
}

fn advice(growth: f64, h: &Host, time_to_limit: Option<f64>) -> String {
    let limit = match (time_to_limit, h.limit_bytes) {
        (Some(t), Some(l)) => format!(
            "; at this pace the container reaches its {} limit in {} and is OOMKilled (exit 137)",
            format_bytes(l),
            format_duration(t)
        ),
        _ => String::new(),
    };
    format!(
        "host memory leak: it grows {:.1} MB/min{limit}. Look for CPU tensors or outputs kept \
         across steps (a Python list that grows: keep .item() or detach().cpu() copies only \
         what you need), and DataLoader workers that hoard (persistent_workers caching \
         samples, a large prefetch_factor); memprof_agent.track() counts the objects that grow",
        growth * 60.0 / 1e6
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const GB: f64 = 1e9;

    fn run(secs: usize, f: impl Fn(f64) -> Host) -> HostState {
        let mut s = HostState::new(&Thresholds::default());
        for i in 0..=secs {
            s.observe(1.8e9 + i as f64, &f(i as f64));
        }
        s
    }

    fn host(rss: f64, ws: Option<f64>, limit: Option<f64>) -> Host {
        Host {
            rss_bytes: Some(rss as u64),
            working_set_bytes: ws.map(|w| w as u64),
            cgroup_usage_bytes: ws.map(|w| (w + 1e9) as u64),
            limit_bytes: limit.map(|l| l as u64),
            cgroup: ws.map(|_| "v2".into()),
        }
    }

    /// A Python list of CPU tensors: 50 MB/min on top of a 6 GB process,
    /// with a DataLoader's jitter of ±200 MB.
    #[test]
    fn a_growing_host_memory_is_a_leak_with_its_time_to_the_limit() {
        let jitter = |t: f64| if (t as u64) % 7 == 0 { 0.2 * GB } else { 0.0 };
        let s = run(300, |t| {
            let v = 6.0 * GB + 50e6 / 60.0 * t + jitter(t);
            host(v, Some(v + 2.0 * GB), Some(16.0 * GB))
        });
        let r = s.report().unwrap();
        assert!(r.leak_suspected, "{r:?}");
        let g = r.growth_bytes_per_second.unwrap();
        assert!((g - 50e6 / 60.0).abs() < 0.1 * 50e6 / 60.0, "{g}");
        // 16 GB - (8 GB + 250 MB) at 0.83 MB/s: about 155 minutes.
        let tto = r.time_to_limit_seconds.unwrap();
        assert!((tto - 7.75e9 / (50e6 / 60.0)).abs() < 0.15 * tto, "{tto}");
        assert!(r.advice.unwrap().contains("OOMKilled"));
    }

    #[test]
    fn steady_or_slightly_drifting_host_memory_is_not_a_leak() {
        let s = run(600, |t| {
            host(
                6.0 * GB + if (t as u64) % 5 == 0 { 0.3 * GB } else { 0.0 },
                None,
                None,
            )
        });
        let r = s.report().unwrap();
        assert!(!r.leak_suspected && r.advice.is_none(), "{r:?}");
        // 5 MB/min for 10 minutes: under the 10 MB/min threshold.
        let s = run(600, |t| host(6.0 * GB + 5e6 / 60.0 * t, None, None));
        assert!(!s.report().unwrap().leak_suspected);
        // A one-off step (the dataset loaded into memory) then flat.
        let s = run(600, |t| {
            host(if t < 200.0 { 6.0 * GB } else { 9.0 * GB }, None, None)
        });
        assert!(!s.report().unwrap().leak_suspected);
    }

    #[test]
    fn dataloader_workers_count_in_the_container_not_the_process() {
        // The trainer's RSS is flat; its workers (same cgroup) grow 100 MB/min.
        let s = run(300, |t| {
            host(6.0 * GB, Some(8.0 * GB + 100e6 / 60.0 * t), Some(32.0 * GB))
        });
        let r = s.report().unwrap();
        assert!(
            r.leak_suspected && r.time_to_limit_seconds.is_some(),
            "{r:?}"
        );
        // Without a limit there is no time to it.
        let s = run(300, |t| host(6.0 * GB + 100e6 / 60.0 * t, None, None));
        let r = s.report().unwrap();
        assert!(
            r.leak_suspected && r.time_to_limit_seconds.is_none(),
            "{r:?}"
        );
    }
}
