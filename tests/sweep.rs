//! `memprof sweep` end to end: the built binary against the fake trainer
//! (tests/fixtures/fake_trainer.py, pure Python: a 16 GB "GPU" whose peak is
//! 2 GB + 1 GB × BATCH_SIZE, reserved 100 MB above; with FAKE_ATTN, a term
//! quadratic in SEQ_LEN as eager attention has).

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const MEMPROF: &str = env!("CARGO_BIN_EXE_memprof");

/// A temporary directory removed when dropped (even when the test panics).
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let dir = std::env::temp_dir().join(format!(
            "memprof-sweep-test-{name}-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
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

fn repo(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(p)
}

fn trainer() -> Vec<String> {
    vec![
        "python3".into(),
        repo("tests/fixtures/fake_trainer.py").display().to_string(),
    ]
}

/// Runs `memprof sweep ARGS -- python3 fake_trainer.py` with `env` set.
fn sweep(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(MEMPROF);
    cmd.arg("sweep").args(args).arg("--").args(trainer());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("memprof runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn json(path: &Path) -> Value {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&bytes).expect("the sweep JSON parses")
}

#[test]
fn an_oom_is_recorded_the_sweep_goes_on_and_the_largest_safe_batch_is_computed() {
    let dir = TempDir::new("oom");
    let (j, c) = (dir.path("s.json"), dir.path("s.csv"));
    // 16 OOMs (18 GB > 16 GB) in the middle of the grid; 4 and 8 still run.
    let out = sweep(
        &[
            "--vary",
            "BATCH_SIZE=1,2,16,4,8",
            "--steps",
            "5",
            "--json",
            j.to_str().unwrap(),
            "--csv",
            c.to_str().unwrap(),
        ],
        &[],
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    let r = json(&j);
    assert_eq!(r["kind"], "memprofSweep");
    let runs = r["runs"].as_array().unwrap();
    let status: Vec<&str> = runs.iter().map(|x| x["status"].as_str().unwrap()).collect();
    assert_eq!(status, ["ok", "ok", "oom", "ok", "ok", "ok"]);
    assert_eq!(runs[2]["oom"], true);
    assert_eq!(runs[2]["exitCode"], 1);
    assert!(runs[2]["oomMessage"]
        .as_str()
        .unwrap()
        .contains("CUDA out of memory"));
    // The step budget reached the trainer (MEMPROF_AGENT_MAX_STEPS).
    assert_eq!(runs[4]["steps"], 5);
    assert_eq!(runs[4]["peakReservedBytes"], 10_100_000_000u64);
    assert_eq!(runs[4]["nvmlPeakBytes"], Value::Null);
    assert!(runs[4]["stepSecondsMedian"].as_f64().unwrap() > 0.0);
    assert_eq!(runs[4]["breakdown"]["parametersBytes"], 500_000_000u64);
    // reserved = 2.1 GB + 1 GB × batch; limit = 16 GB × 0.9 = 14.4 GB. The
    // grid's largest that ran is 8; the line (held out: each batch predicted
    // from the others within noise) backs one step of 4 past it, so the
    // verification runs 12 (14.1 GB): it runs, and 13 is surely over.
    let m = &r["models"][0];
    assert_eq!(m["variable"], "BATCH_SIZE");
    assert_eq!(m["verdict"], "fitted");
    let close = |v: &Value, want: f64| (v.as_f64().unwrap() - want).abs() < want * 1e-9;
    assert_eq!(m["fit"]["curve"]["family"], "linear", "{m}");
    assert!(close(&m["fit"]["curve"]["staticBytes"], 2.1e9), "{m}");
    assert!(close(&m["fit"]["curve"]["perUnitBytes"], 1e9), "{m}");
    assert!(close(&m["limitBytes"], 14.4e9), "{m}");
    assert_eq!(m["step"], 1.0);
    assert_eq!(runs.len(), 6, "the grid and one verification run");
    assert_eq!(runs[5]["values"]["BATCH_SIZE"], "12");
    assert_eq!(runs[5]["status"], "ok");
    assert!(runs[5]["trial"]
        .as_str()
        .unwrap()
        .starts_with("the model predicts"));
    assert_eq!(m["trials"], serde_json::json!([12.0]));
    assert_eq!(m["largestSafe"], 12.0);
    assert_eq!(m["verified"], true);
    assert_eq!(m["bound"]["x"], 16.0);
    assert!(
        m["search"]["why"]
            .as_str()
            .unwrap()
            .starts_with("the model is sure the next value 13 does not fit"),
        "{m}"
    );
    assert_eq!(m["agrees"], true);
    assert!(
        stdout.contains(
            "largest safe BATCH_SIZE = 12 (ran: peak 13.1GiB, verified by a run after the grid)"
        ),
        "{stdout}"
    );
    assert!(stdout.contains("BATCH_SIZE = 16 OOMed"), "{stdout}");
    // CSV: the documented header, one row per configuration.
    let csv = std::fs::read_to_string(&c).unwrap();
    let mut lines = csv.lines();
    assert_eq!(
        lines.next().unwrap(),
        "index,BATCH_SIZE,status,exit_code,oom,timed_out,duration_s,steps,\
         peak_allocated_bytes,peak_reserved_bytes,nvml_peak_bytes,device_total_bytes,\
         step_seconds_median,tokens_per_second,samples_per_second,parameters_bytes,\
         gradients_bytes,optimizer_bytes,activations_peak_bytes,static_bytes,note"
    );
    let rows: Vec<&str> = lines.collect();
    assert_eq!(rows.len(), 6);
    assert!(rows[2].starts_with("2,16,oom,1,true,false,"), "{}", rows[2]);
    assert!(rows[5].starts_with("5,12,ok,0,false,false,"), "{}", rows[5]);
}

#[test]
fn an_oom_the_model_did_not_expect_bounds_the_search_and_is_a_disagreement() {
    let dir = TempDir::new("override");
    let j = dir.path("s.json");
    // The trainer OOMs from 6 on (its "GPU" is 7 GB) but --limit-bytes
    // says 16 GB: the line allows 12, the OOM at 6 says it does not. The
    // verification bisects below the OOM and runs 5 (7.0 GB: it fits).
    let out = sweep(
        &[
            "--vary",
            "BATCH_SIZE=1,2,3,6,8",
            "--steps",
            "3",
            "--limit-bytes",
            "16GB",
            "--json",
            j.to_str().unwrap(),
        ],
        &[("FAKE_TOTAL", "7000000000")],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let m = &json(&j)["models"][0];
    assert_eq!(
        m["bound"],
        serde_json::json!({"kind": "oom", "x": 6.0}),
        "{m}"
    );
    assert_eq!(m["trials"], serde_json::json!([5.0]), "{m}");
    assert_eq!(m["largestSafe"], 5.0, "{m}");
    assert_eq!(m["agrees"], false, "{m}");
    assert!(
        stdout.contains("note: BATCH_SIZE=6 OOMed although the model predicted"),
        "{stdout}"
    );
}

#[test]
fn a_quadratic_trainer_gets_a_verified_value_that_runs_not_a_line_extrapolated() {
    // On the fake trainer: eager attention makes memory
    // quadratic in SEQ_LEN: 2 GB + 50 MB × u + 6 MB × u², u = SEQ_LEN/128,
    // on a 16 GB "GPU" (limit 14.4 GB). 5120 needs 13.6 GB and runs; 6144
    // needs 18.2 GB and OOMs. A line through 1024..4096 called 6144 safe.
    let env = [
        ("BATCH_SIZE", "1"),
        ("FAKE_PER_SAMPLE", "50000000"),
        ("FAKE_ATTN", "6000000"),
    ];
    let dir = TempDir::new("quadratic");
    let j = dir.path("s.json");
    let args = |extra: &[&'static str]| {
        let mut a = vec!["--vary", "SEQ_LEN=1024,2048,3072,4096", "--steps", "3"];
        a.extend_from_slice(extra);
        a
    };
    let mut verify = args(&["--json"]);
    verify.push(j.to_str().unwrap());
    let out = sweep(&verify, &env);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    let r = json(&j);
    let m = &r["models"][0];
    assert_eq!(m["fit"]["curve"]["family"], "quadratic", "{m}");
    assert!(
        m["fit"]["notes"][0]
            .as_str()
            .unwrap()
            .starts_with("linear refused: the residual grows at the top"),
        "{m}"
    );
    // What memprof calls safe ran: 5120, run by the verification.
    assert_eq!(m["largestSafe"], 5120.0, "{m}");
    let runs = r["runs"].as_array().unwrap();
    let safe_run = runs
        .iter()
        .find(|x| x["values"]["SEQ_LEN"] == "5120")
        .expect("a run at the value called safe");
    assert_eq!(safe_run["status"], "ok");
    assert!(safe_run["trial"].is_string());
    assert_eq!(m["verified"], true);
    assert!(
        m["search"]["why"]
            .as_str()
            .unwrap()
            .starts_with("the model is sure the next value 6144 does not fit"),
        "{m}"
    );
    assert!(!stdout.contains("6144 fits"), "{stdout}");
    assert!(
        stdout.contains("largest safe SEQ_LEN = 5120 (ran"),
        "{stdout}"
    );

    // --no-verify: only what ran is safe; the prediction says how far it is.
    let mut skip = args(&["--no-verify", "--json"]);
    skip.push(j.to_str().unwrap());
    let out = sweep(&skip, &env);
    let stdout = text(&out.stdout);
    let r = json(&j);
    let m = &r["models"][0];
    assert_eq!(
        r["runs"].as_array().unwrap().len(),
        4,
        "no run past the grid"
    );
    assert_eq!(m["largestSafe"], 4096.0, "{m}");
    assert_eq!(m["predicted"]["x"], 5120.0, "{m}");
    assert_eq!(m["verified"], false);
    assert!(
        stdout.contains("the model predicts SEQ_LEN = 5120 fits")
            && stdout.contains("extrapolated 1024 above the largest measured value 4096 (+25%)")
            && stdout.contains("NOT verified"),
        "{stdout}"
    );
}

#[test]
fn an_oom_seen_only_on_stderr_is_an_oom() {
    let dir = TempDir::new("stderr");
    let j = dir.path("s.json");
    let out = sweep(
        &["--vary", "BATCH_SIZE=20", "--json", j.to_str().unwrap()],
        &[("FAKE_NO_SUMMARY_ON_OOM", "1")],
    );
    assert_eq!(out.status.code(), Some(0), "an OOM is a result");
    let run = &json(&j)["runs"][0];
    assert_eq!(run["status"], "oom");
    assert!(run["note"]
        .as_str()
        .unwrap()
        .starts_with("no agent summary"));
    assert!(run["stderrTail"]
        .as_str()
        .unwrap()
        .contains("torch.OutOfMemoryError"));
}

fn alive(pid: &str) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

#[test]
fn a_run_past_its_timeout_is_killed_with_its_children_and_the_sweep_goes_on() {
    let dir = TempDir::new("timeout");
    let (j, pid_file) = (dir.path("s.json"), dir.path("child.pid"));
    let out = sweep(
        &[
            "--vary",
            "BATCH_SIZE=2,1",
            // A margin a loaded 2-core machine honours: the run that must
            // finish (python and the agent starting) took over 2 s there.
            "--timeout",
            "15",
            "--json",
            j.to_str().unwrap(),
        ],
        &[
            ("FAKE_HANG_BATCH", "2"),
            ("FAKE_CHILD_PID_FILE", pid_file.to_str().unwrap()),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let r = json(&j);
    let runs = r["runs"].as_array().unwrap();
    assert_eq!(runs[0]["status"], "timeout");
    assert_eq!(runs[0]["timedOut"], true);
    let took = runs[0]["durationSeconds"].as_f64().unwrap();
    assert!(
        (15.0..45.0).contains(&took),
        "killed after the timeout: {took}"
    );
    assert_eq!(runs[1]["status"], "ok");
    let child = std::fs::read_to_string(&pid_file).expect("the hung run started its child");
    assert!(
        !alive(child.trim()),
        "the hung run's child {child} was killed with its group"
    );
}

#[test]
fn the_agent_is_enabled_and_each_run_has_its_own_summary_file() {
    let dir = TempDir::new("env");
    let logs = dir.path("logs");
    let agent = repo("agent/python");
    let out = sweep(
        &[
            "--vary",
            "BATCH_SIZE=1,2",
            "--steps",
            "7",
            "--agent-path",
            agent.to_str().unwrap(),
            "--logs",
            logs.to_str().unwrap(),
        ],
        &[("PYTHONPATH", "/mine")],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let seen =
        |i: usize| std::fs::read_to_string(logs.join(format!("run-00{i}.stdout.log"))).unwrap();
    let first = seen(0);
    let want = format!(
        "PYTHONPATH={}:/mine:{}",
        agent.join("bootstrap").display(),
        agent.display()
    );
    assert!(first.contains(&want), "{first}");
    assert!(first.contains("MEMPROF_AGENT_MAX_STEPS=7"), "{first}");
    // No sidecar: an unserved socket in a private directory, never a URL.
    assert!(first.contains("MEMPROF_AGENT_SOCKET=/"), "{first}");
    assert!(!first.contains("MEMPROF_AGENT_URL"), "{first}");
    assert!(first.contains(&format!(
        "MEMPROF_AGENT_SUMMARY={}",
        logs.join("run-000.summary.json").display()
    )));
    assert!(seen(1).contains("run-001.summary.json"));
    assert!(
        logs.join("run-001.summary.json").is_file(),
        "--logs keeps the files"
    );
}

#[test]
fn nvml_peak_is_null_with_the_reason_when_nvml_is_absent() {
    let sidecar = Path::new(MEMPROF).with_file_name("memprof-sidecar");
    assert!(
        sidecar.is_file(),
        "build the sidecar first: cargo build -p memprof-sidecar"
    );
    let dir = TempDir::new("nvml");
    let j = dir.path("s.json");
    let out = sweep(
        &[
            "--nvml",
            "--vary",
            "BATCH_SIZE=1",
            "--steps",
            "2",
            "--json",
            j.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let run = &json(&j)["runs"][0];
    assert_eq!(run["status"], "ok");
    if std::fs::metadata("/dev/nvidiactl").is_err() {
        assert_eq!(run["nvmlPeakBytes"], Value::Null, "never a silent 0");
        assert!(
            run["nvmlNote"]
                .as_str()
                .unwrap()
                .starts_with("NVML not available"),
            "{run}"
        );
    }
}

#[test]
fn no_usable_run_exits_1_and_bad_flags_say_what_to_write() {
    let out = Command::new(MEMPROF)
        .args(["sweep", "--vary", "X=1", "--", "false"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stdout).contains("failed"));
    let out = Command::new(MEMPROF)
        .args(["sweep", "--vary", "BATCH_SIZE", "--", "true"])
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    let nvml = Command::new(MEMPROF)
        .args(["sweep", "--metric", "nvml", "--", "true"])
        .output()
        .unwrap();
    assert!(
        text(&nvml.stderr).contains("--metric nvml needs --nvml"),
        "{}",
        text(&nvml.stderr)
    );
    assert!(
        text(&out.stderr).contains("expected VAR=v1,v2"),
        "{}",
        text(&out.stderr)
    );
}

/// Parses the report with Python's html.parser: every non-void element
/// closed in order, and what it holds (figure ids, SVG count, table rows,
/// anything that would reach the network or run a script).
const CHECK_HTML: &str = r#"
import html.parser, json, sys
VOID = {"meta", "br", "hr", "img", "input", "link", "col", "area", "base", "wbr", "source"}
class P(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack, self.errors, self.figures, self.svgs, self.rows = [], [], [], 0, 0
        self.scripts, self.external, self.in_svg = 0, [], 0
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "figure": self.figures.append(a.get("id"))
        if tag == "svg": self.svgs += 1
        if tag == "tr": self.rows += 1
        if tag == "script": self.scripts += 1
        for k in ("src", "href"):
            if k in a: self.external.append(a[k])
        if tag not in VOID: self.stack.append(tag)
    def handle_startendtag(self, tag, attrs):
        for k in ("src", "href"):
            if k in dict(attrs): self.external.append(dict(attrs)[k])
    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append("unexpected </%s> with %s open" % (tag, self.stack[-3:]))
        else:
            self.stack.pop()
p = P()
p.feed(open(sys.argv[1]).read())
p.close()
print(json.dumps({"errors": p.errors, "open": p.stack, "figures": p.figures, "svgs": p.svgs,
                  "rows": p.rows, "scripts": p.scripts, "external": p.external}))
"#;

#[test]
fn the_html_report_parses_and_holds_every_plot_and_the_table() {
    let dir = TempDir::new("html");
    let h = dir.path("r.html");
    let plots = dir.path("plots");
    let out = sweep(
        &[
            "--vary",
            "BATCH_SIZE=1,2,4,16",
            "--vary",
            "SEQ_LEN=128,256",
            "--steps",
            "3",
            "--note",
            "fake trainer on CPU",
            "--no-verify",
            "--html",
            h.to_str().unwrap(),
            "--plot-dir",
            plots.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let checked = Command::new("python3")
        .args(["-c", CHECK_HTML, h.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(checked.status.success(), "{}", text(&checked.stderr));
    let v: Value = serde_json::from_slice(&checked.stdout).unwrap();
    assert_eq!(v["errors"], serde_json::json!([]), "{v}");
    assert_eq!(v["open"], serde_json::json!([]), "{v}");
    let figures = [
        "peak-BATCH_SIZE",
        "peak-SEQ_LEN",
        "timeline",
        "heatmap",
        "step",
        "breakdown",
        "tradeoff",
    ];
    assert_eq!(
        v["figures"],
        serde_json::json!(figures.map(|f| format!("plot-{f}")))
    );
    assert_eq!(v["svgs"], figures.len());
    assert_eq!(v["rows"], 1 + 8, "a header and one row per configuration");
    assert_eq!(v["scripts"], 0);
    assert_eq!(
        v["external"],
        serde_json::json!([]),
        "nothing fetched from anywhere"
    );
    let doc = std::fs::read_to_string(&h).unwrap();
    assert!(doc.contains("fake trainer on CPU"));
    assert!(
        doc.contains("largest safe BATCH_SIZE = 4 (ran"),
        "the recommendation is in the report"
    );
    assert!(
        doc.contains(">OOM (SEQ_LEN=128, SEQ_LEN=256)</text>"),
        "OOM runs are marked"
    );
    assert!(
        doc.contains(">activations (peak)</text>"),
        "the breakdown is stacked"
    );
    // The timeline: one line per configuration that left one (the OOM runs
    // write none), over steps; the heatmap writes OOM in the cells that hit
    // one; the step chart is the largest run that ran.
    for ok in ["BATCH_SIZE=4 SEQ_LEN=256", "BATCH_SIZE=1 SEQ_LEN=128"] {
        assert!(doc.contains(&format!(">{ok}</text>")), "{ok}");
    }
    assert_eq!(
        doc.matches(">OOM</text>").count(),
        2,
        "16 × 128 and 16 × 256"
    );
    assert!(doc.contains("One step, forward / backward / optimizer (BATCH_SIZE=4 SEQ_LEN=256)"));
    // One clip path per line chart, so no chart clips to another's area.
    assert_eq!(
        doc.matches("<clipPath id=\"plot-").count(),
        5,
        "peak ×2, timeline, step, trade-off"
    );
    assert!(!doc.contains("id=\"plot\""));

    // --plot-dir: every figure as SVG and PNG.
    for f in figures {
        let svg = std::fs::read_to_string(plots.join(format!("{f}.svg"))).unwrap();
        assert!(svg.trim_end().ends_with("</svg>"), "{f}");
        let png = std::fs::read(plots.join(format!("{f}.png"))).unwrap();
        assert!(
            png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 2000,
            "{f}"
        );
    }
}

#[test]
fn compare_reads_two_sweeps_and_says_what_grew() {
    let dir = TempDir::new("compare");
    let (a, b) = (dir.path("a.json"), dir.path("b.json"));
    for (path, per_sample) in [(&a, "1000000000"), (&b, "1500000000")] {
        let out = sweep(
            &[
                "--vary",
                "BATCH_SIZE=1,2,8",
                "--steps",
                "2",
                "--no-verify",
                "--json",
                path.to_str().unwrap(),
            ],
            &[("FAKE_PER_SAMPLE", per_sample)],
        );
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    }
    let c = memprof::cli::local::compare_files::compare_paths(&a, &b)
        .expect("two sweep results compare");
    assert_eq!(c.kind, "sweep");
    // 8 × 0.5 GB more activations: 10.1 GB → 14.1 GB reserved.
    assert_eq!(
        c.grew[0],
        "BATCH_SIZE=8: peak reserved grew 3.7GiB (+39.6%)"
    );
    let act = c
        .rows
        .iter()
        .find(|r| r.scope == "BATCH_SIZE=8" && r.item == "breakdown activationsPeakBytes")
        .unwrap();
    assert_eq!(act.delta, Some(4e9));
    let per_unit = c.rows.iter().find(|r| r.item == "per unit").unwrap();
    assert!((per_unit.delta.unwrap() - 5e8).abs() < 1.0, "{per_unit:?}");
    let err = memprof::cli::local::compare_files::compare_paths(&a, &dir.path("missing.json"))
        .unwrap_err();
    assert!(err.to_string().starts_with("cannot read"), "{err}");
}
