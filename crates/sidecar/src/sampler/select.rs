//! `--gpus` for the backends that are not NVML: a [`Selected`] sampler
//! reads only the listed GPUs of a simulated or replayed machine.
//!
//! Why at the source: everything downstream (the series, the analysis, the
//! report, the risk transitions, the trace and the CLI's plot) sees only what
//! the sampler returns. Filtering later, at display, left a GPU nobody asked
//! for in the report and its transitions on a plot that did not show it.

use super::{Error, GpuInfo, GpuReading, Sampler};
use memprof_api::DataSource;

/// A `--gpus` entry that names no GPU of the backend: the message lists
/// what exists, so the fix is in the same line.
#[derive(Debug, PartialEq, thiserror::Error)]
#[error("--gpus {entry}: no such GPU; this backend has {have}")]
pub struct NoSuchGpu {
    /// The entry.
    pub entry: String,
    /// Every GPU of the backend, `index (uuid)`, comma-separated.
    pub have: String,
}

/// The GPUs of `inner` that an entry of `wanted` names (an index or a UUID,
/// case-insensitive), in `inner`'s order.
pub struct Selected {
    inner: Box<dyn Sampler>,
    keep: Vec<usize>,
    gpus: Vec<GpuInfo>,
}

/// Whether a `--gpus` entry names this GPU.
pub fn names(entry: &str, gpu: &GpuInfo) -> bool {
    let entry = entry.trim();
    entry.parse::<u32>().is_ok_and(|i| i == gpu.index) || entry.eq_ignore_ascii_case(&gpu.uuid)
}

impl Selected {
    /// `inner` narrowed to the GPUs `wanted` names; `Err` with what exists
    /// when an entry names none (a typo must not silently watch nothing).
    pub fn new(inner: Box<dyn Sampler>, wanted: &[String]) -> Result<Self, NoSuchGpu> {
        let all = inner.gpus();
        if let Some(bad) = wanted.iter().find(|w| !all.iter().any(|g| names(w, g))) {
            let have: Vec<String> = all
                .iter()
                .map(|g| format!("{} ({})", g.index, g.uuid))
                .collect();
            return Err(NoSuchGpu {
                entry: bad.clone(),
                have: have.join(", "),
            });
        }
        let keep: Vec<usize> = (0..all.len())
            .filter(|&i| wanted.iter().any(|w| names(w, &all[i])))
            .collect();
        let gpus = keep.iter().map(|&i| all[i].clone()).collect();
        Ok(Selected { inner, keep, gpus })
    }
}

impl Sampler for Selected {
    fn source(&self) -> DataSource {
        self.inner.source()
    }

    fn gpus(&self) -> &[GpuInfo] {
        &self.gpus
    }

    fn sample(&mut self, t: f64) -> Result<Vec<GpuReading>, Error> {
        let all = self.inner.sample(t)?;
        Ok(self
            .keep
            .iter()
            .filter_map(|&i| all.get(i).copied())
            .collect())
    }

    fn active_processes(&mut self) -> Option<usize> {
        self.inner.active_processes()
    }

    fn processes(&mut self) -> Option<Vec<super::nvml::GpuProcess>> {
        self.inner.processes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::sim::{Scenario, SimSampler};

    fn three() -> Box<dyn Sampler> {
        let s = Scenario::parse("gpusPerRank: 3\ndefault: { baseGiB: 10 }").unwrap();
        Box::new(SimSampler::new(s, 0))
    }

    #[test]
    fn only_the_named_gpus_are_listed_and_sampled_by_index_or_uuid() {
        let wanted = vec!["0".to_string(), "gpu-SIM-0000-01".to_string()];
        let mut s = Selected::new(three(), &wanted).unwrap();
        let idx: Vec<u32> = s.gpus().iter().map(|g| g.index).collect();
        assert_eq!(idx, [0, 1]);
        assert_eq!(s.sample(0.0).unwrap().len(), 2);
        assert_eq!(s.source(), DataSource::Sim);
    }

    #[test]
    fn an_entry_that_names_no_gpu_is_an_error_that_lists_what_exists() {
        let e = Selected::new(three(), &["7".into()]).err().unwrap();
        assert_eq!(e.entry, "7");
        let e = e.to_string();
        assert!(
            e.contains("--gpus 7") && e.contains("2 (GPU-sim-0000-02)"),
            "{e}"
        );
    }
}
