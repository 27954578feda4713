//! Workloads: what one MemoryProfile is about when it is more than a Job.
//! Pure: the I/O that reads each object from the API server is the
//! caller's, so every rule here is tested on plain values.
//!
//! - `resolve.rs`: the top-level workload of a pod's controller, following
//!   *controller* owner references through objects read from the API
//!   server, each link proven by its workload mark, at most
//!   [`memprof_api::workload::MAX_CHAIN`] links.
//! - `read.rs`: the same steps, each object read from the API server.
//! - `pods.rs`: whether a pod is its PyTorchJob's own, and its rank labels.
//! - `rank.rs`: a pod's rank within its workload, from the rank labels its
//!   creator set (bound by the marks), consistent with torchrun's node rank.
//! - `rollup.rs`: one roll-up over every rank of the workload.
//! - `claim.rs`: whose a profile is when workloads of different kinds (or
//!   uids) share its name: the one it already names as owner.
//! - `action.rs`: how a workload's environment is changed, the least
//!   disruptive way its kind allows; `suspend.rs` carries out the suspend,
//!   patch and resume on the API server.

pub mod action;
pub mod claim;
pub mod pods;
pub mod rank;
pub mod read;
pub mod resolve;
pub mod rollup;
pub mod suspend;

pub use memprof_api::workload::WorkloadKind;
