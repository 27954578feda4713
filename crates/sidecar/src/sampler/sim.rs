//! The simulated GPU backend: a scenario file describes each rank's GPU
//! memory over time. Deterministic for a given seed, so demos and tests
//! reproduce. It is a simulation, reported with source `sim`, never as hardware.
//!
//! ```yaml
//! seed: 7
//! totalGiB: 80          # memory of each simulated GPU
//! gpusPerRank: 1
//! default:              # applies to every rank
//!   baseGiB: 30         # weights, optimizer state, allocator cache
//!   amplitudeGiB: 10    # activations at the end of forward
//!   periodSeconds: 2    # one training step
//!   noiseGiB: 0.2
//! ranks:                # per-rank overrides of `default`
//!   "2": { leakMiBPerSecond: 150 }
//!   "3": { baseGiB: 45 }
//!   "1": { spikeAtSeconds: 300, spikeGiB: 20, spikeSeconds: 30 }
//!   "0": { oomAtSeconds: 600 }
//! batch:                # optional: memory follows the trainer's batch size
//!   env: BATCH_SIZE     # read from the sidecar's own environment
//!   staticGiB: 30       # becomes every rank's baseGiB
//!   perSampleGiB: 0.5   # × the batch becomes every rank's amplitudeGiB
//! ```
//!
//! With `batch`, the simulated peak is `staticGiB + perSampleGiB × batch`, so
//! a Job recreated with a smaller batch really needs less memory: what the
//! batch fit (`analysis::batchfit`, `scaleBatch` `mode: fit`) is tested on.
//! The sim reports NVML-like readings only, never a breakdown: the fit then
//! rests on peaks observed at two batch sizes, as it would without the agent.

use super::{Error, GpuInfo, GpuReading, Sampler};
use memprof_api::DataSource;
use serde::Deserialize;
use std::collections::BTreeMap;

const GIB: f64 = (1u64 << 30) as f64;
const MIB: f64 = (1u64 << 20) as f64;

/// A simulation scenario.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Scenario {
    /// Seed of the noise generator.
    #[serde(default)]
    pub seed: u64,
    /// Memory of each simulated GPU, GiB.
    #[serde(default = "default_total")]
    pub total_gi_b: f64,
    /// GPUs per rank.
    #[serde(default = "one")]
    pub gpus_per_rank: u32,
    /// Pattern of every rank.
    #[serde(default)]
    pub default: Pattern,
    /// Per-rank overrides, keyed by rank number.
    #[serde(default)]
    pub ranks: BTreeMap<String, PatternOverride>,
    /// Memory that follows the batch size (base and amplitude of every rank).
    #[serde(default)]
    pub batch: Option<BatchModel>,
}

/// Memory as a function of the batch size: `static + perSample × batch`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BatchModel {
    /// Env var holding the batch size, read from the sidecar's environment.
    #[serde(default = "default_batch_env")]
    pub env: String,
    /// Memory that does not grow with the batch, GiB (the pattern's base).
    pub static_gi_b: f64,
    /// Activations per sample, GiB (× the batch: the pattern's amplitude).
    pub per_sample_gi_b: f64,
}

fn default_batch_env() -> String {
    "BATCH_SIZE".into()
}

fn default_total() -> f64 {
    80.0
}
fn one() -> u32 {
    1
}

/// The memory pattern of one GPU.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Pattern {
    /// Floor: weights, optimizer state, allocator cache, GiB.
    pub base_gi_b: f64,
    /// Rise of activations over one forward pass, GiB.
    pub amplitude_gi_b: f64,
    /// Length of one training step, seconds.
    pub period_seconds: f64,
    /// Uniform noise amplitude, GiB.
    pub noise_gi_b: f64,
    /// Linear leak, MiB per second.
    pub leak_mi_b_per_second: f64,
    /// Start of a spike, seconds.
    pub spike_at_seconds: Option<f64>,
    /// Height of the spike, GiB.
    pub spike_gi_b: f64,
    /// Duration of the spike, seconds.
    pub spike_seconds: f64,
    /// Time at which memory is driven to the total (an OOM), seconds; the
    /// process then dies and its memory is freed.
    pub oom_at_seconds: Option<f64>,
    /// Fraction of each step spent at the activations' peak (0: a sawtooth
    /// that only approaches it). Lets a sampler see the true peak.
    pub hold_fraction: f64,
}

impl Default for Pattern {
    fn default() -> Self {
        Pattern {
            base_gi_b: 30.0,
            amplitude_gi_b: 10.0,
            period_seconds: 2.0,
            noise_gi_b: 0.2,
            leak_mi_b_per_second: 0.0,
            spike_at_seconds: None,
            spike_gi_b: 0.0,
            spike_seconds: 0.0,
            oom_at_seconds: None,
            hold_fraction: 0.0,
        }
    }
}

/// Per-rank overrides: any field left out keeps the default pattern's value.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PatternOverride {
    base_gi_b: Option<f64>,
    amplitude_gi_b: Option<f64>,
    period_seconds: Option<f64>,
    noise_gi_b: Option<f64>,
    leak_mi_b_per_second: Option<f64>,
    spike_at_seconds: Option<f64>,
    spike_gi_b: Option<f64>,
    spike_seconds: Option<f64>,
    oom_at_seconds: Option<f64>,
    hold_fraction: Option<f64>,
}

/// What is wrong with a scenario; the file's error adds its path.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// Not YAML of a scenario (an unknown field, a wrong type).
    #[error("{0}")]
    Yaml(#[from] serde_yaml::Error),
    /// `totalGiB` is zero, negative or NaN.
    #[error("totalGiB must be positive")]
    Total,
    /// `gpusPerRank` outside 1..=16.
    #[error("gpusPerRank must be between 1 and 16")]
    GpusPerRank,
    /// `batch` without an env or with negative sizes.
    #[error("batch needs a non-empty env and non-negative staticGiB and perSampleGiB")]
    Batch,
    /// A `ranks` key that is not a number.
    #[error("ranks key {0:?} is not a rank number")]
    RankKey(String),
    /// `periodSeconds` zero or negative.
    #[error("periodSeconds must be positive")]
    Period,
    /// `holdFraction` outside [0, 1).
    #[error("holdFraction must be at least 0 and below 1")]
    HoldFraction,
    /// A negative size.
    #[error("baseGiB, amplitudeGiB, noiseGiB and spikeGiB must not be negative")]
    Negative,
}

impl Scenario {
    /// Reads a scenario from a YAML or JSON file.
    pub fn from_file(path: &str) -> Result<Self, Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.into(),
            source,
        })?;
        Self::parse(&text).map_err(|why| Error::Scenario {
            path: path.into(),
            why,
        })
    }

    /// Parses and validates a scenario (YAML is a superset of JSON).
    pub fn parse(text: &str) -> Result<Self, ScenarioError> {
        let s: Scenario = serde_yaml::from_str(text)?;
        s.validate()?;
        Ok(s)
    }

    fn validate(&self) -> Result<(), ScenarioError> {
        use ScenarioError as E;
        if self.total_gi_b.is_nan() || self.total_gi_b <= 0.0 {
            return Err(E::Total);
        }
        if self.gpus_per_rank == 0 || self.gpus_per_rank > 16 {
            return Err(E::GpusPerRank);
        }
        if let Some(b) = &self.batch {
            let ok = |v: f64| v.is_finite() && v >= 0.0;
            if !ok(b.static_gi_b) || !ok(b.per_sample_gi_b) || b.env.is_empty() {
                return Err(E::Batch);
            }
        }
        if let Some(key) = self.ranks.keys().find(|k| k.parse::<u32>().is_err()) {
            return Err(E::RankKey(key.clone()));
        }
        for rank in std::iter::once(None).chain(self.ranks.keys().map(|k| k.parse().ok())) {
            let p = self.pattern(rank.unwrap_or(0));
            if p.period_seconds <= 0.0 {
                return Err(E::Period);
            }
            if !(0.0..1.0).contains(&p.hold_fraction) {
                return Err(E::HoldFraction);
            }
            if p.base_gi_b < 0.0
                || p.amplitude_gi_b < 0.0
                || p.noise_gi_b < 0.0
                || p.spike_gi_b < 0.0
            {
                return Err(E::Negative);
            }
        }
        Ok(())
    }

    /// The pattern of `rank`: the default with the rank's overrides applied.
    pub fn pattern(&self, rank: u32) -> Pattern {
        let mut p = self.default.clone();
        if let Some(o) = self.ranks.get(&rank.to_string()) {
            macro_rules! apply {
                ($($f:ident),*) => { $( if let Some(v) = o.$f { p.$f = v; } )* };
            }
            apply!(
                base_gi_b,
                amplitude_gi_b,
                period_seconds,
                noise_gi_b,
                leak_mi_b_per_second,
                spike_gi_b,
                spike_seconds,
                hold_fraction
            );
            if o.spike_at_seconds.is_some() {
                p.spike_at_seconds = o.spike_at_seconds;
            }
            if o.oom_at_seconds.is_some() {
                p.oom_at_seconds = o.oom_at_seconds;
            }
        }
        p
    }

    /// The pattern of `rank` when the trainer runs at `batch`: with a
    /// `batch` model, base and amplitude follow it; otherwise as [`Self::pattern`].
    pub fn pattern_at_batch(&self, rank: u32, batch: Option<u64>) -> Pattern {
        let mut p = self.pattern(rank);
        if let (Some(m), Some(b)) = (&self.batch, batch) {
            p.base_gi_b = m.static_gi_b;
            p.amplitude_gi_b = m.per_sample_gi_b * b as f64;
        }
        p
    }
}

impl Pattern {
    /// Used bytes at scenario time `t` (seconds from the start), before noise.
    pub fn used_at(&self, t: f64, total: f64) -> f64 {
        if let Some(oom) = self.oom_at_seconds {
            if t >= oom {
                // The trainer died of the OOM: only a CUDA context's worth is left, then nothing.
                return if t < oom + 1.0 { total } else { 0.0 };
            }
        }
        let phase = ((t / self.period_seconds).fract() / (1.0 - self.hold_fraction)).min(1.0);
        let mut used = self.base_gi_b * GIB
            + self.amplitude_gi_b * GIB * phase
            + self.leak_mi_b_per_second * MIB * t;
        if let Some(at) = self.spike_at_seconds {
            if t >= at && t < at + self.spike_seconds {
                used += self.spike_gi_b * GIB;
            }
        }
        used.min(total)
    }
}

/// Samples the GPUs of one rank of a scenario.
pub struct SimSampler {
    scenario: Scenario,
    pattern: Pattern,
    gpus: Vec<GpuInfo>,
    start: Option<f64>,
    last_t: Option<f64>,
    rng: SplitMix64,
}

impl SimSampler {
    /// A sampler for `rank` of `scenario`.
    pub fn new(scenario: Scenario, rank: u32) -> Self {
        let total = (scenario.total_gi_b * GIB) as u64;
        let gpus = (0..scenario.gpus_per_rank)
            .map(|i| GpuInfo {
                index: i,
                uuid: format!("GPU-sim-{rank:04}-{i:02}"),
                model: "memprof simulated GPU".into(),
                total_bytes: total,
            })
            .collect();
        // The batch is read where the trainer's is: the process environment.
        let batch = scenario
            .batch
            .as_ref()
            .and_then(|b| std::env::var(&b.env).ok()?.trim().parse().ok());
        let pattern = scenario.pattern_at_batch(rank, batch);
        let rng = SplitMix64(scenario.seed ^ (u64::from(rank) << 32));
        SimSampler {
            scenario,
            pattern,
            gpus,
            start: None,
            last_t: None,
            rng,
        }
    }
}

impl Sampler for SimSampler {
    fn active_processes(&mut self) -> Option<usize> {
        // The simulated trainer runs until its scenario's OOM kills it.
        let (Some(start), Some(last)) = (self.start, self.last_t) else {
            return None;
        };
        Some(usize::from(
            self.pattern
                .oom_at_seconds
                .is_none_or(|oom| last - start < oom + 1.0),
        ))
    }

    fn source(&self) -> DataSource {
        DataSource::Sim
    }

    fn gpus(&self) -> &[GpuInfo] {
        &self.gpus
    }

    fn sample(&mut self, t: f64) -> Result<Vec<GpuReading>, Error> {
        let start = *self.start.get_or_insert(t);
        self.last_t = Some(t);
        let total = self.scenario.total_gi_b * GIB;
        let clean = self.pattern.used_at(t - start, total);
        Ok(self
            .gpus
            .iter()
            .map(|g| {
                let noise = if clean > 0.0 {
                    (self.rng.next_f64() * 2.0 - 1.0) * self.pattern.noise_gi_b * GIB
                } else {
                    0.0
                };
                GpuReading {
                    used_bytes: (clean + noise).clamp(0.0, total) as u64,
                    total_bytes: g.total_bytes,
                    utilization_percent: Some(if clean > 0.0 { 90 } else { 0 }),
                    received_bytes_per_second: None,
                }
            })
            .collect())
    }
}

/// A small, seedable generator: enough for noise, no dependency.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_f64(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEMO: &str = r#"
seed: 7
totalGiB: 80
default: { baseGiB: 30, amplitudeGiB: 10, periodSeconds: 2, noiseGiB: 0.2 }
ranks:
  "2": { leakMiBPerSecond: 150 }
  "3": { baseGiB: 45 }
  "0": { oomAtSeconds: 100 }
"#;

    #[test]
    fn overrides_apply_per_rank() {
        let s = Scenario::parse(DEMO).unwrap();
        assert_eq!(s.pattern(2).leak_mi_b_per_second, 150.0);
        assert_eq!(s.pattern(2).base_gi_b, 30.0);
        assert_eq!(s.pattern(3).base_gi_b, 45.0);
        assert_eq!(s.pattern(1), s.default);
    }

    #[test]
    fn same_seed_same_readings() {
        let s = Scenario::parse(DEMO).unwrap();
        let mut a = SimSampler::new(s.clone(), 2);
        let mut b = SimSampler::new(s, 2);
        for i in 0..100 {
            assert_eq!(a.sample(i as f64).unwrap(), b.sample(i as f64).unwrap());
        }
    }

    #[test]
    fn leak_grows_and_oom_frees_memory() {
        let s = Scenario::parse(DEMO).unwrap();
        let p = s.pattern(2);
        let total = 80.0 * GIB;
        assert!(
            (p.used_at(100.0, total) - p.used_at(0.0, total) - 100.0 * 150.0 * MIB).abs() < 1.0
        );
        let p0 = s.pattern(0);
        assert_eq!(p0.used_at(100.5, total), total);
        assert_eq!(p0.used_at(102.0, total), 0.0);
    }

    #[test]
    fn memory_follows_the_batch_and_holds_its_peak() {
        let s = Scenario::parse(
            "batch: { staticGiB: 66.5, perSampleGiB: 0.2 }\ndefault: { holdFraction: 0.5, noiseGiB: 0 }\nranks: { \"1\": { baseGiB: 1 } }",
        )
        .unwrap();
        assert_eq!(s.batch.as_ref().unwrap().env, "BATCH_SIZE");
        let total = 80.0 * GIB;
        for rank in [0, 1] {
            let p = s.pattern_at_batch(rank, Some(64));
            // Half a step (1 s of 2) at the peak, the first half rising to it.
            assert_eq!(p.used_at(1.0, total), (66.5 + 0.2 * 64.0) * GIB);
            assert_eq!(p.used_at(1.9, total), (66.5 + 0.2 * 64.0) * GIB);
            assert_eq!(p.used_at(0.5, total), (66.5 + 0.1 * 64.0) * GIB);
        }
        let at48 = s.pattern_at_batch(0, Some(48));
        assert!((at48.used_at(1.5, total) - (66.5 + 0.2 * 48.0) * GIB).abs() < 1.0);
        // No batch in the environment: the pattern as written.
        assert_eq!(s.pattern_at_batch(1, None).base_gi_b, 1.0);
        assert!(Scenario::parse("batch: { staticGiB: -1, perSampleGiB: 1 }")
            .unwrap_err()
            .to_string()
            .contains("batch needs"));
        assert!(Scenario::parse("default: { holdFraction: 1 }")
            .unwrap_err()
            .to_string()
            .contains("holdFraction"));
    }

    #[test]
    fn bad_scenarios_are_named() {
        assert!(Scenario::parse("totalGiB: 0")
            .unwrap_err()
            .to_string()
            .contains("totalGiB"));
        assert!(Scenario::parse("ranks: { x: {} }")
            .unwrap_err()
            .to_string()
            .contains("not a rank number"));
        assert!(Scenario::parse("default: { periodSeconds: 0 }")
            .unwrap_err()
            .to_string()
            .contains("periodSeconds"));
        assert!(Scenario::parse("bogus: 1")
            .unwrap_err()
            .to_string()
            .contains("unknown field"));
        assert!(matches!(
            Scenario::parse("bogus: 1"),
            Err(ScenarioError::Yaml(_))
        ));
        assert!(matches!(
            Scenario::parse("ranks: { x: {} }"),
            Err(ScenarioError::RankKey(k)) if k == "x"
        ));
    }
}
