use super::*;
use serde_json::json;

fn from<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).unwrap()
}

#[test]
fn an_image_that_cannot_be_pulled_is_named_with_the_fix() {
    let p: Pod = from(json!({
        "metadata": {"name": "memprof-7d9"},
        "status": {"phase": "Pending", "containerStatuses": [{
            "name": "operator", "image": "ghcr.io/memprof/memprof:0.1.0", "imageID": "",
            "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}
        }]}
    }));
    let c = &pods("memprof-system", &[p])[0];
    assert_eq!(c.level, Level::Fail);
    assert!(c.what.contains("cannot pull image ghcr.io/memprof/memprof:0.1.0 (ImagePullBackOff: Back-off pulling image)"), "{c:?}");
    assert!(
        c.todo
            .as_deref()
            .unwrap()
            .contains("--set image.repository=REGISTRY/memprof"),
        "{c:?}"
    );
}

#[test]
fn crash_loops_not_ready_and_missing_pods_fail_and_ready_ones_pass() {
    let crash: Pod = from(
        json!({"metadata": {"name": "a"}, "status": {"containerStatuses": [{
        "name": "operator", "image": "i", "imageID": "", "ready": false, "restartCount": 5,
        "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}}),
    );
    let c = &pods("ns", &[crash])[0];
    assert!(
        c.todo
            .as_deref()
            .unwrap()
            .contains("logs a -c operator --previous"),
        "{c:?}"
    );
    let pending: Pod = from(json!({"metadata": {"name": "b"}, "status": {"phase": "Pending"}}));
    assert!(pods("ns", &[pending])[0]
        .what
        .contains("not ready (phase Pending)"));
    let ready: Pod = from(
        json!({"metadata": {"name": "c"}, "status": {"phase": "Running",
        "conditions": [{"type": "Ready", "status": "True"}]}}),
    );
    assert_eq!(pods("ns", &[ready])[0].level, Level::Ok);
    assert_eq!(pods("ns", &[])[0].level, Level::Fail);
}

#[test]
fn webhooks_need_a_ca_bundle_and_failing_open_is_said() {
    let cfg: MutatingWebhookConfiguration = from(json!({
        "metadata": {"name": "memprof"},
        "webhooks": [
            {"name": "jobs.memprof.dev", "failurePolicy": "Ignore", "sideEffects": "None",
             "admissionReviewVersions": ["v1"],
             "clientConfig": {"service": {"namespace": "ops", "name": "memprof-webhook"}}},
            {"name": "other.example.com", "sideEffects": "None", "admissionReviewVersions": ["v1"],
             "clientConfig": {"url": "https://x"}}
        ]
    }));
    let (lines, targets) = webhooks(&[cfg]);
    assert_eq!(targets.len(), 1);
    assert_eq!(
        targets[0].service,
        Some(("ops".into(), "memprof-webhook".into()))
    );
    assert_eq!(lines[0].level, Level::Fail);
    assert!(lines[0].what.contains("has no caBundle"), "{lines:?}");
    assert_eq!(lines[1].level, Level::Warn);
    assert!(lines[1].what.contains("fails open"), "{lines:?}");
    assert_eq!(
        lines.len(),
        2,
        "only the marks webhook has a path to check: {lines:?}"
    );
    // On the secret path: said so, and the token is never printed.
    let on_path: MutatingWebhookConfiguration = from(json!({
        "metadata": {"name": "memprof"},
        "webhooks": [{"name": "marks.memprof.dev", "sideEffects": "None", "admissionReviewVersions": ["v1"],
             "clientConfig": {"url": "https://127.0.0.1:8443/mutate/s3cr3t", "caBundle": "Y2E="}}]
    }));
    let (lines, _) = webhooks(&[on_path]);
    assert!(
        lines.iter().all(|l| !l.what.contains("s3cr3t")),
        "{lines:?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.level == Level::Ok && l.what.contains("secret path")),
        "{lines:?}"
    );
    let off_path: MutatingWebhookConfiguration = from(json!({
        "metadata": {"name": "memprof"},
        "webhooks": [{"name": "marks.memprof.dev", "sideEffects": "None", "admissionReviewVersions": ["v1"],
             "clientConfig": {"service": {"namespace": "ops", "name": "w", "path": "/mutate"}, "caBundle": "Y2E="}}]
    }));
    let (lines, _) = webhooks(&[off_path]);
    assert!(
        lines
            .iter()
            .any(|l| l.level == Level::Warn && l.what.contains("not the operator's secret path")),
        "{lines:?}"
    );
    // The writers webhook too: off the path, reports are not marked.
    let writers_off: MutatingWebhookConfiguration = from(json!({
        "metadata": {"name": "memprof"},
        "webhooks": [{"name": "writers.memprof.dev", "sideEffects": "None", "admissionReviewVersions": ["v1"],
             "clientConfig": {"service": {"namespace": "ops", "name": "w", "path": "/mutate"}, "caBundle": "Y2E="}}]
    }));
    let (lines, _) = webhooks(&[writers_off]);
    assert!(
        lines.iter().any(|l| l.level == Level::Warn
            && l.what.contains("writers.memprof.dev")
            && l.what.contains("reports are written but not marked")),
        "{lines:?}"
    );
    let (none, t) = webhooks(&[]);
    assert!(t.is_empty() && none[0].what.contains("no memprof webhook is registered"));
}

#[test]
fn annotated_jobs_without_the_sidecar_are_named() {
    let job = |name: &str, annotated: bool, injected: bool| -> Job {
        let mut containers = vec![json!({"name": "trainer", "image": "t"})];
        if injected {
            containers.push(json!({"name": "memprof-sidecar", "image": "m"}));
        }
        let ann = if annotated {
            json!({"memprof.dev/enabled": "true"})
        } else {
            json!({})
        };
        from(
            json!({"metadata": {"name": name, "namespace": "ml", "annotations": ann},
            "spec": {"template": {"spec": {"containers": containers}}}}),
        )
    };
    let c = jobs(&[
        job("missed", true, false),
        job("fine", true, true),
        job("plain", false, false),
    ]);
    assert_eq!(c[0].level, Level::Warn);
    assert!(
        c[0].what
            .contains("1 annotated Job(s) were never injected and run unprofiled: ml/missed"),
        "{c:?}"
    );
    assert_eq!(jobs(&[job("fine", true, true)])[0].level, Level::Ok);
}

#[test]
fn endpoints_deployments_and_crds() {
    let none: Endpoints = from(json!({"metadata": {"name": "s"}, "subsets": []}));
    assert!(endpoints("ns", "s", Some(&none))
        .what
        .contains("no ready endpoint"));
    assert_eq!(endpoints("ns", "s", None).level, Level::Fail);
    let one: Endpoints =
        from(json!({"metadata": {"name": "s"}, "subsets": [{"addresses": [{"ip": "10.0.0.1"}]}]}));
    assert_eq!(endpoints("ns", "s", Some(&one)).level, Level::Ok);
    let d: Deployment = from(
        json!({"metadata": {"name": "memprof"}, "spec": {"replicas": 2,
        "selector": {}, "template": {}}, "status": {"availableReplicas": 0}}),
    );
    assert!(deployments("ns", &[d])[0].what.contains("0/2 available"));
    let crd: CustomResourceDefinition =
        from(json!({"metadata": {"name": "x"}, "spec": {"group": "g",
        "names": {"plural": "x", "kind": "X"}, "scope": "Namespaced", "versions": []},
        "status": {"conditions": [{"type": "Established", "status": "True"}]}}));
    let c = crds(&[("x", Some(crd)), ("y", None)]);
    assert_eq!((c[0].level, c[1].level), (Level::Ok, Level::Fail));
    assert!(c[1].todo.as_deref().unwrap().contains("--force-conflicts"));
    let text = render(&c);
    assert!(
        text.starts_with(
            "OK    CRD x is served\nFAIL  CRD y is not installed\n      → kubectl apply"
        ),
        "{text}"
    );
    assert!(
        text.ends_with("\n1 failed, 0 warnings, 2 checks\n"),
        "{text}"
    );
}
