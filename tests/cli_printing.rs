//! kubectl's printing flags in every cluster command, compared with what the
//! real `kubectl get memoryprofiles` prints for the same flags over the same
//! objects on the local control plane; and stale ranks named by `report` and
//! `top -o wide`.

use crate::cli_support;
use crate::common;

use cli_support::*;
use common::*;
use kube::Api;
use memprof::api::{MemoryProfile, RiskLevel};

/// `kubectl ARGS` must succeed; its stdout.
async fn kubectl(args: &[&str]) -> String {
    let mut cmd = tokio::process::Command::new("kubectl");
    cmd.args(args).kill_on_drop(true);
    let out = tokio::time::timeout(TIMEOUT, cmd.output())
        .await
        .expect("kubectl finished")
        .expect("running kubectl");
    let (stdout, stderr) = texts(&out);
    assert!(out.status.success(), "kubectl {args:?}: {stderr}");
    stdout
}

/// The flags whose output must be the same from `memprof top` (and
/// `memprof report` without a Job) as from `kubectl get memoryprofiles`.
/// Sorted by name where the order would otherwise differ (top sorts by risk).
fn same_as_kubectl() -> Vec<Vec<&'static str>> {
    let by_name = "--sort-by=.metadata.name";
    vec![
        vec!["-o", "name", by_name],
        vec!["-o", "name", "--sort-by", ".status.peakUsedBytes"],
        vec!["-o", "name", "-l", "memprof.dev/job=calm"],
        vec!["-o", "name", "-l", "memprof.dev/job in (calm,train)", by_name],
        vec!["-o", "jsonpath={.items[*].metadata.name}", by_name],
        vec![
            "-o",
            r#"jsonpath={range .items[*]}{.metadata.name}{"\t"}{.status.risk}{"\t"}{.status.peakPercent}{"\n"}{end}"#,
            by_name,
        ],
        vec![
            "-o",
            r#"jsonpath={.items[?(@.spec.jobName=="train")].status.ranksReporting}"#,
        ],
        vec!["-o", "jsonpath={..jobName}", by_name],
        vec![
            "-o",
            "custom-columns=NAME:.metadata.name,RISK:.status.risk,TTO:.status.timeToOomSeconds,NOPE:.status.nope",
            by_name,
        ],
        vec![
            "-o",
            "custom-columns=NAME:.metadata.name,PEAK:.status.peakUsedBytes",
            "--no-headers",
            "--sort-by=.status.peakUsedBytes",
        ],
    ]
}

#[tokio::test]
async fn printing_flags_print_what_kubectl_get_prints() {
    let Some(client) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&client).await;
    let op = start_operator(&client, &ns.name);
    two_jobs(&client, &ns.name).await;
    // The operator stopped: nothing changes between the two commands.
    drop(op);
    let n = ns.name.as_str();
    for flags in same_as_kubectl() {
        let mut get = vec!["get", "memoryprofiles", "-n", n];
        get.extend(&flags);
        let want = kubectl(&get).await;
        assert!(!want.trim().is_empty(), "kubectl {get:?} printed nothing");
        for cmd in ["top", "report"] {
            let mut ours = vec![cmd, "-n", n];
            ours.extend(&flags);
            assert_eq!(ok(&ours).await, want, "memprof {ours:?} vs kubectl {get:?}");
        }
    }
    // json and yaml: the same List (kubectl's 4-space JSON; YAML compared parsed).
    let by_name = ["--sort-by=.metadata.name"];
    for (o, parse) in [("json", json as fn(&str) -> _), ("yaml", yaml)] {
        let mut get = vec!["get", "memoryprofiles", "-n", n, "-o", o];
        get.extend(by_name);
        let want = kubectl(&get).await;
        for cmd in ["top", "report"] {
            let ours = ok(&[cmd, "-n", n, "-o", o, by_name[0]]).await;
            assert_eq!(parse(&ours), parse(&want), "memprof {cmd} -o {o}");
            if o == "json" {
                assert_eq!(ours, want, "memprof {cmd} -o json byte for byte");
            }
        }
    }
}

/// A profile carries its Job's labels, so `-l` selects what users
/// labelled, in kubectl and in `memprof top`; `-o wide` adds the
/// priority-1 columns.
#[tokio::test]
async fn a_jobs_labels_select_its_profile_and_wide_adds_columns() {
    let Some(client) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&client).await;
    let _op = start_operator(&client, &ns.name);
    two_jobs(&client, &ns.name).await;
    let n = ns.name.as_str();
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(client.clone(), n);
    let label = serde_json::json!({ "metadata": { "labels": { "team": "ml" } } });
    jobs.patch(
        "train",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&label),
    )
    .await
    .unwrap();
    let want = "memoryprofile.memprof.dev/train\n";
    eventually("the label on the profile", || async {
        let got = kubectl(&[
            "get",
            "memoryprofiles",
            "-n",
            n,
            "-l",
            "team=ml",
            "-o",
            "name",
        ])
        .await;
        (got == want).then_some(()).ok_or(got)
    })
    .await;
    assert_eq!(
        ok(&["top", "-n", n, "-l", "team=ml", "-o", "name"]).await,
        want
    );
    let wide = kubectl(&["get", "memoryprofiles", "-n", n, "-o", "wide"]).await;
    let head = wide.lines().next().unwrap_or_default();
    for col in [
        "CAUSE",
        "BOTTLENECK",
        "CONFIDENCE",
        "NOW%",
        "LEAK",
        "STALE",
        "LAST REPORT",
    ] {
        assert!(head.contains(col), "{col} missing: {head}");
    }
    let narrow = kubectl(&["get", "memoryprofiles", "-n", n]).await;
    assert!(
        !narrow
            .lines()
            .next()
            .unwrap_or_default()
            .contains("BOTTLENECK"),
        "{narrow}"
    );
}

#[tokio::test]
async fn printing_flags_of_one_jobs_report_and_of_compare() {
    let Some(client) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&client).await;
    let _op = start_operator(&client, &ns.name);
    two_jobs(&client, &ns.name).await;
    let n = ns.name.as_str();
    // report JOB: the template reads the List of the profile and its reports.
    let risk = ok(&[
        "report",
        "train",
        "-n",
        n,
        "-o",
        "jsonpath={.items[0].status.risk}",
    ])
    .await;
    assert_eq!(risk, "critical");
    let names = ok(&["report", "train", "-n", n, "-o", "name"]).await;
    let kinds: Vec<&str> = names
        .lines()
        .map(|l| l.split('/').next().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "memoryprofile.memprof.dev",
            "memoryreport.memprof.dev",
            "memoryreport.memprof.dev"
        ]
    );
    let cols = ok(&[
        "report",
        "train",
        "-n",
        n,
        "-o",
        "custom-columns=KIND:.kind,RANK:.spec.rank",
        "--no-headers",
    ])
    .await;
    assert_eq!(
        cols,
        "MemoryProfile   <none>\nMemoryReport    0\nMemoryReport    1\n"
    );
    // --no-headers on the ranks table of the text report.
    let text = ok(&["report", "train", "-n", n, "--no-headers"]).await;
    assert!(!text.contains("RANK   POD"), "{text}");
    assert!(text.contains("\nranks:\n0 "), "{text}");
    // compare: jsonpath over what -o json prints.
    let risk = ok(&[
        "compare",
        "calm",
        "train",
        "-n",
        n,
        "-o",
        "jsonpath={.b.risk} {.a.job}",
    ])
    .await;
    assert_eq!(risk, format!("critical {n}/calm"));
    // Formats a command does not print are refused when parsing, by name.
    let out = memprof(&["compare", "calm", "train", "-n", n, "-o", "name"], &[]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(
        texts(&out).1.contains("\"name\" is not an output of this command; it prints: table, wide, json, yaml, jsonpath=, jsonpath-file="),
        "{}",
        texts(&out).1
    );
    // A bad template is a usage error, before any request.
    let out = memprof(&["top", "-n", n, "-o", "jsonpath={.items"], &[]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(
        texts(&out).1.contains("unclosed action"),
        "{}",
        texts(&out).1
    );
}

#[tokio::test]
async fn plot_compare_and_policy_do_not_offer_all_namespaces() {
    for args in [
        ["plot", "train", "-A"],
        ["compare", "a", "-A"],
        ["policy", "explain", "-A"],
    ] {
        let mut argv = args.to_vec();
        if argv[0] == "compare" {
            argv.insert(2, "b");
        }
        let out = memprof(&argv, &[]).await;
        let (_, stderr) = texts(&out);
        assert_eq!(out.status.code(), Some(2), "{argv:?}: {stderr}");
        assert!(
            stderr.contains("unexpected argument '-A'"),
            "{argv:?}: {stderr}"
        );
    }
    let help = ok(&["plot", "--help"]).await;
    assert!(!help.contains("--all-namespaces"), "{help}");
    assert!(ok(&["top", "--help"]).await.contains("--all-namespaces"));
}

#[tokio::test]
async fn help_is_grouped_and_a_typo_suggests_the_closest_command() {
    let help = ok(&["--help"]).await;
    let at = |s: &str| {
        help.find(s)
            .unwrap_or_else(|| panic!("{s:?} not in:\n{help}"))
    };
    assert!(at("Cluster commands") < at("  top ") && at("  top ") < at("Local commands"));
    assert!(at("Local commands") < at("  profile "));
    assert!(help.contains("Examples:"), "{help}");
    for internal in ["  crd ", "install-agent", "__complete"] {
        assert!(!help.contains(internal), "{internal} listed:\n{help}");
    }
    // Hidden, not gone.
    assert!(ok(&["crd"])
        .await
        .contains("kind: CustomResourceDefinition"));
    let out = memprof(&["tpo"], &[]).await;
    let (_, stderr) = texts(&out);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr.contains("a similar subcommand exists: 'top'"),
        "{stderr}"
    );
    assert!(ok(&["top", "--help"])
        .await
        .contains("Examples:\n  kubectl memprof top -A -o wide"));
}

/// The cell under `header` in `row` of a kubectl-style table: cells start
/// where their header starts (left-aligned) and may hold spaces.
fn cell(table: &str, row: usize, header: &str) -> String {
    let lines: Vec<&str> = table.lines().collect();
    let head = lines[0];
    let start = head
        .find(&format!("{header} "))
        .or_else(|| head.ends_with(header).then(|| head.len() - header.len()))
        .unwrap_or_else(|| panic!("no column {header}:\n{table}"));
    let next = head[start + header.len()..]
        .find(|c: char| c != ' ')
        .map(|o| start + header.len() + o);
    let line = lines[row];
    let end = next.unwrap_or(line.len()).min(line.len());
    line.get(start..end).unwrap_or("").trim().to_string()
}

#[tokio::test]
async fn stale_ranks_are_named_with_their_age() {
    let Some(client) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&client).await;
    let _op = start_operator(&client, &ns.name);
    let n = ns.name.as_str();
    create_job_with_batch(&client, n, "quiet", 2, "8").await;
    // Rank 0 reported just now; rank 1's sidecar last wrote 10 minutes ago.
    for (rank, when) in [(0, ago(1)), (1, ago(600))] {
        let g = gpu_with_timeline(rank, 10, 20, RiskLevel::Low, None);
        let mut r = rank_report(&client, n, "quiet", rank, &when, vec![g]).await;
        // A sidecar at its default heartbeat (60 s): stale after 150 s.
        r.spec.heartbeat_seconds = Some(60);
        apply_report(&client, n, &r).await;
    }
    // The operator's verdict (status.ranksStale, staleRanks) is what is shown.
    let profiles: Api<MemoryProfile> = Api::namespaced(client.clone(), n);
    eventually("quiet rolled up with rank 1 stale", || async {
        let p = profiles.get_opt("quiet").await.map_err(|e| e.to_string())?;
        match p.and_then(|p| p.status) {
            Some(st) if st.ranks_stale == 1 && st.ranks_reporting == 1 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let report = ok(&["report", "quiet", "-n", n]).await;
    let line = report
        .lines()
        .find(|l| l.starts_with("  stale ranks: "))
        .unwrap_or_else(|| panic!("no stale line:\n{report}"));
    assert!(
        line.starts_with("  stale ranks: rank 1 (pod quiet-"),
        "{report}"
    );
    assert!(line.contains("silent 10m, last risk low)"), "{report}");
    let ranks_table = report.split("\nranks:\n").nth(1).expect("a ranks table");
    let row_of = |rank: &str| {
        ranks_table
            .lines()
            .position(|l| l.starts_with(&format!("{rank} ")))
            .unwrap_or_else(|| panic!("no rank {rank} row:\n{report}"))
    };
    assert_eq!(
        cell(ranks_table, row_of("1"), "AGE"),
        "10m (stale)",
        "{report}"
    );
    let fresh = cell(ranks_table, row_of("0"), "AGE");
    assert!(fresh.ends_with('s') && !fresh.contains("stale"), "{report}");
    let wide = ok(&["top", "-n", n, "-o", "wide"]).await;
    assert_eq!(cell(&wide, 1, "RANKS"), "1/2 (1 stale)", "{wide}");
    assert_eq!(cell(&wide, 1, "AGE"), "10m", "{wide}");
    assert_eq!(cell(&wide, 1, "STALE RANKS"), "1", "{wide}");
    // --stale-after: judged from the reports with the user's threshold.
    let lax = ok(&["report", "quiet", "-n", n, "--stale-after", "3600"]).await;
    assert!(!lax.contains("stale ranks"), "{lax}");
    let strict = ok(&["top", "-n", n, "-o", "wide", "--stale-after", "0"]).await;
    assert_eq!(cell(&strict, 1, "STALE RANKS"), "0,1", "{strict}");
}
