//! One trainer's allocator numbers, from its report's `allocator` section:
//! what a profile's status does not keep (the roll-up keeps the verdicts),
//! shown under [`super::agent_sections`] where a report is at hand.

use super::{analysis, rate};
use memprof_api::{format_bytes, AllocatorStats, MemoryReportSpec};
use std::fmt::Write;

/// Appends `spec`'s allocator details to `out` (nothing without an agent).
pub fn render(out: &mut String, spec: &MemoryReportSpec) {
    let Some(a) = &spec.allocator else {
        return;
    };
    let who = match spec.rank {
        Some(r) => format!("rank {r}"),
        None => "the trainer".to_string(),
    };
    let _ = writeln!(out, "  {who}'s allocator{}:", position(a));
    analysis::verdict_before_oom(out, a);
    memory(out, a);
    fragmentation(out, a);
    analysis::fragment(out, a);
    match (&a.host, a.rss_bytes) {
        (Some(h), _) => analysis::host(out, h),
        (None, Some(rss)) => {
            let _ = writeln!(out, "    host memory (RSS): {}", format_bytes(rss));
        }
        (None, None) => {}
    }
    if let Some(g) = &a.gradients {
        analysis::gradients(out, g);
    }
    if let Some(t) = &a.tracking {
        analysis::tracking(out, t);
    }
    phases(out, a);
    events(out, a);
}

/// `(GPU cuda:0, step 14, phase forward)`.
fn position(a: &AllocatorStats) -> String {
    let mut parts = vec![];
    if let Some(d) = a.device {
        parts.push(format!("GPU cuda:{d}"));
    }
    if let Some(s) = a.step {
        parts.push(format!("step {s}"));
    }
    if let Some(p) = &a.phase {
        parts.push(format!("phase {p}"));
    }
    if let Some(sps) = a.steps_per_second {
        parts.push(format!("{sps:.2} steps/s"));
    }
    match parts.is_empty() {
        true => String::new(),
        false => format!(" ({})", parts.join(", ")),
    }
}

fn memory(out: &mut String, a: &AllocatorStats) {
    let mut line = format!(
        "    allocated {}, reserved {}",
        format_bytes(a.allocated_bytes),
        format_bytes(a.reserved_bytes)
    );
    if let Some(p) = a.peak_allocated_bytes {
        let _ = write!(line, ", peak allocated {}", format_bytes(p));
    }
    if let Some(l) = a.limit_bytes {
        let _ = write!(line, ", limit {}", format_bytes(l));
    }
    let growth = [
        ("allocated", a.allocated_growth_bytes_per_second),
        ("reserved", a.reserved_growth_bytes_per_second),
    ]
    .into_iter()
    .filter_map(|(what, g)| g.map(|g| format!("{what} {}", rate(g))))
    .collect::<Vec<_>>();
    if !growth.is_empty() {
        let _ = write!(line, "; growth: {}", growth.join(", "));
    }
    let _ = writeln!(out, "{line}");
}

pub(crate) fn fragmentation(out: &mut String, a: &AllocatorStats) {
    let Some(f) = a.fragmentation else {
        return;
    };
    let mut line = format!(
        "    fragmentation: {:.0}% of reserved memory holds no tensor",
        f * 100.0
    );
    if let Some(s) = a.inactive_split_fraction {
        let _ = write!(line, ", {:.0}% in inactive split blocks", s * 100.0);
    }
    let retries = a.recent_alloc_retries.unwrap_or(0);
    let _ = write!(
        line,
        "; {} allocation retries in the last minute ({} in all)",
        retries, a.alloc_retries
    );
    let _ = writeln!(out, "{line}");
}

fn phases(out: &mut String, a: &AllocatorStats) {
    if a.phase_peaks.is_empty() {
        return;
    }
    let peaks: Vec<String> = a
        .phase_peaks
        .iter()
        .map(|p| format!("{} {}", p.phase, format_bytes(p.allocated_bytes)))
        .collect();
    let _ = writeln!(out, "    peak allocated by phase: {}", peaks.join(", "));
}

fn events(out: &mut String, a: &AllocatorStats) {
    if a.events.is_empty() {
        return;
    }
    let _ = writeln!(out, "    newest events:");
    for e in &a.events {
        let step = e.step.map_or(String::new(), |s| format!(" step {s}"));
        let mem = e.allocated_bytes.map_or(String::new(), |b| {
            format!("  allocated {}", format_bytes(b))
        });
        let note = e
            .note
            .as_deref()
            .map_or(String::new(), |n| format!("  ({n})"));
        let _ = writeln!(out, "      {}  {}{step}{mem}{note}", e.time, e.name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_api::{AgentEvent, PhasePeak};

    const G: u64 = 1 << 30;

    #[test]
    fn the_details_name_the_rank_memory_fragmentation_phases_and_events() {
        let spec = MemoryReportSpec {
            rank: Some(1),
            allocator: Some(AllocatorStats {
                allocated_bytes: 3 * G,
                reserved_bytes: 4 * G,
                peak_allocated_bytes: Some(5 * G),
                device: Some(0),
                step: Some(14),
                phase: Some("forward".into()),
                fragmentation: Some(0.25),
                inactive_split_fraction: Some(0.1),
                recent_alloc_retries: Some(2),
                alloc_retries: 7,
                allocated_growth_bytes_per_second: Some(2e6),
                rss_bytes: Some(G),
                phase_peaks: vec![PhasePeak {
                    phase: "backward".into(),
                    allocated_bytes: 5 * G,
                }],
                events: vec![AgentEvent {
                    time: "2026-11-22T10:00:01Z".into(),
                    name: "checkpoint".into(),
                    step: Some(3),
                    allocated_bytes: Some(3 * G),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut out = String::new();
        render(&mut out, &spec);
        for want in [
            "rank 1's allocator (GPU cuda:0, step 14, phase forward):",
            "allocated 3.0GiB, reserved 4.0GiB, peak allocated 5.0GiB; growth: allocated",
            "fragmentation: 25% of reserved memory holds no tensor, 10% in inactive split blocks; 2 allocation retries in the last minute (7 in all)",
            "host memory (RSS): 1.0GiB",
            "peak allocated by phase: backward 5.0GiB",
            "2026-11-22T10:00:01Z  checkpoint step 3  allocated 3.0GiB",
        ] {
            assert!(out.contains(want), "{want:?} not in\n{out}");
        }
        let mut none = String::new();
        render(&mut none, &MemoryReportSpec::default());
        assert!(none.is_empty());
    }
}
