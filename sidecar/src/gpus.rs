//! Opens the sampler the flags ask for, and says whether GPUs are visible.

use memprof::api::Condition;
use memprof::sampler::{self, sim, trace, GpuInfo, GpuReading, Sampler};

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
    fn source(&self) -> memprof::api::DataSource {
        memprof::api::DataSource::Nvml
    }
    fn gpus(&self) -> &[GpuInfo] {
        &[]
    }
    fn sample(&mut self, _t: f64) -> Result<Vec<GpuReading>, sampler::Error> {
        Ok(vec![])
    }
}

/// Opens the backend. Never fails the sidecar: when GPUs cannot be read the
/// result is [`NoGpus`] with a `GpuVisible=False` condition saying why.
pub async fn open(args: &crate::Args, rank: u32) -> (Box<dyn Sampler>, Condition) {
    let result: Result<(Box<dyn Sampler>, Condition), String> = match args.backend {
        Backend::Sim => match &args.scenario {
            None => Err("--backend sim needs --scenario FILE".into()),
            Some(path) => sim::Scenario::from_file(path).map_err(|e| e.to_string()).map(|s| {
                let gpus = s.gpus_per_rank;
                let c = Condition::new(GPU_VISIBLE, true, "Simulated", format!("{gpus} simulated GPU(s) from scenario {path}, rank {rank}: not hardware"));
                (Box::new(sim::SimSampler::new(s, rank)) as Box<dyn Sampler>, c)
            }),
        },
        Backend::Trace => match &args.trace {
            None => Err("--backend trace needs --trace FILE".into()),
            Some(path) => trace::read_trace(path).map_err(|e| e.to_string()).map(|rows| {
                let s = trace::TraceSampler::new(rows);
                let c = Condition::new(GPU_VISIBLE, true, "Replayed", format!("{} GPU(s) replayed from trace {path}", s.gpus().len()));
                (Box::new(s) as Box<dyn Sampler>, c)
            }),
        },
        Backend::Nvml => {
            let (sampler, discovery) = open_nvml(args).await;
            return match sampler {
                Some(s) => (s, discovery),
                None => {
                    tracing::error!("no GPU visible through NVML: {}", discovery.message);
                    (Box::new(NoGpus), discovery)
                }
            };
        }
    };
    match result {
        Ok(ok) => ok,
        Err(why) => {
            tracing::error!("no GPU visible: {why}");
            (
                Box::new(NoGpus),
                Condition::new(GPU_VISIBLE, false, "BackendUnavailable", why),
            )
        }
    }
}

/// GPU discovery in DESIGN.md's order (explicit UUIDs, kubelet PodResources,
/// all GPUs NVML sees only when they are all the pod's, else none), then an
/// NVML sampler over what it found.
async fn open_nvml(args: &crate::Args) -> (Option<Box<dyn Sampler>>, Condition) {
    use memprof::sampler::discovery::{self, DiscoveryOptions};
    let mut opts = match DiscoveryOptions::from_env() {
        Ok(o) => o,
        Err(why) => {
            return (
                None,
                Condition::new(GPU_VISIBLE, false, "InvalidDiscovery", why),
            )
        }
    };
    if let Some(list) = &args.gpus {
        opts.gpus = discovery::split_list(list);
    }
    // Standalone profiles a machine: what NVML sees is the user's. A sidecar
    // writing a pod's report is shown every GPU of the node.
    opts.whole_machine = args.standalone;
    let (sampler, found) = discovery::open_nvml_sampler(&opts).await;
    (
        sampler.map(|s| Box::new(s) as Box<dyn Sampler>),
        found.condition,
    )
}
