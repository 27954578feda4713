//! HTTPS server for `POST /mutate` (and `GET /healthz`).
//!
//! hyper-util serves HTTP/1.1 and HTTP/2 over tokio-rustls connections
//! accepted here. The certificate sits behind a resolver that
//! [`TlsCert::reload`] swaps, so a rotated Secret (self mode) or a renewed
//! cert-manager file takes effect without a restart or a dropped connection.
//!
//! Any pod that can reach the port is a client, so everything a client can
//! make the server hold is capped ([`ServerLimits`]): connections, HTTP/2
//! streams, header and body bytes (the body as it arrives), and every wait
//! has a deadline. See docs/security.md, "Webhook exhaustion".

use super::config::InjectionConfig;
use super::history::History;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio_rustls::TlsAcceptor;

mod conn;
mod handler;
mod limits;
#[cfg(test)]
mod tests;

pub use limits::{CloseLabels, RejectLabels, ServerLimits, ServerMetrics, TLS_BUFFER_ESTIMATE};

/// How often a full server says so in the log (the metric counts every one).
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);

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
    /// The server's limits cannot serve.
    #[error("invalid webhook server limits: {0}")]
    Limits(&'static str),
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

/// Serves the webhook on `listener` with the default [`ServerLimits`] until
/// `shutdown` completes, then lets the open connections finish. Bind
/// `127.0.0.1:0` in tests.
pub async fn serve(
    listener: TcpListener,
    tls: TlsCert,
    config: Arc<InjectionConfig>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServerError> {
    let (limits, metrics) = (ServerLimits::default(), ServerMetrics::unregistered());
    serve_with(listener, tls, config, limits, metrics, shutdown).await
}

/// [`serve`], warning (or, where a policy opts in, refusing) at admission
/// of a Job whose family's measured history predicts it will not fit its
/// GPU (history.rs).
pub async fn serve_with_history(
    listener: TcpListener,
    tls: TlsCert,
    config: Arc<InjectionConfig>,
    history: Arc<History>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServerError> {
    let (limits, metrics) = (ServerLimits::default(), ServerMetrics::unregistered());
    serve_all(
        listener,
        tls,
        config,
        (limits, metrics),
        Some(history),
        shutdown,
    )
    .await
}

/// [`serve`] with explicit limits, counting what they refuse in `metrics`.
pub async fn serve_with(
    listener: TcpListener,
    tls: TlsCert,
    config: Arc<InjectionConfig>,
    limits: ServerLimits,
    metrics: Arc<ServerMetrics>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServerError> {
    serve_all(listener, tls, config, (limits, metrics), None, shutdown).await
}

/// The server: its limits and metrics, and the history when it reads one.
pub(crate) async fn serve_all(
    listener: TcpListener,
    tls: TlsCert,
    config: Arc<InjectionConfig>,
    (limits, metrics): (ServerLimits, Arc<ServerMetrics>),
    history: Option<Arc<History>>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServerError> {
    limits.validate()?;
    let acceptor = TlsAcceptor::from(tls.server_config()?);
    let max_connections = limits.max_connections;
    let shared = Arc::new(handler::Shared::new(config, limits, metrics, history));
    // One permit per open connection: what is left is what may still connect.
    let slots = Arc::new(Semaphore::new(max_connections));
    let (stop, stopped) = watch::channel(false);
    let mut refusals = Refusals::default();
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, max_connections, "admission webhook listening (HTTPS)");
    }
    let mut shutdown = std::pin::pin!(shutdown);
    while let Some((tcp, peer)) = next_connection(&listener, &mut shutdown).await {
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            // Closed before the handshake: a full server spends nothing on it.
            drop(tcp);
            refusals.refuse(peer, &shared.metrics, max_connections);
            continue;
        };
        // Responses are small and latency-bound: do not let Nagle hold back
        // the last segment until the client's delayed ACK (~40 ms).
        let _ = tcp.set_nodelay(true);
        tokio::spawn(conn::serve_connection(
            tcp,
            peer,
            acceptor.clone(),
            shared.clone(),
            slot,
            stopped.clone(),
        ));
    }
    drop(listener);
    let _ = stop.send(true);
    // Every connection holds its slot until it has ended: all slots back
    // means all connections ended. Bounded: the API server's webhook
    // timeout is at most 30 s.
    let all = slots.acquire_many(max_connections as u32);
    let _ = tokio::time::timeout(shared.limits.shutdown_grace, all).await;
    tracing::info!("admission webhook stopped");
    Ok(())
}

/// The next connection, or None once `shutdown` completes.
async fn next_connection(
    listener: &TcpListener,
    shutdown: &mut (impl Future<Output = ()> + Unpin),
) -> Option<(TcpStream, SocketAddr)> {
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => return Some(conn),
                Err(e) => {
                    // Out of file descriptors and the like: back off, keep serving.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            () = &mut *shutdown => return None,
        }
    }
}

/// Connections refused at the cap: counted each, logged at most every
/// [`REFUSAL_LOG_EVERY`] so a flood does not flood the log too.
#[derive(Default)]
struct Refusals {
    total: u64,
    logged: Option<tokio::time::Instant>,
}

impl Refusals {
    fn refuse(&mut self, peer: SocketAddr, metrics: &ServerMetrics, max: usize) {
        metrics.connections_rejected.inc();
        self.total += 1;
        if self
            .logged
            .is_some_and(|at| at.elapsed() < REFUSAL_LOG_EVERY)
        {
            return;
        }
        self.logged = Some(tokio::time::Instant::now());
        tracing::warn!(
            %peer,
            refused_total = self.total,
            "admission webhook has {max} connections open; closing new ones at once \
             (a client holding connections? see the chart's networkPolicy)"
        );
    }
}
