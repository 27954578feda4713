//! The server over real sockets: TLS, both HTTP versions, and each limit
//! against a client that abuses it. Short limits, no timing assertions:
//! each test waits (bounded) for the server to act.

use super::*;
use crate::certs;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;

type Tls = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

/// A TLS connection trusting only `ca_pem`, offering `alpn`.
async fn tls_connect(
    addr: SocketAddr,
    ca_pem: &str,
    alpn: &[u8],
) -> Result<Tls, Box<dyn std::error::Error>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert?)?;
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1")?;
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await?)
}

/// A one-connection HTTPS (HTTP/1.1) client trusting only `ca_pem`.
async fn request(
    addr: SocketAddr,
    ca_pem: &str,
    req: hyper::Request<Full<Bytes>>,
) -> Result<(u16, Vec<u8>), Box<dyn std::error::Error>> {
    let tls = tls_connect(addr, ca_pem, b"http/1.1").await?;
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

/// A review of a pod that asks for injection, with request uid `uid`.
fn inject_review(uid: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": uid, "operation": "CREATE", "name": "p", "namespace": "ml",
            "kind": { "group": "", "version": "v1", "kind": "Pod" },
            "resource": { "group": "", "version": "v1", "resource": "pods" },
            "userInfo": {},
            "object": { "apiVersion": "v1", "kind": "Pod",
                "metadata": { "name": "p", "labels": { "memprof.dev/inject": "true" } },
                "spec": { "containers": [{ "name": "c", "image": "x" }] } }
        }
    })
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

    let review = inject_review("u-1");
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

/// Longer than any test runs: a limit that must not be the one acting.
const NEVER: Duration = Duration::from_secs(3600);
/// Short enough to act within a test, long enough for loopback TLS.
const SHORT: Duration = Duration::from_millis(300);
/// Upper bound on waiting for the server to act (not a speed assertion:
/// without the limit under test the wait never ends).
const BOUND: Duration = Duration::from_secs(20);

/// Limits where nothing times out unless a test shortens it.
fn patient() -> ServerLimits {
    ServerLimits {
        handshake_timeout: NEVER,
        header_read_timeout: NEVER,
        request_timeout: NEVER,
        idle_timeout: NEVER,
        keep_alive_interval: NEVER,
        ..ServerLimits::default()
    }
}

struct TestServer {
    addr: SocketAddr,
    ca_pem: String,
    metrics: Arc<ServerMetrics>,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), ServerError>>,
}

async fn start(limits: ServerLimits) -> TestServer {
    start_with(limits, InjectionConfig::default()).await
}

async fn start_with(limits: ServerLimits, config: InjectionConfig) -> TestServer {
    let now = jiff::Timestamp::now();
    let bundle = certs::generate(&names(), now, jiff::SignedDuration::from_hours(1)).unwrap();
    let tls = TlsCert::from_pem(bundle.cert_pem.as_bytes(), bundle.key_pem.as_bytes()).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let metrics = ServerMetrics::unregistered();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(serve_with(
        listener,
        tls,
        Arc::new(config),
        limits,
        metrics.clone(),
        async {
            let _ = stopped.await;
        },
    ));
    TestServer {
        addr,
        ca_pem: bundle.ca_pem,
        metrics,
        stop,
        task,
    }
}

impl TestServer {
    async fn connect(&self, alpn: &[u8]) -> Result<Tls, Box<dyn std::error::Error>> {
        tls_connect(self.addr, &self.ca_pem, alpn).await
    }

    async fn healthz(&self) -> Result<u16, Box<dyn std::error::Error>> {
        let req = hyper::Request::get("/healthz")
            .header("host", "127.0.0.1")
            .body(Full::default())?;
        Ok(request(self.addr, &self.ca_pem, req).await?.0)
    }

    /// Stops the server; its open connections get the grace period.
    async fn stop(self) {
        self.stop.send(()).unwrap();
        tokio::time::timeout(BOUND, self.task)
            .await
            .expect("serve returns after shutdown")
            .unwrap()
            .unwrap();
    }
}

/// Reads an HTTP/1.1 response head.
async fn read_head(tls: &mut Tls) -> String {
    use tokio::io::AsyncReadExt as _;
    let mut out = Vec::new();
    let mut byte = [0u8; 1];
    let read = async {
        while !out.ends_with(b"\r\n\r\n") {
            if tls.read(&mut byte).await.unwrap_or(0) == 0 {
                break;
            }
            out.push(byte[0]);
        }
    };
    tokio::time::timeout(BOUND, read)
        .await
        .expect("the server answers");
    String::from_utf8_lossy(&out).into_owned()
}

async fn write(tls: &mut Tls, bytes: &[u8]) {
    use tokio::io::AsyncWriteExt as _;
    tls.write_all(bytes).await.unwrap();
    tls.flush().await.unwrap();
}

#[tokio::test]
async fn slow_loris_request_head_is_closed_after_the_header_timeout() {
    let server = start(ServerLimits {
        header_read_timeout: SHORT,
        ..patient()
    })
    .await;
    let mut tls = server.connect(b"http/1.1").await.unwrap();
    let (mut read, mut write_half) = tokio::io::split(&mut tls);
    // One byte of a never-ending head every 50 ms, until the server closes.
    let trickle = async {
        use tokio::io::AsyncWriteExt as _;
        let head = b"POST /mutate HTTP/1.1\r\nhost: 127.0.0.1\r\nx-slow: ";
        for byte in head.iter().chain(std::iter::repeat(&b'a')) {
            if write_half.write_all(&[*byte]).await.is_err() || write_half.flush().await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let closed = async {
        use tokio::io::AsyncReadExt as _;
        let mut buf = [0u8; 256];
        while matches!(read.read(&mut buf).await, Ok(n) if n > 0) {}
    };
    let ended = tokio::time::timeout(BOUND, async {
        tokio::select! {
            () = closed => {}
            () = trickle => {}
        }
    })
    .await;
    assert!(
        ended.is_ok(),
        "a head trickling in must not hold the connection"
    );
    server.stop().await;
}

#[tokio::test]
async fn connections_over_the_cap_are_closed_at_once() {
    let server = start(ServerLimits {
        max_connections: 2,
        ..patient()
    })
    .await;
    let first = server.connect(b"http/1.1").await.unwrap();
    let _second = server.connect(b"http/1.1").await.unwrap();
    // The handshake deadline is an hour away: only the cap can close it.
    let third = tokio::time::timeout(BOUND, server.connect(b"http/1.1"))
        .await
        .expect("the third connection is not left waiting");
    assert!(third.is_err(), "the third connection is closed before TLS");
    assert_eq!(server.metrics.connections_rejected.get(), 1);
    assert_eq!(server.metrics.connections_open.get(), 2);

    // A closed connection gives its slot back.
    drop(first);
    let served = tokio::time::timeout(BOUND, async {
        loop {
            if let Ok(200) = server.healthz().await {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        served.is_ok(),
        "a slot is free again once a connection ends"
    );
    server.stop().await;
}

#[tokio::test]
async fn chunked_body_over_the_cap_gets_413_before_it_ends() {
    let server = start(ServerLimits {
        max_body_bytes: 64 * 1024,
        body_budget_bytes: 64 * 1024,
        ..patient()
    })
    .await;
    let mut tls = server.connect(b"http/1.1").await.unwrap();
    write(
        &mut tls,
        b"POST /mutate HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n\
          transfer-encoding: chunked\r\n\r\n",
    )
    .await;
    // Exactly the cap, then one byte more; the body never ends.
    let chunk = [b"2000\r\n".as_slice(), &[b' '; 8192], b"\r\n"].concat();
    for _ in 0..8 {
        write(&mut tls, &chunk).await;
    }
    write(&mut tls, b"1\r\n \r\n").await;
    let head = read_head(&mut tls).await;
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
    let reason = RejectLabels {
        reason: "body_too_large",
    };
    assert_eq!(
        server
            .metrics
            .requests_rejected
            .get_or_create(&reason)
            .get(),
        1
    );
    server.stop().await;
}

#[tokio::test]
async fn slow_body_gets_408_at_the_request_deadline() {
    let server = start(ServerLimits {
        request_timeout: SHORT,
        ..patient()
    })
    .await;
    let mut tls = server.connect(b"http/1.1").await.unwrap();
    write(
        &mut tls,
        b"POST /mutate HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: 100\r\n\r\n0123456789",
    )
    .await;
    let head = read_head(&mut tls).await;
    assert!(head.starts_with("HTTP/1.1 408"), "{head}");
    server.stop().await;
}

/// HTTP/2 frames, written by hand so the client can break the rules.
mod h2 {
    pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    pub const SETTINGS: u8 = 4;
    pub const RST_STREAM: u8 = 3;
    pub const PING: u8 = 6;
    pub const GOAWAY: u8 = 7;
    pub const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 3;
    pub const REFUSED_STREAM: u32 = 7;

    pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = (payload.len() as u32).to_be_bytes();
        let mut out = vec![len[1], len[2], len[3], kind, flags];
        out.extend_from_slice(&stream.to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    /// HEADERS of `POST /mutate` with END_HEADERS and no END_STREAM: the
    /// body is still to come, so the stream stays open.
    pub fn post_headers(stream: u32) -> Vec<u8> {
        // HPACK: :method POST (static 3), :scheme https (static 7), then
        // literals without indexing with the names of :path (4), :authority (1).
        let mut block = vec![0x83, 0x87, 0x04, 7];
        block.extend_from_slice(b"/mutate");
        block.extend_from_slice(&[0x01, 9]);
        block.extend_from_slice(b"127.0.0.1");
        frame(1, 0x4, stream, &block)
    }

    /// (type, flags, stream, payload) of the next frame.
    pub async fn read_frame(tls: &mut super::Tls) -> std::io::Result<(u8, u8, u32, Vec<u8>)> {
        use tokio::io::AsyncReadExt as _;
        let mut head = [0u8; 9];
        tls.read_exact(&mut head).await?;
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let mut payload = vec![0u8; len];
        tls.read_exact(&mut payload).await?;
        Ok((head[3], head[4], stream, payload))
    }

    /// The value of `id` in a SETTINGS payload.
    pub fn setting(payload: &[u8], id: u16) -> Option<u32> {
        payload.chunks_exact(6).find_map(|s| {
            (u16::from_be_bytes([s[0], s[1]]) == id)
                .then(|| u32::from_be_bytes([s[2], s[3], s[4], s[5]]))
        })
    }
}

#[tokio::test]
async fn h2_streams_over_the_cap_are_refused() {
    let server = start(ServerLimits {
        max_streams: 2,
        ..patient()
    })
    .await;
    let mut tls = server.connect(b"h2").await.unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    write(&mut tls, h2::PREFACE).await;
    write(&mut tls, &h2::frame(h2::SETTINGS, 0, 0, &[])).await;
    // Three streams at once, each waiting for its body; the client ignores
    // the server's limit.
    for stream in [1, 3, 5] {
        write(&mut tls, &h2::post_headers(stream)).await;
    }
    let (mut advertised, mut refused) = (None, None);
    let read = async {
        while refused.is_none() {
            let (kind, flags, stream, payload) = h2::read_frame(&mut tls).await.unwrap();
            match kind {
                h2::SETTINGS if flags & 1 == 0 => {
                    advertised = h2::setting(&payload, h2::SETTINGS_MAX_CONCURRENT_STREAMS);
                }
                h2::RST_STREAM => {
                    let code = u32::from_be_bytes(payload[..4].try_into().unwrap());
                    refused = Some((stream, code));
                }
                h2::GOAWAY => panic!("connection closed instead of refusing a stream"),
                _ => {}
            }
        }
    };
    tokio::time::timeout(BOUND, read)
        .await
        .expect("the stream over the cap is refused");
    assert_eq!(advertised, Some(2));
    assert_eq!(refused, Some((5, h2::REFUSED_STREAM)));
    drop(tls); // ends the two streams still waiting for their bodies
    server.stop().await;
}

#[tokio::test]
async fn idle_h2_connection_is_closed_after_the_idle_timeout() {
    let server = start(ServerLimits {
        idle_timeout: SHORT,
        ..patient()
    })
    .await;
    let mut tls = server.connect(b"h2").await.unwrap();
    write(&mut tls, h2::PREFACE).await;
    write(&mut tls, &h2::frame(h2::SETTINGS, 0, 0, &[])).await;
    let mut goaway = false;
    let read = async {
        while let Ok((kind, flags, _, payload)) = h2::read_frame(&mut tls).await {
            goaway |= kind == h2::GOAWAY;
            // A live client answers PINGs (the graceful close sends one).
            if kind == h2::PING && flags & 1 == 0 {
                write(&mut tls, &h2::frame(h2::PING, 1, 0, &payload)).await;
            }
        }
    };
    tokio::time::timeout(BOUND, read)
        .await
        .expect("an idle HTTP/2 connection is closed");
    assert!(goaway, "closed gracefully, with GOAWAY");
    let idle = CloseLabels { reason: "idle" };
    assert_eq!(
        server.metrics.connections_closed.get_or_create(&idle).get(),
        1
    );
    server.stop().await;
}

#[tokio::test]
async fn h2_client_is_served_admission() {
    let server = start(ServerLimits::default()).await;
    let tls = server.connect(b"h2").await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        TokioIo::new(tls),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let review = inject_review("u-2");
    let req = hyper::Request::post("https://127.0.0.1/mutate")
        .body(Full::new(Bytes::from(review.to_string())))
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let out: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(out["response"]["uid"], "u-2");
    assert!(out["response"]["patch"].is_string(), "{out}");
    server.stop().await;
}

/// A review anyone who reaches the port can send: the Job controller named
/// as the creator of a pod for a victim Job. Only on the API server's
/// secret path does it come back with a mark.
#[tokio::test]
async fn only_reviews_on_the_secret_path_are_marked() {
    use memprof_api::admission::{path_token, Key, KeyRing, Keys, ANNOTATION_ADMISSION};
    let key = Key::generate();
    let config = InjectionConfig {
        marks: crate::config::MarkConfig {
            keys: Keys::of(KeyRing::new(key.clone())),
            ..Default::default()
        },
        ..Default::default()
    };
    let server = start_with(ServerLimits::default(), config).await;
    let review = serde_json::json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": { "uid": "u-3", "operation": "CREATE", "name": "evil-0", "namespace": "ml",
            "kind": { "group": "", "version": "v1", "kind": "Pod" },
            "userInfo": { "username": "system:serviceaccount:kube-system:job-controller" },
            "object": { "apiVersion": "v1", "kind": "Pod",
                "metadata": { "name": "evil-0", "ownerReferences": [{ "apiVersion": "batch/v1",
                    "kind": "Job", "name": "victim", "uid": "victim-uid", "controller": true }] },
                "spec": { "containers": [{ "name": "c", "image": "x" }] } } }
    });
    let marked = |path: String| {
        let review = review.to_string();
        let (addr, ca) = (server.addr, server.ca_pem.clone());
        async move {
            let req = hyper::Request::post(path)
                .header("host", "127.0.0.1")
                .body(Full::new(Bytes::from(review)))
                .unwrap();
            let (status, body) = request(addr, &ca, req).await.unwrap();
            assert_eq!(status, 200);
            let out: serde_json::Value = serde_json::from_slice(&body).unwrap();
            let patch = out["response"]["patch"].as_str().unwrap_or_default();
            use base64::Engine as _;
            let patch = base64::engine::general_purpose::STANDARD
                .decode(patch)
                .unwrap();
            let patch = String::from_utf8(patch).unwrap();
            // Added as a key of a new annotation map, or under an existing one.
            patch.contains(ANNOTATION_ADMISSION)
                || patch.contains(&ANNOTATION_ADMISSION.replace('/', "~1"))
        }
    };
    assert!(
        !marked("/mutate".into()).await,
        "the plain path marks nothing"
    );
    let forged = path_token(&Key::generate());
    assert!(
        !marked(format!("/mutate/{forged}")).await,
        "nor does a guessed token"
    );
    assert!(!marked("/mutate/".into()).await);
    assert!(
        marked(format!("/mutate/{}", path_token(&key))).await,
        "the API server's path marks"
    );
    server.stop().await;
}
