//! `memprof-controller`: what `memprof-operator` runs against the API server,
//! as two folders of one crate: [`operator`] (the roll-up of MemoryReports
//! into MemoryProfiles, Job annotations and Events, the reporters' RBAC,
//! leader election, metrics) and [`remediation`] (OOM records and the
//! RemediationPolicy actions). Depends on `memprof-api` and
//! `memprof-analysis`; `remediation` uses `operator`, never the reverse.
#![forbid(unsafe_code)]

pub mod operator;
pub mod remediation;
