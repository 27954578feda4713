//! Unit tests of `rollup.rs`: a JobSet's and a PyTorchJob's reports, marks
//! signed with a test key as the webhook signs them.

use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use memprof_api::admission::{sign, Key, Subject, ANNOTATION_ADMISSION};
use memprof_api::workload::{
    WorkloadKind, LABEL_PYTORCH_REPLICA_INDEX, LABEL_PYTORCH_REPLICA_TYPE,
};
use memprof_api::workload_mark::{self, Link, ANNOTATION_WORKLOAD_MARK};
use memprof_api::{DataSource, GpuReport, MemoryReportSpec, RiskLevel};
use serde_json::json;
use std::sync::LazyLock;

const NS: &str = "team-a";
const GIB: u64 = 1 << 30;
static KEY: LazyLock<Key> = LazyLock::new(Key::generate);

fn ts(s: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + s).unwrap()
}

fn owner(kind: WorkloadKind, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: kind.api_version().into(),
        kind: kind.kind().into(),
        name: "x".into(),
        uid: uid.into(),
        controller: Some(true),
        ..Default::default()
    }
}

fn base(name: &str, controller: OwnerReference) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some(NS.into()),
        uid: Some(format!("{name}-uid")),
        creation_timestamp: Some(Time(ts(0))),
        owner_references: Some(vec![controller]),
        ..Default::default()
    }
}

/// A pod the Job controller created for Job `job_uid`, completion index `c`.
fn job_pod(name: &str, job_uid: &str, c: u32) -> ObjectMeta {
    let mut m = base(name, owner(WorkloadKind::Job, job_uid));
    let subject = Subject {
        namespace: NS,
        pod: name,
        job_uid,
    };
    m.annotations = Some(BTreeMap::from([
        (
            ANNOTATION_ADMISSION.to_string(),
            sign(&KEY, &subject, ts(0)),
        ),
        (COMPLETION_INDEX.to_string(), c.to_string()),
    ]));
    m
}

/// A pod the training operator created for PyTorchJob `uid` (or a tenant's: unmarked).
fn pytorch_pod_meta(name: &str, uid: &str, rtype: &str, i: u32, marked: bool) -> ObjectMeta {
    let mut m = base(name, owner(WorkloadKind::PyTorchJob, uid));
    m.labels = Some(BTreeMap::from([
        (LABEL_PYTORCH_REPLICA_TYPE.to_string(), rtype.to_string()),
        (LABEL_PYTORCH_REPLICA_INDEX.to_string(), i.to_string()),
    ]));
    if marked {
        let identity = format!("{rtype}/{i}");
        let link = Link {
            namespace: NS,
            kind: "Pod",
            name,
            controller_uid: uid,
            identity: &identity,
        };
        let mark = workload_mark::sign(&KEY, &link, ts(0)).unwrap();
        m.annotations = Some(BTreeMap::from([(
            ANNOTATION_WORKLOAD_MARK.to_string(),
            mark,
        )]));
    }
    m
}

/// The report `pod`'s sidecar writes, with `peak_gib` on its GPU and a
/// rank of its own choosing (ignored).
fn report(pod: &str, peak_gib: u64, claimed_rank: u32) -> MemoryReport {
    let gpu = GpuReport {
        uuid: format!("GPU-{pod}"),
        total_bytes: 80 * GIB,
        used_bytes: peak_gib * GIB,
        peak_bytes: peak_gib * GIB,
        risk: if peak_gib > 70 {
            RiskLevel::High
        } else {
            RiskLevel::Low
        },
        source: DataSource::Sim,
        ..Default::default()
    };
    let spec = MemoryReportSpec {
        pod_name: pod.into(),
        rank: Some(claimed_rank),
        sampled_at: ts(10).to_string(),
        gpus: vec![gpu],
        ..Default::default()
    };
    let mut r = MemoryReport::new(pod, spec);
    r.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: pod.into(),
        uid: format!("{pod}-uid"),
        ..Default::default()
    }]);
    memprof_api::writer::mark_as_written(&mut r, &KEY, NS);
    r
}

fn run(reports: &[MemoryReport], pods: &[ObjectMeta], layout: &Layout) -> WorkloadRollup {
    let by_name: HashMap<&str, &ObjectMeta> = pods
        .iter()
        .map(|p| (p.name.as_deref().unwrap(), p))
        .collect();
    let refs: Vec<&MemoryReport> = reports.iter().collect();
    roll_up(&refs, &by_name, layout, &KeyRing::new(KEY.clone()), ts(20))
}

/// Two child Jobs of two pods each: four ranks in one roll-up, the
/// bottleneck named by its JobSet rank (not the rank its sidecar claimed),
/// the imbalance across both Jobs; a pod of a Job that is not a proven
/// child (a tenant's Job claiming the JobSet) is refused.
#[test]
fn a_jobset_rolls_up_across_its_child_jobs_by_workload_rank() {
    let spec = json!({"replicatedJobs": [{"name": "workers", "replicas": 2,
        "template": {"spec": {"parallelism": 2, "completions": 2}}}]});
    let layout = Layout::JobSet {
        shape: JobSetShape::from_spec(&spec).unwrap(),
        members: BTreeMap::from([
            ("job0".to_string(), "workers/0".to_string()),
            ("job1".to_string(), "workers/1".to_string()),
        ]),
    };
    let pods = vec![
        job_pod("w0-a", "job0", 0),
        job_pod("w0-b", "job0", 1),
        job_pod("w1-a", "job1", 0),
        job_pod("w1-b", "job1", 1),
        job_pod("forged-a", "tenant-job", 0),
    ];
    // Every sidecar claims rank 0 (each is completion index 0..1 of its own Job).
    let reports = vec![
        report("w0-a", 40, 0),
        report("w0-b", 40, 1),
        report("w1-a", 40, 0),
        report("w1-b", 76, 1),
        report("forged-a", 79, 0),
    ];
    let out = run(&reports, &pods, &layout);
    assert_eq!(out.refused.keys().collect::<Vec<_>>(), ["forged-a"]);
    assert!(
        out.refused["forged-a"].contains("not a proven child"),
        "{:?}",
        out.refused
    );
    let st = out.rollup.status(ts(20));
    assert_eq!(st.ranks_reporting, 4);
    assert_eq!(st.ranks, "4/4");
    let bottleneck = st.bottleneck.unwrap();
    assert_eq!(
        (bottleneck.rank, bottleneck.pod.as_str()),
        (Some(3), "w1-b")
    );
    let imbalance = st.imbalance.unwrap();
    assert!((imbalance - 76.0 / 49.0).abs() < 0.01, "{imbalance}");
}

/// A PyTorchJob's master and workers in one roll-up by the training
/// operator's rank; a tenant's pod claiming the PyTorchJob is refused.
#[test]
fn a_pytorchjob_rolls_up_its_master_and_workers_by_rank() {
    let spec =
        json!({"pytorchReplicaSpecs": {"Master": {"replicas": 1}, "Worker": {"replicas": 2}}});
    let layout = Layout::PyTorchJob {
        uid: "pt".into(),
        shape: PyTorchShape::from_spec(&spec).unwrap(),
    };
    let pods = vec![
        pytorch_pod_meta("pt-master-0", "pt", "master", 0, true),
        pytorch_pod_meta("pt-worker-0", "pt", "worker", 0, true),
        pytorch_pod_meta("pt-worker-1", "pt", "worker", 1, true),
        pytorch_pod_meta("pt-worker-9", "pt", "worker", 1, false),
    ];
    let reports = vec![
        report("pt-master-0", 30, 7),
        report("pt-worker-0", 30, 7),
        report("pt-worker-1", 75, 7),
        report("pt-worker-9", 79, 7),
    ];
    let out = run(&reports, &pods, &layout);
    assert_eq!(out.refused.keys().collect::<Vec<_>>(), ["pt-worker-9"]);
    let st = out.rollup.status(ts(20));
    assert_eq!(st.ranks, "3/3");
    assert_eq!(
        st.bottleneck.unwrap().rank,
        Some(2),
        "worker 1 after the master"
    );
}

/// A report that is not its pod's own write, or a pod not in the cache, never counts.
#[test]
fn reports_still_obey_the_report_rules() {
    let layout = Layout::PyTorchJob {
        uid: "pt".into(),
        shape: PyTorchShape::from_spec(
            &json!({"pytorchReplicaSpecs": {"Worker": {"replicas": 2}}}),
        )
        .unwrap(),
    };
    let pods = vec![pytorch_pod_meta("pt-worker-0", "pt", "worker", 0, true)];
    let mut edited = report("pt-worker-0", 30, 0);
    edited.spec.gpus[0].peak_bytes = 79 * GIB; // after the writer mark
    let out = run(&[edited, report("pt-worker-1", 30, 1)], &pods, &layout);
    assert_eq!(out.refused.len(), 2, "{:?}", out.refused);
    assert!(out.refused["pt-worker-1"].contains("does not exist"));
    assert_eq!(out.rollup.status(ts(20)).ranks_reporting, 0);
}

/// Each counted report's recommendation evidence goes under the role of
/// its rank in the workload: a JobSet's replicated job, a PyTorchJob's
/// replica type; a refused report adds none, whatever it claims.
#[test]
fn counted_reports_are_recommended_for_by_the_role_of_their_workload_rank() {
    let spec = json!({"replicatedJobs": [
        {"name": "driver", "replicas": 1, "template": {"spec": {"parallelism": 1}}},
        {"name": "workers", "replicas": 2, "template": {"spec": {"parallelism": 1}}}]});
    let layout = Layout::JobSet {
        shape: JobSetShape::from_spec(&spec).unwrap(),
        members: BTreeMap::from([
            ("d".to_string(), "driver/0".to_string()),
            ("w0".to_string(), "workers/0".to_string()),
            ("w1".to_string(), "workers/1".to_string()),
        ]),
    };
    let pods = vec![
        job_pod("d-a", "d", 0),
        job_pod("w0-a", "w0", 0),
        job_pod("w1-a", "w1", 0),
        job_pod("forged-a", "tenant-job", 0),
    ];
    let reports: Vec<_> = ["d-a", "w0-a", "w1-a", "forged-a"]
        .iter()
        .map(|p| report(p, 40, 0))
        .collect();
    let roles = |out: &WorkloadRollup| {
        let mut st = memprof_api::MemoryProfileStatus::default();
        out.evidence.apply(&mut st, 3);
        st.recommendation
            .iter()
            .map(|r| (r.role.clone(), r.basis.ranks))
            .collect::<Vec<_>>()
    };
    let out = run(&reports, &pods, &layout);
    assert_eq!(
        roles(&out),
        [("driver".to_string(), 1), ("workers".to_string(), 2)]
    );
    let spec =
        json!({"pytorchReplicaSpecs": {"Master": {"replicas": 1}, "Worker": {"replicas": 2}}});
    let layout = Layout::PyTorchJob {
        uid: "pt".into(),
        shape: PyTorchShape::from_spec(&spec).unwrap(),
    };
    let pods = vec![
        pytorch_pod_meta("pt-master-0", "pt", "master", 0, true),
        pytorch_pod_meta("pt-worker-0", "pt", "worker", 0, true),
        pytorch_pod_meta("pt-worker-1", "pt", "worker", 1, true),
        pytorch_pod_meta("pt-master-9", "pt", "master", 0, false),
    ];
    let reports: Vec<_> = ["pt-master-0", "pt-worker-0", "pt-worker-1", "pt-master-9"]
        .iter()
        .map(|p| report(p, 40, 0))
        .collect();
    let out = run(&reports, &pods, &layout);
    assert_eq!(
        roles(&out),
        [("Master".to_string(), 1), ("Worker".to_string(), 2)]
    );
    assert_eq!((layout.role(2), layout.role(3)), (Some("Worker"), None));
}
