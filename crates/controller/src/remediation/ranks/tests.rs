//! Unit tests of `ranks.rs`: which reports a workload's remediation counts,
//! marks signed with a test key as the webhook signs them.

use super::*;
use crate::workload::rank::{JobSetShape, PyTorchShape};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use memprof_api::admission::{sign, Key, Subject, ANNOTATION_ADMISSION};
use memprof_api::workload::{
    WorkloadKind, LABEL_PYTORCH_REPLICA_INDEX, LABEL_PYTORCH_REPLICA_TYPE,
};
use memprof_api::workload_mark::{self, Link, ANNOTATION_WORKLOAD_MARK};
use memprof_api::MemoryReportSpec;
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::sync::LazyLock;

const NS: &str = "team-a";
static KEY: LazyLock<Key> = LazyLock::new(Key::generate);

fn ts(s: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + s).unwrap()
}

fn pod(name: &str, kind: WorkloadKind, controller: &str) -> Pod {
    let metadata = ObjectMeta {
        name: Some(name.into()),
        namespace: Some(NS.into()),
        uid: Some(format!("{name}-uid")),
        creation_timestamp: Some(Time(ts(0))),
        owner_references: Some(vec![OwnerReference {
            api_version: kind.api_version().into(),
            kind: kind.kind().into(),
            name: "x".into(),
            uid: controller.into(),
            controller: Some(true),
            ..Default::default()
        }]),
        ..Default::default()
    };
    Pod {
        metadata,
        ..Default::default()
    }
}

/// A PyTorchJob `pt`'s pod as the training operator creates it (`marked`)
/// or as a tenant does (no workload mark).
fn pytorch_pod(name: &str, index: u32, marked: bool) -> Pod {
    let mut p = pod(name, WorkloadKind::PyTorchJob, "pt");
    p.metadata.labels = Some(BTreeMap::from([
        (LABEL_PYTORCH_REPLICA_TYPE.to_string(), "worker".to_string()),
        (LABEL_PYTORCH_REPLICA_INDEX.to_string(), index.to_string()),
    ]));
    if marked {
        let identity = format!("worker/{index}");
        let link = Link {
            namespace: NS,
            kind: "Pod",
            name,
            controller_uid: "pt",
            identity: &identity,
        };
        let mark = workload_mark::sign(&KEY, &link, ts(0)).unwrap();
        p.metadata.annotations = Some(BTreeMap::from([(ANNOTATION_WORKLOAD_MARK.into(), mark)]));
    }
    p
}

/// A pod the Job controller created for Job `job_uid` (the admission mark).
fn job_pod(name: &str, job_uid: &str) -> Pod {
    let mut p = pod(name, WorkloadKind::Job, job_uid);
    let subject = Subject {
        namespace: NS,
        pod: name,
        job_uid,
    };
    let mark = sign(&KEY, &subject, ts(0));
    p.metadata.annotations = Some(BTreeMap::from([(ANNOTATION_ADMISSION.into(), mark)]));
    p
}

/// `pod`'s own report, claiming `claims`, written by its sidecar.
fn report(pod: &str, claims: &str) -> Arc<MemoryReport> {
    let spec = MemoryReportSpec {
        pod_name: pod.into(),
        // Every sidecar says rank 7: the workload's numbering replaces it.
        rank: Some(7),
        sampled_at: ts(10).to_string(),
        ..Default::default()
    };
    let mut r = MemoryReport::new(pod, spec);
    r.metadata.labels = Some(BTreeMap::from([(LABEL_JOB.into(), claims.into())]));
    r.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: pod.into(),
        uid: format!("{pod}-uid"),
        ..Default::default()
    }]);
    memprof_api::writer::mark_as_written(&mut r, &KEY, NS);
    Arc::new(r)
}

fn counted(ranks: &Ranks, reports: Vec<Arc<MemoryReport>>, pods: Vec<Pod>) -> Vec<String> {
    let pods: HashMap<String, Arc<Pod>> = pods
        .into_iter()
        .map(|p| (p.metadata.name.clone().unwrap(), Arc::new(p)))
        .collect();
    let keys = KeyRing::new(KEY.clone());
    let out = ranks.counted(reports, |n| pods.get(n).cloned(), &keys, ts(20));
    out.iter()
        .map(|(r, pod)| {
            assert!(pod.is_some(), "each counted report comes with its pod");
            let rank = r.spec.rank.map_or("-".into(), |n| n.to_string());
            format!("{}@{rank}", r.spec.pod_name)
        })
        .collect()
}

/// A PyTorchJob's ranks are the training operator's pods' reports (no Job
/// admission mark on them: a Job's rule counted none), numbered by their
/// rank in the PyTorchJob, not the sidecar's word; a tenant's pod
/// claiming the PyTorchJob, a rank outside its replicas and a report
/// claiming another name are not counted.
#[test]
fn a_pytorchjob_s_ranks_are_its_training_operator_s_pods_inside_its_replicas() {
    let spec = json!({"pytorchReplicaSpecs": {"Worker": {"replicas": 2}}});
    let ranks = Ranks {
        claims: BTreeSet::from(["pt".to_string()]),
        layout: Layout::PyTorchJob {
            uid: "pt".into(),
            shape: PyTorchShape::from_spec(&spec).unwrap(),
        },
    };
    let pods = vec![
        pytorch_pod("pt-worker-0", 0, true),
        pytorch_pod("pt-worker-1", 1, true),
        pytorch_pod("pt-worker-5", 5, true),
        pytorch_pod("forged", 0, false),
        pytorch_pod("elsewhere", 0, true),
    ];
    let reports = vec![
        report("pt-worker-0", "pt"),
        report("pt-worker-1", "pt"),
        report("pt-worker-5", "pt"),
        report("forged", "pt"),
        report("elsewhere", "other"),
    ];
    assert_eq!(
        counted(&ranks, reports, pods),
        ["pt-worker-0@0", "pt-worker-1@1"]
    );
}

/// A JobSet's ranks are its proven child Jobs' admitted pods' reports; a
/// pod of a Job that is not a proven child is not counted, whatever name
/// its report claims.
#[test]
fn a_jobset_s_ranks_are_its_proven_children_s_pods() {
    let spec = json!({"replicatedJobs": [{"name": "workers", "replicas": 2,
        "template": {"spec": {"parallelism": 1, "completions": 1}}}]});
    let ranks = Ranks {
        claims: BTreeSet::from(["js-workers-0".to_string(), "js-workers-1".to_string()]),
        layout: Layout::JobSet {
            shape: JobSetShape::from_spec(&spec).unwrap(),
            members: BTreeMap::from([
                ("job0".to_string(), "workers/0".to_string()),
                ("job1".to_string(), "workers/1".to_string()),
            ]),
        },
    };
    let pods = vec![
        job_pod("w0", "job0"),
        job_pod("w1", "job1"),
        job_pod("tenant", "tenant-job"),
    ];
    let reports = vec![
        report("w0", "js-workers-0"),
        report("w1", "js-workers-1"),
        report("tenant", "js-workers-1"),
    ];
    assert_eq!(counted(&ranks, reports, pods), ["w0@0", "w1@1"]);
}
