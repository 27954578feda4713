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
//!
//! Where things are: the scenarios and the printed report here; the server
//! child and the parent's view of it (`/proc`) in `server.rs`; the
//! connection both kinds of client share in `target.rs`; the attackers in
//! `attack.rs`; the legitimate client (the API server's part) in `legit.rs`.

mod attack;
mod legit;
mod server;
mod target;

use attack::{attackers, json_bomb};
use clap::Parser;
use legit::{fresh_connections, legitimate, review, Legit};
use memprof::webhook::server::ServerLimits;
use server::{limits, memory, serve, start_server, stop_server};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};
use target::{client_configs, Counts, Target};

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

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / MIB as f64)
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
