//! What the CLI's integration tests share: running the `memprof` binary,
//! the two Jobs they profile (`train`, `calm`), temporary directories and
//! kubeconfig copies. Included by `tests/cli.rs` and `tests/cli_printing.rs`.
#![allow(dead_code)]

use crate::common::*;
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{Container, EnvVar, PodSpec, PodTemplateSpec};
use kube::api::{Api, PostParams};
use kube::Client;
use memprof::api::{GpuReport, MemoryProfile, RiskLevel, TimelinePoint, ANNOTATION_ENABLED};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;

pub const BIN: &str = env!("CARGO_BIN_EXE_memprof");

/// Runs `memprof ARGS` with extra env; waits for it.
pub async fn memprof(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = tokio::process::Command::new(BIN);
    cmd.args(args).kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    tokio::time::timeout(TIMEOUT, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("memprof {args:?} did not finish within {TIMEOUT:?}"))
        .expect("running memprof")
}

/// `memprof ARGS` must succeed; its stdout.
pub async fn ok(args: &[&str]) -> String {
    let out = memprof(args, &[]).await;
    let (stdout, stderr) = texts(&out);
    assert!(
        out.status.success(),
        "memprof {args:?} failed: {stderr}\n{stdout}"
    );
    stdout
}

pub fn texts(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A Job with `BATCH_SIZE` in its trainer's env, profiled.
pub async fn create_job_with_batch(client: &Client, ns: &str, name: &str, ranks: i32, batch: &str) {
    let mut job = Job {
        spec: Some(JobSpec {
            parallelism: Some(ranks),
            completions: Some(ranks),
            template: PodTemplateSpec {
                spec: Some(PodSpec {
                    restart_policy: Some("Never".into()),
                    containers: vec![Container {
                        name: "trainer".into(),
                        image: Some("busybox".into()),
                        env: Some(vec![EnvVar {
                            name: "BATCH_SIZE".into(),
                            value: Some(batch.into()),
                            ..Default::default()
                        }]),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        }),
        ..Default::default()
    };
    job.metadata.name = Some(name.into());
    job.metadata.annotations = Some(BTreeMap::from([(
        ANNOTATION_ENABLED.to_string(),
        "true".to_string(),
    )]));
    mark_managed(&mut job);
    Api::<Job>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &job)
        .await
        .unwrap_or_else(|e| panic!("creating Job {name}: {e}"));
}

/// A GPU with a 60-point timeline climbing from `from_gib` to its peak.
pub fn gpu_with_timeline(
    rank: u32,
    from_gib: u64,
    peak_gib: u64,
    risk: RiskLevel,
    tto: Option<f64>,
) -> GpuReport {
    let mut g = gpu(rank, peak_gib, peak_gib, risk, tto);
    let t0 = jiff::Timestamp::now().as_second() - 3600;
    g.timeline = (0..60u64)
        .map(|i| {
            let used = from_gib * GIB + (peak_gib - from_gib) * GIB * i / 59;
            TimelinePoint {
                t: t0 + 5 * i as i64,
                max: used,
                min: used - GIB / 2,
            }
        })
        .collect();
    g
}

/// Job `train` (2 ranks, batch 32, rank 1 leaking to critical) and Job
/// `calm` (1 rank, batch 16, low), rolled up by the operator.
pub async fn two_jobs(client: &Client, ns: &str) {
    create_job_with_batch(client, ns, "train", 2, "32").await;
    create_job_with_batch(client, ns, "calm", 1, "16").await;
    let reports = [
        (
            "train",
            0,
            gpu_with_timeline(0, 30, 40, RiskLevel::Low, None),
        ),
        (
            "train",
            1,
            gpu_with_timeline(1, 40, 70, RiskLevel::Critical, Some(90.0)),
        ),
        (
            "calm",
            0,
            gpu_with_timeline(0, 20, 20, RiskLevel::Low, None),
        ),
    ];
    for (job, rank, mut g) in reports {
        if (job, rank) == ("train", 0) {
            // As a sidecar injected before the packed timeline writes it:
            // the CLI must still draw it (docs/api.md).
            g.legacy_timeline = std::mem::take(&mut g.timeline);
        }
        let r = rank_report(client, ns, job, rank, &ago(u64::from(rank)), vec![g]).await;
        apply_report(client, ns, &r).await;
    }
    let profiles: Api<MemoryProfile> = Api::namespaced(client.clone(), ns);
    for (job, ranks) in [("train", 2), ("calm", 1)] {
        eventually(&format!("{job} rolled up"), || async {
            let p = profiles.get_opt(job).await.map_err(|e| e.to_string())?;
            match p.and_then(|p| p.status) {
                Some(st) if st.ranks_reporting == ranks => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    }
}

/// RFC 3339 timestamp `seconds` before now, in whole seconds: a report
/// that fresh is not stale (the two Jobs' ranks are alive).
pub fn ago(seconds: u64) -> String {
    let now = jiff::Timestamp::now().as_second();
    jiff::Timestamp::from_second(now - seconds as i64)
        .unwrap()
        .to_string()
}

pub fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}):\n{text}"))
}

pub fn yaml(text: &str) -> Value {
    serde_yaml::from_str(text).unwrap_or_else(|e| panic!("not YAML ({e}):\n{text}"))
}

/// A temporary directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new() -> Self {
        let p = std::env::temp_dir().join(format!("memprof-cli-test-{}", random_suffix()));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The test cluster's kubeconfig with every context's namespace set to `ns`
/// (and, with `server`, pointed elsewhere).
pub fn kubeconfig_copy(dir: &Path, ns: &str, server: Option<&str>) -> PathBuf {
    let src = std::env::var("KUBECONFIG").expect("KUBECONFIG is set for cluster tests");
    let mut kc: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(src).unwrap()).unwrap();
    for ctx in kc["contexts"].as_sequence_mut().unwrap() {
        ctx["context"]["namespace"] = ns.into();
    }
    if let Some(server) = server {
        for c in kc["clusters"].as_sequence_mut().unwrap() {
            c["cluster"]["server"] = server.into();
        }
    }
    let path = dir.join("kubeconfig");
    std::fs::write(&path, serde_yaml::to_string(&kc).unwrap()).unwrap();
    path
}
