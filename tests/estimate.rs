//! `memprof estimate` end to end against a stub Python: a shell script
//! standing in for `python -m memprof_agent.estimate`, printing the JSON
//! contract (agent/python/memprof_agent/estimate/contract.py) as the real
//! one would. No torch, no GPU: what is checked is this side — the verdict,
//! its rounding, the exit codes and the one-line errors.

use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;
use std::process::{Command, Output};

const MEMPROF: &str = env!("CARGO_BIN_EXE_memprof");
const GIB: u64 = 1 << 30;

/// A temporary directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let p =
            std::env::temp_dir().join(format!("memprof-estimate-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("temp dir");
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn agent() -> String {
    format!("{}/agent/python", env!("CARGO_MANIFEST_DIR"))
}

fn answer(reserved: u64, error: Option<&str>) -> String {
    let rank = match error {
        Some(e) => format!(r#"{{"error":"{e}","at":"train.py:3"}}"#),
        None => format!(
            r#"{{"parametersBytes":{p},"buffersBytes":0,"gradientsBytes":{p},"optimizerBytes":{o},
              "activationsBytes":{a},"temporariesBytes":0,"otherBytes":0,"trackedPeakBytes":{t},
              "allocatedPeakBytes":{t},"reservedPeakBytes":{reserved},"segments":3,"stepsRun":2,"value":null}}"#,
            p = GIB,
            o = 2 * GIB,
            a = reserved.saturating_sub(4 * GIB),
            t = reserved
        ),
    };
    format!(
        r#"{{"kind":"memprofEstimateRun","version":1,"torch":"2.11.0","tracker":"MemTracker","worldSize":1,"steps":2,"rank":{rank},"vary":null,"seconds":1.5}}"#
    )
}

/// A stub interpreter: records its arguments in `args`, prints `stdout`, exits `code`.
fn stub(dir: &TempDir, stdout: &str, code: i32) -> String {
    let path = dir.0.join("python3");
    let args = dir.0.join("args");
    let body = format!(
        "#!/bin/sh\necho \"$@\" > '{}'\ncat <<'JSON'\n{stdout}\nJSON\nexit {code}\n",
        args.display()
    );
    std::fs::write(&path, body).expect("stub");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path.display().to_string()
}

fn estimate(python: &str, flags: &[&str], command: &[&str]) -> Output {
    Command::new(MEMPROF)
        .arg("estimate")
        .args(["--agent-path", &agent(), "--python", python])
        .args(flags)
        .arg("--")
        .args(command)
        .output()
        .expect("memprof runs")
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into(),
        String::from_utf8_lossy(&o.stderr).into(),
    )
}

#[test]
fn a_run_that_fits_says_so_and_exits_0() {
    let dir = TempDir::new("fits");
    let py = stub(&dir, &answer(20 * GIB, None), 0);
    let o = estimate(&py, &["--gpu", "H100-80GB"], &["train.py"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    assert!(
        out.contains("verdict: fits with ") && out.contains("GiB to spare"),
        "{out}"
    );
    assert_eq!(
        admission_warning(&out),
        None,
        "a fit is not warned of: {out}"
    );
    assert!(
        out.contains("CUDA context") && out.contains("measured on NVIDIA H200"),
        "{out}"
    );
    assert!(out.contains("expected error: median"), "{out}");
    let args = std::fs::read_to_string(dir.0.join("args")).unwrap();
    assert!(
        args.starts_with("-m memprof_agent.estimate --steps 2 --world-size 1"),
        "{args}"
    );
    assert!(args.trim_end().ends_with("-- train.py"), "{args}");
}

#[test]
fn vary_prints_the_largest_value_that_fits_and_passes_the_budget() {
    let dir = TempDir::new("vary");
    let run = answer(20 * GIB, None);
    let vary = r#""vary":{"name":"BATCH","budgetBytes":1,"tried":[{"value":"8","fits":true},{"value":"32","fits":false},{"value":"16","fits":true}],"largest":"16"}"#;
    let py = stub(&dir, &run.replace(r#""vary":null"#, vary), 0);
    let o = estimate(&py, &["--vary", "BATCH=8,16,32"], &["train.py"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    assert!(
        out.contains("largest BATCH that fits: 16 (tried 8 fits, 32 does not, 16 fits)"),
        "{out}"
    );
    let args = std::fs::read_to_string(dir.0.join("args")).unwrap();
    assert!(
        args.contains("--vary BATCH=8,16,32") && args.contains("--budget-bytes "),
        "{args}"
    );
}

#[test]
fn a_run_that_does_not_fit_says_how_much_more_and_exits_2() {
    let dir = TempDir::new("short");
    let py = stub(&dir, &answer(90 * GIB, None), 0);
    let o = estimate(&py, &["--gpu", "80GiB"], &["train.py"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}{err}");
    assert!(
        out.contains("verdict: needs ") && out.contains("GiB more"),
        "{out}"
    );
    // The annotations it prints make the webhook warn at admission.
    assert_eq!(
        admission_warning(&out).map(|w| w.contains("exceeds the GPU's 80.0GiB")),
        Some(true),
        "{out}"
    );
}

/// What the webhook says of a Job carrying the annotations `out` printed.
fn admission_warning(out: &str) -> Option<String> {
    let value = |key: &str| {
        let line = out.lines().find(|l| l.trim_start().starts_with(key))?;
        Some(
            line.split_once(": ")?
                .1
                .trim()
                .trim_matches('"')
                .to_string(),
        )
    };
    let pairs: Vec<(&str, String)> = [
        "memprof.dev/predicted-peak",
        "memprof.dev/gpu-memory",
        "memprof.dev/predicted-by",
    ]
    .into_iter()
    .filter_map(|k| Some((k, value(k)?)))
    .collect();
    assert_eq!(pairs.len(), 3, "{out}");
    memprof::webhook::prediction::warning(|k| {
        pairs
            .iter()
            .find(|(key, _)| *key == k)
            .map(|(_, v)| v.as_str())
    })
}

#[test]
fn json_output_carries_the_parts_and_the_verdict() {
    let dir = TempDir::new("json");
    let py = stub(&dir, &answer(10 * GIB, None), 0);
    let o = estimate(&py, &["--gpu", "H200", "-o", "json"], &["train.py"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(v["kind"], "memprofEstimate");
    assert_eq!(v["verdict"]["fits"], true);
    assert_eq!(v["ranks"][0]["reservedPeakBytes"], 10 * GIB);
    assert!(v["ranks"][0]["contextBytes"].as_u64().unwrap() > 0);
    let upper = v["verdict"]["upperBoundBytes"].as_u64().unwrap();
    assert!(
        upper > v["verdict"]["predictedBytes"].as_u64().unwrap(),
        "the margin widens the peak"
    );
    assert!(v["accuracy"]["heldOut"].as_u64().unwrap() >= 5);
}

#[test]
fn torchrun_ranks_reach_the_estimator_and_add_nccl() {
    let dir = TempDir::new("torchrun");
    let py = stub(&dir, &answer(10 * GIB, None), 0);
    let o = estimate(
        &py,
        &["-o", "json"],
        &["torchrun", "--nproc_per_node", "8", "train.py", "--bs", "4"],
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(v["worldSize"], 8);
    assert!(v["ranks"][0]["ncclBytes"].as_u64().unwrap() > 0);
    let args = std::fs::read_to_string(dir.0.join("args")).unwrap();
    assert!(
        args.contains("--world-size 8") && args.trim_end().ends_with("-- train.py --bs 4"),
        "{args}"
    );
}

#[test]
fn a_script_that_fails_under_fake_tensors_is_one_line_and_exit_1() {
    let dir = TempDir::new("fails");
    let py = stub(&dir, &answer(0, Some("RuntimeError: boom")), 3);
    let o = estimate(&py, &[], &["train.py"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("the script failed under fake tensors at train.py:3: RuntimeError: boom"),
        "{err}"
    );
    assert!(err.contains("train.py` runs"), "{err}");
}

#[test]
fn a_missing_python_says_to_pass_one() {
    let o = estimate("/nonexistent/python3", &[], &["train.py"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("cannot start") && err.contains("--python"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

#[test]
fn a_python_without_the_estimator_says_to_check_torch() {
    let dir = TempDir::new("noanswer");
    let py = stub(&dir, "Traceback: no module named torch", 1);
    let o = estimate(&py, &[], &["train.py"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("printed no answer") && err.contains("import torch"),
        "{err}"
    );
}

#[test]
fn an_unknown_gpu_names_the_known_ones() {
    let o = estimate("python3", &["--gpu", "H300"], &["train.py"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("unknown --gpu \"H300\"")
            && err.contains("H100-80GB")
            && err.contains("80GiB"),
        "{err}"
    );
}

#[test]
fn no_command_says_where_it_goes() {
    let o = Command::new(MEMPROF)
        .args(["estimate", "--agent-path", &agent()])
        .output()
        .unwrap();
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("put it after --"), "{err}");
}

#[test]
fn accuracy_lists_the_recorded_runs() {
    let o = Command::new(MEMPROF)
        .args(["estimate", "--accuracy"])
        .output()
        .unwrap();
    let (out, _) = text(&o);
    assert_eq!(o.status.code(), Some(0));
    assert!(
        out.contains("held-out") && out.contains("lora-") && out.contains("cnn-"),
        "{out}"
    );
}

#[test]
fn a_calibration_of_ones_own_replaces_the_recorded_one() {
    let dir = TempDir::new("calibration");
    let file = dir.0.join("calibration.json");
    let point = |name: &str, split: &str, est: u64, real: u64| {
        format!(
            r#"{{"name":"{name}","split":"{split}","real":{{"allocated":{real},"reserved":{real}}},
               "estimate":{{"allocatedPeakBytes":{est},"reservedPeakBytes":{est}}}}}"#
        )
    };
    let own = format!(
        r#"{{"gpu":"Our A100","torch":"2.5.1","constants":{{"contextBytes":500000000,"workspaceBytes":8388608,"ncclBytes":null}},
            "points":[{},{}]}}"#,
        point("ours-fit", "calibration", 95, 100),
        point("ours-held", "held-out", 90, 100)
    );
    std::fs::write(&file, own).unwrap();
    let path = file.display().to_string();
    let o = Command::new(MEMPROF)
        .args(["estimate", "--accuracy", "--calibration", &path])
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        out.contains("recorded on Our A100") && out.contains("ours-held"),
        "{out}"
    );
    assert!(
        out.contains("worst under-estimate 10.0 % allocated, 10.0 % reserved"),
        "{out}"
    );
    assert!(out.contains("would have called ours-held fitting"), "{out}");

    std::fs::write(&file, "{}").unwrap();
    let o = Command::new(MEMPROF)
        .args(["estimate", "--accuracy", "--calibration", &path])
        .output()
        .unwrap();
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("cannot use --calibration") && err.contains("estimate_calibrate.py"),
        "{err}"
    );
}
