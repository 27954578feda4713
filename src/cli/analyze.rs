//! `memprof analyze TRACE.csv`: the sidecar's analysis, offline, as fast as it
//! can, printing each risk transition and time-to-OOM estimate as a JSON line.
//! For post-mortems and for tuning thresholds on recorded traces.

use crate::analysis::{assess, Assessment, GpuSeries, Sample, Thresholds};
use crate::api::RiskLevel;
use crate::sampler::trace::TraceRow;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// Options of an offline analysis.
#[derive(Clone, Debug)]
pub struct Options {
    /// Analysis thresholds.
    pub thresholds: Thresholds,
    /// Trace seconds between two analyses (the sidecar analyses every second).
    pub analyse_every: f64,
    /// Trace seconds between two `estimate` lines (0: none).
    pub estimate_every: f64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            thresholds: Thresholds::default(),
            analyse_every: 1.0,
            estimate_every: 10.0,
        }
    }
}

struct Gpu {
    series: GpuSeries,
    risk: RiskLevel,
    next_analysis: f64,
    next_estimate: f64,
    first_at: BTreeMap<RiskLevel, f64>,
    ceiling_at: Option<f64>,
    last: Option<Assessment>,
}

fn line(event: &str, t: f64, gpu: u32, a: &Assessment) -> Value {
    json!({
        "event": event,
        "t": (t * 1000.0).round() / 1000.0,
        "gpu": gpu,
        "risk": a.risk,
        "confidence": (a.confidence * 1000.0).round() / 1000.0,
        "usedBytes": a.used,
        "totalBytes": a.total,
        "growthBytesPerSecond": a.growth_bytes_per_second.round(),
        "timeToOomSeconds": a.time_to_oom_seconds.map(|x| (x * 10.0).round() / 10.0),
        "leakSuspected": a.leak_suspected,
        "spikeDetected": a.spike_detected,
        "reason": a.reason,
    })
}

/// Analyses `rows`, calling `emit` with each JSON line: `risk` on every
/// transition (with `from`), `estimate` every `estimate_every` seconds while a
/// time to OOM exists, and one `summary` per GPU at the end (peak, first time
/// at each risk level, first time within 1% of the ceiling).
pub fn analyze(rows: &[TraceRow], opts: &Options, mut emit: impl FnMut(Value)) {
    let mut gpus: BTreeMap<u32, Gpu> = BTreeMap::new();
    for r in rows {
        let g = gpus.entry(r.gpu).or_insert_with(|| Gpu {
            series: GpuSeries::new(&opts.thresholds),
            risk: RiskLevel::None,
            next_analysis: r.t,
            next_estimate: r.t,
            first_at: BTreeMap::new(),
            ceiling_at: None,
            last: None,
        });
        g.series.push(Sample {
            t: r.t,
            used: r.used_bytes,
            total: r.total_bytes,
        });
        if g.ceiling_at.is_none() && r.used_bytes as f64 >= 0.99 * r.total_bytes as f64 {
            g.ceiling_at = Some(r.t);
        }
        if r.t < g.next_analysis {
            continue;
        }
        g.next_analysis = r.t + opts.analyse_every;
        let a = assess(&g.series, &opts.thresholds);
        if a.risk != g.risk {
            let mut l = line("risk", r.t, r.gpu, &a);
            l["from"] = json!(g.risk);
            emit(l);
            g.risk = a.risk;
            g.first_at.entry(a.risk).or_insert(r.t);
        }
        if opts.estimate_every > 0.0 && r.t >= g.next_estimate && a.time_to_oom_seconds.is_some() {
            g.next_estimate = r.t + opts.estimate_every;
            emit(line("estimate", r.t, r.gpu, &a));
        }
        g.last = Some(a);
    }
    for (index, g) in gpus {
        let first: BTreeMap<String, f64> = g
            .first_at
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect();
        emit(json!({
            "event": "summary",
            "gpu": index,
            "samples": g.series.sample_count(),
            "peakBytes": g.series.peak(),
            "finalRisk": g.last.as_ref().map(|a| a.risk),
            "firstAt": first,
            "ceilingAt": g.ceiling_at,
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leak_trace() -> Vec<TraceRow> {
        let total = 80_000_000_000u64;
        (0..6000)
            .map(|i| {
                let t = i as f64 * 0.1;
                let used = (30e9 + 100e6 * t + 10e9 * ((t % 2.0) / 2.0)).min(total as f64) as u64;
                TraceRow {
                    t,
                    gpu: 0,
                    used_bytes: used,
                    total_bytes: total,
                    allocated_bytes: None,
                    reserved_bytes: None,
                }
            })
            .collect()
    }

    #[test]
    fn prints_transitions_estimates_and_a_summary() {
        let mut lines = vec![];
        analyze(&leak_trace(), &Options::default(), |l| lines.push(l));
        let risks: Vec<_> = lines
            .iter()
            .filter(|l| l["event"] == "risk")
            .map(|l| l["risk"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(risks.first().map(String::as_str), Some("low"));
        assert!(
            risks.contains(&"high".to_string()) && risks.contains(&"critical".to_string()),
            "{risks:?}"
        );
        assert!(lines.iter().any(|l| l["event"] == "estimate"));
        let summary = lines.last().unwrap();
        assert_eq!(summary["event"], "summary");
        let ceiling = summary["ceilingAt"].as_f64().unwrap();
        let high = summary["firstAt"]["high"].as_f64().unwrap();
        assert!(
            ceiling - high >= 60.0,
            "high at {high}, ceiling at {ceiling}"
        );
    }
}
