//! The status writer's two ways of writing (`--status-write=apply|merge`)
//! against the real API server: the status on the server is the composed
//! status (a field the new status lacks is gone), and a write composed on
//! an older version is refused and composed again, so it never undoes a
//! write it did not see (`crates/controller/src/status/mod.rs`).

use crate::common;

use common::{cluster, eventually, TestNamespace};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Recorder, Reporter};
use memprof::api::{MemoryProfile, MemoryProfileSpec, MemoryProfileStatus, OomRecord, RiskLevel};
use memprof::key::JobKey;
use memprof::operator::Metrics;
use memprof::status::{Analysis, StatusWriter, WriteMode, WriterOptions};
use std::time::Duration;

fn status(peak: u64, tto: Option<f64>) -> MemoryProfileStatus {
    MemoryProfileStatus {
        peak_used_bytes: peak,
        // Never empty in the roll-up's statuses (the schema wants strings).
        ranks: "2/2".into(),
        peak: format!("{peak} B"),
        risk: if tto.is_some() {
            RiskLevel::High
        } else {
            RiskLevel::Low
        },
        time_to_oom_seconds: tto,
        time_to_oom: tto.map(|s| format!("{s}s")),
        ..Default::default()
    }
}

/// Waits until the profile's status has `peak`; the status.
async fn written(profiles: &Api<MemoryProfile>, name: &str, peak: u64) -> MemoryProfileStatus {
    eventually(
        &format!("a status with peakUsedBytes {peak}"),
        || async move {
            let p = profiles.get(name).await.map_err(|e| e.to_string())?;
            match p.status {
                Some(st) if st.peak_used_bytes == peak => Ok(st),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
}

async fn check(client: &kube::Client, mode: WriteMode) {
    let ns = TestNamespace::create(client).await;
    let profiles: Api<MemoryProfile> = Api::namespaced(client.clone(), &ns.name);
    let spec = MemoryProfileSpec {
        job_name: "job".into(),
        expected_ranks: Some(2),
    };
    let created = profiles
        .create(&PostParams::default(), &MemoryProfile::new("job", spec))
        .await
        .unwrap();
    let metrics = Metrics::register(&mut Default::default());
    let recorder = Recorder::new(client.clone(), Reporter::from("memprof-tests"));
    let opts = WriterOptions {
        min_interval: Duration::from_millis(10),
        workers: 2,
        mode,
    };
    let writer = StatusWriter::new(client.clone(), recorder, metrics.clone(), opts);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(writer.clone().run(async move {
        let _ = stopped.await;
    }));
    let key = JobKey::new(&ns.name, "job");
    writer.observe(&key, &created);

    let analysis = |st| Analysis {
        status: st,
        notices: Vec::new(),
    };
    writer.submit(&key, "job-uid", analysis(status(1, Some(400.0))));
    assert_eq!(
        written(&profiles, "job", 1).await.time_to_oom_seconds,
        Some(400.0)
    );
    // Behind the writer's back (a previous leader's remediation edit): it
    // does not observe this version.
    let oom = OomRecord {
        pod: "job-0".into(),
        time: "2026-01-01T00:00:00Z".into(),
        evidence: "test".into(),
        ..Default::default()
    };
    let edit = serde_json::json!({ "status": { "ooms": [oom], "oomCount": 1 } });
    profiles
        .patch_status("job", &PatchParams::default(), &Patch::Merge(&edit))
        .await
        .unwrap();

    writer.submit(&key, "job-uid", analysis(status(2, None)));
    let st = written(&profiles, "job", 2).await;
    assert_eq!(
        st.time_to_oom_seconds, None,
        "{mode:?}: a field the status lacks is gone"
    );
    assert_eq!(st.time_to_oom, None, "{mode:?}");
    assert_eq!(st.risk, RiskLevel::Low, "{mode:?}");
    assert_eq!(
        st.ooms,
        vec![oom],
        "{mode:?}: the write it did not see stays"
    );
    assert_eq!(st.oom_count, Some(1), "{mode:?}");
    assert!(
        metrics.status_conflicts.get() >= 1,
        "{mode:?}: the write composed on the older version was refused (resourceVersion precondition)"
    );
    let _ = stop.send(());
    task.await.unwrap();
}

#[tokio::test]
async fn both_write_modes_write_the_composed_status_and_never_undo_an_unseen_write() {
    let Some(client) = cluster().await else {
        return;
    };
    for mode in [WriteMode::Apply, WriteMode::Merge] {
        check(&client, mode).await;
    }
}
