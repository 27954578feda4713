//! A pod's rank within its workload, and how many ranks the workload has.
//!
//! A rank is the pod's place in the whole workload, numbered as torchrun
//! numbers nodes (`--node-rank`, `GROUP_RANK`): one pod per node, the
//! process of local rank `l` on the node of rank `n` being global rank
//! `n × nproc_per_node + l`. Per kind:
//!
//! - **Job**: the completion index (an Indexed Job), as today.
//! - **JobSet**: replicated jobs in the order of `spec.replicatedJobs`, each
//!   of `replicas` Jobs of `completions` (else `parallelism`, else 1) pods;
//!   the rank of completion index `c` of Job index `j` of replicated job `r`
//!   is (pods of every replicated job before `r`) + `j` × (pods per Job of
//!   `r`) + `c`. With one replicated job of Jobs of one pod each (the
//!   JobSet PyTorch examples' `--node_rank=$(JOB_INDEX)`), or of one Job of
//!   N pods (`--node_rank=$(JOB_COMPLETION_INDEX)`), this is the node rank.
//! - **TrainJob**: its JobSet's.
//! - **PyTorchJob**: the master's index (0), then each worker's index after
//!   the masters, which is the `RANK` the training operator sets.
//!
//! The values come from labels, which are claims; they count only where
//! the creator's identity bound them (docs/security.md "Workloads"): a
//! JobSet child Job's replicated job and index under its workload mark, a
//! PyTorchJob pod's replica type and index under its own. A rank outside
//! the workload's shape (an index past `replicas`, an unknown replicated
//! job) is no rank: the report does not count.

use memprof_api::workload::split_identity;
use serde_json::Value;

/// Most replicated jobs read from a JobSet's spec (its own API allows far
/// fewer in practice; the spec is its creator's, so it is bounded here).
pub const MAX_REPLICATED_JOBS: usize = 64;
/// Most ranks a workload may have (the MemoryProfile's `expectedRanks` bound).
pub const MAX_RANKS: u32 = 1_000_000;

/// Why a workload's spec gives no rank layout.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    /// More replicated jobs than [`MAX_REPLICATED_JOBS`], or none.
    #[error("spec.replicatedJobs has {0} entries; memprof reads 1 to {MAX_REPLICATED_JOBS}")]
    ReplicatedJobs(usize),
    /// A count is not a non-negative integer, or the total passes [`MAX_RANKS`].
    #[error("{0} is not a count memprof can lay ranks out by (at most {MAX_RANKS} ranks in all)")]
    Count(String),
    /// A replicated job has no name, or two share one.
    #[error("spec.replicatedJobs[{0}] has no name, or one another replicated job has")]
    Name(usize),
}

/// How a JobSet's ranks are laid out: per replicated job (in spec order),
/// its name, first rank, Jobs and pods per Job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobSetShape {
    groups: Vec<Group>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Group {
    name: String,
    first: u32,
    replicas: u32,
    per_job: u32,
}

/// A count at `v` (default `default` when absent), within [`MAX_RANKS`].
fn count(v: Option<&Value>, default: u32, what: &str) -> Result<u32, ShapeError> {
    match v {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .filter(|n| *n <= MAX_RANKS)
            .ok_or_else(|| ShapeError::Count(what.into())),
    }
}

impl JobSetShape {
    /// The layout of a JobSet's `spec`.
    pub fn from_spec(spec: &Value) -> Result<JobSetShape, ShapeError> {
        let rjobs = spec.get("replicatedJobs").and_then(Value::as_array);
        let rjobs = rjobs.map_or(&[][..], Vec::as_slice);
        if rjobs.is_empty() || rjobs.len() > MAX_REPLICATED_JOBS {
            return Err(ShapeError::ReplicatedJobs(rjobs.len()));
        }
        let mut groups: Vec<Group> = Vec::with_capacity(rjobs.len());
        let mut next = 0u32;
        for (i, r) in rjobs.iter().enumerate() {
            let name = r
                .get("name")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty());
            let name = name
                .filter(|n| groups.iter().all(|g| g.name != *n))
                .ok_or(ShapeError::Name(i))?;
            let job = r.pointer("/template/spec");
            let replicas = count(r.get("replicas"), 1, "replicas")?;
            let parallelism = count(job.and_then(|j| j.get("parallelism")), 1, "parallelism")?;
            let per_job = count(
                job.and_then(|j| j.get("completions")),
                parallelism,
                "completions",
            )?;
            let pods = replicas
                .checked_mul(per_job)
                .and_then(|p| next.checked_add(p));
            let total = pods
                .filter(|t| *t <= MAX_RANKS)
                .ok_or_else(|| ShapeError::Count("the total".into()))?;
            groups.push(Group {
                name: name.to_string(),
                first: next,
                replicas,
                per_job,
            });
            next = total;
        }
        Ok(JobSetShape { groups })
    }

    /// Ranks of the whole JobSet.
    pub fn ranks(&self) -> u32 {
        self.groups
            .last()
            .map_or(0, |g| g.first + g.replicas * g.per_job)
    }

    /// The rank of completion index `completion` (0 for a Job that is not
    /// Indexed) of the child Job of rank identity `identity`
    /// (`<replicated job>/<job index>`); `None` outside the shape.
    pub fn rank(&self, identity: &str, completion: u32) -> Option<u32> {
        let (rjob, index) = split_identity(identity)?;
        let g = self.groups.iter().find(|g| g.name == rjob)?;
        if index >= g.replicas || completion >= g.per_job {
            return None;
        }
        Some(g.first + index * g.per_job + completion)
    }

    /// The replicated job rank `rank` belongs to (its role in the
    /// recommendation); `None` outside the shape.
    pub fn role(&self, rank: u32) -> Option<&str> {
        let g = self.groups.iter().rev().find(|g| g.first <= rank)?;
        (rank < g.first + g.replicas * g.per_job).then_some(g.name.as_str())
    }
}

/// How a PyTorchJob's ranks are laid out: its masters, then its workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PyTorchShape {
    masters: u32,
    workers: u32,
}

impl PyTorchShape {
    /// The layout of a PyTorchJob's `spec` (`pytorchReplicaSpecs.Master`
    /// and `.Worker`, `replicas` defaulting to 1 where the spec is given).
    pub fn from_spec(spec: &Value) -> Result<PyTorchShape, ShapeError> {
        let specs = spec.get("pytorchReplicaSpecs");
        let replicas = |t: &str| match specs.and_then(|s| s.get(t)) {
            None | Some(Value::Null) => Ok(0),
            Some(s) => count(s.get("replicas"), 1, t),
        };
        let (masters, workers) = (replicas("Master")?, replicas("Worker")?);
        match masters.checked_add(workers) {
            Some(t) if t <= MAX_RANKS => Ok(PyTorchShape { masters, workers }),
            _ => Err(ShapeError::Count("the total".into())),
        }
    }

    /// Ranks of the whole PyTorchJob.
    pub fn ranks(&self) -> u32 {
        self.masters + self.workers
    }

    /// The rank of the pod of rank identity `identity` (`master/<i>` or
    /// `worker/<i>`); `None` outside the shape.
    pub fn rank(&self, identity: &str) -> Option<u32> {
        let (rtype, index) = split_identity(identity)?;
        match rtype {
            "master" if index < self.masters => Some(index),
            "worker" if index < self.workers => Some(self.masters + index),
            _ => None,
        }
    }

    /// The replica type rank `rank` belongs to, as the PyTorchJob's spec
    /// names it (`Master`, `Worker`); `None` outside the shape.
    pub fn role(&self, rank: u32) -> Option<&'static str> {
        match rank {
            r if r < self.masters => Some("Master"),
            r if r < self.ranks() => Some("Worker"),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests;
