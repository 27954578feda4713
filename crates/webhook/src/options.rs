//! The operator's webhook flags and [`run`], which wires certificates, the
//! server and the periodic refresh together.

use super::certs::{self, CertConfig, CertError};
use super::config::{
    parse_image_pattern, GpuAccess, InjectionConfig, MarkConfig, ServiceAccountTokenMode,
    SidecarMode,
};
use super::keys::KeyConfig;
use super::retry::until_ok;
use super::server::{ServerError, TlsCert};
use jiff::SignedDuration;
use kube::Client;
use memprof_api::admission::{Keys, DEFAULT_CONTROLLER_IDENTITIES, DEFAULT_KEY_SECRET};
use memprof_api::interval::parse_interval;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// How often the serving certificate is checked for renewal and the
/// `caBundle` for drift (one GET of each; cheap for the API server).
const RENEW_CHECK_EVERY: Duration = Duration::from_secs(300);
/// How often files mode re-reads the mounted certificate (the kubelet
/// updates a mounted Secret within about a minute).
const RELOAD_FILES_EVERY: Duration = Duration::from_secs(60);

/// Errors that stop the webhook.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The listening port is taken or not allowed.
    #[error(
        "cannot listen on {addr}: {source}; choose another --webhook-port (0 disables the webhook)"
    )]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Certificates could not be set up.
    #[error(transparent)]
    Cert(#[from] CertError),
    /// The TLS configuration is unusable.
    #[error(transparent)]
    Server(#[from] ServerError),
    /// The webhook is on but no sidecar image was given.
    #[error(
        "the admission webhook needs the sidecar image: pass --sidecar-image (MEMPROF_SIDECAR_IMAGE), \
         the memprof image your nodes can pull (the Helm chart sets it from image.repository and \
         image.tag), or --webhook-port 0 to run without the webhook"
    )]
    NoSidecarImage,
}

/// Where the serving certificate comes from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum CertMode {
    /// Self-signed, kept in a Secret, renewed, and `caBundle` patched by the operator.
    #[default]
    #[value(name = "self")]
    SelfSigned,
    /// Read `tls.crt`/`tls.key` from `--webhook-cert-dir` (cert-manager).
    #[value(name = "files")]
    Files,
}

/// Webhook and injection flags of `memprof-operator` (`#[command(flatten)]`).
/// The Helm chart passes them under the same names.
#[derive(Clone, Debug, clap::Args)]
pub struct WebhookOptions {
    /// HTTPS port of the admission webhook; 0 disables it.
    #[arg(
        long = "webhook-port",
        env = "MEMPROF_WEBHOOK_PORT",
        default_value_t = 8443
    )]
    pub port: u16,
    /// Address the webhook listens on.
    #[arg(
        long = "webhook-bind-address",
        env = "MEMPROF_WEBHOOK_BIND_ADDRESS",
        default_value = "0.0.0.0"
    )]
    pub bind_address: IpAddr,
    /// `self`: self-signed certificate in a Secret; `files`: read from --webhook-cert-dir.
    #[arg(long = "webhook-cert-mode", env = "MEMPROF_WEBHOOK_CERT_MODE", value_enum, default_value_t = CertMode::SelfSigned)]
    pub cert_mode: CertMode,
    /// Directory with tls.crt and tls.key (files mode).
    #[arg(
        long = "webhook-cert-dir",
        env = "MEMPROF_WEBHOOK_CERT_DIR",
        default_value = "/etc/memprof/webhook-certs"
    )]
    pub cert_dir: PathBuf,
    /// Namespace of the operator: where the Secret and the Service live.
    #[arg(
        id = "webhook_namespace",
        long = "webhook-namespace",
        env = "MEMPROF_POD_NAMESPACE",
        default_value = "memprof-system"
    )]
    pub namespace: String,
    /// Secret holding the self-signed certificate.
    #[arg(
        long = "webhook-secret-name",
        env = "MEMPROF_WEBHOOK_SECRET_NAME",
        default_value = "memprof-webhook-tls"
    )]
    pub secret_name: String,
    /// Service in front of the webhook (its DNS names go into the certificate).
    #[arg(
        long = "webhook-service-name",
        env = "MEMPROF_WEBHOOK_SERVICE_NAME",
        default_value = "memprof-webhook"
    )]
    pub service_name: String,
    /// MutatingWebhookConfiguration whose caBundle is kept up to date (self mode; empty: do not patch).
    #[arg(
        long = "webhook-config-name",
        env = "MEMPROF_WEBHOOK_CONFIG_NAME",
        default_value = "memprof"
    )]
    pub config_name: String,
    /// More names for the certificate, comma-separated (e.g. `127.0.0.1,localhost`).
    #[arg(
        long = "webhook-extra-names",
        env = "MEMPROF_WEBHOOK_EXTRA_NAMES",
        value_delimiter = ',',
        default_value = ""
    )]
    pub extra_names: Vec<String>,
    /// Sidecar image (the memprof image). Required while the webhook is on:
    /// there is no published default to fall back to.
    #[arg(
        long = "sidecar-image",
        env = "MEMPROF_SIDECAR_IMAGE",
        default_value = ""
    )]
    pub sidecar_image: String,
    /// Secret (in --webhook-namespace) holding the key of the admission marks
    /// that make pods count (docs/security.md, "Pod trust"); created if missing.
    #[arg(
        long = "admission-key-secret",
        env = "MEMPROF_ADMISSION_KEY_SECRET",
        default_value = DEFAULT_KEY_SECRET
    )]
    pub admission_key_secret: String,
    /// Hours a rotated-out admission key still verifies (pods marked under it keep counting).
    #[arg(
        long = "admission-key-grace-hours",
        env = "MEMPROF_ADMISSION_KEY_GRACE_HOURS",
        default_value_t = 168
    )]
    pub admission_key_grace_hours: u32,
    /// Identities (`userInfo.username`) the Job controller creates pods as,
    /// comma-separated: only their pods are marked, so only theirs count.
    #[arg(
        long = "admission-controller-identities",
        env = "MEMPROF_ADMISSION_CONTROLLER_IDENTITIES",
        value_delimiter = ',',
        default_values_t = DEFAULT_CONTROLLER_IDENTITIES.map(String::from)
    )]
    pub admission_controllers: Vec<String>,
    /// Identities the JobSet controller creates a JobSet's child Jobs as,
    /// comma-separated: only their Jobs roll up under a JobSet.
    #[arg(
        long = "jobset-identities",
        env = "MEMPROF_JOBSET_IDENTITIES",
        value_delimiter = ',',
        default_values_t = memprof_api::workload::DEFAULT_JOBSET_IDENTITIES.map(String::from)
    )]
    pub jobset_identities: Vec<String>,
    /// Identities Kubeflow Trainer creates a TrainJob's JobSet as,
    /// comma-separated: only their JobSets roll up under a TrainJob.
    #[arg(
        long = "trainer-identities",
        env = "MEMPROF_TRAINER_IDENTITIES",
        value_delimiter = ',',
        default_values_t = memprof_api::workload::DEFAULT_TRAINER_IDENTITIES.map(String::from)
    )]
    pub trainer_identities: Vec<String>,
    /// Identities the training operator creates a PyTorchJob's pods as,
    /// comma-separated: only their pods count for a PyTorchJob.
    #[arg(
        long = "training-operator-identities",
        env = "MEMPROF_TRAINING_OPERATOR_IDENTITIES",
        value_delimiter = ',',
        default_values_t = memprof_api::workload::DEFAULT_TRAINING_OPERATOR_IDENTITIES.map(String::from)
    )]
    pub training_operator_identities: Vec<String>,
    /// Let a Job pick the sidecar image with the annotation `memprof.dev/sidecar-image`,
    /// among --allowed-sidecar-images. Off by default: the sidecar sees every GPU
    /// of the node (and, with --gpu-access=podResources, the kubelet's socket).
    #[arg(
        long = "allow-sidecar-image-override",
        env = "MEMPROF_ALLOW_SIDECAR_IMAGE_OVERRIDE",
        default_value_t = false,
        action = clap::ArgAction::Set
    )]
    pub allow_image_override: bool,
    /// Images the annotation may name, comma-separated: exact references, or
    /// prefixes ending in `*` (`registry.example.com/memprof/*`); `*` allows any.
    #[arg(
        long = "allowed-sidecar-images",
        env = "MEMPROF_ALLOWED_SIDECAR_IMAGES",
        value_delimiter = ',',
        default_value = "",
        value_parser = parse_image_pattern
    )]
    pub allowed_images: Vec<String>,
    /// Command starting the sidecar in its image.
    #[arg(
        long = "sidecar-command",
        env = "MEMPROF_SIDECAR_COMMAND",
        default_value = "/usr/local/bin/memprof-sidecar"
    )]
    pub sidecar_command: String,
    /// imagePullPolicy of the sidecar.
    #[arg(
        long = "sidecar-image-pull-policy",
        env = "MEMPROF_SIDECAR_IMAGE_PULL_POLICY",
        default_value = "IfNotPresent"
    )]
    pub sidecar_pull_policy: String,
    /// Port of the sidecar's /healthz and /metrics (the agent pushes over
    /// the sidecar's Unix socket, never a port).
    #[arg(
        long = "sidecar-port",
        env = "MEMPROF_SIDECAR_PORT",
        default_value_t = 9464
    )]
    pub sidecar_port: u16,
    /// Serve the sidecars' /metrics on the pod IP for Prometheus (the chart
    /// sets it from monitoring.podMonitor.enabled); off: loopback only.
    #[arg(long = "sidecar-scrape", env = "MEMPROF_SIDECAR_SCRAPE", default_value_t = false, action = clap::ArgAction::Set)]
    pub sidecar_scrape: bool,
    /// Sampling interval (`100ms`, `1s`, `2m`).
    #[arg(long = "sidecar-interval", env = "MEMPROF_SIDECAR_INTERVAL", default_value = "1s", value_parser = parse_interval)]
    pub sidecar_interval: Duration,
    /// CPU request of the sidecar (empty: none).
    #[arg(
        long = "sidecar-cpu-request",
        env = "MEMPROF_SIDECAR_CPU_REQUEST",
        default_value = "50m"
    )]
    pub sidecar_cpu_request: String,
    /// Memory request of the sidecar (empty: none).
    #[arg(
        long = "sidecar-memory-request",
        env = "MEMPROF_SIDECAR_MEMORY_REQUEST",
        default_value = "64Mi"
    )]
    pub sidecar_memory_request: String,
    /// CPU limit of the sidecar (empty: none).
    #[arg(
        long = "sidecar-cpu-limit",
        env = "MEMPROF_SIDECAR_CPU_LIMIT",
        default_value = ""
    )]
    pub sidecar_cpu_limit: String,
    /// Memory limit of the sidecar (empty: none).
    #[arg(
        long = "sidecar-memory-limit",
        env = "MEMPROF_SIDECAR_MEMORY_LIMIT",
        default_value = "128Mi"
    )]
    pub sidecar_memory_limit: String,
    /// Image of the init container that copies the Python agent into pods
    /// annotated memprof.dev/agent=python (empty: the sidecar's image).
    #[arg(long = "agent-image", env = "MEMPROF_AGENT_IMAGE", default_value = "")]
    pub agent_image: String,
    /// Where that image carries the agent tree (bootstrap/, lib/).
    #[arg(long = "agent-path", env = "MEMPROF_AGENT_PATH", default_value = memprof_api::DEFAULT_AGENT_SOURCE)]
    pub agent_path: String,
    /// How the sidecar sees GPUs: envvar, podResources or agentOnly.
    #[arg(long = "gpu-access", env = "MEMPROF_GPU_ACCESS", value_enum, default_value_t = GpuAccess::Envvar)]
    pub gpu_access: GpuAccess,
    /// auto (native sidecar on 1.29+ API servers), native or legacy.
    #[arg(long = "sidecar-mode", env = "MEMPROF_SIDECAR_MODE", value_enum, default_value_t = SidecarMode::Auto)]
    pub sidecar_mode: SidecarMode,
    /// Pods with automountServiceAccountToken=false: project a token into the sidecar, or respect.
    #[arg(long = "sidecar-service-account-token", env = "MEMPROF_SIDECAR_SERVICE_ACCOUNT_TOKEN", value_enum, default_value_t = ServiceAccountTokenMode::Project)]
    pub sidecar_token: ServiceAccountTokenMode,
    /// Cluster-wide analysis thresholds for every Job's sidecars, JSON of
    /// camelCase fields over the built-in ones (`{"highTtoSeconds":900}`);
    /// a Job's `memprof.dev/thresholds` goes over them.
    #[arg(long = "default-thresholds", env = "MEMPROF_DEFAULT_THRESHOLDS", default_value = "", value_parser = parse_thresholds)]
    pub default_thresholds: String,
    /// The sidecars log JSON lines (`MEMPROF_LOG_JSON=true`) instead of text.
    #[arg(long = "sidecar-log-json", env = "MEMPROF_SIDECAR_LOG_JSON", default_value_t = false, action = clap::ArgAction::Set)]
    pub sidecar_log_json: bool,
    /// The sidecar's securityContext as JSON, replacing the built-in one
    /// (restricted; uid 0 without capabilities in podResources mode). Empty: built-in.
    #[arg(long = "sidecar-security-context", env = "MEMPROF_SIDECAR_SECURITY_CONTEXT", default_value = "", value_parser = parse_security_context)]
    pub sidecar_security_context: String,
}

fn parse_thresholds(s: &str) -> Result<String, memprof_api::thresholds::ThresholdsError> {
    memprof_api::thresholds::parse_cluster(s).map(|_| s.to_string())
}

/// `--sidecar-security-context` that is not a container securityContext.
#[derive(Debug, thiserror::Error)]
#[error(
    "not a JSON securityContext ({0}); see `kubectl explain pod.spec.containers.securityContext`"
)]
pub struct SecurityContextError(serde_json::Error);

fn security_context(
    s: &str,
) -> Result<Option<k8s_openapi::api::core::v1::SecurityContext>, SecurityContextError> {
    if s.trim().is_empty() {
        return Ok(None);
    }
    serde_json::from_str(s)
        .map(Some)
        .map_err(SecurityContextError)
}

fn parse_security_context(s: &str) -> Result<String, SecurityContextError> {
    security_context(s).map(|_| s.to_string())
}

fn non_empty(s: &str) -> Option<String> {
    (!s.trim().is_empty()).then(|| s.trim().to_string())
}

/// A comma-separated flag's values, blanks dropped.
fn listed(values: &[String]) -> Vec<String> {
    values.iter().filter_map(|v| non_empty(v)).collect()
}

impl WebhookOptions {
    /// The injection settings, with the sidecar kind already resolved.
    pub fn injection_config(&self, native_sidecar: bool) -> InjectionConfig {
        InjectionConfig {
            image: self.sidecar_image.clone(),
            command: self
                .sidecar_command
                .split_whitespace()
                .map(str::to_string)
                .collect(),
            pull_policy: self.sidecar_pull_policy.clone(),
            port: self.sidecar_port,
            scrape: self.sidecar_scrape,
            interval: self.sidecar_interval,
            cpu_request: non_empty(&self.sidecar_cpu_request),
            memory_request: non_empty(&self.sidecar_memory_request),
            cpu_limit: non_empty(&self.sidecar_cpu_limit),
            memory_limit: non_empty(&self.sidecar_memory_limit),
            gpu_access: self.gpu_access,
            agent: super::config::AgentConfig {
                image: non_empty(&self.agent_image),
                source_dir: self.agent_path.clone(),
            },
            native_sidecar,
            service_account_token: self.sidecar_token,
            allow_image_override: self.allow_image_override,
            allowed_images: self
                .allowed_images
                .iter()
                .filter_map(|p| non_empty(p))
                .collect(),
            // Both checked by their flags' parsers.
            thresholds: memprof_api::thresholds::parse_cluster(&self.default_thresholds)
                .unwrap_or_default(),
            log_json: self.sidecar_log_json,
            security_context: security_context(&self.sidecar_security_context).unwrap_or_default(),
            marks: MarkConfig {
                controllers: self
                    .admission_controllers
                    .iter()
                    .filter_map(|c| non_empty(c))
                    .collect(),
                keys: Keys::default(),
            },
            workloads: crate::workload_marks::WorkloadIdentities {
                jobset: listed(&self.jobset_identities),
                trainer: listed(&self.trainer_identities),
                training_operator: listed(&self.training_operator_identities),
            },
        }
    }

    /// Where the admission-mark key lives.
    pub fn key_config(&self) -> KeyConfig {
        KeyConfig {
            namespace: self.namespace.clone(),
            secret_name: self.admission_key_secret.clone(),
            grace: SignedDuration::from_hours(i64::from(self.admission_key_grace_hours)),
        }
    }

    /// The flags that make the webhook unusable, checked at start.
    pub fn check(&self) -> Result<(), Error> {
        if self.port != 0 && self.sidecar_image.trim().is_empty() {
            return Err(Error::NoSidecarImage);
        }
        Ok(())
    }

    /// Where the certificate lives and what it is for.
    pub fn cert_config(&self) -> CertConfig {
        CertConfig {
            namespace: self.namespace.clone(),
            secret_name: self.secret_name.clone(),
            service_name: self.service_name.clone(),
            extra_names: self
                .extra_names
                .iter()
                .filter_map(|n| non_empty(n))
                .collect(),
            webhook_config_name: non_empty(&self.config_name),
            validity: SignedDuration::from_hours(24 * 365),
            renew_before: SignedDuration::from_hours(24 * 30),
        }
    }
}

/// One pass of the certificate work: returns (cert, key) PEM to serve.
async fn fetch_cert(
    client: &Client,
    opts: &WebhookOptions,
) -> Result<(Vec<u8>, Vec<u8>), CertError> {
    match opts.cert_mode {
        CertMode::Files => certs::load_files(&opts.cert_dir),
        CertMode::SelfSigned => {
            let cfg = opts.cert_config();
            let bundle = certs::ensure_serving_cert(client, &cfg).await?;
            if let Some(name) = &cfg.webhook_config_name {
                certs::patch_ca_bundle(client, name, &bundle.ca_pem).await?;
            }
            Ok((bundle.cert_pem.into_bytes(), bundle.key_pem.into_bytes()))
        }
    }
}

/// Serves the admission webhook until `shutdown` completes: resolves native
/// vs legacy sidecars from the API server's version, sets up the serving
/// certificate, serves `POST /mutate`, and keeps the certificate (and, in
/// self mode, the `caBundle`) fresh. With `--webhook-port 0` it only waits for
/// `shutdown`. Run it on every replica, not only the leader: the Service
/// sends admissions to all of them. Pods the Job controller creates are
/// marked with `keys` (kept fresh by [`super::keys::maintain`]) once loaded.
pub async fn run(
    client: Client,
    opts: WebhookOptions,
    keys: Keys,
    metrics: Arc<super::server::ServerMetrics>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), Error> {
    if opts.port == 0 {
        tracing::info!("admission webhook disabled (--webhook-port 0)");
        shutdown.await;
        return Ok(());
    }
    opts.check()?;
    let addr = SocketAddr::new(opts.bind_address, opts.port);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind { addr, source })?;
    let mut shutdown = std::pin::pin!(shutdown);

    let native = tokio::select! {
        v = until_ok("cannot read the API server version", || client.apiserver_version())
            => opts.sidecar_mode.resolve(&v.major, &v.minor),
        () = &mut shutdown => return Ok(()),
    };
    let mut config = opts.injection_config(native);
    config.marks.keys = keys.clone();
    let config = Arc::new(config);
    tracing::info!(native_sidecar = native, gpu_access = config.gpu_access.as_str(), image = %config.image, "injection configured");

    let (cert, key) = tokio::select! {
        pem = until_ok("webhook certificate not ready", || fetch_cert(&client, &opts)) => pem,
        () = &mut shutdown => return Ok(()),
    };
    let tls = TlsCert::from_pem(&cert, &key)?;

    let paths = non_empty(&opts.config_name).map(|name| {
        let keep = super::paths::keep_paths(client.clone(), name, keys, std::future::pending());
        tokio::spawn(keep)
    });
    // Every replica reads the history: admissions go to all of them.
    let history = Some(Arc::new(super::history::History::new(client.clone())));
    let refresher = tokio::spawn(refresh_cert(tls.clone(), client, opts, (cert, key)));
    let limits = super::server::ServerLimits::default();
    let served =
        super::server::serve_all(listener, tls, config, (limits, metrics), history, shutdown).await;
    refresher.abort();
    if let Some(p) = paths {
        p.abort();
    }
    Ok(served?)
}

/// Reads the serving certificate again every so often (files: when the
/// kubelet rotates the Secret's volume; self mode: before it expires) and
/// swaps it in when it changed; `last` is the one being served. Runs until
/// aborted; a failed read or a bad certificate keeps the previous one.
async fn refresh_cert(
    tls: TlsCert,
    client: Client,
    opts: WebhookOptions,
    mut last: (Vec<u8>, Vec<u8>),
) {
    let every = match opts.cert_mode {
        CertMode::Files => RELOAD_FILES_EVERY,
        CertMode::SelfSigned => RENEW_CHECK_EVERY,
    };
    loop {
        tokio::time::sleep(every).await;
        match fetch_cert(&client, &opts).await {
            Ok(pem) if pem != last => match tls.reload(&pem.0, &pem.1) {
                Ok(()) => {
                    tracing::info!("webhook serving certificate reloaded");
                    last = pem;
                }
                Err(e) => tracing::error!(error = %e, "keeping the previous certificate"),
            },
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "certificate refresh failed; will retry"),
        }
    }
}

#[cfg(test)]
mod tests;
