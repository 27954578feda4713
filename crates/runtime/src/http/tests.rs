use super::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

async fn echo_path(req: Request) -> Response {
    text(
        StatusCode::OK,
        format!("{} {}\n", req.method(), req.uri().path()),
    )
}

fn stopper() -> (watch::Sender<bool>, impl Future<Output = ()>) {
    let (stop, mut stopped) = watch::channel(false);
    (stop, async move {
        let _ = stopped.wait_for(|s| *s).await;
    })
}

async fn get<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, path: &str) -> String {
    let req = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

#[tokio::test]
async fn tcp_and_unix_listeners_are_served_until_shutdown() {
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    let (stop, stopped) = stopper();
    let server = tokio::spawn(serve(tcp, echo_path, stopped));
    let out = get(tokio::net::TcpStream::connect(addr).await.unwrap(), "/a").await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(
        out.contains("content-type: text/plain; charset=utf-8"),
        "{out}"
    );
    assert!(out.ends_with("GET /a\n"), "{out}");
    stop.send(true).unwrap();
    server.await.unwrap();
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "the listener is closed once serve returns"
    );

    let dir = std::env::temp_dir().join(format!("memprof-http-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("s.sock");
    let unix = tokio::net::UnixListener::bind(&path).unwrap();
    let (stop, stopped) = stopper();
    let server = tokio::spawn(serve(unix, echo_path, stopped));
    let out = get(tokio::net::UnixStream::connect(&path).await.unwrap(), "/b").await;
    assert!(out.ends_with("GET /b\n"), "{out}");
    stop.send(true).unwrap();
    server.await.unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_request_in_flight_at_shutdown_is_answered() {
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    let (entered_tx, entered) = tokio::sync::oneshot::channel::<()>();
    let entered_tx = std::sync::Arc::new(std::sync::Mutex::new(Some(entered_tx)));
    let (release_tx, release) = watch::channel(false);
    let slow = move |_req: Request| {
        let (entered_tx, mut release) = (entered_tx.clone(), release.clone());
        async move {
            if let Some(tx) = entered_tx.lock().unwrap().take() {
                let _ = tx.send(());
            }
            let _ = release.wait_for(|r| *r).await;
            text(StatusCode::OK, "done")
        }
    };
    let (stop, stopped) = stopper();
    let server = tokio::spawn(serve(tcp, slow, stopped));
    let client =
        tokio::spawn(
            async move { get(tokio::net::TcpStream::connect(addr).await.unwrap(), "/").await },
        );
    entered.await.unwrap();
    stop.send(true).unwrap();
    release_tx.send(true).unwrap();
    assert!(client.await.unwrap().ends_with("done"));
    server.await.unwrap();
}

#[test]
fn the_helpers_set_status_and_content_type() {
    let r = typed(StatusCode::SERVICE_UNAVAILABLE, JSON, "{}");
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.headers()[CONTENT_TYPE], JSON);
    assert!(response(StatusCode::OK, "ok").headers().is_empty());
}
