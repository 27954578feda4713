//! Fragmentation and what to do about it.

use memprof_api::agent::DeviceStats;
use memprof_api::{format_bytes, AllocationSizes, MemoryGrowth};

/// Share of reserved memory holding no tensor at or above which climbing
/// retries are blamed on fragmentation.
pub const FRAGMENTATION_HIGH: f64 = 0.25;
/// Share of reserved memory in inactive split blocks at or above which
/// climbing retries are blamed on fragmentation.
pub const SPLIT_HIGH: f64 = 0.10;

/// (reserved − allocated) / reserved and inactive split / reserved.
pub fn fragmentation(d: &DeviceStats) -> (Option<f64>, Option<f64>) {
    if d.reserved_bytes == 0 {
        return (None, None);
    }
    let reserved = d.reserved_bytes as f64;
    let free = d.reserved_bytes.saturating_sub(d.allocated_bytes) as f64 / reserved;
    let split = d
        .inactive_split_bytes
        .map(|s| (s as f64 / reserved).clamp(0.0, 1.0));
    (Some(free.clamp(0.0, 1.0)), split)
}

/// Most of the idle cache sits in inactive split blocks (`split` at least
/// half of `idle`, both shares of reserved memory, as [`fragmentation`]
/// gives them): segments a tensor still holds, which the allocator's retry
/// at the ceiling cannot release. Whole free segments (a demand that
/// outgrew its cached blocks, a cache refilled after retries) are given
/// back there: room, not fragmentation.
pub fn pinned(idle: f64, split: Option<f64>) -> bool {
    split.is_some_and(|s| 2.0 * s >= idle)
}

/// What the advice is drawn from: the verdict of one device, from before
/// an OOM when there was one.
#[derive(Clone, Copy, Debug)]
pub struct Facts<'a> {
    /// What grows.
    pub growth: MemoryGrowth,
    /// The pace of allocated memory, bytes per second, when known.
    pub pace: Option<f64>,
    /// (reserved − allocated) / reserved.
    pub fragmentation: Option<f64>,
    /// inactive split / reserved.
    pub split: Option<f64>,
    /// Retries within the last minute.
    pub recent_retries: Option<u64>,
    /// The verdict is fragmentation: the cache fills the limit and its free
    /// blocks do not serve the allocations (advice before the first retry).
    pub blocking: bool,
    /// The device's numbers.
    pub device: &'a DeviceStats,
    /// The allocation-size pattern, when the agent read one.
    pub sizes: Option<&'a AllocationSizes>,
}

/// Advice that names what it saw: a leak (kept tensors: no allocator
/// setting cures it), fragmentation when retries climb over a fragmented
/// cache (the cure that fits the size pattern), or pressure when retries
/// climb over an unfragmented one. Nothing otherwise: cached memory that is
/// never missed costs nothing.
pub fn advice(f: &Facts) -> Option<String> {
    // Fragmentation that will block the next allocations is cured by the
    // allocator's settings even where some tensors are kept as well.
    if f.growth == MemoryGrowth::Leak && !f.blocking {
        return Some(leak_advice(f.pace));
    }
    let retries = f.recent_retries.unwrap_or(0);
    if retries == 0 && !f.blocking {
        return None;
    }
    let fragmented = f.blocking
        || f.fragmentation.is_some_and(|x| x >= FRAGMENTATION_HIGH)
        || f.split.is_some_and(|s| s >= SPLIT_HIGH);
    let d = f.device;
    let idle = d.reserved_bytes.saturating_sub(d.allocated_bytes);
    if !fragmented {
        return Some(format!(
            "memory pressure: the allocator freed its cache and retried {retries} \
             allocation(s) in the last minute (each one synchronizes the GPU); \
             allocated memory is close to the limit"
        ));
    }
    let split_mb = f
        .sizes
        .and_then(|s| s.dominant_bytes)
        .map_or("N".to_string(), |b| (b.div_ceil(1 << 20) + 1).to_string());
    let seen = f
        .sizes
        .map_or(String::new(), |s| format!(" ({})", short(&s.pattern)));
    let why = if retries > 0 {
        format!("the allocator retried {retries} allocation(s) in the last minute")
    } else {
        "the cache fills what the allocator may reserve, so the next allocation its free \
         blocks cannot serve fails"
            .to_string()
    };
    Some(format!(
        "fragmentation: {} of reserved memory holds no tensor ({} in inactive split blocks) \
         and {why}{seen}: set \
         PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (PyTorch >= 2.1), or \
         max_split_size_mb:{split_mb} (a little above the largest common allocation, in MiB) \
         so large cached blocks are not split",
        format_bytes(idle),
        format_bytes(d.inactive_split_bytes.unwrap_or(0)),
    ))
}

/// The first clause of a size pattern (the advice has a bound of its own).
fn short(pattern: &str) -> &str {
    let end = pattern.find(';').unwrap_or(pattern.len()).min(96);
    let mut end = end;
    while !pattern.is_char_boundary(end) {
        end -= 1;
    }
    &pattern[..end]
}

fn leak_advice(pace: Option<f64>) -> String {
    let rate = pace.map_or(String::new(), |p| {
        format!(" {}", memprof_api::format_rate(p).trim_start_matches('+'))
    });
    format!(
        "leak: allocated memory between steps grows{rate}: tensors are kept across steps \
         (a loss or output kept with its graph: keep loss.item() or .detach(); a list or \
         dict that grows). No allocator setting cures it. MEMPROF_AGENT_RECORD_HISTORY=1 \
         makes the OOM snapshot name the allocating line; memprof_agent.track() shows \
         which tensors grow"
    )
}
