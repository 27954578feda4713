//! `memprof-policy`: what a RemediationPolicy decides, as pure functions
//! over plain values: whether a policy fires for a profile and, if not, why
//! not ([`triggers`]), and the concrete plan it carries out ([`plan`]).
//! No client and no clock: the controller (`memprof-controller`) feeds them
//! what the API server holds and carries the plans out; the CLI
//! (`memprof-cli`) feeds them the same objects to explain a policy without
//! running the controller.
#![forbid(unsafe_code)]

pub mod plan;
pub mod triggers;
