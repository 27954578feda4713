//! Environment variables the webhook sets on the sidecar (and the trainers)
//! and the sidecar reads: one definition for both sides.

/// Pod name (downward API `metadata.name`).
pub const POD_NAME: &str = "POD_NAME";
/// Pod namespace (downward API `metadata.namespace`).
pub const POD_NAMESPACE: &str = "POD_NAMESPACE";
/// Node name (downward API `spec.nodeName`).
pub const NODE_NAME: &str = "NODE_NAME";
/// Pod UID (downward API `metadata.uid`), for the MemoryReport's owner reference.
pub const POD_UID: &str = "POD_UID";
/// Name of the Job the pod belongs to.
pub const JOB_NAME: &str = "MEMPROF_JOB_NAME";
/// The Job's parallelism: how many ranks the profile should expect.
pub const EXPECTED_RANKS: &str = "MEMPROF_EXPECTED_RANKS";
/// Completion index of an Indexed Job's pod (the rank).
pub const JOB_COMPLETION_INDEX: &str = "JOB_COMPLETION_INDEX";
/// Sampling interval, always written as whole milliseconds (`250ms`).
pub const INTERVAL: &str = "MEMPROF_INTERVAL";
/// Port of the sidecar's `/healthz` and `/metrics` on every interface (the
/// pod IP): set by the injection only when Prometheus scrapes the sidecars.
pub const PORT: &str = "MEMPROF_PORT";
/// Address of the sidecar's `/healthz` and `/metrics` when [`PORT`] is not
/// set (loopback by default).
pub const LISTEN: &str = "MEMPROF_LISTEN";
/// The Unix socket the sidecar serves `POST /v1/agent` and `GET /v1/report`
/// on, and the agent pushes to: set in the sidecar and every trainer
/// container (contract A, docs/agent-wire.md "Transport").
pub const AGENT_SOCKET: &str = "MEMPROF_AGENT_SOCKET";
/// Where the injection mounts the pod's private `emptyDir` holding the socket.
pub const AGENT_SOCKET_DIR: &str = "/var/run/memprof";
/// The socket in [`AGENT_SOCKET_DIR`]; the agent's default when
/// [`AGENT_SOCKET`] is not set.
pub const AGENT_SOCKET_PATH: &str = "/var/run/memprof/agent.sock";
/// `true` on legacy (non-native) sidecars: exit once the other containers
/// have terminated so that the Job can complete.
pub const EXIT_WHEN_ALONE: &str = "MEMPROF_EXIT_WHEN_ALONE";
/// GPU discovery method forced by the GPU access mode (`podResources`, `agentOnly`).
pub const GPU_DISCOVERY: &str = "MEMPROF_GPU_DISCOVERY";
/// Read by the NVIDIA container runtime: which GPUs to expose.
pub const NVIDIA_VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";
/// Read by the NVIDIA container runtime: which driver parts to mount.
pub const NVIDIA_DRIVER_CAPABILITIES: &str = "NVIDIA_DRIVER_CAPABILITIES";
/// Analysis threshold overrides, JSON of camelCase fields.
pub const THRESHOLDS: &str = "MEMPROF_THRESHOLDS";
/// `true`: the sidecar logs JSON lines.
pub const LOG_JSON: &str = "MEMPROF_LOG_JSON";
/// GPU UUIDs (or NVML indices) to sample, comma-separated (see [`split_list`]).
/// The injection writes it from the trainers' own `NVIDIA_VISIBLE_DEVICES`
/// when they set one.
pub const GPUS: &str = "MEMPROF_GPUS";
/// How many GPUs the pod requested (`nvidia.com/gpu`), written by the injection.
pub const REQUESTED_GPUS: &str = "MEMPROF_REQUESTED_GPUS";

/// The items of a comma-separated list ([`GPUS`], `NVIDIA_VISIBLE_DEVICES`),
/// trimmed, empty items dropped.
pub fn split_list(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(String::from)
        .collect()
}
