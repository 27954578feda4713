//! The server as every client sees it: its address, the TLS configurations
//! (HTTP/1.1 and HTTP/2) that trust its CA, the end of the attack and what
//! the attackers counted. Shared by the attackers and the legitimate client.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

#[derive(Default)]
pub struct Counts {
    pub connections: AtomicU64,
    pub refused: AtomicU64,
    pub status_413: AtomicU64,
    pub status_408: AtomicU64,
    pub status_200: AtomicU64,
    pub streams: AtomicU64,
}

pub struct Target {
    pub addr: SocketAddr,
    pub tls: Arc<rustls::ClientConfig>,
    pub h2: Arc<rustls::ClientConfig>,
    pub end: Instant,
    pub counts: Counts,
}

pub type Tls = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

impl Target {
    pub fn running(&self) -> bool {
        Instant::now() < self.end
    }

    pub async fn connect(&self, h2: bool) -> Option<Tls> {
        let tcp = tokio::net::TcpStream::connect(self.addr).await.ok()?;
        let _ = tcp.set_nodelay(true);
        let config = if h2 { &self.h2 } else { &self.tls };
        let name = ServerName::try_from("127.0.0.1").unwrap();
        match tokio_rustls::TlsConnector::from(config.clone())
            .connect(name, tcp)
            .await
        {
            Ok(tls) => {
                self.counts.connections.fetch_add(1, Relaxed);
                Some(tls)
            }
            Err(_) => {
                self.counts.refused.fetch_add(1, Relaxed);
                None
            }
        }
    }

    /// Counts a response status the attack is after.
    pub fn saw(&self, status: &[u8]) {
        if status.starts_with(b"HTTP/1.1 413") || status == b"413" {
            self.counts.status_413.fetch_add(1, Relaxed);
        } else if status.starts_with(b"HTTP/1.1 408") || status == b"408" {
            self.counts.status_408.fetch_add(1, Relaxed);
        } else if status == b"200" {
            self.counts.status_200.fetch_add(1, Relaxed);
        }
    }
}

pub fn client_configs(ca_pem: &str) -> (Arc<rustls::ClientConfig>, Arc<rustls::ClientConfig>) {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
        .unwrap();
    let config = |alpn: &[u8]| {
        let mut c = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots.clone())
        .with_no_client_auth();
        c.alpn_protocols = vec![alpn.to_vec()];
        Arc::new(c)
    };
    (config(b"http/1.1"), config(b"h2"))
}
