//! The one writer of every MemoryProfile status (and of the `memprof.dev/*`
//! annotations on Jobs): who writes which field, and how.
//!
//! | status field | decided by | handed over as |
//! |---|---|---|
//! | `ranksReporting`, `ranksExpected`, `ranks`, `gpuCount`, `peak*`, `current*`, `risk`, `confidence`, `timeToOom*`, `leak*`, `fragmentation`, `allocator`, `breakdown`, `imbalance*`, `bottleneck`, `topRanks`, `allocationSites` (the worst rank's, `memprof_analysis::worst_rank_sites`), `criticalAllocationSites`, `criticalRanksWithSitesOmitted` (every rank's taken at critical, `memprof_analysis::critical_rank_sites`), `lastReportTime`, `oldestReportTime`, `ranksStale`, `staleRanks`, `riskHeldUntil` | the roll-up stage (one `JobRollup` per Job, `pipeline/rollups.rs`) (`pipeline/rollup_stage.rs`, from `memprof_analysis` and `operator/reconcile.rs`) | [`StatusWriter::submit`]: the latest [`Analysis`] replaces the one before |
//! | `conditions` (`Ready`, `ReportsValid`, `ReportsCounted`, `RanksStale`), `thresholds`, `batchRecommendation` | the roll-up stage | the same [`Analysis`] |
//! | `recommendation` | the roll-up stage (`operator/reconcile/recommend.rs`, from `memprof_analysis::recommend`), kept as the server holds it unless it moves by a rounding step ([`compose`]) | the same [`Analysis`] |
//! | `ooms`, `oomCount`, `remediations`, `remediationTotals`, `lastAction` | the remediation stage (`pipeline/remediation_stage.rs`, `remediation/recording.rs`, `remediation/execute.rs`); `oomCount` grows in the edit that adds to `ooms`, and only that edit's task publishes the OOM's `GPUOutOfMemory` Event | [`StatusWriter::edit`]: a change applied to the newest status, answered once it is written |
//! | Job annotations `memprof.dev/{oom-risk,time-to-oom,imbalance,bottleneck,gpu-oom}` | the roll-up stage (`operator/reconcile/annotations.rs`; `gpu-oom` from the Job's newest record in `ooms`) | [`StatusWriter::annotate`]: the whole set, applied after the status |
//! | the same annotations (but `gpu-oom`) and the risk and `InvalidThresholds` Events of a JobSet's, TrainJob's or PyTorchJob's profile, on that top-level object | the workload's pipeline (`pipeline/workloads.rs`, `pipeline/pytorchjobs.rs`), through [`submit_workload`] (`workload.rs`) | [`StatusWriter::annotate_object`] and the [`Analysis`]'s notices |
//!
//! Every write is made here, by [`StatusWriter::run`]'s workers
//! (`--concurrency` of them, 16 by default), field manager `memprof-operator`, carrying the
//! resourceVersion it was composed on, so a write never undoes one it did
//! not see (409: read the profile again, compose again, retry). How the
//! status travels is `--status-write` (`patch.rs`): `apply` (the default)
//! sends one server-side apply of the whole status; `merge` sends a JSON
//! merge patch of the fields that differ from the status it was composed on
//! (removed ones as `null`), taken against exactly what the server holds at
//! that resourceVersion (the watch's copy keeps a profile's status whole,
//! `pipeline/slim.rs`), so the server ends with the composed status either
//! way. The default stays `apply`: measured side by side, the API server
//! here passed as many of one as of the other (~100/s, its CPU the bound).
//! 16 workers, not 8: with 8 the writer's rate was 8 ÷ the round trip
//! (53 writes/s) while the API server took 91/s from 16, and the report →
//! status p99 fell from 3.8 to 2.5 s (docs/benchmarks.md, the A/B).
//! The MemoryProfile's spec, labels and owner reference are applied by the
//! roll-up stage when the profile is created or drifted; a MemoryReport's
//! only writer is its sidecar.
//!
//! How writes are scheduled (linkerd2's policy-controller status index is
//! the model): only the latest desired status per Job is kept; Jobs are
//! served first in, first out; a Job's writes are at least
//! `--min-write-interval-ms` apart (1 s by default), whatever the load; a
//! change of cosmetic fields alone (`lastReportTime` and the others named in
//! `operator/reconcile/write.rs`) is written at most every 30 s; nothing
//! here is awaited by a reconcile, so a slow API server never holds one up.
//! Remediation awaits its edits in its own task, which is how "recorded
//! durably before acting" holds (docs/remediation.md).

mod advice;
mod compose;
mod patch;
mod refusals;
mod workload;
mod writer;

pub use advice::advice;
pub use compose::{compose, write_needed, Need, COSMETIC_INTERVAL};
pub use patch::{merge_diff, WriteMode};
pub use refusals::announce_refused;
pub use workload::{annotate_workload, object_reference, submit_workload, workload_notices};
pub use writer::{Notice, StatusWriter, WriteError, WriterOptions};

use memprof_api::MemoryProfileStatus;

/// What the roll-up wants the status to be, with the Events that announce
/// it (published once a status that includes it is written).
#[derive(Clone, Debug, Default)]
pub struct Analysis {
    /// The status; its remediation fields are ignored (the recorded ones are kept).
    pub status: MemoryProfileStatus,
    /// Events to publish after the write.
    pub notices: Vec<Notice>,
}
