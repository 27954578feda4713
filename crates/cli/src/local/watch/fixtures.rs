//! What the watch view's and the commands' tests draw on: a box with two
//! GPUs, one leaking, watched for 20 reports, and the screen as text
//! (ratatui's TestBackend). Shared by `view` and `commands` tests, so
//! neither test module reaches into the other.

use super::view::{draw, State};
use memprof_api::{
    AllocatorStats, DataSource, GpuReport, MemoryGrowth, MemoryReportSpec, ReportSummary, RiskLevel,
};
use ratatui::backend::TestBackend;
use ratatui::Terminal;
pub(crate) const G: u64 = 1 << 30;

pub(crate) fn gpu(index: u32, used: u64, risk: RiskLevel) -> GpuReport {
    GpuReport {
        index,
        uuid: format!("GPU-{index}"),
        model: "memprof simulated GPU".into(),
        total_bytes: 80 * G,
        used_bytes: used * G,
        peak_bytes: used * G,
        utilization_percent: Some(90),
        growth_bytes_per_second: if risk >= RiskLevel::High { 250e6 } else { 0.0 },
        time_to_oom_seconds: (risk >= RiskLevel::High).then_some(170.0),
        risk,
        leak_suspected: risk >= RiskLevel::High,
        source: DataSource::Sim,
        ..Default::default()
    }
}

pub(crate) fn report(step: u64) -> MemoryReportSpec {
    MemoryReportSpec {
        pod_name: "node-a".into(),
        // What the roll-up needs to count the report (the sidecar's always do).
        sampled_at: "2026-11-22T10:00:00Z".into(),
        interval_ms: 1000,
        summary: ReportSummary {
            gpu_count: 2,
            risk: RiskLevel::High,
            time_to_oom: Some("2m50s".into()),
            source: DataSource::Sim,
            ..Default::default()
        },
        gpus: vec![
            gpu(0, 30 + step, RiskLevel::High),
            gpu(1, 20, RiskLevel::Low),
        ],
        allocator: Some(AllocatorStats {
            allocated_bytes: 12 * G,
            reserved_bytes: 14 * G,
            peak_allocated_bytes: Some(15 * G),
            fragmentation: Some(0.14),
            step: Some(step),
            device: Some(0),
            growth: MemoryGrowth::Leak,
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub(crate) fn screen(s: &State) -> String {
    let mut t = Terminal::new(TestBackend::new(120, 30)).unwrap();
    t.draw(|f| draw(f, s)).unwrap();
    let buf = t.backend().buffer().clone();
    buf.content()
        .chunks(buf.area.width as usize)
        .map(|row| row.iter().map(|c| c.symbol()).collect::<String>())
        .collect::<Vec<_>>()
        .join("\n")
}

pub(crate) fn watched() -> State {
    let mut s = State {
        pid: Some(4242),
        elapsed: 12.0,
        ..Default::default()
    };
    for step in 0..20 {
        s.observe(report(step));
    }
    s
}
