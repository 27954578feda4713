//! kubectl's conventions for every cluster command (contract C-5): the
//! kubeconfig's current context and its namespace by default, `--kubeconfig`,
//! `--context`, `-n/--namespace`, `-A/--all-namespaces`, an in-cluster
//! fallback, and [`CliError`]: errors that say what to do.

use kube::api::{Api, ListParams};
use kube::config::{Config, KubeConfigOptions, Kubeconfig};
use kube::{Client, ResourceExt};
use memprof_api::{MemoryProfile, MemoryReport, LABEL_JOB};
use std::path::PathBuf;

/// What a cluster command failed at, in words a person can act on.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Neither a kubeconfig nor an in-cluster service account was usable.
    #[error("no Kubernetes cluster configured ({0}): set KUBECONFIG or pass --kubeconfig, or run inside a cluster")]
    NoConfig(String),
    /// The kubeconfig names no such context.
    #[error("context {context:?} is not in the kubeconfig; contexts there: {}", list_or_none(.known))]
    NoSuchContext {
        /// The context asked for.
        context: String,
        /// The contexts the kubeconfig has.
        known: Vec<String>,
    },
    /// The API server did not answer.
    #[error("no cluster reachable at {server}: {reason} (is the cluster up, and is --context/KUBECONFIG the one you meant?)")]
    Unreachable {
        /// The API server's URL.
        server: String,
        /// What the connection said.
        reason: String,
    },
    /// The memprof CRDs are not served.
    #[error("the memprof CRDs are not installed in this cluster ({resource}.memprof.dev not found): run `kubectl apply -f crds/` or install the chart (`helm install memprof charts/memprof`)")]
    CrdsMissing {
        /// The plural of the resource that is missing.
        resource: String,
    },
    /// No MemoryProfile of that name; names the ones that exist.
    #[error("no MemoryProfile {namespace}/{name}; {}", existing_profiles(.namespace, .existing))]
    ProfileNotFound {
        /// Namespace looked in.
        namespace: String,
        /// Name asked for.
        name: String,
        /// Profiles that exist there.
        existing: Vec<String>,
    },
    /// No Job of that name (`policy explain`); exits 1 as kubectl's NotFound does.
    #[error("no Job {namespace}/{name}: `kubectl get jobs -n {namespace}` lists them (or pass NAMESPACE/JOB, -n)")]
    JobNotFound {
        /// Namespace looked in.
        namespace: String,
        /// Name asked for.
        name: String,
    },
    /// The user may not read what the command needs.
    #[error("not allowed to {verb} {resource} in {scope}: {message} (ask for read access to memprof.dev resources, or pick another namespace with -n)")]
    Forbidden {
        /// `get` or `list`.
        verb: &'static str,
        /// Resource plural.
        resource: String,
        /// `namespace X` or `all namespaces`.
        scope: String,
        /// The API server's message.
        message: String,
    },
    /// A command-line combination that cannot work.
    #[error("{0}")]
    Usage(String),
    /// Any other API error.
    #[error("{verb} {resource}: {error}")]
    Api {
        /// `get` or `list`.
        verb: &'static str,
        /// Resource plural.
        resource: String,
        /// The client's error.
        error: kube::Error,
    },
}

fn list_or_none(names: &[String]) -> String {
    if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    }
}

fn existing_profiles(ns: &str, existing: &[String]) -> String {
    if existing.is_empty() {
        format!("there are no MemoryProfiles in namespace {ns} (is the Job annotated memprof.dev/enabled=true, the operator running, and -n/the context's namespace right? -A looks everywhere)")
    } else {
        format!("MemoryProfiles in namespace {ns}: {}", existing.join(", "))
    }
}

/// Where a command looks: one namespace, or all of them (`-A`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// One namespace.
    Namespace(String),
    /// Every namespace.
    All,
}

impl Scope {
    /// The namespace, or `None` for all.
    pub fn namespace(&self) -> Option<&str> {
        match self {
            Scope::Namespace(ns) => Some(ns),
            Scope::All => None,
        }
    }

    /// For messages: `namespace X` or `all namespaces`.
    pub fn describe(&self) -> String {
        match self {
            Scope::Namespace(ns) => format!("namespace {ns}"),
            Scope::All => "all namespaces".to_string(),
        }
    }

    /// An API of `K` over this scope.
    pub fn api<K>(&self, client: &Client) -> Api<K>
    where
        K: kube::Resource<Scope = kube::core::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        match self {
            Scope::Namespace(ns) => Api::namespaced(client.clone(), ns),
            Scope::All => Api::all(client.clone()),
        }
    }
}

/// The flags every cluster command takes, as kubectl spells them.
#[derive(Clone, Debug, Default, PartialEq, Eq, clap::Args)]
pub struct KubeArgs {
    /// Path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config, then in-cluster).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current-context).
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
    /// Namespace (default: the context's namespace, else `default`).
    #[arg(short = 'n', long, value_name = "NS")]
    pub namespace: Option<String>,
}

/// The flags of a command that lists (`top`, `report`): [`KubeArgs`] plus
/// kubectl's `-A/--all-namespaces` and `-l/--selector`. Commands about one
/// Job take [`KubeArgs`] alone, so they do not offer flags they would reject.
#[derive(Clone, Debug, Default, PartialEq, Eq, clap::Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub kube: KubeArgs,
    /// Look in every namespace.
    #[arg(short = 'A', long, conflicts_with = "namespace")]
    pub all_namespaces: bool,
    /// Only objects whose labels match (kubectl's selector: `k=v`, `k!=v`,
    /// `k in (a,b)`, `k`, `!k`, comma-separated). The operator labels each
    /// MemoryProfile `memprof.dev/job=JOB`.
    #[arg(short = 'l', long, value_name = "SELECTOR")]
    pub selector: Option<String>,
}

impl ListArgs {
    /// A client and where to look: `-A`, else `-n`, else the context's
    /// namespace, else `default`.
    pub async fn connect(&self) -> Result<(Client, Scope), CliError> {
        let (client, ns) = self.kube.connect().await?;
        Ok((client, self.scope(&ns)))
    }

    /// The scope given the namespace [`KubeArgs`] resolved (pure, for tests).
    pub fn scope(&self, namespace: &str) -> Scope {
        if self.all_namespaces {
            Scope::All
        } else {
            Scope::Namespace(namespace.to_string())
        }
    }
}

impl KubeArgs {
    /// A client for the chosen cluster and the namespace to use, as kubectl
    /// would: `-n`, else the context's namespace, else `default`.
    pub async fn connect(&self) -> Result<(Client, String), CliError> {
        let config = self.config().await?;
        let ns = self.namespace(&config.default_namespace);
        let server = config.cluster_url.to_string();
        let client = Client::try_from(config).map_err(|e| CliError::NoConfig(e.to_string()))?;
        // One cheap request first, so a cluster that is not there is named as such.
        match client.apiserver_version().await {
            Err(e @ (kube::Error::HyperError(_) | kube::Error::Service(_))) => {
                Err(CliError::Unreachable {
                    server,
                    reason: error_chain(&e),
                })
            }
            _ => Ok((client, ns)),
        }
    }

    /// `-n`, else the context's namespace (pure, for tests).
    pub fn namespace(&self, context_namespace: &str) -> String {
        self.namespace
            .clone()
            .unwrap_or_else(|| context_namespace.to_string())
    }

    async fn config(&self) -> Result<Config, CliError> {
        let options = KubeConfigOptions {
            context: self.context.clone(),
            ..Default::default()
        };
        let kubeconfig = match &self.kubeconfig {
            Some(path) => Some(Kubeconfig::read_from(path).map_err(|e| {
                CliError::NoConfig(format!("cannot read kubeconfig {}: {e}", path.display()))
            })?),
            None => match std::env::var_os("KUBECONFIG") {
                // A kubeconfig the user named but we cannot read is an
                // error to show, not a reason to try the in-cluster config.
                Some(v) if std::env::split_paths(&v).any(|p| !p.as_os_str().is_empty()) => {
                    Some(read_kubeconfig_env(&v)?)
                }
                _ => Kubeconfig::read().ok(),
            },
        };
        match kubeconfig {
            Some(kc) => {
                check_context(&kc, self.context.as_deref())?;
                Config::from_custom_kubeconfig(kc, &options)
                    .await
                    .map_err(|e| CliError::NoConfig(e.to_string()))
            }
            // No kubeconfig anywhere: running in a pod, as the operator does.
            None if self.context.is_none() => Config::incluster().map_err(|e| {
                CliError::NoConfig(format!("no kubeconfig found and not in a cluster: {e}"))
            }),
            None => Err(CliError::NoConfig(
                "--context given but no kubeconfig found".into(),
            )),
        }
    }
}

/// The kubeconfig files named by a `KUBECONFIG` value (a path list),
/// merged as kubectl merges them; the error names the file that failed and
/// the OS error (permission denied, no such file).
fn read_kubeconfig_env(value: &std::ffi::OsStr) -> Result<Kubeconfig, CliError> {
    let paths = std::env::split_paths(value).filter(|p| !p.as_os_str().is_empty());
    paths
        .into_iter()
        .try_fold(Kubeconfig::default(), |merged, path| {
            let named = |e: &dyn std::fmt::Display| {
                CliError::NoConfig(format!(
                    "cannot read kubeconfig {} (named by KUBECONFIG): {e}",
                    path.display()
                ))
            };
            let kc = Kubeconfig::read_from(&path).map_err(|e| match e {
                kube::config::KubeconfigError::ReadConfig(io, _) => named(&io),
                e => named(&error_chain(&e)),
            })?;
            merged.merge(kc).map_err(|e| named(&e))
        })
}

fn check_context(kc: &Kubeconfig, context: Option<&str>) -> Result<(), CliError> {
    let Some(context) = context else {
        return Ok(());
    };
    let known: Vec<String> = kc.contexts.iter().map(|c| c.name.clone()).collect();
    if known.iter().any(|k| k == context) {
        Ok(())
    } else {
        Err(CliError::NoSuchContext {
            context: context.to_string(),
            known,
        })
    }
}

/// Maps a client error on `verb resource` in `scope` to what a person can act on.
pub fn map_error(e: kube::Error, verb: &'static str, resource: &str, scope: &Scope) -> CliError {
    match &e {
        kube::Error::Api(s) if s.code == 404 && verb == "list" => CliError::CrdsMissing {
            resource: resource.to_string(),
        },
        kube::Error::Api(s) if s.code == 403 => CliError::Forbidden {
            verb,
            resource: resource.to_string(),
            scope: scope.describe(),
            message: s.message.clone(),
        },
        kube::Error::HyperError(_) | kube::Error::Service(_) => CliError::Unreachable {
            server: "the API server".to_string(),
            reason: error_chain(&e),
        },
        _ => CliError::Api {
            verb,
            resource: resource.to_string(),
            error: e,
        },
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cur = s.source();
    }
    out
}

/// The list parameters of a label selector (none: everything).
fn selecting(selector: Option<&str>) -> ListParams {
    match selector {
        Some(s) => ListParams::default().labels(s),
        None => ListParams::default(),
    }
}

/// Every MemoryReport in scope (matching `selector`), by namespace, Job,
/// rank, name.
pub async fn list_reports(
    client: &Client,
    scope: &Scope,
    selector: Option<&str>,
) -> Result<Vec<MemoryReport>, CliError> {
    let mut items = scope
        .api::<MemoryReport>(client)
        .list(&selecting(selector))
        .await
        .map_err(|e| map_error(e, "list", "memoryreports", scope))?
        .items;
    items.sort_by_key(|r| {
        let job = r.labels().get(LABEL_JOB).cloned().unwrap_or_default();
        let rank = r.spec.rank.unwrap_or(u32::MAX);
        (r.namespace().unwrap_or_default(), job, rank, r.name_any())
    });
    Ok(items)
}

/// Every MemoryProfile in scope (matching `selector`), sorted by namespace
/// then name.
pub async fn list_profiles(
    client: &Client,
    scope: &Scope,
    selector: Option<&str>,
) -> Result<Vec<MemoryProfile>, CliError> {
    let mut items = scope
        .api::<MemoryProfile>(client)
        .list(&selecting(selector))
        .await
        .map_err(|e| map_error(e, "list", "memoryprofiles", scope))?
        .items;
    items.sort_by_key(|p| (p.namespace().unwrap_or_default(), p.name_any()));
    Ok(items)
}

/// The MemoryProfile `name` in `namespace`; when missing, the error lists those that exist.
pub async fn get_profile(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<MemoryProfile, CliError> {
    let scope = Scope::Namespace(namespace.to_string());
    let api: Api<MemoryProfile> = Api::namespaced(client.clone(), namespace);
    match api.get_opt(name).await {
        Ok(Some(p)) => Ok(p),
        // A 404 on get cannot tell a missing object from a missing CRD: the list can.
        Ok(None) | Err(kube::Error::Api(_)) => {
            let existing = list_profiles(client, &scope, None)
                .await?
                .iter()
                .map(|p| p.name_any())
                .collect();
            Err(CliError::ProfileNotFound {
                namespace: namespace.to_string(),
                name: name.to_string(),
                existing,
            })
        }
        Err(e) => Err(map_error(e, "get", "memoryprofiles", &scope)),
    }
}

/// The MemoryReports of Job `job` (by the `memprof.dev/job` label the
/// sidecars set), by rank then name.
pub async fn job_reports(
    client: &Client,
    namespace: &str,
    job: &str,
) -> Result<Vec<MemoryReport>, CliError> {
    let scope = Scope::Namespace(namespace.to_string());
    let mut items = scope
        .api::<MemoryReport>(client)
        .list(&ListParams::default().labels(&format!("{LABEL_JOB}={job}")))
        .await
        .map_err(|e| map_error(e, "list", "memoryreports", &scope))?
        .items;
    items.sort_by_key(|r| (r.spec.rank.unwrap_or(u32::MAX), r.name_any()));
    Ok(items)
}

/// Splits `ns/job` into its parts; a bare `job` takes `default_ns`.
pub fn split_ref<'a>(arg: &'a str, default_ns: &'a str) -> (&'a str, &'a str) {
    match arg.split_once('/') {
        Some((ns, job)) if !ns.is_empty() && !job.is_empty() => (ns, job),
        _ => (default_ns, arg),
    }
}

/// The namespace a single-object command uses; `-A` has no meaning there.
pub fn single_namespace(scope: &Scope, command: &str) -> Result<String, CliError> {
    scope.namespace().map(str::to_string).ok_or_else(|| {
        CliError::Usage(format!(
            "{command} looks at one Job: use -n NAMESPACE (or NAMESPACE/JOB), not -A"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    fn api_err(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(
            Status::failure("the server could not find the requested resource", reason)
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn a_404_on_a_list_says_the_crds_are_missing_and_how_to_install_them() {
        let e = map_error(
            api_err(404, "NotFound"),
            "list",
            "memoryprofiles",
            &Scope::All,
        );
        let text = e.to_string();
        assert!(matches!(e, CliError::CrdsMissing { .. }), "{e:?}");
        assert!(
            text.contains("memoryprofiles.memprof.dev not found"),
            "{text}"
        );
        assert!(text.contains("kubectl apply -f crds/"), "{text}");
        assert!(text.contains("install the chart"), "{text}");
    }

    #[test]
    fn an_unreadable_kubeconfig_from_the_env_is_named_with_the_os_error() {
        let dir = std::env::temp_dir().join(format!("memprof-kube-{}", std::process::id()));
        let missing = dir.join("no-such-kubeconfig");
        let err = read_kubeconfig_env(missing.as_os_str())
            .unwrap_err()
            .to_string();
        assert!(err.contains(&missing.display().to_string()), "{err}");
        assert!(err.contains("KUBECONFIG"), "{err}");
        assert!(err.contains("No such file or directory"), "{err}");
        // A directory: read fails with the OS's words too.
        let tmp = std::env::temp_dir();
        let err = read_kubeconfig_env(tmp.as_os_str())
            .unwrap_err()
            .to_string();
        assert!(err.contains(&tmp.display().to_string()), "{err}");
        assert!(err.contains("os error"), "{err}");
    }

    #[test]
    fn a_403_names_the_resource_and_scope() {
        let scope = Scope::Namespace("ml".into());
        let text =
            map_error(api_err(403, "Forbidden"), "list", "memoryreports", &scope).to_string();
        assert!(
            text.starts_with("not allowed to list memoryreports in namespace ml"),
            "{text}"
        );
    }

    #[test]
    fn not_found_lists_the_profiles_that_exist_or_says_there_are_none() {
        let e = CliError::ProfileNotFound {
            namespace: "ml".into(),
            name: "trian".into(),
            existing: vec!["train".into(), "eval".into()],
        };
        assert_eq!(
            e.to_string(),
            "no MemoryProfile ml/trian; MemoryProfiles in namespace ml: train, eval"
        );
        let none = CliError::ProfileNotFound {
            namespace: "ml".into(),
            name: "x".into(),
            existing: vec![],
        };
        assert!(none
            .to_string()
            .contains("there are no MemoryProfiles in namespace ml"));
    }

    #[test]
    fn scope_follows_kubectl_all_then_flag_then_context() {
        let mut a = ListArgs::default();
        assert_eq!(a.kube.namespace("team-a"), "team-a");
        a.kube.namespace = Some("ml".into());
        assert_eq!(
            a.scope(&a.kube.namespace("team-a")),
            Scope::Namespace("ml".into())
        );
        a.kube.namespace = None;
        a.all_namespaces = true;
        assert_eq!(a.scope("team-a"), Scope::All);
    }

    #[test]
    fn ns_slash_job_splits_and_a_bare_job_takes_the_default() {
        assert_eq!(split_ref("ml/train", "default"), ("ml", "train"));
        assert_eq!(split_ref("train", "team"), ("team", "train"));
    }
}
