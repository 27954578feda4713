//! Scale benchmark of the operator against the local control plane (not a
//! timed test): `--jobs` Jobs of `--ranks` ranks, one real pod and one
//! MemoryReport per rank, then burst rounds (every rank writes at once) and
//! a paced phase (the sidecars' steady-state budget, one write per rank per
//! 30 s). Measures report write → profile status reflects it, the largest
//! status, the operator's RSS and CPU (read from /proc of the
//! `memprof-operator` binary run as a child process) and its writes to the
//! API server per second (from its /metrics).
//!
//! ```text
//! eval "$(bash hack/local-cluster.sh env)"; export KUBECONFIG
//! cargo build --release --bin memprof-operator --example operator_scale
//! target/release/examples/operator_scale --jobs 1 --ranks 2048
//! target/release/examples/operator_scale --jobs 200 --ranks 16
//! # one Job against one JobSet of 256 child Jobs x 8 pods, A/B (scale_support/ab.rs)
//! target/release/examples/operator_scale --workload jobset --ranks 2048 --pods-per-job 8
//! # one Job against one PyTorchJob of a master and 2,047 workers, A/B
//! target/release/examples/operator_scale --workload pytorchjob --ranks 2048
//! ```
//!
//! Setup (pods, first reports) is not timed: see `scale_support/setup.rs` for how the
//! pods come to exist. The run deletes its namespace and stops the operator
//! by PID, also on failure and on Ctrl-C.

mod scale_support;
use scale_support::ab::{self, Case};
use scale_support::{jobset, load, measure, pytorchjob, setup};

use clap::Parser;
use kube::api::{Api, DeleteParams};
use kube::Client;
use load::{Clock, Shape, Write};
use measure::{percentile, proc_usage, scrape, wait_reflected, writes_between, Seen, Usage};
use memprof::api::{MemoryProfile, MemoryReport};
use setup::RankPod;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Goals of the scale run: report -> status p99 of one Job
/// (2,048 x 1, 256 x 8), and of many Jobs at once (200 x 16).
const GOAL_P99_MS_ONE_JOB: f64 = 1000.0;
const GOAL_P99_MS_MANY_JOBS: f64 = 2000.0;
const GOAL_RSS_KIB: u64 = 100 * 1024;
const GOAL_STATUS_BYTES: usize = 16 * 1024;
/// How long a batch of writes may take to show in the statuses before the run is called broken.
const REFLECT_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, Parser)]
struct Args {
    /// Jobs profiled at once.
    #[arg(long, default_value_t = 1)]
    jobs: usize,
    /// Ranks per Job (its parallelism): one pod and one MemoryReport each.
    #[arg(long, default_value_t = 256)]
    ranks: u32,
    /// GPUs in each rank's report.
    #[arg(long, default_value_t = 1)]
    gpus_per_rank: u32,
    /// Burst rounds: every rank's report rewritten, `--lanes` writes in flight.
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// Writes in flight during bursts.
    #[arg(long, default_value_t = 16)]
    lanes: usize,
    /// Writes per second of the paced phase; default: all ranks / 30 s, the
    /// sidecars' steady-state budget (one write per rank per 30 s).
    #[arg(long)]
    paced_rate: Option<f64>,
    /// The operator binary; default: `memprof-operator` next to this example's directory.
    #[arg(long)]
    operator_bin: Option<std::path::PathBuf>,
    /// PID of the local kube-apiserver, to report its CPU time beside the operator's.
    #[arg(long)]
    apiserver_pid: Option<u32>,
    /// Also write every timed write to this CSV (`round,job,done_s,latency_ms,rtt_ms`;
    /// `done_s` from the batch's first response), to see when a tail happens.
    #[arg(long)]
    latencies: Option<std::path::PathBuf>,
    /// A flag for the operator (repeat for more), e.g. `--operator-arg=--concurrency=16`.
    #[arg(long = "operator-arg", allow_hyphen_values = true)]
    operator_args: Vec<String>,
    /// `job`: `--jobs` Jobs of `--ranks` ranks. `jobset`: A/B in one run:
    /// one Job of `--ranks` ranks against one JobSet of `--ranks` ranks
    /// (child Jobs of `--pods-per-job` pods), each in its own namespace with
    /// its own operator, `--repeat` times, the order swapped every time.
    /// `pytorchjob`: the same A/B against one PyTorchJob of `--ranks` ranks
    /// (a master and `--ranks - 1` workers).
    #[arg(long, value_enum, default_value_t = Workload::Job)]
    workload: Workload,
    /// Pods of each JobSet child Job (`--workload jobset`): 8 is one Job per
    /// node of 8 GPUs, as JobSet runs multi-node training; 1 is a Job per rank.
    #[arg(long, default_value_t = 8)]
    pods_per_job: u32,
    /// A/B pairs (`--workload jobset` or `pytorchjob`).
    #[arg(long, default_value_t = 1)]
    repeat: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Workload {
    Job,
    Jobset,
    Pytorchjob,
}

impl Args {
    fn total_ranks(&self) -> usize {
        self.jobs * self.ranks as usize
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let client = Client::try_default().await?;
    setup::install_crds(&client).await?;
    match args.workload {
        Workload::Job => run_case(&client, &args, Case::Jobs).await.map(|_| ()),
        Workload::Jobset => {
            anyhow::ensure!(
                args.jobs == 1 && args.pods_per_job > 0 && args.ranks % args.pods_per_job == 0,
                "--workload jobset compares one Job with one JobSet: --jobs 1, and --ranks a multiple of --pods-per-job"
            );
            compare(&client, &args, Case::JobSet).await
        }
        Workload::Pytorchjob => {
            anyhow::ensure!(
                args.jobs == 1 && args.ranks > 0,
                "--workload pytorchjob compares one Job with one PyTorchJob: --jobs 1"
            );
            // Served before its operator starts, which looks for the API once a minute.
            jobset::install_workload_crds(&client).await?;
            compare(&client, &args, Case::PyTorchJob).await
        }
    }
}

/// One Job against `other` of the same ranks, `--repeat` pairs (`ab.rs`).
async fn compare(client: &Client, args: &Args, other: Case) -> anyhow::Result<()> {
    let outcomes = ab::pairs(args.repeat, other, |case| run_case(client, args, case)).await?;
    ab::print(&outcomes, args.ranks, other, &case_name(args, other));
    Ok(())
}

/// What `case` profiles, in words.
fn case_name(args: &Args, case: Case) -> String {
    match case {
        Case::Jobs => "Job(s)".to_string(),
        Case::JobSet => format!(
            "JobSet of {} child Jobs x {} pods",
            args.ranks / args.pods_per_job.max(1),
            args.pods_per_job
        ),
        Case::PyTorchJob => format!(
            "PyTorchJob of 1 master and {} workers",
            args.ranks.saturating_sub(1)
        ),
    }
}

/// One measured run in a namespace of its own, with an operator of its own.
async fn run_case(client: &Client, args: &Args, case: Case) -> anyhow::Result<ab::Outcome> {
    static RUNS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let ns = format!("memprof-bench-{}-{run}", std::process::id());
    setup::create_namespace(client, &ns).await?;
    let operator =
        operator_bin(args).and_then(|bin| setup::Operator::start(&bin, &ns, &args.operator_args));
    let result = match &operator {
        Ok(op) => tokio::select! {
            r = bench(client, &ns, args, op, case) => r,
            _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        },
        Err(e) => Err(anyhow::anyhow!("{e}")),
    };
    // Clean up whatever happened: the operator by its PID, then the namespace.
    if let Ok(op) = operator {
        op.stop().await;
    }
    let deleted = delete_namespace(client, &ns).await;
    result.and_then(|r| deleted.map(|()| r))
}

fn operator_bin(args: &Args) -> anyhow::Result<std::path::PathBuf> {
    if let Some(bin) = &args.operator_bin {
        return Ok(bin.clone());
    }
    let exe = std::env::current_exe()?;
    let target = exe
        .parent()
        .and_then(|p| p.parent())
        .ok_or_else(|| anyhow::anyhow!("{} has no target directory", exe.display()))?;
    Ok(target.join("memprof-operator"))
}

/// Deletes the namespace and waits up to 60 s for the namespace controller to finish.
async fn delete_namespace(client: &Client, ns: &str) -> anyhow::Result<()> {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    namespaces.delete(ns, &DeleteParams::background()).await?;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(60) {
        if namespaces.get_opt(ns).await?.is_none() {
            println!(
                "  cleanup: namespace {ns} deleted in {:.0} s",
                started.elapsed().as_secs_f64()
            );
            return Ok(());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    println!("  cleanup: namespace {ns} still terminating after 60 s (the namespace controller finishes it)");
    Ok(())
}

/// One measured phase: its writes, how long they took to issue, their latencies.
struct Phase {
    writes: usize,
    secs: f64,
    /// Each write's Job and report -> status latency, ms.
    latencies: Vec<(usize, f64)>,
    /// Round trips of the writes themselves, ms, sorted.
    rtts: Vec<f64>,
}

/// Writes batches of reports and times them (what a latency is: measure.rs).
struct Driver<'a> {
    reports: Api<MemoryReport>,
    /// One write per rank, rank-major across Jobs.
    order: Vec<&'a RankPod>,
    /// The ranks of the write that follows each batch, by batch parity (see `settle`).
    markers: [Vec<&'a RankPod>; 2],
    clock: Clock,
    /// Every write so far, markers included: (Job, `peakUsedBytes`) → resourceVersion.
    all: Vec<Write>,
    seen: Arc<Mutex<Seen>>,
    names: Vec<String>,
    lanes: usize,
    gpus_per_rank: u32,
    /// `--latencies`.
    dump: Option<std::path::PathBuf>,
}

impl Driver<'_> {
    fn shape(&self, round: u32) -> Shape {
        Shape {
            gpus_per_rank: self.gpus_per_rank,
            round,
        }
    }

    /// Every rank writes once, `lanes` in flight.
    async fn burst(&mut self, round: u32) -> anyhow::Result<Phase> {
        let t = Instant::now();
        let shape = self.shape(round);
        let writes = load::burst(
            &self.reports,
            &self.order,
            &mut self.clock,
            shape,
            self.lanes,
        )
        .await?;
        let secs = t.elapsed().as_secs_f64();
        self.settle(writes, round, secs).await
    }

    /// Every rank writes once, started `rate` per second.
    async fn paced(&mut self, round: u32, rate: f64) -> anyhow::Result<Phase> {
        let t = Instant::now();
        let shape = self.shape(round);
        let writes = load::paced(&self.reports, &self.order, &mut self.clock, shape, rate).await?;
        let secs = t.elapsed().as_secs_f64();
        self.settle(writes, round, secs).await
    }

    /// Waits until the batch shows in the statuses. Writes in flight together
    /// land in any order, so the batch's last writes may never be followed
    /// by a newer peak of their Job: one more write per Job (rank 1 after
    /// an odd batch, rank 2 after an even one; not timed), issued once the
    /// batch is complete, follows them all. Those last writes are timed to
    /// when it shows, which errs late.
    async fn settle(&mut self, writes: Vec<Write>, round: u32, secs: f64) -> anyhow::Result<Phase> {
        let shape = self.shape(round);
        let markers = load::burst(
            &self.reports,
            &self.markers[round as usize % 2],
            &mut self.clock,
            shape,
            self.lanes,
        )
        .await?;
        self.all.extend(writes.iter().cloned());
        self.all.extend(markers);
        let mut rtts: Vec<f64> = writes.iter().map(|w| w.rtt_ms).collect();
        rtts.sort_by(f64::total_cmp);
        let timed: Vec<Write> = writes.iter().filter(|w| w.timed).cloned().collect();
        let rv_of = measure::versions(&self.all);
        let latencies =
            wait_reflected(&self.seen, &timed, &rv_of, &self.names, REFLECT_TIMEOUT).await?;
        if let Some(path) = &self.dump {
            dump(path, round, &timed, &latencies)?;
        }
        Ok(Phase {
            writes: writes.len(),
            secs,
            latencies,
            rtts,
        })
    }
}

/// Appends a batch's writes to the `--latencies` CSV.
fn dump(
    path: &std::path::Path,
    round: u32,
    writes: &[Write],
    latencies: &[(usize, f64)],
) -> anyhow::Result<()> {
    use std::io::Write as _;
    let first = writes.iter().map(|w| w.done).min();
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    for (w, (job, ms)) in writes.iter().zip(latencies) {
        let done = first.map_or(0.0, |f| (w.done - f).as_secs_f64());
        writeln!(f, "{round},{job},{done:.3},{ms:.1},{:.1}", w.rtt_ms)?;
    }
    Ok(())
}

async fn bench(
    client: &Client,
    ns: &str,
    args: &Args,
    op: &setup::Operator,
    case: Case,
) -> anyhow::Result<ab::Outcome> {
    let started = Instant::now();
    let pods = create_pods(client, ns, args, case).await?;
    let pods_secs = started.elapsed().as_secs_f64();
    let (seen, watch) = measure::watch_profiles(Api::namespaced(client.clone(), ns));
    let mut driver = Driver::new(client, ns, args, &pods, seen.clone());

    // Round 0 creates the reports and the profiles fill up: not measured.
    let t = Instant::now();
    driver.burst(0).await?;
    let create_secs = t.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(1)).await;

    let before = Snapshot::take(op, args).await;
    let (burst, paced, rate) = measure_phases(&mut driver, args).await?;
    let after = Snapshot::take(op, args).await;
    watch.abort();
    let max_status = seen
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .max_status_bytes;
    let profiles = Api::<MemoryProfile>::namespaced(client.clone(), ns)
        .list(&Default::default())
        .await?;

    print_header(args, case, pods.len(), pods_secs, create_secs);
    let goal = if args.jobs > 1 {
        GOAL_P99_MS_MANY_JOBS
    } else {
        GOAL_P99_MS_ONE_JOB
    };
    print_phase(
        &format!(
            "burst ({} rounds, every rank at once, {} in flight)",
            args.rounds, args.lanes
        ),
        &burst,
        goal,
    );
    print_phase(
        &format!("paced ({rate:.0} writes/s = 1 per rank per 30 s)"),
        &paced,
        goal,
    );
    print_profiles(&profiles.items, args.ranks, max_status);
    print_usage(&before, &after);
    Ok(outcome(case, &burst, &paced, &before, &after))
}

/// The workload of `case` and one pod per rank (setup, not measured).
async fn create_pods(
    client: &Client,
    ns: &str,
    args: &Args,
    case: Case,
) -> anyhow::Result<Vec<RankPod>> {
    match case {
        Case::Jobs => setup::create_workload(client, ns, args.jobs, args.ranks).await,
        Case::JobSet => {
            let replicas = args.ranks / args.pods_per_job;
            jobset::create_jobset(client, ns, replicas, args.pods_per_job).await
        }
        Case::PyTorchJob => pytorchjob::create_pytorchjob(client, ns, args.ranks).await,
    }
}

/// What the A/B compares of one run.
fn outcome(
    case: Case,
    burst: &Phase,
    paced: &Phase,
    before: &Snapshot,
    after: &Snapshot,
) -> ab::Outcome {
    ab::Outcome {
        case,
        burst: measure::sorted(&burst.latencies),
        paced: measure::sorted(&paced.latencies),
        cpu_seconds: after.operator.cpu_seconds - before.operator.cpu_seconds,
        events: metric_delta(
            &before.metrics,
            &after.metrics,
            "memprof_reports_seen_total",
        ),
        reconciles: metric_delta(&before.metrics, &after.metrics, "memprof_reconciles_total"),
        load: (before.load.clone(), after.load.clone()),
    }
}

fn metric_delta(
    before: &std::collections::BTreeMap<String, f64>,
    after: &std::collections::BTreeMap<String, f64>,
    name: &str,
) -> f64 {
    after.get(name).copied().unwrap_or(0.0) - before.get(name).copied().unwrap_or(0.0)
}

impl<'a> Driver<'a> {
    fn new(
        client: &Client,
        ns: &str,
        args: &Args,
        pods: &'a [RankPod],
        seen: Arc<Mutex<Seen>>,
    ) -> Self {
        let batches = args.rounds as usize + 2;
        Driver {
            reports: Api::namespaced(client.clone(), ns),
            order: load::round_order(pods),
            // Ranks 1 and 2 by turns, never 0 nor the same twice in a row:
            // a write of the rank that was written last changes nothing a
            // user sees (its place in `topRanks` stays), so the operator
            // rightly holds it back (load.rs, `Clock`). Each batch starts
            // with rank 0; and when a Job's whole batch lands between two
            // of its status writes, only the batch's end state is written,
            // which must differ from the last batch's end state: with the
            // same marker rank, `topRanks` read the same after every batch
            // and small shapes measured the 30 s cosmetic hold.
            markers: [1, 2].map(|r| pods.iter().filter(|p| p.rank == r % args.ranks).collect()),
            clock: Clock::for_writes((args.total_ranks() + args.jobs) * batches),
            all: Vec::new(),
            seen,
            names: (0..args.jobs).map(setup::job_name).collect(),
            lanes: args.lanes,
            gpus_per_rank: args.gpus_per_rank,
            dump: args.latencies.clone(),
        }
    }
}

/// The measured window: `--rounds` bursts, then one paced round; the
/// bursts together, the paced round, and its rate (writes/s).
async fn measure_phases(
    driver: &mut Driver<'_>,
    args: &Args,
) -> anyhow::Result<(Phase, Phase, f64)> {
    let mut burst = Phase {
        writes: 0,
        secs: 0.0,
        latencies: Vec::new(),
        rtts: Vec::new(),
    };
    for round in 1..=args.rounds {
        let p = driver.burst(round).await?;
        burst.writes += p.writes;
        burst.secs += p.secs;
        burst.latencies.extend(p.latencies);
        burst.rtts.extend(p.rtts);
    }
    burst.rtts.sort_by(f64::total_cmp);
    let rate = args.paced_rate.unwrap_or(args.total_ranks() as f64 / 30.0);
    let paced = driver.paced(args.rounds + 1, rate).await?;
    Ok((burst, paced, rate))
}

/// What the processes had used at one moment of the window.
struct Snapshot {
    at: Instant,
    load: String,
    operator: Usage,
    metrics: std::collections::BTreeMap<String, f64>,
    this: Usage,
    apiserver: Option<Usage>,
}

impl Snapshot {
    async fn take(op: &setup::Operator, args: &Args) -> Snapshot {
        Snapshot {
            at: Instant::now(),
            load: loadavg(),
            operator: proc_usage(&op.pid.to_string()),
            metrics: scrape(&op.metrics_addr).await,
            this: proc_usage("self"),
            apiserver: args.apiserver_pid.map(|p| proc_usage(&p.to_string())),
        }
    }
}

fn print_header(args: &Args, case: Case, pods: usize, pods_secs: f64, create_secs: f64) {
    let what = case_name(args, case);
    println!(
        "operator_scale: {} {what} x {} ranks ({} GPU each) = {} pods and MemoryReports; \
         2 cores shared by the API server, etcd, the operator and this load generator",
        args.jobs,
        args.ranks,
        args.gpus_per_rank,
        args.total_ranks()
    );
    println!(
        "  setup (not measured): {pods} pods in {pods_secs:.0} s; first reports written and shown in {create_secs:.0} s"
    );
    if !args.operator_args.is_empty() {
        println!("  operator flags: {}", args.operator_args.join(" "));
    }
}

/// The operator's, the API server's and this process's use over the window.
fn print_usage(before: &Snapshot, after: &Snapshot) {
    let window_secs = after.at.duration_since(before.at).as_secs_f64();
    print_operator(
        before.operator,
        after.operator,
        window_secs,
        &before.metrics,
        &after.metrics,
    );
    let cpu = |a: Usage, b: Usage| b.cpu_seconds - a.cpu_seconds;
    let this = cpu(before.this, after.this);
    match (before.apiserver, after.apiserver) {
        (Some(a), Some(b)) => println!(
            "  same machine, same window: kube-apiserver CPU {:.1} s ({:.0} % of a core), this load generator {this:.1} s",
            cpu(a, b), 100.0 * cpu(a, b) / window_secs
        ),
        _ => println!("  same machine, same window: this load generator CPU {this:.1} s"),
    }
    println!(
        "  1-minute load average of the 2-core machine: {} at the start of the window, {} at its end",
        before.load, after.load
    );
}

fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "MISSED"
    }
}

fn print_phase(what: &str, p: &Phase, goal_p99_ms: f64) {
    let all = measure::sorted(&p.latencies);
    let p99 = percentile(&all, 0.99);
    println!(
        "  {what}: {} writes at {:.0}/s; report -> status ({} timed) p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms (goal p99 <= {goal_p99_ms:.0} ms: {})",
        p.writes, p.writes as f64 / p.secs.max(1e-9), all.len(),
        percentile(&all, 0.5), p99, percentile(&all, 1.0),
        verdict(p99 <= goal_p99_ms)
    );
    let medians = measure::job_medians(&p.latencies);
    if medians.len() > 1 {
        let (median, worst) = (percentile(&medians, 0.5), percentile(&medians, 1.0));
        let ratio = worst / median.max(1e-9);
        println!(
            "    (per Job median: best Job {:.0} ms, median Job {median:.0} ms, worst Job {worst:.0} ms: {ratio:.2}x the median; goal <= 2x: {})",
            percentile(&medians, 0.0),
            verdict(ratio <= 2.0)
        );
    }
    println!(
        "    (the report writes' own round trips: p50 {:.0} ms, p99 {:.0} ms)",
        percentile(&p.rtts, 0.5),
        percentile(&p.rtts, 0.99)
    );
}

/// The 1-minute load average: how busy the shared machine was (2 cores).
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

fn print_profiles(profiles: &[MemoryProfile], ranks: u32, max_status: usize) {
    let complete = profiles
        .iter()
        .filter(|p| {
            p.status
                .as_ref()
                .is_some_and(|s| s.ranks_reporting == ranks)
        })
        .count();
    let refusing = profiles
        .iter()
        .filter(|p| {
            p.status
                .iter()
                .flat_map(|s| &s.conditions)
                .any(|c| c.type_ == "ReportsValid" && c.status != "True")
        })
        .count();
    println!(
        "  status: largest {max_status} B (goal <= {GOAL_STATUS_BYTES} B: {}); {complete} of {} profiles count {ranks}/{ranks} ranks, {refusing} refuse reports",
        verdict(max_status <= GOAL_STATUS_BYTES), profiles.len()
    );
}

fn print_operator(
    u0: Usage,
    u1: Usage,
    secs: f64,
    m0: &std::collections::BTreeMap<String, f64>,
    m1: &std::collections::BTreeMap<String, f64>,
) {
    let cpu = u1.cpu_seconds - u0.cpu_seconds;
    println!(
        "  operator RSS: {:.1} MiB at the end, peak {:.1} MiB since start (goal <= {} MiB: {})",
        u1.rss_kib as f64 / 1024.0,
        u1.hwm_kib as f64 / 1024.0,
        GOAL_RSS_KIB / 1024,
        verdict(u1.hwm_kib <= GOAL_RSS_KIB)
    );
    println!(
        "  operator CPU: {cpu:.1} s in the {secs:.0} s measured window ({:.0} % of a core); {:.1} s since start",
        100.0 * cpu / secs, u1.cpu_seconds
    );
    let writes = writes_between(m0, m1);
    let total: f64 = writes.iter().map(|(_, n)| n).sum();
    let parts: Vec<String> = writes
        .iter()
        .map(|(what, n)| format!("{n:.0} {what}"))
        .collect();
    let reconciles = m1.get("memprof_reconciles_total").copied().unwrap_or(0.0)
        - m0.get("memprof_reconciles_total").copied().unwrap_or(0.0);
    let reconcile_secs = m1
        .get("memprof_reconcile_duration_seconds_sum")
        .copied()
        .unwrap_or(0.0)
        - m0.get("memprof_reconcile_duration_seconds_sum")
            .copied()
            .unwrap_or(0.0);
    println!(
        "  operator API writes: {:.1}/s ({}); {reconciles:.0} reconciles, {:.1} ms each on average",
        total / secs,
        parts.join(", "),
        1000.0 * reconcile_secs / reconciles.max(1.0)
    );
}
