//! Which GPUs are this pod's. A sidecar does not own the pod's GPUs: it runs
//! beside the trainer and, with `NVIDIA_VISIBLE_DEVICES=all`, NVML shows it
//! every GPU of the node. Discovery picks the pod's, in this order, and says
//! which method it used in the `GpuVisible` condition:
//!
//! 1. an explicit UUID list (`MEMPROF_GPUS`), matched among NVML's GPUs;
//! 2. the kubelet PodResources API (`List`, v1, read-only Unix socket), when
//!    asked for (`MEMPROF_GPU_DISCOVERY=podResources`) or when the socket is
//!    mounted: the devices of the pod's other containers, `::N` replica
//!    suffixes of time-sliced GPUs stripped, matched to NVML UUIDs;
//! 3. every GPU NVML sees;
//! 4. none through NVML ("agent only"): the in-process agent pushes what CUDA sees.
//!
//! The choice is the pure [`decide`]; the kubelet call is [`list_pod_resources`];
//! [`open_nvml_sampler`] puts them together for the sidecar.
//!
//! The PodResources messages are written out by hand as `prost` structs (only
//! the fields used; protobuf skips the others), and the call is one gRPC
//! unary request over hyper's HTTP/2 client: no tonic, no protoc, no build
//! script.

use super::nvml::{self, NvmlGpu, NvmlSampler};
use crate::api::Condition;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use http_body_util::{BodyExt, Full, Limited};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Type of the condition discovery sets.
pub const CONDITION_TYPE: &str = "GpuVisible";
/// Where the kubelet serves the PodResources API.
pub const DEFAULT_POD_RESOURCES_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";
/// The NVIDIA device plugin's resource name.
pub const DEFAULT_GPU_RESOURCE: &str = "nvidia.com/gpu";
/// Largest PodResources answer read (a node's every pod and container).
const MAX_RESPONSE_BYTES: usize = 16 << 20;

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
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => DiscoveryMode::Auto,
            "explicit" | "explicituuids" | "uuids" => DiscoveryMode::Explicit,
            "podresources" | "pod-resources" | "kubelet" => DiscoveryMode::PodResources,
            "all" | "allvisible" => DiscoveryMode::All,
            "agent" | "agentonly" | "none" => DiscoveryMode::Agent,
            other => {
                return Err(format!(
                    "unknown GPU discovery mode {other:?}: expected auto|explicit|podResources|all|agent"
                ))
            }
        })
    }
}

/// Which method found the GPUs; the condition's reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiscoveryMethod {
    /// From the explicit UUID list.
    ExplicitUuids,
    /// From the kubelet PodResources API.
    PodResources,
    /// Every GPU NVML sees.
    AllVisible,
    /// None through NVML; the in-process agent may report.
    AgentOnly,
    /// NVML could not be loaded or initialised.
    NvmlUnavailable,
}

impl DiscoveryMethod {
    /// The CamelCase reason of the `GpuVisible` condition.
    pub fn as_str(self) -> &'static str {
        match self {
            DiscoveryMethod::ExplicitUuids => "ExplicitUuids",
            DiscoveryMethod::PodResources => "PodResources",
            DiscoveryMethod::AllVisible => "AllVisible",
            DiscoveryMethod::AgentOnly => "AgentOnly",
            DiscoveryMethod::NvmlUnavailable => "NvmlUnavailable",
        }
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
            timeout: Duration::from_secs(5),
        }
    }
}

impl DiscoveryOptions {
    /// Options from the environment; unset variables keep the defaults.
    pub fn from_env() -> Result<Self, String> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let mut o = DiscoveryOptions::default();
        if let Some(v) = var("MEMPROF_GPUS") {
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

/// Splits a comma-separated list, dropping blanks.
pub fn split_list(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(String::from)
        .collect()
}

/// The outcome of discovery.
#[derive(Clone, Debug, PartialEq)]
pub struct Discovery {
    /// The method that decided.
    pub method: DiscoveryMethod,
    /// The GPUs to sample through NVML, in NVML index order; empty when none.
    pub gpus: Vec<NvmlGpu>,
    /// `GpuVisible`: `True` when there are GPUs to sample, else `False` with why.
    pub condition: Condition,
}

impl Discovery {
    fn visible(method: DiscoveryMethod, gpus: Vec<NvmlGpu>, message: String) -> Self {
        let condition = Condition::new(CONDITION_TYPE, true, method.as_str(), message);
        Discovery {
            method,
            gpus,
            condition,
        }
    }

    fn not_visible(method: DiscoveryMethod, message: String) -> Self {
        let condition = Condition::new(CONDITION_TYPE, false, method.as_str(), message);
        Discovery {
            method,
            gpus: vec![],
            condition,
        }
    }
}

/// What the kubelet said about this pod.
#[derive(Clone, Debug, PartialEq)]
pub enum PodLookup {
    /// The pod's GPU device IDs, as the device plugin named them.
    Found(Vec<String>),
    /// The kubelet does not list this pod.
    PodNotFound,
    /// The call failed.
    Failed(String),
}

/// A device ID without the `::N` replica suffix the NVIDIA device plugin adds
/// to time-sliced (shared) GPUs, as dcgm-exporter strips it.
pub fn strip_replica_suffix(id: &str) -> &str {
    match id.rsplit_once("::") {
        Some((base, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => base,
        _ => id,
    }
}

/// The NVML GPUs that `ids` name, in NVML index order and without duplicates,
/// and the IDs that name none. An ID is a UUID (`GPU-…`, any case), or an
/// index (the device plugin's `deviceIDStrategy=index`); `::N` suffixes are
/// ignored.
pub fn match_ids(ids: &[String], nvml: &[NvmlGpu]) -> (Vec<NvmlGpu>, Vec<String>) {
    let mut found: Vec<NvmlGpu> = Vec::new();
    let mut missing = Vec::new();
    for raw in ids {
        let id = strip_replica_suffix(raw.trim());
        let hit = nvml.iter().find(|g| {
            g.uuid.eq_ignore_ascii_case(id) || id.parse::<u32>().is_ok_and(|i| i == g.index)
        });
        match hit {
            Some(g) if !found.contains(g) => found.push(g.clone()),
            Some(_) => {}
            None if !missing.iter().any(|m: &String| m == id) => missing.push(id.to_string()),
            None => {}
        }
    }
    found.sort_by_key(|g| g.index);
    (found, missing)
}

/// The GPU device IDs of pod `namespace/name` in a `List` answer, from every
/// container but `own_container`, for the given resource names; `None` when
/// the pod is not listed.
pub fn pod_gpu_ids(
    resp: &ListPodResourcesResponse,
    namespace: &str,
    name: &str,
    own_container: Option<&str>,
    resource_names: &[String],
) -> Option<Vec<String>> {
    let pod = resp
        .pod_resources
        .iter()
        .find(|p| p.name == name && p.namespace == namespace)?;
    Some(
        pod.containers
            .iter()
            .filter(|c| Some(c.name.as_str()) != own_container)
            .flat_map(|c| &c.devices)
            .filter(|d| resource_names.contains(&d.resource_name))
            .flat_map(|d| d.device_ids.iter().cloned())
            .collect(),
    )
}

fn uuids(gpus: &[NvmlGpu]) -> String {
    gpus.iter()
        .map(|g| g.uuid.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Decides which GPUs to sample, and why. `nvml` is what NVML enumerated (or
/// why it could not); `pod` is the kubelet's answer, `None` when it was not
/// asked (see [`DiscoveryOptions::wants_pod_resources`]). Pure: every branch is
/// unit-tested without a driver or a kubelet.
pub fn decide(
    opts: &DiscoveryOptions,
    nvml: Result<&[NvmlGpu], &str>,
    pod: Option<PodLookup>,
) -> Discovery {
    use DiscoveryMethod::*;
    if opts.mode == DiscoveryMode::Agent {
        return Discovery::not_visible(
            AgentOnly,
            "GPU discovery is set to agent: the sidecar does not read NVML; the in-process \
             agent reports what CUDA sees"
                .into(),
        );
    }
    let all = match nvml {
        Ok(all) => all,
        Err(why) => return Discovery::not_visible(NvmlUnavailable, why.to_string()),
    };
    if all.is_empty() {
        return Discovery::not_visible(
            AgentOnly,
            "NVML sees no GPU: set NVIDIA_VISIBLE_DEVICES=all on the sidecar (and pick the pod's \
             GPUs with MEMPROF_GPUS or PodResources discovery), or rely on the in-process agent"
                .into(),
        );
    }

    let explicit = opts.mode == DiscoveryMode::Explicit
        || (opts.mode == DiscoveryMode::Auto && !opts.gpus.is_empty());
    if explicit {
        if opts.gpus.is_empty() {
            return Discovery::not_visible(
                ExplicitUuids,
                "GPU discovery is set to explicit but MEMPROF_GPUS is empty: list the pod's GPU \
                 UUIDs, comma-separated"
                    .into(),
            );
        }
        let (found, missing) = match_ids(&opts.gpus, all);
        return if found.is_empty() {
            Discovery::not_visible(
                ExplicitUuids,
                format!(
                    "none of the GPUs in MEMPROF_GPUS ({}) is among the {} NVML sees ({}): check \
                     the UUIDs (nvidia-smi -L) and NVIDIA_VISIBLE_DEVICES",
                    missing.join(", "),
                    all.len(),
                    uuids(all)
                ),
            )
        } else {
            let mut msg = format!(
                "{} GPU(s) from MEMPROF_GPUS: {}",
                found.len(),
                uuids(&found)
            );
            if !missing.is_empty() {
                msg.push_str(&format!("; not found by NVML: {}", missing.join(", ")));
            }
            Discovery::visible(ExplicitUuids, found, msg)
        };
    }

    if let Some(lookup) = pod {
        let pod_ref = format!(
            "{}/{}",
            opts.pod_namespace.as_deref().unwrap_or("?"),
            opts.pod_name.as_deref().unwrap_or("?")
        );
        // Once the kubelet is asked, its answer decides: falling back to every
        // GPU on the node would attribute other pods' memory to this one.
        return match lookup {
            PodLookup::Failed(why) => Discovery::not_visible(
                AgentOnly,
                format!(
                    "kubelet PodResources API at {} failed: {why}; set MEMPROF_GPUS, or check \
                     the socket mount and POD_NAME/POD_NAMESPACE",
                    opts.pod_resources_socket.display()
                ),
            ),
            PodLookup::PodNotFound => Discovery::not_visible(
                AgentOnly,
                format!("the kubelet lists no pod {pod_ref}: check POD_NAME and POD_NAMESPACE"),
            ),
            PodLookup::Found(ids) if ids.is_empty() => Discovery::not_visible(
                AgentOnly,
                format!(
                    "pod {pod_ref} was allocated no {} device",
                    opts.resource_names.join("/")
                ),
            ),
            PodLookup::Found(ids) => {
                let (found, missing) = match_ids(&ids, all);
                if found.is_empty() {
                    Discovery::not_visible(
                        PodResources,
                        format!(
                            "pod {pod_ref} holds {} but NVML sees only {}: set \
                             NVIDIA_VISIBLE_DEVICES=all on the sidecar (MIG devices are not sampled)",
                            missing.join(", "),
                            uuids(all)
                        ),
                    )
                } else {
                    let mut msg = format!(
                        "{} GPU(s) of pod {pod_ref} from the kubelet PodResources API: {}",
                        found.len(),
                        uuids(&found)
                    );
                    if !missing.is_empty() {
                        msg.push_str(&format!("; not found by NVML: {}", missing.join(", ")));
                    }
                    Discovery::visible(PodResources, found, msg)
                }
            }
        };
    }

    if opts.mode == DiscoveryMode::PodResources {
        return Discovery::not_visible(
            AgentOnly,
            "GPU discovery is set to podResources but the kubelet was not asked".into(),
        );
    }
    Discovery::visible(
        AllVisible,
        all.to_vec(),
        format!("all {} GPU(s) NVML sees: {}", all.len(), uuids(all)),
    )
}

/// Asks the kubelet for this pod's GPUs (pure decision aside: the I/O half).
pub async fn lookup_pod(opts: &DiscoveryOptions) -> PodLookup {
    let (Some(name), Some(ns)) = (&opts.pod_name, &opts.pod_namespace) else {
        return PodLookup::Failed(
            "POD_NAME and POD_NAMESPACE are not set (give them from the downward API)".into(),
        );
    };
    match list_pod_resources(&opts.pod_resources_socket, opts.timeout).await {
        Err(e) => PodLookup::Failed(e.to_string()),
        Ok(resp) => match pod_gpu_ids(
            &resp,
            ns,
            name,
            opts.own_container.as_deref(),
            &opts.resource_names,
        ) {
            Some(ids) => PodLookup::Found(ids),
            None => PodLookup::PodNotFound,
        },
    }
}

/// Discovers the pod's GPUs and opens an NVML sampler over them. Returns no
/// sampler when no GPU is visible through NVML; the condition (always
/// `GpuVisible`) says why and goes into the MemoryReport as it is.
pub async fn open_nvml_sampler(opts: &DiscoveryOptions) -> (Option<NvmlSampler>, Discovery) {
    let listed = if opts.mode == DiscoveryMode::Agent {
        Ok(vec![])
    } else {
        nvml::list_gpus().map_err(|e| e.to_string())
    };
    let pod = if listed.is_ok() && opts.wants_pod_resources(opts.pod_resources_socket.exists()) {
        Some(lookup_pod(opts).await)
    } else {
        None
    };
    let d = decide(opts, listed.as_deref().map_err(String::as_str), pod);
    if d.gpus.is_empty() {
        return (None, d);
    }
    let indices: Vec<u32> = d.gpus.iter().map(|g| g.index).collect();
    match NvmlSampler::new(&indices) {
        Ok(s) => (Some(s), d),
        Err(e) => (
            None,
            Discovery::not_visible(DiscoveryMethod::NvmlUnavailable, e.to_string()),
        ),
    }
}

// ---- kubelet PodResources v1 (k8s.io/kubelet/pkg/apis/podresources/v1/api.proto) ----

/// `ListPodResourcesRequest {}`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodResourcesRequest {}

/// `ListPodResourcesResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodResourcesResponse {
    /// Every pod on the node with its containers' resources.
    #[prost(message, repeated, tag = "1")]
    pub pod_resources: Vec<PodResources>,
}

/// `PodResources`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PodResources {
    /// Pod name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Pod namespace.
    #[prost(string, tag = "2")]
    pub namespace: String,
    /// Its containers.
    #[prost(message, repeated, tag = "3")]
    pub containers: Vec<ContainerResources>,
}

/// `ContainerResources` (cpu_ids, memory and dynamic_resources are not read).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerResources {
    /// Container name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Devices allocated by device plugins.
    #[prost(message, repeated, tag = "2")]
    pub devices: Vec<ContainerDevices>,
}

/// `ContainerDevices` (topology is not read).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerDevices {
    /// Extended resource name, e.g. `nvidia.com/gpu`.
    #[prost(string, tag = "1")]
    pub resource_name: String,
    /// Device IDs as the plugin named them (GPU UUIDs for NVIDIA's, `::N` when shared).
    #[prost(string, repeated, tag = "2")]
    pub device_ids: Vec<String>,
}

/// Errors of the PodResources call. Messages say what to check.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The socket could not be opened.
    #[error("cannot connect to {path}: {source} (is the kubelet's pod-resources directory mounted read-only into the sidecar?)")]
    Connect {
        /// Socket path.
        path: String,
        /// Underlying error.
        source: std::io::Error,
    },
    /// HTTP/2 failed (handshake, request or body).
    #[error("HTTP/2 to the kubelet failed: {0}")]
    Http(String),
    /// The kubelet answered with a gRPC error.
    #[error("kubelet answered gRPC status {code}: {message}")]
    Status {
        /// gRPC status code.
        code: u32,
        /// gRPC message.
        message: String,
    },
    /// The answer is not a valid message.
    #[error("cannot decode the kubelet's answer: {0}")]
    Decode(String),
    /// The call took too long.
    #[error("no answer from the kubelet within {0:?}")]
    Timeout(Duration),
}

/// A gRPC message frame: uncompressed flag, big-endian length, message.
fn grpc_frame(msg: &impl prost::Message) -> Bytes {
    let len = msg.encoded_len();
    let mut buf = BytesMut::with_capacity(5 + len);
    buf.put_u8(0);
    buf.put_u32(len as u32);
    msg.encode(&mut buf)
        .expect("a buffer sized for the message has room");
    buf.freeze()
}

/// The single message of a unary gRPC answer.
fn grpc_unframe(mut body: Bytes) -> Result<Bytes, Error> {
    if body.len() < 5 {
        return Err(Error::Decode(format!(
            "{} bytes, shorter than a gRPC frame header",
            body.len()
        )));
    }
    let compressed = body.get_u8();
    let len = body.get_u32() as usize;
    if compressed != 0 {
        return Err(Error::Decode(
            "compressed message (none was offered)".into(),
        ));
    }
    if body.len() < len {
        return Err(Error::Decode(format!(
            "frame says {len} bytes, {} arrived",
            body.len()
        )));
    }
    Ok(body.split_to(len))
}

fn grpc_status(h: &hyper::HeaderMap) -> Option<Result<(), Error>> {
    let code: u32 = h.get("grpc-status")?.to_str().ok()?.trim().parse().ok()?;
    Some(if code == 0 {
        Ok(())
    } else {
        Err(Error::Status {
            code,
            message: h
                .get("grpc-message")
                .and_then(|m| m.to_str().ok())
                .unwrap_or("")
                .to_string(),
        })
    })
}

/// Calls `v1.PodResourcesLister/List` on the kubelet's Unix socket.
pub async fn list_pod_resources(
    socket: &Path,
    timeout: Duration,
) -> Result<ListPodResourcesResponse, Error> {
    tokio::time::timeout(timeout, list_pod_resources_inner(socket))
        .await
        .map_err(|_| Error::Timeout(timeout))?
}

async fn list_pod_resources_inner(socket: &Path) -> Result<ListPodResourcesResponse, Error> {
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|source| Error::Connect {
            path: socket.display().to_string(),
            source,
        })?;
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .map_err(|e| Error::Http(e.to_string()))?;
    let driver = tokio::spawn(conn);
    let req = hyper::Request::post("http://localhost/v1.PodResourcesLister/List")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(grpc_frame(&ListPodResourcesRequest {})))
        .map_err(|e| Error::Http(e.to_string()))?;
    let result = async {
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| Error::Http(e.to_string()))?;
        if resp.status() != hyper::StatusCode::OK {
            return Err(Error::Http(format!("HTTP status {}", resp.status())));
        }
        // A trailers-only answer carries the gRPC status in the headers.
        if let Some(status) = grpc_status(resp.headers()) {
            status?;
        }
        let collected = Limited::new(resp.into_body(), MAX_RESPONSE_BYTES)
            .collect()
            .await
            .map_err(|e| Error::Http(e.to_string()))?;
        if let Some(status) = collected.trailers().and_then(grpc_status) {
            status?;
        }
        let msg = grpc_unframe(collected.to_bytes())?;
        <ListPodResourcesResponse as prost::Message>::decode(msg)
            .map_err(|e| Error::Decode(e.to_string()))
    }
    .await;
    driver.abort();
    result
}

#[cfg(test)]
#[path = "discovery_tests.rs"]
mod tests;
