//! Thresholds where users set them, against the real API server: the
//! cluster-wide defaults (`--default-thresholds`) and a Job's
//! `memprof.dev/thresholds` show in the MemoryProfile status with their
//! source; an invalid annotation gives one Warning Event `InvalidThresholds`
//! on the Job, and the cluster-wide thresholds stay in effect.

use crate::common;

use common::*;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, Patch, PatchParams};
use memprof::api::thresholds::{parse_cluster, ANNOTATION_THRESHOLDS};
use memprof::api::{MemoryProfile, ThresholdsInEffect};
use memprof::operator::Options;

async fn wait_thresholds(
    profiles: &Api<MemoryProfile>,
    name: &str,
    what: &str,
    ok: impl Fn(&ThresholdsInEffect) -> bool,
) -> ThresholdsInEffect {
    eventually(what, || async {
        let p = profiles.get_opt(name).await.map_err(|e| e.to_string())?;
        let t = p
            .and_then(|p| p.status?.thresholds)
            .ok_or("no thresholds in the status yet")?;
        if ok(&t) {
            Ok(t)
        } else {
            Err(format!("{t:?}"))
        }
    })
    .await
}

async fn annotate(client: &kube::Client, ns: &str, job: &str, value: &str) {
    let body = serde_json::json!({
        "metadata": { "annotations": { ANNOTATION_THRESHOLDS: value } }
    });
    Api::<Job>::namespaced(client.clone(), ns)
        .patch(job, &PatchParams::default(), &Patch::Merge(&body))
        .await
        .expect("annotating the Job");
}

#[tokio::test]
async fn thresholds_in_effect_show_their_source_and_an_invalid_annotation_warns_once() {
    let Some(client) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&client).await;
    let opts = Options {
        default_thresholds: parse_cluster(r#"{"highTtoSeconds": 900}"#).unwrap(),
        ..Options::for_namespace(&ns.name)
    };
    let _op = start_operator_with(&client, opts);
    create_job(&client, &ns.name, "train", 2, true).await;
    let profiles: Api<MemoryProfile> = Api::namespaced(client.clone(), &ns.name);

    let t = wait_thresholds(&profiles, "train", "the chart's thresholds", |t| {
        t.source == "chart"
    })
    .await;
    assert_eq!(t.values["highTtoSeconds"], 900.0);
    assert_eq!(t.values["criticalTtoSeconds"], 120.0, "built-in default");
    assert_eq!(t.message, None);

    // Valid: applied over the chart's.
    annotate(&client, &ns.name, "train", r#"{"criticalTtoSeconds": 300}"#).await;
    let t = wait_thresholds(&profiles, "train", "the annotation's thresholds", |t| {
        t.source == "annotation"
    })
    .await;
    assert_eq!(t.values["criticalTtoSeconds"], 300.0);
    assert_eq!(t.values["highTtoSeconds"], 900.0);
    // `memprof report` shows them.
    let shown = memprof::cli::kube::report::render(&profiles.get("train").await.unwrap());
    assert!(
        shown.contains("thresholds (annotation): criticalTtoSeconds=300 highTtoSeconds=900"),
        "{shown}"
    );

    // Invalid (high below critical): refused, the chart's apply, one Warning Event.
    annotate(&client, &ns.name, "train", r#"{"highTtoSeconds": 5}"#).await;
    let t = wait_thresholds(&profiles, "train", "the annotation refused", |t| {
        t.message.is_some()
    })
    .await;
    assert_eq!(t.source, "chart");
    assert_eq!(t.values["highTtoSeconds"], 900.0);
    let message = t.message.unwrap();
    assert!(message.contains("highTtoSeconds"), "{message}");
    assert!(message.contains("critical <= high <= medium"), "{message}");
    eventually("one InvalidThresholds Event on the Job", || async {
        match count_events(&client, &ns.name, "InvalidThresholds", "train").await {
            1 => Ok(()),
            n => Err(format!("{n} event(s)")),
        }
    })
    .await;
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(client.clone(), &ns.name);
    let listed = events.list(&Default::default()).await.unwrap();
    let ev = listed
        .items
        .iter()
        .find(|e| e.reason.as_deref() == Some("InvalidThresholds"))
        .unwrap();
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    assert_eq!(
        ev.regarding.as_ref().and_then(|r| r.kind.as_deref()),
        Some("Job")
    );
    assert!(
        ev.note
            .as_deref()
            .unwrap_or_default()
            .contains("cluster-wide"),
        "{ev:?}"
    );
}
