//! Unit tests of `workload_index.rs`: the kept roll-up of a PyTorchJob fed
//! event by event agrees with the from-scratch roll-up
//! (`workload::rollup::roll_up`, the trust rules' one statement) after
//! every change, and a JobSet's ranks are handed on without a copy until
//! its members change. Marks are signed with a test key as the webhook
//! signs them; the caches are filled as the watches fill them.

use super::*;
use crate::workload::rank::{JobSetShape, PyTorchShape};
use crate::workload::rollup::roll_up;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::runtime::reflector::{store::Writer, Store};
use kube::runtime::watcher::Event;
use memprof_api::admission::Key;
use memprof_api::workload::{
    LABEL_JOBSET_JOB_INDEX, LABEL_JOBSET_REPLICATED_JOB, LABEL_PYTORCH_REPLICA_INDEX,
    LABEL_PYTORCH_REPLICA_TYPE,
};
use memprof_api::workload_mark::{self, Link, ANNOTATION_WORKLOAD_MARK};
use memprof_api::{DataSource, GpuReport, MemoryReport, MemoryReportSpec, RiskLevel};
use serde_json::json;
use std::sync::LazyLock;

const NS: &str = "team-a";
const GIB: u64 = 1 << 30;
static KEY: LazyLock<Key> = LazyLock::new(Key::generate);

fn ts(s: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + s).unwrap()
}

fn keys() -> KeyRing {
    KeyRing::new(KEY.clone())
}

/// The caches, and their writers (what the watches would apply).
struct Fixture {
    caches: Caches,
    pytorch_pods: Store<Pod>,
    jobs: Writer<Job>,
    reports: Writer<MemoryReport>,
    pytorch_pods_w: Writer<Pod>,
}

impl Fixture {
    fn new() -> Self {
        let (jobs, jobs_w) = kube::runtime::reflector::store();
        let (reports, reports_w) = kube::runtime::reflector::store();
        let (pytorch_pods, pytorch_pods_w) = kube::runtime::reflector::store();
        let caches = Caches {
            jobs,
            profiles: kube::runtime::reflector::store().0,
            reports,
            pods: kube::runtime::reflector::store().0,
            policies: kube::runtime::reflector::store().0,
            ready: vec![],
        };
        Fixture {
            caches,
            pytorch_pods,
            jobs: jobs_w,
            reports: reports_w,
            pytorch_pods_w,
        }
    }

    fn src(&self) -> Sources<'_> {
        Sources {
            caches: &self.caches,
            pytorch_pods: &self.pytorch_pods,
        }
    }
}

/// A pod the training operator created for PyTorchJob `uid` (`marked`),
/// or a tenant's copy of one (unmarked), labelled with the PyTorchJob's name.
fn pytorch_pod(name: &str, uid: &str, (rtype, i): (&str, u32), marked: bool) -> Pod {
    let mut m = ObjectMeta {
        name: Some(name.into()),
        namespace: Some(NS.into()),
        uid: Some(format!("{name}-uid")),
        creation_timestamp: Some(Time(ts(0))),
        owner_references: Some(vec![OwnerReference {
            api_version: WorkloadKind::PyTorchJob.api_version().into(),
            kind: WorkloadKind::PyTorchJob.kind().into(),
            name: "pt".into(),
            uid: uid.into(),
            controller: Some(true),
            ..Default::default()
        }]),
        labels: Some(BTreeMap::from([
            (LABEL_TRAINING_JOB_NAME.to_string(), "pt".to_string()),
            (LABEL_PYTORCH_REPLICA_TYPE.to_string(), rtype.to_string()),
            (LABEL_PYTORCH_REPLICA_INDEX.to_string(), i.to_string()),
        ])),
        ..Default::default()
    };
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
    Pod {
        metadata: m,
        ..Default::default()
    }
}

/// The report `pod`'s sidecar writes, claiming `job`, with `peak_gib` on its GPU.
fn report(pod: &str, job: &str, peak_gib: u64) -> MemoryReport {
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
        sampled_at: ts(10).to_string(),
        gpus: vec![gpu],
        ..Default::default()
    };
    let mut r = MemoryReport::new(pod, spec);
    r.metadata.namespace = Some(NS.into());
    r.metadata.labels = Some(BTreeMap::from([(LABEL_JOB.to_string(), job.to_string())]));
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

/// The status the from-scratch roll-up of every cached report claiming
/// "pt" and every cached pod of "pt" calls for: what the kept one must equal.
fn from_scratch(f: &Fixture, layout: &Layout, now: Timestamp) -> MemoryProfileStatus {
    let reports = f
        .caches
        .reports
        .state_filter(|r| r.labels().get(LABEL_JOB).map(String::as_str) == Some("pt"));
    let pods = f.pytorch_pods.state();
    let refs: Vec<&MemoryReport> = reports.iter().map(|r| r.as_ref()).collect();
    let metas: HashMap<&str, &ObjectMeta> = pods
        .iter()
        .map(|p| (p.metadata.name.as_deref().unwrap(), &p.metadata))
        .collect();
    let out = roll_up(&refs, &metas, layout, &keys(), now);
    let (mut desired, _) = desired_of(&out.rollup, &out.refused, None, now);
    out.evidence.apply(&mut desired.status, layout.ranks());
    desired.status
}

/// A PyTorchJob of a master and two workers, its roll-up kept and fed
/// only what each event names (as the dispatcher notes it), agrees with
/// the from-scratch roll-up after every change: a tenant's unmarked pod
/// never counts, a genuine pod relabelled to another rank stops counting
/// on its pod's event, a report deleted leaves, a pod deleted takes its
/// report's count with it; and the risk level is held for its dwell once
/// the last report showing it leaves.
#[test]
fn a_pytorchjob_s_kept_roll_up_agrees_with_the_from_scratch_one_after_every_event() {
    let mut f = Fixture::new();
    let (layout, pods) = pytorchjob_of_three(&mut f);
    let uid = "pt-uid";
    let workload = Workload {
        kind: WorkloadKind::PyTorchJob,
        name: "pt".into(),
        uid: uid.into(),
    };
    let mut t = WorkloadTracked::new(&workload, layout.clone());
    let now = ts(20);
    t.full(&f.src(), NS, &keys(), now);
    let kept = |t: &WorkloadTracked| t.desired(None, now).0.status;
    let first = kept(&t);
    assert_eq!(first, from_scratch(&f, &layout, now));
    assert_eq!(
        (first.ranks.as_str(), first.risk),
        ("2/3", RiskLevel::Low),
        "the tenant's unmarked worker (79 GiB, high) does not count"
    );

    // The genuine worker 0 relabelled to rank 2: its mark no longer
    // verifies. Its pod's event names it; only its report is screened.
    let mut moved = pods[1].clone();
    let labels = moved.metadata.labels.as_mut().unwrap();
    labels.insert(LABEL_PYTORCH_REPLICA_INDEX.into(), "1".into());
    f.pytorch_pods_w.apply_watcher_event(&Event::Apply(moved));
    t.apply(&f.src(), NS, "pt", "pt-worker-0", &keys(), now);
    assert_eq!(kept(&t), from_scratch(&f, &layout, now));
    assert_eq!(kept(&t).ranks, "1/3");

    // The master's report deleted, then the (tenant's) worker 1's pod.
    let gone = report("pt-master-0", "pt", 40);
    f.reports.apply_watcher_event(&Event::Delete(gone));
    t.apply(&f.src(), NS, "pt", "pt-master-0", &keys(), now);
    f.pytorch_pods_w
        .apply_watcher_event(&Event::Delete(pods[2].clone()));
    t.apply(&f.src(), NS, "pt", "pt-worker-1", &keys(), now);
    let (mut last, mut fresh) = (kept(&t), from_scratch(&f, &layout, now));
    assert_eq!(last.ranks, "0/3");
    // Only the risk differs: the kept roll-up holds the level its reports
    // showed for the dwell (a roll-up built afresh on every event, as
    // before, forgot it at once), as a Job's does.
    assert_eq!((last.risk, fresh.risk), (RiskLevel::Low, RiskLevel::None));
    assert!(last.risk_held_until.is_some());
    (last.risk, last.risk_held_until) = (fresh.risk, None);
    fresh.risk_held_until = None;
    assert_eq!(last, fresh);
}

/// PyTorchJob `pt` (uid `pt-uid`) of a master and two workers in the
/// caches, each pod with its report (peaks 40, 50 and 79 GiB); worker 1's
/// pod is a tenant's, with no mark. Its layout and the three pods.
fn pytorchjob_of_three(f: &mut Fixture) -> (Layout, [Pod; 3]) {
    let uid = "pt-uid";
    let shape = PyTorchShape::from_spec(&json!({"pytorchReplicaSpecs":
        {"Master": {"replicas": 1}, "Worker": {"replicas": 2}}}))
    .unwrap();
    let pods = [
        pytorch_pod("pt-master-0", uid, ("master", 0), true),
        pytorch_pod("pt-worker-0", uid, ("worker", 0), true),
        pytorch_pod("pt-worker-1", uid, ("worker", 1), false),
    ];
    for (pod, peak) in pods.iter().zip([40, 50, 79]) {
        f.pytorch_pods_w
            .apply_watcher_event(&Event::Apply(pod.clone()));
        let r = report(pod.metadata.name.as_deref().unwrap(), "pt", peak);
        f.reports.apply_watcher_event(&Event::Apply(r));
    }
    let layout = Layout::PyTorchJob {
        uid: uid.into(),
        shape,
    };
    (layout, pods)
}

/// A child Job of JobSet `js_uid`, index `i`, with the workload mark the
/// webhook gives the JobSet controller's Jobs.
fn child_job(i: u32, js_uid: &str) -> Job {
    let name = format!("js-workers-{i}");
    let identity = format!("workers/{i}");
    let link = Link {
        namespace: NS,
        kind: "Job",
        name: &name,
        controller_uid: js_uid,
        identity: &identity,
    };
    let mark = workload_mark::sign(&KEY, &link, ts(0)).unwrap();
    let metadata = ObjectMeta {
        name: Some(name.clone()),
        namespace: Some(NS.into()),
        uid: Some(format!("{name}-uid")),
        resource_version: Some("1".into()),
        creation_timestamp: Some(Time(ts(0))),
        labels: Some(BTreeMap::from([
            (LABEL_JOBSET_NAME.to_string(), "js".to_string()),
            (LABEL_JOBSET_REPLICATED_JOB.into(), "workers".into()),
            (LABEL_JOBSET_JOB_INDEX.into(), i.to_string()),
        ])),
        annotations: Some(BTreeMap::from([(
            ANNOTATION_WORKLOAD_MARK.to_string(),
            mark,
        )])),
        owner_references: Some(vec![OwnerReference {
            api_version: WorkloadKind::JobSet.api_version().into(),
            kind: WorkloadKind::JobSet.kind().into(),
            name: "js".into(),
            uid: js_uid.into(),
            controller: Some(true),
            ..Default::default()
        }]),
        ..Default::default()
    };
    Job {
        metadata,
        ..Default::default()
    }
}

/// A JobSet's ranks (every proven child Job) are built once and handed on
/// as the same `Arc` by every reconcile that changes no member: a child
/// Job's reconcile must not copy the whole JobSet (at 2,048 child Jobs of
/// one pod that copy was most of a report event's cost). A child that
/// joins, and a resize, give new ranks.
#[test]
fn a_jobset_s_ranks_are_built_again_only_when_its_members_or_layout_change() {
    let mut f = Fixture::new();
    let js_uid = "js-uid";
    let spec = |replicas: u32| {
        json!({"replicatedJobs": [{"name": "workers", "replicas": replicas,
            "template": {"spec": {"parallelism": 1, "completions": 1}}}]})
    };
    let layout = |replicas| Layout::JobSet {
        shape: JobSetShape::from_spec(&spec(replicas)).unwrap(),
        members: BTreeMap::new(),
    };
    for i in 0..2 {
        f.jobs
            .apply_watcher_event(&Event::Apply(child_job(i, js_uid)));
    }
    let workload = Workload {
        kind: WorkloadKind::JobSet,
        name: "js".into(),
        uid: js_uid.into(),
    };
    let mut t = WorkloadTracked::new(&workload, layout(3));
    let now = ts(20);
    t.full(&f.src(), NS, &keys(), now);
    let first = t.ranks();
    assert_eq!(first.claims.len(), 2, "both children proven");
    // Reconciles of a known child (unchanged in the cache) and its reports.
    let (key, job) = (JobKey::new(NS, "js-workers-0"), child_job(0, js_uid));
    for _ in 0..3 {
        t.check_child(&f.src(), (&key, &job), &keys(), now);
        t.apply(&f.src(), NS, "js-workers-0", "js-workers-0-0", &keys(), now);
        assert!(Arc::ptr_eq(&first, &t.ranks()), "no copy per reconcile");
    }
    // A third child joins: new ranks, which then stay.
    let (key, job) = (JobKey::new(NS, "js-workers-2"), child_job(2, js_uid));
    t.check_child(&f.src(), (&key, &job), &keys(), now);
    let joined = t.ranks();
    assert!(!Arc::ptr_eq(&first, &joined));
    assert_eq!(joined.claims.len(), 3);
    assert!(Arc::ptr_eq(&joined, &t.ranks()));
    // Resized: new ranks with the new layout.
    assert!(t.set_layout(&layout(4)));
    let resized = t.ranks();
    assert!(!Arc::ptr_eq(&joined, &resized));
    assert_eq!(resized.layout.ranks(), 4);
}

/// An impossible report (more used than the GPU holds) is kept out of the
/// recommendation's evidence as the roll-up keeps it out of its counts,
/// kept and from scratch alike: it sizes no request.
#[test]
fn an_impossible_report_sizes_no_request() {
    let mut f = Fixture::new();
    let (layout, _) = pytorchjob_of_three(&mut f);
    let impossible = report("pt-master-0", "pt", 90);
    f.reports.apply_watcher_event(&Event::Apply(impossible));
    let workload = Workload {
        kind: WorkloadKind::PyTorchJob,
        name: "pt".into(),
        uid: "pt-uid".into(),
    };
    let mut t = WorkloadTracked::new(&workload, layout.clone());
    let now = ts(20);
    t.full(&f.src(), NS, &keys(), now);
    let kept = t.desired(None, now).0.status;
    let roles: Vec<(&str, u32)> = kept
        .recommendation
        .iter()
        .map(|r| (r.role.as_str(), r.basis.ranks))
        .collect();
    assert_eq!(
        roles,
        [("Worker", 1)],
        "the master's impossible report counted"
    );
    assert_eq!(kept, from_scratch(&f, &layout, now));
}
