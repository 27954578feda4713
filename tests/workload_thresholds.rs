//! A workload's profile carries the thresholds in effect, as a Job's does
//! (tests/thresholds.rs), against the real local control plane and the
//! operator: a JobSet's, read where its sidecars were given them (its child
//! Jobs' `memprof.dev/thresholds`, which the JobSet controller copies from
//! the replicated job's template); a PyTorchJob's, from the PyTorchJob.
//! A refused annotation leaves the cluster-wide thresholds in effect and
//! gets one Warning Event `InvalidThresholds` on the workload.
//! (Stand-in CRDs: no JobSet controller or training operator runs here.)

use crate::common;
use crate::workload_support;

use common::*;
use kube::api::Api;
use kube::{Client, ResourceExt};
use memprof::api::thresholds::{parse_cluster, Thresholds, ANNOTATION_THRESHOLDS};
use memprof::api::workload::WorkloadKind;
use memprof::api::{MemoryProfile, ThresholdsInEffect};
use memprof::operator::Options;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use workload_support::*;

/// The thresholds in profile `name`'s status once `ok` holds for them.
async fn wait_thresholds(
    admin: &Client,
    ns: &str,
    name: &str,
    what: &str,
    ok: impl Fn(&ThresholdsInEffect) -> bool,
) -> ThresholdsInEffect {
    let profiles: Api<MemoryProfile> = Api::namespaced(admin.clone(), ns);
    eventually(what, || async {
        let p = profiles.get_opt(name).await.map_err(|e| e.to_string())?;
        let t = p
            .and_then(|p| p.status?.thresholds)
            .ok_or("no thresholds in the status yet")?;
        ok(&t).then_some(t.clone()).ok_or(format!("{t:?}"))
    })
    .await
}

/// The built-in thresholds as a status lists them.
fn built_in() -> BTreeMap<String, f64> {
    let Value::Object(m) = serde_json::to_value(Thresholds::default()).unwrap() else {
        unreachable!("thresholds serialise to an object")
    };
    m.into_iter()
        .map(|(k, v)| (k, v.as_f64().unwrap()))
        .collect()
}

/// A JobSet whose replicated job asks for its own thresholds: its profile
/// shows them, from the annotation, over the built-in ones.
#[tokio::test]
async fn a_jobsets_profile_carries_its_annotated_thresholds() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let _op = start_operator(&admin, &ns.name);
    let spec = r#"{"criticalTtoSeconds": 300, "highTtoSeconds": 900}"#;
    let annotations = json!({"memprof.dev/enabled": "true", ANNOTATION_THRESHOLDS: spec});
    let mut manifest = jobset("train", 2, json!({}));
    manifest["spec"]["replicatedJobs"][0]["template"]["metadata"] =
        json!({"annotations": annotations.clone()});
    let js = create(&admin, &ns.name, WorkloadKind::JobSet, manifest).await;
    create_child(&admin, &ns.name, &js, 0, annotations.clone(), true).await;
    create_child(&admin, &ns.name, &js, 1, annotations, true).await;
    let t = wait_thresholds(&admin, &ns.name, "train", "the JobSet's thresholds", |t| {
        t.source == "annotation"
    })
    .await;
    let mut want = built_in();
    want.insert("criticalTtoSeconds".into(), 300.0);
    want.insert("highTtoSeconds".into(), 900.0);
    assert_eq!(t.values, want);
    assert_eq!(t.message, None);
    let profiles: Api<MemoryProfile> = Api::namespaced(admin.clone(), &ns.name);
    let p = profiles.get("train").await.unwrap();
    assert_eq!(
        p.owner_references()[0].kind,
        "JobSet",
        "the JobSet's profile"
    );
    assert!(
        profiles.get_opt("train-workers-0").await.unwrap().is_none(),
        "no profile of the child's own"
    );
}

/// A PyTorchJob whose annotation is not valid: the cluster-wide
/// thresholds apply and say why, and one Warning Event `InvalidThresholds`
/// regards the PyTorchJob.
#[tokio::test]
async fn a_pytorchjobs_refused_thresholds_warn_on_it_and_the_defaults_apply() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let opts = Options {
        default_thresholds: parse_cluster(r#"{"highTtoSeconds": 900}"#).unwrap(),
        ..Options::for_namespace(&ns.name)
    };
    let _op = start_operator_with(&admin, opts);
    let mut manifest = pytorchjob("train", 1, json!({"memprof.dev/managed": "true"}));
    manifest["metadata"]["annotations"] = json!({"memprof.dev/enabled": "true",
        ANNOTATION_THRESHOLDS: r#"{"highTTOSeconds": 900}"#});
    create(&admin, &ns.name, WorkloadKind::PyTorchJob, manifest).await;
    let t = wait_thresholds(&admin, &ns.name, "train", "the annotation refused", |t| {
        t.message.is_some() && t.source == "chart"
    })
    .await;
    let mut cluster_wide = built_in();
    cluster_wide.insert("highTtoSeconds".into(), 900.0);
    assert_eq!(t.values, cluster_wide);
    let message = t.message.unwrap();
    assert!(message.contains("highTTOSeconds"), "{message}");
    let ev = the_one_event(&admin, &ns.name, "InvalidThresholds", "train").await;
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    let regarding = ev.regarding.as_ref().unwrap();
    assert_eq!(regarding.kind.as_deref(), Some("PyTorchJob"));
    let note = ev.note.as_deref().unwrap_or_default();
    assert!(note.contains("highTTOSeconds"), "{note}");
}
