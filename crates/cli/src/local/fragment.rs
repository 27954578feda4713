//! `memprof fragment FILE...` (seed 000's `fragment`): how fragmented each
//! trainer's allocator cache is, read from the reports `memprof profile
//! --output` wrote (or a MemoryReport's spec saved with `-o json`): the
//! fragmentation now, its trend over the run, the allocation-size pattern
//! and the advice that names what it saw. The numbers are the in-process
//! agent's (PyTorch's allocator); NVML cannot see inside the cache, so a
//! report without agent data says so instead.
//!
//! `--plot FILE` draws the trend (the terminal shows it as a sparkline):
//! the cache's share of reserved memory over the run, one line per report,
//! and the share in inactive split blocks dashed, 0 to 100 %.
//!
//! Exit status: 0; 1 when no report holds the agent's numbers.

use crate::local::rollup::{self, Loaded, RollupError};
use crate::plot::{LineChart, Series, Style, Unit};
use crate::render::{analysis, details};
use memprof_api::FragmentationPoint;
use std::fmt::Write;
use std::path::PathBuf;

/// Flags of `memprof fragment`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Report files (`memprof profile --output`), one or an array per file.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// Draw the fragmentation trend to FILE (.svg or .png).
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
}

/// Why `memprof fragment` could not show or draw the reports.
#[derive(Debug, thiserror::Error)]
pub enum FragmentError {
    /// No file held a usable report.
    #[error(transparent)]
    Load(#[from] RollupError),
    /// `--plot` names a file that cannot be written (checked before reading).
    #[error(transparent)]
    PlotPath(#[from] crate::outfile::OutFileError),
    /// The chart could not be written.
    #[error(transparent)]
    Plot(#[from] crate::plot::ImageError),
}

/// Prints the view (and writes the chart); returns the exit code.
pub async fn run(args: Args) -> Result<i32, FragmentError> {
    if let Some(p) = &args.plot {
        crate::outfile::prepare_image("--plot", p)?;
    }
    let (loaded, bad) = rollup::load(&args.files);
    for b in &bad {
        eprintln!("memprof fragment: skipped {b}");
    }
    if loaded.is_empty() {
        return Err(RollupError::Nothing {
            files: args.files.len(),
            why: bad.join("; "),
        }
        .into());
    }
    let (text, any) = render(&loaded);
    crate::output::print(&text);
    if let Some(p) = &args.plot {
        let c = chart(&loaded);
        if c.series.is_empty() {
            eprintln!(
                "memprof fragment: no fragmentation trend in any report, nothing drawn to {}",
                p.display()
            );
        } else {
            crate::plot::write_image(p, &c.to_svg())?;
            println!("plot written to {}", p.display());
        }
    }
    Ok(if any { 0 } else { 1 })
}

/// The trend of every report with one: the cache's share of reserved
/// memory (reserved with no tensor in it) per interval, and the share in
/// inactive split blocks where the agent sent it; x is seconds since the
/// earliest point of any report, so ranks of one run line up.
pub fn chart(loaded: &[Loaded]) -> LineChart {
    let trends = trends(loaded);
    let t0 = trends
        .iter()
        .filter_map(|(_, t)| t.first().map(|p| p.t))
        .min()
        .unwrap_or(0);
    let series = trends
        .iter()
        .enumerate()
        .flat_map(|(i, (l, points))| report_series(l, points, t0, crate::plot::palette(i)))
        .collect();
    LineChart {
        title: "Fragmentation over the run (the agent's trend, largest cache per interval)".into(),
        x_label: "time since the first point".into(),
        x_unit: Unit::Seconds,
        y_label: "share of reserved memory holding no tensor".into(),
        y_unit: Unit::Percent,
        series,
        // 0 and 100 % drawn, so a flat 60 % does not look like a climb.
        hlines: vec![crate::plot::HLine {
            y: 100.0,
            label: "all reserved memory cached".into(),
        }],
        marks: vec![],
    }
}

/// The reports with a fragmentation trend, each with its points.
fn trends(loaded: &[Loaded]) -> Vec<(&Loaded, &[FragmentationPoint])> {
    loaded
        .iter()
        .filter_map(|l| {
            let a = l.spec.allocator.as_ref()?;
            (!a.fragmentation_trend.is_empty()).then_some((l, a.fragmentation_trend.as_slice()))
        })
        .collect()
}

/// One report's lines in one color: its cache share, and its inactive split
/// share where the agent sent it; x in seconds since `t0`.
fn report_series(l: &Loaded, points: &[FragmentationPoint], t0: i64, color: &str) -> Vec<Series> {
    let name = match l.spec.rank {
        Some(r) => format!("rank {r}"),
        None => l.spec.pod_name.clone(),
    };
    let x = |p: &FragmentationPoint| (p.t - t0) as f64;
    let share = |b: u64, p: &FragmentationPoint| 100.0 * b as f64 / p.reserved_bytes.max(1) as f64;
    let cache = points
        .iter()
        .map(|p| {
            (
                x(p),
                share(p.reserved_bytes.saturating_sub(p.allocated_bytes), p),
            )
        })
        .collect();
    let mut series =
        vec![Series::new(format!("{name} cache"), cache, Style::Line).with_color(color)];
    let split: Vec<_> = points
        .iter()
        .filter_map(|p| p.inactive_split_bytes.map(|b| (x(p), share(b, p))))
        .collect();
    if !split.is_empty() {
        series.push(
            Series::new(format!("{name} inactive split"), split, Style::Dashed).with_color(color),
        );
    }
    series
}

/// The view of every report; true when at least one had agent data.
pub fn render(loaded: &[Loaded]) -> (String, bool) {
    let mut out = String::new();
    let mut any = false;
    for l in loaded {
        let s = &l.spec;
        let who = match s.rank {
            Some(r) => format!("rank {r} ({})", s.pod_name),
            None => s.pod_name.clone(),
        };
        let _ = writeln!(out, "{}: {who}", l.file.display());
        let Some(a) = &s.allocator else {
            let _ = writeln!(
                out,
                "    no agent data: fragmentation is read inside PyTorch's allocator by the in-process agent \
                 (run the trainer under `memprof profile -- python train.py`)"
            );
            continue;
        };
        any = true;
        analysis::verdict_before_oom(&mut out, a);
        details::fragmentation(&mut out, a);
        if a.fragmentation.is_none() {
            let _ = writeln!(out, "    fragmentation: not reported yet");
        }
        analysis::fragment(&mut out, a);
        if a.fragmentation_trend.is_empty() && a.allocation_sizes.is_none() {
            let _ = writeln!(
                out,
                "    no trend or size pattern yet (the agent sends sizes every few pushes; a run of a few seconds may end first)"
            );
        }
        let advice = a.advice.as_deref().unwrap_or("none: nothing to change");
        let _ = writeln!(out, "    advice: {advice}");
    }
    (out, any)
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_api::{AllocatorStats, FragmentationPoint, MemoryReportSpec};

    const G: u64 = 1 << 30;

    fn loaded(name: &str, allocator: Option<AllocatorStats>) -> Loaded {
        Loaded {
            file: name.into(),
            spec: MemoryReportSpec {
                pod_name: "box-rank0".into(),
                rank: Some(0),
                allocator,
                ..Default::default()
            },
        }
    }

    #[test]
    fn each_report_shows_now_the_trend_and_the_advice_or_why_it_cannot() {
        let a = AllocatorStats {
            allocated_bytes: 4 * G,
            reserved_bytes: 10 * G,
            fragmentation: Some(0.6),
            inactive_split_fraction: Some(0.5),
            alloc_retries: 3,
            advice: Some("set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True".into()),
            fragmentation_trend: vec![
                FragmentationPoint {
                    t: 0,
                    reserved_bytes: 10 * G,
                    allocated_bytes: 9 * G,
                    ..Default::default()
                },
                FragmentationPoint {
                    t: 90,
                    reserved_bytes: 10 * G,
                    allocated_bytes: 4 * G,
                    alloc_retries: 3,
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let (text, any) = render(&[loaded("a.json", Some(a)), loaded("nvml.json", None)]);
        assert!(any);
        for want in [
            "a.json: rank 0 (box-rank0)",
            "fragmentation: 60% of reserved memory holds no tensor, 50% in inactive split blocks",
            "fragmentation over 1m30s (2 points, 0-100%):",
            "10% -> 60%, worst 60%; retries 0 -> 3",
            "advice: set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
            "nvml.json: rank 0 (box-rank0)\n    no agent data: fragmentation is read inside PyTorch's allocator",
        ] {
            assert!(text.contains(want), "{want:?} not in\n{text}");
        }
        let (_, any) = render(&[loaded("nvml.json", None)]);
        assert!(!any, "no agent data anywhere: exit 1");
    }

    #[test]
    fn the_chart_has_a_line_per_report_on_one_clock_and_the_split_share_dashed() {
        let point = |t, allocated, split| FragmentationPoint {
            t,
            reserved_bytes: 10 * G,
            allocated_bytes: allocated * G,
            inactive_split_bytes: split,
            ..Default::default()
        };
        let a = |points| AllocatorStats {
            fragmentation_trend: points,
            ..Default::default()
        };
        let mut late = loaded("b.json", Some(a(vec![point(110, 5, None)])));
        late.spec.rank = Some(1);
        let c = chart(&[
            loaded(
                "a.json",
                Some(a(vec![point(100, 9, Some(G)), point(120, 4, Some(2 * G))])),
            ),
            late,
            loaded("nvml.json", None),
        ]);
        let names: Vec<_> = c.series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            ["rank 0 cache", "rank 0 inactive split", "rank 1 cache"]
        );
        let pts = |i: usize| c.series[i].points.clone();
        assert_eq!(pts(0), [(0.0, 10.0), (20.0, 60.0)]);
        assert_eq!(pts(1), [(0.0, 10.0), (20.0, 20.0)]);
        assert_eq!(
            pts(2),
            [(10.0, 50.0)],
            "seconds since the earliest point of any report"
        );
        assert_eq!(c.series[0].color, c.series[1].color);
        assert_eq!((c.x_unit, c.y_unit), (Unit::Seconds, Unit::Percent));
        assert!(chart(&[loaded("nvml.json", None)]).series.is_empty());
    }
}
