//! HTTPS server for `POST /mutate` (and `GET /healthz`).
//!
//! warp 0.4 dropped its TLS support, so the routes are a warp filter turned
//! into a tower service ([`warp::service`]) and served by hyper-util over
//! tokio-rustls connections accepted here. The certificate sits behind a
//! resolver that [`TlsCert::reload`] swaps, so a rotated Secret (self mode)
//! or a renewed cert-manager file takes effect without a restart or a dropped
//! connection.

use super::config::InjectionConfig;
use super::mutate::admit_review;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use std::future::Future;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use warp::Filter;

/// Largest AdmissionReview accepted: an object is at most 1.5 MiB in etcd,
/// and a review may carry it twice (object and oldObject).
const MAX_BODY: u64 = 4 * 1024 * 1024;
/// A client that has not finished the TLS handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Errors of the webhook server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The certificate PEM holds no certificate.
    #[error("no certificate in the serving certificate PEM; check tls.crt in the webhook Secret or cert dir")]
    NoCertificate,
    /// A PEM block could not be parsed.
    #[error("cannot parse the serving {what} PEM: {source}; check the webhook Secret or cert dir")]
    Pem {
        /// `certificate` or `key`.
        what: &'static str,
        /// The parser's complaint.
        source: rustls::pki_types::pem::Error,
    },
    /// rustls refused the key.
    #[error("unusable TLS key or configuration: {0}; regenerate the serving certificate")]
    Tls(#[from] rustls::Error),
}

/// A serving certificate and key that can be replaced while serving.
#[derive(Clone, Debug)]
pub struct TlsCert {
    current: Arc<RwLock<Arc<CertifiedKey>>>,
}

#[derive(Debug)]
struct Resolver(TlsCert);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.current())
    }
}

fn certified_key(cert_pem: &[u8], key_pem: &[u8]) -> Result<CertifiedKey, ServerError> {
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| ServerError::Pem {
            what: "certificate",
            source,
        })?;
    if chain.is_empty() {
        return Err(ServerError::NoCertificate);
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|source| ServerError::Pem {
        what: "key",
        source,
    })?;
    let key = rustls::crypto::ring::sign::any_supported_type(&key)?;
    Ok(CertifiedKey::new(chain, key))
}

impl TlsCert {
    /// A certificate chain (leaf first) and its private key, both PEM.
    pub fn from_pem(cert_pem: &[u8], key_pem: &[u8]) -> Result<Self, ServerError> {
        Ok(TlsCert {
            current: Arc::new(RwLock::new(Arc::new(certified_key(cert_pem, key_pem)?))),
        })
    }

    /// Serves a new certificate from the next handshake on.
    pub fn reload(&self, cert_pem: &[u8], key_pem: &[u8]) -> Result<(), ServerError> {
        let new = Arc::new(certified_key(cert_pem, key_pem)?);
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = new;
        Ok(())
    }

    fn current(&self) -> Arc<CertifiedKey> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The rustls configuration (ring provider, like the kube client).
    pub fn server_config(&self) -> Result<Arc<ServerConfig>, ServerError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(Resolver(self.clone())));
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// The routes, as a warp filter (also usable with `warp::test`).
pub fn routes(
    config: Arc<InjectionConfig>,
) -> impl Filter<Extract = (impl warp::Reply,), Error = warp::Rejection> + Clone + Send + Sync + 'static
{
    let mutate = warp::post()
        .and(warp::path("mutate"))
        .and(warp::path::end())
        .and(warp::body::content_length_limit(MAX_BODY))
        .and(warp::body::bytes())
        .map(move |body: bytes::Bytes| {
            let json = serde_json::to_vec(&admit_review(&body, &config))
                .expect("a JSON value always serialises");
            warp::reply::with_header(json, "content-type", "application/json")
        });
    let health = warp::get()
        .and(warp::path("healthz"))
        .and(warp::path::end())
        .map(|| "ok");
    mutate.or(health)
}

/// Serves the webhook on `listener` until `shutdown` completes, then lets the
/// open connections finish. Bind `127.0.0.1:0` in tests.
pub async fn serve(
    listener: TcpListener,
    tls: TlsCert,
    config: Arc<InjectionConfig>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServerError> {
    let acceptor = TlsAcceptor::from(tls.server_config()?);
    let service = warp::service(routes(config));
    let graceful = GracefulShutdown::new();
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "admission webhook listening (HTTPS)");
    }
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    // Out of file descriptors and the like: back off, keep serving.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Responses are small and latency-bound: do not let Nagle hold back
        // the last segment until the client's delayed ACK (~40 ms).
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let service = service.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let builder = auto::Builder::new(TokioExecutor::new());
            let conn =
                builder.serve_connection(TokioIo::new(tls), TowerToHyperService::new(service));
            if let Err(e) = watcher.watch(conn).await {
                tracing::debug!(%peer, error = %e, "webhook connection ended with an error");
            }
        });
    }
    drop(listener);
    // Bounded: the API server's webhook timeout is at most 30 s.
    let _ = tokio::time::timeout(Duration::from_secs(30), graceful.shutdown()).await;
    tracing::info!("admission webhook stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::webhook::certs;
    use http_body_util::{BodyExt, Full};
    use hyper::body::Bytes;
    use std::net::SocketAddr;

    /// A one-connection HTTPS client trusting only `ca_pem`.
    async fn request(
        addr: SocketAddr,
        ca_pem: &str,
        req: hyper::Request<Full<Bytes>>,
    ) -> Result<(u16, Vec<u8>), Box<dyn std::error::Error>> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            roots.add(cert?)?;
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1")?;
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await?;
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
        tokio::spawn(conn);
        let resp = send.send_request(req).await?;
        let status = resp.status().as_u16();
        Ok((
            status,
            resp.into_body().collect().await?.to_bytes().to_vec(),
        ))
    }

    fn names() -> Vec<String> {
        vec!["127.0.0.1".into(), "localhost".into()]
    }

    #[tokio::test]
    async fn serves_admission_over_tls_and_reloads_the_certificate() {
        let now = jiff::Timestamp::now();
        let validity = jiff::SignedDuration::from_hours(24);
        let first = certs::generate(&names(), now, validity).unwrap();
        let tls = TlsCert::from_pem(first.cert_pem.as_bytes(), first.key_pem.as_bytes()).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(
            listener,
            tls.clone(),
            Arc::new(InjectionConfig::default()),
            async {
                let _ = stopped.await;
            },
        ));

        let health = hyper::Request::get("/healthz")
            .header("host", "127.0.0.1")
            .body(Full::default())
            .unwrap();
        let (status, body) = request(addr, &first.ca_pem, health).await.unwrap();
        assert_eq!((status, body.as_slice()), (200, &b"ok"[..]));

        let review = serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "u-1", "operation": "CREATE", "name": "p", "namespace": "ml",
                "kind": { "group": "", "version": "v1", "kind": "Pod" },
                "resource": { "group": "", "version": "v1", "resource": "pods" },
                "userInfo": {},
                "object": { "apiVersion": "v1", "kind": "Pod",
                    "metadata": { "name": "p", "labels": { "memprof.dev/inject": "true" } },
                    "spec": { "containers": [{ "name": "c", "image": "x" }] } }
            }
        });
        let post = |ca: String| {
            let req = hyper::Request::post("/mutate")
                .header("host", "127.0.0.1")
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(review.to_string())))
                .unwrap();
            async move { request(addr, &ca, req).await }
        };
        let (status, body) = post(first.ca_pem.clone()).await.unwrap();
        assert_eq!(status, 200);
        let out: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(out["response"]["uid"], "u-1");
        assert_eq!(out["response"]["allowed"], true);
        assert!(out["response"]["patch"].is_string(), "{out}");

        // A new certificate from another CA is served from the next handshake.
        let second = certs::generate(&names(), now, validity).unwrap();
        tls.reload(second.cert_pem.as_bytes(), second.key_pem.as_bytes())
            .unwrap();
        assert!(post(first.ca_pem.clone()).await.is_err());
        assert_eq!(post(second.ca_pem.clone()).await.unwrap().0, 200);

        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("serve returns after shutdown")
            .unwrap()
            .unwrap();
    }
}
