//! Unit tests of `trust.rs`: screening on plain values, marks signed with a
//! test key as the webhook signs them.

use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use memprof_api::admission::Key;
use memprof_api::MemoryReportSpec;
use std::sync::LazyLock;

const JOB: &str = "job-uid";
const NS: &str = "team-a";
static KEY: LazyLock<Key> = LazyLock::new(Key::generate);

fn ts(s: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + s).unwrap()
}

fn ring() -> KeyRing {
    KeyRing::new(KEY.clone())
}

/// A pod the Job controller created (marked by the webhook) at `created`.
fn pod(name: &str, job_uid: &str, created: i64) -> ObjectMeta {
    let subject = Subject {
        namespace: NS,
        pod: name,
        job_uid,
    };
    let mark = admission::sign(&KEY, &subject, ts(created));
    let mut meta = unmarked(name, job_uid, created);
    meta.annotations = Some([(ANNOTATION_ADMISSION.to_string(), mark)].into());
    meta
}

/// A pod that claims the Job, created by someone else (no mark).
fn unmarked(name: &str, job_uid: &str, created: i64) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some(NS.into()),
        uid: Some(format!("{name}-uid")),
        creation_timestamp: Some(Time(ts(created))),
        owner_references: Some(vec![OwnerReference {
            api_version: "batch/v1".into(),
            kind: "Job".into(),
            name: "train".into(),
            uid: job_uid.into(),
            controller: Some(true),
            ..Default::default()
        }]),
        ..Default::default()
    }
}

fn report(pod: &str, rank: Option<u32>, sampled: i64) -> MemoryReport {
    let mut r = MemoryReport::new(
        pod,
        MemoryReportSpec {
            pod_name: pod.into(),
            rank,
            sampled_at: ts(sampled).to_string(),
            ..Default::default()
        },
    );
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

fn run<'a>(reports: &[&'a MemoryReport], pods: &[ObjectMeta], parallelism: u32) -> Screened<'a> {
    let facts: HashMap<&str, PodFacts<'_>> = pods.iter().filter_map(PodFacts::of).collect();
    screen(reports, &facts, JOB, parallelism, &ring(), ts(100))
}

fn names(s: &Screened<'_>) -> Vec<String> {
    s.counted
        .iter()
        .map(|r| r.metadata.name.clone().unwrap())
        .collect()
}

fn refused_for(r: &MemoryReport, pods: &[ObjectMeta]) -> String {
    let s = run(&[r], pods, 4);
    assert!(s.counted.is_empty(), "{:?}", s.counted);
    assert_eq!(s.refused.len(), 1);
    s.refused[0].why.clone()
}

#[test]
fn a_pods_own_report_counts() {
    let r = report("train-0", Some(0), 90);
    let s = run(&[&r], &[pod("train-0", JOB, 0)], 1);
    assert_eq!(names(&s), ["train-0"]);
    assert!(s.refused.is_empty());
}

#[test]
fn forged_reports_are_refused_with_the_reason() {
    let pods = [pod("train-0", JOB, 0), pod("other-0", "other-job", 0)];
    // Named after another pod than it describes.
    let mut renamed = report("train-0", Some(0), 90);
    renamed.metadata.name = Some("evil".into());
    // For a pod that does not exist.
    let ghost = report("ghost-0", Some(1), 90);
    // For a pod of another Job, labelled for this one.
    let foreign = report("other-0", Some(2), 90);
    // Not owned by its pod.
    let mut unowned = report("train-0", Some(0), 90);
    unowned.metadata.owner_references = None;
    // From the future.
    let future = report("train-0", Some(0), 100 + 61);
    for (r, why) in [
        (&renamed, "not its pod's own report"),
        (&ghost, "does not exist"),
        (&foreign, "not controlled by this Job"),
        (&unowned, "not owned by pod"),
        (&future, "in the future"),
    ] {
        let refused = refused_for(r, &pods);
        assert!(refused.contains(why), "{refused}");
    }
    // Within the skew is fine.
    let near = report("train-0", Some(0), 100 + 59);
    let s = run(&[&near], &pods, 4);
    assert_eq!(s.counted.len(), 1);
}

#[test]
fn a_pod_claiming_the_job_without_its_controllers_mark_never_counts() {
    let r = report("planted", Some(0), 90);
    // Owner reference and everything else right, but no mark: a pod anyone could create.
    let why = refused_for(&r, &[unmarked("planted", JOB, 0)]);
    assert!(why.contains("has no memprof.dev/admission mark"), "{why}");
    // A genuine pod's mark copied onto it.
    let genuine = pod("train-0", JOB, 0);
    let mut copied = unmarked("planted", JOB, 0);
    copied.annotations = genuine.annotations.clone();
    let why = refused_for(&r, &[copied]);
    assert!(why.contains("not issued for this pod and Job"), "{why}");
    // Marked with another key (another operator's, or a rotated-out one).
    let mut foreign = unmarked("planted", JOB, 0);
    let other = admission::sign(
        &Key::generate(),
        &Subject {
            namespace: NS,
            pod: "planted",
            job_uid: JOB,
        },
        ts(0),
    );
    foreign.annotations = Some([(ANNOTATION_ADMISSION.to_string(), other)].into());
    assert!(refused_for(&r, &[foreign]).contains("not issued for this pod and Job"));
}

#[test]
fn a_mark_replayed_on_a_later_pod_of_the_same_name_never_counts() {
    let r = report("train-0", Some(0), 90);
    // The mark of a pod created at 0, on a pod of that name created at 30.
    let mut later = pod("train-0", JOB, 0);
    later.creation_timestamp = Some(Time(ts(30)));
    let why = refused_for(&r, &[later]);
    assert!(why.contains("outside the window"), "{why}");
}

#[test]
fn a_pod_being_deleted_never_counts() {
    let r = report("train-0", Some(0), 90);
    let mut held = pod("train-0", JOB, 0);
    held.deletion_timestamp = Some(Time(ts(50)));
    assert!(refused_for(&r, &[held]).contains("is being deleted"));
}

#[test]
fn nothing_counts_before_the_key_is_loaded() {
    let r = report("train-0", Some(0), 90);
    let meta = pod("train-0", JOB, 0);
    let facts = PodFacts::of(&meta).unwrap().1;
    assert_eq!(check(&r, Some(&facts), JOB, &ring(), ts(100)), Ok(()));
    let unloaded = check(&r, Some(&facts), JOB, &KeyRing::default(), ts(100));
    assert!(matches!(unloaded, Err(Rejection::NotAdmitted(_))));
}

#[test]
fn only_admitted_pods_are_oom_evidence() {
    let mk = |meta: ObjectMeta| Pod {
        metadata: meta,
        ..Default::default()
    };
    let pods = [
        mk(pod("train-0", JOB, 0)),
        mk(unmarked("planted", JOB, 0)),
        mk(pod("other-0", "other-job", 0)),
    ];
    let ok = admitted(&pods, JOB, &ring(), ts(100));
    let names: Vec<_> = ok.iter().map(|a| a.pod().metadata.name.clone()).collect();
    assert_eq!(names, [Some("train-0".to_string())]);
    assert_eq!(ok[0].job_uid(), JOB);
}

#[test]
fn a_slimmed_pod_keeps_its_mark_and_nothing_else_of_its_creators_annotations() {
    let mut meta = pod("train-0", JOB, 0);
    let a = meta.annotations.as_mut().unwrap();
    a.insert("tenant/blob".into(), "x".repeat(250_000));
    a.insert(COMPLETION_INDEX.into(), "3".into());
    slim_pod_annotations(&mut meta);
    let a = meta.annotations.as_ref().unwrap();
    assert_eq!(a.len(), 2, "{:?}", a.keys());
    let facts = PodFacts::of(&meta).unwrap().1;
    assert_eq!(admit(&facts, JOB, &ring(), ts(100)), Ok(()));
    // An oversized "mark" is not kept (and would not verify).
    let mut big = pod("train-0", JOB, 0);
    big.annotations = Some([(ANNOTATION_ADMISSION.to_string(), "v".repeat(1 << 20))].into());
    slim_pod_annotations(&mut big);
    assert!(big.annotations.unwrap().is_empty());
}

#[test]
fn a_retried_pods_leftover_report_does_not_count_as_another_rank() {
    let pods = [pod("train-0-a", JOB, 0), pod("train-0-b", JOB, 50)];
    let old = report("train-0-a", Some(0), 95);
    let new = report("train-0-b", Some(0), 90);
    let s = run(&[&old, &new], &pods, 1);
    assert_eq!(names(&s), ["train-0-b"], "the newer pod's report wins");
    assert_eq!(s.superseded, 1);
}

/// A Job that is not Indexed (no ranks), parallelism 1: the attempt that
/// failed (kept as a Failed pod, its last report critical) is superseded by
/// its replacement's report, as a rank's leftover is.
#[test]
fn without_ranks_a_failed_attempts_report_is_superseded_by_its_replacements() {
    let pods = [pod("train-a", JOB, 0), pod("train-b", JOB, 50)];
    let failed = report("train-a", None, 95);
    let retry = report("train-b", None, 90);
    let s = run(&[&failed, &retry], &pods, 1);
    assert_eq!(names(&s), ["train-b"]);
    assert_eq!(s.superseded, 1);
    // Two interchangeable pods at parallelism 2 both count.
    let s = run(&[&failed, &retry], &pods, 2);
    assert_eq!(s.counted.len(), 2);
}

#[test]
fn reports_beyond_what_the_job_can_have_are_not_counted() {
    let pods: Vec<_> = (0..10).map(|i| pod(&format!("p{i}"), JOB, i)).collect();
    let reports: Vec<_> = (0..10)
        .map(|i| report(&format!("p{i}"), Some(i as u32), 90))
        .collect();
    let refs: Vec<&MemoryReport> = reports.iter().collect();
    let s = run(&refs, &pods, 1);
    assert_eq!(s.counted.len(), report_limit(1));
    assert_eq!(s.over_limit, 10 - report_limit(1));
    // The newest pods are the ones kept.
    assert!(names(&s).contains(&"p9".to_string()));
    assert!(!names(&s).contains(&"p0".to_string()));
}

/// A pod under the Job's own service account writes the victim pod's report
/// (same name, same owner): without the writer mark the webhook gives only
/// the report's own pod, it does not count; nor does a genuine report whose
/// content was changed after it was marked (the checkpoint or an
/// acknowledgement inside it included).
#[test]
fn a_report_its_pod_did_not_write_does_not_count() {
    let pods = [pod("train-0", JOB, 0)];
    let genuine = report("train-0", Some(0), 50);
    assert_eq!(names(&run(&[&genuine], &pods, 1)), ["train-0"]);

    let mut unmarked = genuine.clone();
    unmarked.metadata.annotations = None;
    let s = run(&[&unmarked], &pods, 1);
    assert!(s.counted.is_empty());
    assert!(
        s.refused[0].why.contains("no memprof.dev/writer mark"),
        "{:?}",
        s.refused
    );

    let mut edited = genuine.clone();
    edited.spec.last_checkpoint = Some(memprof_api::Checkpoint {
        step: Some(999_999),
        ..Default::default()
    });
    let s = run(&[&edited], &pods, 1);
    assert!(s.counted.is_empty());
    assert!(
        s.refused[0].why.contains("does not match its content"),
        "{:?}",
        s.refused
    );

    // A mark the webhook gave another pod's write, copied onto the victim's.
    let mut other = report("train-1", Some(0), 50);
    other.metadata.name = Some("train-0".into());
    other.spec.pod_name = "train-0".into();
    other.metadata.owner_references = genuine.metadata.owner_references.clone();
    let s = run(&[&other], &pods, 1);
    assert!(s.counted.is_empty(), "{:?}", s.refused);
}
