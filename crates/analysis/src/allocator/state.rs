//! The trainer process as its pushes describe it: devices, steps, events,
//! and the verdict kept from before an OOM.
//!
//! After a CUDA OOM the exception unwinds and frees the failing step's
//! tensors: read then, the allocator shows little allocated memory and a
//! large cache, and a leak looks like cache growth or fragmentation (issue
//! 17 item 5: `growth: cache`, fragmentation 0.999 and advice to set
//! `expandable_segments` after a leak's OOM). So an OOM push is taken with
//! the numbers from before the unwinding (its `preOom`, which the agent
//! also puts in its `devices`), the assessment is frozen there, and later
//! pushes of the same process (the final one at exit) change counters,
//! events and host memory, never the verdict. Pushes of other processes
//! (torchrun's other ranks, a restart) are other histories
//! (`processes.rs`).

use super::{
    push_point, recent_rate, AgentDevice, AgentThresholds, AllocatorAssessment, MAX_REPORT_BLOCKS,
    MAX_REPORT_EVENTS, MAX_REPORT_FRAMES,
};
use crate::host::HostState;
use memprof_api::agent::{DeviceStats, Host, Push, PushKind};
use memprof_api::thresholds::Thresholds;
use memprof_api::AllocationSizes;
use memprof_api::{
    truncate_utf8, AgentEvent, AllocatorStats, OomBlock, OomSnapshotSummary, PhasePeak,
};
use std::collections::VecDeque;

/// The agent's view of one trainer process: its devices and the
/// process-wide markers (steps, events, the newest OOM).
#[derive(Clone, Debug)]
pub(super) struct Process {
    thresholds: AgentThresholds,
    devices: Vec<AgentDevice>,
    steps: VecDeque<(f64, u64)>,
    events: VecDeque<AgentEvent>,
    oom: Option<OomSnapshotSummary>,
    step: Option<u64>,
    phase: Option<String>,
    rss: Option<u64>,
    last_push: Option<f64>,
    /// The verdict kept at the newest OOM of this process.
    frozen: Option<Frozen>,
    /// OOM pushes seen, and the highest `numOoms` counter pushed.
    ooms: (u64, u64),
    /// The newest allocation-size reading, as the report shows it, and its device.
    sizes: Option<(u32, AllocationSizes)>,
    /// The host memory of the process and its container.
    host: HostState,
    /// The newest gradient check and tracker growth, as the report carries them.
    gradients: Option<memprof_api::GradientCheck>,
    tracking: Option<memprof_api::TrackedGrowth>,
}

/// The assessment from just before an OOM.
#[derive(Clone, Debug)]
struct Frozen {
    at: f64,
    assessments: Vec<AllocatorAssessment>,
}

impl Process {
    /// No pushes yet.
    pub(super) fn new(th: &Thresholds) -> Self {
        Process {
            thresholds: AgentThresholds::from(th),
            devices: Vec::new(),
            steps: VecDeque::new(),
            events: VecDeque::new(),
            oom: None,
            step: None,
            phase: None,
            rss: None,
            last_push: None,
            frozen: None,
            ooms: (0, 0),
            sizes: None,
            host: HostState::new(th),
            gradients: None,
            tracking: None,
        }
    }

    /// Takes one (validated) push of this process.
    pub(super) fn observe(&mut self, p: &Push) {
        self.last_push = Some(p.time);
        self.rss = p
            .host
            .as_ref()
            .and_then(|h| h.rss_bytes)
            .or(p.rss_bytes)
            .or(self.rss);
        for d in &p.devices {
            self.ooms.1 = self.ooms.1.max(d.num_ooms);
        }
        self.observe_events(p);
        self.observe_host(p);
        // Neither is what an OOM's unwinding changes.
        if let Some(g) = &p.grads {
            self.gradients = Some(super::carried::gradients(g));
        }
        if let Some(t) = &p.tracking {
            self.tracking = Some(super::carried::tracking(t));
        }
        if self.frozen.is_some() {
            // The process after its OOM: the verdict stays the one from before.
            return;
        }
        self.step = p.step;
        self.phase.clone_from(&p.phase);
        if let Some(step) = p.step {
            push_point(&mut self.steps, (p.time, step));
        }
        self.observe_sizes(p);
        let (t, devices): (f64, &[DeviceStats]) = match (&p.pre_oom, p.kind) {
            (Some(pre), PushKind::Oom) => (pre.time, &pre.devices),
            _ => (p.time, &p.devices),
        };
        for d in devices {
            self.observe_device(t, (p.phase.as_deref(), p.step), d);
        }
        if let Some(oom) = &p.oom {
            self.ooms.0 += 1;
            self.oom = Some(oom_summary(p.time, oom));
            let assessments = self.assess();
            self.frozen = Some(Frozen { at: t, assessments });
        }
    }

    fn observe_device(&mut self, t: f64, at_step: (Option<&str>, Option<u64>), d: &DeviceStats) {
        let at = match self.devices.iter().position(|x| x.index == d.index) {
            Some(i) => i,
            None if self.devices.len() < memprof_api::agent::MAX_DEVICES => {
                self.devices
                    .push(AgentDevice::new(d.index, &self.thresholds));
                self.devices.len() - 1
            }
            None => return,
        };
        self.devices[at].observe(t, at_step, d, &self.thresholds);
    }

    /// Host memory is not what a CUDA OOM frees: read before and after it.
    fn observe_host(&mut self, p: &Push) {
        let host = p.host.clone().or_else(|| {
            p.rss_bytes.map(|rss| Host {
                rss_bytes: Some(rss),
                ..Default::default()
            })
        });
        if let Some(h) = host {
            self.host.observe(p.time, &h);
        }
    }

    /// A `sizes` reading, once per reading (pushes repeat the latest).
    fn observe_sizes(&mut self, p: &Push) {
        let Some(s) = &p.sizes else { return };
        let time = s.at.map(rfc3339);
        if self
            .sizes
            .as_ref()
            .is_some_and(|(_, r)| r.time == time && time.is_some())
        {
            return;
        }
        let device = s.device.unwrap_or(0);
        self.sizes = Some((device, super::fragment::report(s, time)));
    }

    fn observe_events(&mut self, p: &Push) {
        for e in &p.events {
            self.events.push_back(AgentEvent {
                time: rfc3339(e.t),
                name: e.name.clone(),
                note: e.note.clone(),
                step: e.step,
                allocated_bytes: e.allocated_bytes,
            });
            while self.events.len() > MAX_REPORT_EVENTS {
                self.events.pop_front();
            }
        }
    }

    /// OOMs of this process: its OOM pushes, or its allocator's counter if higher.
    pub(super) fn ooms(&self) -> u64 {
        self.ooms.1.max(self.ooms.0)
    }

    /// When the verdict was frozen at an OOM (the agent's clock), if it was.
    pub(super) fn frozen_at(&self) -> Option<f64> {
        self.frozen.as_ref().map(|f| f.at)
    }

    /// Time of the newest push (the agent's clock), if any.
    pub(super) fn last_push(&self) -> Option<f64> {
        self.last_push
    }

    /// The devices seen, in the order first seen.
    pub(super) fn devices(&self) -> &[AgentDevice] {
        &self.devices
    }

    /// The allocation-size pattern of `device`, when the newest reading is of it.
    fn sizes_of(&self, device: u32) -> Option<&AllocationSizes> {
        self.sizes
            .as_ref()
            .filter(|(d, _)| *d == device)
            .map(|(_, s)| s)
    }

    /// Assesses every device, in the order of [`AgentState::devices`]
    /// (after an OOM: as they were just before it).
    pub(super) fn assess(&self) -> Vec<AllocatorAssessment> {
        if let Some(f) = &self.frozen {
            return f.assessments.clone();
        }
        self.devices
            .iter()
            .map(|d| d.assess(&self.thresholds, self.sizes_of(d.index)))
            .collect()
    }

    /// Training steps per second within the last minute.
    pub(super) fn steps_per_second(&self) -> Option<f64> {
        recent_rate(&self.steps)
    }

    /// The report's allocator section: the device with the most allocated
    /// memory, with its assessment.
    pub(super) fn stats(&self, assessments: &[AllocatorAssessment]) -> Option<AllocatorStats> {
        let (dev, a) = self
            .devices
            .iter()
            .zip(assessments)
            .max_by_key(|(d, _)| d.last.allocated_bytes)?;
        let d = &dev.last;
        let limit = d.free_bytes.map(|f| f.saturating_add(d.reserved_bytes));
        let mut phase_peaks: Vec<PhasePeak> = dev
            .phases
            .iter()
            .map(|(name, s)| PhasePeak {
                phase: name.clone(),
                allocated_bytes: s.peak(),
            })
            .collect();
        phase_peaks.sort_by_key(|p| std::cmp::Reverse(p.allocated_bytes));
        Some(AllocatorStats {
            allocated_bytes: d.allocated_bytes,
            reserved_bytes: d.reserved_bytes,
            active_bytes: d.active_bytes,
            inactive_split_bytes: d.inactive_split_bytes,
            alloc_retries: d.alloc_retries,
            // An OOM push counts even when the observer read the counter
            // before the allocator raised it.
            num_ooms: self.ooms.1.max(self.ooms.0),
            step: self.step,
            phase: self.phase.clone(),
            device: Some(dev.index),
            peak_allocated_bytes: Some(dev.peak_allocated),
            peak_inactive_split_bytes: dev.peak_inactive_split,
            limit_bytes: limit,
            growth: a.growth,
            allocated_growth_bytes_per_second: a.allocated_growth.filter(|g| g.is_finite()),
            reserved_growth_bytes_per_second: a.reserved_growth.filter(|g| g.is_finite()),
            fragmentation: a.fragmentation,
            inactive_split_fraction: a.split_fraction,
            recent_alloc_retries: a.recent_retries,
            advice: a.advice.clone(),
            steps_per_second: self.steps_per_second().filter(|s| s.is_finite()),
            phase_peaks,
            rss_bytes: self.rss,
            events: self.events.iter().cloned().collect(),
            oom: self.oom.clone(),
            verdict_before_oom: self.frozen.as_ref().map(|f| rfc3339(f.at)),
            fragmentation_trend: dev.fragmentation_trend().to_vec(),
            allocation_sizes: self.sizes.as_ref().map(|(_, s)| s.clone()),
            host: self.host.report(),
            gradients: self.gradients.clone(),
            tracking: self.tracking.clone(),
        })
    }
}

use memprof_api::rfc3339;

/// The report's bounded view of an OOM snapshot.
fn oom_summary(t: f64, o: &memprof_api::agent::OomSnapshot) -> OomSnapshotSummary {
    let mut message = o.message.clone();
    truncate_utf8(&mut message, 512);
    OomSnapshotSummary {
        time: rfc3339(t),
        device: o.device,
        requested_bytes: o.requested_bytes,
        message,
        source: o.source.as_str().into(),
        blocks: o
            .blocks
            .iter()
            .take(MAX_REPORT_BLOCKS)
            .map(|b| OomBlock {
                size_bytes: b.size_bytes,
                count: b.count,
                frames: b
                    .frames
                    .iter()
                    .take(MAX_REPORT_FRAMES)
                    .map(|f| {
                        let mut s = format!("{}:{} {}", f.filename, f.line, f.name);
                        truncate_utf8(&mut s, 256);
                        s
                    })
                    .collect(),
            })
            .collect(),
    }
}
