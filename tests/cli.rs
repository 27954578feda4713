//! The `memprof` binary's cluster commands against the real local control
//! plane: profiles rolled up by the in-process operator from reports written
//! as the sidecars write them; every subcommand and output format; the
//! kubeconfig context's namespace; `-A`; errors; `kubectl memprof` through
//! kubectl's own plugin and completion mechanisms. kubectl's printing flags
//! against `kubectl get` are in `tests/cli_printing.rs`.

use crate::cli_support;
use crate::common;

use cli_support::*;
use common::*;
use memprof::api::RiskLevel;
use std::path::Path;
#[tokio::test]
async fn every_cluster_command_in_every_format_against_real_profiles() {
    let Some(client) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&client).await;
    let _op = start_operator(&client, &ns.name);
    two_jobs(&client, &ns.name).await;
    let n = ns.name.as_str();

    // top: worst first, kubectl columns; wide adds columns; json/yaml parse.
    let top = ok(&["top", "-n", n]).await;
    let lines: Vec<&str> = top.lines().collect();
    assert!(
        lines[0].starts_with(
            "JOB     RISK       TTO     CAUSE   PEAK            NOW%   IMBALANCE   RANKS   LEAK"
        ),
        "{top}"
    );
    // The operator ages the 90 s prediction to now (the report is seconds old).
    let train: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(train[..2], ["train", "critical"], "{top}");
    assert!(
        train[2].starts_with("1m") || train[2].ends_with('s'),
        "{top}"
    );
    // No cause in these made-up reports: the column says so.
    assert_eq!(train[3..6], ["-", "70.0GiB", "(88%)"], "{top}");
    assert!(lines[2].starts_with("calm    low"), "{top}");
    assert!(ok(&["top", "-n", n, "-o", "wide"])
        .await
        .contains("BOTTLENECK"));
    // -o json: a kubectl List of the MemoryProfiles, worst first, typed fields.
    let list = json(&ok(&["top", "-n", n, "-o", "json"]).await);
    assert_eq!(
        (&list["apiVersion"], &list["kind"]),
        (&"v1".into(), &"List".into())
    );
    let rows = &list["items"];
    assert_eq!(rows[0]["kind"], "MemoryProfile");
    assert_eq!(rows[0]["spec"]["jobName"], "train");
    assert_eq!(rows[0]["status"]["risk"], "critical");
    assert_eq!(rows[0]["status"]["peakUsedBytes"], 70 * GIB);
    assert_eq!(rows[0]["status"]["ranksReporting"], 2);
    assert_eq!(rows[1]["spec"]["jobName"], "calm");
    assert_eq!(yaml(&ok(&["top", "-n", n, "-o", "yaml"]).await), list);
    // --watch, not on a terminal: whole tables one after the other, no escapes.
    let watched = ok(&[
        "top",
        "-n",
        n,
        "--watch",
        "--interval",
        "0.1",
        "--watch-count",
        "2",
    ])
    .await;
    assert_eq!(watched.matches("JOB ").count(), 2, "{watched}");
    assert!(!watched.contains('\x1b'), "{watched:?}");

    // report JOB: the profile in words, one row per rank with its sparkline.
    let report = ok(&["report", "train", "-n", n]).await;
    assert!(
        report.contains(&format!("MemoryProfile {n}/train (job train)")),
        "{report}"
    );
    assert!(report.contains("risk: critical"), "{report}");
    // The reports come from the simulated backend: the report says so.
    assert!(
        report.contains("\n  NOTE: simulated data, not measured on a GPU\n"),
        "{report}"
    );
    assert!(!report.contains("stale ranks"), "fresh reports: {report}");
    let rank1 = report
        .lines()
        .find(|l| l.starts_with("1 ") && l.contains("node-1"))
        .unwrap_or_else(|| panic!("no rank 1 row:\n{report}"));
    assert!(
        rank1.contains("70.0GiB") && rank1.contains("critical"),
        "{rank1}"
    );
    // Sparklines scale from 0 to the GPU's total: rank 1 climbs 40 -> 70 of
    // 80 GiB (▅ to ▇), rank 0 30 -> 40 GiB (▄ to ▅).
    let spark = |row: &str| row.split_whitespace().last().unwrap().to_string();
    let rank0 = report
        .lines()
        .find(|l| l.starts_with("0 ") && l.contains("node-0"))
        .unwrap_or_else(|| panic!("no rank 0 row:\n{report}"));
    assert_eq!(spark(rank1).chars().count(), 60, "{rank1}");
    assert!(
        spark(rank1).starts_with('▅') && spark(rank1).ends_with('▇'),
        "{rank1}"
    );
    assert!(
        spark(rank0).starts_with('▄') && spark(rank0).ends_with('▅'),
        "{rank0}"
    );
    assert!(ok(&["report", "train", "-n", n, "-o", "wide"])
        .await
        .contains("GPU-sim-0001"));
    let list = json(&ok(&["report", "train", "-n", n, "-o", "json"]).await);
    assert_eq!(list["kind"], "List");
    let kinds: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["MemoryProfile", "MemoryReport", "MemoryReport"]);
    assert_eq!(list["items"][0]["status"]["risk"], "critical");
    // Rank 1's timeline is packed, rank 0's in the objects of a sidecar
    // from before the packed form: both stored as written.
    let gpu = |i: usize| &list["items"][i]["spec"]["gpus"][0];
    assert_eq!(list["items"][2]["spec"]["rank"], 1);
    let packed = gpu(2)["packedTimeline"].as_str().unwrap();
    assert_eq!(packed.split(' ').count(), 60, "{packed}");
    assert!(gpu(2).get("timeline").is_none());
    assert_eq!(list["items"][1]["spec"]["rank"], 0);
    assert_eq!(gpu(1)["timeline"].as_array().unwrap().len(), 60);
    assert!(gpu(1).get("packedTimeline").is_none());
    assert!(list["items"][0]["metadata"].get("managedFields").is_none());
    assert_eq!(
        yaml(&ok(&["report", "train", "-n", n, "-o", "yaml"]).await),
        list
    );
    let all = ok(&["report", "-n", n]).await;
    assert!(
        all.contains("/calm (job calm)") && all.contains("/train (job train)"),
        "{all}"
    );
    let all = json(&ok(&["report", "-n", n, "-o", "json"]).await);
    assert_eq!(all["items"].as_array().unwrap().len(), 2);
    let also = ok(&["report", &format!("{n}/calm"), "-n", "default"]).await;
    assert!(
        also.contains("risk: low"),
        "NAMESPACE/JOB overrides -n: {also}"
    );

    // plot: SVG that parses, with each rank's series and the axis labels.
    let dir = TempDir::new();
    let svg_path = dir.0.join("train.svg");
    let svg_arg = svg_path.to_str().unwrap();
    ok(&["plot", "train", "-n", n, "--out", svg_arg]).await;
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    // PNG in-process (resvg), no rasteriser on the PATH needed.
    let png_path = dir.0.join("train.png");
    let out = memprof(
        &[
            "plot",
            "train",
            "-n",
            n,
            "--out",
            png_path.to_str().unwrap(),
        ],
        &[("PATH", "/nonexistent")],
    )
    .await;
    assert!(out.status.success(), "{}", texts(&out).1);
    let png = std::fs::read(&png_path).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    // The IHDR width: the SVG's width at twice the scale.
    let svg_width: f64 = roxmltree::Document::parse(&svg)
        .unwrap()
        .root_element()
        .attribute("width")
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        u32::from_be_bytes(png[16..20].try_into().unwrap()),
        2 * svg_width as u32
    );
    // MEMPROF_CLI_SAMPLES=DIR keeps the picture and the tables (how
    // docs/plots/ and the outputs in docs/cli.md were made).
    if let Some(keep) = std::env::var_os("MEMPROF_CLI_SAMPLES") {
        let keep = Path::new(&keep);
        std::fs::write(keep.join("kubectl-memprof-plot.svg"), &svg).unwrap();
        std::fs::write(keep.join("kubectl-memprof-plot.png"), &png).unwrap();
        std::fs::write(keep.join("top.txt"), &top).unwrap();
        std::fs::write(keep.join("report.txt"), &report).unwrap();
        let cmp = ok(&["compare", "calm", "train", "-n", n]).await;
        std::fs::write(keep.join("compare.txt"), cmp).unwrap();
    }
    let doc = roxmltree::Document::parse(&svg).unwrap_or_else(|e| panic!("bad SVG ({e})"));
    let text: Vec<&str> = doc
        .descendants()
        .filter(|n| n.is_text())
        .filter_map(|n| n.text())
        .collect();
    for want in [
        "rank 0",
        "rank 1",
        "GPU memory total",
        "GPU 0",
        "rank 1 on node-1",
    ] {
        assert!(
            text.contains(&want),
            "{want:?} not among the SVG's texts {text:?}"
        );
    }
    for want in [
        "time since first sample",
        "used memory",
        "GPU memory of Job train by rank",
        "Peak GPU memory of Job train per GPU",
    ] {
        assert!(
            text.iter().any(|t| t.contains(want)),
            "{want:?} not in {text:?}"
        );
    }
    let chart = ok(&[
        "plot", "train", "-n", n, "--chart", "timeline", "--width", "60",
    ])
    .await;
    assert!(
        chart.contains("rank 0") && chart.contains("rank 1") && chart.lines().count() > 10,
        "{chart}"
    );
    if let Some(keep) = std::env::var_os("MEMPROF_CLI_SAMPLES") {
        let text = ok(&["plot", "train", "-n", n]).await;
        std::fs::write(Path::new(&keep).join("plot.txt"), text).unwrap();
    }

    // compare: side by side, batch size from the Jobs' env.
    let cmp = ok(&["compare", "calm", "train", "-n", n]).await;
    assert!(
        cmp.lines().next().unwrap().contains(&format!("{n}/calm")),
        "{cmp}"
    );
    assert!(cmp.contains("BATCH SIZE   16"), "{cmp}");
    assert!(
        cmp.lines()
            .any(|l| l.starts_with("BATCH SIZE") && l.contains("32")),
        "{cmp}"
    );
    assert!(
        cmp.lines()
            .any(|l| l.starts_with("PEAK") && l.ends_with("+250%")),
        "{cmp}"
    );
    let cmp = json(&ok(&["compare", "calm", "train", "-n", n, "-o", "json"]).await);
    assert_eq!(cmp["b"]["batchSize"], "32");
    assert_eq!(cmp["b"]["risk"], "critical");
    yaml(&ok(&["compare", "calm", "train", "-n", n, "-o", "yaml"]).await);

    // policy explain takes the same flags.
    let explain = ok(&["policy", "explain", "train", "-n", n]).await;
    assert!(explain.contains(&format!("Job {n}/train")), "{explain}");
}

#[tokio::test]
async fn the_kubeconfig_contexts_namespace_is_where_commands_look() {
    let Some(client) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&client).await;
    let _op = start_operator(&client, &ns.name);
    two_jobs(&client, &ns.name).await;
    let dir = TempDir::new();
    let kc = kubeconfig_copy(&dir.0, &ns.name, None);
    let kc = kc.to_str().unwrap();

    // Through $KUBECONFIG, as kubectl: no -n anywhere.
    let env = [("KUBECONFIG", kc)];
    let out = memprof(&["report", "train"], &env).await;
    let (stdout, stderr) = texts(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.contains(&format!("MemoryProfile {}/train", ns.name)),
        "{stdout}"
    );
    let out = memprof(&["top", "-o", "json"], &env).await;
    let rows = json(&texts(&out).0)["items"].clone();
    assert_eq!(rows.as_array().unwrap().len(), 2, "{rows}");
    assert_eq!(rows[0]["metadata"]["namespace"], ns.name.as_str());
    // Through --kubeconfig and --context.
    let top = ok(&["top", "--kubeconfig", kc, "--context", "memprof-local"]).await;
    assert!(top.contains("train") && top.contains("calm"), "{top}");
    // -n still wins over the context.
    let other = ok(&["top", "--kubeconfig", kc, "-n", "default"]).await;
    assert!(!other.contains("train   critical"), "{other}");
    // A context that is not there is named, with those that are.
    let out = memprof(&["top", "--kubeconfig", kc, "--context", "nope"], &[]).await;
    let (_, stderr) = texts(&out);
    assert!(!out.status.success());
    assert!(
        stderr.contains("context \"nope\" is not in the kubeconfig; contexts there: memprof-local"),
        "{stderr}"
    );
}

#[tokio::test]
async fn all_namespaces_lists_jobs_of_every_namespace() {
    let Some(client) = cluster().await else {
        return;
    };
    let (a, b) = (
        TestNamespace::create(&client).await,
        TestNamespace::create(&client).await,
    );
    let _op_a = start_operator(&client, &a.name);
    let _op_b = start_operator(&client, &b.name);
    two_jobs(&client, &a.name).await;
    two_jobs(&client, &b.name).await;
    let top = ok(&["top", "-A"]).await;
    let header: Vec<&str> = top.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header[..3], ["NAMESPACE", "JOB", "RISK"], "{top}");
    for ns in [&a.name, &b.name] {
        for job in ["train", "calm"] {
            assert!(
                top.lines()
                    .any(|l| l.starts_with(ns.as_str()) && l.contains(&format!(" {job} "))),
                "{ns}/{job} not in:\n{top}"
            );
        }
    }
    let rows = json(&ok(&["top", "--all-namespaces", "-o", "json"]).await);
    let ours = rows["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["metadata"]["namespace"])
        .filter(|ns| *ns == a.name.as_str() || *ns == b.name.as_str())
        .count();
    assert_eq!(ours, 4);
    let report = ok(&["report", "-A"]).await;
    assert!(
        report.contains(&format!("{}/train", a.name))
            && report.contains(&format!("{}/train", b.name))
    );
    // One Job and -A do not go together.
    let out = memprof(&["report", "train", "-A"], &[]).await;
    assert!(texts(&out)
        .1
        .contains("use -n NAMESPACE (or NAMESPACE/JOB), not -A"));
}

#[tokio::test]
async fn errors_say_what_exists_and_what_to_do_without_a_backtrace() {
    let Some(client) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&client).await;
    let _op = start_operator(&client, &ns.name);
    two_jobs(&client, &ns.name).await;
    let n = ns.name.as_str();
    for args in [
        vec!["report", "trian", "-n", n],
        vec!["plot", "trian", "-n", n],
        vec!["compare", "train", "trian", "-n", n],
    ] {
        let out = memprof(&args, &[("RUST_BACKTRACE", "1")]).await;
        let (_, stderr) = texts(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert_eq!(
            stderr,
            format!(
                "error: no MemoryProfile {n}/trian; MemoryProfiles in namespace {n}: calm, train\n"
            ),
            "{args:?}"
        );
    }
    // kubectl's NotFound: one line, exit 1 (it said "not found" and exited 0).
    let out = memprof(&["policy", "explain", "nope", "-n", n], &[]).await;
    let (stdout, stderr) = texts(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert_eq!(
        stderr,
        format!("error: no Job {n}/nope: `kubectl get jobs -n {n}` lists them (or pass NAMESPACE/JOB, -n)\n")
    );
    let empty = TestNamespace::create(&client).await;
    let out = memprof(&["report", "x", "-n", &empty.name], &[]).await;
    assert!(texts(&out).1.contains(&format!(
        "there are no MemoryProfiles in namespace {}",
        empty.name
    )));
    // As kubectl: the note on stderr, nothing on stdout (a pipe gets nothing).
    let out = memprof(&["top", "-n", &empty.name], &[]).await;
    let (stdout, stderr) = texts(&out);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stdout, "");
    assert_eq!(
        stderr,
        format!("No MemoryProfiles found in namespace {}.\n", empty.name)
    );
    let out = memprof(&["report", "-n", &empty.name], &[]).await;
    assert_eq!(texts(&out), (String::new(), stderr.clone()));

    // Nothing listening: the server is named, no Rust error dump.
    let dir = TempDir::new();
    let kc = kubeconfig_copy(&dir.0, "default", Some("https://127.0.0.1:1"));
    let out = memprof(
        &["top", "--kubeconfig", kc.to_str().unwrap()],
        &[("RUST_BACKTRACE", "1")],
    )
    .await;
    let (_, stderr) = texts(&out);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr.starts_with("error: no cluster reachable at https://127.0.0.1:1/"),
        "{stderr}"
    );
    assert!(!stderr.contains("stack backtrace"), "{stderr}");
}

#[tokio::test]
async fn kubectl_runs_the_plugin_and_completes_it() {
    let Some(client) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&client).await;
    let _op = start_operator(&client, &ns.name);
    two_jobs(&client, &ns.name).await;
    // Installed as kubectl's plugin: the binary as kubectl-memprof, the helper beside it.
    let dir = TempDir::new();
    std::fs::copy(BIN, dir.0.join("kubectl-memprof")).unwrap();
    let helper = Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/kubectl_complete-memprof");
    std::fs::copy(&helper, dir.0.join("kubectl_complete-memprof")).unwrap();
    let path = format!(
        "{}:{}",
        dir.0.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let kubectl = |args: Vec<&str>| {
        let path = path.clone();
        let args: Vec<String> = args.into_iter().map(String::from).collect();
        async move {
            let mut cmd = tokio::process::Command::new("kubectl");
            cmd.args(&args).env("PATH", path).kill_on_drop(true);
            let out = tokio::time::timeout(TIMEOUT, cmd.output())
                .await
                .unwrap()
                .unwrap();
            let (stdout, stderr) = texts(&out);
            assert!(out.status.success(), "kubectl {args:?}: {stderr}");
            stdout
        }
    };
    let version = format!("memprof {}\n", env!("CARGO_PKG_VERSION"));
    assert_eq!(ok(&["--version"]).await, version);
    assert_eq!(kubectl(vec!["memprof", "--version"]).await, version);
    let top = kubectl(vec!["memprof", "top", "-n", &ns.name]).await;
    assert!(top.contains("train   critical"), "{top}");
    // kubectl ≥ 1.26 asks kubectl_complete-memprof, which asks memprof __complete.
    let subs = kubectl(vec!["__complete", "memprof", "re"]).await;
    assert!(subs.lines().any(|l| l.starts_with("report\t")), "{subs}");
    assert!(subs.trim_end().ends_with(":4"), "{subs}");
    let jobs = kubectl(vec!["__complete", "memprof", "report", "-n", &ns.name, "t"]).await;
    assert!(jobs.lines().any(|l| l.starts_with("train")), "{jobs}");
    assert!(!jobs.contains("calm"), "{jobs}");
    let formats = kubectl(vec!["__complete", "memprof", "top", "-o", ""]).await;
    for f in ["table", "wide", "json", "yaml"] {
        assert!(formats.lines().any(|l| l.starts_with(f)), "{formats}");
    }
    // The shells' own scripts.
    for shell in ["bash", "zsh", "fish"] {
        let script = ok(&["completion", shell]).await;
        assert!(
            script.contains("memprof") && script.contains("report"),
            "{shell}: {script}"
        );
    }
}

#[tokio::test]
async fn two_files_are_compared_as_files_without_a_cluster() {
    let dir = TempDir::new();
    let (a, b) = (dir.0.join("a.json"), dir.0.join("b.json"));
    for (path, peak) in [(&a, 40), (&b, 60)] {
        let r = report(
            "train",
            0,
            &at(0),
            vec![gpu(0, peak, peak, RiskLevel::Low, None)],
        );
        std::fs::write(path, serde_json::to_string(&r).unwrap()).unwrap();
    }
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    // No cluster at all: the files alone decide.
    let nowhere = dir.0.join("no-kubeconfig");
    let env = [("KUBECONFIG", nowhere.to_str().unwrap())];
    let out = memprof(&["compare", a, b], &env).await;
    let (stdout, stderr) = texts(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("60.0GiB"), "{stdout}");
    let out = memprof(&["compare", a, b, "-o", "json"], &env).await;
    json(&texts(&out).0);
}
