//! A profiled run adds a calibration point: `memprof estimate --points
//! FILE -- COMMAND` (a stub Python answering as the estimator would, as in
//! tests/estimate.rs) records its estimate; `memprof profile --points FILE
//! -- python3 COMMAND` (the sidecar on a simulation, the trainer on the
//! agent's fake torch) adds what the trainer's allocator measured; `memprof
//! estimate --accuracy --points FILE` then reports the error on it. No
//! cluster, no GPU.

use crate::cli_support::{texts, TempDir, BIN};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

const GIB: u64 = 1 << 30;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A stub interpreter printing the estimator's answer: 11 GiB allocated,
/// 11.5 GiB reserved at the peak.
fn stub(dir: &Path) -> String {
    let rank = format!(
        r#"{{"parametersBytes":{g},"buffersBytes":0,"gradientsBytes":{g},"optimizerBytes":{g},
           "activationsBytes":{g},"temporariesBytes":0,"otherBytes":0,"trackedPeakBytes":{a},
           "allocatedPeakBytes":{a},"reservedPeakBytes":{r},"segments":3,"stepsRun":2,"value":null}}"#,
        g = GIB,
        a = 11 * GIB,
        r = 23 * GIB / 2
    );
    let answer = format!(
        r#"{{"kind":"memprofEstimateRun","version":1,"torch":"2.11.0","tracker":"MemTracker","worldSize":1,"steps":2,"rank":{rank},"vary":null,"seconds":0.5}}"#
    );
    let path = dir.join("python3");
    std::fs::write(&path, format!("#!/bin/sh\ncat <<'JSON'\n{answer}\nJSON\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.display().to_string()
}

/// The trainer's command, its script given as the user would type it.
fn trainer() -> Vec<String> {
    let script = root().join("tests/cli_support/steady_trainer.py");
    let fake_torch = root().join("agent/python/tests");
    [script, fake_torch]
        .iter()
        .map(|p| p.display().to_string())
        .chain(["2".to_string()])
        .collect()
}

#[test]
fn a_profiled_run_adds_a_point_that_the_estimates_error_counts() {
    let dir = TempDir::new();
    let points = dir.0.join("points.json");
    let agent = root().join("agent/python");
    let estimated = Command::new(BIN)
        .args(["estimate", "--gpu", "H100-80GB", "--python", &stub(&dir.0)])
        .arg("--agent-path")
        .arg(&agent)
        .arg("--points")
        .arg(&points)
        .arg("--")
        .args(trainer())
        .output()
        .unwrap();
    let (out, err) = texts(&estimated);
    assert_eq!(estimated.status.code(), Some(0), "{out}{err}");
    assert!(err.contains("recorded in"), "{err}");

    let profiled = Command::new(BIN)
        .args(["profile", "--backend", "sim", "--interval", "200ms"])
        .arg("--scenario")
        .arg(root().join("hack/scenarios/demo.yaml"))
        .arg("--agent-path")
        .arg(&agent)
        .arg("--points")
        .arg(&points)
        .arg("--")
        .arg("python3")
        .args(trainer())
        .env_remove("MEMPROF_AGENT_SOCKET")
        .env_remove("MEMPROF_AGENT_URL")
        .output()
        .unwrap();
    let (out, err) = texts(&profiled);
    assert!(profiled.status.success(), "{out}{err}");
    // Estimated 11.5 GiB reserved, measured 12 GiB: 4.2 % under.
    assert!(
        err.contains("point added to") && err.contains("(-4.2%"),
        "{err}"
    );

    let accuracy = Command::new(BIN)
        .args(["estimate", "--accuracy", "--points"])
        .arg(&points)
        .output()
        .unwrap();
    let (out, err) = texts(&accuracy);
    assert!(accuracy.status.success(), "{err}");
    let row = out.lines().find(|l| l.contains("profiled")).unwrap_or("");
    assert!(
        row.contains("steady_trainer") && row.contains("-4.2%"),
        "{out}"
    );
    assert!(out.contains("(1 of them profiled runs, --points)"), "{out}");
}
