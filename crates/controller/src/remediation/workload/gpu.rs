//! `scaleBatch`'s `gpuMemoryRequest` on a workload's plan. The policy's
//! planning sets the request on the Job view's one pod template
//! (`memprof_policy::plan::with_gpu_request`), which a workload's plan
//! does not keep: its recreated object is the user's, every pod template
//! its own. So each pod template of a recreated JobSet or PyTorchJob asks
//! for its own role's recommendation (a JobSet's replicated job, a
//! PyTorchJob's replica type: the roles its profile recommends for), by
//! the same rule as a Job's (raised, never lowered), and the workload's
//! `memprof.dev/gpu-memory-request` says what each role asked. A change
//! that keeps the pod templates (suspend, patch the environment, resume)
//! and a TrainJob (whose pod templates are its runtime's) ask nothing, and
//! the annotation says so rather than what the Job view would have asked.

use super::kind_of;
use memprof_api::workload::WorkloadKind;
use memprof_api::{RemediationPolicy, RoleRecommendation};
use memprof_policy::plan::{
    asked_gpu_request, with_gpu_request, Plan, Step, ANNOTATION_GPU_MEMORY_REQUEST,
};
use serde_json::{json, Value};

/// Applies `policy`'s `gpuMemoryRequest` (if it asks for one) to the
/// workload `plan` acts on, from its profile's `recommendation`.
pub fn with_gpu_requests(
    plan: &mut Plan,
    policy: &RemediationPolicy,
    recommendation: &[RoleRecommendation],
) {
    let asked = asked_gpu_request(policy).is_some();
    let kind = kind_of(plan);
    if !asked || kind == WorkloadKind::Job {
        return;
    }
    for step in &mut plan.steps {
        match step {
            Step::Recreate { manifest, .. } => {
                let note = per_role(policy, kind, manifest, recommendation);
                manifest["metadata"]["annotations"][ANNOTATION_GPU_MEMORY_REQUEST] = json!(note);
            }
            Step::SuspendPatchResume { annotations, .. } => {
                let note = format!(
                    "none: a {} suspended, patched and resumed keeps its pod templates (only a \
                     recreated one asks again)",
                    kind.kind()
                );
                annotations.insert(ANNOTATION_GPU_MEMORY_REQUEST.into(), note);
            }
            _ => {}
        }
    }
}

/// Sets each pod template of `manifest` (a workload of `kind`) to ask for
/// its role's request; returns what each role asked, `role: note; …`.
fn per_role(
    policy: &RemediationPolicy,
    kind: WorkloadKind,
    manifest: &mut Value,
    recommendation: &[RoleRecommendation],
) -> String {
    let roles = templates(kind, manifest);
    if roles.is_empty() {
        return format!(
            "none: a {}'s pod templates are not its own: nothing was requested",
            kind.kind()
        );
    }
    let mut notes = Vec::new();
    for (role, template) in roles {
        let own: Vec<RoleRecommendation> = recommendation
            .iter()
            .filter(|r| r.role == role)
            .cloned()
            .collect();
        notes.push(format!("{role}: {}", ask(policy, template, &own)));
    }
    notes.join("; ")
}

/// The pod templates of `manifest`, each with the role it runs: a JobSet's
/// replicated jobs by name, a PyTorchJob's replica types. None for a TrainJob.
fn templates(kind: WorkloadKind, manifest: &mut Value) -> Vec<(String, &mut Value)> {
    let spec = &mut manifest["spec"];
    match kind {
        WorkloadKind::JobSet => spec["replicatedJobs"]
            .as_array_mut()
            .into_iter()
            .flatten()
            .filter_map(|r| {
                let role = r["name"].as_str()?.to_string();
                Some((role, &mut r["template"]["spec"]["template"]))
            })
            .collect(),
        WorkloadKind::PyTorchJob => spec["pytorchReplicaSpecs"]
            .as_object_mut()
            .into_iter()
            .flatten()
            .map(|(role, r)| (role.clone(), &mut r["template"]))
            .collect(),
        WorkloadKind::TrainJob | WorkloadKind::Job => Vec::new(),
    }
}

/// Asks, on `template`, for the request of `recommendation` (one role's)
/// by the policy's rule for a Job's template; returns what it says.
fn ask(
    policy: &RemediationPolicy,
    template: &mut Value,
    recommendation: &[RoleRecommendation],
) -> String {
    let manifest = json!({"metadata": {}, "spec": {"template": template.take()}});
    let mut one = Plan {
        id: String::new(),
        policy: String::new(),
        namespace: String::new(),
        job: String::new(),
        job_uid: String::new(),
        why: String::new(),
        steps: vec![Step::Recreate {
            changes: Vec::new(),
            manifest,
        }],
        kind: None,
        checkpoint: None,
    };
    with_gpu_request(&mut one, policy, recommendation);
    let Some(Step::Recreate { mut manifest, .. }) = one.steps.pop() else {
        unreachable!("one recreation step, kept");
    };
    *template = manifest["spec"]["template"].take();
    let note = &manifest["metadata"]["annotations"][ANNOTATION_GPU_MEMORY_REQUEST];
    note.as_str().unwrap_or_default().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::action::EnvChange;

    fn policy() -> RemediationPolicy {
        serde_json::from_value(json!({
            "apiVersion": "memprof.dev/v1alpha1", "kind": "RemediationPolicy",
            "metadata": {"name": "kai", "namespace": "ml"},
            "spec": {"triggers": [{"riskAtLeast": {"level": "high"}}],
                     "actions": [{"scaleBatch": {"env": "BATCH_SIZE", "factor": 0.75,
                                                 "gpuMemoryRequest": "kaiScheduler"}}]},
        }))
        .unwrap()
    }

    fn role(name: &str, gib: Option<u64>) -> RoleRecommendation {
        RoleRecommendation {
            role: name.into(),
            request_bytes: gib.map(|g| g << 30),
            ..Default::default()
        }
    }

    fn pytorchjob() -> Value {
        let t = json!({"spec": {"containers": [{"name": "pytorch", "image": "i",
            "env": [{"name": "BATCH_SIZE", "value": "32"}]}]}});
        json!({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
               "metadata": {"name": "train", "namespace": "ml", "uid": "u"},
               "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": t.clone()},
                                                "Worker": {"replicas": 2, "template": t}}}})
    }

    /// The plan the executor makes for `object` recreated or suspended, with the request.
    fn planned(object: &Value, how: EnvChange, recs: &[RoleRecommendation]) -> Plan {
        let view = super::super::job_view(WorkloadKind::PyTorchJob, object);
        let mut plan = Plan {
            id: "r1".into(),
            policy: "kai".into(),
            namespace: "ml".into(),
            job: "train".into(),
            job_uid: "u".into(),
            why: String::new(),
            steps: vec![Step::Recreate {
                changes: Vec::new(),
                manifest: view,
            }],
            kind: None,
            checkpoint: None,
        };
        with_gpu_request(&mut plan, &policy(), recs);
        let mut plan = super::super::for_workload(plan, WorkloadKind::PyTorchJob, object, how);
        with_gpu_requests(&mut plan, &policy(), recs);
        plan
    }

    #[test]
    fn each_pod_template_of_a_recreated_pytorchjob_asks_for_its_own_roles_request() {
        let recs = [role("Master", Some(8)), role("Worker", Some(30))];
        let plan = planned(&pytorchjob(), EnvChange::Recreate, &recs);
        let Step::Recreate { manifest, .. } = &plan.steps[0] else {
            panic!("{plan:?}");
        };
        let asked = |t: &str| {
            let at =
                format!("/spec/pytorchReplicaSpecs/{t}/template/metadata/annotations/gpu-memory");
            manifest
                .pointer(&at)
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        assert_eq!(asked("Master").as_deref(), Some("8192"));
        assert_eq!(asked("Worker").as_deref(), Some("30720"));
        let note = &manifest["metadata"]["annotations"][ANNOTATION_GPU_MEMORY_REQUEST];
        assert_eq!(
            note,
            "Master: KaiScheduler annotation gpu-memory=8192; \
             Worker: KaiScheduler annotation gpu-memory=30720"
        );
    }

    #[test]
    fn a_role_without_a_request_asks_nothing_and_a_suspension_claims_nothing() {
        let recs = [role("Master", None), role("Worker", Some(30))];
        let plan = planned(&pytorchjob(), EnvChange::Recreate, &recs);
        let Step::Recreate { manifest, .. } = &plan.steps[0] else {
            panic!("{plan:?}");
        };
        let master = "/spec/pytorchReplicaSpecs/Master/template/metadata/annotations/gpu-memory";
        assert_eq!(manifest.pointer(master), None);
        let note = manifest["metadata"]["annotations"][ANNOTATION_GPU_MEMORY_REQUEST]
            .as_str()
            .unwrap();
        assert!(note.starts_with("Master: none: "), "{note}");
        let plan = planned(&pytorchjob(), EnvChange::SuspendPatchResume, &recs);
        let Step::SuspendPatchResume { annotations, .. } = &plan.steps[0] else {
            panic!("{plan:?}");
        };
        let note = &annotations[ANNOTATION_GPU_MEMORY_REQUEST];
        assert!(note.starts_with("none: a PyTorchJob suspended"), "{note}");
    }
}
