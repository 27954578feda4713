//! The roll-up of the in-process agents' verdicts in words.

use memprof_api::{format_bytes, AllocatorRollup, MemoryGrowth};
use std::fmt::Write;

/// What the in-process agents said: leak or cache, advice, step rate, the OOM's blocks.
pub fn render(out: &mut String, a: &AllocatorRollup) {
    let growth = match a.growth {
        MemoryGrowth::Leak => "leak: allocated memory between steps keeps growing".to_string(),
        // A trainer with no rank (a local run) has no rank to name.
        MemoryGrowth::Cache if a.cache_ranks.is_empty() => {
            "cache: reserved memory grows, allocated memory between steps is flat (not a leak)"
                .to_string()
        }
        MemoryGrowth::Cache => format!(
            "cache: reserved memory grows on ranks {:?}, allocated memory between steps is flat (not a leak)",
            a.cache_ranks
        ),
        MemoryGrowth::None => "nothing grows".to_string(),
    };
    let _ = writeln!(
        out,
        "  allocator (agent in {} rank(s)): {growth}",
        a.ranks_with_agent
    );
    if let Some(advice) = &a.advice {
        let _ = writeln!(out, "  advice: {advice}");
    }
    match a.slowest_steps_per_second {
        // One trainer has no slowest rank, only a step rate.
        Some(sps) if a.ranks_with_agent <= 1 => {
            let _ = writeln!(out, "  step rate: {sps:.2} steps/s");
        }
        Some(sps) => {
            let rank = a.slowest_rank.map_or("-".to_string(), |r| r.to_string());
            let _ = writeln!(out, "  slowest rank: {rank} at {sps:.2} steps/s");
        }
        None => {}
    }
    if let Some(o) = &a.last_oom {
        let rank = o.rank.map_or("-".to_string(), |r| r.to_string());
        let asked = o.snapshot.requested_bytes.map_or(String::new(), |b| {
            format!(", asked for {}", format_bytes(b))
        });
        let _ = writeln!(
            out,
            "  CUDA OOM at {} in pod {} (rank {rank}){asked}; largest live blocks:",
            o.snapshot.time, o.pod
        );
        for b in &o.snapshot.blocks {
            let at = if b.frames.is_empty() {
                "-".to_string()
            } else {
                b.frames.join(" <- ")
            };
            let blocks = b.count.map_or(String::new(), |n| format!(" in {n} blocks"));
            let _ = writeln!(out, "    {:>9}{blocks}  {at}", format_bytes(b.size_bytes));
        }
        if o.snapshot.source != "history" {
            let _ = writeln!(
                out,
                "    (no allocation stacks: set MEMPROF_AGENT_RECORD_HISTORY=1 in the trainer to name the code)"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_trainer_has_a_step_rate_not_a_slowest_rank() {
        let mut a = AllocatorRollup {
            ranks_with_agent: 1,
            slowest_steps_per_second: Some(9.9),
            ..Default::default()
        };
        let mut one = String::new();
        render(&mut one, &a);
        assert!(one.contains("  step rate: 9.90 steps/s\n"), "{one}");
        assert!(!one.contains("slowest"), "{one}");
        a.growth = MemoryGrowth::Cache;
        let mut local = String::new();
        render(&mut local, &a);
        assert!(
            local.contains("cache: reserved memory grows, allocated memory between steps is flat"),
            "no `on ranks []` for a trainer without a rank: {local}"
        );
        (a.ranks_with_agent, a.slowest_rank) = (4, Some(3));
        let mut four = String::new();
        render(&mut four, &a);
        assert!(
            four.contains("  slowest rank: 3 at 9.90 steps/s\n"),
            "{four}"
        );
    }
}
