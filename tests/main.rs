//! The integration tests: one test binary, each former test file a module.
//!
//! One binary links the workspace once instead of once per file, and shares
//! its set-up (the CRDs are installed once per run, see
//! `common::cluster`). Run everything, or one module by its path:
//!
//!     eval "$(bash hack/local-cluster.sh env)"
//!     MEMPROF_REQUIRE_CLUSTER=1 cargo test --test integration
//!     MEMPROF_REQUIRE_CLUSTER=1 cargo test --test integration operator::
//!
//! Without `KUBECONFIG` the cluster tests are skipped with a message.
//! Tests of different modules run side by side: a test that must not
//! overlap any other cluster test (an operator that watches every
//! namespace) holds `common::alone`. The fault tests that start control
//! planes of their own are `#[ignore]`d and run after the rest, one at a
//! time (`-- --ignored --test-threads=1`, as hack/test.sh does).
//!
//! Every `tests/*.rs` file is a module here (or, until it is moved in, a
//! `[[test]]` of its own in Cargo.toml): Cargo.toml sets `autotests = false`,
//! so a file named in neither place would never be built
//! (`every_test_file_is_built` fails instead).

// Support shared by the modules below.
mod agent_common;
mod cli_support;
mod common;
mod faults_support;
mod remediation_support;
mod sidecar_support;
mod tenant_support;
mod webhook_support;
mod workload_support;

mod admission_history;
mod admission_history_workloads;
mod agent_breakdown;
mod agent_injection;
mod agent_rollup;
mod batch_fit;
mod breakdown;
mod cli;
mod cli_doctor;
mod cli_first_hour;
mod cli_local;
mod cli_local_rollup;
mod cli_printing;
mod cli_seed_gaps;
mod crds;
mod estimate;
mod estimate_points;
mod faults;
mod gpu_oom_visibility;
mod notify_end_to_end;
mod operator;
mod pod_trust;
mod profile_writes;
mod pytorchjobs;
mod recommend;
mod recommend_remediation;
mod remediation;
mod remediation_accumulation;
mod remediation_checkpoint;
mod remediation_namespaces;
mod remediation_notify;
mod remediation_trust;
mod security;
mod sidecar_directives;
mod sidecar_kube;
mod single_writer;
mod status_write;
mod sweep;
mod thresholds;
mod trainjobs;
mod webhook;
mod workload_checkpoint;
mod workload_gpu_request;
mod workload_namesakes;
mod workload_oom;
mod workload_ownerless;
mod workload_recommend;
mod workload_remediation;
mod workload_remediation_pytorch;
mod workload_remediation_twins;
mod workload_thresholds;
mod workload_trust;
mod workload_twins_more;
mod workload_twins_pytorch;
mod workload_twins_recreate;
mod workload_twins_restart;
mod workload_twins_trust;
mod workloads;

/// A test file that is neither declared above nor a `[[test]]` of its own is
/// not compiled at all (no automatic test targets): it fails here instead of
/// passing unseen.
#[test]
fn every_test_file_is_built() {
    let root = env!("CARGO_MANIFEST_DIR");
    let modules = include_str!("main.rs");
    let manifest = std::fs::read_to_string(format!("{root}/Cargo.toml")).expect("Cargo.toml");
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(format!("{root}/tests")).expect("tests/ is readable") {
        let path = entry.expect("a directory entry").path();
        let Some(name) = path.file_name().and_then(|s| s.to_str()) else {
            continue;
        };
        let Some(stem) = name.strip_suffix(".rs").filter(|s| *s != "main") else {
            continue;
        };
        let module = modules.contains(&format!("\nmod {stem};\n"));
        let target = manifest.contains(&format!("path = \"tests/{name}\""));
        if !module && !target {
            missing.push(name.to_string());
        }
    }
    assert!(
        missing.is_empty(),
        "tests/ files built by no test target: {missing:?}; add `mod NAME;` to \
         tests/main.rs (and make the file's `mod common;` a `use crate::common;`)"
    );
}
