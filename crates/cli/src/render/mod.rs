//! What memprof concluded, in words: the one renderer of a profile's agent
//! sections, used by `memprof report` (a Job's MemoryProfile on a cluster)
//! and by the local commands (`memprof profile`'s summary, `memprof
//! rollup`), so a verdict reads the same wherever it is shown.
//!
//! - [`agent_sections`]: leak or cache, the allocator's advice, the slowest
//!   rank, the newest OOM's largest blocks, the memory breakdown (what the
//!   roll-up put in the status);
//! - [`details`]: one trainer's allocator numbers from its report (phase
//!   peaks, fragmentation, retries, recorded events) and the sidecar's
//!   analysis of it ([`analysis`]: the verdict kept from before an OOM, host
//!   memory, gradients, tracked growth, fragmentation over the run and the
//!   allocation-size pattern), which a profile's status does not keep.

mod allocator;
pub mod analysis;
pub mod breakdown;
pub mod details;

use memprof_api::{format_bytes, MemoryProfileStatus};

/// Appends the agent's sections of a profile status to `out`, indented two
/// spaces as the rest of `memprof report`; nothing when no agent reported.
pub fn agent_sections(out: &mut String, st: &MemoryProfileStatus) {
    if let Some(a) = &st.allocator {
        allocator::render(out, a);
    }
    if let Some(b) = &st.breakdown {
        breakdown::render_breakdown(out, b);
    }
}

/// A growth rate for a person: `+100MiB/s`, `-2.0GiB/s`, `0/s` below 1 B/s.
pub fn rate(bytes_per_second: f64) -> String {
    let v = bytes_per_second;
    if !v.is_finite() || v.abs() < 1.0 {
        return "0/s".into();
    }
    let sign = if v > 0.0 { "+" } else { "-" };
    format!("{sign}{}/s", format_bytes(v.abs() as u64))
}
