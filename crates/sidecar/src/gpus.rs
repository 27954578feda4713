//! Opens the sampler the flags ask for, and says whether GPUs are visible.

use crate::sampler::discovery::{self, DiscoveryMethod, DiscoveryOptions};
use crate::sampler::{self, select, sim, trace, GpuInfo, GpuReading, Sampler};
use memprof_api::Condition;

/// Which backend to sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// Real GPUs through NVML.
    Nvml,
    /// A simulation scenario (demos and tests; reported as source `sim`).
    Sim,
    /// Replay of a recorded CSV trace.
    Trace,
}

/// The `GpuVisible` condition type.
pub const GPU_VISIBLE: &str = "GpuVisible";

/// A sampler with no GPUs: what runs when none is visible, so the sidecar
/// keeps serving and reporting *that* rather than zeros.
pub struct NoGpus;

impl Sampler for NoGpus {
    fn source(&self) -> memprof_api::DataSource {
        memprof_api::DataSource::Nvml
    }
    fn gpus(&self) -> &[GpuInfo] {
        &[]
    }
    fn sample(&mut self, _t: f64) -> Result<Vec<GpuReading>, sampler::Error> {
        Ok(vec![])
    }
}

/// The backend, whether GPUs are visible, and, when NVML works but nothing
/// said which GPUs are the pod's, what the in-process agent may still name.
pub struct Opened {
    /// The sampler ([`NoGpus`] when none is visible).
    pub sampler: Box<dyn Sampler>,
    /// `GpuVisible`.
    pub condition: Condition,
    /// Set when discovery found the pod's GPUs ambiguous.
    pub agent_named: Option<AgentNamed>,
}

/// The pod's GPUs as the in-process agent names them, for a sidecar whose
/// discovery could not tell them from the node's others (`AmbiguousGpus`).
/// Each push names the devices its process uses (a torchrun rank: its own),
/// so the pod's are the union over pushes.
pub struct AgentNamed {
    opts: DiscoveryOptions,
    uuids: Vec<String>,
    sampled: Vec<u32>,
}

impl AgentNamed {
    /// At most as many UUIDs as a node has GPUs (the push's own bound).
    const MAX: usize = memprof_api::agent::MAX_DEVICES;

    fn new(opts: DiscoveryOptions) -> Self {
        AgentNamed {
            opts,
            uuids: vec![],
            sampled: vec![],
        }
    }

    /// Adds a push's UUIDs to those known; true when one is new.
    pub fn add(&mut self, push: &memprof_api::agent::Push) -> bool {
        let before = self.uuids.len();
        for uuid in push.devices.iter().filter_map(|d| d.uuid.as_deref()) {
            let known = self.uuids.iter().any(|u| u.eq_ignore_ascii_case(uuid));
            if !known && !uuid.is_empty() && self.uuids.len() < Self::MAX {
                self.uuids.push(uuid.to_string());
            }
        }
        self.uuids.len() > before
    }

    /// A sampler over the GPUs the agent named so far, when a push named a
    /// new one and NVML samples other GPUs than before; its `GpuVisible`.
    pub fn learn(
        &mut self,
        push: &memprof_api::agent::Push,
    ) -> Option<(Box<dyn Sampler>, Condition)> {
        if !self.add(push) {
            return None;
        }
        let (sampler, found) = discovery::open_agent_named(&self.opts, &self.uuids);
        let sampler = sampler?;
        let indices: Vec<u32> = found.gpus.iter().map(|g| g.index).collect();
        if indices == self.sampled {
            return None;
        }
        self.sampled = indices;
        Some((Box::new(sampler) as Box<dyn Sampler>, found.condition))
    }
}

/// Why the simulated or replayed backend could not be opened; the sidecar
/// samples nothing and says this in its `GpuVisible` condition.
#[derive(Debug, thiserror::Error)]
enum OpenError {
    #[error("--backend sim needs --scenario FILE")]
    NoScenario,
    #[error("--backend trace needs --trace FILE")]
    NoTrace,
    #[error(transparent)]
    Scenario(#[from] sampler::Error),
    #[error(transparent)]
    Trace(#[from] memprof_api::trace::TraceError),
    #[error(transparent)]
    Select(#[from] select::NoSuchGpu),
}

/// Opens the backend. Never fails the sidecar: when GPUs cannot be read the
/// result is [`NoGpus`] with a `GpuVisible=False` condition saying why.
pub async fn open(args: &crate::Args, rank: u32) -> Opened {
    let result: Result<(Box<dyn Sampler>, Condition), OpenError> = match args.backend {
        Backend::Sim => match &args.scenario {
            None => Err(OpenError::NoScenario),
            Some(path) => sim::Scenario::from_file(path).map_err(OpenError::from).map(|s| {
                let gpus = s.gpus_per_rank;
                let c = Condition::new(GPU_VISIBLE, true, "Simulated", format!("{gpus} simulated GPU(s) from scenario {path}, rank {rank}: not hardware"));
                (Box::new(sim::SimSampler::new(s, rank)) as Box<dyn Sampler>, c)
            }),
        },
        Backend::Trace => match &args.trace {
            None => Err(OpenError::NoTrace),
            Some(path) => memprof_api::trace::read_trace(path).map_err(OpenError::from).map(|rows| {
                let s = trace::TraceSampler::new(rows);
                let c = Condition::new(GPU_VISIBLE, true, "Replayed", format!("{} GPU(s) replayed from trace {path}", s.gpus().len()));
                (Box::new(s) as Box<dyn Sampler>, c)
            }),
        },
        Backend::Nvml => return open_nvml(args).await,
    };
    let result = result.and_then(|(sampler, c)| select(sampler, c, args.gpus.as_deref()));
    let (sampler, condition) = match result {
        Ok(ok) => ok,
        Err(why) => {
            tracing::error!("no GPU visible: {why}");
            (
                Box::new(NoGpus) as Box<dyn Sampler>,
                Condition::new(GPU_VISIBLE, false, "BackendUnavailable", why.to_string()),
            )
        }
    };
    Opened {
        sampler,
        condition,
        agent_named: None,
    }
}

/// `--gpus` on a simulated or replayed machine: only the listed GPUs are
/// sampled (NVML's discovery applies the list itself).
fn select(
    sampler: Box<dyn Sampler>,
    c: Condition,
    gpus: Option<&str>,
) -> Result<(Box<dyn Sampler>, Condition), OpenError> {
    let wanted = gpus.map(memprof_api::env::split_list).unwrap_or_default();
    if wanted.is_empty() {
        return Ok((sampler, c));
    }
    let s = select::Selected::new(sampler, &wanted)?;
    let message = format!(
        "{} (of which --gpus {} selected)",
        c.message,
        wanted.join(",")
    );
    let c = Condition::new(GPU_VISIBLE, true, &c.reason, message);
    Ok((Box::new(s) as Box<dyn Sampler>, c))
}

/// GPU discovery in DESIGN.md's order (explicit UUIDs, kubelet PodResources,
/// all GPUs NVML sees only when they are all the pod's, else none until the
/// in-process agent names them), then an NVML sampler over what it found.
async fn open_nvml(args: &crate::Args) -> Opened {
    let none = |condition: Condition, agent_named| {
        tracing::error!("no GPU visible through NVML: {}", condition.message);
        Opened {
            sampler: Box::new(NoGpus),
            condition,
            agent_named,
        }
    };
    let mut opts = match DiscoveryOptions::from_env() {
        Ok(o) => o,
        Err(why) => {
            return none(
                Condition::new(GPU_VISIBLE, false, "InvalidDiscovery", why.to_string()),
                None,
            )
        }
    };
    if let Some(list) = &args.gpus {
        opts.gpus = memprof_api::env::split_list(list);
    }
    // Standalone profiles a machine: what NVML sees is the user's. A sidecar
    // writing a pod's report is shown every GPU of the node.
    opts.whole_machine = args.standalone;
    let (sampler, found) = discovery::open_nvml_sampler(&opts).await;
    match sampler {
        Some(s) => Opened {
            sampler: Box::new(s),
            condition: found.condition,
            agent_named: None,
        },
        None => {
            let ambiguous = found.method == DiscoveryMethod::AmbiguousGpus;
            none(found.condition, ambiguous.then(|| AgentNamed::new(opts)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_api::agent::{DeviceStats, Push};

    fn push(uuids: &[Option<&str>]) -> Push {
        Push {
            devices: uuids
                .iter()
                .enumerate()
                .map(|(i, u)| DeviceStats {
                    index: i as u32,
                    uuid: u.map(String::from),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn the_agents_gpus_are_the_union_of_its_pushes() {
        let mut a = AgentNamed::new(DiscoveryOptions::default());
        assert!(a.add(&push(&[Some("GPU-aaaa")])), "rank 0");
        assert!(!a.add(&push(&[Some("gpu-AAAA"), None])), "nothing new");
        assert!(a.add(&push(&[Some("GPU-bbbb")])), "rank 1");
        assert_eq!(a.uuids, ["GPU-aaaa", "GPU-bbbb"]);
        let many: Vec<String> = (0..40).map(|i| format!("GPU-{i}")).collect();
        let many: Vec<Option<&str>> = many.iter().map(|s| Some(s.as_str())).collect();
        a.add(&push(&many));
        assert_eq!(a.uuids.len(), AgentNamed::MAX, "bounded");
    }
}
