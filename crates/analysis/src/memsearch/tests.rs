//! The search on recorded sweeps and on simulated trainers.

use super::*;

const GIB: f64 = (1u64 << 30) as f64;
const H100_TOTAL: f64 = 79.2 * GIB;
const TARGET: f64 = 0.9 * H100_TOTAL;

fn ran(x: f64, gib: f64) -> (f64, Outcome) {
    (x, Outcome::Ran(gib * GIB))
}

fn run_of(next: &Next) -> Option<f64> {
    match next {
        Next::Run { x, .. } => Some(*x),
        Next::Done { .. } => None,
    }
}

#[test]
fn the_h100_lora_sweep_runs_12_and_stops_where_the_model_is_sure() {
    // docs/gpu/sweep-h100.txt: 2, 4, 8 ran; 16, 32, 64 OOMed.
    let grid = [2.0, 4.0, 8.0, 16.0, 32.0, 64.0];
    let mut trials = vec![ran(2.0, 12.7), ran(4.0, 23.2), ran(8.0, 44.3)];
    trials.extend([16.0, 32.0, 64.0].map(|x| (x, Outcome::Oom)));
    let step = common_step(&grid);
    assert_eq!(step, Some(2.0));
    let s = assess(&trials, TARGET, step);
    assert_eq!(s.safe.map(|s| s.0), Some(8.0));
    assert_eq!(s.bound, Some(Bound::Oom { x: 16.0 }));
    assert_eq!(run_of(&s.next), Some(12.0), "{:?}", s.next);
    // docs/gpu/sweep-h100-fine.txt: 12 ran at 65.33 GiB.
    trials.push(ran(12.0, 65.33));
    let s = assess(&trials, TARGET, step);
    assert_eq!(s.safe.map(|s| s.0), Some(12.0));
    let Next::Done { why } = &s.next else {
        panic!("{:?}", s.next)
    };
    assert!(
        why.starts_with("the model is sure the next value 14 does not fit"),
        "{why}"
    );
}

#[test]
fn a_run_over_the_target_bounds_the_search_and_is_not_safe() {
    // docs/gpu/sweep-h100-fine.txt: 14 ran at 75.86 GiB, over 71.3 GiB.
    let trials = [
        ran(6.0, 33.8),
        ran(8.0, 44.3),
        ran(10.0, 54.8),
        ran(12.0, 65.33),
        ran(14.0, 75.86),
    ];
    let s = assess(&trials, TARGET, Some(2.0));
    assert_eq!(s.safe.map(|s| s.0), Some(12.0));
    assert!(matches!(s.bound, Some(Bound::OverTarget { x, .. }) if x == 14.0));
    assert_eq!(
        s.next,
        Next::Done {
            why: "12 ran under the target and the next value 14 did not".into()
        }
    );
}

#[test]
fn the_issue_17_sweep_calls_only_4096_safe_and_runs_5120_next() {
    let trials = [
        ran(1024.0, 4.0),
        ran(2048.0, 10.3),
        ran(3072.0, 21.3),
        ran(4096.0, 32.5),
    ];
    let s = assess(&trials, TARGET, Some(1024.0));
    assert_eq!(s.safe.map(|s| s.0), Some(4096.0), "only what ran is safe");
    assert_eq!(s.predicted.map(|p| p.x), Some(5120.0));
    assert_eq!(run_of(&s.next), Some(5120.0), "{:?}", s.next);
    // The issue gives no peak at 5120: any peak under the target leads to
    // 6144 being tried, which OOMed; 5120 is then the answer.
    let mut trials = trials.to_vec();
    trials.push(ran(5120.0, 48.0));
    let s = assess(&trials, TARGET, Some(1024.0));
    assert_eq!(run_of(&s.next), Some(6144.0), "{:?}", s.next);
    trials.push((6144.0, Outcome::Oom));
    let s = assess(&trials, TARGET, Some(1024.0));
    assert_eq!(s.safe.map(|s| s.0), Some(5120.0));
    assert!(matches!(s.next, Next::Done { .. }), "{:?}", s.next);
}

/// A trainer whose peak is `law(x)`, OOMing over `total`; the search run
/// to its end from `grid`, at most `budget` extra runs. Returns the safe
/// value and the values tried beyond the grid.
fn search(law: &dyn Fn(f64) -> f64, total: f64, grid: &[f64], budget: usize) -> (f64, Vec<f64>) {
    let outcome = |x: f64| {
        let p = law(x);
        (
            x,
            if p > total {
                Outcome::Oom
            } else {
                Outcome::Ran(p)
            },
        )
    };
    let mut trials: Vec<(f64, Outcome)> = grid.iter().map(|&x| outcome(x)).collect();
    let mut extra = vec![];
    let step = common_step(grid);
    for _ in 0..budget {
        match assess(&trials, 0.9 * total, step).next {
            Next::Run { x, .. } => {
                assert!(!trials.iter().any(|t| t.0 == x), "{x} tried twice");
                extra.push(x);
                trials.push(outcome(x));
            }
            Next::Done { .. } => break,
        }
    }
    let s = assess(&trials, 0.9 * total, step);
    assert!(
        matches!(s.next, Next::Done { .. }),
        "budget {budget} spent: {extra:?}"
    );
    (s.safe.map_or(0.0, |s| s.0), extra)
}

#[test]
fn simulated_quadratic_trainers_are_searched_to_their_true_boundary() {
    // Eager attention: 3 GiB + 2 MiB·S + 2.5 KiB·S² (batch fixed), on 40,
    // 80 and 141 GB devices, from a grid of 512..2048 (step 512).
    let law = |s: f64| 3.0 * GIB + 2.0 * 1_048_576.0 * s + 2560.0 * s * s;
    let grid = [512.0, 1024.0, 1536.0, 2048.0];
    for total in [40e9, 80e9, 141e9] {
        let truth = (1..64)
            .map(|k| 512.0 * k as f64)
            .filter(|&s| law(s) <= 0.9 * total)
            .fold(0.0, f64::max);
        let (safe, extra) = search(&law, total, &grid, 8);
        assert_eq!(safe, truth, "total {total}: tried {extra:?}");
        assert!(law(safe) <= 0.9 * total, "what is called safe fits");
        assert!(extra.len() <= 5, "{extra:?}");
    }
}

#[test]
fn a_linear_batch_trainer_is_searched_between_its_grid_points() {
    // 6 GB + 0.5 GB per sample on an 80 GB device: 132 fits under 72 GB.
    let law = |b: f64| 6e9 + 0.5e9 * b;
    let (safe, extra) = search(&law, 80e9, &[8.0, 16.0, 32.0, 64.0, 128.0, 256.0], 6);
    assert_eq!(
        safe, 128.0,
        "the grid's step is 8: 132 is not on it; {extra:?}"
    );
    let (safe, extra) = search(&law, 80e9, &[4.0, 8.0, 12.0], 8);
    assert!(extra.len() <= 4, "{extra:?}");
    assert_eq!(safe, 132.0);
}

#[test]
fn without_a_model_it_bisects_or_steps_up() {
    // One run and an OOM far above: bisect.
    let s = assess(&[ran(8.0, 10.0), (64.0, Outcome::Oom)], TARGET, Some(8.0));
    assert!(s.model.is_err());
    assert_eq!(run_of(&s.next), Some(32.0));
    // One run, nothing failed: one step up (the run's own size).
    let s = assess(&[ran(1024.0, 4.0)], TARGET, Some(1024.0));
    assert_eq!(run_of(&s.next), Some(2048.0));
    // Adjacent: done.
    let s = assess(&[ran(8.0, 10.0), (16.0, Outcome::Oom)], TARGET, Some(8.0));
    assert!(matches!(s.next, Next::Done { .. }));
    // Even the smallest OOMed: try lower on the step.
    let s = assess(&[(32.0, Outcome::Oom)], TARGET, Some(8.0));
    assert_eq!((s.safe, run_of(&s.next)), (None, Some(16.0)));
    // Values that are not whole numbers: no search.
    let s = assess(
        &[ran(0.5, 1.0), ran(1.5, 2.0)],
        TARGET,
        common_step(&[0.5, 1.5]),
    );
    assert!(matches!(s.next, Next::Done { .. }));
}

#[test]
fn common_step_is_the_gcd_of_whole_values() {
    assert_eq!(common_step(&[1024.0, 2048.0, 3072.0]), Some(1024.0));
    assert_eq!(common_step(&[6.0, 8.0, 10.0]), Some(2.0));
    assert_eq!(common_step(&[3.0, 8.0]), Some(1.0));
    assert_eq!(common_step(&[0.5, 1.0]), None);
    assert_eq!(common_step(&[]), None);
}
