//! Builds the `memprof-sidecar` container and the volumes it needs, from the
//! [`InjectionConfig`] and what the webhook learned about the workload.
//! Pure: no client, no I/O.

use super::config::{GpuAccess, InjectionConfig, ServiceAccountTokenMode};
use super::{env, ANNOTATION_COMPLETION_INDEX, SIDECAR_CONTAINER};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapProjection, Container, ContainerPort, DownwardAPIProjection,
    DownwardAPIVolumeFile, EnvVar, EnvVarSource, HostPathVolumeSource, KeyToPath,
    ObjectFieldSelector, ProjectedVolumeSource, ResourceRequirements, SeccompProfile,
    SecurityContext, ServiceAccountTokenProjection, Volume, VolumeMount, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
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
}

/// The sidecar plus the pod volumes it mounts.
#[derive(Clone, Debug, PartialEq)]
pub struct SidecarParts {
    /// The `memprof-sidecar` container.
    pub container: Container,
    /// Volumes to add to the pod spec (skipped when one of the same name exists).
    pub volumes: Vec<Volume>,
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
fn security_context(gpu: GpuAccess) -> SecurityContext {
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

/// Builds the sidecar container and its volumes.
pub fn build(cfg: &InjectionConfig, ov: &Overrides, ctx: &SidecarContext) -> SidecarParts {
    let port = ov.port.unwrap_or(cfg.port);
    let interval = ov.interval.unwrap_or(cfg.interval);
    let mut envs = vec![
        field(env::POD_NAME, "metadata.name"),
        field(env::POD_NAMESPACE, "metadata.namespace"),
        field(env::NODE_NAME, "spec.nodeName"),
        field(env::POD_UID, "metadata.uid"),
        plain(env::INTERVAL, format!("{}ms", interval.as_millis())),
        plain(env::PORT, port.to_string()),
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

    let mut mounts = vec![];
    let mut volumes = vec![];
    match cfg.gpu_access {
        GpuAccess::Envvar | GpuAccess::PodResources => {
            envs.push(plain(env::NVIDIA_VISIBLE_DEVICES, "all"));
            // utility = NVML only: no CUDA libraries, no compute on the trainer's GPUs.
            envs.push(plain(env::NVIDIA_DRIVER_CAPABILITIES, "utility"));
        }
        GpuAccess::AgentOnly => {
            // `void` tells the NVIDIA runtime to expose nothing, even where the
            // node's default would be all GPUs.
            envs.push(plain(env::NVIDIA_VISIBLE_DEVICES, "void"));
            envs.push(plain(env::GPU_DISCOVERY, "agentOnly"));
        }
    }
    if cfg.gpu_access == GpuAccess::PodResources {
        envs.push(plain(env::GPU_DISCOVERY, "podResources"));
        volumes.push(Volume {
            name: POD_RESOURCES_VOLUME.into(),
            host_path: Some(HostPathVolumeSource {
                path: POD_RESOURCES_PATH.into(),
                type_: Some("Directory".into()),
            }),
            ..Default::default()
        });
        mounts.push(VolumeMount {
            name: POD_RESOURCES_VOLUME.into(),
            mount_path: POD_RESOURCES_PATH.into(),
            read_only: Some(true),
            ..Default::default()
        });
    }
    if ctx.token_not_mounted && cfg.service_account_token == ServiceAccountTokenMode::Project {
        volumes.push(token_volume());
        mounts.push(VolumeMount {
            name: TOKEN_VOLUME.into(),
            mount_path: TOKEN_PATH.into(),
            read_only: Some(true),
            ..Default::default()
        });
    }

    let container = Container {
        name: SIDECAR_CONTAINER.into(),
        image: Some(ov.image.clone().unwrap_or_else(|| cfg.image.clone())),
        image_pull_policy: Some(cfg.pull_policy.clone()),
        command: (!cfg.command.is_empty()).then(|| cfg.command.clone()),
        env: Some(envs),
        ports: Some(vec![ContainerPort {
            name: Some(PORT_NAME.into()),
            container_port: i32::from(port),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        resources: Some(resources(cfg)),
        security_context: Some(security_context(cfg.gpu_access)),
        volume_mounts: (!mounts.is_empty()).then_some(mounts),
        // Native sidecar: an init container that keeps running beside the
        // trainers and is stopped after them, so the Job completes.
        restart_policy: cfg.native_sidecar.then(|| "Always".to_string()),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
    };
    SidecarParts { container, volumes }
}
