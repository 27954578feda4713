//! Builds the `memprof-sidecar` container and the volumes it needs, from the
//! [`InjectionConfig`] and what the webhook learned about the workload.
//! Pure: no client, no I/O.

use super::config::{image_allowed, GpuAccess, InjectionConfig, ServiceAccountTokenMode};
use super::{ANNOTATION_COMPLETION_INDEX, ANNOTATION_SIDECAR_IMAGE, SIDECAR_CONTAINER};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapProjection, Container, ContainerPort, DownwardAPIProjection,
    DownwardAPIVolumeFile, EmptyDirVolumeSource, EnvVar, EnvVarSource, HostPathVolumeSource,
    KeyToPath, ObjectFieldSelector, PodSpec, ProjectedVolumeSource, ResourceRequirements,
    SeccompProfile, SecurityContext, ServiceAccountTokenProjection, Volume, VolumeMount,
    VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use memprof_api::{env, DEFAULT_GPU_RESOURCE};
use std::collections::BTreeMap;
use std::time::Duration;

/// Volume holding the kubelet PodResources socket (podResources mode).
pub const POD_RESOURCES_VOLUME: &str = "memprof-pod-resources";
/// Where the kubelet serves the PodResources API.
pub const POD_RESOURCES_PATH: &str = "/var/lib/kubelet/pod-resources";
/// Projected service-account token for the sidecar only.
pub const TOKEN_VOLUME: &str = "memprof-sa-token";
/// Where client libraries (kube-rs included) look for the in-cluster token.
pub const TOKEN_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// Non-root uid/gid of the distroless `nonroot` image.
pub const NONROOT_UID: i64 = 65532;
/// Name of the sidecar's container port (at most 15 characters).
pub const PORT_NAME: &str = "memprof-metrics";
/// The pod's private `emptyDir` holding the agent socket (contract A): the
/// sidecar serves `POST /v1/agent` there, every trainer container mounts it
/// read-only (connecting to a socket needs no write access to its mount).
/// Only the pod's containers mount it: that is the authentication.
pub const SOCKET_VOLUME: &str = "memprof-agent-socket";
/// The socket volume's size limit: it holds one socket file.
const SOCKET_VOLUME_SIZE_LIMIT: &str = "1Mi";

/// The agent socket's `emptyDir`.
pub fn socket_volume() -> Volume {
    Volume {
        name: SOCKET_VOLUME.into(),
        empty_dir: Some(EmptyDirVolumeSource {
            size_limit: Some(Quantity(SOCKET_VOLUME_SIZE_LIMIT.into())),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The socket volume at [`env::AGENT_SOCKET_DIR`].
pub fn socket_mount(read_only: bool) -> VolumeMount {
    VolumeMount {
        name: SOCKET_VOLUME.into(),
        mount_path: env::AGENT_SOCKET_DIR.into(),
        read_only: read_only.then_some(true),
        ..Default::default()
    }
}

/// What the webhook knows about the workload when it builds the sidecar.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SidecarContext {
    /// The Job's name, when the request is for a Job and the name is known
    /// (it is empty with `generateName`; the pod label `job-name` is used then).
    pub job_name: Option<String>,
    /// True for Jobs (even with a generated name): the job name can be read
    /// from the pod's `job-name` label.
    pub is_job: bool,
    /// The Job's parallelism.
    pub parallelism: Option<i32>,
    /// `completionMode: Indexed`.
    pub indexed: bool,
    /// The pod spec sets `automountServiceAccountToken: false`.
    pub token_not_mounted: bool,
}

/// Per-object overrides from annotations, already validated.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Overrides {
    /// `memprof.dev/sidecar-image`.
    pub image: Option<String>,
    /// `memprof.dev/interval`.
    pub interval: Option<Duration>,
    /// `memprof.dev/port`.
    pub port: Option<u16>,
    /// `MEMPROF_THRESHOLDS`: the cluster-wide thresholds with the Job's
    /// `memprof.dev/thresholds` over them (`None`: nothing overridden).
    pub thresholds: Option<String>,
}

/// The sidecar plus the pod volumes it mounts.
#[derive(Clone, Debug, PartialEq)]
pub struct SidecarParts {
    /// The `memprof-sidecar` container.
    pub container: Container,
    /// Volumes to add to the pod spec (skipped when one of the same name exists).
    pub volumes: Vec<Volume>,
    /// What the user should hear about (an image override that was ignored).
    pub warnings: Vec<String>,
}

/// What the pod spec says about the trainers' GPUs, so that a sidecar shown
/// every GPU of the node (`NVIDIA_VISIBLE_DEVICES=all`) can tell whether they
/// are all the pod's. The device plugin picks the GPUs only when the pod
/// starts, so the spec gives their number, not their UUIDs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodGpus {
    /// `nvidia.com/gpu` the pod holds while its trainers run: the app
    /// containers' plus native sidecars', or the largest init container's
    /// if that is more (init containers' devices are reused by the others).
    pub requested: u32,
    /// The GPUs the trainers' own `NVIDIA_VISIBLE_DEVICES` names (UUIDs or
    /// indices), when every container that uses GPUs sets a list there; the
    /// runtime then gives them exactly those.
    pub named: Vec<String>,
}

fn gpu_count(c: &Container) -> u32 {
    let res = c.resources.as_ref();
    let of = |m: Option<&BTreeMap<String, Quantity>>| m?.get(DEFAULT_GPU_RESOURCE).cloned();
    // Extended resources are whole numbers; anything else counts as none,
    // which errs on the side of reporting no GPU rather than others'.
    of(res.and_then(|r| r.limits.as_ref()))
        .or_else(|| of(res.and_then(|r| r.requests.as_ref())))
        .and_then(|q| q.0.trim().parse().ok())
        .unwrap_or(0)
}

/// `NVIDIA_VISIBLE_DEVICES` as the container spec sets it (a literal value).
fn visible_devices(c: &Container) -> Option<&str> {
    c.env
        .iter()
        .flatten()
        .find(|e| e.name == env::NVIDIA_VISIBLE_DEVICES)?
        .value
        .as_deref()
}

/// A list naming particular GPUs; `all`, `none`, `void` or empty name none.
fn named_gpus(value: &str) -> Option<Vec<String>> {
    let v = value.trim();
    if v.is_empty() || ["all", "none", "void"].contains(&v.to_ascii_lowercase().as_str()) {
        return None;
    }
    Some(env::split_list(v))
}

impl PodGpus {
    /// Reads the trainers' GPU request (and named GPUs) from the pod spec,
    /// before the sidecar is added.
    pub fn of(spec: &PodSpec) -> Self {
        let init = spec.init_containers.as_deref().unwrap_or_default();
        let native = |c: &&Container| c.restart_policy.as_deref() == Some("Always");
        let running: u32 = spec
            .containers
            .iter()
            .chain(init.iter().filter(native))
            .map(gpu_count)
            .fold(0, u32::saturating_add);
        let largest_init = init
            .iter()
            .filter(|c| !native(c))
            .map(gpu_count)
            .max()
            .unwrap_or(0);
        let users: Vec<&Container> = spec
            .containers
            .iter()
            .filter(|c| gpu_count(c) > 0 || visible_devices(c).is_some())
            .collect();
        let lists: Option<Vec<Vec<String>>> = users
            .iter()
            .map(|c| visible_devices(c).and_then(named_gpus))
            .collect();
        let mut named: Vec<String> = vec![];
        for id in lists.unwrap_or_default().concat() {
            if !named.contains(&id) {
                named.push(id);
            }
        }
        PodGpus {
            requested: running.max(largest_init),
            named,
        }
    }
}

/// The image to run: the configured one, or the pod's override when the
/// operator allows overrides and the image is on its list; a warning says
/// why an override was ignored.
pub fn choose_image(cfg: &InjectionConfig, wanted: Option<&str>) -> (String, Option<String>) {
    let Some(wanted) = wanted.filter(|w| *w != cfg.image) else {
        return (cfg.image.clone(), None);
    };
    let why = if !cfg.allow_image_override {
        "this cluster does not allow sidecar image overrides (chart value \
         injection.allowSidecarImageOverride, operator flag --allow-sidecar-image-override)"
    } else if !image_allowed(&cfg.allowed_images, wanted) {
        "the image is not among the sidecar images this cluster allows (chart value \
         injection.allowedSidecarImages, operator flag --allowed-sidecar-images)"
    } else {
        return (wanted.to_string(), None);
    };
    let warning = format!(
        "memprof: ignoring {ANNOTATION_SIDECAR_IMAGE}={wanted:?}: {why}; the sidecar runs {}",
        cfg.image
    );
    (cfg.image.clone(), Some(warning))
}

fn plain(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..Default::default()
    }
}

fn field(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn resources(cfg: &InjectionConfig) -> ResourceRequirements {
    let map = |cpu: &Option<String>, mem: &Option<String>| {
        let m: BTreeMap<String, Quantity> = [("cpu", cpu), ("memory", mem)]
            .into_iter()
            .filter_map(|(k, v)| v.as_ref().map(|v| (k.to_string(), Quantity(v.clone()))))
            .collect();
        (!m.is_empty()).then_some(m)
    };
    ResourceRequirements {
        requests: map(&cfg.cpu_request, &cfg.memory_request),
        limits: map(&cfg.cpu_limit, &cfg.memory_limit),
        ..Default::default()
    }
}

/// Locked down as Pod Security `restricted` asks. In podResources mode the
/// sidecar runs as uid 0 (still without any capability): the kubelet creates
/// its PodResources socket `0755 root`, and connecting to a Unix socket needs
/// write permission on it. That mode needs the `privileged` level anyway
/// (hostPath), so root costs no further admission.
pub(super) fn security_context(gpu: GpuAccess) -> SecurityContext {
    let root = gpu == GpuAccess::PodResources;
    SecurityContext {
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(!root),
        run_as_user: Some(if root { 0 } else { NONROOT_UID }),
        run_as_group: Some(if root { 0 } else { NONROOT_UID }),
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            ..Default::default()
        }),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn token_volume() -> Volume {
    let item = |key: &str| KeyToPath {
        key: key.into(),
        path: key.into(),
        ..Default::default()
    };
    Volume {
        name: TOKEN_VOLUME.into(),
        projected: Some(ProjectedVolumeSource {
            sources: Some(vec![
                VolumeProjection {
                    service_account_token: Some(ServiceAccountTokenProjection {
                        path: "token".into(),
                        // The kubelet refreshes at 80% of the lifetime; one hour
                        // plus the 7 s kube-rs also asks for.
                        expiration_seconds: Some(3607),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                VolumeProjection {
                    // Published in every namespace since 1.20 (RootCAConfigMap).
                    config_map: Some(ConfigMapProjection {
                        name: "kube-root-ca.crt".into(),
                        items: Some(vec![item("ca.crt")]),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                VolumeProjection {
                    downward_api: Some(DownwardAPIProjection {
                        items: Some(vec![DownwardAPIVolumeFile {
                            path: "namespace".into(),
                            field_ref: Some(ObjectFieldSelector {
                                field_path: "metadata.namespace".into(),
                                ..Default::default()
                            }),
                            ..Default::default()
                        }]),
                    }),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The sidecar's environment that does not depend on the GPU access mode:
/// who it is, how it samples, where it serves.
fn base_env(cfg: &InjectionConfig, ov: &Overrides, ctx: &SidecarContext) -> Vec<EnvVar> {
    let port = ov.port.unwrap_or(cfg.port);
    let interval = ov.interval.unwrap_or(cfg.interval);
    let mut envs = vec![
        field(env::POD_NAME, "metadata.name"),
        field(env::POD_NAMESPACE, "metadata.namespace"),
        field(env::NODE_NAME, "spec.nodeName"),
        field(env::POD_UID, "metadata.uid"),
        plain(env::INTERVAL, format!("{}ms", interval.as_millis())),
        // /metrics on the pod IP only when Prometheus scrapes the sidecars.
        match cfg.scrape {
            true => plain(env::PORT, port.to_string()),
            false => plain(env::LISTEN, format!("127.0.0.1:{port}")),
        },
        plain(env::AGENT_SOCKET, env::AGENT_SOCKET_PATH),
    ];
    match (&ctx.job_name, ctx.is_job) {
        (Some(name), _) => envs.push(plain(env::JOB_NAME, name)),
        // generateName: the Job controller labels every pod with its job's name.
        (None, true) => envs.push(field(env::JOB_NAME, "metadata.labels['job-name']")),
        (None, false) => {}
    }
    if ctx.is_job {
        envs.push(plain(
            env::EXPECTED_RANKS,
            ctx.parallelism.unwrap_or(1).max(0).to_string(),
        ));
    }
    if ctx.indexed {
        envs.push(field(
            env::JOB_COMPLETION_INDEX,
            &format!("metadata.annotations['{ANNOTATION_COMPLETION_INDEX}']"),
        ));
    }
    if !cfg.native_sidecar {
        envs.push(plain(env::EXIT_WHEN_ALONE, "true"));
    }
    if let Some(t) = &ov.thresholds {
        envs.push(plain(env::THRESHOLDS, t.clone()));
    }
    if cfg.log_json {
        envs.push(plain(env::LOG_JSON, "true"));
    }
    envs
}

/// What the sidecar needs to see GPUs in the configured mode: its
/// environment, and (podResources) the kubelet's socket.
fn gpu_access(
    cfg: &InjectionConfig,
    gpus: &PodGpus,
) -> (Vec<EnvVar>, Option<(Volume, VolumeMount)>) {
    let mut envs = vec![];
    match cfg.gpu_access {
        GpuAccess::Envvar | GpuAccess::PodResources => {
            envs.push(plain(env::NVIDIA_VISIBLE_DEVICES, "all"));
            // utility = NVML only: no CUDA libraries, no compute on the trainer's GPUs.
            envs.push(plain(env::NVIDIA_DRIVER_CAPABILITIES, "utility"));
            // With every GPU of the node visible, the sidecar reports them all
            // only when they are no more than the pod requested.
            envs.push(plain(env::REQUESTED_GPUS, gpus.requested.to_string()));
        }
        GpuAccess::AgentOnly => {
            // `void` tells the NVIDIA runtime to expose nothing, even where the
            // node's default would be all GPUs.
            envs.push(plain(env::NVIDIA_VISIBLE_DEVICES, "void"));
            envs.push(plain(env::GPU_DISCOVERY, "agentOnly"));
        }
    }
    if cfg.gpu_access == GpuAccess::Envvar && !gpus.named.is_empty() {
        // The trainers chose their GPUs themselves: the same ones are theirs.
        envs.push(plain(env::GPUS, gpus.named.join(",")));
    }
    if cfg.gpu_access != GpuAccess::PodResources {
        return (envs, None);
    }
    envs.push(plain(env::GPU_DISCOVERY, "podResources"));
    let volume = Volume {
        name: POD_RESOURCES_VOLUME.into(),
        host_path: Some(HostPathVolumeSource {
            path: POD_RESOURCES_PATH.into(),
            type_: Some("Directory".into()),
        }),
        ..Default::default()
    };
    let mount = VolumeMount {
        name: POD_RESOURCES_VOLUME.into(),
        mount_path: POD_RESOURCES_PATH.into(),
        read_only: Some(true),
        ..Default::default()
    };
    (envs, Some((volume, mount)))
}

/// Builds the sidecar container and its volumes.
pub fn build(
    cfg: &InjectionConfig,
    ov: &Overrides,
    ctx: &SidecarContext,
    gpus: &PodGpus,
) -> SidecarParts {
    let mut envs = base_env(cfg, ov, ctx);
    let mut mounts = vec![socket_mount(false)];
    let mut volumes = vec![socket_volume()];
    let (gpu_env, kubelet) = gpu_access(cfg, gpus);
    envs.extend(gpu_env);
    if let Some((volume, mount)) = kubelet {
        volumes.push(volume);
        mounts.push(mount);
    }
    // Pod-bound, so its writes count (`memprof_api::writer`): a legacy token names no pod.
    if cfg.service_account_token == ServiceAccountTokenMode::Project {
        volumes.push(token_volume());
        mounts.push(VolumeMount {
            name: TOKEN_VOLUME.into(),
            mount_path: TOKEN_PATH.into(),
            read_only: Some(true),
            ..Default::default()
        });
    }
    let (image, image_warning) = choose_image(cfg, ov.image.as_deref());
    let port = ov.port.unwrap_or(cfg.port);
    let container = Container {
        name: SIDECAR_CONTAINER.into(),
        image: Some(image),
        image_pull_policy: Some(cfg.pull_policy.clone()),
        command: (!cfg.command.is_empty()).then(|| cfg.command.clone()),
        env: Some(envs),
        ports: cfg.scrape.then(|| {
            vec![ContainerPort {
                name: Some(PORT_NAME.into()),
                container_port: i32::from(port),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]
        }),
        resources: Some(resources(cfg)),
        security_context: Some(
            cfg.security_context
                .clone()
                .unwrap_or_else(|| security_context(cfg.gpu_access)),
        ),
        volume_mounts: Some(mounts),
        // Native sidecar: an init container that keeps running beside the
        // trainers and is stopped after them, so the Job completes.
        restart_policy: cfg.native_sidecar.then(|| "Always".to_string()),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
    };
    SidecarParts {
        container,
        volumes,
        warnings: image_warning.into_iter().collect(),
    }
}

#[cfg(test)]
mod tests;
