//! `memprof report [JOB]` (also `kubectl memprof report`): what the operator
//! concluded about a job, from its MemoryProfile, in words; its ranks'
//! reports as a table with each one's AGE; the stale ranks and a data source
//! that is not a measurement named. kubectl's printing flags print the
//! objects (`-o json`: a List of the profile and its reports).

use crate::kube::client::{self as k, CliError, ListArgs, Scope};
use crate::kube::ranks::{self, JobAge, StaleRule};
use crate::output::{self, printer, PrintArgs, Printed, Table, WatchArgs};
use jiff::Timestamp;
use kube::ResourceExt;
use memprof_api::{
    format_bytes, format_duration, format_rate, MemoryProfile, MemoryProfileStatus, MemoryReport,
    LABEL_JOB,
};
use std::fmt::Write;

/// Flags of `memprof report`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Job name, or NAMESPACE/JOB; every profile in scope when left out.
    pub job: Option<String>,
    #[command(flatten)]
    pub list: ListArgs,
    #[command(flatten)]
    pub print: PrintArgs,
    #[command(flatten)]
    pub watch: WatchArgs,
    /// Call a rank stale when its last report is older than this (`150`,
    /// `150s`, `2m`; a bare number is seconds). Default: the operator's verdict (two of the sidecar's
    /// heartbeats plus 30 s; 150 s by default).
    #[arg(long, value_name = "DURATION", value_parser = crate::duration::parse)]
    pub stale_after: Option<std::time::Duration>,
    /// Write the Job's newest CUDA OOM snapshot (the largest live blocks and
    /// where they were allocated) to FILE as the pickle PyTorch's memory_viz
    /// opens; needs JOB.
    #[arg(long, value_name = "FILE", requires = "job")]
    pub oom_snapshot: Option<std::path::PathBuf>,
}

/// Now and `--stale-after`: what ages are measured against.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    /// Now.
    pub now: Timestamp,
    /// `--stale-after`, or the operator's verdict.
    pub rule: StaleRule,
}

/// Fetches and prints (with `--watch`, again and again); returns the exit code.
pub async fn run(args: Args) -> Result<i32, CliError> {
    if let Some(p) = &args.oom_snapshot {
        crate::outfile::prepare("--oom-snapshot", p).map_err(|e| CliError::Usage(e.to_string()))?;
    }
    let (client, scope) = args.list.connect().await?;
    let selector = args.list.selector.as_deref();
    output::watch(args.watch, || async {
        let clock = Clock {
            now: Timestamp::now(),
            rule: StaleRule::from_flag(args.stale_after),
        };
        match &args.job {
            Some(job) => {
                let ns = k::single_namespace(&scope, "memprof report JOB")?;
                let (ns, job) = k::split_ref(job, &ns);
                let profile = k::get_profile(&client, ns, job).await?;
                let reports = k::job_reports(&client, ns, &profile.spec.job_name).await?;
                if let Some(path) = &args.oom_snapshot {
                    write_oom_snapshot(path, &profile, &reports)?;
                }
                Ok(render_job(&profile, &reports, &args.print, clock))
            }
            None => {
                let profiles = k::list_profiles(&client, &scope, selector).await?;
                let reports = match args.print.is_table() && !profiles.is_empty() {
                    true => k::list_reports(&client, &scope, None).await?,
                    false => Vec::new(),
                };
                Ok(render_all(&profiles, &reports, &scope, &args.print, clock))
            }
        }
    })
    .await?;
    Ok(0)
}

/// The Job's newest OOM: the pod the roll-up names, its own report's
/// snapshot (8 blocks, 4 frames each) when it still holds it, else the
/// profile's copy (4 blocks, 2 frames each).
pub fn newest_oom(
    p: &MemoryProfile,
    reports: &[MemoryReport],
) -> Option<(String, memprof_api::OomSnapshotSummary)> {
    let last = p.status.as_ref()?.allocator.as_ref()?.last_oom.as_ref()?;
    let own = reports
        .iter()
        .filter(|r| r.spec.pod_name == last.pod)
        .filter_map(|r| r.spec.allocator.as_ref()?.oom.clone())
        .find(|o| o.time == last.snapshot.time);
    Some((
        last.pod.clone(),
        own.unwrap_or_else(|| last.snapshot.clone()),
    ))
}

/// `--oom-snapshot`: written, or one line saying the Job had no OOM (on
/// stderr: stdout may be `-o json` being piped).
fn write_oom_snapshot(
    path: &std::path::Path,
    p: &MemoryProfile,
    reports: &[MemoryReport],
) -> Result<(), CliError> {
    match newest_oom(p, reports) {
        Some((pod, oom)) => {
            crate::memviz::write(path, &oom).map_err(|e| {
                CliError::Usage(format!("--oom-snapshot {}: {e}", path.display()))
            })?;
            eprintln!("{} (pod {pod})", crate::memviz::written(path, &oom));
        }
        None => eprintln!(
            "memprof report: no agent of job {} saw a CUDA OOM, nothing written to {} (--oom-snapshot)",
            p.spec.job_name,
            path.display()
        ),
    }
    Ok(())
}

/// One Job: the profile in words and its ranks' table, or the profile and
/// its reports as a List (what `-o json` prints and jsonpath reads).
pub fn render_job(
    p: &MemoryProfile,
    reports: &[MemoryReport],
    print: &PrintArgs,
    clock: Clock,
) -> Printed {
    if !print.is_table() {
        let mut items = vec![printer::object(p)];
        items.extend(reports.iter().map(printer::object));
        return print.print(&items, Clone::clone, |_| Table::default(), "");
    }
    let age = ranks::job_age_of(p.status.as_ref(), reports, clock.now, clock.rule);
    let mut out = render_with(p, reports, &age);
    out.push_str(&memprof_analysis::sites_section(
        p.status.as_ref(),
        reports.iter().map(|r| &r.spec),
    ));
    out.push_str(&render_ranks(reports, print, clock.now, &age));
    out.into()
}

/// Every profile in scope, each in words with its reports (or all of them
/// as the printing flags ask).
pub fn render_all(
    profiles: &[MemoryProfile],
    reports: &[MemoryReport],
    scope: &Scope,
    print: &PrintArgs,
    clock: Clock,
) -> Printed {
    let none = format!("No MemoryProfiles found in {}.", scope.describe());
    if !print.is_table() || profiles.is_empty() {
        return print.print(profiles, printer::object, |_| Table::default(), &none);
    }
    let text = profiles
        .iter()
        .map(|p| {
            let mine = reports_of(p, reports);
            let age = ranks::job_age_of(p.status.as_ref(), &mine, clock.now, clock.rule);
            render_with(p, &mine, &age)
        })
        .collect::<Vec<_>>()
        .join("\n");
    text.into()
}

/// The reports of `p`'s Job among `reports` (same namespace, `memprof.dev/job`).
fn reports_of(p: &MemoryProfile, reports: &[MemoryReport]) -> Vec<MemoryReport> {
    let ns = p.namespace();
    reports
        .iter()
        .filter(|r| r.namespace() == ns && r.labels().get(LABEL_JOB) == Some(&p.spec.job_name))
        .cloned()
        .collect()
}

/// One row per GPU of each rank, with the report's AGE (`(stale)` after it
/// for a rank in `age.stale`) and the GPU's recent memory as a sparkline
/// (the report's 60-point timeline, highest use per point); `--no-headers`
/// leaves the header out.
pub fn render_ranks(
    reports: &[MemoryReport],
    print: &PrintArgs,
    now: Timestamp,
    age: &JobAge,
) -> String {
    if reports.is_empty() {
        return "  no MemoryReports for this Job yet\n".to_string();
    }
    let wide = print.wide();
    let mut headers = vec![
        "RANK", "POD", "NODE", "GPU", "USED", "PEAK", "TOTAL", "RISK", "TTO", "CAUSE", "AGE",
        "RECENT",
    ];
    if wide {
        headers.extend(["GROWTH", "UTIL", "SOURCE", "UUID", "SAMPLED"]);
    }
    let mut table = Table::new(headers);
    for r in reports {
        let rank = r.spec.rank.map_or("-".into(), |x| x.to_string());
        let node = r.spec.node_name.clone().unwrap_or_else(|| "-".into());
        let mut since = ranks::age_seconds(r, now).map_or("-".into(), output::age);
        if age.is_stale_pod(&r.spec.pod_name) {
            since.push_str(" (stale)");
        }
        for g in &r.spec.gpus {
            let mut row = gpu_cells(r, g, [&rank, &node, &since]);
            if wide {
                row.extend(wide_cells(r, g));
            }
            table.row(row);
        }
        if r.spec.gpus.is_empty() {
            table.row([
                rank,
                r.name_any(),
                node,
                "-".into(),
                "no GPU visible".into(),
            ]);
        }
    }
    let mut out = String::from("\nranks:\n");
    out.push_str(&table.no_headers(print.no_headers).render());
    out
}

/// RANK to RECENT of one GPU, given its report's rank, node and AGE.
fn gpu_cells(
    r: &MemoryReport,
    g: &memprof_api::GpuReport,
    [rank, node, since]: [&String; 3],
) -> Vec<String> {
    // Scaled from 0 to the GPU's total, not to the line's own range:
    // ranks then compare at a glance (30→40 GiB is not 40→70 GiB).
    let mut line = vec![0.0, g.total_bytes as f64];
    line.extend(g.points().iter().map(|p| p.max as f64));
    let spark: String = crate::plot::sparkline(&line).chars().skip(2).collect();
    vec![
        rank.clone(),
        r.spec.pod_name.clone(),
        node.clone(),
        g.index.to_string(),
        format_bytes(g.used_bytes),
        format_bytes(g.peak_bytes),
        format_bytes(g.total_bytes),
        g.risk_text(),
        g.tto_text(),
        g.cause_text().to_string(),
        since.clone(),
        spark,
    ]
}

/// GROWTH, UTIL, SOURCE, UUID, SAMPLED of one GPU (`-o wide`).
fn wide_cells(r: &MemoryReport, g: &memprof_api::GpuReport) -> [String; 5] {
    [
        g.growth_text(),
        g.utilization_percent
            .map_or("-".into(), |u| format!("{u}%")),
        g.source.to_string(),
        g.uuid.clone(),
        r.spec.sampled_at.clone(),
    ]
}

/// One profile for a terminal, with what its reports add: a data source
/// that is not a measurement, and the ranks that stopped reporting (`age`).
pub fn render_with(p: &MemoryProfile, reports: &[MemoryReport], age: &JobAge) -> String {
    let text = render(p);
    let (first, rest) = text.split_once('\n').unwrap_or((&text, ""));
    let mut out = format!("{first}\n");
    if let Some(src) = ranks::not_measured(reports) {
        let _ = writeln!(out, "  NOTE: {src}");
    }
    if let Some(line) = ranks::stale_line(age) {
        let _ = writeln!(out, "{line}");
    }
    out.push_str(rest);
    out
}

/// Renders one profile for a terminal.
pub fn render(p: &MemoryProfile) -> String {
    let mut out = String::new();
    let name = p.metadata.name.clone().unwrap_or_default();
    let ns = p.metadata.namespace.clone().unwrap_or_default();
    let _ = writeln!(out, "MemoryProfile {ns}/{name} (job {})", p.spec.job_name);
    let Some(st) = &p.status else {
        let _ = writeln!(out, "  no status yet: no sidecar has reported (is the sidecar injected and allowed to write memoryreports?)");
        return out;
    };
    render_summary(&mut out, st);
    render_findings(&mut out, st);
    render_closest(&mut out, st);
    render_history(&mut out, st);
    out
}

/// Ranks, risk, peak, imbalance, bottleneck.
fn render_summary(out: &mut String, st: &MemoryProfileStatus) {
    let _ = writeln!(
        out,
        "  ranks reporting: {}   GPUs: {}",
        st.ranks, st.gpu_count
    );
    let _ = writeln!(
        out,
        "  risk: {} (confidence {:.0}%)   time to OOM: {}",
        st.risk,
        st.confidence * 100.0,
        st.time_to_oom.as_deref().unwrap_or("-")
    );
    if let Some(c) = &st.cause {
        let _ = writeln!(out, "  cause: {}", c.line());
    }
    let _ = writeln!(
        out,
        "  peak: {}   now: {} ({:.0}%)",
        st.peak,
        format_bytes(st.current_used_bytes),
        st.current_percent
    );
    if let Some(i) = st.imbalance {
        let _ = writeln!(out, "  imbalance (max/mean of per-GPU peak): {i:.2}");
    }
    if let Some(b) = &st.bottleneck {
        let rank = b.rank.map_or("-".to_string(), |r| r.to_string());
        let _ = writeln!(
            out,
            "  bottleneck: rank {rank}, pod {}, node {}, GPU {} ({})",
            b.pod,
            b.node.as_deref().unwrap_or("-"),
            b.gpu_index,
            b.gpu_uuid
        );
    }
}

/// What the analysis found: leak, fragmentation, the agents' view, the
/// breakdown, the batch recommendation, the thresholds used.
fn render_findings(out: &mut String, st: &MemoryProfileStatus) {
    if st.leak_suspected {
        let _ = writeln!(
            out,
            "  leak suspected on ranks {:?}: memory between steps keeps growing",
            st.leak_ranks
        );
    }
    if let Some(f) = st.fragmentation {
        let _ = writeln!(
            out,
            "  fragmentation: {:.0}% of reserved memory holds no tensor",
            f * 100.0
        );
    }
    crate::render::agent_sections(out, st);
    if let Some(r) = &st.batch_recommendation {
        out.push_str(&memprof_analysis::batchfit::render(r));
    }
    if let Some(t) = &st.thresholds {
        out.push_str(&memprof_api::thresholds::render(t));
    }
}

/// The ranks closest to an OOM.
fn render_closest(out: &mut String, st: &MemoryProfileStatus) {
    if !st.top_ranks.is_empty() {
        let _ = writeln!(out, "  closest to OOM:");
        for r in &st.top_ranks {
            let rank = r.location.rank.map_or("-".to_string(), |r| r.to_string());
            let tto = r
                .time_to_oom_seconds
                .map_or("-".to_string(), format_duration);
            let cause = r
                .cause
                .map_or(String::new(), |c| format!("{}  ", c.as_str()));
            let risk = r.risk.to_string();
            let peak = format_bytes(r.peak_bytes);
            let total = format_bytes(r.total_bytes);
            // The roll-up keeps a growth only where the verdict stands behind it.
            let growth = if r.growth_bytes_per_second == 0.0 {
                "-".to_string()
            } else {
                format_rate(r.growth_bytes_per_second)
            };
            // The operator keeps a silent rank's last numbers: say they are old.
            let stale = if r.stale {
                ", stale: its last report"
            } else {
                ""
            };
            let pod = &r.location.pod;
            let _ = writeln!(
                out,
                "    rank {rank:>4}  {risk:<8}  peak {peak:>9} / {total:<9}  growth {growth:>11}  TTO {tto}  {cause}({pod}{stale})",
            );
        }
    }
}

/// OOMs seen, remediations taken, conditions.
fn render_history(out: &mut String, st: &MemoryProfileStatus) {
    for o in &st.ooms {
        let _ = writeln!(out, "  OOM at {} in pod {}: {}", o.time, o.pod, o.evidence);
    }
    for r in &st.remediations {
        let _ = writeln!(
            out,
            "  remediation {} [{}] {} by {}",
            r.id, r.phase, r.action, r.policy
        );
        // What the engineer asks first: what it kept or lost, who answered.
        if let Some(m) = r.message.as_deref().filter(|m| !m.is_empty()) {
            let _ = writeln!(out, "    {m}");
        }
        if let Some(a) = &r.acknowledged {
            let _ = writeln!(out, "    trainers: {}", a.summary);
        }
    }
    for c in &st.conditions {
        let _ = writeln!(
            out,
            "  condition {}={} ({}): {}",
            c.type_, c.status, c.reason, c.message
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_api::{
        AgentOomRecord, AllocatorRollup, MemoryGrowth, MemoryProfileStatus, OomBlock,
        OomSnapshotSummary,
    };

    #[test]
    fn the_allocator_section_says_leak_or_cache_advice_and_what_held_the_memory() {
        let mut p = MemoryProfile::new(
            "train",
            memprof_api::MemoryProfileSpec {
                job_name: "train".into(),
                expected_ranks: Some(2),
            },
        );
        p.status = Some(MemoryProfileStatus {
            allocator: Some(AllocatorRollup {
                ranks_with_agent: 2,
                growth: MemoryGrowth::Cache,
                cache_ranks: vec![1],
                advice: Some(
                    "rank 1: fragmentation: set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
                        .into(),
                ),
                slowest_steps_per_second: Some(2.5),
                slowest_rank: Some(0),
                last_oom: Some(AgentOomRecord {
                    pod: "train-0".into(),
                    rank: Some(0),
                    snapshot: OomSnapshotSummary {
                        time: "2026-11-22T10:00:10Z".into(),
                        requested_bytes: Some(2 << 30),
                        source: "history".into(),
                        blocks: vec![OomBlock {
                            size_bytes: 6 << 30,
                            count: Some(1500),
                            frames: vec!["train.py:42 leak".into(), "train.py:99 main".into()],
                        }],
                        ..Default::default()
                    },
                }),
            }),
            ..Default::default()
        });
        let text = render(&p);
        for want in [
            "allocator (agent in 2 rank(s)): cache: reserved memory grows on ranks [1]",
            "advice: rank 1: fragmentation: set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
            "slowest rank: 0 at 2.50 steps/s",
            "CUDA OOM at 2026-11-22T10:00:10Z in pod train-0 (rank 0), asked for 2.0GiB",
            "6.0GiB in 1500 blocks  train.py:42 leak <- train.py:99 main",
        ] {
            assert!(text.contains(want), "{want:?} not in:\n{text}");
        }
        assert!(!text.contains("MEMPROF_AGENT_RECORD_HISTORY"));
    }

    #[test]
    fn the_oom_snapshot_comes_from_the_pods_own_report_when_it_still_holds_it() {
        let snap = |blocks: usize, time: &str| OomSnapshotSummary {
            time: time.into(),
            blocks: vec![OomBlock::default(); blocks],
            ..Default::default()
        };
        let mut p = MemoryProfile::new(
            "train",
            memprof_api::MemoryProfileSpec {
                job_name: "train".into(),
                expected_ranks: None,
            },
        );
        assert!(newest_oom(&p, &[]).is_none(), "no status, no OOM");
        p.status = Some(MemoryProfileStatus {
            allocator: Some(AllocatorRollup {
                last_oom: Some(AgentOomRecord {
                    pod: "train-1".into(),
                    rank: Some(1),
                    snapshot: snap(4, "t1"),
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        let report = |pod: &str, oom: Option<OomSnapshotSummary>| {
            MemoryReport::new(
                pod,
                memprof_api::MemoryReportSpec {
                    pod_name: pod.into(),
                    allocator: Some(memprof_api::AllocatorStats {
                        oom,
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            )
        };
        let (pod, o) = newest_oom(&p, &[]).unwrap();
        assert_eq!(
            (pod.as_str(), o.blocks.len()),
            ("train-1", 4),
            "the profile's copy"
        );
        let reports = [
            report("train-0", Some(snap(8, "t1"))),
            report("train-1", Some(snap(8, "t1"))),
        ];
        assert_eq!(newest_oom(&p, &reports).unwrap().1.blocks.len(), 8);
        // The pod's report moved on to a later OOM the roll-up has not seen.
        let moved = [report("train-1", Some(snap(8, "t2")))];
        assert_eq!(newest_oom(&p, &moved).unwrap().1.time, "t1");
    }

    #[test]
    fn memprof_report_shows_the_profiles_breakdown() {
        let mut p = memprof_api::MemoryProfile::new(
            "train",
            memprof_api::MemoryProfileSpec {
                job_name: "train".into(),
                expected_ranks: Some(4),
            },
        );
        p.status = Some(memprof_api::MemoryProfileStatus {
            breakdown: Some(crate::render::breakdown::tests::lora()),
            ..Default::default()
        });
        let text = render(&p);
        assert!(
            text.contains("memory breakdown (rank 2, pod train-2, step 3, batch 16)"),
            "{text}"
        );
        p.status = Some(Default::default());
        assert!(!render(&p).contains("memory breakdown"));
    }

    #[test]
    fn the_batch_recommendation_is_shown_as_batchfit_renders_it() {
        use memprof_analysis::batchfit::{recommend, Evidence};
        use memprof_api::{BatchObservation, DEFAULT_HEADROOM_FRACTION};
        const GIB: u64 = 1 << 30;
        let obs = |batch, gib: f64| BatchObservation {
            batch,
            peak_bytes: (gib * GIB as f64) as u64,
            total_bytes: 80 * GIB,
        };
        let seen = [obs(36, 73.7), obs(48, 76.1), obs(64, 79.3)];
        let rec = recommend(&Evidence {
            env_var: "BATCH_SIZE",
            current: Some(36),
            limit_bytes: Some(80 * GIB),
            headroom_fraction: DEFAULT_HEADROOM_FRACTION,
            breakdown: None,
            observations: &seen,
        });
        let mut p = MemoryProfile::new(
            "train",
            memprof_api::MemoryProfileSpec {
                job_name: "train".into(),
                expected_ranks: None,
            },
        );
        p.status = Some(MemoryProfileStatus {
            batch_recommendation: Some(rec.clone()),
            ..Default::default()
        });
        let report = render(&p);
        assert!(
            report.contains(&memprof_analysis::batchfit::render(&rec)),
            "{report}"
        );
        assert!(
            report.contains("batch size: BATCH_SIZE = 36 now; largest safe 25 (predicted peak 71.5GiB; extrapolated 11 below"),
            "{report}"
        );
    }

    #[test]
    fn a_remediation_says_what_it_kept_and_which_trainers_answered() {
        let mut p = MemoryProfile::new(
            "train",
            memprof_api::MemoryProfileSpec {
                job_name: "train".into(),
                expected_ranks: None,
            },
        );
        let acknowledged = memprof_api::Acknowledgements {
            summary: "2/3 acknowledged (1 pending: rank 2)".into(),
            ..Default::default()
        };
        p.status = Some(MemoryProfileStatus {
            remediations: vec![
                memprof_api::RemediationRecord {
                    id: "a1".into(),
                    policy: "shrink".into(),
                    action: "scaleBatch BATCH_SIZE 32->24".into(),
                    phase: "Done".into(),
                    message: Some("checkpoint step 900 kept; lost 3 s since it".into()),
                    ..Default::default()
                },
                memprof_api::RemediationRecord {
                    id: "b2".into(),
                    policy: "tell".into(),
                    action: "notifyTrainer critical".into(),
                    phase: "Done".into(),
                    acknowledged: Some(acknowledged),
                    ..Default::default()
                },
            ],
            ..Default::default()
        });
        let report = render(&p);
        assert!(
            report.contains("    checkpoint step 900 kept; lost 3 s since it\n"),
            "{report}"
        );
        assert!(
            report.contains("    trainers: 2/3 acknowledged (1 pending: rank 2)\n"),
            "{report}"
        );
    }
}
