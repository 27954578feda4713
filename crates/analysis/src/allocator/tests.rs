//! Every allocator rule on plain values: pushes built in code, no clock.

use super::*;
use memprof_api::agent::{Block, DeviceStats, Frame, OomSnapshot, Push, PushKind, SnapshotSource};
use memprof_api::RiskLevel;

const GB: f64 = 1e9;
const TOTAL: u64 = 80_000_000_000;
const T0: f64 = 1.8e9;

/// What the allocator holds at one push.
#[derive(Clone, Copy)]
struct At {
    allocated: f64,
    peak: f64,
    reserved: f64,
    /// Memory of other processes on the device.
    others: f64,
    retries: u64,
    split: f64,
}

fn at(allocated: f64, peak: f64, reserved: f64) -> At {
    At {
        allocated,
        peak,
        reserved,
        others: 0.0,
        retries: 0,
        split: 0.0,
    }
}

fn push(t: f64, step: Option<u64>, phase: Option<&str>, a: At) -> Push {
    let reserved = a.reserved.max(a.peak) as u64;
    let ctx = 500_000_000.0;
    Push {
        version: 1,
        time: T0 + t,
        step,
        phase: phase.map(str::to_string),
        devices: vec![DeviceStats {
            index: 0,
            uuid: Some("GPU-a".into()),
            allocated_bytes: a.allocated as u64,
            reserved_bytes: reserved,
            inactive_split_bytes: Some(a.split as u64),
            peak_allocated_bytes: Some(a.peak.max(a.allocated) as u64),
            alloc_retries: a.retries,
            free_bytes: Some(TOTAL.saturating_sub((reserved as f64 + a.others + ctx) as u64)),
            total_bytes: Some(TOTAL),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// Pushes at 1 Hz for `secs`, 2 steps per second; assessments every second.
fn run(secs: usize, f: impl Fn(f64) -> At) -> (AgentState, Vec<AllocatorAssessment>) {
    let th = Thresholds::default();
    let mut s = AgentState::new(&th);
    let mut out = vec![];
    for i in 0..=secs {
        let t = i as f64;
        s.observe(&push(t, Some(2 * i as u64), None, f(t)));
        out.push(s.assess().remove(0));
    }
    (s, out)
}

/// 30 GB of weights and optimizer state; activations up to +15 GB within a step.
fn training(_t: f64) -> At {
    at(30.0 * GB, 45.0 * GB, 48.0 * GB)
}

#[test]
fn steady_training_is_neither_leak_nor_cache_and_stays_low() {
    let (_, all) = run(600, training);
    for a in &all {
        assert_eq!(a.growth, MemoryGrowth::None, "{a:?}");
        assert!(a.risk.risk <= RiskLevel::Low, "{a:?}");
    }
    assert!(all.last().unwrap().risk.confidence > 0.9);
}

#[test]
fn a_leak_is_called_a_leak_and_its_oom_predicted_against_the_allocator_limit() {
    let rate = 100e6;
    // Allocated grows 100 MB/s; the allocator reserves whole 2 GB segments ahead of it.
    let leak = |t: f64| {
        let floor = 30.0 * GB + rate * t;
        let reserved = ((floor + 15.0 * GB) / (2.0 * GB)).ceil() * 2.0 * GB;
        at(floor, floor + 15.0 * GB, reserved)
    };
    // The real OOM: the peak (floor + 15 GB) reaches free + reserved = total - context.
    let limit = TOTAL as f64 - 500_000_000.0;
    let truth = (limit - 45.0 * GB) / rate;
    let (_, all) = run(300, leak);
    let first_leak = all
        .iter()
        .position(|a| a.growth == MemoryGrowth::Leak)
        .unwrap();
    assert!(first_leak <= 75, "called a leak after {first_leak} s");
    assert!(all[first_leak..].iter().all(|a| a.risk.leak_suspected));
    // Half the leak's life: time to OOM within 10 % of the truth.
    let half = (truth / 2.0) as usize;
    let a = &all[half];
    let tto = a.risk.time_to_oom_seconds.unwrap();
    let remaining = truth - half as f64;
    assert!(
        (tto - remaining).abs() <= 0.1 * remaining,
        "tto {tto} vs {remaining}"
    );
    assert!(a.allocated_growth.unwrap() > 0.9 * rate);
}

#[test]
fn reserved_growing_with_a_flat_floor_is_cache_not_a_leak() {
    // Longer sequences: each step's activations grow, reserved follows in
    // segments, and memory between steps is the same 30 GB.
    let (_, all) = run(600, |t| {
        let act = 5.0 * GB + 40e6 * t;
        at(
            30.0 * GB,
            30.0 * GB + act,
            ((30.0 * GB + act) / (2.0 * GB)).ceil() * 2.0 * GB,
        )
    });
    assert!(all
        .iter()
        .all(|a| a.growth != MemoryGrowth::Leak && !a.risk.leak_suspected));
    assert!(all[200..].iter().any(|a| a.growth == MemoryGrowth::Cache));
}

#[test]
fn with_phases_a_leak_lifts_every_phase_and_longer_sequences_only_one() {
    let th = Thresholds::default();
    let phases = ["forward", "backward", "optimizer"];
    let mut leak = AgentState::new(&th);
    let mut seq = AgentState::new(&th);
    for i in 0..=400usize {
        let t = i as f64;
        let phase = phases[i % 3];
        // Leak: every phase's memory rises with time.
        let base = 30.0 * GB + 100e6 * t;
        let extra = if phase == "forward" {
            10.0 * GB
        } else {
            2.0 * GB
        };
        leak.observe(&push(
            t,
            Some(i as u64),
            Some(phase),
            at(base + extra, base + extra, 75.0 * GB),
        ));
        // Longer sequences: forward's activations rise, the optimizer's memory does not.
        let extra = if phase == "forward" {
            5.0 * GB + 30e6 * t
        } else {
            0.0
        };
        seq.observe(&push(
            t,
            Some(i as u64),
            Some(phase),
            at(30.0 * GB + extra, 30.0 * GB + extra, 60.0 * GB),
        ));
    }
    assert_eq!(leak.assess()[0].growth, MemoryGrowth::Leak);
    assert_ne!(seq.assess()[0].growth, MemoryGrowth::Leak);
    let stats = seq.stats().unwrap();
    assert_eq!(stats.phase_peaks[0].phase, "forward");
    assert_eq!(stats.phase_peaks.len(), 3);
    assert!(stats.phase_peaks[0].allocated_bytes > stats.phase_peaks[2].allocated_bytes);
}

#[test]
fn the_limit_is_free_plus_reserved_not_the_gpu_total() {
    // 20 GB belong to another process: the trainer's OOM comes 20 GB earlier
    // than NVML's ceiling, when reserved memory (10 GB of it a cache no
    // step uses, growing with the tensors) reaches the limit.
    let rate = 100e6;
    let (_, all) = run(150, |t| At {
        others: 20.0 * GB,
        ..at(
            30.0 * GB + rate * t,
            30.0 * GB + rate * t,
            40.0 * GB + rate * t,
        )
    });
    let a = all.last().unwrap();
    let limit = TOTAL as f64 - 20.0 * GB - 500_000_000.0;
    let truth = (limit - (40.0 * GB + rate * 150.0)) / rate;
    let tto = a.risk.time_to_oom_seconds.unwrap();
    assert!((tto - truth).abs() <= 0.1 * truth, "tto {tto} vs {truth}");
}

#[test]
fn fragmentation_advice_needs_fragmented_memory_and_climbing_retries() {
    let frag = |retries: u64| At {
        retries,
        split: 6.0 * GB,
        ..at(30.0 * GB, 30.0 * GB, 50.0 * GB)
    };
    // Fragmented, retries climbing: the concrete advice.
    let (s, all) = run(120, |t| frag(t as u64 / 10));
    let a = all.last().unwrap();
    assert_eq!(a.recent_retries, Some(6));
    let advice = a.advice.as_deref().unwrap();
    assert!(
        advice.contains("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"),
        "{advice}"
    );
    assert!(advice.contains("max_split_size_mb"), "{advice}");
    assert_eq!(a.fragmentation, Some(0.4));
    assert_eq!(s.stats().unwrap().advice.as_deref(), Some(advice));
    // Fragmented but no retry for a minute: cache that is never missed costs nothing.
    let (_, all) = run(120, |t| frag((t as u64).min(30) / 10));
    assert_eq!(all.last().unwrap().advice, None);
    // Retries without fragmentation: pressure, not fragmentation.
    let (_, all) = run(120, |t| At {
        retries: t as u64 / 10,
        ..at(47.0 * GB, 47.0 * GB, 48.0 * GB)
    });
    let advice = all.last().unwrap().advice.clone().unwrap();
    assert!(
        advice.starts_with("memory pressure") && !advice.contains("expandable"),
        "{advice}"
    );
}

#[test]
fn a_restarted_process_starts_its_counters_again() {
    let (_, all) = run(30, |t| At {
        retries: if t < 20.0 { 50 } else { 1 },
        ..training(t)
    });
    assert_eq!(all.last().unwrap().recent_retries, Some(0));
}

#[test]
fn the_step_rate_comes_from_the_step_markers() {
    let (s, _) = run(120, training);
    let rate = s.steps_per_second().unwrap();
    assert!((rate - 2.0).abs() < 1e-9, "{rate}");
    assert!(AgentState::new(&Thresholds::default())
        .steps_per_second()
        .is_none());
}

#[test]
fn the_oom_snapshot_and_events_are_bounded_in_the_report() {
    let th = Thresholds::default();
    let mut s = AgentState::new(&th);
    let frame = Frame {
        filename: "train.py".into(),
        line: 42,
        name: "leak".repeat(100),
    };
    let mut p = push(1.0, Some(9), Some("forward"), training(1.0));
    p.kind = PushKind::Oom;
    p.events = (0..20)
        .map(|i| memprof_api::agent::Event {
            t: T0 + i as f64,
            name: format!("e{i}"),
            ..Default::default()
        })
        .collect();
    p.oom = Some(OomSnapshot {
        device: Some(0),
        requested_bytes: Some(2 << 30),
        message: "CUDA out of memory. ".repeat(100),
        source: SnapshotSource::History,
        blocks: vec![
            Block {
                size_bytes: 6 << 30,
                frames: vec![frame; 8],
                ..Default::default()
            };
            16
        ],
    });
    s.observe(&p);
    let stats = s.stats().unwrap();
    let oom = stats.oom.as_ref().unwrap();
    assert_eq!((oom.blocks.len(), oom.blocks[0].frames.len()), (8, 4));
    assert!(oom.blocks[0].frames[0].starts_with("train.py:42 leakleak"));
    assert!(oom.blocks[0].frames[0].len() <= 256 && oom.message.len() <= 512);
    assert_eq!(oom.source, "history");
    assert_eq!(stats.events.len(), 8);
    assert_eq!(stats.events[7].name, "e19");
    assert!(
        stats.events[0].time.starts_with("2027-01-15T"),
        "{}",
        stats.events[0].time
    );
    assert!(serde_json::to_vec(&stats).unwrap().len() < 12 * 1024);
}

#[test]
fn no_device_numbers_means_no_stats() {
    let th = Thresholds::default();
    let mut s = AgentState::new(&th);
    s.observe(&Push {
        version: 1,
        time: T0,
        step: Some(1),
        ..Default::default()
    });
    assert!(s.stats().is_none());
    assert_eq!(s.last_push(), Some(T0));
}

/// The shape of the 1 GB/s leak recorded on an H100 (docs/gpu-results.md):
/// a 7 GB floor, steps peaking 15 GB above it, 1 GB/s kept from t = 0 until
/// the peak meets the limit 46 s later. With NVML's bucketing the estimate
/// at half the leak's life was 132 % late; the agent's finer series must be
/// within 10 %, critical well before the OOM, and call it a leak.
#[test]
fn a_1_gb_per_s_leak_is_predicted_within_10_percent_at_half_its_life() {
    let th = Thresholds::default();
    let mut s = AgentState::new(&th);
    let rate = 1e9;
    let ctx = 500_000_000.0;
    let limit = TOTAL as f64 - ctx;
    let oom = (limit - 22.0 * GB) / rate; // peak = 7 + 15 GB + leak
    let mut at_half = None;
    let mut first_critical = None;
    let mut first_leak = None;
    for i in -60..(oom as i64) {
        let t = i as f64;
        let leak = rate * t.max(0.0);
        let floor = 7.0 * GB + leak;
        s.observe(&push(
            t + 100.0,
            Some((i + 60) as u64 * 22),
            None,
            at(floor, floor + 15.0 * GB, (floor + 15.0 * GB).max(34.0 * GB)),
        ));
        let a = s.assess().remove(0);
        if i >= 0 && first_critical.is_none() && a.risk.risk >= RiskLevel::Critical {
            first_critical = Some(t);
        }
        if i >= 0 && first_leak.is_none() && a.growth == MemoryGrowth::Leak {
            first_leak = Some(t);
        }
        if i == (oom / 2.0) as i64 {
            at_half = Some((t, a.risk.time_to_oom_seconds));
        }
    }
    let (t, tto) = at_half.unwrap();
    let tto = tto.expect("an estimate at half the leak's life");
    let truth = oom - t;
    assert!((tto - truth).abs() <= 0.1 * truth, "tto {tto} vs {truth}");
    let critical = first_critical.expect("critical before the OOM");
    assert!(
        oom - critical >= 15.0,
        "critical {critical} s into a {oom} s leak"
    );
    let called = first_leak.expect("called a leak before the OOM");
    assert!(called <= 25.0, "called a leak {called} s into it");
}

/// A leak of 0.7 GB/s in a trainer that calls `empty_cache` every 3 s (as
/// recorded on an H200, pcie-d leakec3): each emptying returns the whole
/// free segments, the leak's tensors land in the next step's segments, and
/// the free space around them, which the step's larger allocations cannot
/// use, grows with the leak (1 GB, then 0.06 GB/s; the push after an
/// emptying sees 0.5 GB less reserved). The OOM comes when reserved memory
/// reaches the limit, the largest step 1 GB + 0.06 GB/s short of it. Read
/// as if that cache were free, the time to OOM at half the leak's life was
/// 20 % late; it must be within 10 %.
#[test]
fn a_leak_that_empties_its_cache_is_timed_by_the_cache_it_cannot_use() {
    let th = Thresholds::default();
    let mut s = AgentState::new(&th);
    let (rate, idle_rate) = (0.7 * GB, 0.06 * GB);
    let limit = TOTAL as f64 - 500_000_000.0;
    let oom = (limit - 23.0 * GB) / (rate + idle_rate);
    let mut at_half = None;
    for i in -60..(oom as i64) {
        let t = i as f64;
        let floor = 7.0 * GB + rate * t.max(0.0);
        let peak = floor + 15.0 * GB;
        let emptied = if i % 3 == 1 { 0.5 * GB } else { 0.0 };
        let reserved = peak + 1.0 * GB + idle_rate * t.max(0.0) - emptied;
        s.observe(&push(
            t + 100.0,
            Some((i + 60) as u64 * 40),
            None,
            at(floor, peak, reserved),
        ));
        let a = s.assess().remove(0);
        if i == (oom / 2.0) as i64 {
            at_half = Some((t, a.risk.time_to_oom_seconds, a.growth));
        }
    }
    let (t, tto, growth) = at_half.unwrap();
    let tto = tto.expect("an estimate at half the leak's life");
    let truth = oom - t;
    assert_eq!(growth, MemoryGrowth::Leak);
    assert!((tto - truth).abs() <= 0.1 * truth, "tto {tto} vs {truth}");
}

/// Pushes land at random points of a step: the value at a push is the
/// floor plus some of the activations. Steady training read that way is
/// never a leak, on either horizon.
#[test]
fn noisy_steady_training_is_never_a_leak() {
    let mut seed: u64 = 7;
    let mut noise = move || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let u = (seed >> 33) as f64 / (1u64 << 31) as f64;
        if u < 0.3 {
            0.0
        } else {
            u
        }
    };
    let th = Thresholds::default();
    let mut s = AgentState::new(&th);
    for i in 0..=900 {
        let t = i as f64;
        let now = 7.0 * GB + 15.0 * GB * noise();
        s.observe(&push(
            t,
            Some(i as u64 * 20),
            None,
            at(now, 22.0 * GB, 34.0 * GB),
        ));
        let a = s.assess().remove(0);
        assert_ne!(a.growth, MemoryGrowth::Leak, "t={t}: {a:?}");
        assert!(a.risk.risk <= RiskLevel::Low, "t={t}: {a:?}");
    }
}

mod verdict;

mod processes;

/// Sequence length ramping (the peaks rise 0.5 GB/s, memory
/// between steps stays put) until it no longer fits. It was held at medium
/// ("a pace over a flat floor may warn, never alarm") until the OOM; now the
/// forecast alarms, named growing demand, not a leak.
#[test]
fn growing_demand_that_will_not_fit_alarms_from_its_forecast() {
    let th = Thresholds::default();
    let ramp = |t: f64| {
        at(
            20.0 * GB,
            30.0 * GB + 0.5 * GB * t,
            31.0 * GB + 0.5 * GB * t,
        )
    };
    // The limit is 79.5 GB: the peaks reach it at t = 99 s.
    let (_, all) = run(95, ramp);
    let first = all
        .iter()
        .position(|a| a.risk.risk >= RiskLevel::High)
        .expect("high before the OOM");
    assert!(99 - first >= 50, "first high at {first} s");
    for a in &all {
        assert!(!a.risk.leak_suspected, "{a:?}");
        assert!(crate::verdict::check(&a.risk, &th, false).is_ok(), "{a:?}");
    }
    let c = all[first].risk.cause.clone().unwrap();
    assert_eq!(c.cause, crate::verdict::Cause::GrowingDemand, "{c:?}");
    assert!(
        all[90].risk.risk == RiskLevel::Critical,
        "{:?}",
        all[90].risk
    );
}

/// 77 GB reserved, 0.3 GB allocated, the cache in split
/// blocks: it sat at risk low with no advice until the OOM (the advice came
/// 1 s after it, with the first retries). A full cache whose free blocks
/// serve the allocations (no split blocks, no retries) is not a risk.
#[test]
fn a_fragmented_cache_that_fills_the_limit_is_high_with_its_advice_before_any_retry() {
    let th = Thresholds::default();
    let fragmented = At {
        split: 40.0 * GB,
        ..at(0.3 * GB, 0.3 * GB, 77.0 * GB)
    };
    let (_, all) = run(20, |_| fragmented);
    let a = all.last().unwrap();
    assert!(a.risk.risk >= RiskLevel::High, "{a:?}");
    assert_eq!(
        a.risk.cause.as_ref().map(|c| c.cause),
        Some(crate::verdict::Cause::Fragmentation)
    );
    assert!(
        a.advice.as_deref().unwrap().contains("expandable_segments"),
        "{a:?}"
    );
    assert!(crate::verdict::check(&a.risk, &th, false).is_ok(), "{a:?}");
    let (_, all) = run(20, |_| at(0.3 * GB, 0.3 * GB, 77.0 * GB));
    let a = all.last().unwrap();
    assert!(a.risk.risk <= RiskLevel::Low && a.advice.is_none(), "{a:?}");
}

/// Before the cache is full (the causes-dev fragmenter on
/// an H200: reserved memory grew 2.4 GB/s, allocated 0.09 GB/s, the agent
/// said medium and "leak" all along): reserved memory climbing toward the
/// limit many times faster than the tensors, most of it holding none, is
/// fragmentation forecast to the moment the next segment no longer fits,
/// high with the expandable_segments advice while the cache still has room.
#[test]
fn a_cache_climbing_past_its_tensors_is_fragmentation_forecast_before_it_fills() {
    let th = Thresholds::default();
    let fragmenter = |t: f64| {
        let allocated = 3.0 * GB + 0.09 * GB * t;
        at(allocated, allocated + 0.5 * GB, 7.0 * GB + 1.2 * GB * t)
    };
    // The limit is 79.5 GB: reserved reaches it at t = 60 s.
    let (_, all) = run(55, fragmenter);
    let first = all
        .iter()
        .position(|a| a.risk.risk >= RiskLevel::High)
        .expect("high before the cache fills");
    assert!(60 - first >= 20, "first high at {first} s");
    let a = &all[first];
    assert_eq!(
        a.risk.cause.as_ref().map(|c| c.cause),
        Some(crate::verdict::Cause::Fragmentation),
        "{a:?}"
    );
    assert!(
        a.advice
            .as_deref()
            .is_some_and(|x| x.contains("expandable_segments")),
        "{a:?}"
    );
    for a in &all {
        assert!(crate::verdict::check(&a.risk, &th, false).is_ok(), "{a:?}");
    }
    // Evaluations with larger batches grow the cache by jumps (4 GB every
    // 4 s for 40 s) over flat tensors, much of it then idle: a cache that
    // holds what it needs, not fragmentation (it rises in one bucket of
    // two, where the fragmenter's rises in every one).
    let (_, all) = run(70, |t| {
        let reserved = 20.0 * GB + 4.0 * GB * (t / 4.0).floor().min(10.0);
        at(8.0 * GB, 10.0 * GB, reserved)
    });
    assert!(all.iter().all(|a| a.risk.risk <= RiskLevel::Low), "{all:?}");
    // A cache that follows its tensors (a leak) is the leak's, not fragmentation.
    let (_, all) = run(55, |t| {
        let allocated = 20.0 * GB + 0.5 * GB * t;
        at(allocated, allocated + 2.0 * GB, allocated + 4.0 * GB)
    });
    assert!(all.iter().all(|a| a
        .risk
        .cause
        .as_ref()
        .is_none_or(|c| c.cause != crate::verdict::Cause::Fragmentation)));
}

/// A cache that climbs by whole segments far apart (8 GB every 8 s from
/// 20 s) over flat tensors, each segment pinned by a block still in use
/// (the free part in split blocks): fragmentation, forecast from the
/// staircase of reserved memory. The smooth climb refuses jumps this far
/// apart; before the staircase was read, the first high came at the
/// ceiling. The same staircase of whole free segments (which the retry at
/// the ceiling releases), or one the steps' peak fills (a larger batch),
/// is not fragmentation.
#[test]
fn a_cache_climbing_by_pinned_segments_far_apart_is_fragmentation_forecast() {
    let reserved = |t: f64| 10.0 * GB + 8.0 * GB * (((t - 20.0) / 8.0).floor() + 1.0).max(0.0);
    let pinned = move |t: f64| At {
        split: reserved(t) - 4.5 * GB,
        ..at(4.0 * GB, 5.0 * GB, reserved(t))
    };
    // The limit is 79.5 GB: the segment due at 84 s no longer fits.
    let (_, all) = run(83, pinned);
    let first = all
        .iter()
        .position(|a| a.risk.risk >= RiskLevel::High)
        .expect("high before the cache fills");
    assert!(84 - first >= 30, "first high at {first} s");
    let fragmentation = |a: &AllocatorAssessment| {
        a.risk.cause.as_ref().map(|c| c.cause) == Some(crate::verdict::Cause::Fragmentation)
    };
    assert!(fragmentation(&all[first]), "{:?}", all[first]);
    assert!(
        all[first].risk.reason.contains("a segment every 8 s"),
        "{:?}",
        all[first]
    );
    let th = Thresholds::default();
    for a in &all {
        assert!(crate::verdict::check(&a.risk, &th, false).is_ok(), "{a:?}");
    }
    let whole = move |t: f64| at(4.0 * GB, 5.0 * GB, reserved(t));
    let (_, all) = run(83, whole);
    assert!(!all.iter().any(fragmentation), "whole free segments");
    // Split blocks between steps, but each step's peak fills the segments.
    let filled = move |t: f64| At {
        split: reserved(t) - 4.5 * GB,
        ..at(4.0 * GB, reserved(t) - 1.0 * GB, reserved(t))
    };
    let (_, all) = run(83, filled);
    assert!(!all.iter().any(fragmentation), "segments the steps fill");
}

/// Another process on the GPU grows 400 MB/s while the
/// trainer's allocator is flat; its limit falls. The allocator alone warned
/// 2 s ahead; the device's memory outside the allocator now forecasts it.
#[test]
fn a_neighbour_filling_the_gpu_is_forecast_from_memory_outside_the_allocator() {
    let th = Thresholds::default();
    let neighbour = |t: f64| At {
        others: 0.4 * GB * t,
        ..at(30.0 * GB, 40.0 * GB, 42.0 * GB)
    };
    // Free memory runs out at t = (80 - 42 - 0.5) / 0.4 = 94 s.
    let (_, all) = run(90, neighbour);
    let first = all
        .iter()
        .position(|a| a.risk.risk >= RiskLevel::High)
        .unwrap_or_else(|| panic!("{:?}", all[80].risk));
    assert!(94 - first >= 30, "first high at {first} s");
    let a = &all[first];
    assert_eq!(
        a.risk.cause.as_ref().map(|c| c.cause),
        Some(crate::verdict::Cause::Neighbour),
        "{a:?}"
    );
    assert!(!a.risk.leak_suspected);
    assert!(all
        .iter()
        .all(|a| crate::verdict::check(&a.risk, &th, false).is_ok()));
}

/// The tensors' pace is allocated memory's, whatever cause made the
/// verdict: over flat tensors, a cache fragmenting at 1.2 GB/s and a
/// neighbour growing 0.4 GB/s are forecast at their own pace, and the
/// allocated growth stays none (it was the forecast's pace, which the
/// tracker read as tensors rising with NVML's leak: `own_leak_sooner`).
#[test]
fn allocated_growth_is_the_tensors_pace_whatever_cause_made_the_verdict() {
    let th = Thresholds::default();
    let fragmenter = |t: f64| at(3.0 * GB, 3.5 * GB, 7.0 * GB + 1.2 * GB * t);
    let neighbour = |t: f64| At {
        others: 0.4 * GB * t,
        ..at(30.0 * GB, 40.0 * GB, 42.0 * GB)
    };
    for (f, cause) in [
        (&fragmenter as &dyn Fn(f64) -> At, Cause::Fragmentation),
        (&neighbour, Cause::Neighbour),
    ] {
        let (_, all) = run(55, f);
        let named = all
            .iter()
            .find(|a| a.risk.cause.as_ref().is_some_and(|c| c.cause == cause))
            .unwrap_or_else(|| panic!("{cause:?}: {:?}", all.last()));
        assert!(named.risk.growth_bytes_per_second > 0.3 * GB, "{named:?}");
        for a in &all {
            let g = a.allocated_growth.unwrap_or(0.0);
            assert!(g <= th.leak_bytes_per_second, "{cause:?}: {a:?}");
            assert!(!a.risk.leak_suspected, "{cause:?}: {a:?}");
        }
    }
}

/// Long sequences make every step long: a push lands mid-step, its
/// allocated bytes anywhere between memory between steps and the step's
/// peak. The peaks rise (growing demand), memory between steps stays put
/// but is caught only now and then: never a leak flag, named growing
/// demand (it was named a leak from the scattered floor).
#[test]
fn growing_demand_caught_mid_step_is_not_a_leak() {
    let th = Thresholds::default();
    let ramp = |t: f64| {
        let peak = 30.0 * GB + 0.3 * GB * t;
        // A fixed scatter: one push in four between steps, the rest mid-step.
        let k = (t as u64 * 7919) % 4;
        let share = [0.0, 0.9, 0.5, 0.75][k as usize];
        at(
            20.0 * GB + share * (peak - 20.0 * GB),
            peak,
            peak + 2.0 * GB,
        )
    };
    let (_, all) = run(90, ramp);
    for a in &all {
        assert!(!a.risk.leak_suspected, "{a:?}");
        assert!(crate::verdict::check(&a.risk, &th, false).is_ok(), "{a:?}");
    }
    let named = all[60].risk.cause.as_ref().map(|c| c.cause);
    assert_eq!(named, Some(crate::verdict::Cause::GrowingDemand));
}

/// A growing demand frees its activations every step, so before it fails
/// the allocator releases the cache's idle segments: the time to OOM
/// counts what the step's peak leaves of the limit in whole segments, not
/// what the cache leaves (8 GB segments; at t = 40 s the peak is 50 GB,
/// reserved 56 GB, the limit 79.5 GB: 48 s, not the 44 s reserved memory's
/// segments would give).
#[test]
fn a_growing_demands_ceiling_counts_the_caches_idle_segments_as_released() {
    let seg = 8.0 * GB;
    let ramp = |t: f64| {
        let peak = 30.0 * GB + 0.5 * GB * t;
        at(20.0 * GB, peak, ((peak + 4.0 * GB) / seg).ceil() * seg)
    };
    let (_, all) = run(40, ramp);
    let a = &all[40].risk;
    let tto = a.time_to_oom_seconds.expect("a forecast");
    assert!((47.0..=49.0).contains(&tto), "{tto} {a:?}");
    assert_eq!(
        a.cause.as_ref().map(|c| c.cause),
        Some(crate::verdict::Cause::GrowingDemand)
    );
}

/// Weights arriving at 1.2 GB/s for 60 s after 20 s of training, no step
/// meanwhile (smooth-b's loadlong): memory kept, peaks and floor rising
/// along a line, as a leak's. With the step count standing still after it
/// moved it is setup: never a leak, never above medium. The same rise while
/// steps run is a leak.
#[test]
fn memory_that_rises_while_no_step_runs_is_setup_not_a_leak() {
    let load = |t: f64| {
        let kept = 2.0 * GB + 1.2 * GB * (t - 20.0).max(0.0);
        at(kept, kept + 0.5 * GB, ((kept + 0.5 * GB) / GB).ceil() * GB)
    };
    let th = Thresholds::default();
    let mut s = AgentState::new(&th);
    let mut setup = vec![];
    for i in 0..=80u64 {
        s.observe(&push(i as f64, Some(2 * i.min(20)), None, load(i as f64)));
        setup.push(s.assess().remove(0));
    }
    for a in &setup {
        assert!(
            !a.risk.leak_suspected && a.growth != MemoryGrowth::Leak,
            "{a:?}"
        );
        assert!(a.risk.risk <= RiskLevel::Medium, "{a:?}");
    }
    let (_, training) = run(80, load);
    assert!(
        training.iter().any(|a| a.risk.leak_suspected),
        "a leak while steps run"
    );
}

/// Weights arriving at 1 GB/s for 70 s after 10 s of training, no step
/// meanwhile, then training again (setup-a's loadlong2): on the user's
/// horizon the floor rose 70 GB along a line, which read as a leak once
/// it spanned a minute, 11 s after the load ended. Memory kept while no
/// step ran is setup on every horizon: the floor counts from the end of
/// the load. A floor that rises as slowly while steps run is still a leak.
#[test]
fn the_floor_on_the_user_s_horizon_counts_from_the_end_of_setup() {
    let load = |t: f64| {
        let kept = 2.0 * GB + 1.0 * GB * (t - 10.0).clamp(0.0, 70.0);
        at(kept, kept + 0.5 * GB, ((kept + 0.5 * GB) / GB).ceil() * GB)
    };
    let th = Thresholds::default();
    let mut s = AgentState::new(&th);
    for i in 0..=120u64 {
        let step = match i {
            0..=10 => 2 * i,
            11..=80 => 20,
            _ => 2 * i - 140,
        };
        s.observe(&push(i as f64, Some(step), None, load(i as f64)));
        let a = s.assess().remove(0);
        assert!(!a.risk.leak_suspected, "at {i}: {a:?}");
    }
    let (_, slow) = run(120, |t| {
        let kept = 2.0 * GB + 0.02 * GB * t;
        at(kept, kept + 0.5 * GB, 48.0 * GB)
    });
    assert!(slow.iter().any(|a| a.risk.leak_suspected), "a slow leak");
}

/// The report's split peak is the highest any push told (each push's peak
/// covers its own interval), and absent while no push told one (an agent
/// that does not read it), never a made-up 0.
#[test]
fn the_reported_split_peak_is_the_highest_any_push_told() {
    let th = Thresholds::default();
    let mut s = AgentState::new(&th);
    s.observe(&push(0.0, Some(1), None, training(0.0)));
    assert_eq!(s.stats().unwrap().peak_inactive_split_bytes, None);
    for (i, split) in [3_000_000_000u64, 1_000_000_000].into_iter().enumerate() {
        let mut p = push(1.0 + i as f64, Some(2 + i as u64), None, training(0.0));
        p.devices[0].peak_inactive_split_bytes = Some(split);
        s.observe(&p);
    }
    s.observe(&push(4.0, Some(5), None, training(0.0)));
    assert_eq!(
        s.stats().unwrap().peak_inactive_split_bytes,
        Some(3_000_000_000)
    );
}
