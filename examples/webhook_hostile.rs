//! A hostile client against the admission webhook server (not a timed test):
//! many slow and silent connections, large bodies over HTTP/1.1 and HTTP/2,
//! JSON built to inflate when parsed, while a legitimate client keeps
//! sending AdmissionReviews over one kept-alive HTTP/2 connection, as the
//! API server does. Prints the server's RSS before, during and after the
//! attack, and the legitimate client's latency and failures.
//!
//! ```text
//! cargo build --release --example webhook_hostile
//! target/release/examples/webhook_hostile --limits default
//! target/release/examples/webhook_hostile --limits off   # A/B
//! ```
//!
//! The server is this binary run again as a child (`--serve`), so its RSS
//! (read from /proc) is the server's alone. `--limits off` lifts the limits
//! to what the server had before they existed (no deadlines, no connection
//! cap, 200 HTTP/2 streams, 4 MiB bodies, hyper's 1 MiB windows, no body
//! budget). Loopback only; the attack stops after `--seconds`, the child is
//! stopped by closing its stdin, then killed by PID if it lingers.

use bytes::Bytes;
use clap::Parser;
use futures::channel::mpsc;
use futures::SinkExt as _;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use memprof::webhook::server::{serve_with, ServerLimits, ServerMetrics};
use memprof::webhook::{certs, InjectionConfig, TlsCert};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use std::io::{BufRead as _, Write as _};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const MIB: usize = 1024 * 1024;

#[derive(Parser)]
struct Args {
    /// `default`: the operator's limits; `off`: the server before them.
    #[arg(long, default_value = "default")]
    limits: String,
    /// How long each attack lasts.
    #[arg(long, default_value_t = 15)]
    seconds: u64,
    /// `all`, or one of slots, bodies, bombs, mixed.
    #[arg(long, default_value = "all")]
    scenario: String,
    /// Run as the server (internal: the parent starts the child this way).
    #[arg(long)]
    serve: bool,
}

fn limits(name: &str) -> ServerLimits {
    let never = Duration::from_secs(24 * 3600);
    match name {
        "default" => ServerLimits::default(),
        "off" => ServerLimits {
            handshake_timeout: Duration::from_secs(10), // existed before
            header_read_timeout: never,
            request_timeout: never,
            idle_timeout: never,
            keep_alive_interval: never,
            max_connections: 1 << 20,
            max_streams: 200,
            max_header_bytes: 400 * 1024,
            max_body_bytes: 4 * MIB as u32,
            small_body_bytes: 4 * MIB as u32,
            body_budget_bytes: u32::MAX,
            max_concurrent_reviews: 1 << 16,
            h2_stream_window: MIB as u32,
            h2_connection_window: MIB as u32,
            shutdown_grace: Duration::from_secs(1),
        },
        other => panic!("--limits default|off, not {other}"),
    }
}

// ---- the server (child process) -------------------------------------------

/// Serves on 127.0.0.1:0, prints the port and the CA, stops when stdin closes.
fn serve(limits_name: &str) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let names = vec!["127.0.0.1".to_string()];
        let now = jiff::Timestamp::now();
        let bundle = certs::generate(&names, now, jiff::SignedDuration::from_hours(1)).unwrap();
        let tls = TlsCert::from_pem(bundle.cert_pem.as_bytes(), bundle.key_pem.as_bytes()).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut out = std::io::stdout().lock();
        writeln!(out, "{port}\n{}\nEND", bundle.ca_pem.trim()).unwrap();
        out.flush().unwrap();
        drop(out);
        let stdin_closed = async {
            let _ = tokio::task::spawn_blocking(|| {
                let mut sink = String::new();
                while std::io::stdin().read_line(&mut sink).is_ok_and(|n| n > 0) {}
            })
            .await;
        };
        let limits = limits(limits_name);
        serve_with(
            listener,
            tls,
            Arc::new(InjectionConfig::default()),
            limits,
            ServerMetrics::unregistered(),
            stdin_closed,
        )
        .await
        .unwrap();
    });
}

// ---- the clients ------------------------------------------------------------

#[derive(Default)]
struct Counts {
    connections: AtomicU64,
    refused: AtomicU64,
    status_413: AtomicU64,
    status_408: AtomicU64,
    status_200: AtomicU64,
    streams: AtomicU64,
}

struct Target {
    addr: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
    h2: Arc<rustls::ClientConfig>,
    end: Instant,
    counts: Counts,
}

type Tls = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

impl Target {
    fn running(&self) -> bool {
        Instant::now() < self.end
    }

    async fn connect(&self, h2: bool) -> Option<Tls> {
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
    fn saw(&self, status: &[u8]) {
        if status.starts_with(b"HTTP/1.1 413") || status == b"413" {
            self.counts.status_413.fetch_add(1, Relaxed);
        } else if status.starts_with(b"HTTP/1.1 408") || status == b"408" {
            self.counts.status_408.fetch_add(1, Relaxed);
        } else if status == b"200" {
            self.counts.status_200.fetch_add(1, Relaxed);
        }
    }
}

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
fn json_bomb(cap: usize) -> Bytes {
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

/// The legitimate client's record.
#[derive(Default)]
struct Legit {
    latencies: Vec<Duration>,
    /// Failures by kind: no connection (refused at the cap), timed out
    /// (the API server's 5 s), other (error status, reset).
    refused: u64,
    timed_out: u64,
    other: u64,
}

/// An HTTP/2 connection for the legitimate client.
async fn h2_client(t: &Target) -> Option<hyper::client::conn::http2::SendRequest<Full<Bytes>>> {
    let tls = t.connect(true).await?;
    let (send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .ok()?;
    tokio::spawn(conn);
    Some(send)
}

/// The API server's part: an HTTP/2 connection opened before the attack and
/// kept alive, a review every 50 ms; reconnects on failure.
async fn legitimate(t: Arc<Target>, review: Bytes) -> Legit {
    let mut out = Legit::default();
    let mut send = h2_client(&t).await;
    while t.running() {
        if send.is_none() {
            send = h2_client(&t).await;
        }
        let started = Instant::now();
        let Some(s) = send.as_mut() else {
            out.refused += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let req = hyper::Request::post("https://127.0.0.1/mutate")
            .body(Full::new(review.clone()))
            .unwrap();
        // The API server's own webhook timeout (chart: 5 s).
        let exchange = async {
            let resp = s.send_request(req).await.ok()?;
            let ok = resp.status() == 200;
            (resp.into_body().collect().await.is_ok() && ok).then_some(())
        };
        match tokio::time::timeout(Duration::from_secs(5), exchange).await {
            Ok(Some(())) => out.latencies.push(started.elapsed()),
            Err(_) => {
                out.timed_out += 1;
                send = None;
            }
            Ok(None) => {
                out.other += 1;
                send = None;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    out
}

/// What happens to a client that connects during the attack (an API server
/// replica that has just started, or whose idle connection was closed):
/// (attempts, served).
async fn fresh_connections(t: Arc<Target>) -> (u64, u64) {
    let (mut tried, mut served) = (0, 0);
    while t.running() {
        tried += 1;
        if let Some(mut send) = h2_client(&t).await {
            let req = hyper::Request::get("https://127.0.0.1/healthz")
                .body(Full::default())
                .unwrap();
            let ok = tokio::time::timeout(Duration::from_secs(5), send.send_request(req)).await;
            served += u64::from(matches!(ok, Ok(Ok(r)) if r.status() == 200));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    (tried, served)
}

fn review() -> Bytes {
    let containers: Vec<_> = (0..2)
        .map(|i| {
            serde_json::json!({
                "name": format!("trainer-{i}"), "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                "env": (0..20).map(|e| serde_json::json!({"name": format!("VAR_{e}"), "value": "x".repeat(40)})).collect::<Vec<_>>(),
                "resources": { "limits": { "nvidia.com/gpu": "8" } }
            })
        })
        .collect();
    Bytes::from(
        serde_json::to_vec(&serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "0c9a8d74-9cb7-44dd-b98e-09fd62def2f4",
                "kind": { "group": "batch", "version": "v1", "kind": "Job" },
                "resource": { "group": "batch", "version": "v1", "resource": "jobs" },
                "name": "train", "namespace": "ml", "operation": "CREATE",
                "object": {
                    "apiVersion": "batch/v1", "kind": "Job",
                    "metadata": { "name": "train", "namespace": "ml",
                                  "annotations": { "memprof.dev/enabled": "true" } },
                    "spec": { "parallelism": 16, "template": { "spec": {
                        "restartPolicy": "Never", "containers": containers } } }
                }
            }
        }))
        .unwrap(),
    )
}

// ---- the parent -------------------------------------------------------------

/// (VmRSS, VmHWM) of `pid` in bytes.
fn memory(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / MIB as f64)
}

fn client_configs(ca_pem: &str) -> (Arc<rustls::ClientConfig>, Arc<rustls::ClientConfig>) {
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

/// Starts the server child; returns it, its address and its CA.
fn start_server(limits: &str) -> (std::process::Child, SocketAddr, String) {
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--serve", "--limits", limits])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let port: u16 = lines.next().unwrap().unwrap().parse().unwrap();
    let ca: Vec<String> = lines
        .map_while(Result::ok)
        .take_while(|l| l != "END")
        .collect();
    (
        child,
        SocketAddr::from(([127, 0, 0, 1], port)),
        ca.join("\n") + "\n",
    )
}

/// What one scenario throws at the server, concurrently.
#[derive(Clone, Copy)]
struct Attack {
    name: &'static str,
    /// TLS, then a request head one byte per second.
    slow_heads: usize,
    /// TCP connections that never start TLS.
    silent: usize,
    /// HTTP/1.1 bodies of cap - 1 bytes, the last byte never sent.
    held_bodies: usize,
    /// Loops sending complete JSON bombs of nearly the cap.
    bombers: usize,
    /// HTTP/2 connections and streams per connection, each stream a body
    /// of cap - 1 bytes held open.
    h2: (usize, usize),
}

const SCENARIOS: [Attack; 4] = [
    Attack {
        name: "slots",
        slow_heads: 200,
        silent: 100,
        held_bodies: 0,
        bombers: 0,
        h2: (0, 0),
    },
    Attack {
        name: "bodies",
        slow_heads: 0,
        silent: 0,
        held_bodies: 32,
        bombers: 0,
        h2: (4, 64),
    },
    Attack {
        name: "bombs",
        slow_heads: 0,
        silent: 0,
        held_bodies: 0,
        bombers: 4,
        h2: (0, 0),
    },
    Attack {
        name: "mixed",
        slow_heads: 40,
        silent: 20,
        held_bodies: 16,
        bombers: 2,
        h2: (2, 64),
    },
];

fn main() {
    let args = Args::parse();
    if args.serve {
        return serve(&args.limits);
    }
    let server_limits = limits(&args.limits);
    println!(
        "limits: {} (buffered-bytes bound {}; body cap {}; {} connections; {} HTTP/2 streams each)",
        args.limits,
        if args.limits == "off" {
            "none".into()
        } else {
            mib(server_limits.buffered_bytes_bound())
        },
        mib(u64::from(server_limits.max_body_bytes)),
        server_limits.max_connections,
        server_limits.max_streams,
    );
    for attack in SCENARIOS {
        if args.scenario == "all" || args.scenario == attack.name {
            run_scenario(&args, &server_limits, attack);
        }
    }
}

/// A fresh server, its baseline, the attack with the legitimate client
/// beside it, and the server's memory during and after.
fn run_scenario(args: &Args, server_limits: &ServerLimits, attack: Attack) {
    let cap = server_limits.max_body_bytes as usize;
    let (mut child, addr, ca) = start_server(&args.limits);
    let pid = child.id();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let (tls, h2) = client_configs(&ca);
        let target = |for_: Duration| {
            Arc::new(Target {
                addr,
                tls: tls.clone(),
                h2: h2.clone(),
                end: Instant::now() + for_,
                counts: Counts::default(),
            })
        };
        // One legitimate exchange before the baseline.
        legitimate(target(Duration::from_millis(300)), review()).await;
        let before = memory(pid).0;
        let t = target(Duration::from_secs(args.seconds));
        print_attack(&attack, args.seconds, cap);
        let legit = tokio::spawn(legitimate(t.clone(), review()));
        // The API server's connection is open before the attack starts.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let fresh = tokio::spawn(fresh_connections(t.clone()));
        let mut tasks = attackers(&t, &attack, cap);
        let mut peak = 0;
        while t.running() {
            peak = peak.max(memory(pid).0);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
        let legit = legit.await.unwrap();
        let (tried, served) = fresh.await.unwrap();
        let hwm = memory(pid).1;
        tokio::time::sleep(Duration::from_secs(5)).await;
        let after = memory(pid).0;
        println!(
            "server RSS: before {}, during max {} (VmHWM {}), 5 s after {}",
            mib(before),
            mib(peak),
            mib(hwm),
            mib(after)
        );
        print_counts(&t.counts);
        report_latency(legit);
        println!("new connections (GET /healthz every 250 ms) during the attack: {served} of {tried} served");
    });
    drop(runtime);
    stop_server(&mut child);
}

/// What the attack is made of.
fn print_attack(attack: &Attack, seconds: u64, cap: usize) {
    println!(
        "\n== {} ({} s): {} slow-head HTTP/1.1, {} silent TCP, {} HTTP/1.1 bodies of {} held open, \
         {} loops of {} JSON bombs, {} HTTP/2 connections x {} streams of {} held open",
        attack.name,
        seconds,
        attack.slow_heads,
        attack.silent,
        attack.held_bodies,
        mib(cap as u64 - 1),
        attack.bombers,
        mib(json_bomb(cap).len() as u64),
        attack.h2.0,
        attack.h2.1,
        mib(cap as u64 - 1),
    );
}

/// Every attacker of `attack`, started against `t`.
fn attackers(t: &Arc<Target>, attack: &Attack, cap: usize) -> tokio::task::JoinSet<()> {
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

/// What the attackers saw.
fn print_counts(c: &Counts) {
    println!(
        "attacker: {} TLS connections, {} closed before TLS, {} HTTP/2 streams, {} x 200 (bombs parsed), {} x 413, {} x 408",
        c.connections.load(Relaxed),
        c.refused.load(Relaxed),
        c.streams.load(Relaxed),
        c.status_200.load(Relaxed),
        c.status_413.load(Relaxed),
        c.status_408.load(Relaxed),
    );
}

fn report_latency(legit: Legit) {
    let Legit {
        mut latencies,
        refused,
        timed_out,
        other,
    } = legit;
    latencies.sort();
    let pct = |p: f64| {
        latencies
            .get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    println!(
        "legitimate mutate (HTTP/2, kept alive): ok={} p50={:.1?} p99={:.1?} max={:.1?}; \
         failed: {refused} no connection, {timed_out} timed out (5 s), {other} other",
        latencies.len(),
        pct(0.5),
        pct(0.99),
        latencies.last().copied().unwrap_or_default(),
    );
}

/// Closes the child's stdin (its shutdown signal); kills it by PID if it is
/// still running 5 s later.
fn stop_server(child: &mut std::process::Child) {
    drop(child.stdin.take());
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}
