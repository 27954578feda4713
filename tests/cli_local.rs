//! The local commands, run as a user runs them: the real `memprof` binary
//! driving the real `memprof-sidecar` on the simulated backend (no GPU, no
//! cluster). Needs `cargo build -p memprof-sidecar` first (or
//! MEMPROF_SIDECAR_BIN pointing at one, copied next to `memprof`).
//!
//! `memprof profile`, `memprof oom --monitor --fail-on` (its exit status),
//! `memprof analyze` (table, `-o json` parsed, `--plot` parsed as XML).

use memprof::api::{DataSource, MemoryReportSpec};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const MEMPROF: &str = env!("CARGO_BIN_EXE_memprof");

/// A temporary directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let p =
            std::env::temp_dir().join(format!("memprof-cli-local-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("temp dir");
        TempDir(p)
    }
    fn path(&self, f: &str) -> PathBuf {
        self.0.join(f)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn sidecar_present() {
    let p = Path::new(MEMPROF).with_file_name("memprof-sidecar");
    assert!(
        p.is_file(),
        "{} is missing: run `cargo build -p memprof-sidecar` first",
        p.display()
    );
}

/// A simulated GPU; `leak` MiB/s fills 80 GiB from 30 GiB in 205 s at 250.
fn scenario(dir: &TempDir, leak: f64) -> PathBuf {
    let p = dir.path("scenario.yaml");
    std::fs::write(
        &p,
        format!(
            "seed: 3\ntotalGiB: 80\ngpusPerRank: 1\ndefault:\n  baseGiB: 30\n  amplitudeGiB: 6\n  periodSeconds: 2\n  noiseGiB: 0.1\n  leakMiBPerSecond: {leak}\n"
        ),
    )
    .unwrap();
    p
}

fn memprof(args: &[&str]) -> Output {
    Command::new(MEMPROF)
        .args(args)
        .output()
        .expect("memprof runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Every text node of an SVG, after checking it parses as XML.
fn svg_texts(path: &Path) -> String {
    let svg = std::fs::read_to_string(path).expect("the plot was written");
    let doc = roxmltree::Document::parse(&svg).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    doc.descendants()
        .filter_map(|n| n.text())
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn profile_prints_a_summary_and_writes_the_report_the_trace_and_the_plot() {
    sidecar_present();
    let dir = TempDir::new("profile");
    let scen = scenario(&dir, 250.0);
    let (report, plot, trace) = (dir.path("r.json"), dir.path("p.svg"), dir.path("t.csv"));
    let s = |p: &Path| p.display().to_string();
    let out = memprof(&[
        "profile",
        "--backend",
        "sim",
        "--scenario",
        &s(&scen),
        "--duration",
        "8",
        "--speed",
        "30",
        "--interval",
        "100ms",
        "--output",
        &s(&report),
        "--plot",
        &s(&plot),
        "--trace-out",
        &s(&trace),
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    for want in [
        "source sim (simulated, not hardware)",
        "USED",
        "FREE",
        "TOTAL",
        "PEAK",
        "UTIL AVG",
        "UTIL MAX",
        "SAMPLES",
        "RISK",
        "GROWTH",
        "TTO",
        "GPU 0:",
    ] {
        assert!(stdout.contains(want), "{want:?} missing from\n{stdout}");
    }
    // How far it got before the leak is read depends on the load (a busy
    // machine samples less often): high, or straight to critical.
    let alarm = ["high", "critical"]
        .into_iter()
        .find(|r| stdout.contains(&format!("-> {r}")))
        .unwrap_or_else(|| panic!("no transition to high or critical in\n{stdout}"));
    let r: MemoryReportSpec =
        serde_json::from_slice(&std::fs::read(&report).expect("--output written")).unwrap();
    assert_eq!((r.gpus.len(), r.summary.source), (1, DataSource::Sim));
    let rows = memprof::api::trace::read_trace(&s(&trace)).expect("--trace-out written");
    assert!(rows.len() >= 20, "{} samples", rows.len());
    let t = svg_texts(&plot);
    for want in [
        "simulated",
        "GPU 0",
        "used memory (GiB)",
        "time since start",
        "total memory",
    ] {
        assert!(
            t.contains(want),
            "{want:?} missing from the plot's text:\n{t}"
        );
    }
    assert!(
        t.contains(&format!("GPU 0 {alarm}")),
        "no {alarm} mark in\n{t}"
    );
}

/// The command gets the sidecar's socket (contract A), in a directory only
/// this user can enter, served while it runs and gone after.
#[test]
fn profile_runs_a_command_beside_the_sidecar_and_exits_with_its_status() {
    sidecar_present();
    let dir = TempDir::new("command");
    let scen = scenario(&dir, 0.0);
    let seen = dir.0.join("socket.txt");
    let script = format!(
        "sleep 2; test -S \"$MEMPROF_AGENT_SOCKET\" || exit 1; \
         test \"$(stat -c %a \"$(dirname \"$MEMPROF_AGENT_SOCKET\")\")\" = 700 || exit 2; \
         test -z \"$MEMPROF_AGENT_URL\" || exit 3; \
         echo \"$MEMPROF_AGENT_SOCKET\" > {}; exit 7",
        seen.display()
    );
    let out = memprof(&[
        "profile",
        "--backend",
        "sim",
        "--scenario",
        &scen.display().to_string(),
        "--",
        "sh",
        "-c",
        &script,
    ]);
    assert_eq!(out.status.code(), Some(7), "{}", text(&out.stderr));
    let socket = std::fs::read_to_string(&seen).expect("the command saw the socket");
    let socket = std::path::Path::new(socket.trim());
    assert!(
        !socket.exists() && !socket.parent().unwrap().exists(),
        "{} is removed at exit",
        socket.display()
    );
    assert!(
        text(&out.stdout).contains(", 1 GPU(s), source sim"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn profile_refuses_sim_without_a_scenario_and_says_what_to_pass() {
    let out = memprof(&["profile", "--backend", "sim", "--duration", "1"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--scenario"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn oom_monitor_exits_3_as_soon_as_the_risk_reaches_fail_on() {
    sidecar_present();
    let dir = TempDir::new("oom");
    let scen = scenario(&dir, 2000.0);
    let began = Instant::now();
    let out = memprof(&[
        "oom",
        "--monitor",
        "--fail-on",
        "critical",
        "--backend",
        "sim",
        "--scenario",
        &scen.display().to_string(),
        "--speed",
        "20",
        "--interval",
        "100ms",
        "--duration",
        "60",
    ]);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(3),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    assert!(stdout.contains("-> critical"), "{stdout}");
    assert!(stdout.contains("simulated"), "{stdout}");
    assert!(
        began.elapsed() < Duration::from_secs(50),
        "it stopped at critical, not at --duration"
    );
}

#[test]
fn oom_monitor_exits_0_when_the_watch_ends_below_fail_on() {
    sidecar_present();
    let dir = TempDir::new("oom-calm");
    let scen = scenario(&dir, 0.0);
    let out = memprof(&[
        "oom",
        "--monitor",
        "--fail-on",
        "warning",
        "--backend",
        "sim",
        "--scenario",
        &scen.display().to_string(),
        "--duration",
        "3",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(
        text(&out.stdout).contains("-> low"),
        "{}",
        text(&out.stdout)
    );
}

fn fixture(name: &str) -> String {
    format!(
        "{}/tests/fixtures/traces/{name}",
        env!("CARGO_MANIFEST_DIR")
    )
}

#[test]
fn analyze_prints_tables_on_request_json_lines_and_draws_the_prediction() {
    let trace = fixture("leak300_h100.csv");
    let table = memprof(&["analyze", &trace]);
    let t = text(&table.stdout);
    assert!(table.status.success(), "{}", text(&table.stderr));
    for want in [
        "RISK TRANSITIONS",
        "SUMMARY",
        "FROM",
        "TTO",
        "FIRST HIGH",
        "critical",
    ] {
        assert!(t.contains(want), "{want:?} missing from\n{t}");
    }
    assert!(!t.trim_start().starts_with('{'), "a table, not JSON:\n{t}");

    let json = memprof(&["analyze", &trace, "-o", "json"]);
    assert!(json.status.success(), "{}", text(&json.stderr));
    let lines: Vec<serde_json::Value> = text(&json.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    // An alarm (the staircase's pace may go straight from medium to critical).
    assert!(lines
        .iter()
        .any(|l| l["event"] == "risk" && (l["risk"] == "high" || l["risk"] == "critical")));
    assert!(lines.iter().any(|l| l["event"] == "estimate"));
    let summary = lines.last().unwrap();
    assert_eq!(
        (summary["event"].as_str(), summary["gpu"].as_u64()),
        (Some("summary"), Some(0))
    );

    let dir = TempDir::new("analyze");
    let plot = dir.path("a.svg");
    let out = memprof(&[
        "analyze",
        &trace,
        "-o",
        "json",
        "--plot",
        &plot.display().to_string(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let t = svg_texts(&plot);
    for want in [
        "samples",
        "upper envelope",
        "lower envelope",
        "trend at",
        "predicted OOM",
        "total memory",
        "used memory (GiB)",
        "trace time (min)",
        "risk critical",
    ] {
        assert!(
            t.contains(want),
            "{want:?} missing from the plot's text:\n{t}"
        );
    }
    // Every command that draws writes PNG too, in-process.
    let png = dir.path("a.png");
    let out = memprof(&["analyze", &trace, "--plot", &png.display().to_string()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let bytes = std::fs::read(&png).expect("the PNG was written");
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n") && bytes.len() > 2000);
    let bad = dir.path("a.jpg");
    let out = memprof(&["analyze", &trace, "--plot", &bad.display().to_string()]);
    assert!(!out.status.success());
}

/// Runs `memprof ARGS`, killed (by its PID, through the handle) after
/// `limit`: `None` when it had not exited by then.
fn memprof_within(args: &[&str], limit: Duration) -> Option<Output> {
    let mut child = Command::new(MEMPROF)
        .args(args)
        // The default log filter is part of what is tested (one line).
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("memprof runs");
    let began = Instant::now();
    while began.elapsed() < limit {
        if child.try_wait().expect("wait").is_some() {
            return Some(child.wait_with_output().expect("output"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// On a machine without the NVIDIA driver, the guard and
/// the profile saw nothing and passed (exit 0), and `oom --monitor` without
/// `--duration` waited forever. Blind now means exit 4 and one line saying
/// why. Needs a machine without the driver (what this one is; skipped where
/// /dev/nvidiactl exists).
#[test]
fn without_a_gpu_the_guard_and_the_profile_fail_at_once_and_say_why() {
    sidecar_present();
    if Path::new("/dev/nvidiactl").exists() {
        eprintln!("SKIPPED: this machine has an NVIDIA driver; the property is about one without");
        return;
    }
    for args in [
        &[
            "oom",
            "--monitor",
            "--fail-on",
            "critical",
            "--duration",
            "3",
        ][..],
        &["oom", "--monitor", "--fail-on", "critical"][..],
        &["profile", "--duration", "2"][..],
        &["profile"][..],
    ] {
        let out = memprof_within(args, Duration::from_secs(20))
            .unwrap_or_else(|| panic!("memprof {args:?} was still running after 20 s"));
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(4), "memprof {args:?}\n{stderr}");
        let said: Vec<&str> = stderr.lines().collect();
        assert_eq!(said.len(), 1, "one line from memprof {args:?}:\n{stderr}");
        assert!(
            said[0].starts_with("memprof: no GPU and no agent data"),
            "{}",
            said[0]
        );
        assert!(said[0].contains("libnvidia-ml"), "{}", said[0]);
    }
}

/// The same property where it can be made anywhere: a `--devices` list
/// that names no GPU of the simulated machine watches nothing, and says so.
#[test]
fn a_devices_list_that_names_no_gpu_is_blind_too() {
    sidecar_present();
    let dir = TempDir::new("blind-sim");
    let scen = scenario(&dir, 0.0);
    let s = scen.display().to_string();
    for cmd in ["oom", "profile"] {
        let mut args = vec![cmd, "--backend", "sim", "--scenario", &s, "--devices", "7"];
        args.extend(match cmd {
            "oom" => &["--monitor", "--fail-on", "critical"][..],
            _ => &["--duration", "30"][..],
        });
        let out = memprof_within(&args, Duration::from_secs(20))
            .unwrap_or_else(|| panic!("memprof {args:?} was still running after 20 s"));
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(4), "memprof {args:?}\n{stderr}");
        assert!(
            stderr.contains("--devices 7: no such GPU") && !stderr.contains("--gpus"),
            "says which entry named nothing:\n{stderr}"
        );
    }
}

/// A simulated machine with three GPUs: `--devices 0,1` samples, reports,
/// traces and plots GPUs 0 and 1 only (GPU 2 was reported and its
/// transitions drawn on a plot that did not show it).
#[test]
fn devices_are_chosen_at_the_source_so_no_other_gpu_reaches_report_trace_or_plot() {
    sidecar_present();
    let dir = TempDir::new("devices");
    let scen = dir.path("three.yaml");
    std::fs::write(
        &scen,
        "seed: 1\ntotalGiB: 80\ngpusPerRank: 3\ndefault: { baseGiB: 30, amplitudeGiB: 4, periodSeconds: 2, noiseGiB: 0.1, leakMiBPerSecond: 2000 }\n",
    )
    .unwrap();
    let (report, plot, trace) = (dir.path("r.json"), dir.path("p.svg"), dir.path("t.csv"));
    let s = |p: &Path| p.display().to_string();
    let out = memprof(&[
        "profile",
        "--backend",
        "sim",
        "--scenario",
        &s(&scen),
        "--devices",
        "0,1",
        "--duration",
        "6",
        "--speed",
        "20",
        "--interval",
        "100ms",
        "--output",
        &s(&report),
        "--plot",
        &s(&plot),
        "--trace-out",
        &s(&trace),
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    let r: MemoryReportSpec = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let idx: Vec<u32> = r.gpus.iter().map(|g| g.index).collect();
    assert_eq!(idx, [0, 1], "the report's GPUs");
    let rows = memprof::api::trace::read_trace(&s(&trace)).unwrap();
    assert!(rows.iter().all(|row| row.gpu < 2), "the trace names GPU 2");
    assert!(
        stdout.contains("-> "),
        "the leak raised the risk:\n{stdout}"
    );
    assert!(!stdout.contains("GPU 2"), "GPU 2 in\n{stdout}");
    let t = svg_texts(&plot);
    assert!(t.contains("GPU 0") && !t.contains("GPU 2"), "{t}");
}

/// Seed 002's timeline end to end: a trainer (the fake torch) records
/// events with the agent and exports them; `memprof timeline` shows them in
/// time order with the change of allocated memory and draws them.
#[test]
fn the_agents_timeline_export_is_a_table_of_stages_and_a_picture() {
    let dir = TempDir::new("timeline");
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let script = dir.path("t.py");
    std::fs::write(
        &script,
        "import sys\nsys.path[:0] = sys.argv[1:3]\nimport fake_torch\nfake = fake_torch.install()\n\
         import memprof_agent\nmemprof_agent.record('start', 'before the model')\n\
         fake.alloc(400 << 20)\nmemprof_agent.record('model loaded')\n\
         for step in range(2):\n    memprof_agent.step(step)\n    fake.alloc(300 << 20)\n\
         \x20   memprof_agent.record('forward')\n    fake.free(250 << 20)\n    memprof_agent.record('optimizer')\n\
         memprof_agent.export_timeline(sys.argv[3])\n",
    )
    .unwrap();
    let export = dir.path("export.json");
    let py = Command::new("python3")
        .arg(&script)
        .arg(root.join("agent/python/tests"))
        .arg(root.join("agent/python"))
        .arg(&export)
        .env_remove("MEMPROF_AGENT_SOCKET")
        .env_remove("MEMPROF_AGENT_URL")
        .output()
        .expect("python3 runs");
    assert!(py.status.success(), "{}", text(&py.stderr));
    let plot = dir.path("t.svg");
    let s = |p: &Path| p.display().to_string();
    let out = memprof(&["timeline", &s(&export), "--plot", &s(&plot)]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    let order: Vec<&str> = stdout
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(1))
        .take(6)
        .collect();
    assert_eq!(
        order,
        [
            "start",
            "model",
            "forward",
            "optimizer",
            "forward",
            "optimizer"
        ],
        "{stdout}"
    );
    for want in [
        "before the model",
        "+400MiB",
        "+300MiB",
        "-250MiB",
        "6 events; largest increase +400MiB at model loaded",
    ] {
        assert!(stdout.contains(want), "{want:?} not in\n{stdout}");
    }
    let t = svg_texts(&plot);
    assert!(t.contains("model loaded") && t.contains("allocated"), "{t}");
}

/// `watch` draws a full screen: into a pipe it refuses at once and names
/// the command that fits (no sidecar left behind, no escape codes in a log).
#[test]
fn watch_into_a_pipe_says_to_use_profile() {
    let out = memprof_within(
        &[
            "watch",
            "--backend",
            "sim",
            "--scenario",
            "hack/scenarios/demo.yaml",
        ],
        Duration::from_secs(10),
    )
    .expect("watch into a pipe exits at once");
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
    assert!(
        text(&out.stderr).contains(
            "memprof watch draws on a terminal; for logs or a pipe use `memprof profile`"
        ),
        "{}",
        text(&out.stderr)
    );
}
