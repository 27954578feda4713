//! The pipeline's steps on a simulated GPU, driven tick by tick.

use super::*;
use clap::Parser;
use memprof_api::agent::{Ack, DeviceStats, Push};
use memprof_api::DataSource;
use std::path::PathBuf;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A fresh directory under the temp dir, removed by the caller.
fn temp_dir(what: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let d = std::env::temp_dir().join(format!(
        "memprof-run-{}-{}-{what}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A standalone sidecar over a scenario, its agent socket in `dir`.
async fn sidecar(dir: &std::path::Path, scenario: &str) -> (Sidecar, Endpoints) {
    let path = dir.join("scenario.yaml");
    std::fs::write(&path, scenario).unwrap();
    let socket = dir.join("agent.sock");
    let argv = [
        "memprof-sidecar",
        "--standalone",
        "--backend",
        "sim",
        "--scenario",
        path.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--agent-socket",
        socket.to_str().unwrap(),
    ];
    let args = Args::try_parse_from(argv).unwrap();
    let setup = Setup::from_args(&args).unwrap();
    let (s, endpoints, writer) = Sidecar::start(args, setup, None).await;
    assert!(writer.is_none(), "standalone: no writer");
    (s, endpoints)
}

/// One analysis step as the loop runs it.
fn tick(s: &mut Sidecar, t: f64) -> Option<Reason> {
    s.sample(t);
    s.take_pushes();
    let report = s.analyse();
    let d = s.decide(&report);
    let write = d.write;
    s.write(report, d, t);
    write
}

async fn post(socket: &std::path::Path, body: &str) -> serde_json::Value {
    let mut s = tokio::net::UnixStream::connect(socket).await.unwrap();
    let req = format!(
        "POST /v1/agent HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    serde_json::from_str(out.split_once("\r\n\r\n").unwrap().1).unwrap()
}

const PUSH: &str = r#"{"version": 1, "time": 1795000000.5,
    "devices": [{"index": 0, "allocatedBytes": 30, "reservedBytes": 40}]}"#;

/// Contract B end to end: the analysis's verdict is what the socket answers,
/// and `history` turns on once the risk reached high.
#[tokio::test]
async fn the_socket_answers_with_the_last_analysis_and_history_once_high() {
    let dir = temp_dir("answer");
    let (mut s, endpoints) = sidecar(&dir, "default: { leakMiBPerSecond: 50, noiseGiB: 0 }").await;
    let socket = dir.join("agent.sock");

    let before = post(&socket, PUSH).await;
    assert_eq!(before["verdict"], serde_json::Value::Null, "{before}");

    for i in 0..600 {
        s.sample(1_000_000.0 + i as f64 * 0.5);
    }
    tick(&mut s, 1_000_300.0);
    let report = s.out.report.borrow().clone().unwrap();
    assert!(
        report.summary.risk >= RiskLevel::High,
        "{:?}",
        report.summary
    );

    let answer = post(&socket, PUSH).await;
    assert_eq!(answer["accepted"], true);
    assert_eq!(answer["verdict"]["risk"], report.summary.risk.as_str());
    assert_eq!(answer["verdict"]["source"], "sim");
    assert_eq!(answer["verdict"]["leak"], true);
    assert!(
        answer["verdict"]["ttoSeconds"].as_f64().unwrap() > 0.0,
        "{answer}"
    );
    assert!(
        answer["verdict"]["at"].as_f64().unwrap() > 1.7e9,
        "{answer}"
    );
    assert_eq!(answer["history"], true);
    assert_eq!(answer["directives"], serde_json::json!([]));

    endpoints.stop().await;
    assert!(!socket.exists(), "the socket goes with the sidecar");
    std::fs::remove_dir_all(&dir).unwrap();
}

fn ack_push(id: &str) -> Push {
    Push {
        version: 1,
        time: 1.8e9,
        pid: 42,
        rank: Some(3),
        acks: vec![Ack {
            id: id.into(),
            action: "split micro-batch 16 x 1 -> 8 x 2".into(),
            ok: true,
        }],
        ..Default::default()
    }
}

/// The report states its heartbeat and the trainers' acknowledgements; a new
/// acknowledgement is a reason to write.
#[tokio::test]
async fn acks_and_the_heartbeat_reach_the_report_and_a_new_ack_is_written() {
    let dir = temp_dir("acks");
    let (mut s, endpoints) = sidecar(
        &dir,
        "default: { baseGiB: 30, amplitudeGiB: 0, noiseGiB: 0 }",
    )
    .await;
    let (tx, mut rx) = watch::channel(None);
    s.out.write = Some(tx);
    s.budget.min_interval = 0.0;

    assert_eq!(tick(&mut s, 1.0), Some(Reason::First));
    assert_eq!(tick(&mut s, 2.0), None, "nothing changed");
    s.inbox.put(ack_push("job/critical-1"));
    assert_eq!(tick(&mut s, 3.0), Some(Reason::AcksChanged));
    let (_, written) = rx.borrow_and_update().clone().unwrap();
    assert_eq!(written.heartbeat_seconds, Some(60));
    let ack = &written.agent_acks[0];
    assert_eq!(
        (ack.id.as_str(), ack.ok, ack.pid, ack.rank),
        ("job/critical-1", true, Some(42), Some(3))
    );
    s.inbox.put(ack_push("job/critical-1"));
    assert_eq!(tick(&mut s, 4.0), None, "the same ack again is no news");
    assert!(memprof_analysis::validate_report(&written).is_ok());
    endpoints.stop().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A push announcing a checkpoint (over the agent socket, as the agent
/// sends it) reaches the next report as `lastCheckpoint`, is a reason to
/// write, and its time is never later than the push's.
#[tokio::test]
async fn a_pushed_checkpoint_reaches_the_next_report_clamped_to_its_push() {
    let dir = temp_dir("checkpoint");
    let (mut s, endpoints) = sidecar(
        &dir,
        "default: { baseGiB: 30, amplitudeGiB: 0, noiseGiB: 0 }",
    )
    .await;
    let (tx, mut rx) = watch::channel(None);
    s.out.write = Some(tx);
    s.budget.min_interval = 0.0;
    let socket = dir.join("agent.sock");
    assert_eq!(tick(&mut s, 1.0), Some(Reason::First));
    let (_, first) = rx.borrow_and_update().clone().unwrap();
    assert_eq!(first.last_checkpoint, None);

    // The event claims a time a day after the push that carries it.
    let body = r#"{"version": 1, "time": 1795000000.5, "pid": 7, "rank": 1,
        "events": [{"t": 1795086400.0, "name": "checkpoint", "note": "step=1200", "elapsed": 3.0}]}"#;
    post(&socket, body).await;
    assert_eq!(tick(&mut s, 2.0), Some(Reason::CheckpointChanged));
    let (_, written) = rx.borrow_and_update().clone().unwrap();
    let c = written
        .last_checkpoint
        .clone()
        .expect("the report carries it");
    assert_eq!(c.step, Some(1200));
    assert_eq!(c.note, "step=1200");
    let at: jiff::Timestamp = c.time.parse().unwrap();
    assert_eq!(at.as_second(), 1_795_000_000, "clamped to the push's time");
    assert!(memprof_analysis::validate_report(&written).is_ok());

    // The same checkpoint re-sent (a push the agent retried) is no news.
    post(&socket, body).await;
    assert_eq!(tick(&mut s, 3.0), None);
    endpoints.stop().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_stated_heartbeat_is_whole_seconds_rounded_up() {
    assert_eq!(heartbeat_seconds(60.0), 60);
    assert_eq!(heartbeat_seconds(4.2), 5);
    assert_eq!(heartbeat_seconds(0.2), 1);
    assert_eq!(heartbeat_seconds(f64::NAN), 1);
}

/// A pod whose GPUs only the agent sees (`agentOnly`) exports the same
/// per-GPU gauges as a sampled one, from the report.
#[test]
fn agent_only_pods_export_their_gpu_gauges() {
    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry);
    let mut m = Monitor::new(Box::new(gpus::NoGpus), Thresholds::default());
    for i in 0..=120u64 {
        m.sample(i as f64).unwrap();
        let allocated = 30_000_000_000 + i * 100_000_000;
        m.agent_push(Push {
            version: 1,
            time: 1.8e9 + i as f64,
            step: Some(i),
            devices: vec![DeviceStats {
                uuid: Some("GPU-a1".into()),
                name: Some("NVIDIA H100 80GB HBM3".into()),
                allocated_bytes: allocated,
                reserved_bytes: allocated + 1_000_000_000,
                free_bytes: Some(40_000_000_000 - i * 100_000_000),
                total_bytes: Some(80_000_000_000),
                ..Default::default()
            }],
            ..Default::default()
        });
    }
    m.analyse();
    let report = m.report(&Identity::default(), String::new(), 1000, vec![]);
    assert_eq!(report.gpus[0].source, DataSource::Agent);
    metrics.export(&report);
    let text = crate::metrics::render(&registry);
    assert!(
        text.contains(
            "memprof_gpu_used_bytes{gpu=\"0\",UUID=\"GPU-a1\",modelName=\"NVIDIA H100 80GB HBM3\"}"
        ),
        "{text}"
    );
    assert!(
        text.contains("memprof_gpu_risk_level{gpu=\"0\",UUID=\"GPU-a1\""),
        "{text}"
    );
}
