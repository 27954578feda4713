//! Prometheus metrics of the sidecar, all prefixed `memprof_`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// Labels of per-GPU metrics. `gpu`, `UUID` and `modelName` are spelled as
/// dcgm-exporter spells them, so a query can join the two on `UUID` (see
/// docs/observability.md). Cardinality stays that of the GPU index: a GPU's
/// UUID and model never change, and a sidecar sees only its pod's GPUs.
///
/// What they carry is no more than dcgm-exporter's own series say about the
/// same GPU (index, UUID, product name, memory used and total); the risk and
/// time to OOM are memprof's reading of those numbers. Nothing the agent
/// pushes beyond them (allocator internals, phases, code locations) is
/// exported: that stays on the pod's socket and in its MemoryReport.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
#[allow(non_snake_case)]
pub struct GpuLabel {
    /// GPU index.
    pub gpu: String,
    /// GPU UUID (`GPU-…`), empty when the backend does not know it.
    pub UUID: String,
    /// Product name, e.g. `NVIDIA H100 80GB HBM3`.
    pub modelName: String,
}

/// Longest model name exported: NVML names are short; this only bounds a
/// label an agent or a trace file could make arbitrarily long.
const MAX_MODEL_NAME: usize = 64;

impl GpuLabel {
    /// The labels of one GPU of a report (sampled, or only the agent's: its
    /// `gpu` is then the CUDA ordinal the trainer sees).
    pub fn of(g: &memprof_api::GpuReport) -> Self {
        let mut model = g.model.clone();
        memprof_api::truncate_utf8(&mut model, MAX_MODEL_NAME);
        let mut uuid = g.uuid.clone();
        memprof_api::truncate_utf8(&mut uuid, MAX_MODEL_NAME);
        GpuLabel {
            gpu: g.index.to_string(),
            UUID: uuid,
            modelName: model,
        }
    }
}

/// Label of write metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// Why (writes) or what failed (errors).
    pub reason: String,
}

/// Every metric the sidecar exports.
#[derive(Clone)]
pub struct Metrics {
    /// Time to sample all GPUs once.
    pub sampler_duration: Histogram,
    /// Samples taken.
    pub samples: Counter,
    /// Samples that failed.
    pub sample_errors: Counter,
    /// MemoryReport writes that succeeded, by reason.
    pub report_writes: Family<ReasonLabel, Counter>,
    /// MemoryReport writes that failed, by kind.
    pub report_write_errors: Family<ReasonLabel, Counter>,
    /// Pushes received from the in-process agent.
    pub agent_pushes: Counter,
    /// Failures to listen for the endpoints (port taken, address not allowed).
    pub listen_errors: Counter,
    /// 1 when GPUs are visible to the sidecar, 0 when not (then no GPU numbers are data).
    pub gpu_visible: Gauge,
    /// Used memory, bytes.
    pub gpu_used: Family<GpuLabel, Gauge<f64, AtomicU64>>,
    /// Peak memory, bytes.
    pub gpu_peak: Family<GpuLabel, Gauge<f64, AtomicU64>>,
    /// Total memory, bytes.
    pub gpu_total: Family<GpuLabel, Gauge<f64, AtomicU64>>,
    /// Risk level: 0 none, 1 low, 2 medium, 3 high, 4 critical.
    pub gpu_risk: Family<GpuLabel, Gauge>,
    /// Predicted seconds to OOM (absent when memory is not growing).
    pub gpu_time_to_oom: Family<GpuLabel, Gauge<f64, AtomicU64>>,
}

impl Metrics {
    /// Creates the metrics and registers them.
    pub fn new(registry: &mut Registry) -> Self {
        let m = Metrics {
            sampler_duration: Histogram::new(exponential_buckets(1e-6, 2.0, 24)),
            samples: Counter::default(),
            sample_errors: Counter::default(),
            report_writes: Family::default(),
            report_write_errors: Family::default(),
            agent_pushes: Counter::default(),
            listen_errors: Counter::default(),
            gpu_visible: Gauge::default(),
            gpu_used: Family::default(),
            gpu_peak: Family::default(),
            gpu_total: Family::default(),
            gpu_risk: Family::default(),
            gpu_time_to_oom: Family::default(),
        };
        m.register_sidecar(registry);
        m.register_gpus(registry);
        m
    }

    /// The sidecar's own families: sampling, writes, pushes, listeners.
    fn register_sidecar(&self, r: &mut Registry) {
        let m = self;
        r.register(
            "memprof_sampler_duration_seconds",
            "Time to sample all GPUs once",
            m.sampler_duration.clone(),
        );
        r.register(
            "memprof_sidecar_samples",
            "Samples taken",
            m.samples.clone(),
        );
        r.register(
            "memprof_sidecar_sample_errors",
            "Samples that failed",
            m.sample_errors.clone(),
        );
        r.register(
            "memprof_sidecar_report_writes",
            "MemoryReport writes, by reason",
            m.report_writes.clone(),
        );
        r.register(
            "memprof_sidecar_report_write_errors",
            "Failed MemoryReport writes, by kind",
            m.report_write_errors.clone(),
        );
        r.register(
            "memprof_sidecar_agent_pushes",
            "Pushes from the in-process agent",
            m.agent_pushes.clone(),
        );
        r.register(
            "memprof_sidecar_listen_errors",
            "Failures to serve the endpoints or the agent socket (sampling and reports go on)",
            m.listen_errors.clone(),
        );
    }

    /// The per-GPU families (and whether GPUs are visible).
    fn register_gpus(&self, r: &mut Registry) {
        let m = self;
        r.register(
            "memprof_gpu_visible",
            "1 when the pod's GPUs are visible to the sidecar",
            m.gpu_visible.clone(),
        );
        r.register(
            "memprof_gpu_used_bytes",
            "GPU memory in use",
            m.gpu_used.clone(),
        );
        r.register(
            "memprof_gpu_peak_bytes",
            "Peak GPU memory in use",
            m.gpu_peak.clone(),
        );
        r.register(
            "memprof_gpu_total_bytes",
            "Total GPU memory",
            m.gpu_total.clone(),
        );
        r.register(
            "memprof_gpu_risk_level",
            "OOM risk: 0 none, 1 low, 2 medium, 3 high, 4 critical",
            m.gpu_risk.clone(),
        );
        r.register(
            "memprof_gpu_time_to_oom_seconds",
            "Predicted seconds to OOM",
            m.gpu_time_to_oom.clone(),
        );
    }

    /// Counts a successful write.
    pub fn written(&self, reason: &str) {
        self.report_writes
            .get_or_create(&ReasonLabel {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Counts a failed write.
    pub fn write_failed(&self, kind: &str) {
        self.report_write_errors
            .get_or_create(&ReasonLabel {
                reason: kind.to_string(),
            })
            .inc();
    }

    /// Total successful writes, all reasons.
    pub fn writes_total(&self) -> u64 {
        crate::budget::Reason::ALL
            .iter()
            .map(|r| {
                self.report_writes
                    .get_or_create(&ReasonLabel {
                        reason: r.as_str().to_string(),
                    })
                    .get()
            })
            .sum()
    }
}

impl Metrics {
    /// Sets the per-GPU gauges from a report: every GPU it carries, whether
    /// NVML sampled it or only the agent reports it, with the assessment the
    /// report shows (the allocator's where it replaced NVML's). GPUs no
    /// longer in the report leave the families.
    pub fn export(&self, report: &memprof_api::MemoryReportSpec) {
        for family in [
            &self.gpu_used,
            &self.gpu_peak,
            &self.gpu_total,
            &self.gpu_time_to_oom,
        ] {
            family.clear();
        }
        self.gpu_risk.clear();
        for g in &report.gpus {
            let l = GpuLabel::of(g);
            self.gpu_used.get_or_create(&l).set(g.used_bytes as f64);
            self.gpu_total.get_or_create(&l).set(g.total_bytes as f64);
            self.gpu_peak.get_or_create(&l).set(g.peak_bytes as f64);
            self.gpu_risk.get_or_create(&l).set(g.risk as i64);
            if let Some(tto) = g.time_to_oom_seconds {
                self.gpu_time_to_oom.get_or_create(&l).set(tto);
            }
        }
    }
}

/// Renders the registry in the Prometheus text format.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}

/// The registry's metric families (`# HELP`/`# TYPE` lines, no samples):
/// what `memprof-sidecar --print-metrics` prints, so the chart's dashboard
/// and alerts are checked against the names this binary really registers.
pub fn describe() -> String {
    let mut registry = Registry::default();
    let m = Metrics::new(&mut registry);
    // A family without a child is not encoded at all: give each one a
    // child, then keep only the descriptors.
    let gpu = GpuLabel {
        gpu: String::new(),
        UUID: String::new(),
        modelName: String::new(),
    };
    for family in [&m.gpu_used, &m.gpu_peak, &m.gpu_total, &m.gpu_time_to_oom] {
        let _ = family.get_or_create(&gpu);
    }
    let _ = m.gpu_risk.get_or_create(&gpu);
    m.written("");
    m.write_failed("");
    render(&registry)
        .lines()
        .filter(|l| l.starts_with("# HELP ") || l.starts_with("# TYPE "))
        .map(|l| format!("{l}\n"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_gpu_series_carry_the_labels_dcgm_exporter_joins_on() {
        let mut registry = Registry::default();
        let m = Metrics::new(&mut registry);
        let g = memprof_api::GpuReport {
            index: 3,
            uuid: "GPU-0b1c".into(),
            model: format!("NVIDIA H100 80GB HBM3{}", "x".repeat(200)),
            used_bytes: 42,
            ..Default::default()
        };
        let l = GpuLabel::of(&g);
        assert_eq!(l.modelName.len(), MAX_MODEL_NAME, "bounded");
        m.export(&memprof_api::MemoryReportSpec {
            gpus: vec![g],
            ..Default::default()
        });
        let text = render(&registry);
        let want = format!(
            "memprof_gpu_used_bytes{{gpu=\"3\",UUID=\"GPU-0b1c\",modelName=\"{}\"}} 42.0",
            l.modelName
        );
        assert!(text.contains(&want), "{text}");
        assert!(
            !text.contains("memprof_gpu_time_to_oom_seconds{"),
            "no TTO, no series"
        );
        // The GPU leaves the report: its series go.
        m.export(&memprof_api::MemoryReportSpec::default());
        assert!(!render(&registry).contains("memprof_gpu_used_bytes{"));
    }

    #[test]
    fn describe_names_every_family_without_samples() {
        let text = describe();
        for name in [
            "# TYPE memprof_gpu_used_bytes gauge",
            "# TYPE memprof_sidecar_samples counter",
            "# TYPE memprof_sampler_duration_seconds histogram",
        ] {
            assert!(text.contains(name), "{name} in {text}");
        }
        assert!(!text.contains("memprof_gpu_used_bytes{"), "{text}");
    }
}
