//! The webhook server under attack, run as a child process (`--serve`) so
//! that its RSS is its own: the limits it runs with, how the parent starts
//! and stops it, and what the parent reads of its memory from `/proc`.

use crate::MIB;
use memprof::webhook::server::{serve_with, ServerLimits, ServerMetrics};
use memprof::webhook::{certs, InjectionConfig, TlsCert};
use std::io::{BufRead as _, Write as _};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub fn limits(name: &str) -> ServerLimits {
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

/// Serves on 127.0.0.1:0, prints the port and the CA, stops when stdin closes.
pub fn serve(limits_name: &str) {
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

/// (VmRSS, VmHWM) of `pid` in bytes.
pub fn memory(pid: u32) -> (u64, u64) {
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

/// Starts the server child; returns it, its address and its CA.
pub fn start_server(limits: &str) -> (std::process::Child, SocketAddr, String) {
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

/// Closes the child's stdin (its shutdown signal); kills it by PID if it is
/// still running 5 s later.
pub fn stop_server(child: &mut std::process::Child) {
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
