//! One number everywhere: the same reports rendered through every view of
//! the CLI show the same risk, time to OOM and cause, and none shows a
//! trend the verdict does not stand behind (a low GPU's young 20 s trend).
//! The views: the local roll-up (`memprof rollup`), `report`, `top`,
//! `compare`, `watch`'s header and GPU rows, and the status as JSON.

use crate::kube::client::Scope;
use crate::kube::ranks::StaleRule;
use crate::output::{Format, PrintArgs};
use memprof_api::{
    format_duration, Cause, DataSource, GpuReport, MemoryProfile, MemoryProfileSpec,
    MemoryReportSpec, NamedCause, RiskLevel,
};

const G: u64 = 1 << 30;
/// The verdict every view must show: 2m17s (a coarser view would round it).
const TTO: f64 = 137.0;

/// Rank 1's noisy slope, which no view may show (its verdict is low).
const NOISE: f64 = 213.0 * 1024.0 * 1024.0;

fn gpu(index: u32, risk: RiskLevel, tto: f64, cause: Option<NamedCause>) -> GpuReport {
    GpuReport {
        index,
        uuid: format!("GPU-{index}"),
        model: "memprof simulated GPU".into(),
        total_bytes: 80 * G,
        used_bytes: 60 * G,
        peak_bytes: 61 * G,
        risk,
        confidence: 0.9,
        time_to_oom_seconds: Some(tto),
        growth_bytes_per_second: if risk >= RiskLevel::Medium {
            1e8
        } else {
            NOISE
        },
        cause,
        source: DataSource::Sim,
        ..Default::default()
    }
}

/// A cause whose name appears nowhere else in a view (no LEAK column,
/// no leak flag), so finding it proves the view shows the cause.
fn named() -> NamedCause {
    NamedCause::new(Cause::Neighbour, "pid 4242 holds 31GiB, +400MiB/s")
}

/// Rank 0 is high with 2m17s to go, a neighbour filling its GPU; rank 1 is low with a young
/// 20 s trend that no view may show.
fn reports() -> Vec<MemoryReportSpec> {
    let report = |rank: u32, g: GpuReport| MemoryReportSpec {
        pod_name: format!("train-{rank}"),
        rank: Some(rank),
        sampled_at: "2026-11-28T10:00:00Z".into(),
        interval_ms: 1000,
        summary: memprof_analysis::summarize(std::slice::from_ref(&g), DataSource::Sim),
        gpus: vec![g],
        ..Default::default()
    };
    vec![
        report(0, gpu(0, RiskLevel::High, TTO, Some(named()))),
        report(1, gpu(1, RiskLevel::Low, 20.0, None)),
    ]
}

fn profile(job: &str) -> MemoryProfile {
    let specs = reports();
    let named = specs.iter().enumerate().map(|(i, s)| (format!("r{i}"), s));
    let mut p = MemoryProfile::new(
        job,
        MemoryProfileSpec {
            job_name: job.into(),
            expected_ranks: Some(2),
        },
    );
    p.metadata.namespace = Some("ml".into());
    p.status = Some(crate::local::rollup::status_of(named, Some(2)));
    p
}

/// Every view's text, by name.
fn views() -> Vec<(&'static str, String)> {
    let p = profile("train");
    let specs = reports();
    let loaded: Vec<crate::local::rollup::Loaded> = specs
        .iter()
        .map(|s| crate::local::rollup::Loaded {
            file: format!("{}.json", s.pod_name).into(),
            spec: s.clone(),
        })
        .collect();
    let st = p.status.clone().unwrap();
    let scope = Scope::Namespace("ml".into());
    let view = crate::kube::top::View {
        scope: &scope,
        reports: &[],
        now: "2026-11-28T10:00:00Z".parse().unwrap(),
        rule: StaleRule::Operator,
    };
    let top = crate::kube::top::render(std::slice::from_ref(&p), &view, &PrintArgs::default());
    let side = crate::kube::compare::side(&p, None);
    let mut box_report = specs[1].clone();
    box_report.gpus.insert(0, specs[0].gpus[0].clone());
    box_report.summary = memprof_analysis::summarize(&box_report.gpus, DataSource::Sim);
    let mut watched = crate::local::watch::view::State::default();
    watched.observe(box_report);
    vec![
        ("rollup", crate::local::rollup::render(&loaded, &st)),
        ("report", crate::kube::report::render(&p)),
        ("top", top.stdout),
        (
            "compare",
            crate::kube::compare::render(&side, &side, Format::Table),
        ),
        ("watch", crate::local::watch::fixtures::screen(&watched)),
        ("json", serde_json::to_string(&st).unwrap()),
    ]
}

#[test]
fn every_view_shows_the_same_risk_time_to_oom_and_cause() {
    let tto = format_duration(TTO);
    for (name, text) in views() {
        assert!(text.contains(&tto), "{name} lacks {tto}:\n{text}");
        assert!(text.contains("high"), "{name} lacks the risk:\n{text}");
        assert!(
            text.contains("neighbour"),
            "{name} lacks the cause:\n{text}"
        );
    }
}

#[test]
fn no_view_shows_a_trend_the_verdict_does_not_stand_behind() {
    let young = format_duration(20.0);
    let noise = memprof_api::format_rate(NOISE);
    for (name, text) in views() {
        assert!(!text.contains(&young), "{name} shows {young}:\n{text}");
        assert!(!text.contains(&noise), "{name} shows {noise}:\n{text}");
    }
}

#[test]
fn the_status_carries_the_bottlenecks_cause_and_the_counted_time() {
    let st = profile("train").status.unwrap();
    assert_eq!(st.risk, RiskLevel::High);
    assert_eq!(st.time_to_oom_seconds, Some(TTO));
    assert_eq!(st.time_to_oom.as_deref(), Some("2m17s"));
    assert_eq!(st.cause, Some(named()));
    assert_eq!(st.top_ranks[0].cause, Some(Cause::Neighbour));
    assert_eq!(st.top_ranks[1].time_to_oom_seconds, None);
}

/// The report's closest ranks read as their labels say: the peak over the
/// GPU's total, then the growth, the time, the cause and the pod (the
/// arguments had shifted one place: "peak  / 38.0GiB  growth 80.0GiB").
#[test]
fn the_reports_rank_lines_put_each_number_under_its_label() {
    let text = crate::kube::report::render(&profile("train"));
    let line = |rank: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with(&format!("rank {rank:>4}")))
            .unwrap_or_else(|| panic!("no rank {rank} line in\n{text}"))
            .to_string()
    };
    let zero = line("0");
    assert!(zero.contains("peak   61.0GiB / 80.0GiB"), "{zero}");
    assert!(
        zero.contains(&format!("growth {:>11}", memprof_api::format_rate(1e8))),
        "{zero}"
    );
    assert!(zero.contains("TTO 2m17s  neighbour  (train-0)"), "{zero}");
    let one = line("1");
    assert!(
        one.contains("growth           -  TTO -  (train-1)"),
        "{one}"
    );
}
