//! The first hour of a new user, run as that user runs it: the
//! real `memprof` binary (and `memprof-sidecar` on the simulated backend; no
//! GPU, no cluster). Every file a command writes is checked before the work
//! starts; a mistake is one line saying what is wrong and what to type; a
//! duration is written the same way for every command.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const MEMPROF: &str = env!("CARGO_BIN_EXE_memprof");

/// A temporary directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let p =
            std::env::temp_dir().join(format!("memprof-first-hour-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("temp dir");
        TempDir(p)
    }
    fn path(&self, f: &str) -> PathBuf {
        self.0.join(f)
    }
    fn s(&self, f: &str) -> String {
        self.path(f).display().to_string()
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

/// A simulated GPU, flat at 30 of 80 GiB.
fn scenario(dir: &TempDir) -> String {
    std::fs::write(
        dir.path("scenario.yaml"),
        "seed: 3\ntotalGiB: 80\ngpusPerRank: 1\ndefault:\n  baseGiB: 30\n  amplitudeGiB: 1\n  periodSeconds: 2\n  noiseGiB: 0.1\n  leakMiBPerSecond: 0\n",
    )
    .unwrap();
    dir.s("scenario.yaml")
}

/// `memprof ARGS` with `env`, no cluster (KUBECONFIG points nowhere), timed.
fn run(args: &[&str], env: &[(&str, &str)]) -> (Output, Duration) {
    let began = Instant::now();
    let out = Command::new(MEMPROF)
        .args(args)
        .env("KUBECONFIG", "/nonexistent/memprof-first-hour-kubeconfig")
        .env_remove("RUST_LOG")
        .envs(env.iter().copied())
        .output()
        .expect("memprof runs");
    (out, began.elapsed())
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Fails with exactly one line on stderr; that line.
fn one_line_failure(args: &[&str]) -> String {
    let (out, took) = run(args, &[]);
    let e = stderr(&out);
    assert!(!out.status.success(), "memprof {args:?} succeeded:\n{e}");
    assert_eq!(e.lines().count(), 1, "one line from memprof {args:?}:\n{e}");
    assert!(
        took < Duration::from_secs(10),
        "memprof {args:?} took {took:?}"
    );
    e
}

#[test]
fn profile_makes_the_missing_output_folder_with_host_and_rank_filled_in() {
    sidecar_present();
    let dir = TempDir::new("mkdir");
    let scen = scenario(&dir);
    let pattern = dir.s("out/deeper/{host}-rank{rank}.json");
    let plot = dir.s("plots/p.svg");
    let trace = dir.s("traces/t.csv");
    let args = [
        "profile",
        "--scenario",
        &scen,
        "--duration",
        "3",
        "--output",
        &pattern,
        "--plot",
        &plot,
        "--trace-out",
        &trace,
    ];
    let (out, _) = run(&args, &[("RANK", "0"), ("LOCAL_RANK", "0")]);
    assert!(out.status.success(), "{}", stderr(&out));
    let written: Vec<_> = std::fs::read_dir(dir.path("out/deeper"))
        .expect("the folder was made")
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(written.len(), 1, "{written:?}");
    assert!(written[0].ends_with("-rank0.json"), "{written:?}");
    // The file holds what the table printed.
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path("out/deeper").join(&written[0])).unwrap())
            .unwrap();
    let g = &report["gpus"][0];
    let table = String::from_utf8_lossy(&out.stdout);
    let row = table
        .lines()
        .find(|l| l.starts_with("0 "))
        .expect("a row for GPU 0");
    let cells: Vec<&str> = row
        .split("   ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    // GPU MODEL USED FREE TOTAL PEAK | UTIL AVG | UTIL MAX | SAMPLES
    let gib =
        |v: &serde_json::Value| format!("{:.1}GiB", v.as_f64().unwrap() / (1u64 << 30) as f64);
    assert_eq!(cells[3], gib(&g["freeBytes"]), "FREE of {row}");
    assert_eq!(cells[8], g["samples"].to_string(), "SAMPLES of {row}");
    match cells[6] {
        "-" => assert!(g.get("utilizationAvgPercent").is_none(), "{g}"),
        avg => assert_eq!(
            avg,
            format!("{:.0}%", g["utilizationAvgPercent"].as_f64().unwrap()),
            "UTIL AVG of {row}"
        ),
    }
    match cells[7] {
        "-" => assert!(g.get("utilizationMaxPercent").is_none(), "{g}"),
        max => assert_eq!(
            max,
            format!("{}%", g["utilizationMaxPercent"]),
            "UTIL MAX of {row}"
        ),
    }
    assert!(dir.path("plots/p.svg").is_file());
    assert!(dir.path("traces/t.csv").is_file());
}

/// Before: the run went on for its whole --duration and then failed with
/// "wrote no final report (bad --scenario or --trace?)". Now every output
/// flag of every command is refused at once, naming the flag and the path.
#[test]
fn an_output_that_cannot_be_written_fails_at_once_naming_flag_and_path() {
    sidecar_present();
    let dir = TempDir::new("blocked");
    let scen = scenario(&dir);
    std::fs::write(dir.path("file"), "").unwrap();
    let blocked = |name: &str| dir.s(&format!("file/{name}"));
    let trace =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/traces/leak300_h100.csv");
    let trace = trace.to_str().unwrap();
    let export = dir.s("export.json");
    std::fs::write(&export, r#"{"events":{}}"#).unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec![
                "profile",
                "--scenario",
                &scen,
                "--duration",
                "60",
                "--output",
                &blocked("r.json"),
            ]
            .into_iter()
            .map(String::from)
            .collect(),
            "--output",
        ),
        (
            vec![
                "profile",
                "--scenario",
                &scen,
                "--duration",
                "60",
                "--plot",
                &blocked("p.svg"),
            ]
            .into_iter()
            .map(String::from)
            .collect(),
            "--plot",
        ),
        (
            vec![
                "profile",
                "--scenario",
                &scen,
                "--duration",
                "60",
                "--trace-out",
                &blocked("t.csv"),
            ]
            .into_iter()
            .map(String::from)
            .collect(),
            "--trace-out",
        ),
        (
            vec!["analyze", trace, "--plot", &blocked("a.svg")]
                .into_iter()
                .map(String::from)
                .collect(),
            "--plot",
        ),
        (
            vec!["timeline", &export, "--plot", &blocked("t.png")]
                .into_iter()
                .map(String::from)
                .collect(),
            "--plot",
        ),
        (
            vec!["sweep", "--json", &blocked("s.json"), "--", "true"]
                .into_iter()
                .map(String::from)
                .collect(),
            "--json",
        ),
        (
            vec!["sweep", "--plot-dir", &dir.s("file"), "--", "true"]
                .into_iter()
                .map(String::from)
                .collect(),
            "--plot-dir",
        ),
    ];
    for (args, flag) in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let e = one_line_failure(&args);
        assert!(e.starts_with(&format!("error: {flag} ")), "{args:?}: {e}");
        assert!(e.contains(&dir.s("file")), "names the path: {e}");
        assert!(!e.contains("bad --scenario"), "{e}");
    }
}

#[test]
fn mistakes_are_one_line_that_says_what_to_type() {
    sidecar_present();
    let dir = TempDir::new("mistakes");
    let scen = scenario(&dir);
    // A mistyped flag was run as the command ("cannot run").
    for cmd in ["profile", "watch"] {
        let e = one_line_failure(&[cmd, "--duraton", "5"]);
        assert!(e.contains("unknown flag --duraton"), "{e}");
        assert!(e.contains("did you mean --duration?"), "{e}");
        assert!(e.contains("after `--`"), "{e}");
        assert!(!e.contains("cannot run"), "{e}");
    }
    // A missing scenario or trace was "no GPU and no agent data" (exit 4)
    // with a hint to pass the flag that was passed.
    for flag in ["--scenario", "--trace"] {
        let e = one_line_failure(&["profile", flag, "nope.yaml", "--duration", "1"]);
        assert!(
            e.starts_with(&format!("error: {flag} nope.yaml: cannot read it")),
            "{e}"
        );
        assert!(!e.contains("no GPU"), "{e}");
    }
    let e = one_line_failure(&["oom", "--monitor", "--scenario", "nope.yaml"]);
    assert!(e.contains("--scenario nope.yaml: cannot read it"), "{e}");
    // Bad thresholds were the sidecar's, then "did not start serving its
    // socket within 10 s".
    let e = one_line_failure(&["profile", "--scenario", &scen, "--thresholds", "{bad"]);
    assert!(e.starts_with("error: --thresholds {bad: "), "{e}");
    assert!(!e.contains("socket"), "{e}");
    // A missing file to compare was "no Kubernetes cluster configured".
    let r = dir.s("r.json");
    std::fs::write(&r, r#"{"gpus":[]}"#).unwrap();
    for args in [["compare", &r, "nope.json"], ["compare", "nope.json", &r]] {
        let e = one_line_failure(&args);
        assert!(e.contains("cannot read nope.json: No such file"), "{e}");
        assert!(!e.contains("Kubernetes"), "{e}");
    }
    // The OS error was said twice.
    for args in [&["analyze", "nope.csv"][..], &["timeline", "nope.json"][..]] {
        let e = one_line_failure(args);
        assert_eq!(e.matches("os error 2").count(), 1, "{e}");
    }
    // The flag the user typed, not the sidecar's (`--gpus`).
    let (out, _) = run(
        &[
            "profile",
            "--scenario",
            &scen,
            "--devices",
            "5",
            "--duration",
            "1",
        ],
        &[],
    );
    let e = stderr(&out);
    assert_eq!(out.status.code(), Some(4), "{e}");
    assert!(e.contains("--devices 5: no such GPU"), "{e}");
    assert!(!e.contains("--gpus"), "{e}");
}

/// `5`, `5s`, `500ms`, `2m`: the same on every command (`profile
/// --interval 5` was refused for having no unit, `top --interval 2s` for
/// being no number).
#[test]
fn durations_are_written_the_same_way_everywhere() {
    sidecar_present();
    let dir = TempDir::new("durations");
    let scen = scenario(&dir);
    for (interval, duration) in [("1", "1"), ("500ms", "1s"), ("0.5s", "1500ms")] {
        let (out, _) = run(
            &[
                "profile",
                "--scenario",
                &scen,
                "--interval",
                interval,
                "--duration",
                duration,
            ],
            &[],
        );
        assert!(
            out.status.success(),
            "{interval} {duration}: {}",
            stderr(&out)
        );
    }
    // clap's own error (its usage lines follow): the flag, the value, the bounds.
    let (out, _) = run(&["profile", "--scenario", &scen, "--interval", "2m"], &[]);
    let e = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{e}");
    assert!(e.contains("10ms..60s"), "{e}");
    // The cluster commands parse the same forms (then find no cluster).
    for cmd in ["top", "report"] {
        for d in ["2", "2s", "500ms", "2m"] {
            let (out, _) = run(&[cmd, "--interval", d, "--stale-after", d], &[]);
            let e = stderr(&out);
            assert!(
                e.contains("no Kubernetes cluster configured"),
                "{cmd} {d}: {e}"
            );
        }
        let (out, _) = run(&[cmd, "--interval", "2x"], &[]);
        let e = stderr(&out);
        assert!(
            e.contains("'--interval <DURATION>'") && e.contains("`500ms`, `5s`, `2m`"),
            "{e}"
        );
    }
}

/// `analyze` took one file where `fragment` and `rollup` take many.
#[test]
fn analyze_takes_several_traces_each_under_its_name() {
    let fixture = |n: &str| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/traces")
            .join(n)
            .display()
            .to_string()
    };
    let (a, b) = (fixture("leak300_h100.csv"), fixture("steady_h100.csv"));
    let (out, _) = run(&["analyze", &a, &b], &[]);
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{}", stderr(&out));
    let (ha, hb) = (format!("==> {a} <=="), format!("\n\n==> {b} <==\n"));
    assert!(table.starts_with(&ha), "{table}");
    assert!(table.find(&hb).is_some_and(|i| i > ha.len()), "{table}");
    assert_eq!(table.matches("SUMMARY").count(), 2, "{table}");
    let (out, _) = run(&["analyze", &a, &b, "-o", "json"], &[]);
    let heads: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(r#""event":"trace""#))
        .map(String::from)
        .collect();
    assert_eq!(heads.len(), 2, "{heads:?}");
    assert!(heads[1].contains("steady_h100.csv"), "{heads:?}");
    // One file still reads as before: no heading.
    let (out, _) = run(&["analyze", &a], &[]);
    assert!(!String::from_utf8_lossy(&out.stdout).contains("==>"));
    // A missing file is said before any table.
    let (out, _) = run(&["analyze", &a, "nope.csv"], &[]);
    assert!(!out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "");
    assert!(
        stderr(&out).contains("cannot read nope.csv"),
        "{}",
        stderr(&out)
    );
    let e = one_line_failure(&["analyze", &a, &b, "--plot", "x.svg"]);
    assert!(e.contains("one trace (2 given)"), "{e}");
}
