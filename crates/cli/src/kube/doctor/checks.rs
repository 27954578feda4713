//! The checks of `memprof doctor`, as pure functions of the objects read:
//! each says OK, WARN or FAIL, what it saw, and what to do.

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Endpoints, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use memprof_api::ANNOTATION_ENABLED;

/// How a check came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// As it should be.
    Ok,
    /// Works, but something may surprise.
    Warn,
    /// Broken: Jobs go unprofiled or the operator does not run.
    Fail,
}

/// One line of the doctor's output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    /// OK, WARN or FAIL.
    pub level: Level,
    /// What was checked and seen.
    pub what: String,
    /// What to do about it (WARN and FAIL).
    pub todo: Option<String>,
}

impl Check {
    /// An OK line.
    pub fn ok(what: impl Into<String>) -> Self {
        Check {
            level: Level::Ok,
            what: what.into(),
            todo: None,
        }
    }
    /// A WARN line with advice.
    pub fn warn(what: impl Into<String>, todo: impl Into<String>) -> Self {
        Check {
            level: Level::Warn,
            what: what.into(),
            todo: Some(todo.into()),
        }
    }
    /// A FAIL line with advice.
    pub fn fail(what: impl Into<String>, todo: impl Into<String>) -> Self {
        Check {
            level: Level::Fail,
            what: what.into(),
            todo: Some(todo.into()),
        }
    }
}

/// The lines, each `OK    …` / `WARN  …` / `FAIL  …` with its advice under it.
pub fn render(checks: &[Check]) -> String {
    let mut out = String::new();
    for c in checks {
        let tag = match c.level {
            Level::Ok => "OK  ",
            Level::Warn => "WARN",
            Level::Fail => "FAIL",
        };
        out.push_str(&format!("{tag}  {}\n", c.what));
        if let Some(t) = &c.todo {
            out.push_str(&format!("      → {t}\n"));
        }
    }
    let fails = checks.iter().filter(|c| c.level == Level::Fail).count();
    let warns = checks.iter().filter(|c| c.level == Level::Warn).count();
    let plural = |n: usize, one: &str| format!("{n} {one}{}", if n == 1 { "" } else { "s" });
    out.push_str(&format!(
        "\n{fails} failed, {}, {}\n",
        plural(warns, "warning"),
        plural(checks.len(), "check")
    ));
    out
}

/// The three CRDs: present and `Established`.
pub fn crds(found: &[(&str, Option<CustomResourceDefinition>)]) -> Vec<Check> {
    let apply = "kubectl apply --server-side --force-conflicts -f crds/ (or install the chart)";
    found
        .iter()
        .map(|(name, crd)| {
            let Some(crd) = crd else {
                return Check::fail(format!("CRD {name} is not installed"), apply);
            };
            let established = crd
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c.type_ == "Established" && c.status == "True")
                });
            if established {
                Check::ok(format!("CRD {name} is served"))
            } else {
                Check::fail(
                    format!("CRD {name} exists but is not Established"),
                    format!("kubectl describe crd {name}"),
                )
            }
        })
        .collect()
}

/// Where a memprof webhook sends its requests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The configuration's name.
    pub config: String,
    /// Service namespace and name, or `None` for a `url` webhook.
    pub service: Option<(String, String)>,
    /// The PEM trust bundle the API server uses (decoded `caBundle`).
    pub ca_bundle: Vec<u8>,
}

/// The operator's secret path prefix (`memprof_webhook::paths`): only
/// reviews sent there get pods their admission mark.
const SECRET_PATH: &str = "/mutate/";

/// `url` with the secret path's token hidden (it is what lets a review be marked).
fn without_token(url: &str) -> String {
    match url.find(SECRET_PATH) {
        Some(i) if url.len() > i + SECRET_PATH.len() => format!("{}{SECRET_PATH}…", &url[..i]),
        _ => url.to_string(),
    }
}

/// Whether the marks webhook `name` is on the operator's secret path (else
/// pods are injected but never marked, so none counts for its Job).
fn mark_path(name: &str, cc: &WebhookClientConfig) -> Check {
    let path = match (&cc.service, &cc.url) {
        (Some(s), _) => s.path.clone().unwrap_or_default(),
        (None, Some(u)) => {
            let rest = u.split_once("://").map_or(u.as_str(), |(_, r)| r);
            rest.find('/')
                .map_or(String::new(), |i| rest[i..].to_string())
        }
        (None, None) => String::new(),
    };
    let (marked, lost) = match name {
        "writers.memprof.dev" => (
            "the reports its pods' sidecars write are marked",
            "reports are written but not marked, so none counts",
        ),
        _ => (
            "the Job controller's pods are marked",
            "pods are injected but not marked, so none counts for its Job",
        ),
    };
    if path.len() > SECRET_PATH.len() && path.starts_with(SECRET_PATH) {
        return Check::ok(format!(
            "webhook {name} is on the operator's secret path: {marked}"
        ));
    }
    Check::warn(
        format!("webhook {name} calls {}, not the operator's secret path: {lost}", if path.is_empty() { "/" } else { &path }),
        "the operator sets it within 30 s of starting (--webhook-config-name, and get/patch on its MutatingWebhookConfiguration); after a helm upgrade, wait 30 s",
    )
}

/// The memprof webhooks (`*.memprof.dev`) of the configurations: each must
/// have a caBundle; `failurePolicy: Ignore` means Jobs run unprofiled, not
/// rejected, while the webhook is down. Returns the lines and the targets.
pub fn webhooks(configs: &[MutatingWebhookConfiguration]) -> (Vec<Check>, Vec<Target>) {
    let (mut checks, mut targets) = (Vec::new(), Vec::new());
    for cfg in configs {
        let name = cfg.metadata.name.clone().unwrap_or_default();
        for w in cfg
            .webhooks
            .iter()
            .flatten()
            .filter(|w| w.name.ends_with(".memprof.dev"))
        {
            let cc = &w.client_config;
            let ca = cc
                .ca_bundle
                .as_ref()
                .map(|b| b.0.clone())
                .unwrap_or_default();
            let service = cc
                .service
                .as_ref()
                .map(|s| (s.namespace.clone(), s.name.clone()));
            let at = match (&service, &cc.url) {
                (Some((ns, n)), _) => format!("service {ns}/{n}"),
                (None, Some(u)) => format!("url {}", without_token(u)),
                (None, None) => "nowhere".into(),
            };
            if ca.is_empty() {
                checks.push(Check::fail(
                    format!("webhook {} of {name} ({at}) has no caBundle: the API server cannot call it", w.name),
                    "certMode self: the operator writes it at start (is it running? see its pods below); certMode certManager: is cert-manager's cainjector running?",
                ));
            } else {
                checks.push(Check::ok(format!(
                    "webhook {} of {name} calls {at}",
                    w.name
                )));
            }
            if w.failure_policy.as_deref() != Some("Fail") && w.name == "jobs.memprof.dev" {
                checks.push(Check::warn(
                    format!("webhook {} fails open (failurePolicy {}): while it is unreachable, annotated Jobs run unprofiled", w.name, w.failure_policy.as_deref().unwrap_or("Fail")),
                    "that is deliberate (training is never blocked by memprof); the last check below finds Jobs it missed",
                ));
            }
            if ["marks.memprof.dev", "writers.memprof.dev"].contains(&w.name.as_str()) {
                checks.push(mark_path(&w.name, cc));
            }
            targets.push(Target {
                config: name.clone(),
                service,
                ca_bundle: ca,
            });
        }
    }
    if targets.is_empty() {
        checks.push(Check::fail(
            "no memprof webhook is registered (no MutatingWebhookConfiguration with *.memprof.dev webhooks): annotated Jobs are never profiled",
            "install the chart with webhook.enabled=true (the default): helm install memprof charts/memprof",
        ));
    }
    (checks, targets)
}

/// The operator's pods: an image that cannot be pulled, a crash loop, not ready.
pub fn pods(ns: &str, pods: &[Pod]) -> Vec<Check> {
    if pods.is_empty() {
        return vec![Check::fail(
            format!("no operator pod in namespace {ns}"),
            format!("kubectl -n {ns} get deploy,rs,events: is the Deployment scaled to 0, or are pods refused (quota, Pod Security)?"),
        )];
    }
    pods.iter().map(|p| pod(ns, p)).collect()
}

fn pod(ns: &str, p: &Pod) -> Check {
    let name = p.metadata.name.clone().unwrap_or_default();
    let status = p.status.clone().unwrap_or_default();
    let containers = status
        .container_statuses
        .iter()
        .flatten()
        .chain(status.init_container_statuses.iter().flatten());
    for c in containers {
        let Some(waiting) = c.state.as_ref().and_then(|s| s.waiting.as_ref()) else {
            continue;
        };
        let reason = waiting.reason.clone().unwrap_or_default();
        let msg = waiting.message.clone().unwrap_or_default();
        match reason.as_str() {
            "ErrImagePull" | "ImagePullBackOff" | "InvalidImageName" => {
                return Check::fail(
                    format!("operator pod {name} cannot pull image {} ({reason}{})", c.image, if msg.is_empty() { String::new() } else { format!(": {msg}") }),
                    "the image is not published where the nodes can pull it: `make image`, push it to your registry, then `helm upgrade memprof charts/memprof --reuse-values --set image.repository=REGISTRY/memprof --set image.tag=TAG` (docs/install.md); add imagePullSecrets for a private registry",
                );
            }
            "CrashLoopBackOff" | "CreateContainerConfigError" | "RunContainerError" => {
                return Check::fail(
                    format!("operator pod {name}: container {} is in {reason}", c.name),
                    format!("kubectl -n {ns} logs {name} -c {} --previous", c.name),
                );
            }
            _ => {}
        }
    }
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    let phase = status.phase.clone().unwrap_or_else(|| "Pending".into());
    if ready {
        Check::ok(format!("operator pod {name} is ready"))
    } else {
        Check::fail(
            format!("operator pod {name} is not ready (phase {phase})"),
            format!(
                "kubectl -n {ns} describe pod {name}: events say why (scheduling, image, probes)"
            ),
        )
    }
}

/// The operator Deployments: at least one available replica.
pub fn deployments(ns: &str, deploys: &[Deployment]) -> Vec<Check> {
    deploys
        .iter()
        .map(|d| {
            let name = d.metadata.name.clone().unwrap_or_default();
            let available = d.status.as_ref().and_then(|s| s.available_replicas).unwrap_or(0);
            let wanted = d.spec.replicas.unwrap_or(1);
            if available > 0 {
                Check::ok(format!("operator Deployment {ns}/{name}: {available}/{wanted} available"))
            } else {
                Check::fail(
                    format!("operator Deployment {ns}/{name}: 0/{wanted} available: no operator and no webhook"),
                    format!("kubectl -n {ns} rollout status deploy/{name}; the pod lines say why"),
                )
            }
        })
        .collect()
}

/// The webhook Service's endpoints: some address must be ready.
pub fn endpoints(ns: &str, svc: &str, ep: Option<&Endpoints>) -> Check {
    let ready = ep.and_then(|e| e.subsets.as_ref()).map_or(0, |s| {
        s.iter()
            .map(|s| s.addresses.as_ref().map_or(0, Vec::len))
            .sum::<usize>()
    });
    match (ep, ready) {
        (None, _) => Check::fail(
            format!("webhook Service {ns}/{svc} has no Endpoints object"),
            format!("kubectl -n {ns} get svc {svc}: is the Service there and does its selector match the operator pods?"),
        ),
        (Some(_), 0) => Check::fail(
            format!("webhook Service {ns}/{svc} has no ready endpoint: the API server has nowhere to send Jobs"),
            "the operator pods are not ready: see their lines",
        ),
        (Some(_), n) => Check::ok(format!("webhook Service {ns}/{svc} has {n} ready endpoint(s)")),
    }
}

/// Annotated Jobs whose pod template was never injected (no sidecar): they
/// were created while the webhook was unreachable (it fails open) or outside
/// its selectors, and run unprofiled.
pub fn jobs(jobs: &[Job]) -> Vec<Check> {
    let missed: Vec<String> = jobs
        .iter()
        .filter(|j| {
            j.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANNOTATION_ENABLED))
                .is_some_and(|v| v == "true")
        })
        .filter(|j| !injected(j))
        .map(|j| {
            format!(
                "{}/{}",
                j.metadata.namespace.as_deref().unwrap_or("-"),
                j.metadata.name.as_deref().unwrap_or("-")
            )
        })
        .collect();
    if missed.is_empty() {
        return vec![Check::ok(
            "every Job annotated memprof.dev/enabled=true was injected",
        )];
    }
    vec![Check::warn(
        format!("{} annotated Job(s) were never injected and run unprofiled: {}", missed.len(), missed.join(", ")),
        "they were created while the webhook was down (it fails open) or in a namespace its namespaceSelector leaves out; fix the lines above, then re-create them",
    )]
}

/// Whether the webhook injected the Job: its pod template has the sidecar.
fn injected(j: &Job) -> bool {
    let Some(t) = j.spec.as_ref().map(|s| &s.template) else {
        return false;
    };
    let marked = t
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.as_ref())
        .and_then(|a| a.get("memprof.dev/injected"))
        .is_some();
    let sidecar = t.spec.as_ref().is_some_and(|s| {
        s.containers
            .iter()
            .chain(s.init_containers.iter().flatten())
            .any(|c| c.name == "memprof-sidecar")
    });
    marked || sidecar
}

#[cfg(test)]
mod tests;
