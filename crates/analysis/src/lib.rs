//! Pure analysis of GPU memory over time, shared by the sidecar, the operator
//! and the CLI. Nothing here does I/O or reads a clock: time comes in with the
//! samples, so every behaviour is unit-tested on plain values without sleeping.
//!
//! Training memory is periodic (activations rise in forward, fall in backward)
//! and PyTorch's caching allocator keeps what it reserved, so NVML sees a
//! staircase. Trends are therefore fitted to envelopes, not raw samples: the
//! samples are bucketed (default 10 s), the upper envelope (bucket maxima)
//! predicts OOM, the lower envelope (bucket minima) reveals a leak.
//!
//! `memprof-analysis` depends only on `memprof-api`.
#![forbid(unsafe_code)]

pub mod allocator;
mod allocator_rollup;
pub mod batchfit;
pub mod breakdown;
pub mod busy;
pub mod evaluate;
mod fit;
pub mod host;
pub mod hysteresis;
pub mod memmodel;
pub mod memsearch;
pub mod recommend;
mod risk;
mod rollup;
mod series;
pub mod staircase;
pub mod tracker;
pub mod verdict;

pub use fit::{least_squares_slope, theil_sen, LinearFit};
pub use risk::{assess, Assessment};
pub use rollup::{critical_rank_sites, sites_section, summarize, worst_gpu, worst_rank_sites};
pub use rollup::{
    report_limit, rollup, validate_report, InvalidReport, JobRollup, ReportMeta, RollupInput,
    RollupLimits, MAX_STALE_LISTED,
};
pub use series::{GpuSeries, Sample};
