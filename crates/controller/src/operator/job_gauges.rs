//! Per-Job gauges (`memprof_job_*`), computed at each scrape from the
//! MemoryProfiles in the controller's watch cache.

use kube::runtime::reflector::Store;
use memprof_api::{MemoryProfile, MemoryProfileStatus};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use std::sync::Arc;

/// Labels of the per-Job gauges: the Job's namespace and name. The name is
/// `job_name`, not `job`: Prometheus sets `job` on every series to the
/// scrape job, and with `honorLabels` a `job` label here would replace it
/// (kube-state-metrics says `job_name` for the same reason, and the
/// chart's PodMonitor puts `job_name` on the sidecars' series, so the two
/// join). A scrape config must keep `namespace` (`honorLabels: true`, as
/// the chart's ServiceMonitor sets), or Prometheus renames it to
/// `exported_namespace` in favour of the operator pod's own.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JobLabels {
    /// Namespace of the Job.
    pub namespace: String,
    /// Name of the Job (and of its MemoryProfile).
    pub job_name: String,
}

/// Per-Job gauges (`memprof_job_*`), computed at each scrape from the
/// MemoryProfiles in the operator's watch cache. Reading the cache rather
/// than setting gauges during reconciles means a deleted profile's series
/// disappear with it (no stale series for Jobs long gone), and only the
/// replica that reconciles (the leader, which has a cache) exports them.
#[derive(Default)]
pub struct JobGauges {
    profiles: std::sync::RwLock<Option<Store<MemoryProfile>>>,
    /// Set by [`Metrics::touch_families`]: every gauge gets one child with
    /// empty labels, so that [`descriptors`] can name the labels.
    pub(super) described: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for JobGauges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobGauges").finish_non_exhaustive()
    }
}

/// While alive, [`JobGauges`] exports the profiles of one cache; dropped
/// when the controller stops (leadership lost), the series go with it.
#[must_use = "the per-Job gauges stop when this is dropped"]
pub struct Published(Arc<JobGauges>);

impl Drop for Published {
    fn drop(&mut self) {
        *self.0.profiles.write().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

impl JobGauges {
    /// Exports the profiles in `store` until the returned guard is dropped.
    pub fn publish(self: &Arc<Self>, store: Store<MemoryProfile>) -> Published {
        *self.profiles.write().unwrap_or_else(|e| e.into_inner()) = Some(store);
        Published(self.clone())
    }
}

/// One per-Job gauge: name (after the registry's prefix), help, and its value
/// for a status (`None`: no series for that Job).
type JobGauge = (
    &'static str,
    &'static str,
    fn(&MemoryProfileStatus) -> Option<f64>,
);

const JOB_GAUGES: [JobGauge; 9] = [
    (
        "job_risk_level",
        "Job OOM risk (worst rank): 0 none, 1 low, 2 medium, 3 high, 4 critical",
        |s| Some(f64::from(s.risk as u8)),
    ),
    (
        "job_time_to_oom_seconds",
        "Smallest predicted time to OOM over the Job's ranks (absent when none is predicted)",
        |s| s.time_to_oom_seconds,
    ),
    (
        "job_imbalance_ratio",
        "Max/mean of per-GPU peak memory across the Job's GPUs (absent with fewer than 2 GPUs)",
        |s| s.imbalance,
    ),
    (
        "job_peak_used_bytes",
        "Largest peak GPU memory in use over the Job's GPUs",
        |s| Some(s.peak_used_bytes as f64),
    ),
    (
        "job_ranks_reporting",
        "Ranks of the Job with a valid MemoryReport",
        |s| Some(f64::from(s.ranks_reporting)),
    ),
    (
        "job_gpu_ooms",
        "GPU OOMs recorded in the Job's MemoryProfile (its bounded history)",
        |s| Some(s.ooms.len() as f64),
    ),
    (
        "job_last_gpu_oom_timestamp_seconds",
        "Unix time of the newest GPU OOM recorded for the Job (absent when none)",
        |s| {
            s.ooms
                .iter()
                .filter_map(|o| o.time.parse::<jiff::Timestamp>().ok())
                .max()
                .map(|t| t.as_millisecond() as f64 / 1000.0)
        },
    ),
    (
        "job_remediations",
        "Finished remediations that changed the Job, over its whole life (all policies)",
        |s| {
            Some(
                s.remediation_totals
                    .iter()
                    .map(|t| f64::from(t.count))
                    .sum(),
            )
        },
    ),
    (
        "job_remediations_failed",
        "Remediation records of the Job in phase Failed (its bounded history)",
        |s| {
            Some(
                s.remediations
                    .iter()
                    .filter(|r| r.phase == "Failed")
                    .count() as f64,
            )
        },
    ),
];

impl Collector for JobGauges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let profiles = match &*self.profiles.read().unwrap_or_else(|e| e.into_inner()) {
            Some(store) => store.state(),
            None => Vec::new(),
        };
        let rows: Vec<(JobLabels, &MemoryProfileStatus)> = profiles
            .iter()
            .filter_map(|p| {
                let labels = JobLabels {
                    namespace: p.metadata.namespace.clone()?,
                    job_name: p.metadata.name.clone()?,
                };
                Some((labels, p.status.as_ref()?))
            })
            .collect();
        // Descriptors even without profiles: `--print-metrics` names them.
        let described = self.described.load(std::sync::atomic::Ordering::Relaxed);
        for (name, help, value) in JOB_GAUGES {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            if described {
                ConstGauge::new(0.0).encode(family.encode_family(&JobLabels::default())?)?;
            }
            for (labels, status) in &rows {
                if let Some(v) = value(status) {
                    ConstGauge::new(v).encode(family.encode_family(labels)?)?;
                }
            }
        }
        Ok(())
    }
}
