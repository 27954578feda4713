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
        text(&out.stdout).contains("memprof profile: 1 GPU(s)"),
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
}
