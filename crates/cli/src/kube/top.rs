//! `memprof top` (also `kubectl memprof top`): profiled jobs by risk, then
//! time to OOM, like `kubectl top`; with kubectl's printing flags, where
//! `-o json` and friends print the MemoryProfiles themselves as `kubectl get
//! memoryprofiles` does. Rendering is pure ([`render`]); [`run`] only
//! fetches (again and again with `--watch`).

use crate::kube::client::{self as k, CliError, ListArgs, Scope};
use crate::kube::ranks::{self, StaleRule};
use crate::output::{self, printer, PrintArgs, Printed, Table, WatchArgs};
use jiff::Timestamp;
use kube::ResourceExt;
use memprof_api::{format_bytes, MemoryProfile, MemoryReport, RiskLevel, LABEL_JOB};

/// Flags of `memprof top`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub list: ListArgs,
    #[command(flatten)]
    pub print: PrintArgs,
    #[command(flatten)]
    pub watch: WatchArgs,
    /// Call a rank stale when its last report is older than this (`150`,
    /// `2m`; a bare number is seconds; `-o wide`: AGE and STALE RANKS columns). Default: the operator's
    /// verdict (two of the sidecar's heartbeats plus 30 s; 150 s by default).
    #[arg(long, value_name = "DURATION", value_parser = crate::duration::parse)]
    pub stale_after: Option<std::time::Duration>,
}

/// Runs the subcommand; returns the process exit code.
pub async fn run(args: Args) -> Result<i32, CliError> {
    let (client, scope) = args.list.connect().await?;
    let selector = args.list.selector.as_deref();
    output::watch(args.watch, || async {
        let profiles = k::list_profiles(&client, &scope, selector).await?;
        let rule = StaleRule::from_flag(args.stale_after);
        // AGE and STALE RANKS come from the operator's status; the reports are
        // listed (one more call) only where it cannot say (see ranks.rs).
        let statuses: Vec<_> = profiles.iter().map(|p| p.status.as_ref()).collect();
        let reports = if args.print.wide() && ranks::needs_reports(&statuses, rule) {
            k::list_reports(&client, &scope, None).await?
        } else {
            Vec::new()
        };
        let view = View {
            scope: &scope,
            reports: &reports,
            now: Timestamp::now(),
            rule,
        };
        Ok(render(&profiles, &view, &args.print))
    })
    .await?;
    Ok(0)
}

/// What the table needs besides the profiles.
#[derive(Clone, Copy, Debug)]
pub struct View<'a> {
    /// Where `top` looked (NAMESPACE column with `-A`).
    pub scope: &'a Scope,
    /// The reports in scope, where the statuses cannot give AGE and STALE RANKS
    /// (see [`ranks::needs_reports`]); empty otherwise.
    pub reports: &'a [MemoryReport],
    /// Now, for ages.
    pub now: Timestamp,
    /// `--stale-after`, or the operator's verdict.
    pub rule: StaleRule,
}

/// The profiles worst first: highest risk, then soonest OOM, then by name.
pub fn worst_first(profiles: &[MemoryProfile]) -> Vec<&MemoryProfile> {
    let mut out: Vec<&MemoryProfile> = profiles.iter().collect();
    let key = |p: &MemoryProfile| {
        let st = p.status.as_ref();
        let risk = st.map_or(RiskLevel::None, |s| s.risk);
        let tto = st
            .and_then(|s| s.time_to_oom_seconds)
            .unwrap_or(f64::INFINITY);
        (risk, tto)
    };
    out.sort_by(|a, b| {
        let ((ra, ta), (rb, tb)) = (key(a), key(b));
        rb.cmp(&ra)
            .then_with(|| ta.total_cmp(&tb))
            .then_with(|| (a.namespace(), a.name_any()).cmp(&(b.namespace(), b.name_any())))
    });
    out
}

/// What `top` prints: the table (NAMESPACE only with `-A`; `-o wide` adds
/// GPUS, AGE, STALE RANKS, BOTTLENECK, ACTION), or the profiles as kubectl's
/// printing flags ask.
pub fn render(profiles: &[MemoryProfile], view: &View, print: &PrintArgs) -> Printed {
    let sorted: Vec<MemoryProfile> = worst_first(profiles).into_iter().cloned().collect();
    let none = format!("No MemoryProfiles found in {}.", view.scope.describe());
    print.print(
        &sorted,
        printer::object,
        |ps| table(ps, view, print.wide()),
        &none,
    )
}

fn table(profiles: &[&MemoryProfile], view: &View, wide: bool) -> Table {
    let all = *view.scope == Scope::All;
    let mut headers = vec![];
    if all {
        headers.push("NAMESPACE");
    }
    headers.extend([
        "JOB",
        "RISK",
        "TTO",
        "CAUSE",
        "PEAK",
        "NOW%",
        "IMBALANCE",
        "RANKS",
        "LEAK",
    ]);
    if wide {
        // Which ranks are stale, not how many: named so a `1` reads as rank 1.
        headers.extend(["GPUS", "AGE", "STALE RANKS", "BOTTLENECK", "ACTION"]);
    }
    let mut table = Table::new(headers);
    for p in profiles {
        let mut cells = vec![];
        if all {
            cells.push(p.namespace().unwrap_or_default());
        }
        cells.extend(cells_of(p));
        if wide {
            cells.extend(wide_cells(p, view));
        }
        table.row(cells);
    }
    table
}

fn cells_of(p: &MemoryProfile) -> [String; 9] {
    let st = p.status.clone().unwrap_or_default();
    [
        p.spec.job_name.clone(),
        st.risk.to_string(),
        // The profile's own text, as `kubectl get memoryprofiles` shows it.
        st.time_to_oom.clone().unwrap_or_else(|| "-".into()),
        st.cause
            .as_ref()
            .map_or("-", |c| c.cause.as_str())
            .to_string(),
        format!(
            "{} ({:.0}%)",
            format_bytes(st.peak_used_bytes),
            st.peak_percent
        ),
        format!("{:.0}%", st.current_percent),
        st.imbalance.map_or("-".into(), |i| format!("{i:.2}")),
        if st.ranks.is_empty() {
            "0".into()
        } else {
            st.ranks
        },
        if st.leak_suspected { "yes" } else { "-" }.into(),
    ]
}

/// GPUS, AGE (since the least recent rank's last report), STALE RANKS (the stale
/// ranks, `+N` for those the status counted but did not list), BOTTLENECK,
/// ACTION.
fn wide_cells(p: &MemoryProfile, view: &View) -> [String; 5] {
    let st = p.status.clone().unwrap_or_default();
    let ns = p.namespace();
    let mine = view
        .reports
        .iter()
        .filter(|r| r.namespace() == ns && r.labels().get(LABEL_JOB) == Some(&p.spec.job_name));
    let age = ranks::job_age_of(p.status.as_ref(), mine, view.now, view.rule);
    let bottleneck = st.bottleneck.map(|b| {
        let rank = b.rank.map_or("-".to_string(), |r| r.to_string());
        format!("rank {rank} {}/GPU{}", b.pod, b.gpu_index)
    });
    [
        st.gpu_count.to_string(),
        age.oldest_seconds.map_or("-".into(), output::age),
        age.stale_labels(),
        bottleneck.unwrap_or_else(|| "-".into()),
        st.last_action.unwrap_or_else(|| "-".into()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_api::MemoryReport;
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
            time_to_oom: tto.map(memprof_api::format_duration),
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

    fn view<'a>(scope: &'a Scope, reports: &'a [MemoryReport]) -> View<'a> {
        View {
            scope,
            reports,
            now: "2026-11-22T10:10:00Z".parse().unwrap(),
            rule: StaleRule::Operator,
        }
    }

    fn text(ps: &[MemoryProfile], v: &View, args: &[&str]) -> String {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct P {
            #[command(flatten)]
            p: PrintArgs,
        }
        let print = P::try_parse_from(std::iter::once("x").chain(args.iter().copied()))
            .unwrap()
            .p;
        render(ps, v, &print).stdout
    }

    #[test]
    fn worst_risk_first_then_soonest_oom() {
        let ps = [
            profile("a", "calm", RiskLevel::Low, None),
            profile("b", "later", RiskLevel::Critical, Some(600.0)),
            profile("a", "soon", RiskLevel::Critical, Some(60.0)),
            profile("a", "high", RiskLevel::High, Some(30.0)),
        ];
        let order: Vec<_> = worst_first(&ps)
            .into_iter()
            .map(|p| p.spec.job_name.as_str())
            .collect();
        assert_eq!(order, ["soon", "later", "high", "calm"]);
        let scope = Scope::All;
        let names = text(&ps, &view(&scope, &[]), &["-o", "name"]);
        assert_eq!(
            names.lines().next(),
            Some("memoryprofile.memprof.dev/soon"),
            "{names}"
        );
    }

    #[test]
    fn namespace_column_only_across_namespaces() {
        let r = [profile("a", "soon", RiskLevel::Critical, Some(60.0))];
        let ns = Scope::Namespace("a".into());
        let one = text(&r, &view(&ns, &[]), &[]);
        assert!(
            one.starts_with(
                "JOB    RISK       TTO    CAUSE   PEAK            NOW%   IMBALANCE   RANKS   LEAK\nsoon   critical   1m0s   -       60.0GiB (75%)   70%    1.30        2/2     yes\n"
            ),
            "{one}"
        );
        let all = text(&r, &view(&Scope::All, &[]), &[]);
        assert!(all.starts_with("NAMESPACE   JOB"), "{all}");
        let wide = text(&r, &view(&Scope::All, &[]), &["-o", "wide"]);
        assert!(
            wide.lines()
                .next()
                .unwrap()
                .ends_with("GPUS   AGE   STALE RANKS   BOTTLENECK   ACTION"),
            "{wide}"
        );
    }

    #[test]
    fn wide_names_the_ranks_that_stopped_reporting_and_the_oldest_reports_age() {
        let report = |rank: u32, at: &str| {
            let mut r = MemoryReport::new(
                &format!("soon-{rank}"),
                memprof_api::MemoryReportSpec {
                    pod_name: format!("soon-{rank}"),
                    rank: Some(rank),
                    sampled_at: at.into(),
                    ..Default::default()
                },
            );
            r.metadata.namespace = Some("a".into());
            r.metadata.labels = Some([(LABEL_JOB.to_string(), "soon".to_string())].into());
            r
        };
        let reports = [
            report(0, "2026-11-22T10:09:50Z"),
            report(1, "2026-11-22T10:04:00Z"),
        ];
        let ps = [profile("a", "soon", RiskLevel::Critical, Some(60.0))];
        let ns = Scope::Namespace("a".into());
        let wide = text(&ps, &view(&ns, &reports), &["-o", "wide"]);
        let row: Vec<&str> = wide.lines().nth(1).unwrap().split_whitespace().collect();
        // ... LEAK GPUS AGE STALE RANKS BOTTLENECK ACTION
        assert_eq!(row[row.len() - 4..row.len() - 2], ["6m", "1"], "{wide}");
        // Not wide: no reports were read and no such columns.
        assert!(!text(&ps, &view(&ns, &[]), &[]).contains("STALE"));
    }

    #[test]
    fn wide_reads_age_and_stale_ranks_from_the_operators_status() {
        let mut p = profile("a", "soon", RiskLevel::Critical, Some(60.0));
        let st = p.status.as_mut().unwrap();
        st.ranks = "1/2 (1 stale)".into();
        st.ranks_stale = 1;
        st.oldest_report_time = Some("2026-11-22T10:02:00Z".into());
        st.stale_ranks = vec![memprof_api::StaleRank {
            rank: Some(1),
            pod: "soon-1".into(),
            last_report_time: "2026-11-22T10:02:00Z".into(),
            risk: RiskLevel::Critical,
            ..Default::default()
        }];
        let ns = Scope::Namespace("a".into());
        // No reports at all: the status alone fills AGE and STALE RANKS.
        let wide = text(&[p], &view(&ns, &[]), &["-o", "wide"]);
        let row = wide.lines().nth(1).unwrap();
        assert!(row.contains("1/2 (1 stale)"), "{wide}");
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(
            cells[cells.len() - 4..cells.len() - 2],
            ["8m", "1"],
            "{wide}"
        );
    }

    #[test]
    fn an_empty_scope_prints_nothing_on_stdout_and_says_so_on_stderr() {
        let ns = Scope::Namespace("a".into());
        let p = render(&[], &view(&ns, &[]), &PrintArgs::default());
        assert_eq!(p.stdout, "");
        assert_eq!(p.stderr, "No MemoryProfiles found in namespace a.\n");
    }
}
