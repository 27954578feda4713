//! The sidecar's analysis of one trainer's push, in words: the verdict kept
//! from before an OOM, host memory, the gradient check, what the reference
//! tracker saw grow, and fragmentation over the run with the allocation-size
//! pattern (seed 000's `fragment`). Part of [`super::details`]; [`fragment`]
//! is also `memprof fragment`'s view.

use super::rate;
use memprof_api::{
    format_bytes, format_duration, AllocationSizes, AllocatorStats, FragmentationPoint,
    GradientCheck, HostMemory, TrackedGrowth,
};
use std::fmt::Write;

/// `verdictBeforeOom`: why growth, fragmentation and advice are not what the
/// allocator showed last.
pub fn verdict_before_oom(out: &mut String, a: &AllocatorStats) {
    if let Some(t) = &a.verdict_before_oom {
        let _ = writeln!(
            out,
            "    verdict kept from before the CUDA OOM at {t} (the state the exception left behind is not evidence)"
        );
    }
}

/// Host memory: what must fit under the container's limit, its growth,
/// whether it leaks, and when it reaches the limit.
pub fn host(out: &mut String, h: &HostMemory) {
    let mut parts = vec![];
    if let Some(r) = h.rss_bytes {
        parts.push(format!("RSS {}", format_bytes(r)));
    }
    if let Some(w) = h.working_set_bytes {
        parts.push(format!("working set {}", format_bytes(w)));
    } else if let Some(u) = h.usage_bytes {
        parts.push(format!("container usage {}", format_bytes(u)));
    }
    parts.push(match h.limit_bytes {
        Some(l) => format!("limit {}", format_bytes(l)),
        None => "no container limit".into(),
    });
    if let Some(g) = h.growth_bytes_per_second {
        parts.push(format!("growth {}", rate(g)));
    }
    let mut line = format!("    host memory: {}", parts.join(", "));
    if h.leak_suspected {
        line.push_str("; LEAK suspected");
    }
    if let Some(t) = h.time_to_limit_seconds {
        let _ = write!(line, "; limit reached in {}", format_duration(t));
    }
    let _ = writeln!(out, "{line}");
    if let Some(advice) = &h.advice {
        let _ = writeln!(out, "      advice: {advice}");
    }
}

/// `3 non-finite (a, b, +1)`; nothing when there were none.
fn named(what: &str, names: &[String], count: u64) -> Option<String> {
    if count == 0 && names.is_empty() {
        return None;
    }
    let count = count.max(names.len() as u64);
    let more = count.saturating_sub(names.len() as u64);
    let mut list = names.join(", ");
    if more > 0 {
        let _ = write!(list, ", +{more}");
    }
    Some(format!("{count} {what} ({list})"))
}

/// The latest gradient check: NaN/Inf, exploding and vanishing gradients.
pub fn gradients(out: &mut String, g: &GradientCheck) {
    let at = g
        .step
        .map_or("latest check".into(), |s| format!("step {s}"));
    let checked = g
        .checked
        .map_or(String::new(), |n| format!(", {n} checked"));
    let flagged: Vec<String> = [
        named("non-finite", &g.non_finite, g.non_finite_count),
        named("large", &g.large, g.large_count),
        named("vanishing", &g.vanishing, g.vanishing_count),
    ]
    .into_iter()
    .flatten()
    .collect();
    let verdict = match flagged.is_empty() {
        true => "all finite, none unusually large or vanishing".to_string(),
        false => flagged.join("; "),
    };
    let mut line = format!("    gradients ({at}{checked}): {verdict}");
    if let Some(n) = g.global_norm {
        let _ = write!(line, "; global norm {n:.3e}");
        if let Some(m) = g.global_norm_median {
            let _ = write!(line, " (median {m:.3e})");
        }
    }
    if let Some(s) = g.first_non_finite_step {
        let _ = write!(line, "; first non-finite at step {s}");
    }
    let _ = writeln!(out, "{line}");
}

/// What grew between the reference tracker's last two samples.
pub fn tracking(out: &mut String, t: &TrackedGrowth) {
    let steps = match (t.from_step, t.to_step) {
        (Some(a), Some(b)) => format!("steps {a} to {b}"),
        _ => "the last two samples".into(),
    };
    let secs = t
        .seconds
        .map_or(String::new(), |s| format!(", {}", format_duration(s)));
    let live = match (t.live_tensors, t.live_tensor_bytes) {
        (Some(n), Some(b)) => format!("; {n} live tensors, {}", format_bytes(b)),
        _ => String::new(),
    };
    if t.tensors.is_empty() && t.objects.is_empty() {
        let _ = writeln!(out, "    tracked ({steps}{secs}): nothing grew{live}");
        return;
    }
    let _ = writeln!(out, "    grew between {steps}{secs}{live}:");
    for g in &t.tensors {
        let site = g
            .site
            .as_deref()
            .map_or(String::new(), |s| format!("  at {s}"));
        let bytes = format!("{}{}", sign(g.bytes), format_bytes(g.bytes.unsigned_abs()));
        let _ = writeln!(
            out,
            "      {:+} tensors {bytes}  {}{site}",
            g.count, g.group
        );
    }
    for o in &t.objects {
        let _ = writeln!(out, "      {:+} {} (live {})", o.count, o.type_, o.live);
    }
}

fn sign(v: i64) -> &'static str {
    match v < 0 {
        true => "-",
        false => "+",
    }
}

/// Fragmentation over the run and the allocation-size pattern.
pub fn fragment(out: &mut String, a: &AllocatorStats) {
    trend(out, &a.fragmentation_trend);
    if let Some(s) = &a.allocation_sizes {
        sizes(out, s);
    }
}

/// The cache's share of reserved memory at a point (0 when nothing is reserved).
fn cache_share(p: &FragmentationPoint) -> f64 {
    let cache = p.reserved_bytes.saturating_sub(p.allocated_bytes);
    cache as f64 / p.reserved_bytes.max(1) as f64
}

fn trend(out: &mut String, points: &[FragmentationPoint]) {
    let (Some(first), Some(last)) = (points.first(), points.last()) else {
        return;
    };
    if points.len() == 1 {
        // No trend in one interval: only its largest cache.
        let _ = writeln!(
            out,
            "    fragmentation over the run: one interval so far, largest cache {:.0}% of reserved",
            cache_share(first) * 100.0
        );
        return;
    }
    // Drawn from 0 to 100 %, so a flat 60 % does not look like a climb.
    let mut line = vec![0.0, 1.0];
    line.extend(points.iter().map(cache_share));
    let spark: String = crate::plot::sparkline(&line).chars().skip(2).collect();
    let worst = points.iter().map(cache_share).fold(0.0, f64::max);
    let span = format_duration((last.t - first.t).max(0) as f64);
    let _ = writeln!(
        out,
        "    fragmentation over {span} ({} points, 0-100%): {spark}  {:.0}% -> {:.0}%, worst {:.0}%; retries {} -> {}",
        points.len(),
        cache_share(first) * 100.0,
        cache_share(last) * 100.0,
        worst * 100.0,
        first.alloc_retries,
        last.alloc_retries
    );
    if let Some(split) = last.inactive_split_bytes {
        let _ = writeln!(
            out,
            "      inactive split blocks now {} of {} reserved",
            format_bytes(split),
            format_bytes(last.reserved_bytes)
        );
    }
}

fn sizes(out: &mut String, s: &AllocationSizes) {
    let dominant = s.dominant_bytes.map_or(String::new(), |d| {
        format!("; most live bytes in blocks up to {}", format_bytes(d))
    });
    let _ = writeln!(
        out,
        "    allocation sizes ({}): {}{dominant}",
        s.source, s.pattern
    );
    for (what, buckets) in [("live", &s.buckets), ("free", &s.free_buckets)] {
        let total: u64 = buckets.iter().map(|b| b.count).sum();
        if total == 0 {
            continue;
        }
        let cells: Vec<String> = buckets
            .iter()
            .filter(|b| b.count > 0)
            .map(|b| format!("<={} x{}", format_bytes(b.upper_bytes), b.count))
            .collect();
        let _ = writeln!(out, "      {what} blocks by size: {}", cells.join("  "));
    }
}

#[cfg(test)]
mod tests;
