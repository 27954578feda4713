//! GPU samplers: where memory numbers come from.
//!
//! One trait, several real implementations: [`sim::SimSampler`] (scenario
//! files, for demos and tests — documented as simulation, never presented as
//! hardware), [`trace::TraceSampler`] (replays a recorded CSV trace) and the
//! NVML sampler for real GPUs. The sidecar's sample → analyse → write path is
//! the same whichever is plugged in.

pub mod discovery;
pub mod nvml;
pub mod select;
pub mod sim;
pub mod trace;

use memprof_api::DataSource;

/// A GPU as discovered at start-up.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuInfo {
    /// NVML index on the node (or the position in a scenario/trace).
    pub index: u32,
    /// GPU UUID.
    pub uuid: String,
    /// Product name.
    pub model: String,
    /// Total memory, bytes.
    pub total_bytes: u64,
}

/// One reading of one GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GpuReading {
    /// Memory in use, bytes.
    pub used_bytes: u64,
    /// Total memory, bytes.
    pub total_bytes: u64,
    /// Utilization, percent, when the backend knows it.
    pub utilization_percent: Option<u32>,
    /// Bytes per second received over PCIe, when the backend knows it
    /// (NVML: a 20 ms glimpse, read with the utilization).
    pub received_bytes_per_second: Option<u64>,
}

/// Errors of samplers. Messages say what to do.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A scenario file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// File path.
        path: String,
        /// Underlying error.
        source: std::io::Error,
    },
    /// A scenario file is not valid.
    #[error("invalid scenario {path}: {why}")]
    Scenario {
        /// File path.
        path: String,
        /// What is wrong and how to fix it.
        why: sim::ScenarioError,
    },
    /// The GPU backend failed.
    #[error("GPU backend {backend}: {why}")]
    Backend {
        /// Backend name.
        backend: &'static str,
        /// What failed, and what to do.
        why: String,
    },
}

/// A source of GPU memory readings.
pub trait Sampler: Send {
    /// Where this sampler's numbers come from.
    fn source(&self) -> DataSource;
    /// The GPUs this sampler reads, in a fixed order.
    fn gpus(&self) -> &[GpuInfo];
    /// Reads every GPU, in the order of [`Sampler::gpus`]. `t` is the time of
    /// the sample in seconds; simulated and replayed backends read their
    /// timeline at `t`, the hardware backend ignores it.
    fn sample(&mut self, t: f64) -> Result<Vec<GpuReading>, Error>;
    /// How many processes compute on these GPUs right now, when the backend
    /// can tell (NVML can; a trace cannot). Lets a sidecar that is not a
    /// native sidecar notice that the trainer is gone and exit, so the Job
    /// completes.
    fn active_processes(&mut self) -> Option<usize> {
        None
    }
    /// The compute processes on these GPUs with the memory each holds, when
    /// the backend can tell (NVML's per-process usage): the analysis names
    /// the process that grows (a neighbour on a shared GPU).
    fn processes(&mut self) -> Option<Vec<nvml::GpuProcess>> {
        None
    }
}
