//! `memprof doctor` (also `kubectl memprof doctor`): is the install working?
//! CRDs served; the memprof webhooks registered with a caBundle; their
//! Service's endpoints; the operator's pods (an image that cannot be pulled
//! is named, with the fix) and Deployment; the serving certificate as the API
//! server will check it; and annotated Jobs the webhook never injected (it
//! fails open, so they ran unprofiled). One line each, OK/WARN/FAIL with what
//! to do; exit status 1 on any FAIL. Reading is here, judging in [`checks`].

pub mod cert;
pub mod checks;

use crate::kube::client::{map_error, CliError, ListArgs, Scope};
use checks::{Check, Level, Target};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Endpoints, Pod, Secret, Service};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams};
use kube::Client;

/// Flags of `memprof doctor`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Where to look for annotated Jobs the webhook missed (`-n`, `-A`, `-l`).
    #[command(flatten)]
    pub list: ListArgs,
    /// Check only this MutatingWebhookConfiguration (default: every one with
    /// `*.memprof.dev` webhooks).
    #[arg(long, value_name = "NAME")]
    pub webhook: Option<String>,
}

/// The CRDs memprof needs.
pub const CRDS: [&str; 3] = [
    "memoryprofiles.memprof.dev",
    "memoryreports.memprof.dev",
    "remediationpolicies.memprof.dev",
];

/// Runs every check, prints the lines; 1 when any FAILs.
pub async fn run(args: Args) -> Result<i32, CliError> {
    let (client, scope) = args.list.connect().await?;
    let mut out = crds(&client).await;
    let (lines, targets) = webhooks(&client, args.webhook.as_deref()).await?;
    out.extend(lines);
    for t in &targets {
        out.extend(target(&client, t).await);
    }
    out.extend(jobs(&client, &scope, args.list.selector.as_deref()).await?);
    crate::output::print(&checks::render(&out));
    Ok(i32::from(out.iter().any(|c| c.level == Level::Fail)))
}

/// A read the user may not be allowed: 403 becomes a WARN line.
fn cannot(what: &str, e: &kube::Error) -> Check {
    Check::warn(
        format!("cannot read {what}: {e}"),
        "run doctor as a user who may read it, or check by hand",
    )
}

async fn crds(client: &Client) -> Vec<Check> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut found = Vec::new();
    for name in CRDS {
        match api.get_opt(name).await {
            Ok(crd) => found.push((name, crd)),
            Err(e) => return vec![cannot("CustomResourceDefinitions", &e)],
        }
    }
    checks::crds(&found)
}

async fn webhooks(
    client: &Client,
    only: Option<&str>,
) -> Result<(Vec<Check>, Vec<Target>), CliError> {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let configs = match api.list(&ListParams::default()).await {
        Ok(l) => l.items,
        Err(e) => return Ok((vec![cannot("MutatingWebhookConfigurations", &e)], vec![])),
    };
    let configs: Vec<_> = configs
        .into_iter()
        .filter(|c| only.is_none_or(|n| c.metadata.name.as_deref() == Some(n)))
        .collect();
    Ok(checks::webhooks(&configs))
}

/// The operator behind one webhook Service: endpoints, pods (by the
/// Service's selector), Deployments (`app.kubernetes.io/part-of=memprof`),
/// the serving certificate (Secret `<service>-tls`, as the chart names it).
async fn target(client: &Client, t: &Target) -> Vec<Check> {
    let Some((ns, svc)) = &t.service else {
        return vec![];
    };
    let mut out = Vec::new();
    let svc_obj = match Api::<Service>::namespaced(client.clone(), ns)
        .get_opt(svc)
        .await
    {
        Ok(s) => s,
        Err(e) => return vec![cannot(&format!("Service {ns}/{svc}"), &e)],
    };
    let ep = Api::<Endpoints>::namespaced(client.clone(), ns)
        .get_opt(svc)
        .await
        .ok()
        .flatten();
    out.push(checks::endpoints(ns, svc, ep.as_ref()));
    let selector = svc_obj.and_then(|s| s.spec?.selector).map(|m| {
        m.iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    });
    if let Some(sel) = selector.filter(|s| !s.is_empty()) {
        match Api::<Pod>::namespaced(client.clone(), ns)
            .list(&ListParams::default().labels(&sel))
            .await
        {
            Ok(l) => out.extend(checks::pods(ns, &l.items)),
            Err(e) => out.push(cannot(&format!("pods in {ns}"), &e)),
        }
    }
    let part_of = ListParams::default().labels("app.kubernetes.io/part-of=memprof");
    if let Ok(l) = Api::<Deployment>::namespaced(client.clone(), ns)
        .list(&part_of)
        .await
    {
        out.extend(checks::deployments(ns, &l.items));
    }
    let secret = format!("{svc}-tls");
    let now = jiff::Timestamp::now().as_second() as u64;
    match Api::<Secret>::namespaced(client.clone(), ns).get_opt(&secret).await {
        Ok(Some(s)) => {
            let crt = s.data.as_ref().and_then(|d| d.get("tls.crt")).map(|b| b.0.clone());
            out.push(cert::check(ns, svc, &secret, crt.as_deref(), &t.ca_bundle, now));
        }
        Ok(None) => out.push(Check::fail(
            format!("serving certificate: no Secret {ns}/{secret}"),
            "certMode self: the operator creates it at start (see its pods); certMode certManager: kubectl describe certificate",
        )),
        Err(e) => out.push(cannot(&format!("Secret {ns}/{secret}"), &e)),
    }
    out
}

async fn jobs(
    client: &Client,
    scope: &Scope,
    selector: Option<&str>,
) -> Result<Vec<Check>, CliError> {
    let lp = selector.map_or_else(ListParams::default, |s| ListParams::default().labels(s));
    match scope.api::<Job>(client).list(&lp).await {
        Ok(l) => Ok(checks::jobs(&l.items)),
        Err(kube::Error::Api(s)) if s.code == 403 => Ok(vec![Check::warn(
            format!("cannot list Jobs in {}: {}", scope.describe(), s.message),
            "pass -n NAMESPACE for a namespace you may read",
        )]),
        Err(e) => Err(map_error(e, "list", "jobs", scope)),
    }
}
