//! MIG (Multi-Instance GPU) in discovery: not supported, and never reported
//! as the pod's.
//!
//! A MIG-enabled GPU is split into instances that the device plugin hands to
//! different pods; NVML's memory numbers for the GPU are all instances'
//! together, other tenants' included, and dcgm-exporter reports each
//! instance as its own row (the parent's `UUID` plus `GPU_I_ID`). Sampling
//! an instance needs its MIG device handle, which memprof has not been able
//! to check on MIG hardware; until it has, a MIG-enabled GPU is never
//! sampled, and a pod whose GPUs are MIG instances gets `GpuVisible=False`
//! with reason `MigUnsupported` (the in-process agent still reports what
//! CUDA sees: the instance's own memory).

use super::{Discovery, DiscoveryMethod, NvmlGpu};

/// The prefix NVML gives MIG device UUIDs (and the device plugin's IDs under
/// the `single` and `mixed` strategies).
pub const MIG_UUID_PREFIX: &str = "MIG-";

/// Whether a device ID names a MIG instance.
pub fn is_mig_id(id: &str) -> bool {
    id.get(..4)
        .is_some_and(|p| p.eq_ignore_ascii_case(MIG_UUID_PREFIX))
}

/// `gpus` split into whole GPUs and MIG-enabled ones.
pub fn whole_and_mig(gpus: &[NvmlGpu]) -> (Vec<NvmlGpu>, Vec<NvmlGpu>) {
    gpus.iter().cloned().partition(|g| !g.mig)
}

/// What is MIG among what was asked for: MIG-enabled GPUs that matched and
/// MIG instance IDs that matched nothing, by name.
pub fn named(mig_gpus: &[NvmlGpu], missing: &[String]) -> Vec<String> {
    mig_gpus
        .iter()
        .map(|g| format!("{} (GPU {}, MIG mode on)", g.uuid, g.index))
        .chain(missing.iter().filter(|m| is_mig_id(m)).cloned())
        .collect()
}

/// The note for a message that reports other GPUs.
pub fn note(names: &[String]) -> String {
    format!(
        "; not sampled: {} (MIG devices are not supported)",
        names.join(", ")
    )
}

/// No GPU is reported because what is the pod's is MIG.
pub fn unsupported(names: &[String]) -> Discovery {
    Discovery::not_visible(
        DiscoveryMethod::MigUnsupported,
        format!(
            "the pod's GPUs are MIG devices ({}): memprof does not sample MIG devices, and a \
             MIG-enabled GPU's memory is every instance's, other tenants' included, so none is \
             reported as this pod's. The in-process agent (gpuAccess=agentOnly, \
             memprof.dev/agent: python) reports the instance's own memory as CUDA sees it",
            names.join(", ")
        ),
    )
}
