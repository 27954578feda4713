//! The analysis half of a sidecar in one object: each GPU's NVML history,
//! the in-process agent's pushes, the rule that combines them, and the
//! hysteresis of the published level and leak flag. The sidecar's monitor
//! and the replay of recordings (`crate::evaluate`, `memprof analyze
//! --evaluate`) drive the same [`Tracker`], so what is measured on a
//! recording is what a pod would have reported.
//!
//! Combination (docs/analysis.md): a GPU both see keeps NVML's numbers and
//! takes risk, growth, time to OOM and the leak flag from the allocator
//! while the agent's pushes are fresh ([`AGENT_FRESH_SECONDS`]); a GPU only
//! the agent sees is assessed from the agent alone. Matching is by UUID
//! when the sampler knows the GPU's, else by index.
//!
//! Pure: time comes with each call.

use crate::allocator::{AgentState, AllocatorAssessment};
use crate::hysteresis::{FlagGate, Hold, LevelGate};
use crate::{assess, Assessment, GpuSeries, Sample};
use memprof_api::agent::Push;
use memprof_api::thresholds::Thresholds;
use memprof_api::RiskLevel;

/// The agent's assessment replaces NVML's for a GPU while its newest push
/// is at most this old (sample time, seconds): a trainer that stopped
/// pushing leaves the GPU to NVML again.
pub const AGENT_FRESH_SECONDS: f64 = 30.0;

/// What is published for one GPU after an analysis.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuVerdict {
    /// GPU index (the sampler's; for a GPU only the agent sees, its CUDA ordinal).
    pub index: u32,
    /// The sampler knows no such GPU: only the agent sees it.
    pub agent_only: bool,
    /// Risk, growth, time to OOM and leak flag as published: `risk` and
    /// `leak_suspected` after the hysteresis.
    pub assessment: Assessment,
    /// The risk before the hysteresis.
    pub raw_risk: RiskLevel,
    /// The leak flag before the hysteresis.
    pub raw_leak: bool,
    /// Whether the assessment is the allocator's (the agent's).
    pub from_agent: bool,
}

#[derive(Clone, Debug)]
struct Gpu {
    index: u32,
    uuid: Option<String>,
    series: GpuSeries,
    level: LevelGate,
    leak: FlagGate,
}

/// Every GPU of a pod, and its trainer's agent, as the sidecar analyses them.
#[derive(Clone, Debug)]
pub struct Tracker {
    thresholds: Thresholds,
    hold: Hold,
    gpus: Vec<Gpu>,
    agent_only: Vec<(u32, LevelGate, FlagGate)>,
    agent: AgentState,
    agent_received: Option<f64>,
    last_t: f64,
    verdicts: Vec<GpuVerdict>,
    agent_assessments: Vec<AllocatorAssessment>,
}

impl Tracker {
    /// No GPU and no push yet.
    pub fn new(th: &Thresholds) -> Self {
        Tracker {
            thresholds: th.clone(),
            hold: Hold::from_thresholds(th),
            gpus: Vec::new(),
            agent_only: Vec::new(),
            agent: AgentState::new(th),
            agent_received: None,
            last_t: f64::NEG_INFINITY,
            verdicts: Vec::new(),
            agent_assessments: Vec::new(),
        }
    }

    /// One NVML (or simulated) sample of GPU `index` at time `t`.
    pub fn sample(&mut self, t: f64, index: u32, uuid: Option<&str>, used: u64, total: u64) {
        let at = match self.gpus.iter().position(|g| g.index == index) {
            Some(i) => i,
            None if self.gpus.len() < memprof_api::MAX_GPUS_PER_REPORT => {
                self.gpus.push(Gpu {
                    index,
                    uuid: None,
                    series: GpuSeries::new(&self.thresholds),
                    level: LevelGate::default(),
                    leak: FlagGate::default(),
                });
                self.gpus.len() - 1
            }
            None => return,
        };
        let g = &mut self.gpus[at];
        if let Some(u) = uuid {
            g.uuid = Some(u.to_string());
        }
        g.series.push(Sample { t, used, total });
        self.last_t = self.last_t.max(t);
    }

    /// One (validated) push of the agent, received after the latest sample.
    pub fn push(&mut self, p: &Push) {
        self.agent.observe(p);
        self.agent_received = Some(self.last_t);
    }

    /// What the agent pushed so far.
    pub fn agent(&self) -> &AgentState {
        &self.agent
    }

    /// The allocator's assessments of the last analysis, in the order of
    /// [`AgentState::devices`].
    pub fn agent_assessments(&self) -> &[AllocatorAssessment] {
        &self.agent_assessments
    }

    /// NVML's history of GPU `index`.
    pub fn series(&self, index: u32) -> Option<&GpuSeries> {
        self.gpus
            .iter()
            .find(|g| g.index == index)
            .map(|g| &g.series)
    }

    fn agent_fresh(&self) -> bool {
        self.agent_received
            .is_some_and(|at| self.last_t - at <= AGENT_FRESH_SECONDS)
    }

    /// Re-assesses every GPU at time `t` (the sidecar: once per second).
    pub fn analyse(&mut self, t: f64) -> &[GpuVerdict] {
        self.agent_assessments = self.agent.assess();
        let fresh = self.agent_fresh();
        let devices = self.agent.devices();
        let mut matched = vec![false; devices.len()];
        let mut out = Vec::with_capacity(self.gpus.len());
        for g in &mut self.gpus {
            let nvml = assess(&g.series, &self.thresholds);
            let found = devices.iter().position(|d| match &g.uuid {
                Some(u) => d.uuid.as_deref() == Some(u.as_str()),
                None => d.index == g.index,
            });
            if let Some(i) = found {
                matched[i] = true;
            }
            let agent = found
                .map(|i| &self.agent_assessments[i].risk)
                .filter(|a| fresh && a.risk > RiskLevel::None);
            let (a, from_agent) = match agent {
                Some(a) => (a.clone(), true),
                None => (nvml, false),
            };
            out.push(publish(
                (g.index, false),
                a,
                from_agent,
                t,
                (&mut g.level, &mut g.leak),
                self.hold,
            ));
        }
        for (i, d) in devices.iter().enumerate() {
            if matched[i] {
                continue;
            }
            let at = match self.agent_only.iter().position(|(x, _, _)| *x == d.index) {
                Some(at) => at,
                None => {
                    self.agent_only
                        .push((d.index, LevelGate::default(), FlagGate::default()));
                    self.agent_only.len() - 1
                }
            };
            let (_, level, leak) = &mut self.agent_only[at];
            let a = self.agent_assessments[i].risk.clone();
            out.push(publish(
                (d.index, true),
                a,
                true,
                t,
                (level, leak),
                self.hold,
            ));
        }
        out.truncate(memprof_api::MAX_GPUS_PER_REPORT);
        self.verdicts = out;
        &self.verdicts
    }

    /// The verdicts of the last analysis.
    pub fn verdicts(&self) -> &[GpuVerdict] {
        &self.verdicts
    }
}

/// The raw assessment through the GPU's gates.
fn publish(
    (index, agent_only): (u32, bool),
    mut a: Assessment,
    from_agent: bool,
    t: f64,
    (level, leak): (&mut LevelGate, &mut FlagGate),
    hold: Hold,
) -> GpuVerdict {
    let raw_risk = a.risk;
    let raw_leak = a.leak_suspected;
    a.risk = level.update(t, raw_risk, hold);
    a.leak_suspected = leak.update(t, raw_leak, hold);
    GpuVerdict {
        index,
        agent_only,
        assessment: a,
        raw_risk,
        raw_leak,
        from_agent,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_api::agent::{DeviceStats, VERSION};

    const G: u64 = 1 << 30;

    fn push(t: f64, allocated: u64) -> Push {
        Push {
            version: VERSION,
            time: t,
            devices: vec![DeviceStats {
                index: 0,
                uuid: Some("GPU-a".into()),
                allocated_bytes: allocated,
                reserved_bytes: allocated + G,
                peak_allocated_bytes: Some(allocated),
                free_bytes: Some(78 * G - allocated),
                total_bytes: Some(80 * G),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn the_agent_assesses_a_gpu_it_shares_with_nvml_while_it_pushes() {
        let th = Thresholds::default();
        let mut tr = Tracker::new(&th);
        for s in 0..40 {
            let t = s as f64;
            tr.sample(t, 0, Some("GPU-a"), 40 * G, 80 * G);
            tr.push(&push(t, 10 * G));
            let v = &tr.analyse(t)[0];
            assert!(v.from_agent && !v.agent_only);
        }
        // The pushes stop: after 30 s the GPU is NVML's again.
        for s in 40..80 {
            tr.sample(s as f64, 0, Some("GPU-a"), 40 * G, 80 * G);
            tr.analyse(s as f64);
        }
        assert!(!tr.verdicts()[0].from_agent);
        // A GPU the agent sees and NVML does not is reported from the agent alone.
        let mut tr = Tracker::new(&th);
        tr.sample(0.0, 0, Some("GPU-b"), 40 * G, 80 * G);
        tr.push(&push(0.0, 10 * G));
        let v = tr.analyse(0.0);
        assert_eq!(v.len(), 2);
        assert!(v[1].agent_only && v[1].from_agent);
    }
}
