//! `scaleBatch` `mode: fit` end to end against the local control plane
//! (kube-apiserver and kube-controller-manager 1.20: the Job controller makes
//! pods, nothing runs them). Each pod's sidecar is the real `memprof-sidecar`
//! with the sim backend, run here as a process, whose scenario makes memory
//! follow the `BATCH_SIZE` in its environment: 66.5 GiB + 0.2 GiB per sample
//! on an 80 GiB GPU.
//!
//!     cargo build -p memprof-sidecar
//!     eval "$(bash hack/local-cluster.sh env)"
//!     MEMPROF_REQUIRE_CLUSTER=1 cargo test --test integration batch_fit::
//!
//! Without `KUBECONFIG` the test is skipped with a message.

use crate::common;
use crate::remediation_support;
use crate::webhook_support;

use common::*;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::{Client, ResourceExt};
use memprof::api::{BatchRecommendation, MemoryProfile};
use remediation_support::*;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// Memory that does not grow with the batch, GiB.
const STATIC_GIB: f64 = 66.5;
/// Activations per sample, GiB.
const PER_SAMPLE_GIB: f64 = 0.2;
/// The simulated GPU, GiB.
const TOTAL_GIB: f64 = 80.0;

/// No noise, and activations held at their peak for 90 % of each 4 s step,
/// so that the sampled peak is the true one (a sawtooth's is only approached).
fn scenario_yaml() -> String {
    format!(
        "seed: 1\ntotalGiB: {TOTAL_GIB}\n\
         default: {{ periodSeconds: 4, holdFraction: 0.9, noiseGiB: 0 }}\n\
         batch: {{ env: BATCH_SIZE, staticGiB: {STATIC_GIB}, perSampleGiB: {PER_SAMPLE_GIB} }}\n"
    )
}

/// `memprof-sidecar` next to this package's binaries (`cargo build -p memprof-sidecar`).
fn sidecar_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("MEMPROF_SIDECAR_BIN") {
        return p.into();
    }
    let p = Path::new(env!("CARGO_BIN_EXE_memprof-operator")).with_file_name("memprof-sidecar");
    assert!(
        p.exists(),
        "{} is missing: run `cargo build -p memprof-sidecar` first (or set MEMPROF_SIDECAR_BIN)",
        p.display()
    );
    p
}

/// A sim sidecar of one pod, stopped (by its PID) and its scenario file removed when dropped.
struct Sidecar {
    child: Child,
    scenario: PathBuf,
    kubeconfig: PathBuf,
}

impl Sidecar {
    /// The sidecar of `pod` (rank 0 of Job `job`), with `BATCH_SIZE` in its
    /// environment, writing as its pod (a token bound to it).
    async fn start(client: &Client, ns: &str, pod: &Pod, job: &str, batch: &str) -> Self {
        let kubeconfig =
            kubeconfig_bound_to(client, ns, &pod.name_any(), &pod.uid().unwrap()).await;
        let scenario = std::env::temp_dir().join(format!(
            "memprof-batch-fit-{}.yaml",
            common::random_suffix()
        ));
        std::fs::write(&scenario, scenario_yaml()).expect("writing the scenario");
        let child = Command::new(sidecar_binary())
            .args(["--backend", "sim", "--speed", "10", "--interval", "100ms"])
            .arg("--scenario")
            .arg(&scenario)
            .args(["--listen", "127.0.0.1:0"])
            .env("KUBECONFIG", &kubeconfig)
            .env("POD_NAME", pod.name_any())
            .env("POD_UID", pod.uid().unwrap())
            .env("POD_NAMESPACE", ns)
            .env("NODE_NAME", "node-a")
            .env("MEMPROF_JOB_NAME", job)
            .env("RANK", "0")
            .env("BATCH_SIZE", batch)
            .env("MEMPROF_HEARTBEAT_SECONDS", "5")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawning memprof-sidecar");
        Sidecar {
            child,
            scenario,
            kubeconfig,
        }
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.scenario);
        let _ = std::fs::remove_file(&self.kubeconfig);
    }
}

/// Waits for the Job `name` to be a new one (not `old_uid`) with a `BATCH_SIZE`
/// other than `old_batch`, and returns it.
async fn recreated(client: &Client, ns: &str, old_uid: &str, old_batch: &str) -> Job {
    eventually("the Job recreated with a new BATCH_SIZE", || async {
        match job(client, ns, "train").await {
            Some(j) if j.uid().as_deref() != Some(old_uid) => {
                let b = env_of(&j, "BATCH_SIZE");
                (b.as_deref() != Some(old_batch))
                    .then_some(j)
                    .ok_or(format!("{b:?}"))
            }
            other => Err(format!("{:?}", other.map(|j| j.uid()))),
        }
    })
    .await
}

/// The line through the observed peaks (least squares, computed here),
/// and its prediction at `batch`, bytes.
fn line_at(rec: &BatchRecommendation, batch: u64) -> f64 {
    let pts: Vec<(f64, f64)> = rec
        .observations
        .iter()
        .map(|o| (o.batch as f64, o.peak_bytes as f64))
        .collect();
    let n = pts.len() as f64;
    let (mx, my) = (
        pts.iter().map(|p| p.0).sum::<f64>() / n,
        pts.iter().map(|p| p.1).sum::<f64>() / n,
    );
    let sxy: f64 = pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let sxx: f64 = pts.iter().map(|p| (p.0 - mx).powi(2)).sum();
    my + sxy / sxx * (batch as f64 - mx)
}

#[tokio::test]
async fn mode_fit_acts_only_on_a_batch_the_evidence_backs() {
    let Some(client) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&client).await;
    let ns = ns.name.as_str();
    let operator = start_operator(&client, ns);
    let _writers = webhook_support::serve_writers(&client, ns, admission_keys(ns).await).await;
    let policy = json!({
        "selector": {"matchLabels": {"team": "ml"}},
        "triggers": [{"riskAtLeast": {"level": "medium"}}],
        "actions": [{"scaleBatch": {"env": "BATCH_SIZE", "factor": 0.75, "minimum": 4, "mode": "fit"}}],
        "cooldownSeconds": 0,
        "maxRemediations": 3,
    });
    apply_policy(&client, ns, "fit", policy).await.unwrap();

    // 1. At 64 the GPU peaks at 79.3 GiB (99 %): critical. One batch size
    //    seen and no agent breakdown: too little evidence, so the factor.
    let first = training_job(&client, ns, "train", Some("64")).await;
    let pod = first_pod(&client, ns, "train").await;
    let sidecar = Sidecar::start(&client, ns, &pod, "train", "64").await;
    let second = recreated(&client, ns, &first.uid().unwrap(), "64").await;
    drop(sidecar);
    assert_eq!(env_of(&second, "BATCH_SIZE").as_deref(), Some("48"));
    let recs = records(&client, ns, "train").await;
    assert!(
        recs[0]
            .action
            .starts_with("scaleBatch BATCH_SIZE 64->48 (fit: too little evidence, factor 0.75)"),
        "{recs:?}"
    );

    // 2. At 48 it peaks at 76.1 GiB (95 %): high. Batch 64's peak survived
    //    the recreation: two batch sizes, a line through them that says 25
    //    fits. 25 is 23 below the smallest batch measured, and two points
    //    leave nothing to hold out: not backed, so the factor again.
    let pod = job_pods(&client, ns, "train", 1).await.remove(0);
    let sidecar = Sidecar::start(&client, ns, &pod, "train", "48").await;
    let third = recreated(&client, ns, &second.uid().unwrap(), "48").await;
    drop(sidecar);
    assert_eq!(env_of(&third, "BATCH_SIZE").as_deref(), Some("36"));
    let recs = records(&client, ns, "train").await;
    let profiles = Api::<MemoryProfile>::namespaced(client.clone(), ns);
    assert!(
        recs[1].action.starts_with(
            "scaleBatch BATCH_SIZE 48->36 (fit: not backed by the measured batches, factor 0.75)"
        ),
        "{recs:?}\n{:?}",
        profiles.get("train").await.unwrap().status
    );
    eventually("two BatchFitFallback Events", || async {
        let n = count_events(&client, ns, "BatchFitFallback", "train").await;
        (n >= 2).then_some(()).ok_or(format!("{n} events"))
    })
    .await;

    // 3. At 36 it peaks at 73.7 GiB (92 %): medium. Three batch sizes: each
    //    predicted from the other two, so the line is backed one step (12)
    //    below 36, and the fit applies.
    let pod = job_pods(&client, ns, "train", 1).await.remove(0);
    let sidecar = Sidecar::start(&client, ns, &pod, "train", "36").await;
    let fourth = recreated(&client, ns, &third.uid().unwrap(), "36").await;
    drop(sidecar);
    let fitted: u64 = env_of(&fourth, "BATCH_SIZE").unwrap().parse().unwrap();

    let rec = profiles
        .get("train")
        .await
        .unwrap()
        .status
        .unwrap()
        .batch_recommendation
        .expect("a batchRecommendation");
    assert_eq!(rec.method, "twoBatchSizes", "{rec:?}");
    assert_eq!(rec.observations.len(), 3, "{rec:?}");
    let target = 0.9 * TOTAL_GIB * (1u64 << 30) as f64;
    assert!(
        (24..36).contains(&fitted),
        "within one held-out step below 36: {fitted}"
    );
    assert!(
        line_at(&rec, fitted) <= target,
        "the line through the peaks fits {fitted}"
    );
    let truth = STATIC_GIB + PER_SAMPLE_GIB * fitted as f64;
    assert!(
        truth <= 0.9 * TOTAL_GIB,
        "and so does the scenario: {truth} GiB"
    );
    assert_ne!(fitted, 27, "not the factor (36 × 0.75)");
    let recs = records(&client, ns, "train").await;
    assert_eq!(recs.len(), 3, "{recs:?}");
    assert!(
        recs[2].action.starts_with(&format!(
            "scaleBatch BATCH_SIZE 36->{fitted} (fit twoBatchSizes: "
        )) && recs[2].action.contains("extrapolated"),
        "{recs:?}"
    );
    operator.stop().await;
}
