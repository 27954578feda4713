//! A recording through the sidecar's analysis: NVML samples, NVML's
//! per-process usage and the agent's pushes in the order the sidecar got
//! them, one analysis per second of samples, through the same [`Tracker`]
//! the sidecar runs. Per-process usage goes in both modes: the sidecar
//! reads it from NVML whether or not an agent pushes.

use super::recording::{ProcessPoll, ReceivedPoll, Recording, UtilizationPoll};
use crate::tracker::{GpuVerdict, Tracker};
use memprof_api::agent::Push;
use memprof_api::thresholds::Thresholds;
use memprof_api::trace::TraceRow;
use memprof_api::{AllocatorStats, Cause, RiskLevel};

/// With or without the in-process agent's pushes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// NVML samples only (`memprof analyze` on a trace).
    Nvml,
    /// NVML samples and the agent's pushes (the sidecar beside the agent).
    Agent,
}

/// What the pod reported after one analysis (its GPUs rolled up as the
/// report's summary: any leak flag, the worst risk, the smallest TTO).
#[derive(Clone, Debug, PartialEq)]
pub struct Reading {
    /// Analysis time.
    pub t: f64,
    /// Some GPU's published leak flag.
    pub leak: bool,
    /// The worst published risk.
    pub risk: RiskLevel,
    /// The smallest time to OOM.
    pub tto: Option<f64>,
    /// Some GPU was assessed from the allocator.
    pub from_agent: bool,
    /// The cause the worst GPU's verdict named, if any.
    pub cause: Option<Cause>,
    /// The process its evidence names (`pid N holds …`: memory growing
    /// outside the trainer, from NVML's per-process usage).
    pub pid: Option<u32>,
}

/// The pid in a verdict's evidence (`…; pid 4242 holds 31 GiB, …`).
pub fn named_pid(evidence: &str) -> Option<u32> {
    let rest = &evidence[evidence.find("pid ")? + 4..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// The readings of a replay and the state it ended in.
#[derive(Clone, Debug)]
pub struct Replay {
    /// One reading per analysis, oldest first.
    pub readings: Vec<Reading>,
    /// The allocator section the report had at the end (after an OOM: what
    /// the report says about it).
    pub allocator: Option<AllocatorStats>,
}

/// Replays `rec` with the thresholds `th` ([`drive`]) into one reading per
/// analysis, and the allocator section the report had at the end.
pub fn replay(rec: &Recording, th: &Thresholds, mode: Mode) -> Replay {
    let mut readings = Vec::new();
    let tr = drive(rec, th, mode, |t, v| readings.push(reading(t, v)));
    Replay {
        readings,
        allocator: tr.agent().stats(),
    }
}

/// Drives the sidecar's [`Tracker`] through `rec` as the live sidecar met
/// it: samples grouped by time, pushes received and process polls made up
/// to a sample's time applied before it, an analysis once per second of
/// trace time; pushes after the last sample (the final one) are applied,
/// and analysed once, at the end. `each` sees every analysis's time and
/// published verdicts; the tracker is returned as it ended. The one replay
/// loop: the judge and the tests that check every verdict both use it.
pub fn drive(
    rec: &Recording,
    th: &Thresholds,
    mode: Mode,
    each: impl FnMut(f64, &[GpuVerdict]),
) -> Tracker {
    drive_tracker(Tracker::new(th), rec, mode, each)
}

/// [`drive`] with a tracker set up by the caller (the trainer's pids told,
/// as `memprof profile` tells its sidecar the command it started).
pub fn drive_tracker(
    tr: Tracker,
    rec: &Recording,
    mode: Mode,
    each: impl FnMut(f64, &[GpuVerdict]),
) -> Tracker {
    drive_inputs(tr, &Inputs::of(rec, mode), each)
}

/// What a replay feeds the tracker, each list oldest first: a recording's
/// readings ([`Inputs::of`]) or a bare NVML trace's ([`Inputs::trace`],
/// `memprof analyze`), so that every offline view publishes what the
/// sidecar would have.
#[derive(Clone, Copy, Debug)]
pub struct Inputs<'a> {
    /// NVML samples.
    pub rows: &'a [TraceRow],
    /// The agent's pushes with the time the sidecar received them.
    pub pushes: &'a [(f64, Push)],
    /// NVML's per-process usage.
    pub processes: &'a [ProcessPoll],
    /// NVML's utilization.
    pub utilization: &'a [UtilizationPoll],
    /// NVML's PCIe receive throughput.
    pub received: &'a [ReceivedPoll],
    /// The UUID of GPU `uuid_gpu` as the agent named it.
    pub uuid: Option<&'a str>,
    /// The trace's index of that GPU.
    pub uuid_gpu: u32,
}

impl<'a> Inputs<'a> {
    /// A recording's readings; its pushes only with the agent.
    pub fn of(rec: &'a Recording, mode: Mode) -> Self {
        Inputs {
            rows: &rec.rows,
            pushes: match mode {
                Mode::Nvml => &[],
                Mode::Agent => &rec.pushes,
            },
            processes: &rec.processes,
            utilization: &rec.utilization,
            received: &rec.received,
            uuid: rec.uuid.as_deref(),
            uuid_gpu: rec.uuid_gpu,
        }
    }

    /// NVML's samples alone.
    pub fn trace(rows: &'a [TraceRow]) -> Self {
        Inputs {
            rows,
            pushes: &[],
            processes: &[],
            utilization: &[],
            received: &[],
            uuid: None,
            uuid_gpu: 0,
        }
    }
}

/// The replay loop over `inputs` ([`drive`]).
pub fn drive_inputs(
    mut tr: Tracker,
    inputs: &Inputs<'_>,
    mut each: impl FnMut(f64, &[GpuVerdict]),
) -> Tracker {
    let (pushes, rows) = (inputs.pushes, inputs.rows);
    let (mut next_push, mut next_poll, mut next_util, mut next_rx, mut i) = (0, 0, 0, 0, 0);
    let mut next_analysis = f64::NEG_INFINITY;
    while i < rows.len() {
        let t = rows[i].t;
        while next_push < pushes.len() && pushes[next_push].0 <= t {
            tr.push(&pushes[next_push].1);
            next_push += 1;
        }
        i = sample_at(inputs, &mut tr, i, t);
        while next_poll < inputs.processes.len() && inputs.processes[next_poll].t <= t {
            let p = &inputs.processes[next_poll];
            tr.processes(p.t, p.index, &p.list);
            next_poll += 1;
        }
        while next_util < inputs.utilization.len() && inputs.utilization[next_util].t <= t {
            let u = inputs.utilization[next_util];
            tr.utilization(u.t, u.index, u.percent);
            next_util += 1;
        }
        while next_rx < inputs.received.len() && inputs.received[next_rx].t <= t {
            let r = inputs.received[next_rx];
            tr.pcie_received(r.t, r.index, r.bytes_per_second);
            next_rx += 1;
        }
        if t >= next_analysis {
            next_analysis = t + 1.0;
            each(t, tr.analyse(t));
        }
    }
    if next_push < pushes.len() {
        let t = pushes[pushes.len() - 1].0;
        for (_, p) in &pushes[next_push..] {
            tr.push(p);
        }
        each(t, tr.analyse(t));
    }
    tr
}

/// Feeds every row of time `t` from row `i` on; returns the next row.
fn sample_at(inputs: &Inputs<'_>, tr: &mut Tracker, mut i: usize, t: f64) -> usize {
    while i < inputs.rows.len() && inputs.rows[i].t == t {
        let r = &inputs.rows[i];
        let uuid = (r.gpu == inputs.uuid_gpu).then_some(inputs.uuid).flatten();
        tr.sample(t, r.gpu, uuid, r.used_bytes, r.total_bytes);
        i += 1;
    }
    i
}

fn reading(t: f64, v: &[GpuVerdict]) -> Reading {
    let named = v
        .iter()
        .max_by_key(|g| g.assessment.risk)
        .and_then(|g| g.assessment.cause.as_ref());
    Reading {
        cause: named.map(|c| c.cause),
        pid: named.and_then(|c| named_pid(&c.evidence)),
        t,
        leak: v.iter().any(|g| g.assessment.leak_suspected),
        risk: v
            .iter()
            .map(|g| g.assessment.risk)
            .max()
            .unwrap_or_default(),
        // The time to OOM the report shows (the worst GPU's, at medium or
        // above: `memprof_analysis::summarize`), not one it keeps to itself.
        tto: v
            .iter()
            .max_by_key(|g| g.assessment.risk)
            .filter(|g| g.assessment.risk >= RiskLevel::Medium)
            .and_then(|g| g.assessment.time_to_oom_seconds),
        from_agent: v.iter().any(|g| g.from_agent),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Assessment;

    fn verdict(index: u32, risk: RiskLevel, tto: f64) -> GpuVerdict {
        GpuVerdict {
            index,
            agent_only: false,
            assessment: Assessment {
                risk,
                time_to_oom_seconds: Some(tto),
                ..Default::default()
            },
            raw_risk: risk,
            raw_leak: false,
            from_agent: false,
            held: false,
            held_until: None,
            agent_device: None,
        }
    }

    /// The judge scores the time to OOM the report shows: the worst GPU's,
    /// at medium or above, never a low GPU's young trend.
    #[test]
    fn a_reading_takes_the_time_to_oom_the_report_shows() {
        let v = [
            verdict(0, RiskLevel::Low, 20.0),
            verdict(1, RiskLevel::High, 300.0),
        ];
        assert_eq!(reading(0.0, &v).tto, Some(300.0));
        assert_eq!(reading(0.0, &v[..1]).tto, None);
    }
}
