//! A MemoryProfile whose workload and reports did not change is not
//! written again, whatever labels the workload carries: the labels each
//! profile copies from its workload (`team`, …: a Job's, a JobSet's, a
//! PyTorchJob's) and its family.
//! The API server is not memprof's: a profile applied again on every
//! reconcile is a write (and two RBAC applies beside it) per report a
//! sidecar writes. Counted on the wire (`profile_writes/wire.rs`), over
//! reconciles that change nothing memprof reads: the workload annotated
//! with a key memprof does not read, as a tenant's `kubectl annotate`,
//! once the profile's first complete write is seen (labels and status);
//! and a profile is made with one write, its create, never applied again
//! after it (`made_once`).
//!
//!     eval "$(bash hack/local-cluster.sh env)"
//!     MEMPROF_REQUIRE_CLUSTER=1 cargo test --test integration profile_writes::

mod wire;

use crate::common::{self, eventually, RunningOperator, TestNamespace};
use crate::workload_support::{self, api, create, marked_child};
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Client;
use memprof::api::workload::WorkloadKind;
use memprof::api::MemoryProfile;
use serde_json::json;
use wire::Wire;

const FAMILY: &str = "llama-8b";
/// Reconciles that change nothing, per test.
const TOUCHES: u32 = 3;

/// The labels a tenant gives its workload (`memprof.dev/managed` as the
/// webhook stamps a profiled one).
fn tenant_labels() -> serde_json::Value {
    json!({"team": "ml", "app.kubernetes.io/part-of": "llm", "memprof.dev/managed": "true"})
}

/// What each profile copies of [`tenant_labels`], with its workload's family.
const COPIED: [(&str, &str); 3] = [
    ("team", "ml"),
    ("app.kubernetes.io/part-of", "llm"),
    ("memprof.dev/family", FAMILY),
];

fn profiled() -> serde_json::Value {
    json!({"memprof.dev/enabled": "true", "memprof.dev/family": FAMILY})
}

/// Paths of what the operator writes for a profile in `ns`: the profile
/// (and its status) and the sidecars' leave to write reports.
fn profile_paths(ns: &str) -> Vec<String> {
    vec![
        format!("/apis/memprof.dev/v1alpha1/namespaces/{ns}/memoryprofiles"),
        format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles"),
        format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings"),
    ]
}

/// Waits for profile `name`'s first complete write: made, carrying each
/// of `labels`, and its first status written (the status writer's own
/// task writes it after the reconcile that made the profile). Counting
/// starts after that positive signal, not after a guess at how long it takes.
async fn labelled(client: &Client, ns: &str, name: &str, labels: &[(&str, &str)]) {
    let profiles: Api<MemoryProfile> = Api::namespaced(client.clone(), ns);
    eventually(
        &format!("profile {name} labelled {labels:?}, with a status"),
        || async {
            let p = profiles.get_opt(name).await.map_err(|e| e.to_string())?;
            let p = p.ok_or("no profile yet")?;
            let have = p.metadata.labels.unwrap_or_default();
            let all = labels
                .iter()
                .all(|(k, v)| have.get(*k).map(String::as_str) == Some(*v));
            if !all {
                return Err(format!("labels {have:?}"));
            }
            p.status.map(|_| ()).ok_or("no status yet".to_string())
        },
    )
    .await;
}

/// Checks that profile `name` was written once over the whole test: its
/// create, never an apply after it. A profile just made, whose create the
/// API server records as an `Update`, looked unlabelled to the operator's
/// cache, and the next reconcile applied it again (with its RBAC), at
/// whatever time that reconcile came: for a JobSet, one of its child
/// Jobs' after the cache held the profile, which under load fell among
/// the counted touches.
fn made_once(wire: &Wire, ns: &str, name: &str) {
    let profiles = format!("/apis/memprof.dev/v1alpha1/namespaces/{ns}/memoryprofiles");
    let own = [
        format!("POST {profiles}"),
        format!("PATCH {profiles}/{name}"),
    ];
    let writes: Vec<String> = wire
        .writes(std::slice::from_ref(&profiles))
        .into_iter()
        .filter(|w| own.contains(w))
        .collect();
    assert_eq!(
        writes,
        [own[0].clone()],
        "profile {name}: made, never applied again"
    );
}

/// Annotates `name` (a `kind`) with a key memprof does not read and waits
/// until the operator has started a reconcile since; `n` makes each
/// annotation a change the watch reports.
async fn touch(
    client: &Client,
    ns: &str,
    kind: WorkloadKind,
    name: &str,
    n: u32,
    op: &RunningOperator,
) {
    let seen = op.metrics.reconciles.get();
    let patch = json!({"metadata": {"annotations": {"example.com/touched": n.to_string()}}});
    api(client, ns, kind)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("annotate {name}: {e}"));
    eventually(
        &format!("a reconcile after touch {n} of {name}"),
        || async {
            let now = op.metrics.reconciles.get();
            (now > seen)
                .then_some(())
                .ok_or(format!("{now} reconciles"))
        },
    )
    .await;
}

/// Touches `name` [`TOUCHES`] times (through `client`, the test's own:
/// not on the wire) and checks that none of it had the operator write the
/// profile or its RBAC. A first touch settles what the profile's first
/// apply set off; a last one starts a reconcile after the counted ones,
/// so theirs have ended (a key is reconciled by one worker at a time).
async fn no_writes_over_touches(
    (client, wire, op): (&Client, &Wire, &RunningOperator),
    ns: &str,
    kind: WorkloadKind,
    name: &str,
) {
    touch(client, ns, kind, name, 0, op).await;
    touch(client, ns, kind, name, 1, op).await;
    let before = wire.writes(&profile_paths(ns));
    for n in 2..2 + TOUCHES {
        touch(client, ns, kind, name, n, op).await;
    }
    touch(client, ns, kind, name, 2 + TOUCHES, op).await;
    let after = wire.writes(&profile_paths(ns));
    assert_eq!(
        after[before.len()..],
        [] as [String; 0],
        "{TOUCHES} reconciles with nothing changed wrote the profile or its RBAC again \
         ({} writes before them)",
        before.len()
    );
}

#[tokio::test]
async fn a_labelled_jobs_profile_is_not_written_again_when_nothing_changed() {
    let Some(client) = common::cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&client).await;
    let wire = Wire::start(&client, &ns.name).await;
    let op = common::start_operator(&wire.client, &ns.name);
    let job: Job = serde_json::from_value(json!({
        "metadata": {"name": "train", "labels": tenant_labels(), "annotations": profiled()},
        "spec": {"parallelism": 1, "completions": 1, "template": {
            "metadata": {"labels": {"memprof.dev/managed": "true"}},
            "spec": {"restartPolicy": "Never",
                     "containers": [{"name": "trainer", "image": "busybox"}]}}}
    }))
    .unwrap();
    Api::<Job>::namespaced(client.clone(), &ns.name)
        .create(&PostParams::default(), &job)
        .await
        .unwrap();
    labelled(&client, &ns.name, "train", &COPIED).await;
    no_writes_over_touches((&client, &wire, &op), &ns.name, WorkloadKind::Job, "train").await;
    made_once(&wire, &ns.name, "train");
    op.stop().await;
}

#[tokio::test]
async fn a_jobsets_profile_with_its_labels_is_not_written_again_when_nothing_changed() {
    let Some((client, ns)) = workload_support::workload_cluster().await else {
        return;
    };
    let wire = Wire::start(&client, &ns.name).await;
    let op = common::start_operator(&wire.client, &ns.name);
    let mut js = workload_support::jobset("js", 1, tenant_labels());
    js["metadata"]["annotations"] = profiled();
    let js = create(&client, &ns.name, WorkloadKind::JobSet, js).await;
    let child = marked_child(&client, &ns.name, &js, 0).await;
    let child = child.metadata.name.unwrap();
    labelled(&client, &ns.name, "js", &COPIED).await;
    no_writes_over_touches((&client, &wire, &op), &ns.name, WorkloadKind::Job, &child).await;
    made_once(&wire, &ns.name, "js");
    op.stop().await;
}

#[tokio::test]
async fn a_pytorchjobs_profile_with_its_labels_is_not_written_again_when_nothing_changed() {
    let Some((client, ns)) = workload_support::workload_cluster().await else {
        return;
    };
    let wire = Wire::start(&client, &ns.name).await;
    let op = common::start_operator(&wire.client, &ns.name);
    let mut pt = workload_support::pytorchjob("pt", 1, tenant_labels());
    pt["metadata"]["annotations"] = profiled();
    create(&client, &ns.name, WorkloadKind::PyTorchJob, pt).await;
    labelled(&client, &ns.name, "pt", &COPIED).await;
    no_writes_over_touches(
        (&client, &wire, &op),
        &ns.name,
        WorkloadKind::PyTorchJob,
        "pt",
    )
    .await;
    made_once(&wire, &ns.name, "pt");
    op.stop().await;
}
