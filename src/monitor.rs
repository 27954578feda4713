//! The sampling → analysis half of a sidecar, without any I/O of its own:
//! a [`Monitor`] owns a [`Sampler`] and one [`GpuSeries`] per GPU, and turns
//! them into a [`MemoryReportSpec`]. The sidecar, its standalone mode and the
//! CLI all drive one, so what runs on a GPU box is what runs in a pod.

use crate::analysis::{assess, Assessment, GpuSeries, Sample, Thresholds};
use crate::api::{
    format_bytes, format_duration, AllocatorStats, Condition, GpuReport, MemoryReportSpec,
    ReportSummary, RiskLevel, TimelinePoint, MAX_TIMELINE_POINTS,
};
use crate::sampler::{self, Sampler};

/// Who the report is about.
#[derive(Clone, Debug, Default)]
pub struct Identity {
    /// Pod name.
    pub pod_name: String,
    /// Node name.
    pub node_name: Option<String>,
    /// Job name.
    pub job_name: Option<String>,
    /// Rank.
    pub rank: Option<u32>,
}

/// Samples GPUs and keeps their analysed history.
pub struct Monitor {
    sampler: Box<dyn Sampler>,
    thresholds: Thresholds,
    series: Vec<GpuSeries>,
    utilization: Vec<Option<u32>>,
    assessments: Vec<Assessment>,
    allocator: Option<AllocatorStats>,
    last_t: f64,
}

impl Monitor {
    /// A monitor over `sampler`'s GPUs.
    pub fn new(sampler: Box<dyn Sampler>, thresholds: Thresholds) -> Self {
        let n = sampler.gpus().len();
        Monitor {
            series: (0..n).map(|_| GpuSeries::new(&thresholds)).collect(),
            utilization: vec![None; n],
            assessments: vec![Assessment::default(); n],
            sampler,
            thresholds,
            allocator: None,
            last_t: 0.0,
        }
    }

    /// Takes one sample of every GPU at time `t` (seconds). Cheap: the
    /// analysis runs separately, in [`Monitor::analyse`].
    pub fn sample(&mut self, t: f64) -> Result<(), sampler::Error> {
        let readings = self.sampler.sample(t)?;
        for (i, r) in readings.iter().enumerate().take(self.series.len()) {
            self.series[i].push(Sample {
                t,
                used: r.used_bytes,
                total: r.total_bytes,
            });
            self.utilization[i] = r.utilization_percent;
        }
        self.last_t = t;
        Ok(())
    }

    /// Re-assesses every GPU; returns the worst risk.
    pub fn analyse(&mut self) -> RiskLevel {
        for (i, s) in self.series.iter().enumerate() {
            self.assessments[i] = assess(s, &self.thresholds);
        }
        self.worst_risk()
    }

    /// The worst risk of the last analysis.
    pub fn worst_risk(&self) -> RiskLevel {
        self.assessments
            .iter()
            .map(|a| a.risk)
            .max()
            .unwrap_or_default()
    }

    /// The assessments of the last analysis, one per GPU.
    pub fn assessments(&self) -> &[Assessment] {
        &self.assessments
    }

    /// The history of every GPU.
    pub fn series(&self) -> &[GpuSeries] {
        &self.series
    }

    /// The sampler.
    pub fn sampler(&self) -> &dyn Sampler {
        self.sampler.as_ref()
    }

    /// Processes computing on the GPUs, when the backend can tell.
    pub fn active_processes(&mut self) -> Option<usize> {
        self.sampler.active_processes()
    }

    /// Takes one push of the in-process agent (already validated).
    pub fn agent_push(&mut self, push: crate::agent::Push) {
        if let Some(d) = push.devices.first() {
            self.allocator = Some(AllocatorStats {
                allocated_bytes: d.allocated_bytes,
                reserved_bytes: d.reserved_bytes,
                active_bytes: d.active_bytes,
                inactive_split_bytes: d.inactive_split_bytes,
                alloc_retries: d.alloc_retries,
                num_ooms: d.num_ooms,
                step: push.step,
                phase: push.phase.clone(),
            });
        }
    }

    /// Fragmentation from the agent's numbers: the share of reserved memory not
    /// holding tensors.
    fn fragmentation(&self) -> Option<f64> {
        let a = self.allocator.as_ref()?;
        if a.reserved_bytes == 0 {
            return None;
        }
        Some(
            (a.reserved_bytes.saturating_sub(a.allocated_bytes) as f64 / a.reserved_bytes as f64)
                .clamp(0.0, 1.0),
        )
    }

    /// The report as of the last sample and analysis. `conditions` come from
    /// the caller (GPU discovery knows why GPUs are or are not visible).
    pub fn report(
        &self,
        id: &Identity,
        sampled_at: String,
        interval_ms: u64,
        conditions: Vec<Condition>,
    ) -> MemoryReportSpec {
        let source = self.sampler.source();
        let fragmentation = self.fragmentation();
        let gpus: Vec<GpuReport> = self
            .sampler
            .gpus()
            .iter()
            .zip(&self.series)
            .zip(&self.assessments)
            .zip(&self.utilization)
            .take(crate::api::MAX_GPUS_PER_REPORT)
            .map(|(((info, series), a), util)| GpuReport {
                index: info.index,
                uuid: info.uuid.clone(),
                model: info.model.clone(),
                total_bytes: series.last().map_or(info.total_bytes, |s| s.total),
                used_bytes: series.last().map_or(0, |s| s.used),
                peak_bytes: series.peak(),
                utilization_percent: *util,
                growth_bytes_per_second: finite(a.growth_bytes_per_second),
                time_to_oom_seconds: a.time_to_oom_seconds.filter(|t| t.is_finite()),
                risk: a.risk,
                confidence: finite(a.confidence),
                leak_suspected: a.leak_suspected,
                spike_detected: a.spike_detected,
                fragmentation,
                source,
                timeline: timeline(series),
            })
            .collect();

        let fullest = gpus.iter().max_by(|a, b| {
            frac(a.used_bytes, a.total_bytes).total_cmp(&frac(b.used_bytes, b.total_bytes))
        });
        let peakiest = gpus.iter().max_by(|a, b| {
            frac(a.peak_bytes, a.total_bytes).total_cmp(&frac(b.peak_bytes, b.total_bytes))
        });
        let human = |used: u64, total: u64| {
            format!("{} ({:.0}%)", format_bytes(used), 100.0 * frac(used, total))
        };
        let risk = gpus.iter().map(|g| g.risk).max().unwrap_or_default();
        let tto = gpus
            .iter()
            .filter_map(|g| g.time_to_oom_seconds)
            .min_by(|a, b| a.total_cmp(b));
        MemoryReportSpec {
            pod_name: id.pod_name.clone(),
            node_name: id.node_name.clone(),
            job_name: id.job_name.clone(),
            rank: id.rank,
            sampled_at,
            interval_ms: interval_ms.max(1),
            summary: ReportSummary {
                gpu_count: gpus.len() as u32,
                risk,
                time_to_oom: if risk >= RiskLevel::Medium {
                    tto.map(format_duration)
                } else {
                    None
                },
                used: fullest.map_or("-".into(), |g| human(g.used_bytes, g.total_bytes)),
                peak: peakiest.map_or("-".into(), |g| human(g.peak_bytes, g.total_bytes)),
                source,
            },
            gpus,
            allocator: self.allocator.clone(),
            conditions,
        }
    }
}

fn finite(v: f64) -> f64 {
    if v.is_finite() {
        v
    } else {
        0.0
    }
}

fn frac(used: u64, total: u64) -> f64 {
    used as f64 / total.max(1) as f64
}

/// The newest buckets of a series as timeline points, merged pairwise until
/// they fit the report's bound.
fn timeline(series: &GpuSeries) -> Vec<TimelinePoint> {
    let mut points: Vec<TimelinePoint> = series
        .buckets()
        .map(|b| TimelinePoint {
            t: b.start as i64,
            max: b.max,
            min: b.min,
        })
        .collect();
    while points.len() > MAX_TIMELINE_POINTS {
        points = points
            .chunks(2)
            .map(|c| TimelinePoint {
                t: c[0].t,
                max: c.iter().map(|p| p.max).max().unwrap_or(0),
                min: c.iter().map(|p| p.min).min().unwrap_or(0),
            })
            .collect();
    }
    points
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::sim::{Scenario, SimSampler};

    fn leaking_monitor() -> Monitor {
        let s = Scenario::parse("default: { leakMiBPerSecond: 50, noiseGiB: 0 }").unwrap();
        Monitor::new(Box::new(SimSampler::new(s, 0)), Thresholds::default())
    }

    #[test]
    fn a_report_carries_analysis_and_a_bounded_timeline() {
        let mut m = leaking_monitor();
        for i in 0..600 {
            m.sample(1_000_000.0 + i as f64 * 0.5).unwrap();
        }
        m.analyse();
        let id = Identity {
            pod_name: "train-0".into(),
            rank: Some(0),
            ..Default::default()
        };
        let r = m.report(&id, "2026-11-22T10:00:00Z".into(), 500, vec![]);
        assert_eq!(r.gpus.len(), 1);
        let g = &r.gpus[0];
        assert!(g.risk >= RiskLevel::High, "{g:?}");
        assert!(g.leak_suspected);
        assert!(g.peak_bytes >= g.used_bytes);
        assert!(g.timeline.len() <= MAX_TIMELINE_POINTS && g.timeline.len() > 10);
        assert_eq!(r.summary.source, crate::api::DataSource::Sim);
        assert!(r.summary.time_to_oom.is_some());
        assert!(crate::analysis::validate_report(&r).is_ok());
        // Bounded size whatever the run length.
        assert!(serde_json::to_vec(&r).unwrap().len() < 8 * 1024);
    }

    #[test]
    fn fragmentation_comes_from_the_agent() {
        let mut m = leaking_monitor();
        m.sample(0.0).unwrap();
        m.agent_push(crate::agent::Push {
            version: 1,
            time: 1.0,
            devices: vec![crate::agent::DeviceStats {
                allocated_bytes: 30,
                reserved_bytes: 40,
                ..Default::default()
            }],
            ..Default::default()
        });
        let r = m.report(&Identity::default(), String::new(), 1000, vec![]);
        assert_eq!(r.gpus[0].fragmentation, Some(0.25));
    }
}
