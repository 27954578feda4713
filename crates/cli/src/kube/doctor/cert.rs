//! The webhook's serving certificate, checked as the API server will check
//! it: the chain in the Secret's `tls.crt` against the webhook's `caBundle`,
//! for the Service's DNS name, at a given time (rustls' WebPKI verifier).

use super::checks::Check;
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use std::sync::Arc;

/// Why the certificate would be refused (rustls' words where it refused
/// it); the doctor's check line says what to do about any of them.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// The Secret's `tls.crt` does not parse.
    #[error("tls.crt is not PEM: {0}")]
    CertPem(rustls::pki_types::pem::Error),
    /// The Secret's `tls.crt` is empty.
    #[error("tls.crt holds no certificate")]
    NoCert,
    /// The webhook's `caBundle` does not parse.
    #[error("caBundle is not PEM: {0}")]
    CaPem(rustls::pki_types::pem::Error),
    /// A `caBundle` certificate rustls cannot use, or none.
    #[error("caBundle: {0}")]
    Ca(rustls::Error),
    /// The `caBundle` is empty.
    #[error("caBundle holds no certificate")]
    NoCa,
    /// No verifier could be built over the `caBundle`.
    #[error("{0}")]
    Verifier(#[from] rustls::client::VerifierBuilderError),
    /// The Service's name is not a DNS name.
    #[error("{0}")]
    Name(#[from] rustls::pki_types::InvalidDnsNameError),
    /// The API server would refuse the chain.
    #[error("{0}")]
    Refused(#[from] rustls::Error),
}

/// Why the certificate would be refused, in rustls' words, or `Ok`.
pub fn verify(
    cert_pem: &[u8],
    ca_pem: &[u8],
    dns_name: &str,
    now_seconds: u64,
) -> Result<(), CertError> {
    let chain: Vec<CertificateDer> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(CertError::CertPem)?;
    let (leaf, rest) = chain.split_first().ok_or(CertError::NoCert)?;
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(ca_pem) {
        roots
            .add(ca.map_err(CertError::CaPem)?)
            .map_err(CertError::Ca)?;
    }
    if roots.is_empty() {
        return Err(CertError::NoCa);
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier =
        rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()?;
    let name = ServerName::try_from(dns_name.to_string())?;
    let now = UnixTime::since_unix_epoch(std::time::Duration::from_secs(now_seconds));
    verifier.verify_server_cert(leaf, rest, &name, &[], now)?;
    Ok(())
}

/// The check line for the Secret `secret` of Service `ns/svc`.
pub fn check(
    ns: &str,
    svc: &str,
    secret: &str,
    cert_pem: Option<&[u8]>,
    ca_pem: &[u8],
    now: u64,
) -> Check {
    let dns = format!("{svc}.{ns}.svc");
    let Some(cert) = cert_pem else {
        return Check::fail(
            format!("serving certificate: Secret {ns}/{secret} has no tls.crt"),
            "certMode self: the operator writes it at start (see its pods); certMode certManager: kubectl describe certificate",
        );
    };
    match verify(cert, ca_pem, &dns, now) {
        Ok(()) => Check::ok(format!("serving certificate in {ns}/{secret} is valid for {dns} and signed by the caBundle")),
        Err(e) => Check::fail(
            format!("serving certificate in {ns}/{secret} would be refused by the API server: {e}"),
            format!("certMode self: restart the operator (kubectl -n {ns} rollout restart deploy) and it issues a new one; certMode certManager: kubectl -n {ns} describe certificate"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bundle(names: &[&str], hours: i64) -> (String, String) {
        let b = memprof_webhook_certs::generate(names, hours);
        (b.0, b.1)
    }

    mod memprof_webhook_certs {
        //! A CA and a serving certificate, as the operator's certMode self makes them.
        use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};

        pub fn generate(names: &[&str], hours: i64) -> (String, String) {
            let now = time::OffsetDateTime::now_utc();
            let mut ca = CertificateParams::default();
            ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            ca.not_before = now - time::Duration::hours(48);
            ca.not_after = now + time::Duration::hours(24 * 365);
            let ca_key = KeyPair::generate().unwrap();
            let ca_cert = ca.self_signed(&ca_key).unwrap();
            let mut leaf =
                CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                    .unwrap();
            leaf.not_before = now - time::Duration::hours(48);
            leaf.not_after = now + time::Duration::hours(hours);
            let key = KeyPair::generate().unwrap();
            let issuer = Issuer::new(ca, ca_key);
            let cert = leaf.signed_by(&key, &issuer).unwrap();
            (cert.pem(), ca_cert.pem())
        }
    }

    fn now() -> u64 {
        jiff::Timestamp::now().as_second() as u64
    }

    #[test]
    fn a_certificate_for_the_service_signed_by_the_bundle_passes() {
        let (cert, ca) = bundle(&["memprof-webhook.ops.svc"], 24);
        let c = check(
            "ops",
            "memprof-webhook",
            "memprof-webhook-tls",
            Some(cert.as_bytes()),
            ca.as_bytes(),
            now(),
        );
        assert_eq!(c.level, super::super::checks::Level::Ok, "{c:?}");
    }

    #[test]
    fn expired_wrong_name_and_foreign_ca_are_refused_with_rustls_words() {
        let (cert, ca) = bundle(&["memprof-webhook.ops.svc"], -1);
        let e = verify(
            cert.as_bytes(),
            ca.as_bytes(),
            "memprof-webhook.ops.svc",
            now(),
        )
        .unwrap_err();
        assert!(matches!(e, CertError::Refused(_)), "{e}");
        assert!(e.to_string().to_lowercase().contains("expired"), "{e}");
        let (cert, ca) = bundle(&["other.ops.svc"], 24);
        let e = verify(
            cert.as_bytes(),
            ca.as_bytes(),
            "memprof-webhook.ops.svc",
            now(),
        )
        .unwrap_err();
        assert!(
            e.to_string().to_lowercase().contains("not valid for name"),
            "{e}"
        );
        let (cert, _) = bundle(&["memprof-webhook.ops.svc"], 24);
        let (_, other_ca) = bundle(&["x"], 24);
        let e = verify(
            cert.as_bytes(),
            other_ca.as_bytes(),
            "memprof-webhook.ops.svc",
            now(),
        )
        .unwrap_err();
        // Another CA (of the same name, as rcgen's default): its key did not sign it.
        let e = e.to_string().to_lowercase();
        assert!(
            e.contains("unknown issuer") || e.contains("badsignature"),
            "{e}"
        );
        let c = check("ops", "memprof-webhook", "s", None, b"", now());
        assert!(c.what.contains("has no tls.crt"), "{c:?}");
    }
}
