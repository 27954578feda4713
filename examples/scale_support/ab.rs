//! `operator_scale --workload jobset` and `--workload pytorchjob`: one Job
//! against one JobSet (or one PyTorchJob) of the same ranks, same machine,
//! same invocation. Each run has its own
//! namespace and operator (so each CPU figure is one operator's), the runs
//! alternate (Job, JobSet, then JobSet, Job, …) so that a machine shared
//! with other work loads both alike, and the comparison is of medians over
//! the runs, with their spread.

use super::measure::percentile;
use std::future::Future;

/// What one measured run profiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Case {
    /// `--jobs` Jobs of `--ranks` ranks.
    Jobs,
    /// One JobSet of `--ranks` ranks in child Jobs of `--pods-per-job` pods.
    JobSet,
    /// One PyTorchJob of `--ranks` ranks (a master and `--ranks - 1` workers).
    PyTorchJob,
}

/// What one run measured.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub case: Case,
    /// Report write → profile reflects it, ms, sorted: the burst rounds'.
    pub burst: Vec<f64>,
    /// The same, the paced round's.
    pub paced: Vec<f64>,
    /// The operator's CPU (utime + stime) in the measured window.
    pub cpu_seconds: f64,
    /// Report watch events the operator saw in the window (`memprof_reports_seen_total`).
    pub events: f64,
    /// Reconciles in the window.
    pub reconciles: f64,
    /// The 1-minute load average at the window's start and end.
    pub load: (String, String),
}

impl Outcome {
    /// Operator CPU per report event, ms.
    pub fn cpu_ms_per_event(&self) -> f64 {
        1000.0 * self.cpu_seconds / self.events.max(1.0)
    }
}

/// `repeat` pairs of a Job and `other`, the order swapped every pair;
/// stops at the first failure.
pub async fn pairs<F, Fut>(repeat: u32, other: Case, mut run: F) -> anyhow::Result<Vec<Outcome>>
where
    F: FnMut(Case) -> Fut,
    Fut: Future<Output = anyhow::Result<Outcome>>,
{
    let mut out = Vec::new();
    for pair in 0..repeat.max(1) {
        let order = if pair % 2 == 0 {
            [Case::Jobs, other]
        } else {
            [other, Case::Jobs]
        };
        for case in order {
            println!("== pair {} of {}: {case:?}", pair + 1, repeat.max(1));
            out.push(run(case).await?);
        }
    }
    Ok(out)
}

/// The median of `values` (NaN when empty).
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    percentile(values, 0.5)
}

/// Median over the runs of `case` of `f`, and the runs' range.
fn over_runs(outcomes: &[Outcome], case: Case, f: impl Fn(&Outcome) -> f64) -> (f64, f64, f64) {
    let mut v: Vec<f64> = outcomes.iter().filter(|o| o.case == case).map(f).collect();
    let m = median(&mut v);
    (
        m,
        v.first().copied().unwrap_or(f64::NAN),
        v.last().copied().unwrap_or(f64::NAN),
    )
}

/// Every run, then per measure the median over runs of each case, the
/// range, and `other` ÷ Job (goal: ≤ 1.10); `what`: `other` in words.
pub fn print(outcomes: &[Outcome], ranks: u32, other: Case, what: &str) {
    println!("\nA/B: 1 Job x {ranks} ranks against 1 {what} ({ranks} ranks)");
    println!("  run  case        burst p50/p90 ms   paced p50/p90 ms   CPU ms/event  events  reconciles  load");
    for (i, o) in outcomes.iter().enumerate() {
        println!(
            "  {:>3}  {:<10}  {:>7.0} / {:>6.0}   {:>7.0} / {:>6.0}   {:>12.3}  {:>6.0}  {:>10.0}  {}-{}",
            i + 1,
            format!("{:?}", o.case),
            percentile(&o.burst, 0.5),
            percentile(&o.burst, 0.9),
            percentile(&o.paced, 0.5),
            percentile(&o.paced, 0.9),
            o.cpu_ms_per_event(),
            o.events,
            o.reconciles,
            o.load.0,
            o.load.1
        );
    }
    type Measure = (&'static str, fn(&Outcome) -> f64);
    let measures: [Measure; 5] = [
        ("burst p50 ms", |o| percentile(&o.burst, 0.5)),
        ("burst p90 ms", |o| percentile(&o.burst, 0.9)),
        ("paced p50 ms", |o| percentile(&o.paced, 0.5)),
        ("paced p90 ms", |o| percentile(&o.paced, 0.9)),
        (
            "operator CPU ms per report event",
            Outcome::cpu_ms_per_event,
        ),
    ];
    println!("  medians over runs (range):");
    for (what, f) in measures {
        let (job, jl, jh) = over_runs(outcomes, Case::Jobs, f);
        let (set, sl, sh) = over_runs(outcomes, other, f);
        let ratio = set / job;
        let verdict = if ratio <= 1.10 {
            "within 10 %"
        } else {
            "MISSED"
        };
        println!(
            "    {what}: Job {job:.3} ({jl:.3}-{jh:.3}), {other:?} {set:.3} ({sl:.3}-{sh:.3}): {other:?} / Job {ratio:.2} (goal <= 1.10: {verdict})"
        );
    }
}
