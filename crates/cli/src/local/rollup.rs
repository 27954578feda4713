//! `memprof rollup FILE...`: a distributed run without Kubernetes, rolled up.
//! Each file is a report `memprof profile --output` wrote (one per rank, e.g.
//! under `torchrun --no-python memprof profile --output
//! 'out/{host}-rank{rank}.json' -- python train.py` on every node), or a
//! JSON array of them. The reports are checked as the operator checks a
//! pod's, rolled up by the operator's own roll-up ([`JobRollup`]:
//! worst risk, time to OOM, imbalance, bottleneck rank/node/GPU, leak ranks,
//! the agents' verdicts) and shown as `memprof report` shows a Job.
//!
//! Exit status: 0; 1 when no file holds a usable report.

use crate::output::{self, OutputArgs, Table};
use jiff::Timestamp;
use memprof_analysis::{JobRollup, RollupLimits};
use memprof_api::{format_bytes, MemoryProfile, MemoryProfileStatus, MemoryReportSpec};
use std::fmt::Write;
use std::path::{Path, PathBuf};

/// Flags of `memprof rollup`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Report files (`memprof profile --output`), one per rank or node.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// Ranks the run has (e.g. torchrun's world size): fewer reports than
    /// this are shown as `2/4` ranks reporting.
    #[arg(long, value_name = "N")]
    pub expected_ranks: Option<u32>,
    /// Write the newest CUDA OOM's snapshot the reports hold (the largest
    /// live blocks, where they were allocated) to FILE as the pickle
    /// PyTorch's memory_viz opens.
    #[arg(long, value_name = "FILE")]
    pub oom_snapshot: Option<PathBuf>,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// Why the files could not be rolled up.
#[derive(Debug, thiserror::Error)]
pub enum RollupError {
    /// No file held a usable report.
    #[error("no usable report in {files} file(s): {why}; pass the files `memprof profile --output` wrote")]
    Nothing {
        /// How many files were read.
        files: usize,
        /// What was wrong with them.
        why: String,
    },
    /// `--oom-snapshot` names a file that cannot be written (checked first).
    #[error(transparent)]
    OutFile(#[from] crate::outfile::OutFileError),
    /// The snapshot could not be written.
    #[error("--oom-snapshot {}: {error}", .path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        error: std::io::Error,
    },
}

/// One report and the file it came from.
pub struct Loaded {
    /// The file.
    pub file: PathBuf,
    /// The report.
    pub spec: MemoryReportSpec,
}

/// Reads every file; what cannot be used is named in the second list.
pub fn load(files: &[PathBuf]) -> (Vec<Loaded>, Vec<String>) {
    let (mut ok, mut bad) = (vec![], vec![]);
    for f in files {
        match read(f) {
            Ok(specs) => {
                for spec in specs {
                    match memprof_analysis::validate_report(&spec) {
                        Ok(()) => ok.push(Loaded {
                            file: f.clone(),
                            spec,
                        }),
                        Err(why) => bad.push(format!("{}: {why}", f.display())),
                    }
                }
            }
            Err(why) => bad.push(format!("{}: {why}", f.display())),
        }
    }
    (ok, bad)
}

/// Why a file gave no reports; listed as skipped beside its name, so the
/// user sees which file to regenerate (`memprof profile --output`).
#[derive(Debug, thiserror::Error)]
enum ReadError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    #[error("not a memprof report: {0}")]
    NotAReport(serde_json::Error),
}

fn read(f: &Path) -> Result<Vec<MemoryReportSpec>, ReadError> {
    let bytes = std::fs::read(f)?;
    let v: serde_json::Value = serde_json::from_slice(&bytes)?;
    let items = match v {
        serde_json::Value::Array(items) => items,
        one => vec![one],
    };
    items
        .into_iter()
        .map(|i| serde_json::from_value(i).map_err(ReadError::NotAReport))
        .collect()
}

/// The roll-up of the loaded reports: the operator's own ([`JobRollup`],
/// what it keeps per Job), judged at the newest report's time, so a rank
/// whose file ends a few heartbeats before the others' is stale, as it would
/// be on a cluster, while a run finished an hour ago is not all stale.
pub fn status(loaded: &[Loaded], expected_ranks: Option<u32>) -> MemoryProfileStatus {
    status_of(
        loaded
            .iter()
            .enumerate()
            .map(|(i, l)| (format!("{}#{i}", l.file.display()), &l.spec)),
        expected_ranks,
    )
}

/// [`JobRollup`] over named reports, at the newest one's `sampledAt`.
pub fn status_of<'a>(
    reports: impl Iterator<Item = (String, &'a MemoryReportSpec)>,
    expected_ranks: Option<u32>,
) -> MemoryProfileStatus {
    let mut rollup = JobRollup::new(expected_ranks, RollupLimits::default());
    let mut now = Timestamp::UNIX_EPOCH;
    for (name, spec) in reports {
        if let Ok(t) = spec.sampled_at.parse::<Timestamp>() {
            now = now.max(t);
        }
        rollup.upsert(&name, spec);
    }
    rollup.status(now)
}

/// One trainer's report in words, as `profile`'s summary and `watch` show
/// it: rolled up as a Job of one rank (the shared renderer of `memprof
/// report`), then its own numbers. A report the operator's checks refuse
/// is not rolled up, and that is said rather than left out in silence.
pub fn agent_words(out: &mut String, spec: &MemoryReportSpec) {
    if spec.allocator.is_none() {
        return;
    }
    match memprof_analysis::validate_report(spec) {
        Ok(()) => {
            let status = status_of(std::iter::once(("local".to_string(), spec)), None);
            crate::render::agent_sections(out, &status);
        }
        Err(why) => {
            let _ = writeln!(
                out,
                "  (the agent's verdicts are not rolled up: the report fails the operator's checks: {why})"
            );
        }
    }
    crate::render::details::render(out, spec);
}

/// Runs the subcommand; returns the exit code.
pub async fn run(args: Args) -> Result<i32, RollupError> {
    if let Some(p) = &args.oom_snapshot {
        crate::outfile::prepare("--oom-snapshot", p)?;
    }
    let (loaded, bad) = load(&args.files);
    for b in &bad {
        eprintln!("memprof rollup: skipped {b}");
    }
    if loaded.is_empty() {
        return Err(RollupError::Nothing {
            files: args.files.len(),
            why: bad.join("; "),
        });
    }
    let st = status(&loaded, args.expected_ranks);
    let text = match args.output.format {
        f if f.is_structured() => output::structured(&st, f),
        _ => render(&loaded, &st),
    };
    output::print(&text);
    if let Some(path) = &args.oom_snapshot {
        // The roll-up keeps the newest OOM of any rank, as a Job's profile does.
        match st.allocator.as_ref().and_then(|a| a.last_oom.as_ref()) {
            Some(o) => {
                crate::memviz::write(path, &o.snapshot).map_err(|error| RollupError::Write {
                    path: path.clone(),
                    error,
                })?;
                // stderr: stdout may be `-o json` being piped.
                eprintln!("{} (pod {})", crate::memviz::written(path, &o.snapshot), o.pod);
            }
            None => eprintln!(
                "memprof rollup: no report holds a CUDA OOM, nothing written to {} (--oom-snapshot)",
                path.display()
            ),
        }
    }
    Ok(0)
}

/// The roll-up in words, as `memprof report` words a Job's profile (the same
/// renderer), then one row per GPU of each report.
pub fn render(loaded: &[Loaded], st: &MemoryProfileStatus) -> String {
    let mut p = MemoryProfile::new(
        "rollup",
        memprof_api::MemoryProfileSpec {
            job_name: "local".into(),
            expected_ranks: st.ranks_expected,
        },
    );
    p.status = Some(st.clone());
    let words = crate::kube::report::render(&p);
    let body = words.split_once('\n').map_or("", |(_, rest)| rest);
    let nodes: std::collections::BTreeSet<&str> = loaded
        .iter()
        .filter_map(|l| l.spec.node_name.as_deref())
        .collect();
    let mut out = format!(
        "memprof rollup: {} report(s) from {} node(s)\n{body}",
        loaded.len(),
        nodes.len().max(1)
    );
    for r in &st.stale_ranks {
        let _ = writeln!(
            out,
            "  stale: rank {} ({} on {}), last report {}, risk {} (still counted): it stopped reporting before the others",
            r.rank.map_or("-".into(), |k| k.to_string()),
            r.pod,
            r.node.as_deref().unwrap_or("-"),
            r.last_report_time,
            r.risk
        );
    }
    let _ = write!(out, "\nranks:\n{}", ranks(loaded).render());
    out
}

fn ranks(loaded: &[Loaded]) -> Table {
    let mut t = Table::new([
        "RANK", "NODE", "NAME", "GPU", "USED", "PEAK", "TOTAL", "RISK", "TTO", "CAUSE", "SOURCE",
        "FILE",
    ]);
    for l in loaded {
        let s = &l.spec;
        for g in &s.gpus {
            t.row([
                s.rank.map_or("-".into(), |r| r.to_string()),
                s.node_name.clone().unwrap_or_else(|| "-".into()),
                s.pod_name.clone(),
                g.index.to_string(),
                format_bytes(g.used_bytes),
                format_bytes(g.peak_bytes),
                format_bytes(g.total_bytes),
                g.risk_text(),
                g.tto_text(),
                g.cause_text().to_string(),
                g.assessed_from.unwrap_or(g.source).to_string(),
                l.file.display().to_string(),
            ]);
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_api::{GpuReport, RiskLevel};

    const G: u64 = 1 << 30;

    fn rank(r: u32, node: &str, peak: u64, risk: RiskLevel) -> Loaded {
        Loaded {
            file: format!("{node}-rank{r}.json").into(),
            spec: MemoryReportSpec {
                pod_name: format!("{node}-rank{r}"),
                node_name: Some(node.into()),
                rank: Some(r),
                sampled_at: "2026-11-22T10:00:00Z".into(),
                interval_ms: 1000,
                gpus: vec![GpuReport {
                    index: 0,
                    uuid: format!("GPU-{r}"),
                    total_bytes: 80 * G,
                    used_bytes: peak * G,
                    peak_bytes: peak * G,
                    risk,
                    time_to_oom_seconds: (risk >= RiskLevel::Medium).then_some(200.0),
                    ..Default::default()
                }],
                ..Default::default()
            },
        }
    }

    #[test]
    fn ranks_of_two_nodes_roll_up_to_the_bottleneck_imbalance_and_worst_risk() {
        let loaded = [
            rank(0, "a", 40, RiskLevel::Low),
            rank(1, "a", 40, RiskLevel::Low),
            rank(2, "b", 60, RiskLevel::High),
            rank(3, "b", 20, RiskLevel::Low),
        ];
        let st = status(&loaded, Some(4));
        let text = render(&loaded, &st);
        for want in [
            "memprof rollup: 4 report(s) from 2 node(s)",
            "ranks reporting: 4/4",
            "risk: high",
            "imbalance (max/mean of per-GPU peak): 1.50",
            "bottleneck: rank 2, pod b-rank2, node b, GPU 0 (GPU-2)",
            "b-rank2.json",
        ] {
            assert!(text.contains(want), "{want:?} not in\n{text}");
        }
        assert!(!text.contains("MemoryProfile"), "{text}");
    }

    /// The operator's staleness, judged at the newest report: a rank whose
    /// file ends 5 minutes before the others' stopped; ranks reporting 3/4.
    #[test]
    fn a_rank_that_stopped_before_the_others_is_stale_not_reporting() {
        let mut loaded = vec![
            rank(0, "a", 40, RiskLevel::Low),
            rank(1, "a", 40, RiskLevel::Low),
            rank(2, "b", 70, RiskLevel::Critical),
            rank(3, "b", 20, RiskLevel::Low),
        ];
        loaded[2].spec.sampled_at = "2026-11-22T09:55:00Z".into();
        let st = status(&loaded, Some(4));
        assert_eq!((st.ranks_reporting, st.ranks_stale), (3, 1), "{st:?}");
        assert_eq!(st.risk, RiskLevel::Critical, "a quiet rank's verdict stays");
        let text = render(&loaded, &st);
        assert!(
            text.contains(
                "stale: rank 2 (b-rank2 on b), last report 2026-11-22T09:55:00Z, risk critical"
            ),
            "{text}"
        );
        // All four from the same moment, an hour ago: none stale.
        loaded[2].spec.sampled_at = "2026-11-22T10:00:00Z".into();
        assert_eq!(status(&loaded, Some(4)).ranks_stale, 0);
    }

    #[test]
    fn one_trainers_words_say_when_its_report_cannot_be_rolled_up() {
        let mut l = rank(0, "a", 40, RiskLevel::Low);
        l.spec.allocator = Some(memprof_api::AllocatorStats {
            growth: memprof_api::MemoryGrowth::Leak,
            ..Default::default()
        });
        let mut ok = String::new();
        agent_words(&mut ok, &l.spec);
        assert!(ok.contains("allocator (agent in 1 rank(s)): leak"), "{ok}");
        assert!(ok.contains("rank 0's allocator"), "{ok}");
        l.spec.sampled_at = "yesterday".into();
        let mut refused = String::new();
        agent_words(&mut refused, &l.spec);
        assert!(
            refused.contains("not rolled up: the report fails the operator's checks: sampledAt"),
            "{refused}"
        );
        assert!(refused.contains("rank 0's allocator"), "{refused}");
    }

    #[test]
    fn files_are_one_report_or_an_array_and_bad_ones_are_named() {
        let dir = std::env::temp_dir().join(format!("memprof-rollup-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let one = dir.join("one.json");
        let many = dir.join("many.json");
        let bad = dir.join("bad.json");
        std::fs::write(
            &one,
            serde_json::to_vec(&rank(0, "a", 1, RiskLevel::Low).spec).unwrap(),
        )
        .unwrap();
        let specs = [
            rank(1, "a", 1, RiskLevel::Low).spec,
            rank(2, "a", 1, RiskLevel::Low).spec,
        ];
        std::fs::write(&many, serde_json::to_vec(&specs).unwrap()).unwrap();
        let mut impossible = rank(3, "a", 1, RiskLevel::Low).spec;
        impossible.gpus[0].used_bytes = 81 * G;
        std::fs::write(&bad, serde_json::to_vec(&impossible).unwrap()).unwrap();
        let (ok, skipped) = load(&[one, many, bad, dir.join("missing.json")]);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(ok.len(), 3);
        assert_eq!(skipped.len(), 2, "{skipped:?}");
        assert!(skipped[0].contains("usedBytes"), "{skipped:?}");
    }
}
