//! Every trainer process of a pod, as their pushes describe them.
//!
//! One pod often runs several trainer processes that each push: torchrun's
//! ranks (one per GPU, all importing torch, so each starts its own agent),
//! `torch.multiprocessing.spawn`'s workers, or a trainer restarted in the same
//! container. Each gets its own history ([`Process`]), keyed by pid: one
//! history fed by several processes would mix their numbers (a push of rank 1
//! is not the next reading of rank 0's device), and restarting it at every
//! change of pid kept no history at all under torchrun.
//!
//! Which history speaks for a GPU:
//! - a process is **over** once another one started pushing after it last
//!   pushed (with a grace of twice its own push interval, at least 2 s): a
//!   restarted trainer, or the next stage of a pipeline. Over processes
//!   speak for nothing; their memory goes once [`GONE_SECONDS`] pass, and
//!   their OOMs stay counted;
//! - among the processes that are not over, a GPU (by UUID, else by the
//!   process's CUDA ordinal) is spoken for by the process holding the most
//!   allocated memory on it: the rank that trains there, not another rank's
//!   stray context on it.
//!
//! The report's allocator section is one process's: the newest OOM's
//! process if one of the running ones had one (its verdict from before the
//! OOM is what the report must show), else the process of the GPU with the
//! most allocated memory. Its OOM count is every process's.

use super::state::Process;
use super::{AgentDevice, AllocatorAssessment};
use memprof_api::agent::Push;
use memprof_api::thresholds::Thresholds;
use memprof_api::AllocatorStats;

/// Trainer processes followed at once (a pod's ranks and their restarts);
/// the one that pushed least recently makes room for a new one.
pub const MAX_PROCESSES: usize = 2 * memprof_api::agent::MAX_DEVICES;
/// A process that is over is forgotten this long after the newest push, seconds.
pub const GONE_SECONDS: f64 = 60.0;
/// A push this much older than its process's last is a clock stepped back, seconds.
const CLOCK_STEP_SECONDS: f64 = 10.0;
/// The least grace before a process counts as over, seconds.
const MIN_GRACE_SECONDS: f64 = 2.0;

/// One process's history and when it pushed.
#[derive(Clone, Debug)]
struct Followed {
    pid: u32,
    first: f64,
    last: f64,
    /// Seconds between its last two pushes (0 until it pushed twice).
    gap: f64,
    state: Process,
}

impl Followed {
    /// How long after its last push it may still be running.
    fn grace(&self) -> f64 {
        (2.0 * self.gap).max(MIN_GRACE_SECONDS)
    }
}

/// The agent's view of a pod's trainer processes (one history per process).
#[derive(Clone, Debug)]
pub struct AgentState {
    thresholds: Thresholds,
    processes: Vec<Followed>,
    /// OOMs of the processes already forgotten.
    retired_ooms: u64,
}

/// One GPU of the merged view: the process that speaks for it, and which of its devices.
#[derive(Clone, Copy, Debug)]
struct Speaker {
    process: usize,
    device: usize,
}

impl AgentState {
    /// No pushes yet.
    pub fn new(th: &Thresholds) -> Self {
        AgentState {
            thresholds: th.clone(),
            processes: Vec::new(),
            retired_ooms: 0,
        }
    }

    /// Takes one (validated) push into its process's history.
    pub fn observe(&mut self, p: &Push) {
        let at = self.follow(p.pid, p.time);
        let f = &mut self.processes[at];
        if p.time + CLOCK_STEP_SECONDS < f.last {
            // The agent's wall clock stepped back (NTP): every later push
            // would fold into one bucket of the old timeline and freeze its
            // series, so the process's history starts again (its OOMs stay counted).
            self.retired_ooms = self.retired_ooms.saturating_add(f.state.ooms());
            *f = Followed {
                first: p.time,
                last: p.time,
                gap: 0.0,
                state: Process::new(&self.thresholds),
                ..*f
            };
        }
        let f = &mut self.processes[at];
        if p.time > f.last {
            f.gap = p.time - f.last;
            f.last = p.time;
        }
        f.state.observe(p);
        self.forget_gone();
    }

    /// The index of `pid`'s history, started (making room) when new. A
    /// push that names no process (pid 0) is the most recent process's; the
    /// first process to name itself takes over a history of such pushes.
    fn follow(&mut self, pid: u32, t: f64) -> usize {
        if let Some(i) = self.processes.iter().position(|f| f.pid == pid) {
            return i;
        }
        let unnamed = match pid {
            0 => self.most_recent(),
            _ => self.processes.iter().position(|f| f.pid == 0),
        };
        if let Some(i) = unnamed {
            if self.processes[i].pid == 0 {
                self.processes[i].pid = pid;
            }
            return i;
        }
        if self.processes.len() >= MAX_PROCESSES {
            if let Some(i) = self.least_recent() {
                self.retire(i);
            }
        }
        self.processes.push(Followed {
            pid,
            first: t,
            last: t,
            gap: 0.0,
            state: Process::new(&self.thresholds),
        });
        self.processes.len() - 1
    }

    fn most_recent(&self) -> Option<usize> {
        (0..self.processes.len())
            .max_by(|&a, &b| self.processes[a].last.total_cmp(&self.processes[b].last))
    }

    fn least_recent(&self) -> Option<usize> {
        (0..self.processes.len())
            .min_by(|&a, &b| self.processes[a].last.total_cmp(&self.processes[b].last))
    }

    fn retire(&mut self, i: usize) {
        let f = self.processes.remove(i);
        self.retired_ooms = self.retired_ooms.saturating_add(f.state.ooms());
    }

    /// Forgets processes that are over and silent for [`GONE_SECONDS`].
    fn forget_gone(&mut self) {
        let newest = self.newest();
        while let Some(i) = (0..self.processes.len())
            .find(|&i| newest - self.processes[i].last > GONE_SECONDS && self.is_over(i))
        {
            self.retire(i);
        }
    }

    fn newest(&self) -> f64 {
        self.processes
            .iter()
            .map(|f| f.last)
            .fold(f64::NEG_INFINITY, f64::max)
    }

    /// Whether another process started pushing after process `i` stopped.
    fn is_over(&self, i: usize) -> bool {
        let me = &self.processes[i];
        let stopped = me.last + me.grace();
        self.processes
            .iter()
            .enumerate()
            .any(|(j, f)| j != i && f.first > stopped)
    }

    /// The GPUs of the processes still running, each once, with who speaks for it.
    fn speakers(&self) -> Vec<Speaker> {
        let mut out: Vec<Speaker> = Vec::new();
        for (process, f) in self.processes.iter().enumerate() {
            if self.is_over(process) {
                continue;
            }
            for (device, d) in f.state.devices().iter().enumerate() {
                let s = Speaker { process, device };
                let same = d.uuid.as_deref().and_then(|u| {
                    out.iter()
                        .position(|o| self.device(*o).uuid.as_deref() == Some(u))
                });
                match same {
                    None => out.push(s),
                    Some(k) if allocated(d) > allocated(self.device(out[k])) => out[k] = s,
                    Some(_) => {}
                }
            }
        }
        out
    }

    fn device(&self, s: Speaker) -> &AgentDevice {
        &self.processes[s.process].state.devices()[s.device]
    }

    /// The pids of the trainer processes that pushed (0 when one named none).
    pub fn pids(&self) -> Vec<u32> {
        self.processes.iter().map(|p| p.pid).collect()
    }

    /// How many processes are followed now (over ones not yet forgotten included).
    pub fn processes_followed(&self) -> usize {
        self.processes.len()
    }

    /// When the verdict of the reporting process was frozen at an OOM (the agent's clock).
    pub fn frozen_at(&self) -> Option<f64> {
        self.reporting()
            .and_then(|i| self.processes[i].state.frozen_at())
    }

    /// Time of the newest push of any process (the agent's clock), if any.
    pub fn last_push(&self) -> Option<f64> {
        self.processes
            .iter()
            .filter_map(|f| f.state.last_push())
            .reduce(f64::max)
    }

    /// Every GPU the running processes use, once each (see the module's doc).
    pub fn devices(&self) -> Vec<&AgentDevice> {
        self.speakers()
            .into_iter()
            .map(|s| self.device(s))
            .collect()
    }

    /// Assesses every GPU, in the order of [`AgentState::devices`], each by
    /// the process that speaks for it (after its OOM: as it was just before).
    pub fn assess(&self) -> Vec<AllocatorAssessment> {
        // Only the processes that speak for a GPU are assessed, each once.
        let mut by_process: Vec<Option<Vec<AllocatorAssessment>>> =
            vec![None; self.processes.len()];
        self.speakers()
            .into_iter()
            .map(|s| {
                let all = by_process[s.process]
                    .get_or_insert_with(|| self.processes[s.process].state.assess());
                all[s.device].clone()
            })
            .collect()
    }

    /// Training steps per second within the last minute, of the reporting process.
    pub fn steps_per_second(&self) -> Option<f64> {
        self.reporting()
            .and_then(|i| self.processes[i].state.steps_per_second())
    }

    /// The process the report's allocator section is of.
    fn reporting(&self) -> Option<usize> {
        let running = || (0..self.processes.len()).filter(|&i| !self.is_over(i));
        let oomed = running()
            .filter_map(|i| self.processes[i].state.frozen_at().map(|t| (i, t)))
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(i, _)| i);
        oomed.or_else(|| {
            self.speakers()
                .into_iter()
                .max_by_key(|s| allocated(self.device(*s)))
                .map(|s| s.process)
        })
    }

    /// The report's allocator section: the reporting process's device with
    /// the most allocated memory, with its assessment; the OOM count is
    /// every process's.
    pub fn stats(&self) -> Option<AllocatorStats> {
        let f = &self.processes[self.reporting()?];
        let mut stats = f.state.stats(&f.state.assess())?;
        stats.num_ooms = self.ooms();
        Some(stats)
    }

    /// OOMs of every process followed so far.
    fn ooms(&self) -> u64 {
        self.processes
            .iter()
            .map(|f| f.state.ooms())
            .fold(self.retired_ooms, u64::saturating_add)
    }
}

fn allocated(d: &AgentDevice) -> u64 {
    d.last.allocated_bytes
}
