//! The attackers: slow request heads, silent TCP connections, HTTP/1.1
//! bodies held open, JSON bombs, and HTTP/2 streams held open, each a loop
//! that reconnects until the attack ends.

use crate::target::{Target, Tls};
use crate::Attack;
use bytes::Bytes;
use futures::channel::mpsc;
use futures::SinkExt as _;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// Backs off between reconnects so a refused client does not spin.
async fn pause() {
    tokio::time::sleep(Duration::from_millis(50)).await;
}

/// Reads until the server answers or closes; returns the first bytes.
async fn read_some(tls: &mut Tls, until: Instant) -> Vec<u8> {
    let mut buf = vec![0u8; 64];
    let left = until.saturating_duration_since(Instant::now());
    match tokio::time::timeout(left, tls.read(&mut buf)).await {
        Ok(Ok(n)) => buf[..n].to_vec(),
        _ => Vec::new(),
    }
}

/// TLS, then a request head one byte per second, reconnecting when closed.
async fn slow_head(t: Arc<Target>) {
    while t.running() {
        let Some(mut tls) = t.connect(false).await else {
            pause().await;
            continue;
        };
        let head = b"POST /mutate HTTP/1.1\r\nhost: 127.0.0.1\r\nx-slow: ";
        for byte in head.iter().chain(std::iter::repeat(&b'a')) {
            if !t.running() || tls.write_all(&[*byte]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

/// A TCP connection that never starts TLS.
async fn silent(t: Arc<Target>) {
    while t.running() {
        let Ok(mut tcp) = tokio::net::TcpStream::connect(t.addr).await else {
            pause().await;
            continue;
        };
        let mut buf = [0u8; 1];
        let left = t.end.saturating_duration_since(Instant::now());
        let _ = tokio::time::timeout(left, tcp.read(&mut buf)).await;
        pause().await;
    }
}

/// HTTP/1.1 bodies declared just under the cap, sent but for the last byte.
async fn held_body(t: Arc<Target>, cap: usize, body: Bytes) {
    while t.running() {
        let Some(mut tls) = t.connect(false).await else {
            pause().await;
            continue;
        };
        let head =
            format!("POST /mutate HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: {cap}\r\n\r\n");
        let sent = async {
            tls.write_all(head.as_bytes()).await?;
            tls.write_all(&body).await
        };
        let until = t.end;
        if tokio::time::timeout(until.saturating_duration_since(Instant::now()), sent)
            .await
            .is_ok_and(|r| r.is_ok())
        {
            let answer = read_some(&mut tls, until).await;
            t.saw(&answer);
        }
    }
}

/// A complete AdmissionReview just under the cap whose object is an array of
/// zeros: each 2-byte `0,` becomes a 32-byte JSON value when parsed.
pub fn json_bomb(cap: usize) -> Bytes {
    let head = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"b","operation":"CREATE","kind":{"group":"","version":"v1","kind":"Pod"},"object":{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","labels":{"memprof.dev/inject":"true"}},"spec":{"bomb":[0"#;
    let tail = br#"]}}}}"#;
    let n = (cap - head.len() - tail.len() - 16) / 2;
    let mut out = Vec::with_capacity(cap);
    out.extend_from_slice(head);
    for _ in 0..n {
        out.extend_from_slice(b",0");
    }
    out.extend_from_slice(tail);
    Bytes::from(out)
}

/// Complete bombs over HTTP/1.1, one after another on a kept-alive connection.
async fn bombs(t: Arc<Target>, bomb: Bytes) {
    while t.running() {
        let Some(tls) = t.connect(false).await else {
            pause().await;
            continue;
        };
        let Ok((mut send, conn)) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await
        else {
            continue;
        };
        tokio::spawn(conn);
        while t.running() && send.ready().await.is_ok() {
            let req = hyper::Request::post("/mutate")
                .header("host", "127.0.0.1")
                .body(Full::new(bomb.clone()))
                .unwrap();
            let Ok(resp) = send.send_request(req).await else {
                break;
            };
            t.saw(resp.status().as_str().as_bytes());
            let _ = resp.into_body().collect().await;
        }
    }
}

/// HTTP/2 connections opening `streams` streams each, every stream sending a
/// body of `cap - 1` bytes and then holding it open.
async fn h2_streams(t: Arc<Target>, streams: usize, cap: usize) {
    while t.running() {
        let Some(tls) = t.connect(true).await else {
            pause().await;
            continue;
        };
        let Ok((send, conn)) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls)).await
        else {
            continue;
        };
        let conn = tokio::spawn(conn);
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..streams {
            let (t, mut send) = (t.clone(), send.clone());
            tasks.spawn(async move {
                while t.running() && send.ready().await.is_ok() {
                    let (mut tx, rx) = mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(4);
                    let req = hyper::Request::post("https://127.0.0.1/mutate")
                        .header("content-length", cap.to_string())
                        .body(StreamBody::new(rx))
                        .unwrap();
                    let feeder = tokio::spawn(async move {
                        let chunk = Bytes::from(vec![b' '; 64 * 1024]);
                        let mut left = cap - 1;
                        while left > 0 {
                            let n = left.min(chunk.len());
                            if tx.send(Ok(Frame::data(chunk.slice(..n)))).await.is_err() {
                                return;
                            }
                            left -= n;
                        }
                        // Hold the stream open: the last byte never comes.
                        std::future::pending::<()>().await;
                    });
                    t.counts.streams.fetch_add(1, Relaxed);
                    let left = t.end.saturating_duration_since(Instant::now());
                    match tokio::time::timeout(left, send.send_request(req)).await {
                        Ok(Ok(resp)) => t.saw(resp.status().as_str().as_bytes()),
                        Ok(Err(_)) => {
                            feeder.abort();
                            break;
                        }
                        Err(_) => {}
                    }
                    feeder.abort();
                }
            });
        }
        while tasks.join_next().await.is_some() {}
        conn.abort();
    }
}

/// Every attacker of `attack`, started against `t`.
pub fn attackers(t: &Arc<Target>, attack: &Attack, cap: usize) -> tokio::task::JoinSet<()> {
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..attack.slow_heads {
        tasks.spawn(slow_head(t.clone()));
    }
    for _ in 0..attack.silent {
        tasks.spawn(silent(t.clone()));
    }
    let body = Bytes::from(vec![b' '; cap - 1]);
    for _ in 0..attack.held_bodies {
        tasks.spawn(held_body(t.clone(), cap, body.clone()));
    }
    let bomb = json_bomb(cap);
    for _ in 0..attack.bombers {
        tasks.spawn(bombs(t.clone(), bomb.clone()));
    }
    for _ in 0..attack.h2.0 {
        tasks.spawn(h2_streams(t.clone(), attack.h2.1, cap));
    }
    tasks
}
