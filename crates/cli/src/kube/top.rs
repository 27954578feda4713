//! `memprof top` (also `kubectl memprof top`): profiled jobs by risk, then
//! time to OOM, like `kubectl top`. Rendering is pure ([`render`]); [`run`]
//! only fetches (again and again with `--watch`).

use crate::kube::client::{self as k, CliError, KubeArgs, Scope};
use crate::output::{self, Format, OutputArgs, Table, WatchArgs};
use kube::ResourceExt;
use memprof_api::{format_bytes, format_duration, MemoryProfile, RiskLevel};
use serde::Serialize;

/// Flags of `memprof top`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub kube: KubeArgs,
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(flatten)]
    pub watch: WatchArgs,
}

/// Runs the subcommand; returns the process exit code.
pub async fn run(args: Args) -> Result<i32, CliError> {
    let (client, scope) = args.kube.connect().await?;
    let format = args.output.format;
    output::watch(args.watch, || async {
        let profiles = k::list_profiles(&client, &scope).await?;
        Ok(render(&rows(&profiles), &scope, format))
    })
    .await?;
    Ok(0)
}

/// One profiled Job, as `top` shows it (and as `-o json|yaml` prints it).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Row {
    /// Namespace of the Job.
    pub namespace: String,
    /// Job name.
    pub job: String,
    /// Worst risk of any GPU.
    pub risk: RiskLevel,
    /// Smallest predicted time to OOM, seconds.
    pub time_to_oom_seconds: Option<f64>,
    /// Highest peak of any GPU, bytes.
    pub peak_used_bytes: u64,
    /// That peak as a percentage of its GPU's memory.
    pub peak_percent: f64,
    /// Current use of the fullest GPU, bytes.
    pub current_used_bytes: u64,
    /// Current use of the fullest GPU, percent of its memory.
    pub current_percent: f64,
    /// Max/mean of per-GPU peaks.
    pub imbalance: Option<f64>,
    /// `reporting/expected`.
    pub ranks: String,
    /// GPUs reporting.
    pub gpus: u32,
    /// Some rank's memory between steps keeps growing.
    pub leak_suspected: bool,
    /// Where the OOM comes first: `rank R pod/GPU`.
    pub bottleneck: Option<String>,
    /// The newest remediation, in words.
    pub last_action: Option<String>,
    /// Newest report's sample time.
    pub last_report_time: Option<String>,
}

/// The rows, worst first: highest risk, then soonest OOM, then by name.
pub fn rows(profiles: &[MemoryProfile]) -> Vec<Row> {
    let mut rows: Vec<Row> = profiles.iter().map(row).collect();
    rows.sort_by(|a, b| {
        b.risk
            .cmp(&a.risk)
            .then_with(|| {
                let tto = |r: &Row| r.time_to_oom_seconds.unwrap_or(f64::INFINITY);
                tto(a).total_cmp(&tto(b))
            })
            .then_with(|| (&a.namespace, &a.job).cmp(&(&b.namespace, &b.job)))
    });
    rows
}

fn row(p: &MemoryProfile) -> Row {
    let st = p.status.clone().unwrap_or_default();
    Row {
        namespace: p.namespace().unwrap_or_default(),
        job: p.spec.job_name.clone(),
        risk: st.risk,
        time_to_oom_seconds: st.time_to_oom_seconds,
        peak_used_bytes: st.peak_used_bytes,
        peak_percent: st.peak_percent,
        current_used_bytes: st.current_used_bytes,
        current_percent: st.current_percent,
        imbalance: st.imbalance,
        ranks: if st.ranks.is_empty() {
            "0".into()
        } else {
            st.ranks
        },
        gpus: st.gpu_count,
        leak_suspected: st.leak_suspected,
        bottleneck: st.bottleneck.map(|b| {
            let rank = b.rank.map_or("-".to_string(), |r| r.to_string());
            format!("rank {rank} {}/GPU{}", b.pod, b.gpu_index)
        }),
        last_action: st.last_action,
        last_report_time: st.last_report_time,
    }
}

/// The table (NAMESPACE only with `-A`; `-o wide` adds GPUS, BOTTLENECK,
/// ACTION), or the rows as a JSON/YAML list.
pub fn render(rows: &[Row], scope: &Scope, format: Format) -> String {
    if format.is_structured() {
        return output::structured(&rows, format);
    }
    if rows.is_empty() {
        return format!("No MemoryProfiles found in {}.\n", scope.describe());
    }
    let all = *scope == Scope::All;
    let wide = format == Format::Wide;
    let mut headers = vec![];
    if all {
        headers.push("NAMESPACE");
    }
    headers.extend([
        "JOB",
        "RISK",
        "TTO",
        "PEAK",
        "NOW%",
        "IMBALANCE",
        "RANKS",
        "LEAK",
    ]);
    if wide {
        headers.extend(["GPUS", "BOTTLENECK", "ACTION"]);
    }
    let mut table = Table::new(headers);
    for r in rows {
        let mut cells = vec![];
        if all {
            cells.push(r.namespace.clone());
        }
        cells.extend([
            r.job.clone(),
            r.risk.to_string(),
            r.time_to_oom_seconds.map_or("-".into(), format_duration),
            format!(
                "{} ({:.0}%)",
                format_bytes(r.peak_used_bytes),
                r.peak_percent
            ),
            format!("{:.0}%", r.current_percent),
            r.imbalance.map_or("-".into(), |i| format!("{i:.2}")),
            r.ranks.clone(),
            if r.leak_suspected { "yes" } else { "-" }.into(),
        ]);
        if wide {
            cells.extend([
                r.gpus.to_string(),
                r.bottleneck.clone().unwrap_or_else(|| "-".into()),
                r.last_action.clone().unwrap_or_else(|| "-".into()),
            ]);
        }
        table.row(cells);
    }
    table.render()
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_api::{MemoryProfileSpec, MemoryProfileStatus};

    fn profile(ns: &str, name: &str, risk: RiskLevel, tto: Option<f64>) -> MemoryProfile {
        let mut p = MemoryProfile::new(
            name,
            MemoryProfileSpec {
                job_name: name.into(),
                expected_ranks: Some(2),
            },
        );
        p.metadata.namespace = Some(ns.into());
        p.status = Some(MemoryProfileStatus {
            risk,
            time_to_oom_seconds: tto,
            ranks: "2/2".into(),
            peak_used_bytes: 60 << 30,
            peak_percent: 75.0,
            current_percent: 70.0,
            imbalance: Some(1.3),
            leak_suspected: tto.is_some(),
            ..Default::default()
        });
        p
    }

    #[test]
    fn worst_risk_first_then_soonest_oom() {
        let ps = [
            profile("a", "calm", RiskLevel::Low, None),
            profile("b", "later", RiskLevel::Critical, Some(600.0)),
            profile("a", "soon", RiskLevel::Critical, Some(60.0)),
            profile("a", "high", RiskLevel::High, Some(30.0)),
        ];
        let order: Vec<_> = rows(&ps).into_iter().map(|r| r.job).collect();
        assert_eq!(order, ["soon", "later", "high", "calm"]);
    }

    #[test]
    fn namespace_column_only_across_namespaces() {
        let r = rows(&[profile("a", "soon", RiskLevel::Critical, Some(60.0))]);
        let one = render(&r, &Scope::Namespace("a".into()), Format::Table);
        assert!(
            one.starts_with(
                "JOB    RISK       TTO    PEAK            NOW%   IMBALANCE   RANKS   LEAK\nsoon   critical   1m0s   60.0GiB (75%)   70%    1.30        2/2     yes\n"
            ),
            "{one}"
        );
        let all = render(&r, &Scope::All, Format::Table);
        assert!(all.starts_with("NAMESPACE   JOB"), "{all}");
        let wide = render(&r, &Scope::All, Format::Wide);
        assert!(
            wide.lines()
                .next()
                .unwrap()
                .ends_with("GPUS   BOTTLENECK   ACTION"),
            "{wide}"
        );
    }
}
