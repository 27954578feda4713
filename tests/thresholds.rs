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
    let ev = the_one_event(&client, &ns.name, "InvalidThresholds", "train").await;
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

/// A profiled Job whose pod template (not the Job) carries `thresholds`.
async fn create_job_with_template_thresholds(
    client: &kube::Client,
    ns: &str,
    name: &str,
    thresholds: &str,
) {
    let mut job: Job = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "annotations": {memprof::api::ANNOTATION_ENABLED: "true"}},
        "spec": {"parallelism": 1, "completions": 1, "template": {
            "spec": {"restartPolicy": "Never", "containers": [{"name": "trainer", "image": "busybox"}]}}},
    }))
    .unwrap();
    mark_managed(&mut job);
    let template = job
        .spec
        .as_mut()
        .and_then(|s| s.template.metadata.as_mut())
        .unwrap();
    template.annotations =
        Some([(ANNOTATION_THRESHOLDS.to_string(), thresholds.to_string())].into());
    Api::<Job>::namespaced(client.clone(), ns)
        .create(&kube::api::PostParams::default(), &job)
        .await
        .expect("creating the Job");
}

/// `{"criticalTtoSeconds": value}` padded with spaces to `len` bytes.
fn padded(value: u32, len: usize) -> String {
    let text = format!(r#"{{"criticalTtoSeconds": {value}}}"#);
    format!("{}{text}", " ".repeat(len - text.len()))
}

/// The status shows the thresholds the webhook gives the sidecars: a
/// template-only annotation (the webhook reads the Job's, else its pod
/// template's), a Job's own of 600 bytes (over the 512 the cache keeps of
/// other values, under the parser's 4096), and one over 4096 refused as too
/// long with the Warning, never read as no annotation.
#[tokio::test]
async fn the_status_shows_the_thresholds_the_sidecars_were_given_whatever_their_length() {
    let Some(client) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&client).await;
    let _op = start_operator_with(&client, Options::for_namespace(&ns.name));
    let template = r#"{"criticalTtoSeconds": 300}"#;
    create_job_with_template_thresholds(&client, &ns.name, "train", template).await;
    let profiles: Api<MemoryProfile> = Api::namespaced(client.clone(), &ns.name);
    let t = wait_thresholds(&profiles, "train", "the template's thresholds", |t| {
        t.source == "annotation"
    })
    .await;
    assert_eq!(t.values["criticalTtoSeconds"], 300.0);

    annotate(&client, &ns.name, "train", &padded(200, 600)).await;
    let t = wait_thresholds(&profiles, "train", "the Job's 600-byte thresholds", |t| {
        t.values["criticalTtoSeconds"] == 200.0
    })
    .await;
    assert_eq!((t.source.as_str(), t.message), ("annotation", None));

    annotate(&client, &ns.name, "train", &padded(200, 5000)).await;
    let t = wait_thresholds(
        &profiles,
        "train",
        "the over-long annotation refused",
        |t| t.message.is_some(),
    )
    .await;
    assert_eq!(t.source, "default");
    assert!(t.message.unwrap().contains("longer than 4096 bytes"));
    eventually("the InvalidThresholds Warning on the Job", || async {
        match count_events(&client, &ns.name, "InvalidThresholds", "train").await {
            0 => Err("none yet".to_string()),
            _ => Ok(()),
        }
    })
    .await;
}
