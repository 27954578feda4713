//! `memprof-controller`: what `memprof-operator` runs against the API server.
//! [`pipeline`] is the one controller (watches, work queue, per-Job
//! pipeline); [`status`] the one writer of MemoryProfile status; its two
//! stages' decisions live in [`operator`] (the roll-up of MemoryReports into
//! MemoryProfiles, which reports count, leader election, metrics) and
//! [`remediation`] (OOM records and the RemediationPolicy actions).
//! Depends on `memprof-api`, `memprof-analysis` and `memprof-policy` (what a
//! RemediationPolicy decides; this crate carries it out). Layers, each using only
//! those before it: `key`, `queue` → `operator` → `status` → `remediation`
//! → `pipeline`.
#![forbid(unsafe_code)]

pub mod key;
pub mod operator;
pub mod pipeline;
pub mod queue;
pub mod remediation;
pub mod status;
pub mod workload;
