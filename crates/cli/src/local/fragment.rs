//! `memprof fragment FILE...` (seed 000's `fragment`): how fragmented each
//! trainer's allocator cache is, read from the reports `memprof profile
//! --output` wrote (or a MemoryReport's spec saved with `-o json`): the
//! fragmentation now, its trend over the run, the allocation-size pattern
//! and the advice that names what it saw. The numbers are the in-process
//! agent's (PyTorch's allocator); NVML cannot see inside the cache, so a
//! report without agent data says so instead.
//!
//! Exit status: 0; 1 when no report holds the agent's numbers.

use crate::local::rollup::{self, Loaded, RollupError};
use crate::render::{analysis, details};
use std::fmt::Write;
use std::path::PathBuf;

/// Flags of `memprof fragment`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Report files (`memprof profile --output`), one or an array per file.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
}

/// Prints the view; returns the exit code.
pub async fn run(args: Args) -> Result<i32, RollupError> {
    let (loaded, bad) = rollup::load(&args.files);
    for b in &bad {
        eprintln!("memprof fragment: skipped {b}");
    }
    if loaded.is_empty() {
        return Err(RollupError::Nothing {
            files: args.files.len(),
            why: bad.join("; "),
        });
    }
    let (text, any) = render(&loaded);
    crate::output::print(&text);
    Ok(if any { 0 } else { 1 })
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
}
