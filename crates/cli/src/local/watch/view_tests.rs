//! The view drawn on ratatui's TestBackend: what a person sees, as text.

use super::*;
use crate::local::watch::commands::Effect;
use memprof_api::{AllocatorStats, DataSource, MemoryGrowth, ReportSummary};
use ratatui::backend::TestBackend;
use ratatui::Terminal;

const G: u64 = 1 << 30;

fn gpu(index: u32, used: u64, risk: RiskLevel) -> GpuReport {
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

fn report(step: u64) -> MemoryReportSpec {
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

#[test]
fn the_gpu_view_has_a_row_per_gpu_the_risk_a_sparkline_and_the_trainer() {
    let text = screen(&watched());
    for want in [
        "memprof watch",
        "source sim (simulated, not hardware)",
        "risk high",
        "OOM in 2m50s",
        "[g] GPUs",
        "[q] quit",
        "[r] record  [m] mark  [s] save",
        "memprof simulated GPU",
        "49.0GiB/80.0GiB (61%)",
        "2m50s",
        "+238MiB/s",
        "leak",
        "GPU 0 used memory, last 20 samples",
        "pid 4242 on cuda:0: growth: leak  allocated 12.0GiB  reserved 14.0GiB",
        "fragmentation 14%",
        "growth: leak",
    ] {
        assert!(text.contains(want), "{want:?} not on screen:\n{text}");
    }
    // The sparkline: GPU 0's used memory rose 30 → 49 GiB of 80, oldest at
    // the left, so the first column is lower than the 20th and both are
    // drawn to scale (0 to the GPU's total).
    let box_rows: Vec<Vec<char>> = text
        .lines()
        .skip_while(|l| !l.contains("used memory"))
        .skip(1)
        .take_while(|l| !l.starts_with('└'))
        .map(|l| l.chars().collect())
        .collect();
    let height = |col: usize| {
        let full = box_rows.iter().filter(|r| r.get(col) == Some(&'█')).count();
        full as f64 / box_rows.len() as f64
    };
    let (first, last) = (height(1), height(20));
    assert!(
        first < last,
        "no rising sparkline ({first} vs {last}):\n{text}"
    );
    assert!(
        (0.25..0.40).contains(&first),
        "30 of 80 GiB drawn as {first}"
    );
    assert!((0.50..0.62).contains(&last), "49 of 80 GiB drawn as {last}");
    assert_eq!(height(21), 0.0, "nothing drawn past the 20 samples");
}

#[test]
fn keys_switch_views_and_move_the_selection() {
    let mut s = watched();
    assert_eq!(s.key('j'), Effect::Nothing);
    assert_eq!(s.selected, 1);
    assert!(screen(&s).contains("GPU 1 used memory"));
    s.key('j');
    assert_eq!(s.selected, 1, "stays on the last GPU");
    s.key('k');
    assert_eq!(s.selected, 0);

    s.key('a');
    let agent = screen(&s);
    assert!(
        agent.contains("allocator (agent in 1 rank(s)): leak"),
        "the agent view is report's renderer:\n{agent}"
    );
    assert!(agent.contains("the trainer's allocator"), "{agent}");

    s.key('l');
    assert!(screen(&s).contains("no risk transition or mark yet"));
    s.transitions.push(Transition {
        elapsed_seconds: 4.0,
        from: RiskLevel::Low,
        to: RiskLevel::High,
        gpu: Some(0),
        used_bytes: None,
        growth_bytes_per_second: None,
        time_to_oom_seconds: Some(170.0),
    });
    assert!(screen(&s).contains("risk low -> high (GPU 0), OOM in 2m50s"));
    assert_eq!(s.key('q'), Effect::Quit);
}

#[test]
fn a_blind_machine_says_why_instead_of_drawing_zeros() {
    let mut s = State::default();
    assert!(screen(&s).contains("waiting for the first report"));
    s.observe(MemoryReportSpec {
        conditions: vec![memprof_api::Condition::new(
            "GpuVisible",
            false,
            "NvmlUnavailable",
            "cannot load libnvidia-ml.so.1",
        )],
        ..Default::default()
    });
    let text = screen(&s);
    assert!(
        text.contains("no GPU visible: cannot load libnvidia-ml.so.1"),
        "{text}"
    );
}
