//! `memprof report [JOB]` (also `kubectl memprof report`): what the operator
//! concluded about a job, from its MemoryProfile, in words.

use crate::kube::client::{self as k, CliError, KubeArgs, Scope};
use crate::output::{self, Format, OutputArgs, Table, WatchArgs};
use kube::ResourceExt;
use memprof_api::{
    format_bytes, format_duration, AllocatorRollup, MemoryGrowth, MemoryProfile, MemoryReport,
};
use std::fmt::Write;

/// Flags of `memprof report`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Job name, or NAMESPACE/JOB; every profile in scope when left out.
    pub job: Option<String>,
    #[command(flatten)]
    pub kube: KubeArgs,
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(flatten)]
    pub watch: WatchArgs,
}

/// Fetches and prints (with `--watch`, again and again); returns the exit code.
pub async fn run(args: Args) -> Result<i32, CliError> {
    let (client, scope) = args.kube.connect().await?;
    let format = args.output.format;
    output::watch(args.watch, || async {
        match &args.job {
            Some(job) => {
                let ns = k::single_namespace(&scope, "memprof report JOB")?;
                let (ns, job) = k::split_ref(job, &ns);
                let profile = k::get_profile(&client, ns, job).await?;
                let reports = k::job_reports(&client, ns, &profile.spec.job_name).await?;
                Ok(render_job(&profile, &reports, format))
            }
            None => {
                let profiles = k::list_profiles(&client, &scope).await?;
                Ok(render_all(&profiles, &scope, format))
            }
        }
    })
    .await?;
    Ok(0)
}

/// One Job: the profile in words and its ranks' table, or both as a List object.
pub fn render_job(p: &MemoryProfile, reports: &[MemoryReport], format: Format) -> String {
    if format.is_structured() {
        let mut items = vec![object(p)];
        items.extend(reports.iter().map(object));
        return output::structured(&list(items), format);
    }
    let mut out = render(p);
    out.push_str(&memprof_analysis::sites_section(
        p.status.as_ref(),
        reports.iter().map(|r| &r.spec),
    ));
    out.push_str(&render_ranks(reports, format == Format::Wide));
    out
}

/// Every profile in scope, each in words (or all of them as a List object).
pub fn render_all(profiles: &[MemoryProfile], scope: &Scope, format: Format) -> String {
    if format.is_structured() {
        return output::structured(&list(profiles.iter().map(object).collect()), format);
    }
    if profiles.is_empty() {
        return format!("No MemoryProfiles found in {}.\n", scope.describe());
    }
    profiles.iter().map(render).collect::<Vec<_>>().join("\n")
}

/// A kubectl `List` of objects.
fn list(items: Vec<serde_json::Value>) -> serde_json::Value {
    serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items})
}

/// The object as kubectl prints it: without managedFields.
fn object<K: kube::Resource + serde::Serialize + Clone>(o: &K) -> serde_json::Value {
    let mut o = o.clone();
    o.meta_mut().managed_fields = None;
    serde_json::to_value(&o).unwrap_or_default()
}

/// One row per GPU of each rank, with the GPU's recent memory as a sparkline
/// (the report's 60-point timeline, highest use per point).
pub fn render_ranks(reports: &[MemoryReport], wide: bool) -> String {
    if reports.is_empty() {
        return "  no MemoryReports for this Job yet\n".to_string();
    }
    let mut headers = vec![
        "RANK", "POD", "NODE", "GPU", "USED", "PEAK", "TOTAL", "RISK", "TTO", "RECENT",
    ];
    if wide {
        headers.extend(["GROWTH", "UTIL", "UUID", "SAMPLED"]);
    }
    let mut table = Table::new(headers);
    for r in reports {
        for g in &r.spec.gpus {
            // Scaled from 0 to the GPU's total, not to the line's own range:
            // ranks then compare at a glance (30→40 GiB is not 40→70 GiB).
            let mut line = vec![0.0, g.total_bytes as f64];
            line.extend(g.timeline.iter().map(|p| p.max as f64));
            let spark: String = crate::plot::sparkline(&line).chars().skip(2).collect();
            let mut row = vec![
                r.spec.rank.map_or("-".into(), |x| x.to_string()),
                r.spec.pod_name.clone(),
                r.spec.node_name.clone().unwrap_or_else(|| "-".into()),
                g.index.to_string(),
                format_bytes(g.used_bytes),
                format_bytes(g.peak_bytes),
                format_bytes(g.total_bytes),
                g.risk.to_string(),
                g.time_to_oom_seconds.map_or("-".into(), format_duration),
                spark,
            ];
            if wide {
                row.extend([
                    format!("{:.1}MB/s", g.growth_bytes_per_second / 1e6),
                    g.utilization_percent
                        .map_or("-".into(), |u| format!("{u}%")),
                    g.uuid.clone(),
                    r.spec.sampled_at.clone(),
                ]);
            }
            table.row(row);
        }
        if r.spec.gpus.is_empty() {
            table.row([
                r.spec.rank.map_or("-".into(), |x| x.to_string()),
                r.name_any(),
                r.spec.node_name.clone().unwrap_or_else(|| "-".into()),
                "-".into(),
                "no GPU visible".to_string(),
            ]);
        }
    }
    let mut out = String::from("\nranks:\n");
    out.push_str(&table.render());
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
    if let Some(a) = &st.allocator {
        render_allocator(&mut out, a);
    }
    if let Some(b) = &st.breakdown {
        crate::kube::breakdown::render_breakdown(&mut out, b);
    }
    if let Some(r) = &st.batch_recommendation {
        out.push_str(&memprof_analysis::batchfit::render(r));
    }
    if let Some(t) = &st.thresholds {
        out.push_str(&memprof_api::thresholds::render(t));
    }
    if !st.top_ranks.is_empty() {
        let _ = writeln!(out, "  closest to OOM:");
        for r in &st.top_ranks {
            let rank = r.location.rank.map_or("-".to_string(), |r| r.to_string());
            let tto = r
                .time_to_oom_seconds
                .map_or("-".to_string(), format_duration);
            let _ = writeln!(
                out,
                "    rank {rank:>4}  {:<8}  peak {:>9} / {:<9}  growth {:>8.1} MB/s  TTO {tto}  ({})",
                r.risk.to_string(),
                format_bytes(r.peak_bytes),
                format_bytes(r.total_bytes),
                r.growth_bytes_per_second / 1e6,
                r.location.pod
            );
        }
    }
    for o in &st.ooms {
        let _ = writeln!(out, "  OOM at {} in pod {}: {}", o.time, o.pod, o.evidence);
    }
    for r in &st.remediations {
        let _ = writeln!(
            out,
            "  remediation {} [{}] {} by {}",
            r.id, r.phase, r.action, r.policy
        );
    }
    for c in &st.conditions {
        let _ = writeln!(
            out,
            "  condition {}={} ({}): {}",
            c.type_, c.status, c.reason, c.message
        );
    }
    out
}

/// What the in-process agents said: leak or cache, advice, step rate, the OOM's blocks.
fn render_allocator(out: &mut String, a: &AllocatorRollup) {
    let growth = match a.growth {
        MemoryGrowth::Leak => "leak: allocated memory between steps keeps growing".to_string(),
        MemoryGrowth::Cache => format!(
            "cache: reserved memory grows on ranks {:?}, allocated memory between steps is flat (not a leak)",
            a.cache_ranks
        ),
        MemoryGrowth::None => "nothing grows".to_string(),
    };
    let _ = writeln!(
        out,
        "  allocator (agent in {} rank(s)): {growth}",
        a.ranks_with_agent
    );
    if let Some(advice) = &a.advice {
        let _ = writeln!(out, "  advice: {advice}");
    }
    if let Some(sps) = a.slowest_steps_per_second {
        let rank = a.slowest_rank.map_or("-".to_string(), |r| r.to_string());
        let _ = writeln!(out, "  slowest rank: {rank} at {sps:.2} steps/s");
    }
    if let Some(o) = &a.last_oom {
        let rank = o.rank.map_or("-".to_string(), |r| r.to_string());
        let asked = o.snapshot.requested_bytes.map_or(String::new(), |b| {
            format!(", asked for {}", format_bytes(b))
        });
        let _ = writeln!(
            out,
            "  CUDA OOM at {} in pod {} (rank {rank}){asked}; largest live blocks:",
            o.snapshot.time, o.pod
        );
        for b in &o.snapshot.blocks {
            let at = if b.frames.is_empty() {
                "-".to_string()
            } else {
                b.frames.join(" <- ")
            };
            let blocks = b.count.map_or(String::new(), |n| format!(" in {n} blocks"));
            let _ = writeln!(out, "    {:>9}{blocks}  {at}", format_bytes(b.size_bytes));
        }
        if o.snapshot.source != "history" {
            let _ = writeln!(
                out,
                "    (no allocation stacks: set MEMPROF_AGENT_RECORD_HISTORY=1 in the trainer to name the code)"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_api::{AgentOomRecord, MemoryProfileStatus, OomBlock, OomSnapshotSummary};

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
    fn memprof_report_shows_the_profiles_breakdown() {
        let mut p = memprof_api::MemoryProfile::new(
            "train",
            memprof_api::MemoryProfileSpec {
                job_name: "train".into(),
                expected_ranks: Some(4),
            },
        );
        p.status = Some(memprof_api::MemoryProfileStatus {
            breakdown: Some(crate::kube::breakdown::tests::lora()),
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
        let seen = [obs(48, 76.1), obs(64, 79.3)];
        let rec = recommend(&Evidence {
            env_var: "BATCH_SIZE",
            current: Some(48),
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
            report.contains("batch size: BATCH_SIZE = 48 now; largest safe 27"),
            "{report}"
        );
    }
}
