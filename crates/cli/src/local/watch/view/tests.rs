//! The view drawn on ratatui's TestBackend: what a person sees, as text.

use super::*;
use crate::local::watch::fixtures::{screen, watched};

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
