//! What GPU discovery is told: the mode and the options, from the
//! environment the injection writes (or the sidecar's flags).

use super::{DEFAULT_POD_RESOURCES_SOCKET, ENV_IN_KUBERNETES};
use memprof_api::env::{self, split_list};
use memprof_api::DEFAULT_GPU_RESOURCE;
use std::path::PathBuf;
use std::time::Duration;

/// What in the discovery variables cannot be used; the sidecar shows it in
/// the report's `GPUVisible` condition (`InvalidDiscovery`).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum OptionsError {
    /// `MEMPROF_GPU_DISCOVERY` names no mode.
    #[error("unknown GPU discovery mode {0:?}: expected auto|explicit|podResources|all|agent")]
    UnknownMode(String),
    /// `MEMPROF_REQUESTED_GPUS` is not a count.
    #[error("{}={:?} is not a number of GPUs", env::REQUESTED_GPUS, .0)]
    RequestedGpus(String),
}

/// How to discover GPUs (`MEMPROF_GPU_DISCOVERY`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DiscoveryMode {
    /// The design's order: explicit list, PodResources when its socket is there, all.
    #[default]
    Auto,
    /// Only the explicit UUID list.
    Explicit,
    /// Only the kubelet PodResources API.
    PodResources,
    /// Every GPU NVML sees.
    All,
    /// No NVML: the in-process agent reports.
    Agent,
}

impl std::str::FromStr for DiscoveryMode {
    type Err = OptionsError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => DiscoveryMode::Auto,
            "explicit" | "explicituuids" | "uuids" => DiscoveryMode::Explicit,
            "podresources" | "pod-resources" | "kubelet" => DiscoveryMode::PodResources,
            "all" | "allvisible" => DiscoveryMode::All,
            "agent" | "agentonly" | "none" => DiscoveryMode::Agent,
            other => return Err(OptionsError::UnknownMode(other.to_string())),
        })
    }
}

/// What discovery needs to know. Every field has an environment variable,
/// read by [`DiscoveryOptions::from_env`]; the sidecar's flags may fill it instead.
#[derive(Clone, Debug, PartialEq)]
pub struct DiscoveryOptions {
    /// GPU UUIDs to sample (`MEMPROF_GPUS`, comma-separated).
    pub gpus: Vec<String>,
    /// Discovery mode (`MEMPROF_GPU_DISCOVERY`).
    pub mode: DiscoveryMode,
    /// The kubelet's PodResources socket (`MEMPROF_POD_RESOURCES_SOCKET`).
    pub pod_resources_socket: PathBuf,
    /// This pod's name (`POD_NAME`, from the downward API).
    pub pod_name: Option<String>,
    /// This pod's namespace (`POD_NAMESPACE`).
    pub pod_namespace: Option<String>,
    /// The sidecar's own container, whose devices (none, normally) are not the trainer's
    /// (`MEMPROF_CONTAINER_NAME`).
    pub own_container: Option<String>,
    /// Extended resources that are GPUs (`MEMPROF_GPU_RESOURCES`, comma-separated).
    pub resource_names: Vec<String>,
    /// How many GPUs the pod requested (`MEMPROF_REQUESTED_GPUS`); `None` when
    /// nobody said.
    pub requested_gpus: Option<u32>,
    /// Every GPU NVML sees belongs to this process's user: true on a machine
    /// (`--standalone`, outside Kubernetes), false for a sidecar in a pod,
    /// which is shown every GPU of the node. False by default: the safe side.
    pub whole_machine: bool,
    /// Limit on the whole PodResources call.
    pub timeout: Duration,
}

impl Default for DiscoveryOptions {
    fn default() -> Self {
        DiscoveryOptions {
            gpus: vec![],
            mode: DiscoveryMode::Auto,
            pod_resources_socket: DEFAULT_POD_RESOURCES_SOCKET.into(),
            pod_name: None,
            pod_namespace: None,
            own_container: None,
            resource_names: vec![DEFAULT_GPU_RESOURCE.into()],
            requested_gpus: None,
            whole_machine: false,
            timeout: Duration::from_secs(5),
        }
    }
}

impl DiscoveryOptions {
    /// Options from the environment; unset variables keep the defaults. A
    /// process outside Kubernetes (no `KUBERNETES_SERVICE_HOST`) counts as
    /// owning the whole machine; callers that know better set `whole_machine`.
    pub fn from_env() -> Result<Self, OptionsError> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// [`Self::from_env`] over any lookup of variables (tests pass a map).
    pub fn from_vars(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, OptionsError> {
        let var = |k: &str| lookup(k).filter(|v| !v.trim().is_empty());
        let mut o = DiscoveryOptions::default();
        if let Some(v) = var(env::GPUS) {
            o.gpus = split_list(&v);
        }
        if let Some(v) = var("MEMPROF_GPU_DISCOVERY") {
            o.mode = v.parse()?;
        }
        if let Some(v) = var("MEMPROF_POD_RESOURCES_SOCKET") {
            o.pod_resources_socket = v.into();
        }
        o.pod_name = var("POD_NAME");
        o.pod_namespace = var("POD_NAMESPACE");
        o.own_container = var("MEMPROF_CONTAINER_NAME");
        if let Some(v) = var("MEMPROF_GPU_RESOURCES") {
            o.resource_names = split_list(&v);
        }
        if let Some(v) = var(env::REQUESTED_GPUS) {
            o.requested_gpus = Some(
                v.trim()
                    .parse()
                    .map_err(|_| OptionsError::RequestedGpus(v.clone()))?,
            );
        }
        o.whole_machine = var(ENV_IN_KUBERNETES).is_none();
        Ok(o)
    }

    /// Whether to ask the kubelet: when told to, or in auto mode without an
    /// explicit list when the socket is mounted (the chart mounts it only
    /// when PodResources discovery is on).
    pub fn wants_pod_resources(&self, socket_exists: bool) -> bool {
        match self.mode {
            DiscoveryMode::PodResources => true,
            DiscoveryMode::Auto => self.gpus.is_empty() && socket_exists,
            _ => false,
        }
    }
}
