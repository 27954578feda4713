//! Fragmentation and what to do about it.

use memprof_api::agent::DeviceStats;
use memprof_api::format_bytes;

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

/// Advice when retries climb: fragmentation's cure when reserved memory is
/// fragmented, otherwise a word on pressure. Nothing while retries are flat:
/// cached memory that is never missed costs nothing.
pub fn advice(
    fragmentation: Option<f64>,
    split: Option<f64>,
    recent_retries: Option<u64>,
    d: &DeviceStats,
) -> Option<String> {
    let retries = recent_retries.filter(|r| *r > 0)?;
    let fragmented = fragmentation.is_some_and(|f| f >= FRAGMENTATION_HIGH)
        || split.is_some_and(|s| s >= SPLIT_HIGH);
    let idle = d.reserved_bytes.saturating_sub(d.allocated_bytes);
    Some(if fragmented {
        format!(
            "fragmentation: {} of reserved memory holds no tensor ({} in inactive split blocks) \
             and the allocator retried {retries} allocation(s) in the last minute: set \
             PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (PyTorch >= 2.1), or \
             max_split_size_mb:N (N a little above the largest common allocation, in MiB) \
             so large cached blocks are not split",
            format_bytes(idle),
            format_bytes(d.inactive_split_bytes.unwrap_or(0)),
        )
    } else {
        format!(
            "memory pressure: the allocator freed its cache and retried {retries} \
             allocation(s) in the last minute (each one synchronizes the GPU); \
             allocated memory is close to the limit"
        )
    })
}
