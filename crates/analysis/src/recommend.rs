//! Right-sizing from measurement: the GPU memory one rank of each role
//! should request (`status.recommendation`), from what its trainers'
//! allocators measured, and when that value is worth writing again.
//!
//! The peak is the trainer's own need, never NVML's used memory, which
//! counts every process on the GPU, a neighbour's included. Two upper
//! bounds of it come from the caching allocator, and the smaller is taken:
//! its reserved bytes (the highest of the reserved now and the reserved the
//! agent's pushes showed over the run, never below its peak allocated), and
//! its peak allocated plus its peak of inactive split blocks. A capped
//! allocator frees every cached segment that holds no live block and
//! retries before it fails, so what it cannot give back is the live blocks
//! and the free pieces split off beside them: a cache the trainer holds
//! beyond that (a CNN's, 73 % over its allocated peak on the GPU) is not
//! needed (docs/recommend.md, measured). A rank without the agent's numbers
//! has no measured peak and adds none.
//! To it come the memory outside the allocator (the CUDA context, NCCL's
//! buffers for a Job of several ranks; measured on the GPU, see
//! `bench/estimate/calibration.json`) and a margin for what the run did not
//! show: the larger of the spread across ranks (highest peak less the
//! median), the growth of the reserved cache over the later half of each
//! rank's samples (a peak still rising), and a floor. The sum is rounded
//! *up* to a step: never a request below what was measured.
//!
//! "Seen" is what the reports say happened: every measured rank reached
//! [`MIN_STEPS`] training steps (the first steps allocate the optimizer's
//! state and fill the cache), some rank ran a phase named `eval…` or
//! `valid…` (evaluation), some rank announced a checkpoint. Until each
//! phase the Job requires was seen, there is no request, only what is
//! missing. A Job that never evaluates or checkpoints says so with the
//! annotation [`ANNOTATION_RECOMMEND_PHASES`].

use memprof_api::{
    MemoryReportSpec, RecommendationBasis, RoleRecommendation, CHECKPOINT_EVENT,
    MAX_RECOMMENDED_ROLES,
};
use std::collections::BTreeMap;

/// Job annotation: the phases the recommendation waits for, a comma list of
/// `evaluation` and `checkpoint`, or `none` (training steps only).
pub const ANNOTATION_RECOMMEND_PHASES: &str = "memprof.dev/recommend-phases";
/// Training steps every measured rank must have reached.
pub const MIN_STEPS: u64 = 3;
/// Requests are multiples of this (128 MiB): a move within a step is noise.
pub const STEP_BYTES: u64 = 128 << 20;
/// The CUDA context with cuBLAS' workspace, H200, torch 2.11 (calibration.json `contextBytes`).
pub const CONTEXT_BYTES: u64 = 804_061_184;
/// NCCL's buffers outside the allocator (calibration.json `ncclBytes`).
pub const NCCL_BYTES: u64 = 885_063_680;
/// The smallest margin: 64 MiB, or 2 % of the peak when larger.
const MIN_MARGIN_BYTES: u64 = 64 << 20;
const MIN_MARGIN_FRACTION: f64 = 0.02;

/// Which phases must have been seen before a request is given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Phases {
    /// An evaluation phase.
    pub evaluation: bool,
    /// A checkpoint.
    pub checkpoint: bool,
}

impl Default for Phases {
    fn default() -> Self {
        Phases {
            evaluation: true,
            checkpoint: true,
        }
    }
}

/// The recommend-phases annotation could not be read.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "{ANNOTATION_RECOMMEND_PHASES}: unknown phase {0:?}: write a comma list of `evaluation` \
     and `checkpoint`, or `none`; both are required meanwhile"
)]
pub struct PhasesError(pub String);

/// The phases annotation `value` requires (both when absent).
pub fn required_phases(value: Option<&str>) -> Result<Phases, PhasesError> {
    let Some(value) = value else {
        return Ok(Phases::default());
    };
    let mut p = Phases {
        evaluation: false,
        checkpoint: false,
    };
    for word in value.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        match word {
            "evaluation" => p.evaluation = true,
            "checkpoint" => p.checkpoint = true,
            "none" => {}
            other => {
                let mut shown = other.to_string();
                memprof_api::truncate_utf8(&mut shown, 32);
                return Err(PhasesError(shown));
            }
        }
    }
    Ok(p)
}

/// What one rank's report shows for the recommendation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RankEvidence {
    /// The trainer's own peak need, when its agent reports: the smaller of
    /// the reserved peak (at least peak allocated) and, when the agent
    /// tells it, peak allocated + peak inactive split.
    pub peak: Option<u64>,
    /// The peak was bounded by the allocated and split peaks (the agent
    /// told the split peak), not by the reserved peak alone.
    pub held: bool,
    /// Training step reached.
    pub steps: u64,
    /// Growth of the highest reserved over the later half of the samples.
    pub late_growth: u64,
    /// Allocator samples (fragmentation trend points).
    pub samples: u32,
    /// Ran an evaluation phase.
    pub evaluation: bool,
    /// Announced a checkpoint.
    pub checkpoint: bool,
}

fn is_evaluation(phase: &str) -> bool {
    let p = phase.to_ascii_lowercase();
    p.starts_with("eval") || p.starts_with("valid")
}

fn is_checkpoint(phase: &str) -> bool {
    let p = phase.to_ascii_lowercase();
    p.starts_with("checkpoint") || p.starts_with("save")
}

/// A rank's evidence from its report. Bounded by the report: a peak above
/// the largest GPU the report names is cut to it (the trainer writes these
/// numbers through its agent; it cannot ask for more than the card holds).
pub fn evidence(spec: &MemoryReportSpec) -> RankEvidence {
    let Some(a) = spec.allocator.as_ref() else {
        return RankEvidence::default();
    };
    let trend = &a.fragmentation_trend;
    let trend_max = |points: &[memprof_api::FragmentationPoint]| {
        points.iter().map(|p| p.reserved_bytes).max().unwrap_or(0)
    };
    let allocated = a.peak_allocated_bytes.unwrap_or(a.allocated_bytes);
    let reserved = trend_max(trend).max(a.reserved_bytes).max(allocated);
    let held = a
        .peak_inactive_split_bytes
        .map(|split| allocated.saturating_add(split));
    let mut peak = held.map_or(reserved, |h| h.min(reserved));
    if let Some(card) = spec.gpus.iter().map(|g| g.total_bytes).max() {
        peak = peak.min(card);
    }
    let half = trend.len() / 2;
    let late_growth = match half {
        0 => 0,
        _ => trend_max(trend).saturating_sub(trend_max(&trend[..half])),
    };
    let phases = || {
        a.phase_peaks
            .iter()
            .map(|p| p.phase.as_str())
            .chain(a.phase.as_deref())
    };
    let announced = a.events.iter().any(|e| e.name == CHECKPOINT_EVENT);
    RankEvidence {
        peak: (peak > 0).then_some(peak),
        held: held.is_some(),
        steps: a.step.unwrap_or(0),
        late_growth,
        samples: trend.len() as u32,
        evaluation: phases().any(is_evaluation),
        checkpoint: announced || spec.last_checkpoint.is_some() || phases().any(is_checkpoint),
    }
}

/// What the whole Job contributes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JobFacts {
    /// Ranks the Job runs (NCCL's buffers when more than one).
    pub ranks: u32,
    /// Phases the recommendation waits for.
    pub phases: Phases,
}

/// One recommendation per role (at most [`MAX_RECOMMENDED_ROLES`], by
/// name) from each counted rank's role and evidence.
pub fn recommend(ranks: &[(String, RankEvidence)], job: JobFacts) -> Vec<RoleRecommendation> {
    recommend_roles(ranks, job.ranks, |_| job.phases)
}

/// [`recommend`] where each role waits for phases of its own
/// (`phases_of(role)`): a workload's roles are made from different
/// templates (a JobSet's replicated jobs), each with its own annotation.
/// `total_ranks` is the whole workload's (NCCL's buffers when more than one).
pub fn recommend_roles<'a>(
    ranks: impl IntoIterator<Item = &'a (String, RankEvidence)>,
    total_ranks: u32,
    phases_of: impl Fn(&str) -> Phases,
) -> Vec<RoleRecommendation> {
    let mut roles: BTreeMap<&str, Vec<&RankEvidence>> = BTreeMap::new();
    for (role, ev) in ranks {
        roles.entry(role.as_str()).or_default().push(ev);
    }
    roles
        .into_iter()
        .take(MAX_RECOMMENDED_ROLES)
        .map(|(role, evs)| {
            let job = JobFacts {
                ranks: total_ranks,
                phases: phases_of(role),
            };
            for_role(role, &evs, job)
        })
        .collect()
}

fn basis(evs: &[&RankEvidence], phases: Phases) -> RecommendationBasis {
    let measured: Vec<_> = evs.iter().filter(|e| e.peak.is_some()).collect();
    let mut required = vec![];
    if phases.evaluation {
        required.push("evaluation".to_string());
    }
    if phases.checkpoint {
        required.push("checkpoint".to_string());
    }
    RecommendationBasis {
        source: if measured.is_empty() {
            "none"
        } else if measured.iter().all(|e| e.held) {
            "allocatorHeld"
        } else {
            "allocatorReserved"
        }
        .into(),
        ranks: evs.len() as u32,
        ranks_measured: measured.len() as u32,
        steps: measured.iter().map(|e| e.steps).min().unwrap_or(0),
        samples: measured.iter().map(|e| e.samples).sum(),
        evaluation_seen: evs.iter().any(|e| e.evaluation),
        checkpoint_seen: evs.iter().any(|e| e.checkpoint),
        phases_required: required,
    }
}

/// What is missing before a request can be given, in words (empty: nothing).
fn missing(b: &RecommendationBasis, phases: Phases) -> Vec<String> {
    let mut out = vec![];
    if b.ranks_measured == 0 {
        out.push(
            "no rank's trainer reports its allocator (turn the agent on: \
             memprof.dev/agent); NVML's used memory counts every process on the GPU"
                .to_string(),
        );
    } else if b.steps < MIN_STEPS {
        out.push(format!(
            "{} of {MIN_STEPS} training steps on the least advanced rank",
            b.steps
        ));
    }
    if phases.evaluation && !b.evaluation_seen {
        out.push("no evaluation phase yet".into());
    }
    if phases.checkpoint && !b.checkpoint_seen {
        out.push("no checkpoint yet".into());
    }
    out
}

fn for_role(role: &str, evs: &[&RankEvidence], job: JobFacts) -> RoleRecommendation {
    let basis = basis(evs, job.phases);
    let context = CONTEXT_BYTES + if job.ranks > 1 { NCCL_BYTES } else { 0 };
    let mut peaks: Vec<u64> = evs.iter().filter_map(|e| e.peak).collect();
    peaks.sort_unstable();
    let peak = peaks.last().copied();
    let median = peaks.get(peaks.len() / 2).copied().unwrap_or(0);
    let top = peak.unwrap_or(0);
    let floor = MIN_MARGIN_BYTES.max((top as f64 * MIN_MARGIN_FRACTION).ceil() as u64);
    let late = evs.iter().map(|e| e.late_growth).max().unwrap_or(0);
    let margin = floor.max(top - median).max(late);
    let gaps = missing(&basis, job.phases);
    let request = gaps
        .is_empty()
        .then(|| round_up(top.saturating_add(context).saturating_add(margin)));
    let reason = match request {
        Some(_) => format!(
            "peak need {} + context {} + margin {} (spread across ranks {}, late growth {}), rounded up",
            memprof_api::format_bytes(top),
            memprof_api::format_bytes(context),
            memprof_api::format_bytes(margin),
            memprof_api::format_bytes(top - median),
            memprof_api::format_bytes(late),
        ),
        None => format!("not yet: {}", gaps.join("; ")),
    };
    let mut reason = reason;
    memprof_api::truncate_utf8(&mut reason, 512);
    RoleRecommendation {
        role: role.to_string(),
        request_bytes: request,
        peak_bytes: peak,
        context_bytes: context,
        margin_bytes: margin,
        step_bytes: STEP_BYTES,
        basis,
        reason,
    }
}

/// `bytes` rounded up to a multiple of [`STEP_BYTES`].
pub fn round_up(bytes: u64) -> u64 {
    bytes.div_ceil(STEP_BYTES).saturating_mul(STEP_BYTES)
}

/// What is written: `new`, except that a role whose request is unchanged,
/// or fell by at most one step, with the same phases seen, keeps its
/// `previous` recommendation whole (its basis as of when it was written).
/// A rise is written at once (a request below the need is the user's
/// loss); a fall waits until it exceeds a step, so a peak hovering at a
/// step's edge does not write the profile at every report.
pub fn settle(
    previous: &[RoleRecommendation],
    new: Vec<RoleRecommendation>,
) -> Vec<RoleRecommendation> {
    new.into_iter()
        .map(|n| match previous.iter().find(|p| p.role == n.role) {
            Some(p) if holds(p, &n) => p.clone(),
            _ => n,
        })
        .collect()
}

fn holds(prev: &RoleRecommendation, new: &RoleRecommendation) -> bool {
    let stage = |r: &RoleRecommendation| {
        (
            r.basis.evaluation_seen,
            r.basis.checkpoint_seen,
            // The ranks it is of: one written before a rank reported is
            // written again once it has (the status would name too few).
            r.basis.ranks,
            r.basis.ranks_measured,
            r.basis.steps >= MIN_STEPS,
            r.basis.phases_required.clone(),
        )
    };
    if stage(prev) != stage(new) {
        return false;
    }
    match (prev.request_bytes, new.request_bytes) {
        (None, None) => true,
        (Some(p), Some(n)) => n <= p && p - n <= STEP_BYTES,
        _ => false,
    }
}

#[cfg(test)]
mod tests;
