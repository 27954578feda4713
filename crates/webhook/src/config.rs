//! What the webhook injects: plain values, built once from the operator's
//! flags ([`super::WebhookOptions`]) and shared read-only by every admission.

use memprof_api::admission::{Keys, DEFAULT_CONTROLLER_IDENTITIES};
use memprof_api::DEFAULT_AGENT_SOURCE;
use std::time::Duration;

/// How the sidecar gets to see the GPUs of its pod (see DESIGN.md, "GPU visibility").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum GpuAccess {
    /// `NVIDIA_VISIBLE_DEVICES=all`: the NVIDIA container runtime exposes every
    /// GPU of the node to the sidecar, which reports all of them (or the UUIDs it
    /// is told). Works with the device plugin's env-var strategy.
    #[default]
    #[value(name = "envvar")]
    Envvar,
    /// As `envvar`, plus the kubelet PodResources socket (read-only hostPath), so
    /// the sidecar reports only the GPUs allocated to its pod's other containers.
    #[value(name = "podResources")]
    PodResources,
    /// No NVML at all: the in-process Python agent pushes what CUDA sees.
    #[value(name = "agentOnly")]
    AgentOnly,
}

impl GpuAccess {
    /// The spelling used in flags, Helm values and the sidecar's env.
    pub fn as_str(self) -> &'static str {
        match self {
            GpuAccess::Envvar => "envvar",
            GpuAccess::PodResources => "podResources",
            GpuAccess::AgentOnly => "agentOnly",
        }
    }
}

/// Native (init container with `restartPolicy: Always`) or legacy (regular
/// container) sidecar.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SidecarMode {
    /// Native when the API server is 1.29 or newer.
    #[default]
    Auto,
    /// Always native. Needs every kubelet at 1.29+ (or 1.28 with the
    /// `SidecarContainers` gate): an older kubelet would run the sidecar as a
    /// plain init container that never finishes, and the pod would never start.
    Native,
    /// Always a regular container that exits when it is alone.
    Legacy,
}

/// Which token the sidecar writes its MemoryReport with. A report counts
/// only when written with a token bound to its pod (`memprof_api::writer`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ServiceAccountTokenMode {
    /// Mount a projected, pod-bound token (plus the cluster CA and
    /// namespace) into the sidecar only, whatever the pod's
    /// `automountServiceAccountToken` says; the trainer containers keep
    /// what they had.
    #[default]
    Project,
    /// Leave the pod as it is: the sidecar uses the pod's own token (a
    /// legacy Secret token names no pod, and its reports do not count), or
    /// none when automounting is off (it then cannot write and says so).
    Respect,
}

/// Everything one admission needs to build the sidecar.
#[derive(Clone, Debug, PartialEq)]
pub struct InjectionConfig {
    /// Sidecar image (the memprof image; the sidecar binary is its `command`).
    pub image: String,
    /// Command that starts the sidecar inside `image`.
    pub command: Vec<String>,
    /// `imagePullPolicy` of the sidecar.
    pub pull_policy: String,
    /// Port of the sidecar's `/healthz` and `/metrics` (the agent's endpoints
    /// are on its Unix socket, never on a port).
    pub port: u16,
    /// Serve `/metrics` on the pod IP, for Prometheus (`MEMPROF_PORT`, a
    /// declared container port); off: on loopback only (`MEMPROF_LISTEN`).
    pub scrape: bool,
    /// Sampling interval.
    pub interval: Duration,
    /// Resource requests (`cpu`, `memory`), Kubernetes quantities.
    pub cpu_request: Option<String>,
    /// Memory request of the sidecar.
    pub memory_request: Option<String>,
    /// CPU limit; `None` by default because a throttled sampler only gets late,
    /// while a memory limit protects the trainer's node.
    pub cpu_limit: Option<String>,
    /// Memory limit of the sidecar.
    pub memory_limit: Option<String>,
    /// GPU access mode.
    pub gpu_access: GpuAccess,
    /// The in-process agent's injection (`memprof.dev/agent`).
    pub agent: AgentConfig,
    /// Native or legacy sidecar, already resolved against the server version.
    pub native_sidecar: bool,
    /// Token handling for pods without an automounted service-account token.
    pub service_account_token: ServiceAccountTokenMode,
    /// Whether the annotation `memprof.dev/sidecar-image` may pick the image.
    /// Off by default: the sidecar gets every GPU of the node (and, with
    /// `podResources`, the kubelet's socket and uid 0), so whoever picks its
    /// image runs code with that access.
    pub allow_image_override: bool,
    /// Images the annotation may name when allowed (see [`image_allowed`]).
    pub allowed_images: Vec<String>,
    /// Cluster-wide threshold overrides (`--default-thresholds`), already
    /// valid; a Job's `memprof.dev/thresholds` goes over them.
    pub thresholds: serde_json::Map<String, serde_json::Value>,
    /// The sidecar logs JSON lines (`MEMPROF_LOG_JSON=true`).
    pub log_json: bool,
    /// Replaces the sidecar's built-in securityContext (`--sidecar-security-context`).
    pub security_context: Option<k8s_openapi::api::core::v1::SecurityContext>,
    /// The admission mark on pods the Job controller creates.
    pub marks: MarkConfig,
    /// Who creates each link of a JobSet, TrainJob or PyTorchJob (the
    /// workload mark, `workload_marks.rs`; signed with `marks.keys`).
    pub workloads: WorkloadIdentities,
}

/// How the webhook marks the pods the Job controller creates
/// (`memprof_api::admission`, docs/security.md "Pod trust").
#[derive(Clone, Debug, PartialEq)]
pub struct MarkConfig {
    /// `userInfo.username`s the Job controller creates pods as
    /// (`--admission-controller-identities`).
    pub controllers: Vec<String>,
    /// The operator's key ring: marks are signed with its current key; none
    /// is signed until it is loaded.
    pub keys: Keys,
}

/// Who creates each link (`--jobset-identities`, `--trainer-identities`,
/// `--training-operator-identities`; the chart's `workloads` values).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadIdentities {
    /// Create a JobSet's child Jobs.
    pub jobset: Vec<String>,
    /// Create a TrainJob's JobSet.
    pub trainer: Vec<String>,
    /// Create a PyTorchJob's pods.
    pub training_operator: Vec<String>,
}

impl Default for WorkloadIdentities {
    fn default() -> Self {
        use memprof_api::workload::*;
        let own = |ids: &[&str]| ids.iter().map(|s| s.to_string()).collect();
        WorkloadIdentities {
            jobset: own(&DEFAULT_JOBSET_IDENTITIES),
            trainer: own(&DEFAULT_TRAINER_IDENTITIES),
            training_operator: own(&DEFAULT_TRAINING_OPERATOR_IDENTITIES),
        }
    }
}

impl Default for MarkConfig {
    fn default() -> Self {
        MarkConfig {
            controllers: DEFAULT_CONTROLLER_IDENTITIES.map(String::from).to_vec(),
            keys: Keys::default(),
        }
    }
}

impl Default for InjectionConfig {
    fn default() -> Self {
        InjectionConfig {
            // No default: the operator refuses to serve without --sidecar-image.
            image: String::new(),
            command: vec!["/usr/local/bin/memprof-sidecar".into()],
            pull_policy: "IfNotPresent".into(),
            port: 9464,
            scrape: false,
            interval: Duration::from_secs(1),
            cpu_request: Some("50m".into()),
            memory_request: Some("64Mi".into()),
            cpu_limit: None,
            memory_limit: Some("128Mi".into()),
            gpu_access: GpuAccess::Envvar,
            agent: Default::default(),
            native_sidecar: false,
            service_account_token: ServiceAccountTokenMode::Project,
            allow_image_override: false,
            allowed_images: vec![],
            thresholds: serde_json::Map::new(),
            log_json: false,
            security_context: None,
            marks: MarkConfig::default(),
            workloads: Default::default(),
        }
    }
}

impl SidecarMode {
    /// Native or not, for an API server reporting `major`.`minor` (as in
    /// `/version`, where cloud builds say `"29+"`).
    pub fn resolve(self, major: &str, minor: &str) -> bool {
        match self {
            SidecarMode::Native => true,
            SidecarMode::Legacy => false,
            SidecarMode::Auto => {
                let num = |s: &str| -> u32 {
                    s.chars()
                        .take_while(char::is_ascii_digit)
                        .collect::<String>()
                        .parse()
                        .unwrap_or(0)
                };
                let (major, minor) = (num(major), num(minor));
                major > 1 || (major == 1 && minor >= 29)
            }
        }
    }
}

/// Whether `image` matches one of `patterns`: an exact reference
/// (`registry.example.com/memprof:0.2.0`), or a prefix ending in `*`
/// (`registry.example.com/memprof/*`; `*` alone matches any image). A prefix
/// is plain text: end it at a `/`, `:` or `@`, or `registry.example.com/memprof*`
/// also matches `registry.example.com/memprof-other`. No pattern, no image.
pub fn image_allowed(patterns: &[String], image: &str) -> bool {
    patterns.iter().any(|p| match p.strip_suffix('*') {
        Some(prefix) => image.starts_with(prefix),
        None => p == image,
    })
}

/// Checks one `--allowed-sidecar-images` entry: `*` only at the end, no
/// whitespace (empty entries are dropped later).
pub fn parse_image_pattern(s: &str) -> Result<String, ImagePatternError> {
    let s = s.trim();
    if s.contains(char::is_whitespace) {
        return Err(ImagePatternError::Whitespace(s.to_string()));
    }
    if s.trim_end_matches('*').contains('*') || s.ends_with("**") {
        return Err(ImagePatternError::Star(s.to_string()));
    }
    Ok(s.to_string())
}

/// An `--allowed-sidecar-images` entry that is not an image or a prefix.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum ImagePatternError {
    /// Blanks inside it (a list separated by spaces, not commas?).
    #[error("image pattern {0:?} contains whitespace")]
    Whitespace(String),
    /// A `*` anywhere but once at the end.
    #[error(
        "image pattern {0:?}: `*` may only end a prefix, e.g. `registry.example.com/memprof/*`"
    )]
    Star(String),
}

/// Operator settings of the agent injection (`--agent-image`, `--agent-path`).
#[derive(Clone, Debug, PartialEq)]
pub struct AgentConfig {
    /// Image of the init container; `None`: the sidecar's image, which
    /// carries the agent (no further image to pull or to allow).
    pub image: Option<String>,
    /// Where that image carries the agent tree.
    pub source_dir: String,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            image: None,
            source_dir: DEFAULT_AGENT_SOURCE.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_match_exactly_or_by_a_prefix_ending_in_a_star() {
        let patterns: Vec<String> = [
            "registry.example.com/memprof/*",
            "ghcr.io/memprof/memprof:0.2.0",
        ]
        .map(String::from)
        .to_vec();
        assert!(image_allowed(
            &patterns,
            "registry.example.com/memprof/sidecar:dev"
        ));
        assert!(image_allowed(&patterns, "ghcr.io/memprof/memprof:0.2.0"));
        assert!(!image_allowed(
            &patterns,
            "ghcr.io/memprof/memprof:0.2.0-evil"
        ));
        assert!(!image_allowed(
            &patterns,
            "registry.example.com/memprof-other/x"
        ));
        assert!(!image_allowed(&patterns, "docker.io/attacker/miner"));
        assert!(
            !image_allowed(&[], "ghcr.io/memprof/memprof:0.2.0"),
            "none allowed"
        );
        assert!(image_allowed(&["*".to_string()], "anything"));

        assert_eq!(parse_image_pattern(" a/* "), Ok("a/*".into()));
        assert!(parse_image_pattern("a/*/b")
            .unwrap_err()
            .to_string()
            .contains("may only end"));
        assert_eq!(
            parse_image_pattern("a/**"),
            Err(ImagePatternError::Star("a/**".into()))
        );
        assert_eq!(
            parse_image_pattern("a b"),
            Err(ImagePatternError::Whitespace("a b".into()))
        );
    }

    #[test]
    fn native_sidecar_from_version() {
        assert!(!SidecarMode::Auto.resolve("1", "20"));
        assert!(!SidecarMode::Auto.resolve("1", "28"));
        assert!(SidecarMode::Auto.resolve("1", "29"));
        assert!(SidecarMode::Auto.resolve("1", "30+"));
        assert!(SidecarMode::Native.resolve("1", "20"));
        assert!(!SidecarMode::Legacy.resolve("1", "31"));
    }
}
