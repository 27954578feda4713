//! The seed tools' last gaps, as a user meets them: the
//! fragmentation trend drawn (`memprof fragment --plot`), the OOM snapshot
//! exported as the pickle PyTorch's memory_viz opens (`--oom-snapshot` of
//! `profile` and `rollup`, read back by Python's own `pickle`), and the demo
//! built as the tests build it. No cluster; `profile` needs `cargo build -p
//! memprof-sidecar` and python3.
//!
//! `tests/cli_support/oom-rank0.json` is what `memprof profile --backend sim
//! --interval 1s --output` wrote around `tests/cli_support/oom_trainer.py
//! agent/python/tests 62` (MEMPROF_AGENT_RECORD_HISTORY=1): a minute of a
//! cache growing from 21 % to 75 % of reserved memory, then a CUDA OOM.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const MEMPROF: &str = env!("CARGO_BIN_EXE_memprof");

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn fixture() -> PathBuf {
    root().join("tests/cli_support/oom-rank0.json")
}

/// A temporary directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("memprof-gaps-{name}-{}", std::process::id()));
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

fn run(args: &[&std::ffi::OsStr]) -> (Output, String, String) {
    let out = Command::new(MEMPROF)
        .args(args)
        .output()
        .expect("memprof runs");
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    (out, o, e)
}

macro_rules! os {
    ($($a:expr),* $(,)?) => { [$(std::ffi::OsStr::new($a)),*] };
}

#[test]
fn fragment_draws_the_trend_it_shows_as_a_sparkline() {
    let dir = TempDir::new("fragment");
    // A folder that does not exist yet is made, as for every other output.
    let svg = dir.0.join("plots/fragment.svg");
    let (out, stdout, stderr) = run(&os![
        "fragment",
        fixture().as_os_str(),
        "--plot",
        svg.as_os_str()
    ]);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("(7 points, 0-100%)"), "{stdout}");
    assert!(
        stdout.contains(&format!("plot written to {}", svg.display())),
        "{stdout}"
    );
    let text = std::fs::read_to_string(&svg).expect("the chart");
    assert!(
        text.starts_with("<svg") || text.starts_with("<?xml"),
        "{text}"
    );
    for want in [
        "Fragmentation over the run",
        "vm cache",
        "vm inactive split",
        "(%)",
    ] {
        assert!(text.contains(want), "{want:?} not in the chart");
    }
    let png = dir.0.join("fragment.png");
    let (out, _, stderr) = run(&os![
        "fragment",
        fixture().as_os_str(),
        "--plot",
        png.as_os_str()
    ]);
    assert!(out.status.success(), "{stderr}");
    assert!(std::fs::read(&png).unwrap().starts_with(b"\x89PNG"));

    // The name is checked before any report is read.
    let (out, stdout, stderr) = run(&os!["fragment", "missing.json", "--plot", "trend.txt"]);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stderr.contains("--plot trend.txt: name a .svg or .png file"),
        "{stderr}"
    );
    assert!(!stderr.contains("missing.json"), "{stderr}");
}

/// Python's pickle reads the file back; the check prints what it found.
fn load_pickle(path: &Path) -> serde_json::Value {
    let py = r#"
import json, pickle, sys
d = pickle.load(open(sys.argv[1], "rb"))
assert set(d) == {"segments", "device_traces"}, d.keys()
assert isinstance(d["device_traces"], list) and all(t == [] for t in d["device_traces"])
for s in d["segments"]:
    for k in ("device", "address", "total_size", "allocated_size", "active_size", "stream", "segment_type", "blocks"):
        assert k in s, k
    assert sum(b["size"] for b in s["blocks"]) == s["total_size"]
    assert s["segment_pool_id"] == (0, 0) and isinstance(s["frames"], list)
    for b in s["blocks"]:
        assert b["state"] in ("active_allocated", "active_pending_free", "inactive")
        assert isinstance(b["address"], int) and isinstance(b["requested_size"], int)
        for f in b["frames"]:
            assert set(f) == {"filename", "line", "name"} and isinstance(f["line"], int)
json.dump(d, sys.stdout)
"#;
    let out = Command::new("python3")
        .args(["-c", py])
        .arg(path)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "pickle.load: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn rollup_exports_the_newest_oom_as_memory_viz_reads_it() {
    let dir = TempDir::new("rollup");
    let file = dir.0.join("snapshots/oom.pickle");
    let (out, stdout, stderr) = run(&os![
        "rollup",
        fixture().as_os_str(),
        "--oom-snapshot",
        file.as_os_str()
    ]);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("4 block(s)) written to") && stderr.contains("pytorch.org/memory_viz"),
        "{stderr}"
    );
    let d = load_pickle(&file);
    let segs = d["segments"].as_array().unwrap();
    // The roll-up keeps the 4 largest blocks of the newest OOM, largest first.
    assert_eq!(segs.len(), 4);
    assert_eq!(segs[0]["total_size"], 6u64 << 30);
    assert_eq!(segs[0]["segment_type"], "large");
    assert_eq!(segs[2]["segment_type"], "small");
    assert_eq!(
        segs[0]["blocks"][0]["frames"][0],
        serde_json::json!({"filename": "train.py", "line": 42, "name": "leak"})
    );
    assert_eq!(d["device_traces"], serde_json::json!([[]]));

    // Reports without an OOM: said, nothing written, still a roll-up.
    let calm = dir.0.join("calm.json");
    let mut spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture()).unwrap()).unwrap();
    spec["allocator"].as_object_mut().unwrap().remove("oom");
    std::fs::write(&calm, spec.to_string()).unwrap();
    let none = dir.0.join("none.pickle");
    let (out, _, stderr) = run(&os![
        "rollup",
        calm.as_os_str(),
        "--oom-snapshot",
        none.as_os_str()
    ]);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("no report holds a CUDA OOM, nothing written to"),
        "{stderr}"
    );
    assert!(!none.exists());
}

#[test]
fn profile_exports_the_agents_oom_snapshot_after_the_run() {
    let sidecar = Path::new(MEMPROF).with_file_name("memprof-sidecar");
    assert!(
        sidecar.is_file(),
        "run `cargo build -p memprof-sidecar` first"
    );
    let dir = TempDir::new("profile");
    let scen = dir.0.join("scenario.yaml");
    std::fs::write(
        &scen,
        "seed: 5\ntotalGiB: 80\ngpusPerRank: 1\ndefault: { baseGiB: 30, amplitudeGiB: 4, periodSeconds: 2, noiseGiB: 0.1 }\n",
    )
    .unwrap();
    let file = dir.0.join("out/oom.pickle");
    let out = Command::new(MEMPROF)
        .args(["profile", "--backend", "sim", "--interval", "200ms"])
        .arg("--scenario")
        .arg(&scen)
        .arg("--agent-path")
        .arg(root().join("agent/python"))
        .arg("--oom-snapshot")
        .arg(&file)
        .args(["--", "python3"])
        .arg(root().join("tests/cli_support/oom_trainer.py"))
        .arg(root().join("agent/python/tests"))
        .arg("3")
        .env("MEMPROF_AGENT_RECORD_HISTORY", "1")
        .env_remove("MEMPROF_AGENT_SOCKET")
        .env_remove("MEMPROF_AGENT_URL")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("8 block(s)) written to"), "{stdout}");
    let d = load_pickle(&file);
    let segs = d["segments"].as_array().unwrap();
    // The report keeps the 8 largest blocks (the roll-up 4).
    assert_eq!(segs.len(), 8);
    assert_eq!(segs[1]["blocks"][0]["frames"][0]["name"], "forward");
    assert_eq!(segs[1]["blocks"][0]["size"], 512u64 << 20);
}

#[test]
fn watch_checks_where_its_keys_save_before_it_starts() {
    let dir = TempDir::new("watch");
    let file = dir.0.join("a-file");
    std::fs::write(&file, "").unwrap();
    let (out, _, stderr) = run(&os!["watch", "--save-dir", file.as_os_str()]);
    assert!(!out.status.success());
    assert!(
        stderr.contains(&format!(
            "--save-dir {}: is a file, not a folder",
            file.display()
        )),
        "{stderr}"
    );
    let help = run(&os!["watch", "--help"]).1;
    assert!(help.contains("--save-dir <DIR>"), "{help}");
}

/// The `cargo ...` line of a script that starts with `prefix`, as words.
fn script_line(script: &str, prefix: &str) -> Vec<String> {
    let text = std::fs::read_to_string(root().join(script)).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no `{prefix}` line in {script}"));
    line.split_whitespace()
        .map(|w| w.trim_matches('"').to_string())
        .collect()
}

/// What cargo would build for `args` (cargo's unit graph), each unit as
/// package, target, kind, mode, features and profile settings: equal units
/// are one artifact, built once.
fn plan(args: &[String]) -> std::collections::BTreeSet<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // Without `cargo`, and without what follows `--` (the test binaries' flags).
    let mut args: Vec<String> = args[1..]
        .iter()
        .take_while(|w| *w != "--")
        .cloned()
        .collect();
    if args[0] == "test" {
        args.push("--no-run".into());
    }
    let out = Command::new(cargo)
        .args(&args)
        .args(["--unit-graph", "-Z", "unstable-options"])
        // The unit graph is an unstable flag; stable cargo prints it when told to.
        .env("RUSTC_BOOTSTRAP", "1")
        .current_dir(root())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo {args:?} --unit-graph: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let g: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    g["units"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| {
            let mut profile = u["profile"].clone();
            // `dev` and `test` name the same settings for a dependency.
            profile.as_object_mut().unwrap().remove("name");
            format!(
                "{} {} {} {} [{}] {profile}",
                u["pkg_id"], u["target"]["name"], u["target"]["kind"], u["mode"], u["features"]
            )
        })
        .collect()
}

#[test]
fn the_demo_builds_what_the_tests_build_and_shows_cargos_progress() {
    let demo = script_line("hack/demo.sh", "cargo build");
    assert!(
        !demo.iter().any(|w| w == "--quiet" || w == "-q"),
        "the demo's build shows cargo's progress: {demo:?}"
    );
    let demo_text = std::fs::read_to_string(root().join("hack/demo.sh")).unwrap();
    let opening = demo_text
        .find("log \"memprof demo: ")
        .expect("an opening line");
    assert!(
        opening < demo_text.find("cargo build").unwrap()
            && demo_text.contains("the first run takes 20-30 minutes"),
        "the demo says up front how long its first run takes"
    );
    let test_build = script_line("hack/test.sh", "cargo build");
    let unit = script_line("hack/test.sh", "cargo test --workspace --lib");
    let integration = script_line("hack/test.sh", "cargo test --workspace --test");
    let (demo, test_build, unit, integration) = (
        plan(&demo),
        plan(&test_build),
        plan(&unit),
        plan(&integration),
    );
    // `make test` after `make demo`: every artifact of the demo is one the
    // tests build too (the same binaries, the same crates under them).
    let extra: Vec<_> = demo.difference(&test_build).collect();
    assert!(
        extra.is_empty(),
        "the demo builds what hack/test.sh's build does not: {extra:#?}"
    );
    // Within `make test`: the binaries for the agent's tests add no second
    // build of a crate the unit and integration tests use.
    let libs = |p: &std::collections::BTreeSet<String>| -> std::collections::BTreeSet<String> {
        p.iter()
            .filter(|u| u.contains("\"build\"") && !u.contains("[\"bin\"]"))
            .cloned()
            .collect()
    };
    let tested: std::collections::BTreeSet<String> =
        libs(&unit).union(&libs(&integration)).cloned().collect();
    let second: Vec<_> = libs(&test_build).difference(&tested).cloned().collect();
    assert!(
        second.is_empty(),
        "built twice (other features): {second:#?}"
    );
}

#[test]
fn report_checks_its_oom_snapshot_path_before_the_cluster_and_needs_a_job() {
    let dir = TempDir::new("report");
    let file = dir.0.join("a-file");
    std::fs::write(&file, "").unwrap();
    let inside = file.join("oom.pickle");
    let out = Command::new(MEMPROF)
        .args(["report", "train", "--oom-snapshot"])
        .arg(&inside)
        .env("KUBECONFIG", dir.0.join("no-such-kubeconfig"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(&format!(
            "--oom-snapshot {}: cannot create the folder",
            inside.display()
        )),
        "checked before connecting: {stderr}"
    );
    let (out, _, stderr) = run(&os!["report", "--oom-snapshot", "x.pickle"]);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("<JOB>"), "{stderr}");
}

/// The model analysis' rows and DP-SGD's part, as `profile` shows them
/// after a run and writes them to `--output` (a ghost-clipping trainer on
/// the fake torch: every parameter holds `_norm_sample`).
#[test]
fn profile_shows_the_largest_parameters_layers_and_dp_sgd_in_text_and_json() {
    let dir = TempDir::new("rows");
    let json = dir.0.join("out.json");
    let out = Command::new(MEMPROF)
        .args(["profile", "--backend", "sim", "--interval", "200ms"])
        .arg("--scenario")
        .arg(root().join("hack/scenarios/demo.yaml"))
        .arg("--agent-path")
        .arg(root().join("agent/python"))
        .arg("--output")
        .arg(&json)
        .args(["--", "python3"])
        .arg(root().join("tests/cli_support/dp_trainer.py"))
        .arg(root().join("agent/python/tests"))
        .env_remove("MEMPROF_AGENT_SOCKET")
        .env_remove("MEMPROF_AGENT_URL")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for want in [
        "largest parameters (16 of 52; the other 36: 1.2M parameters, 4.5MiB):",
        "head.weight               4000x256   float32     3.9MiB  yes",
        "layers (all 9):",
        "blocks.0    787.5K     787.5K     3.0MiB",
        "DP-SGD (8 samples, 52 parameters with per-sample state):",
        "per-sample gradient norms         1.6KiB  measured: the parameters' _norm_sample",
        "temporary matrices (peak)        64.0MiB  modelled: ghost clipping's ggT + aaT, 2 x 8 x 1024^2 elements",
    ] {
        assert!(stdout.contains(want), "{want:?} not in:\n{stdout}");
    }
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let b = &doc["breakdown"];
    assert_eq!(b["parameterRows"].as_array().unwrap().len(), 16);
    assert_eq!(
        b["parameterRows"][0],
        serde_json::json!({"name": "head.weight", "shape": [4000, 256], "dtype": "float32",
            "bytes": 4_096_000, "trainable": true})
    );
    let shown: u64 = b["parameterRows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(
        shown + b["parametersLeftOut"]["bytes"].as_u64().unwrap(),
        b["parametersBytes"].as_u64().unwrap(),
        "nothing lost"
    );
    assert_eq!(b["layerRows"].as_array().unwrap().len(), 9);
    assert_eq!(b["dpSgd"]["tempMatricesBytes"], 2 * 8 * 1024 * 1024 * 4);
    assert_eq!(b["dpSgd"]["normsSource"], "measured");
}

/// `MEMPROF_AGENT_OOM_SNAPSHOT` set for `profile` reaches the trainer: the
/// agent writes the allocator's own snapshot at the OOM (the fake torch's,
/// every block of it, not the summary's 8), named from the template.
#[test]
fn profile_passes_the_agents_snapshot_file_to_the_trainer() {
    let dir = TempDir::new("agentsnap");
    let template = dir.0.join("snaps/oom-{pid}-gpu{device}.pickle");
    let out = Command::new(MEMPROF)
        .args(["profile", "--backend", "sim", "--interval", "200ms"])
        .arg("--scenario")
        .arg(root().join("hack/scenarios/demo.yaml"))
        .arg("--agent-path")
        .arg(root().join("agent/python"))
        .args(["--", "python3"])
        .arg(root().join("tests/cli_support/oom_trainer.py"))
        .arg(root().join("agent/python/tests"))
        .arg("3")
        .env("MEMPROF_AGENT_OOM_SNAPSHOT", &template)
        .env_remove("MEMPROF_AGENT_SOCKET")
        .env_remove("MEMPROF_AGENT_URL")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let files: Vec<_> = std::fs::read_dir(dir.0.join("snaps"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(
        files[0].starts_with("oom-") && files[0].ends_with("-gpu0.pickle"),
        "{files:?}"
    );
    assert!(
        stderr.contains("memprof-agent: CUDA OOM snapshot ("),
        "{stderr}"
    );
    let py = "import pickle, sys; d = pickle.load(open(sys.argv[1], 'rb')); \
              print(len(d['segments']), sum(len(s['blocks']) for s in d['segments']))";
    let read = Command::new("python3")
        .args(["-c", py])
        .arg(dir.0.join("snaps").join(&files[0]))
        .output()
        .unwrap();
    let counts = String::from_utf8_lossy(&read.stdout);
    // More blocks than any summary keeps: the allocator's snapshot, whole.
    let blocks: usize = counts.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(blocks > 16, "{counts}");
}
