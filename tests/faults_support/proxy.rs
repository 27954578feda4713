//! A TCP proxy on loopback in front of an API server, whose link a fault
//! test switches between up, a black hole (requests hang) and refused.

use super::{kubeconfig_with, TempFile};
use serde_json::Value;
use std::net::SocketAddr;
use std::path::Path;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::watch;

/// What a TCP link to the API server does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Link {
    /// Bytes flow.
    Up,
    /// Connections are accepted and kept, bytes are held (a partition:
    /// requests hang); they flow again when the link is back up.
    Blackhole,
    /// Connections are closed at once and new ones closed on accept.
    Refuse,
}

/// A TCP proxy on loopback in front of `upstream`, whose link a test switches.
pub struct Proxy {
    pub port: u16,
    link: watch::Sender<Link>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (link, rx) = watch::channel(Link::Up);
        let task = tokio::spawn(async move {
            // Dropped with the accept loop: aborting it closes every connection.
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                if *rx.borrow() == Link::Refuse {
                    continue;
                }
                conns.spawn(pipe(client, upstream, rx.clone()));
            }
        });
        Proxy { port, link, task }
    }

    pub fn set(&self, link: Link) {
        self.link.send_replace(link);
    }

    /// A kubeconfig like `base` whose server is this proxy.
    pub fn kubeconfig(&self, base: &Path) -> TempFile {
        let port = self.port;
        kubeconfig_with(base, |cfg| {
            for c in cfg["clusters"].as_array_mut().unwrap() {
                c["cluster"]["server"] = Value::from(format!("https://127.0.0.1:{port}"));
            }
        })
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn pipe(client: tokio::net::TcpStream, upstream: SocketAddr, link: watch::Receiver<Link>) {
    let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
        return;
    };
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    // Either direction ending ends both.
    tokio::select! {
        () = gated_copy(cr, sw, link.clone()) => {}
        () = gated_copy(sr, cw, link) => {}
    }
}

/// Waits while the link is a black hole; `false` when it refuses (or the proxy is gone).
async fn link_up(link: &mut watch::Receiver<Link>) -> bool {
    loop {
        match *link.borrow_and_update() {
            Link::Up => return true,
            Link::Refuse => return false,
            Link::Blackhole => {}
        }
        if link.changed().await.is_err() {
            return false;
        }
    }
}

async fn gated_copy(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut link: watch::Receiver<Link>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if !link_up(&mut link).await {
            return;
        }
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            // Re-check the link (reading from a TcpStream is cancel-safe).
            _ = link.changed() => continue,
        };
        // Read while up, held while a black hole, delivered when up again.
        if !link_up(&mut link).await || to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
