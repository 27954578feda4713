//! Fragmentation over time (seed 000's `fragment`): the
//! allocator's cache over the whole run in a bounded trend, and the
//! allocation-size pattern the agent reads (`sizes`), in words.

use memprof_api::agent::{DeviceStats, Sizes, SizesSource};
use memprof_api::{format_bytes, AllocationSizes, FragmentationPoint, SizeBucket};

/// Points of the trend kept (the report's bound).
pub const MAX_TREND_POINTS: usize = 30;
/// Width of a trend point at first, seconds (doubled whenever they merge).
const FIRST_WIDTH: f64 = 10.0;
/// Live allocations spread over at least this many size classes, with the
/// two largest classes holding less than [`MIXED_TOP_SHARE`] of the bytes,
/// are "mixed sizes".
const MIXED_CLASSES: usize = 6;
/// See [`MIXED_CLASSES`].
const MIXED_TOP_SHARE: f64 = 0.7;

/// The cache over the run: one point per interval (the moment the cache
/// was largest), merged pairwise when there are more than
/// [`MAX_TREND_POINTS`], so the whole run fits.
#[derive(Clone, Debug, Default)]
pub struct Trend {
    points: Vec<FragmentationPoint>,
    width: f64,
}

impl Trend {
    /// Adds one push's numbers at `t`.
    pub fn push(&mut self, t: f64, d: &DeviceStats) {
        if self.width == 0.0 {
            self.width = FIRST_WIDTH;
        }
        let idle = |p: &FragmentationPoint| p.reserved_bytes.saturating_sub(p.allocated_bytes);
        let here = FragmentationPoint {
            t: t.floor() as i64,
            reserved_bytes: d.reserved_bytes,
            allocated_bytes: d.allocated_bytes,
            inactive_split_bytes: d.inactive_split_bytes,
            alloc_retries: d.alloc_retries,
        };
        match self.points.last_mut() {
            Some(last) if (t - last.t as f64) < self.width => {
                if idle(&here) > idle(last) {
                    last.reserved_bytes = here.reserved_bytes;
                    last.allocated_bytes = here.allocated_bytes;
                }
                last.inactive_split_bytes =
                    max_opt(last.inactive_split_bytes, here.inactive_split_bytes);
                last.alloc_retries = here.alloc_retries;
            }
            _ => self.points.push(here),
        }
        if self.points.len() > MAX_TREND_POINTS {
            self.merge();
        }
    }

    fn merge(&mut self) {
        let idle = |p: &FragmentationPoint| p.reserved_bytes.saturating_sub(p.allocated_bytes);
        let merged = self
            .points
            .chunks(2)
            .map(|pair| {
                let mut a = pair[0].clone();
                if let Some(b) = pair.get(1) {
                    if idle(b) > idle(&a) {
                        a.reserved_bytes = b.reserved_bytes;
                        a.allocated_bytes = b.allocated_bytes;
                    }
                    a.inactive_split_bytes =
                        max_opt(a.inactive_split_bytes, b.inactive_split_bytes);
                    a.alloc_retries = b.alloc_retries;
                }
                a
            })
            .collect();
        self.points = merged;
        self.width *= 2.0;
    }

    /// The points, oldest first.
    pub fn points(&self) -> &[FragmentationPoint] {
        &self.points
    }
}

fn max_opt(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

fn buckets(h: &[(u64, u64)]) -> Vec<SizeBucket> {
    h.iter()
        .take(32)
        .map(|&(upper_bytes, count)| SizeBucket { upper_bytes, count })
        .collect()
}

/// The size class holding the most live bytes (counted at its upper bound)
/// and the share of the live bytes the two largest classes hold.
fn dominant(h: &[(u64, u64)]) -> Option<(u64, f64)> {
    let mut bytes: Vec<(u64, f64)> = h
        .iter()
        .map(|&(u, c)| (u, u as f64 * c as f64))
        .filter(|b| b.1 > 0.0)
        .collect();
    let total: f64 = bytes.iter().map(|b| b.1).sum();
    bytes.sort_by(|a, b| b.1.total_cmp(&a.1));
    let top2: f64 = bytes.iter().take(2).map(|b| b.1).sum();
    bytes.first().map(|b| (b.0, top2 / total.max(1.0)))
}

/// The pattern of a `sizes` reading in words, and its dominant size class.
pub fn pattern(s: &Sizes) -> (String, Option<u64>) {
    let live: u64 = s.buckets.iter().map(|b| b.1).sum();
    if live == 0 {
        return ("no live allocations".into(), None);
    }
    if s.source == SizesSource::Stats {
        let small: u64 = s
            .buckets
            .iter()
            .filter(|b| b.0 <= 1 << 20)
            .map(|b| b.1)
            .sum();
        return (
            format!(
                "{small} small (up to 1 MiB) and {} large allocations live (pool counts; no sizes without snapshots)",
                live - small
            ),
            None,
        );
    }
    let classes = s.buckets.iter().filter(|b| b.1 > 0).count();
    let Some((dom, top_share)) = dominant(&s.buckets) else {
        return ("no live allocations".into(), None);
    };
    let low = s.buckets.iter().find(|b| b.1 > 0).map_or(0, |b| b.0);
    let high = s.buckets.iter().rev().find(|b| b.1 > 0).map_or(0, |b| b.0);
    let mut words = if classes >= MIXED_CLASSES && top_share < MIXED_TOP_SHARE {
        format!(
            "mixed sizes: {live} live allocations over {classes} size classes from {} to {}",
            format_bytes(low),
            format_bytes(high)
        )
    } else {
        format!(
            "uniform sizes: most live bytes in allocations of up to {} ({live} live)",
            format_bytes(dom)
        )
    };
    let largest_free = s
        .free_buckets
        .as_ref()
        .and_then(|f| f.iter().rev().find(|b| b.1 > 0).map(|b| b.0));
    if let Some(free) = largest_free.filter(|f| *f < dom) {
        words.push_str(&format!(
            "; the cache's free blocks are all smaller than that (up to {}): a new allocation of that size needs a new segment",
            format_bytes(free)
        ));
    }
    (words, Some(dom))
}

/// The report's view of a `sizes` reading.
pub fn report(s: &Sizes, time: Option<String>) -> AllocationSizes {
    let (pattern, dominant_bytes) = pattern(s);
    let mut pattern = pattern;
    memprof_api::truncate_utf8(&mut pattern, 256);
    AllocationSizes {
        source: match s.source {
            SizesSource::Snapshot => "snapshot".into(),
            SizesSource::Stats => "stats".into(),
        },
        time,
        buckets: buckets(&s.buckets),
        free_buckets: s.free_buckets.as_deref().map(buckets).unwrap_or_default(),
        pattern,
        dominant_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1 << 30;
    const M: u64 = 1 << 20;

    #[test]
    fn the_trend_covers_the_whole_run_in_at_most_60_points() {
        let mut tr = Trend::default();
        for i in 0..36_000u64 {
            // An hour at 10 Hz: the cache grows 1 GB every 10 minutes.
            let d = DeviceStats {
                reserved_bytes: 40 * G + (i / 6000) * G,
                allocated_bytes: 30 * G + if i % 20 == 0 { 5 * G } else { 0 },
                inactive_split_bytes: Some(i / 36),
                alloc_retries: i / 3600,
                ..Default::default()
            };
            tr.push(1.8e9 + i as f64 / 10.0, &d);
        }
        let p = tr.points();
        assert!(
            p.len() <= MAX_TREND_POINTS && p.len() >= MAX_TREND_POINTS / 2,
            "{}",
            p.len()
        );
        assert_eq!(p[0].t, 1_800_000_000);
        assert!(p.last().unwrap().t >= 1_800_003_000);
        // Each point is its interval's largest cache: 40 - 30 GB at the start.
        assert_eq!(p[0].reserved_bytes - p[0].allocated_bytes, 10 * G);
        assert_eq!(p.last().unwrap().reserved_bytes, 45 * G);
        assert_eq!(p.last().unwrap().alloc_retries, 9);
        assert!(p.windows(2).all(|w| w[0].t < w[1].t));
    }

    fn sizes(buckets: &[(u64, u64)], free: Option<&[(u64, u64)]>) -> Sizes {
        Sizes {
            source: SizesSource::Snapshot,
            buckets: buckets.to_vec(),
            free_buckets: free.map(|f| f.to_vec()),
            ..Default::default()
        }
    }

    #[test]
    fn the_pattern_names_mixed_and_uniform_sizes_and_free_blocks_too_small() {
        let mixed = sizes(
            &[
                (4096, 900),
                (M, 300),
                (8 * M, 200),
                (64 * M, 60),
                (256 * M, 20),
                (G, 6),
                (2 * G, 2),
            ],
            None,
        );
        let (words, dom) = pattern(&mixed);
        assert!(
            words.starts_with(
                "mixed sizes: 1488 live allocations over 7 size classes from 4.0KiB to 2.0GiB"
            ),
            "{words}"
        );
        assert_eq!(dom, Some(G));
        let uniform = sizes(&[(M, 50), (G, 60)], Some(&[(256 * M, 30)]));
        let (words, dom) = pattern(&uniform);
        assert!(
            words.starts_with("uniform sizes: most live bytes in allocations of up to 1.0GiB"),
            "{words}"
        );
        assert!(words.contains("free blocks are all smaller"), "{words}");
        assert_eq!(dom, Some(G));
        let stats = Sizes {
            buckets: vec![(M, 900), (1 << 40, 40)],
            ..Default::default()
        };
        assert!(pattern(&stats)
            .0
            .starts_with("900 small (up to 1 MiB) and 40 large"));
        assert_eq!(pattern(&sizes(&[], None)).0, "no live allocations");
    }
}
