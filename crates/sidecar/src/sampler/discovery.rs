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
//! 3. the UUIDs the in-process agent says its process uses (CUDA's view);
//! 4. every GPU NVML sees, but only where they are all this pod's: on a
//!    machine outside Kubernetes, or when NVML sees no more GPUs than the pod
//!    requested (`MEMPROF_REQUESTED_GPUS`, written by the injection);
//! 5. otherwise none (`AmbiguousGpus`): with `NVIDIA_VISIBLE_DEVICES=all` a
//!    sidecar sees every GPU of the node, and reporting them all would put
//!    other tenants' memory into this pod's report (and let their memory
//!    pressure remediate this pod's Job);
//! 6. none through NVML ("agent only") when told so: the in-process agent
//!    pushes what CUDA sees.
//!
//! The choice is the pure [`decide`]; the kubelet call is [`list_pod_resources`]
//! (in `discovery/podresources.rs`); [`open_nvml_sampler`] puts them together
//! for the sidecar.

use super::nvml::{self, NvmlGpu, NvmlSampler};
use memprof_api::env;
use memprof_api::Condition;

/// Type of the condition discovery sets.
pub const CONDITION_TYPE: &str = "GpuVisible";
/// Where the kubelet serves the PodResources API.
pub const DEFAULT_POD_RESOURCES_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";
/// Set by the kubelet in every container of every pod: tells a process
/// started by hand on a machine from one started in a pod.
const ENV_IN_KUBERNETES: &str = "KUBERNETES_SERVICE_HOST";

/// Which method found the GPUs; the condition's reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiscoveryMethod {
    /// From the explicit UUID list.
    ExplicitUuids,
    /// From the kubelet PodResources API.
    PodResources,
    /// From the UUIDs the in-process agent reported (CUDA's view of the trainer).
    AgentUuids,
    /// Every GPU NVML sees (all of them are this pod's, or this machine's).
    AllVisible,
    /// NVML sees more GPUs than the pod requested and nothing says which are
    /// its own: none is reported.
    AmbiguousGpus,
    /// None through NVML; the in-process agent may report.
    AgentOnly,
    /// NVML could not be loaded or initialised.
    NvmlUnavailable,
    /// The pod's GPUs are MIG devices, which are not sampled
    /// (`discovery/mig.rs`).
    MigUnsupported,
}

impl DiscoveryMethod {
    /// The CamelCase reason of the `GpuVisible` condition.
    pub fn as_str(self) -> &'static str {
        match self {
            DiscoveryMethod::ExplicitUuids => "ExplicitUuids",
            DiscoveryMethod::PodResources => "PodResources",
            DiscoveryMethod::AgentUuids => "AgentUuids",
            DiscoveryMethod::AllVisible => "AllVisible",
            DiscoveryMethod::AmbiguousGpus => "AmbiguousGpus",
            DiscoveryMethod::AgentOnly => "AgentOnly",
            DiscoveryMethod::NvmlUnavailable => "NvmlUnavailable",
            DiscoveryMethod::MigUnsupported => "MigUnsupported",
        }
    }
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
/// and the IDs that name none. An ID is a UUID (`GPU-…`, any case, the prefix
/// optional as torch leaves it out), or an index (the device plugin's
/// `deviceIDStrategy=index`); `::N` suffixes are ignored.
pub fn match_ids(ids: &[String], nvml: &[NvmlGpu]) -> (Vec<NvmlGpu>, Vec<String>) {
    let mut found: Vec<NvmlGpu> = Vec::new();
    let mut missing = Vec::new();
    for raw in ids {
        let id = strip_replica_suffix(raw.trim());
        let hit = nvml
            .iter()
            .find(|g| same_uuid(&g.uuid, id) || id.parse::<u32>().is_ok_and(|i| i == g.index));
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

/// UUIDs compared without case and without NVML's `GPU-` prefix (torch's
/// `get_device_properties(i).uuid` has none).
pub fn same_uuid(a: &str, b: &str) -> bool {
    fn bare(s: &str) -> &str {
        match s.get(..4) {
            Some(p) if p.eq_ignore_ascii_case("GPU-") => &s[4..],
            _ => s,
        }
    }
    !bare(a).is_empty() && bare(a).eq_ignore_ascii_case(bare(b))
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
        device_ids(pod, own_container, resource_names)
            .cloned()
            .collect(),
    )
}

/// The device IDs a pod's containers (all but `skip`) hold of the given
/// resource names, as the kubelet listed them.
pub fn device_ids<'a>(
    pod: &'a PodResources,
    skip: Option<&'a str>,
    resource_names: &'a [String],
) -> impl Iterator<Item = &'a String> + 'a {
    pod.containers
        .iter()
        .filter(move |c| Some(c.name.as_str()) != skip)
        .flat_map(|c| &c.devices)
        .filter(move |d| resource_names.contains(&d.resource_name))
        .flat_map(|d| &d.device_ids)
}

fn uuids(gpus: &[NvmlGpu]) -> String {
    gpus.iter()
        .map(|g| g.uuid.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// "the N NVML sees", with their UUIDs only on a whole machine: in a pod the
/// others are other tenants' GPUs, and their names do not belong in this
/// pod's report.
fn seen(opts: &DiscoveryOptions, all: &[NvmlGpu]) -> String {
    if opts.whole_machine {
        format!("the {} NVML sees ({})", all.len(), uuids(all))
    } else {
        format!("the {} NVML sees", all.len())
    }
}

/// What the GPUs were matched from, for [`from_ids`].
struct IdSource<'a> {
    method: DiscoveryMethod,
    /// e.g. "from MEMPROF_GPUS", "of pod ml/train-0 from the kubelet PodResources API".
    found: String,
    /// Why none matched, and what to check.
    none_match: &'a str,
}

/// The GPUs `ids` name among NVML's, or why none does. MIG-enabled GPUs and
/// MIG instance IDs are never sampled (`discovery/mig.rs`).
fn from_ids(opts: &DiscoveryOptions, all: &[NvmlGpu], ids: &[String], src: IdSource) -> Discovery {
    let (found, missing) = match_ids(ids, all);
    let (found, mig_gpus) = mig::whole_and_mig(&found);
    let mig_named = mig::named(&mig_gpus, &missing);
    if found.is_empty() && !mig_named.is_empty() {
        return mig::unsupported(&mig_named);
    }
    if found.is_empty() {
        return Discovery::not_visible(
            src.method,
            format!(
                "none of {} is among {}: {}",
                missing.join(", "),
                seen(opts, all),
                src.none_match
            ),
        );
    }
    let mut msg = format!("{} GPU(s) {}: {}", found.len(), src.found, uuids(&found));
    let missing: Vec<String> = missing.into_iter().filter(|m| !mig::is_mig_id(m)).collect();
    if !missing.is_empty() {
        msg.push_str(&format!("; not found by NVML: {}", missing.join(", ")));
    }
    if !mig_named.is_empty() {
        msg.push_str(&mig::note(&mig_named));
    }
    Discovery::visible(src.method, found, msg)
}

/// Decides which GPUs to sample, and why. `nvml` is what NVML enumerated (or
/// why it could not); `pod` is the kubelet's answer, `None` when it was not
/// asked (see [`DiscoveryOptions::wants_pod_resources`]); `agent` the GPU
/// UUIDs the in-process agent reported (empty when none). Pure: every branch
/// is unit-tested without a driver, a kubelet or an agent.
pub fn decide(
    opts: &DiscoveryOptions,
    nvml: Result<&[NvmlGpu], &str>,
    pod: Option<PodLookup>,
    agent: &[String],
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
        return from_explicit(opts, all);
    }

    if let Some(lookup) = pod {
        // Once the kubelet is asked, its answer decides: falling back to every
        // GPU on the node would attribute other pods' memory to this one.
        return from_kubelet(opts, all, lookup);
    }

    if opts.mode == DiscoveryMode::PodResources {
        return Discovery::not_visible(
            AgentOnly,
            "GPU discovery is set to podResources but the kubelet was not asked".into(),
        );
    }
    if opts.mode == DiscoveryMode::Auto && !agent.is_empty() {
        let src = IdSource {
            method: AgentUuids,
            found: "named by the in-process agent".into(),
            none_match:
                "set NVIDIA_VISIBLE_DEVICES=all on the sidecar (MIG devices are not sampled)",
        };
        return from_ids(opts, all, agent, src);
    }
    all_if_the_pods(opts, all)
}

/// The GPUs `MEMPROF_GPUS` names.
fn from_explicit(opts: &DiscoveryOptions, all: &[NvmlGpu]) -> Discovery {
    if opts.gpus.is_empty() {
        return Discovery::not_visible(
            DiscoveryMethod::ExplicitUuids,
            "GPU discovery is set to explicit but MEMPROF_GPUS is empty: list the pod's GPU \
             UUIDs, comma-separated"
                .into(),
        );
    }
    let src = IdSource {
        method: DiscoveryMethod::ExplicitUuids,
        found: "from MEMPROF_GPUS".into(),
        none_match: "check the UUIDs (nvidia-smi -L) and NVIDIA_VISIBLE_DEVICES",
    };
    from_ids(opts, all, &opts.gpus, src)
}

/// The kubelet's answer about this pod, matched to NVML's GPUs.
fn from_kubelet(opts: &DiscoveryOptions, all: &[NvmlGpu], lookup: PodLookup) -> Discovery {
    use DiscoveryMethod::*;
    let pod_ref = format!(
        "{}/{}",
        opts.pod_namespace.as_deref().unwrap_or("?"),
        opts.pod_name.as_deref().unwrap_or("?")
    );
    match lookup {
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
            let src = IdSource {
                method: PodResources,
                found: format!("of pod {pod_ref} from the kubelet PodResources API"),
                none_match:
                    "set NVIDIA_VISIBLE_DEVICES=all on the sidecar (MIG devices are not sampled)",
            };
            from_ids(opts, all, &ids, src)
        }
    }
}

/// Every whole GPU NVML sees, when they are all this pod's (or this
/// machine's); none otherwise. A sidecar with `NVIDIA_VISIBLE_DEVICES=all`
/// sees the whole node: only when NVML sees no more GPUs than the pod
/// requested are they all the pod's. Never all "to be helpful": another
/// tenant's memory in this pod's report would also let its pressure
/// remediate this pod's Job. MIG-enabled GPUs do not count and are never
/// reported: under the device plugin's `single` strategy a pod's
/// `nvidia.com/gpu` are instances, and the parent's memory is every tenant's.
fn all_if_the_pods(opts: &DiscoveryOptions, all: &[NvmlGpu]) -> Discovery {
    let (whole, mig_gpus) = mig::whole_and_mig(all);
    let mig_named = mig::named(&mig_gpus, &[]);
    if whole.is_empty() {
        return mig::unsupported(&mig_named);
    }
    let mut d = whole_gpus_if_the_pods(opts, &whole);
    if !mig_named.is_empty() {
        d.condition.message.push_str(&mig::note(&mig_named));
    }
    d
}

fn whole_gpus_if_the_pods(opts: &DiscoveryOptions, all: &[NvmlGpu]) -> Discovery {
    let n = all.len();
    if opts.mode == DiscoveryMode::All || opts.whole_machine {
        return Discovery::visible(
            DiscoveryMethod::AllVisible,
            all.to_vec(),
            format!("all {n} GPU(s) NVML sees: {}", uuids(all)),
        );
    }
    let resource = opts.resource_names.join("/");
    let why = match opts.requested_gpus {
        Some(m) if n <= m as usize => {
            return Discovery::visible(
                DiscoveryMethod::AllVisible,
                all.to_vec(),
                format!(
                "all {n} GPU(s) NVML sees, no more than the {m} {resource} the pod requested: {}",
                uuids(all)
            ),
            )
        }
        Some(0) => format!("NVML sees {n} GPU(s) of the node but the pod requests no {resource}"),
        Some(m) => format!(
            "NVML sees {n} GPUs of the node but the pod requested {m} {resource}, and nothing \
             says which are its own"
        ),
        None => format!(
            "NVML sees {n} GPU(s) and nothing says which are this pod's ({} \
             is not set)",
            env::REQUESTED_GPUS
        ),
    };
    Discovery::not_visible(
        DiscoveryMethod::AmbiguousGpus,
        format!(
            "{why}: none is reported, so that no other pod's memory counts as this one's. To \
             report the pod's GPUs, install memprof with gpuAccess=podResources (the kubelet \
             names them), or use gpuAccess=agentOnly with the in-process agent"
        ),
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
    let d = decide(opts, listed.as_deref().map_err(String::as_str), pod, &[]);
    open_decided(d)
}

/// Decides again with the GPU UUIDs the in-process agent named, and opens a
/// sampler over them: for a sidecar whose discovery found the pod's GPUs
/// ambiguous (no explicit list, no kubelet asked).
pub fn open_agent_named(
    opts: &DiscoveryOptions,
    agent: &[String],
) -> (Option<NvmlSampler>, Discovery) {
    let listed = nvml::list_gpus().map_err(|e| e.to_string());
    open_decided(decide(
        opts,
        listed.as_deref().map_err(String::as_str),
        None,
        agent,
    ))
}

fn open_decided(d: Discovery) -> (Option<NvmlSampler>, Discovery) {
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

pub mod mig;
mod options;
pub use options::{DiscoveryMode, DiscoveryOptions, OptionsError};
mod podresources;
#[cfg(test)]
use podresources::{grpc_frame, grpc_unframe};
pub use podresources::{
    list_pod_resources, ContainerDevices, ContainerResources, Error, ListPodResourcesRequest,
    ListPodResourcesResponse, PodResources,
};

#[cfg(test)]
mod tests;
