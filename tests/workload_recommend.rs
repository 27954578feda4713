//! A workload's GPU-memory recommendation end to end, against the real
//! local control plane and the operator: a JobSet of two replicated jobs
//! (created here as the JobSet controller creates them, with their
//! workload marks as the webhook gives them; stand-in CRDs, no JobSet
//! controller runs here) gets one `status.recommendation` per replicated
//! job, each waiting for the phases its own Jobs' annotation names, and
//! `memprof recommend` prints it for the JobSet's profile; a PyTorchJob
//! (its pods created as the training operator's identity, marked by the
//! webhook) gets one per replica type, `Master` and `Worker`.

use crate::cli_support;
use crate::common;
use crate::tenant_support;
use crate::workload_support;

use common::*;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, PostParams};
use kube::{Client, ResourceExt};
use memprof::api::workload::WorkloadKind;
use memprof::api::workload_mark::{sign, Link, ANNOTATION_WORKLOAD_MARK};
use memprof::api::{
    AllocatorStats, MemoryProfile, MemoryReport, PhasePeak, RiskLevel, RoleRecommendation,
};
use serde_json::{json, Value};
use workload_support::*;

const GB: u64 = 1_000_000_000;

/// A JobSet `train`: replicated job `driver` (1 Job of 1 pod), then
/// `workers` (2 Jobs of 1 pod): ranks 0, then 1 and 2.
fn two_roles() -> Value {
    let rjob = |name: &str, replicas: u32| {
        json!({"name": name, "replicas": replicas,
               "template": {"spec": {"parallelism": 1, "completions": 1,
                   "template": {"spec": {"restartPolicy": "Never",
                       "containers": [{"name": "trainer", "image": "busybox"}]}}}}})
    };
    json!({"metadata": {"name": "train"},
           "spec": {"replicatedJobs": [rjob("driver", 1), rjob("workers", 2)]}})
}

/// Creates Job `index` of replicated job `rjob` of `js` as the JobSet
/// controller does (its template's `annotations` copied on), profiled and
/// marked as the webhook marks it.
async fn child(
    admin: &Client,
    ns: &str,
    js: &DynamicObject,
    (rjob, index): (&str, u32),
    mut annotations: Value,
) -> Job {
    let jobset = js.name_any();
    let name = format!("{jobset}-{rjob}-{index}");
    let identity = format!("{rjob}/{index}");
    let mark = child_mark(admin, ns, js, &name, &identity).await;
    annotations["memprof.dev/enabled"] = json!("true");
    annotations[ANNOTATION_WORKLOAD_MARK] = json!(mark);
    let manifest = json!({"metadata": {"name": name, "annotations": annotations,
            "labels": {"jobset.sigs.k8s.io/jobset-name": jobset,
                       "jobset.sigs.k8s.io/replicatedjob-name": rjob,
                       "jobset.sigs.k8s.io/job-index": index.to_string(),
                       "memprof.dev/managed": "true"},
            "ownerReferences": controller_ref(WorkloadKind::JobSet, js)},
        "spec": {"parallelism": 1, "completions": 1, "backoffLimit": 0,
            "template": {"metadata": {"labels": {"memprof.dev/managed": "true"}},
                "spec": {"restartPolicy": "Never",
                    "containers": [{"name": "trainer", "image": "busybox"}]}}}});
    let job: Job = serde_json::from_value(manifest).unwrap();
    Api::<Job>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &job)
        .await
        .unwrap()
}

/// Writes the report of Job `job`'s one pod as its sidecar would, its
/// trainer's allocator at `reserved` bytes after 10 steps of `phases`.
async fn trained(admin: &Client, ns: &str, job: &str, reserved: u64, phases: &[&str], t: u64) {
    let pod = job_pods(admin, ns, job, 1).await.remove(0);
    let report = measured(&pod, job, reserved, phases, t);
    apply_report(admin, ns, &report).await;
}

/// The report of `pod` (claiming `job`'s profile) whose trainer's
/// allocator is at `reserved` bytes after 10 steps of `phases`.
fn measured(pod: &Pod, job: &str, reserved: u64, phases: &[&str], t: u64) -> MemoryReport {
    let gpus = vec![gpu(0, 60, 60, RiskLevel::Low, None)];
    let mut report = pod_report(pod, job, 0, &at(t), gpus);
    report.spec.allocator = Some(AllocatorStats {
        allocated_bytes: reserved / 2,
        reserved_bytes: reserved,
        peak_allocated_bytes: Some(reserved - GB),
        step: Some(10),
        phase_peaks: phases
            .iter()
            .map(|p| PhasePeak {
                phase: p.to_string(),
                allocated_bytes: GB,
            })
            .collect(),
        ..Default::default()
    });
    report
}

/// The profile `train`'s recommendation once `done` holds for it.
async fn recommendation(
    profiles: &Api<MemoryProfile>,
    what: &str,
    done: impl Fn(&[RoleRecommendation]) -> bool,
) -> Vec<RoleRecommendation> {
    eventually(what, || async {
        let p = profiles.get_opt("train").await.map_err(|e| e.to_string())?;
        let recs = p.and_then(|p| p.status).map(|s| s.recommendation);
        let recs = recs.unwrap_or_default();
        done(&recs)
            .then_some(recs.clone())
            .ok_or(format!("{recs:?}"))
    })
    .await
}

/// JobSet `train` (two_roles) and its three marked child Jobs: the
/// driver, which never evaluates nor saves and says so on its template,
/// and two workers.
async fn driver_and_two_workers(admin: &Client, ns: &str) {
    let js = create(admin, ns, WorkloadKind::JobSet, two_roles()).await;
    let none = json!({"memprof.dev/recommend-phases": "none"});
    child(admin, ns, &js, ("driver", 0), none).await;
    child(admin, ns, &js, ("workers", 0), json!({})).await;
    child(admin, ns, &js, ("workers", 1), json!({})).await;
}

#[tokio::test]
async fn each_replicated_job_of_a_jobset_gets_a_recommendation_once_its_phases_were_seen() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let op = start_operator(&admin, &ns.name);
    driver_and_two_workers(&admin, &ns.name).await;
    let n = ns.name.as_str();
    trained(&admin, n, "train-driver-0", 4 * GB, &["forward"], 0).await;
    trained(&admin, n, "train-workers-0", 20 * GB, &["forward"], 0).await;
    trained(&admin, n, "train-workers-1", 22 * GB, &["forward"], 0).await;
    let profiles: Api<MemoryProfile> = Api::namespaced(admin.clone(), n);

    // 1. Training steps only: the driver has its request, the workers wait.
    let recs = recommendation(&profiles, "a role per replicated job", |r| {
        r.len() == 2 && r[0].request_bytes.is_some() && r[1].basis.ranks == 2
    })
    .await;
    let (driver, workers) = (&recs[0], &recs[1]);
    assert_eq!(
        (driver.role.as_str(), workers.role.as_str()),
        ("driver", "workers")
    );
    assert_eq!(driver.peak_bytes, Some(4 * GB), "{driver:?}");
    assert_eq!(workers.request_bytes, None, "{workers:?}");
    assert!(
        workers.reason.contains("no evaluation phase yet"),
        "{workers:?}"
    );
    let out = cli_support::memprof(&["recommend", "train", "-n", n], &[]).await;
    let (stdout, stderr) = cli_support::texts(&out);
    assert_eq!(
        out.status.code(),
        Some(3),
        "a role has none yet: {stderr}{stdout}"
    );
    assert!(
        stdout.contains("driver") && stdout.contains("workers"),
        "{stdout}"
    );

    // 2. The workers evaluate and save: their request, from the higher rank.
    let seen = ["forward", "eval", "checkpoint"];
    trained(&admin, n, "train-workers-0", 20 * GB, &seen, 5).await;
    trained(&admin, n, "train-workers-1", 22 * GB, &seen, 5).await;
    let recs = recommendation(&profiles, "the workers' request", |r| {
        r.len() == 2 && r[1].request_bytes.is_some()
    })
    .await;
    let workers = &recs[1];
    assert_eq!(workers.peak_bytes, Some(22 * GB), "{workers:?}");
    assert!(workers.basis.evaluation_seen && workers.basis.checkpoint_seen);
    let nccl = memprof::analysis::recommend::NCCL_BYTES;
    assert!(
        workers.context_bytes > nccl,
        "three ranks: NCCL's buffers counted"
    );
    let request = workers.request_bytes.unwrap();
    assert!(request >= 22 * GB + workers.context_bytes + workers.margin_bytes);

    // 3. `memprof recommend` prints the JobSet's roles per scheduler.
    let args = ["recommend", "train", "-n", n, "-o", "yaml"];
    let doc = cli_support::yaml(&cli_support::ok(&args).await);
    assert_eq!(doc["kind"].as_str(), Some("JobSet"), "{doc:?}");
    assert_eq!(doc["roles"][1]["role"].as_str(), Some("workers"), "{doc:?}");
    assert_eq!(doc["roles"][1]["requestBytes"].as_u64(), Some(request));
    let mib = request.div_ceil(1 << 20).to_string();
    let hami = &doc["roles"][1]["schedulers"]["hami"]["resources"]["limits"]["nvidia.com/gpumem"];
    assert_eq!(hami.as_str(), Some(mib.as_str()), "{doc:?}");
    op.stop().await;
}

/// A role's recommendation that waits for its phases counts every rank
/// of the role that reports, whatever the order of their reports: one
/// written while a rank had not reported yet is written again once it
/// has (the status names the ranks it is of). Before, the status writer
/// kept a waiting recommendation whole while its stage was unchanged, so
/// the workers' stayed of one rank when the writer ran between the two
/// workers' first reports (the test above, intermittently).
#[tokio::test]
async fn a_waiting_recommendation_counts_a_rank_that_reports_after_it_was_written() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let op = start_operator(&admin, &ns.name);
    driver_and_two_workers(&admin, &ns.name).await;
    let n = ns.name.as_str();
    trained(&admin, n, "train-driver-0", 4 * GB, &["forward"], 0).await;
    trained(&admin, n, "train-workers-0", 20 * GB, &["forward"], 0).await;
    let profiles: Api<MemoryProfile> = Api::namespaced(admin.clone(), n);
    // The order that was rare: written with one worker counted ...
    recommendation(&profiles, "the workers' wait, of one rank", |r| {
        r.len() == 2 && r[1].basis.ranks == 1
    })
    .await;
    // ... then the other worker's first report.
    trained(&admin, n, "train-workers-1", 22 * GB, &["forward"], 0).await;
    let recs = recommendation(&profiles, "the workers' wait, of both ranks", |r| {
        r.len() == 2 && r[1].basis.ranks == 2
    })
    .await;
    let workers = &recs[1];
    assert_eq!(workers.peak_bytes, Some(22 * GB), "{workers:?}");
    assert_eq!(workers.request_bytes, None, "{workers:?}");
    op.stop().await;
}

#[tokio::test]
async fn a_pytorchjob_gets_a_recommendation_per_replica_type() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let n = ns.name.as_str();
    let hooks = pytorch_admission(&admin, n).await;
    // What tenant_support::user_with checks the Role by (a list of Jobs), and pod creation.
    let rules = json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get"]},
                       {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["list"]}]);
    let operator = tenant_support::user_with(&admin, n, TRAINING_OPERATOR, rules).await;
    let op = start_operator(&admin, n);
    let mut manifest = pytorchjob("train", 2, json!({"memprof.dev/managed": "true"}));
    manifest["metadata"]["annotations"] =
        json!({"memprof.dev/enabled": "true", "memprof.dev/recommend-phases": "none"});
    let pt = create(&admin, n, WorkloadKind::PyTorchJob, manifest).await;
    let made = pytorch_pods(&operator, n, &pt).await;
    // The sidecars' writes: signed here as the writers webhook would (the
    // hooks go first so that they do not unmark them).
    hooks.stop().await;
    for (pod, reserved) in made.iter().zip([6 * GB, 20 * GB, 24 * GB]) {
        apply_report(
            &admin,
            n,
            &measured(pod, "train", reserved, &["forward"], 0),
        )
        .await;
    }
    let profiles: Api<MemoryProfile> = Api::namespaced(admin.clone(), n);
    let recs = recommendation(&profiles, "Master and Worker requests", |r| {
        r.len() == 2 && r.iter().all(|r| r.request_bytes.is_some()) && r[1].basis.ranks == 2
    })
    .await;
    let (master, worker) = (&recs[0], &recs[1]);
    assert_eq!(
        (master.role.as_str(), worker.role.as_str()),
        ("Master", "Worker")
    );
    assert_eq!(master.peak_bytes, Some(6 * GB), "{master:?}");
    assert_eq!(worker.peak_bytes, Some(24 * GB), "{worker:?}");
    assert_eq!(worker.basis.ranks_measured, 2, "{worker:?}");
    let args = ["recommend", "train", "-n", n, "-o", "json"];
    let doc: Value = serde_json::from_str(&cli_support::ok(&args).await).unwrap();
    assert_eq!(doc["kind"].as_str(), Some("PyTorchJob"), "{doc:?}");
    op.stop().await;
}

/// A TrainJob's profile recommends per replicated job of its JobSet (the
/// runtime's), each waiting for the phases its Jobs carry (the TrainJob's
/// `spec.annotations`, which Trainer puts on its JobSet's Jobs; the test
/// plays Trainer and the JobSet controller).
#[tokio::test]
async fn a_trainjobs_profile_recommends_per_replicated_job_of_its_jobset() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let n = ns.name.as_str();
    let op = start_operator(&admin, n);
    let phases = json!({"memprof.dev/recommend-phases": "none"});
    let manifest = json!({"metadata": {"name": "train"},
                          "spec": {"trainer": {"numNodes": 2}, "annotations": phases}});
    let tj = create(&admin, n, WorkloadKind::TrainJob, manifest).await;
    let mut js = two_roles();
    js["metadata"]["labels"] = json!({"trainer.kubeflow.org/trainjob-name": "train"});
    js["metadata"]["ownerReferences"] = controller_ref(WorkloadKind::TrainJob, &tj);
    let keys = admission_keys(n).await;
    let link = Link {
        namespace: n,
        kind: "JobSet",
        name: "train",
        controller_uid: tj.metadata.uid.as_deref().unwrap(),
        identity: "",
    };
    let mark = sign(keys.current().unwrap(), &link, jiff::Timestamp::now()).unwrap();
    js["metadata"]["annotations"] = json!({ANNOTATION_WORKLOAD_MARK: mark});
    let js = create(&admin, n, WorkloadKind::JobSet, js).await;
    for (rjob, index) in [("driver", 0), ("workers", 0), ("workers", 1)] {
        child(&admin, n, &js, (rjob, index), phases.clone()).await;
    }
    trained(&admin, n, "train-driver-0", 3 * GB, &["forward"], 0).await;
    trained(&admin, n, "train-workers-0", 30 * GB, &["forward"], 0).await;
    trained(&admin, n, "train-workers-1", 31 * GB, &["forward"], 0).await;
    let profiles: Api<MemoryProfile> = Api::namespaced(admin.clone(), n);
    let recs = recommendation(&profiles, "the TrainJob's two roles", |r| {
        r.len() == 2 && r.iter().all(|r| r.request_bytes.is_some()) && r[1].basis.ranks == 2
    })
    .await;
    let roles: Vec<_> = recs
        .iter()
        .map(|r| (r.role.as_str(), r.peak_bytes))
        .collect();
    assert_eq!(
        roles,
        [("driver", Some(3 * GB)), ("workers", Some(31 * GB))]
    );
    let profile = profiles.get("train").await.unwrap();
    assert_eq!(profile.owner_references()[0].kind, "TrainJob");
    op.stop().await;
}
