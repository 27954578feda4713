//! `memprof report [JOB]` (also `kubectl memprof report`): what the operator
//! concluded about a job, from its MemoryProfile, in words.

use crate::api::{format_bytes, format_duration, MemoryProfile};
use std::fmt::Write;

/// Renders one profile for a terminal.
pub fn render(p: &MemoryProfile) -> String {
    let mut out = String::new();
    let name = p.metadata.name.clone().unwrap_or_default();
    let ns = p.metadata.namespace.clone().unwrap_or_default();
    let _ = writeln!(out, "MemoryProfile {ns}/{name} (job {})", p.spec.job_name);
    let Some(st) = &p.status else {
        let _ = writeln!(out, "  no status yet: no sidecar has reported (is the sidecar injected and allowed to write memoryreports?)");
        return out;
    };
    let _ = writeln!(
        out,
        "  ranks reporting: {}   GPUs: {}",
        st.ranks, st.gpu_count
    );
    let _ = writeln!(
        out,
        "  risk: {} (confidence {:.0}%)   time to OOM: {}",
        st.risk,
        st.confidence * 100.0,
        st.time_to_oom.as_deref().unwrap_or("-")
    );
    let _ = writeln!(
        out,
        "  peak: {}   now: {} ({:.0}%)",
        st.peak,
        format_bytes(st.current_used_bytes),
        st.current_percent
    );
    if let Some(i) = st.imbalance {
        let _ = writeln!(out, "  imbalance (max/mean of per-GPU peak): {i:.2}");
    }
    if let Some(b) = &st.bottleneck {
        let rank = b.rank.map_or("-".to_string(), |r| r.to_string());
        let _ = writeln!(
            out,
            "  bottleneck: rank {rank}, pod {}, node {}, GPU {} ({})",
            b.pod,
            b.node.as_deref().unwrap_or("-"),
            b.gpu_index,
            b.gpu_uuid
        );
    }
    if st.leak_suspected {
        let _ = writeln!(
            out,
            "  leak suspected on ranks {:?}: memory between steps keeps growing",
            st.leak_ranks
        );
    }
    if let Some(f) = st.fragmentation {
        let _ = writeln!(
            out,
            "  fragmentation: {:.0}% of reserved memory holds no tensor",
            f * 100.0
        );
    }
    if !st.top_ranks.is_empty() {
        let _ = writeln!(out, "  closest to OOM:");
        for r in &st.top_ranks {
            let rank = r.location.rank.map_or("-".to_string(), |r| r.to_string());
            let tto = r
                .time_to_oom_seconds
                .map_or("-".to_string(), format_duration);
            let _ = writeln!(
                out,
                "    rank {rank:>4}  {:<8}  peak {:>9} / {:<9}  growth {:>8.1} MB/s  TTO {tto}  ({})",
                r.risk.to_string(),
                format_bytes(r.peak_bytes),
                format_bytes(r.total_bytes),
                r.growth_bytes_per_second / 1e6,
                r.location.pod
            );
        }
    }
    for o in &st.ooms {
        let _ = writeln!(out, "  OOM at {} in pod {}: {}", o.time, o.pod, o.evidence);
    }
    for r in &st.remediations {
        let _ = writeln!(
            out,
            "  remediation {} [{}] {} by {}",
            r.id, r.phase, r.action, r.policy
        );
    }
    for c in &st.conditions {
        let _ = writeln!(
            out,
            "  condition {}={} ({}): {}",
            c.type_, c.status, c.reason, c.message
        );
    }
    out
}
