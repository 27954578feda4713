//! What the cluster benchmarks share (`operator_scale`, `operator_memory`,
//! `api_write_loop`, `remediation_latency`): the set-up before anything is
//! timed (`setup`), the load of MemoryReports (`load`) and what is measured
//! (`measure`). Not an example itself: Cargo builds only `examples/*.rs`
//! and `examples/*/main.rs`, and each benchmark mounts this folder with
//! `mod scale_support;`, as the tests mount `tests/*_support/`.

pub mod ab;
pub mod jobset;
pub mod load;
pub mod measure;
pub mod pytorchjob;
pub mod setup;
