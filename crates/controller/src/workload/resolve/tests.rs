//! Unit tests of `resolve.rs`: chains of metadata as the API server would
//! hold them, marks signed with a test key as the webhook signs them.

use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use memprof_api::admission::Key;
use std::collections::{BTreeMap, HashMap};

const NS: &str = "team-a";

fn now() -> Timestamp {
    Timestamp::from_second(1_800_000_100).unwrap()
}

fn created() -> Timestamp {
    Timestamp::from_second(1_800_000_000).unwrap()
}

fn owner(kind: WorkloadKind, name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: kind.api_version().into(),
        kind: kind.kind().into(),
        name: name.into(),
        uid: uid.into(),
        controller: Some(true),
        ..Default::default()
    }
}

fn meta(
    name: &str,
    uid: &str,
    controller: Option<OwnerReference>,
    labels: &[(&str, &str)],
) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some(NS.into()),
        uid: Some(uid.into()),
        creation_timestamp: Some(Time(created())),
        owner_references: controller.map(|o| vec![o]),
        labels: Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        ..Default::default()
    }
}

/// Marks `m` (of `kind`) as its controller's identity would have it marked.
fn marked(key: &Key, kind: WorkloadKind, mut m: ObjectMeta) -> ObjectMeta {
    let controller = m.owner_references.as_ref().unwrap()[0].uid.clone();
    let identity = link_identity(kind, &m);
    let link = Link {
        namespace: NS,
        kind: kind.kind(),
        name: m.name.as_deref().unwrap(),
        controller_uid: &controller,
        identity: &identity,
    };
    let mark = workload_mark::sign(key, &link, created()).unwrap();
    m.annotations = Some(BTreeMap::from([(
        ANNOTATION_WORKLOAD_MARK.to_string(),
        mark,
    )]));
    m
}

struct Cluster(HashMap<(WorkloadKind, String), ObjectMeta>);

impl Cluster {
    fn with(objects: Vec<(WorkloadKind, ObjectMeta)>) -> Cluster {
        Cluster(
            objects
                .into_iter()
                .map(|(k, m)| ((k, m.name.clone().unwrap()), m))
                .collect(),
        )
    }

    fn resolve(&self, start: Workload, keys: &KeyRing) -> (Result<Resolved, ResolveError>, usize) {
        let mut reads = 0;
        let mut read = |k: WorkloadKind, n: &str| {
            reads += 1;
            self.0.get(&(k, n.to_string())).cloned()
        };
        let r = super::resolve(NS, start, &mut read, keys, now());
        (r, reads)
    }
}

fn job(name: &str, uid: &str) -> Workload {
    Workload {
        kind: WorkloadKind::Job,
        name: name.into(),
        uid: uid.into(),
    }
}

const CHILD: [(&str, &str); 2] = [
    (
        memprof_api::workload::LABEL_JOBSET_REPLICATED_JOB,
        "workers",
    ),
    (memprof_api::workload::LABEL_JOBSET_JOB_INDEX, "1"),
];

#[test]
fn a_marked_trainjob_chain_rolls_up_to_the_trainjob() {
    let key = Key::generate();
    let keys = KeyRing::new(key.clone());
    let tj = meta("llm", "tj-uid", None, &[]);
    let js = marked(
        &key,
        WorkloadKind::JobSet,
        meta(
            "llm",
            "js-uid",
            Some(owner(WorkloadKind::TrainJob, "llm", "tj-uid")),
            &[],
        ),
    );
    let j = marked(
        &key,
        WorkloadKind::Job,
        meta(
            "llm-workers-1",
            "job-uid",
            Some(owner(WorkloadKind::JobSet, "llm", "js-uid")),
            &CHILD,
        ),
    );
    let cluster = Cluster::with(vec![
        (WorkloadKind::TrainJob, tj),
        (WorkloadKind::JobSet, js),
        (WorkloadKind::Job, j),
    ]);
    let (r, reads) = cluster.resolve(job("llm-workers-1", "job-uid"), &keys);
    let r = r.unwrap();
    assert_eq!(r.top.kind, WorkloadKind::TrainJob);
    assert_eq!(r.top.uid, "tj-uid");
    assert_eq!(r.chain.len(), 3);
    assert_eq!(r.unproven, None);
    assert_eq!(reads, 3, "one read per link, no more");
}

#[test]
fn a_job_alone_or_under_an_unknown_controller_is_its_own_workload() {
    let keys = KeyRing::new(Key::generate());
    let cron = OwnerReference {
        api_version: "batch/v1".into(),
        kind: "CronJob".into(),
        name: "nightly".into(),
        uid: "cron-uid".into(),
        controller: Some(true),
        ..Default::default()
    };
    let cluster = Cluster::with(vec![
        (WorkloadKind::Job, meta("alone", "a-uid", None, &[])),
        (
            WorkloadKind::Job,
            meta("nightly-1", "n-uid", Some(cron), &[]),
        ),
    ]);
    for (name, uid) in [("alone", "a-uid"), ("nightly-1", "n-uid")] {
        let r = cluster.resolve(job(name, uid), &keys).0.unwrap();
        assert_eq!(r.top, job(name, uid));
        assert_eq!(r.unproven, None);
    }
}

/// The attack: a tenant who may create Jobs creates one whose controller is
/// another team's JobSet (uid and all). Its pods get pod marks (the Job
/// controller made them), but the Job has no workload mark from the JobSet
/// controller: it is its own workload, never the JobSet's.
#[test]
fn a_job_claiming_a_jobset_it_was_not_made_by_stays_its_own_workload() {
    let key = Key::generate();
    let keys = KeyRing::new(key.clone());
    let js = meta("victim", "js-uid", None, &[]);
    let forged = meta(
        "victim-workers-9",
        "job-uid",
        Some(owner(WorkloadKind::JobSet, "victim", "js-uid")),
        &CHILD,
    );
    let cluster = Cluster::with(vec![
        (WorkloadKind::JobSet, js.clone()),
        (WorkloadKind::Job, forged),
    ]);
    let r = cluster
        .resolve(job("victim-workers-9", "job-uid"), &keys)
        .0
        .unwrap();
    assert_eq!(r.top, job("victim-workers-9", "job-uid"));
    assert!(
        matches!(
            r.unproven,
            Some(Unproven::Unmarked(LinkError::Missing { .. }))
        ),
        "{r:?}"
    );
    // A genuine child's mark copied onto it names another Job: forged.
    let genuine = marked(
        &key,
        WorkloadKind::Job,
        meta(
            "victim-workers-1",
            "g-uid",
            Some(owner(WorkloadKind::JobSet, "victim", "js-uid")),
            &CHILD,
        ),
    );
    let mut copied = meta(
        "victim-workers-9",
        "job-uid",
        Some(owner(WorkloadKind::JobSet, "victim", "js-uid")),
        &CHILD,
    );
    copied.annotations = genuine.annotations.clone();
    let cluster = Cluster::with(vec![
        (WorkloadKind::JobSet, js),
        (WorkloadKind::Job, copied),
    ]);
    let r = cluster
        .resolve(job("victim-workers-9", "job-uid"), &keys)
        .0
        .unwrap();
    assert!(
        matches!(
            r.unproven,
            Some(Unproven::Unmarked(LinkError::Forged { .. }))
        ),
        "{r:?}"
    );
}

/// A genuine child Job relabelled afterwards (to move its rank) no longer
/// proves its link: the mark binds the labels the JobSet controller set.
#[test]
fn a_relabelled_child_job_loses_its_link() {
    let key = Key::generate();
    let keys = KeyRing::new(key.clone());
    let mut j = marked(
        &key,
        WorkloadKind::Job,
        meta(
            "t-workers-1",
            "job-uid",
            Some(owner(WorkloadKind::JobSet, "t", "js-uid")),
            &CHILD,
        ),
    );
    j.labels.as_mut().unwrap().insert(
        memprof_api::workload::LABEL_JOBSET_JOB_INDEX.into(),
        "0".into(),
    );
    let cluster = Cluster::with(vec![
        (WorkloadKind::JobSet, meta("t", "js-uid", None, &[])),
        (WorkloadKind::Job, j),
    ]);
    let r = cluster
        .resolve(job("t-workers-1", "job-uid"), &keys)
        .0
        .unwrap();
    assert_eq!(r.top.kind, WorkloadKind::Job);
    assert!(matches!(
        r.unproven,
        Some(Unproven::Unmarked(LinkError::Forged { .. }))
    ));
}

#[test]
fn a_controller_gone_or_replaced_under_its_name_is_not_followed() {
    let key = Key::generate();
    let keys = KeyRing::new(key.clone());
    let j = marked(
        &key,
        WorkloadKind::Job,
        meta(
            "t-workers-1",
            "job-uid",
            Some(owner(WorkloadKind::JobSet, "t", "old-js")),
            &CHILD,
        ),
    );
    // A JobSet of that name exists, but it is another one (another uid).
    let cluster = Cluster::with(vec![
        (WorkloadKind::JobSet, meta("t", "new-js", None, &[])),
        (WorkloadKind::Job, j),
    ]);
    let r = cluster
        .resolve(job("t-workers-1", "job-uid"), &keys)
        .0
        .unwrap();
    assert_eq!(r.top.kind, WorkloadKind::Job);
    assert!(matches!(r.unproven, Some(Unproven::Gone { .. })));
    // The pod's own controller gone (or another of its name): nothing resolves.
    assert!(matches!(
        cluster.resolve(job("t-workers-1", "other-uid"), &keys).0,
        Err(ResolveError::NoController { .. })
    ));
}

/// However a tenant links objects, at most MAX_CHAIN are read: the kinds'
/// parents only go up (Job → JobSet → TrainJob), and the bound stands anyway.
#[test]
fn resolution_reads_at_most_max_chain_objects() {
    let key = Key::generate();
    let keys = KeyRing::new(key.clone());
    // A TrainJob claiming a controller: TrainJob has no parent kind, so no read.
    let tj = meta(
        "x",
        "tj-uid",
        Some(owner(WorkloadKind::TrainJob, "x", "tj-uid")),
        &[],
    );
    let js = marked(
        &key,
        WorkloadKind::JobSet,
        meta(
            "x",
            "js-uid",
            Some(owner(WorkloadKind::TrainJob, "x", "tj-uid")),
            &[],
        ),
    );
    let j = marked(
        &key,
        WorkloadKind::Job,
        meta(
            "x-workers-1",
            "job-uid",
            Some(owner(WorkloadKind::JobSet, "x", "js-uid")),
            &CHILD,
        ),
    );
    let cluster = Cluster::with(vec![
        (WorkloadKind::TrainJob, tj),
        (WorkloadKind::JobSet, js),
        (WorkloadKind::Job, j),
    ]);
    let (r, reads) = cluster.resolve(job("x-workers-1", "job-uid"), &keys);
    assert_eq!(r.unwrap().top.kind, WorkloadKind::TrainJob);
    assert!(reads <= MAX_CHAIN);
}

/// `meta` with `family` as its `memprof.dev/family` annotation, kept beside
/// any mark it carries.
fn with_family(mut m: ObjectMeta, family: &str) -> ObjectMeta {
    let family_key = memprof_api::family::ANNOTATION_FAMILY.to_string();
    let annotations = m.annotations.get_or_insert_with(Default::default);
    annotations.insert(family_key, family.into());
    m
}

/// The profile's family is the one the top-level object names, never a
/// child Job's or the JobSet's under a TrainJob; an invalid one is none.
#[test]
fn the_family_is_the_top_level_objects_own() {
    let key = Key::generate();
    let keys = KeyRing::new(key.clone());
    let tj = with_family(meta("llm", "tj-uid", None, &[]), "llama-8b");
    let js_meta = meta(
        "llm",
        "js-uid",
        Some(owner(WorkloadKind::TrainJob, "llm", "tj-uid")),
        &[],
    );
    let js = with_family(marked(&key, WorkloadKind::JobSet, js_meta), "jobset-says");
    let child = meta(
        "llm-workers-1",
        "job-uid",
        Some(owner(WorkloadKind::JobSet, "llm", "js-uid")),
        &CHILD,
    );
    let j = with_family(marked(&key, WorkloadKind::Job, child), "child-says");
    let mut objects = vec![
        (WorkloadKind::TrainJob, tj),
        (WorkloadKind::JobSet, js),
        (WorkloadKind::Job, j),
    ];
    let start = job("llm-workers-1", "job-uid");
    let r = Cluster::with(objects.clone())
        .resolve(start.clone(), &keys)
        .0;
    assert_eq!(r.unwrap().family.as_deref(), Some("llama-8b"));
    objects[0].1 = with_family(objects[0].1.clone(), "not a label value");
    let r = Cluster::with(objects.clone())
        .resolve(start.clone(), &keys)
        .0;
    assert_eq!(r.unwrap().family, None, "an invalid family is none");
    // Under a TrainJob that is gone, the JobSet is the top: its family.
    objects.remove(0);
    let r = Cluster::with(objects).resolve(start, &keys).0.unwrap();
    assert_eq!(r.top.kind, WorkloadKind::JobSet);
    assert_eq!(r.family.as_deref(), Some("jobset-says"));
}

/// The labels a workload's profile copies are the top-level object's own,
/// bounded as a Job's profile copies a Job's: a TrainJob's, never its
/// JobSet's or a child Job's; the JobSet's where it is the top.
#[test]
fn the_labels_are_the_top_level_objects_own_bounded() {
    use crate::operator::reconcile::MAX_WORKLOAD_LABELS;
    let key = Key::generate();
    let keys = KeyRing::new(key.clone());
    let own = [("team", "ml"), ("memprof.dev/job", "forged")];
    let tj = meta("llm", "tj-uid", None, &own);
    let to_tj = Some(owner(WorkloadKind::TrainJob, "llm", "tj-uid"));
    let js = meta("llm", "js-uid", to_tj, &[("team", "jobset-says")]);
    let js = marked(&key, WorkloadKind::JobSet, js);
    let mut child_labels = CHILD.to_vec();
    child_labels.push(("team", "child-says"));
    let to_js = Some(owner(WorkloadKind::JobSet, "llm", "js-uid"));
    let child = meta("llm-workers-1", "job-uid", to_js, &child_labels);
    let j = marked(&key, WorkloadKind::Job, child);
    let mut objects = vec![
        (WorkloadKind::TrainJob, tj),
        (WorkloadKind::JobSet, js),
        (WorkloadKind::Job, j),
    ];
    let start = job("llm-workers-1", "job-uid");
    let resolve = |objects: &[(WorkloadKind, ObjectMeta)]| {
        let r = Cluster::with(objects.to_vec()).resolve(start.clone(), &keys);
        r.0.unwrap()
    };
    let team = |v: &str| BTreeMap::from([("team".to_string(), v.to_string())]);
    let r = resolve(&objects);
    assert_eq!(r.top.kind, WorkloadKind::TrainJob);
    assert_eq!(*r.labels, team("ml"), "memprof's own key is not copied");
    // A TrainJob of many labels: as many as a Job's profile copies.
    let many: Vec<(String, String)> = (0..40).map(|i| (format!("k{i:02}"), "v".into())).collect();
    let many: Vec<(&str, &str)> = many.iter().map(|(k, v)| (&**k, &**v)).collect();
    objects[0].1.labels = meta("llm", "tj-uid", None, &many).labels;
    assert_eq!(resolve(&objects).labels.len(), MAX_WORKLOAD_LABELS);
    // Under a TrainJob that is gone, the JobSet is the top: its labels.
    objects.remove(0);
    let r = resolve(&objects);
    assert_eq!(r.top.kind, WorkloadKind::JobSet);
    assert_eq!(*r.labels, team("jobset-says"));
}
