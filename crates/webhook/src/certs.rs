//! TLS material for the webhook.
//!
//! Self mode (the default): a self-signed CA and a serving certificate for the
//! Service's DNS names, kept in a Secret so that every replica serves the same
//! certificate, renewed when less than [`CertConfig::renew_before`] is left,
//! and the CA written into the `MutatingWebhookConfiguration`'s `caBundle`.
//! Each renewal makes a new CA; the previous CA stays in the bundle while it
//! is valid, so a replica still serving the old certificate keeps working
//! until it reloads. No CA key is stored anywhere.
//!
//! Files mode: cert-manager (or anything else) writes `tls.crt`/`tls.key`
//! into a mounted Secret and its CA injector fills `caBundle`; the operator
//! only reads the files ([`load_files`]).
//!
//! Replicas race on startup and on renewal; the Secret's create (409
//! AlreadyExists) and replace-with-resourceVersion (409 Conflict) decide the
//! winner, and the loser adopts what the winner wrote.

use base64::Engine as _;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use std::collections::BTreeMap;
use std::path::Path;

/// Secret annotation: when the serving certificate expires (RFC 3339).
pub const ANNOTATION_NOT_AFTER: &str = "memprof.dev/cert-not-after";
/// Secret annotation: the names the certificate was issued for, comma-separated.
pub const ANNOTATION_NAMES: &str = "memprof.dev/cert-names";
/// Secret annotation: when the previous CA (still in `ca.crt`) expires.
pub const ANNOTATION_PREVIOUS_CA_NOT_AFTER: &str = "memprof.dev/previous-ca-not-after";
const PREVIOUS_CA_KEY: &str = "ca-previous.crt";

/// Errors of the certificate step.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// rcgen could not build a certificate.
    #[error("cannot generate the webhook certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// Reading or writing the Secret failed.
    #[error(
        "cannot {verb} Secret {namespace}/{name}: {source}; the operator needs get/create/update \
         on secrets in its own namespace (see the Helm chart's Role)"
    )]
    Secret {
        /// What was attempted.
        verb: &'static str,
        /// Namespace of the Secret.
        namespace: String,
        /// Name of the Secret.
        name: String,
        /// The API error.
        source: Box<kube::Error>,
    },
    /// The webhook configuration to patch does not exist or cannot be patched.
    #[error(
        "cannot {verb} MutatingWebhookConfiguration {name}: {source}; install the Helm chart \
         or pass the right --webhook-config-name"
    )]
    WebhookConfig {
        /// What was attempted.
        verb: &'static str,
        /// Its name.
        name: String,
        /// The API error.
        source: Box<kube::Error>,
    },
    /// A file of the cert dir (files mode) is missing or unreadable.
    #[error(
        "cannot read {path}: {source}; in files mode mount a Secret with tls.crt and tls.key \
         (cert-manager's) at --webhook-cert-dir"
    )]
    File {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Another replica kept winning the race for the Secret.
    #[error(
        "Secret {0} keeps changing under the operator; is another memprof release writing it?"
    )]
    Contended(String),
}

/// Where the serving certificate lives and what it must be valid for.
#[derive(Clone, Debug, PartialEq)]
pub struct CertConfig {
    /// Namespace of the Secret and the Service (the operator's).
    pub namespace: String,
    /// Name of the Secret.
    pub secret_name: String,
    /// Name of the Service in front of the webhook.
    pub service_name: String,
    /// More SANs (`127.0.0.1`, `localhost`) for webhooks registered by URL.
    pub extra_names: Vec<String>,
    /// The `MutatingWebhookConfiguration` whose `caBundle` is kept in sync.
    pub webhook_config_name: Option<String>,
    /// Lifetime of a new serving certificate.
    pub validity: SignedDuration,
    /// Renew when less than this is left.
    pub renew_before: SignedDuration,
}

impl Default for CertConfig {
    fn default() -> Self {
        CertConfig {
            namespace: "memprof-system".into(),
            secret_name: "memprof-webhook-tls".into(),
            service_name: "memprof-webhook".into(),
            extra_names: vec![],
            webhook_config_name: Some("memprof".into()),
            validity: SignedDuration::from_hours(24 * 365),
            renew_before: SignedDuration::from_hours(24 * 30),
        }
    }
}

impl CertConfig {
    /// The names the certificate is issued for: the Service's DNS names, then
    /// the extra names.
    pub fn names(&self) -> Vec<String> {
        let (svc, ns) = (&self.service_name, &self.namespace);
        let mut names = vec![
            format!("{svc}.{ns}.svc"),
            format!("{svc}.{ns}.svc.cluster.local"),
        ];
        names.extend(self.extra_names.iter().cloned());
        names
    }
}

/// A serving certificate, its key and the CA bundle clients should trust.
#[derive(Clone, Debug, PartialEq)]
pub struct CertBundle {
    /// Serving certificate, PEM.
    pub cert_pem: String,
    /// Its private key, PEM (PKCS#8).
    pub key_pem: String,
    /// CA certificate(s) to trust, PEM: what goes into `caBundle`.
    pub ca_pem: String,
    /// When the serving certificate expires.
    pub not_after: Timestamp,
}

/// `ts` as rcgen's certificate time.
fn cert_time(ts: Timestamp) -> time::OffsetDateTime {
    time::OffsetDateTime::from_unix_timestamp(ts.as_second())
        .expect("a jiff timestamp is within time's range")
}

/// A new CA and a serving certificate for `names`, valid from a day before
/// `now` (clock skew between nodes) for `validity`.
pub fn generate(
    names: &[String],
    now: Timestamp,
    validity: SignedDuration,
) -> Result<CertBundle, CertError> {
    // Whole seconds: what the certificate can hold, and what the Secret records.
    let now = Timestamp::from_second(now.as_second()).expect("in range");
    let not_before = cert_time(now - SignedDuration::from_hours(24));
    let not_after_ts = now + validity;
    let not_after = cert_time(not_after_ts);

    let mut ca = CertificateParams::default();
    ca.distinguished_name = rcgen::DistinguishedName::new();
    ca.distinguished_name.push(
        DnType::CommonName,
        format!("memprof-webhook-ca-{}", now.as_second()),
    );
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    ca.not_before = not_before;
    // The CA outlives the leaf by a day so the leaf never outlives its issuer.
    ca.not_after = cert_time(now + validity + SignedDuration::from_hours(24));
    let ca_key = KeyPair::generate()?;
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, ca_key);

    let mut leaf = CertificateParams::new(names.to_vec())?;
    leaf.distinguished_name = rcgen::DistinguishedName::new();
    leaf.distinguished_name.push(
        DnType::CommonName,
        names
            .first()
            .cloned()
            .unwrap_or_else(|| "memprof-webhook".into()),
    );
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.use_authority_key_identifier_extension = true;
    leaf.not_before = not_before;
    leaf.not_after = not_after;
    let leaf_key = KeyPair::generate()?;
    let leaf_cert = leaf.signed_by(&leaf_key, &issuer)?;

    Ok(CertBundle {
        cert_pem: leaf_cert.pem(),
        key_pem: leaf_key.serialize_pem(),
        ca_pem: ca_cert.pem(),
        not_after: not_after_ts,
    })
}

fn data_str(secret: &Secret, key: &str) -> Option<String> {
    let bytes = secret.data.as_ref()?.get(key)?;
    String::from_utf8(bytes.0.clone()).ok()
}

fn annotation<'a>(secret: &'a Secret, key: &str) -> Option<&'a str> {
    secret
        .metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// The bundle a Secret holds, if it is complete. `ca_pem` is the whole trust
/// bundle (current and, while valid, previous CA).
pub fn bundle_from_secret(secret: &Secret) -> Option<CertBundle> {
    Some(CertBundle {
        cert_pem: data_str(secret, "tls.crt")?,
        key_pem: data_str(secret, "tls.key")?,
        ca_pem: data_str(secret, "ca.crt")?,
        not_after: annotation(secret, ANNOTATION_NOT_AFTER)?.parse().ok()?,
    })
}

/// Whether the Secret's certificate must be replaced: missing or unreadable,
/// issued for other names, or expiring within `renew_before`.
pub fn needs_renewal(secret: &Secret, names: &[String], now: Timestamp, cfg: &CertConfig) -> bool {
    let Some(bundle) = bundle_from_secret(secret) else {
        return true;
    };
    let issued_for = annotation(secret, ANNOTATION_NAMES).unwrap_or_default();
    issued_for != names.join(",") || bundle.not_after - cfg.renew_before <= now
}

/// The Secret holding `bundle`. `previous_ca` (PEM, expiry) is kept in the
/// trust bundle until it expires.
pub fn secret_for(
    cfg: &CertConfig,
    names: &[String],
    bundle: &CertBundle,
    previous_ca: Option<(&str, Timestamp)>,
) -> Secret {
    let mut ca = bundle.ca_pem.clone();
    let mut annotations = BTreeMap::from([
        (
            ANNOTATION_NOT_AFTER.to_string(),
            bundle.not_after.to_string(),
        ),
        (ANNOTATION_NAMES.to_string(), names.join(",")),
    ]);
    let mut data = BTreeMap::new();
    if let Some((prev, until)) = previous_ca {
        ca.push_str(prev);
        annotations.insert(ANNOTATION_PREVIOUS_CA_NOT_AFTER.into(), until.to_string());
        data.insert(
            PREVIOUS_CA_KEY.to_string(),
            ByteString(prev.as_bytes().to_vec()),
        );
    }
    data.insert(
        "tls.crt".into(),
        ByteString(bundle.cert_pem.as_bytes().to_vec()),
    );
    data.insert(
        "tls.key".into(),
        ByteString(bundle.key_pem.as_bytes().to_vec()),
    );
    data.insert("ca.crt".into(), ByteString(ca.into_bytes()));
    Secret {
        metadata: ObjectMeta {
            name: Some(cfg.secret_name.clone()),
            namespace: Some(cfg.namespace.clone()),
            annotations: Some(annotations),
            labels: Some(BTreeMap::from([
                ("app.kubernetes.io/name".into(), "memprof".into()),
                ("app.kubernetes.io/component".into(), "webhook".into()),
            ])),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(data),
        ..Default::default()
    }
}

/// The CA of the Secret being replaced, when it outlives the replacement's
/// rollout (it stays trusted so replicas that have not reloaded keep working).
fn previous_ca(old: &Secret, now: Timestamp) -> Option<(String, Timestamp)> {
    let bundle = bundle_from_secret(old)?;
    // The current CA is the first PEM block of ca.crt (see secret_for).
    let end = "-----END CERTIFICATE-----";
    let first = bundle
        .ca_pem
        .find(end)
        .map(|i| &bundle.ca_pem[..i + end.len()])?;
    let until = bundle.not_after + SignedDuration::from_hours(24);
    (until > now).then(|| (format!("{}\n", first.trim()), until))
}

/// Returns the serving certificate from the Secret, creating or renewing it
/// first when needed. Safe to call from every replica at once.
pub async fn ensure_serving_cert(
    client: &Client,
    cfg: &CertConfig,
) -> Result<CertBundle, CertError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), &cfg.namespace);
    let names = cfg.names();
    for _attempt in 0..5 {
        let now = Timestamp::now();
        let existing = api
            .get_opt(&cfg.secret_name)
            .await
            .map_err(secret_error(cfg, "read"))?;
        let written = match existing {
            Some(s) if !needs_renewal(&s, &names, now, cfg) => {
                return Ok(bundle_from_secret(&s).expect("checked by needs_renewal"));
            }
            Some(old) => renew(&api, cfg, (&names, now), &old).await?,
            None => create(&api, cfg, (&names, now)).await?,
        };
        // None: another replica wrote first; adopt its certificate.
        if let Some(bundle) = written {
            return Ok(bundle);
        }
    }
    Err(CertError::Contended(cfg.secret_name.clone()))
}

/// What a failed `verb` on the Secret is reported as.
fn secret_error(cfg: &CertConfig, verb: &'static str) -> impl FnOnce(kube::Error) -> CertError {
    let (ns, name) = (cfg.namespace.clone(), cfg.secret_name.clone());
    move |source| CertError::Secret {
        verb,
        namespace: ns,
        name,
        source: Box::new(source),
    }
}

/// Replaces `old` with a new certificate for `names` (keeping its CA
/// trusted while it may still be served); None when another replica
/// changed the Secret first (409).
async fn renew(
    api: &Api<Secret>,
    cfg: &CertConfig,
    (names, now): (&[String], Timestamp),
    old: &Secret,
) -> Result<Option<CertBundle>, CertError> {
    let bundle = generate(names, now, cfg.validity)?;
    let prev = previous_ca(old, now);
    let mut secret = secret_for(
        cfg,
        names,
        &bundle,
        prev.as_ref().map(|(p, t)| (p.as_str(), *t)),
    );
    secret.metadata.resource_version = old.metadata.resource_version.clone();
    match api
        .replace(&cfg.secret_name, &PostParams::default(), &secret)
        .await
    {
        Ok(s) => {
            tracing::info!(secret = %cfg.secret_name, not_after = %bundle.not_after, "renewed webhook serving certificate");
            Ok(Some(bundle_from_secret(&s).unwrap_or(bundle)))
        }
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(None),
        Err(e) => Err(secret_error(cfg, "update")(e)),
    }
}

/// Creates the Secret with a new certificate for `names`; None when another
/// replica created it first (409).
async fn create(
    api: &Api<Secret>,
    cfg: &CertConfig,
    (names, now): (&[String], Timestamp),
) -> Result<Option<CertBundle>, CertError> {
    let bundle = generate(names, now, cfg.validity)?;
    let secret = secret_for(cfg, names, &bundle, None);
    match api.create(&PostParams::default(), &secret).await {
        Ok(_) => {
            tracing::info!(secret = %cfg.secret_name, not_after = %bundle.not_after, "created webhook serving certificate");
            Ok(Some(bundle))
        }
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(None),
        Err(e) => Err(secret_error(cfg, "create")(e)),
    }
}

/// The error of `verb` on the MutatingWebhookConfiguration `name`.
pub(crate) fn webhook_config_error<'a>(
    verb: &'static str,
    name: &'a str,
) -> impl Fn(kube::Error) -> CertError + 'a {
    move |source| CertError::WebhookConfig {
        verb,
        name: name.into(),
        source: Box::new(source),
    }
}

/// Sets `caBundle` on every webhook of the `MutatingWebhookConfiguration`
/// `name` that does not have it yet. Returns whether anything changed.
/// Strategic merge by webhook name touches nothing else, so Helm keeps
/// owning the rest of the object.
pub async fn patch_ca_bundle(client: &Client, name: &str, ca_pem: &str) -> Result<bool, CertError> {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let err = |verb| webhook_config_error(verb, name);
    let mwc = api.get(name).await.map_err(err("read"))?;
    let want = ca_pem.as_bytes();
    let stale: Vec<&str> = mwc
        .webhooks
        .iter()
        .flatten()
        .filter(|w| w.client_config.ca_bundle.as_ref().map(|b| b.0.as_slice()) != Some(want))
        .map(|w| w.name.as_str())
        .collect();
    if stale.is_empty() {
        return Ok(false);
    }
    let b64 = base64::engine::general_purpose::STANDARD.encode(want);
    let patch = serde_json::json!({
        "webhooks": stale
            .iter()
            .map(|n| serde_json::json!({ "name": n, "clientConfig": { "caBundle": b64 } }))
            .collect::<Vec<_>>()
    });
    api.patch(name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .map_err(err("patch"))?;
    tracing::info!(
        webhook_config = name,
        webhooks = stale.len(),
        "patched caBundle"
    );
    Ok(true)
}

/// Reads `tls.crt` and `tls.key` from `dir` (files mode); returns (cert, key) PEM.
pub fn load_files(dir: &Path) -> Result<(Vec<u8>, Vec<u8>), CertError> {
    let read = |f: &str| {
        let path = dir.join(f);
        std::fs::read(&path).map_err(|source| CertError::File {
            path: path.display().to_string(),
            source,
        })
    };
    Ok((read("tls.crt")?, read("tls.key")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> CertConfig {
        CertConfig {
            namespace: "memprof".into(),
            extra_names: vec!["127.0.0.1".into(), "localhost".into()],
            ..Default::default()
        }
    }

    #[test]
    fn names_cover_the_service_and_extras() {
        assert_eq!(
            cfg().names(),
            [
                "memprof-webhook.memprof.svc",
                "memprof-webhook.memprof.svc.cluster.local",
                "127.0.0.1",
                "localhost"
            ]
        );
    }

    #[test]
    fn generated_bundle_serves_and_round_trips_through_the_secret() {
        let now = Timestamp::now();
        let names = cfg().names();
        let b = generate(&names, now, cfg().validity).unwrap();
        assert!(b.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(b.ca_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(b.not_after > now + SignedDuration::from_hours(24 * 364));
        // rustls accepts the pair.
        crate::TlsCert::from_pem(b.cert_pem.as_bytes(), b.key_pem.as_bytes()).unwrap();

        let s = secret_for(&cfg(), &names, &b, None);
        assert_eq!(bundle_from_secret(&s), Some(b.clone()));
        assert!(!needs_renewal(&s, &names, now, &cfg()));
        // Other names, or close to expiry: renew.
        assert!(needs_renewal(&s, &names[..2], now, &cfg()));
        assert!(needs_renewal(
            &s,
            &names,
            b.not_after - SignedDuration::from_hours(24),
            &cfg()
        ));
        assert!(needs_renewal(&Secret::default(), &names, now, &cfg()));
    }

    #[test]
    fn renewal_keeps_the_previous_ca_trusted() {
        let now = Timestamp::now();
        let names = cfg().names();
        let old = secret_for(
            &cfg(),
            &names,
            &generate(&names, now, cfg().validity).unwrap(),
            None,
        );
        let later = now + SignedDuration::from_hours(24 * 340);
        let (prev, until) = previous_ca(&old, later).expect("old CA still valid");
        let new = generate(&names, later, cfg().validity).unwrap();
        let s = secret_for(&cfg(), &names, &new, Some((&prev, until)));
        let ca = data_str(&s, "ca.crt").unwrap();
        assert_eq!(ca.matches("BEGIN CERTIFICATE").count(), 2);
        assert!(ca.starts_with(&new.ca_pem));
        // Once the old CA has expired it is dropped on the next renewal.
        assert!(previous_ca(&old, now + SignedDuration::from_hours(24 * 400)).is_none());
    }
}
