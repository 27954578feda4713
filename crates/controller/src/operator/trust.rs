//! Which MemoryReports and pods count for a Job: pure screening, shared by
//! the roll-up and remediation, so that nothing a tenant could forge ever
//! steers the operator.
//!
//! Why: any pod of the service account the reporter Role is bound to (often
//! `default`, so often every pod of the namespace) can write a MemoryReport
//! with any `memprof.dev/job` label, and anyone who may create pods can
//! create one that names any Job as its controller, with the Job's labels.
//! Labels and owner references are claims. What the cluster vouches for is
//! who created the pod: the webhook marks the pods the Job controller
//! creates (`memprof_api::admission`), under a key only the operator holds.
//!
//! A pod is the Job's ([`admit`]) only if
//! 1. its controller owner reference is the Job (by uid): the Job controller
//!    still counts it (it drops the reference when it releases a pod);
//! 2. it is not being deleted (a pod held by a finalizer after the Job
//!    controller deleted it as excess never counts);
//! 3. it carries an admission mark that verifies for (namespace, name, Job
//!    uid) under the operator's key, issued when the pod was created.
//!
//! A report counts ([`check`]) only if
//! 1. it is its pod's own: `metadata.name == spec.podName`;
//! 2. that pod exists and is the Job's (above);
//! 3. the report is owned by that pod (the sidecar sets the ownerReference);
//! 4. that pod wrote it: its writer mark (`memprof_api::writer`) verifies
//!    for what it holds, written with that pod's bound token. Any pod may
//!    run under the Job's service account, so the account proves nothing;
//!    the checkpoint and acknowledgements inside a report count with it;
//! 5. its `sampledAt` parses and is not in the future (more than `MAX_SKEW`).
//!
//! Then, among reports that pass ([`screen`]):
//! 6. one per rank: a retried pod's leftover report (an earlier pod of the
//!    same rank) is superseded by the newest pod's; without ranks (a Job
//!    that is not Indexed) the newest `parallelism` pods' reports, so a
//!    failed attempt's is superseded by its replacement's;
//! 7. at most `report_limit(parallelism)` of them (the newest first), so a
//!    Job cannot be made to carry more ranks than it can have.
//!
//! Rejected reports (1–5) are named in the `ReportsValid` condition and never
//! acted on; superseded and excess ones (6–7) are counted in `ReportsCounted`.
//! OOM evidence is read only from pods that pass [`admit`] ([`Admitted`]).

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use memprof_api::admission::{
    self, KeyRing, MarkError, Subject, ANNOTATION_ADMISSION, MAX_MARK_LEN,
};
use memprof_api::writer::{self, WriterError, Written, ANNOTATION_WRITER};
use memprof_api::MemoryReport;
use std::collections::{BTreeMap, HashMap};

/// Annotation of a cached report (never of a stored one): the digest of its
/// spec as written, before the cache slimmed it, which its writer mark must
/// verify for (`pipeline::slim::report` sets it).
pub const ANNOTATION_SPEC_DIGEST: &str = "memprof.dev/spec-digest";

/// How far in the future a `sampledAt` may be (clock skew between nodes).
pub const MAX_SKEW: SignedDuration = SignedDuration::from_secs(60);

/// Most reports counted for a Job of `parallelism` pods: retries and
/// restarts briefly leave more pods than `parallelism`, never many more.
pub fn report_limit(parallelism: u32) -> usize {
    (parallelism as usize).saturating_mul(2).saturating_add(4)
}

/// What screening needs of a pod: part of its metadata. Keep exactly these
/// in a slimmed pod cache (the mark is one annotation, at most 96 bytes read).
#[derive(Clone, Debug, Default)]
pub struct PodFacts<'a> {
    /// Namespace of the pod.
    pub namespace: &'a str,
    /// Name of the pod.
    pub name: &'a str,
    /// uid of the pod.
    pub uid: &'a str,
    /// uid of the Job controlling it, if a Job does.
    pub job_uid: Option<&'a str>,
    /// When it was created.
    pub created: Option<Timestamp>,
    /// It has a `deletionTimestamp`.
    pub deleting: bool,
    /// Its `memprof.dev/admission` annotation.
    pub mark: Option<&'a str>,
}

impl<'a> PodFacts<'a> {
    /// The facts of a pod's metadata, keyed by its name.
    pub fn of(meta: &'a ObjectMeta) -> Option<(&'a str, PodFacts<'a>)> {
        let name = meta.name.as_deref()?;
        let job_uid = meta
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true) && o.kind == "Job" && o.api_version == "batch/v1")
            .map(|o| o.uid.as_str());
        let mark = meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_ADMISSION));
        Some((
            name,
            PodFacts {
                namespace: meta.namespace.as_deref().unwrap_or_default(),
                name,
                uid: meta.uid.as_deref().unwrap_or_default(),
                job_uid,
                created: meta.creation_timestamp.as_ref().map(|t| t.0),
                deleting: meta.deletion_timestamp.is_some(),
                mark: mark.map(String::as_str),
            },
        ))
    }
}

/// Pod annotation of Indexed Jobs' pods (the rank OOM records carry).
const COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";

/// Keeps of a cached pod's annotations only what screening and OOM
/// detection read, bounded: the admission mark and the completion index.
/// (Every other annotation is the pod creator's, of any size.)
pub fn slim_pod_annotations(meta: &mut ObjectMeta) {
    meta.managed_fields = None;
    if let Some(a) = meta.annotations.as_mut() {
        a.retain(|k, v| match k.as_str() {
            ANNOTATION_ADMISSION => v.len() <= MAX_MARK_LEN,
            COMPLETION_INDEX => v.len() <= 10,
            _ => false,
        });
    }
}

/// Why a report or a pod does not count for a Job.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// The report describes another pod than it is named after.
    #[error("not its pod's own report: named {name:?} but describes pod {pod:?}")]
    NotOwnReport {
        /// `metadata.name`.
        name: String,
        /// `spec.podName`.
        pod: String,
    },
    /// No such pod (in the cache).
    #[error("pod {0} does not exist")]
    NoSuchPod(String),
    /// The pod's controller is not this Job (or none).
    #[error("pod {0} is not controlled by this Job")]
    NotControlled(String),
    /// The pod is being deleted: the Job controller no longer counts it.
    #[error("pod {0} is being deleted")]
    Deleting(String),
    /// The pod's admission mark is missing or does not verify.
    #[error(transparent)]
    NotAdmitted(#[from] MarkError),
    /// The report is not owned by its pod.
    #[error("not owned by pod {pod} (uid {uid})")]
    NotOwnedByPod {
        /// The pod.
        pod: String,
        /// Its uid.
        uid: String,
    },
    /// Its pod did not write it (or not what it now holds).
    #[error(transparent)]
    NotWrittenByPod(#[from] WriterError),
    /// `sampledAt` does not parse.
    #[error("sampledAt is not an RFC 3339 time")]
    BadTime,
    /// `sampledAt` is later than now plus [`MAX_SKEW`].
    #[error("sampledAt {0} is in the future")]
    Future(Timestamp),
}

/// Whether `pod` is Job `job_uid`'s own (module docs, pod rules 1–3).
/// Pure and O(1): at most two HMACs.
pub fn admit(
    pod: &PodFacts<'_>,
    job_uid: &str,
    keys: &KeyRing,
    now: Timestamp,
) -> Result<(), Rejection> {
    if pod.job_uid != Some(job_uid) {
        return Err(Rejection::NotControlled(pod.name.into()));
    }
    let subject = Subject {
        namespace: pod.namespace,
        pod: pod.name,
        job_uid,
    };
    // The API server always sets creationTimestamp; without one no window holds.
    let created = pod.created.unwrap_or(Timestamp::MIN);
    admission::verify(keys, pod.mark, &subject, created, now)?;
    // After the mark: a forged pod the Job controller deleted as excess is
    // named for what it is, not for being deleted.
    if pod.deleting {
        return Err(Rejection::Deleting(pod.name.into()));
    }
    Ok(())
}

/// Whether `report` counts for Job `job_uid`, `pod` being the facts of the
/// pod it names (`None`: no such pod). Module docs, report rules 1–4. Pure, O(1).
pub fn check(
    report: &MemoryReport,
    pod: Option<&PodFacts<'_>>,
    job_uid: &str,
    keys: &KeyRing,
    now: Timestamp,
) -> Result<(), Rejection> {
    let name = report.metadata.name.as_deref().unwrap_or_default();
    let pod_name = report.spec.pod_name.as_str();
    if name != pod_name {
        return Err(Rejection::NotOwnReport {
            name: name.into(),
            pod: pod_name.into(),
        });
    }
    let facts = pod.ok_or_else(|| Rejection::NoSuchPod(pod_name.into()))?;
    admit(facts, job_uid, keys, now)?;
    check_written(report, facts, keys, now)
}

/// Report rules 3–5 for a report of `pod`, whose pod rules the caller
/// checked (here [`admit`]; a PyTorchJob's pods, `workload::pods`). O(1).
pub fn check_written(
    report: &MemoryReport,
    facts: &PodFacts<'_>,
    keys: &KeyRing,
    now: Timestamp,
) -> Result<(), Rejection> {
    let pod_name = report.spec.pod_name.as_str();
    let owned = report
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "Pod" && o.uid == facts.uid);
    if !owned {
        return Err(Rejection::NotOwnedByPod {
            pod: pod_name.into(),
            uid: facts.uid.into(),
        });
    }
    written_by(report, facts, keys, now)?;
    let sampled: Timestamp = report
        .spec
        .sampled_at
        .parse()
        .map_err(|_| Rejection::BadTime)?;
    if sampled > now + MAX_SKEW {
        return Err(Rejection::Future(sampled));
    }
    Ok(())
}

/// Report rule 4: the writer mark verifies for the report's content as the
/// cache received it (`slim::report` keeps its digest) written by `pod`.
fn written_by(
    report: &MemoryReport,
    pod: &PodFacts<'_>,
    keys: &KeyRing,
    now: Timestamp,
) -> Result<(), WriterError> {
    let annotations = report.metadata.annotations.as_ref();
    let get = |k: &str| annotations.and_then(|a| a.get(k)).map(String::as_str);
    // A report not from the cache (a caller that read it itself) is digested here.
    let digest = match get(ANNOTATION_SPEC_DIGEST) {
        Some(d) => d.to_string(),
        None => writer::spec_digest(&report.spec),
    };
    let written = Written {
        namespace: pod.namespace,
        report: pod.name,
        pod_uid: pod.uid,
        digest: &digest,
    };
    writer::verify(keys, get(ANNOTATION_WRITER), &written, now)
}

/// A pod that passed [`admit`] for a Job: the only kind of pod whose
/// container statuses are OOM evidence (`remediation::oom::detect`).
#[derive(Clone, Copy, Debug)]
pub struct Admitted<'p> {
    pod: &'p Pod,
    job_uid: &'p str,
}

impl<'p> Admitted<'p> {
    /// The pod.
    pub fn pod(&self) -> &'p Pod {
        self.pod
    }

    /// uid of the Job it belongs to.
    pub fn job_uid(&self) -> &'p str {
        self.job_uid
    }

    /// A rank's pod of a top-level workload (JobSet, TrainJob, PyTorchJob)
    /// that the workload's roll-up proves its own (`remediation::Ranks::counted`:
    /// its marks, its rank inside the layout, its report its own write): OOM
    /// evidence of workload `workload_uid`, as an admitted pod is of its Job.
    /// Only the pods `Ranks::counted` returns may be passed.
    pub(crate) fn proven_rank(pod: &'p Pod, workload_uid: &'p str) -> Admitted<'p> {
        Admitted {
            pod,
            job_uid: workload_uid,
        }
    }

    /// A pod taken as admitted, for unit tests of what reads admitted pods.
    #[cfg(test)]
    pub(crate) fn assume(pod: &'p Pod, job_uid: &'p str) -> Admitted<'p> {
        Admitted { pod, job_uid }
    }
}

/// Those of `pods` that are Job `job_uid`'s own ([`admit`]).
pub fn admitted<'p>(
    pods: impl IntoIterator<Item = &'p Pod>,
    job_uid: &'p str,
    keys: &KeyRing,
    now: Timestamp,
) -> Vec<Admitted<'p>> {
    pods.into_iter()
        .filter(|p| {
            PodFacts::of(&p.metadata).is_some_and(|(_, f)| admit(&f, job_uid, keys, now).is_ok())
        })
        .map(|pod| Admitted { pod, job_uid })
        .collect()
}

/// A report left out, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    /// `metadata.name` of the MemoryReport.
    pub name: String,
    /// Why, for the `ReportsValid` condition.
    pub why: String,
}

/// The outcome of screening a Job's reports.
#[derive(Debug, Default)]
pub struct Screened<'a> {
    /// Reports that count, in (rank, name) order.
    pub counted: Vec<&'a MemoryReport>,
    /// Reports that are not what they claim (rules 1–5).
    pub refused: Vec<Refused>,
    /// Genuine reports of earlier pods of a rank that has a newer pod (rule 6).
    pub superseded: usize,
    /// Genuine reports beyond the Job's limit (rule 7).
    pub over_limit: usize,
}

/// Screens the reports claiming Job `job_uid` (see the module docs).
pub fn screen<'a>(
    reports: &[&'a MemoryReport],
    pods: &HashMap<&str, PodFacts<'_>>,
    job_uid: &str,
    parallelism: u32,
    keys: &KeyRing,
    now: Timestamp,
) -> Screened<'a> {
    let mut out = Screened::default();
    // Rule 6: newest pod per rank (then newest sample, then name, for determinism).
    let mut by_rank: BTreeMap<Option<u32>, Vec<(&MemoryReport, Key)>> = BTreeMap::new();
    for r in reports {
        let pod = pods.get(r.spec.pod_name.as_str());
        match check(r, pod, job_uid, keys, now) {
            Ok(()) => by_rank
                .entry(r.spec.rank)
                .or_default()
                .push((*r, key(r, pod))),
            Err(why) => out.refused.push(Refused {
                name: r.metadata.name.clone().unwrap_or_default(),
                why: why.to_string(),
            }),
        }
    }
    let mut kept: Vec<(&MemoryReport, Key)> = Vec::new();
    for (rank, mut group) in by_rank {
        group.sort_by(|a, b| b.1.cmp(&a.1));
        if rank.is_none() {
            // A Job that is not Indexed: its pods are interchangeable, and
            // the newest `parallelism` are its current ones (a failed
            // attempt's report is superseded by its replacement's).
            let keep = parallelism as usize;
            out.superseded += group.len().saturating_sub(keep);
            kept.extend(group.into_iter().take(keep));
            continue;
        }
        out.superseded += group.len() - 1;
        kept.extend(group.into_iter().take(1));
    }
    // Rule 7: the newest within the limit.
    let limit = report_limit(parallelism);
    if kept.len() > limit {
        kept.sort_by(|a, b| b.1.cmp(&a.1));
        out.over_limit = kept.len() - limit;
        kept.truncate(limit);
    }
    out.counted = kept.into_iter().map(|(r, _)| r).collect();
    out.counted.sort_by(|a, b| {
        (a.spec.rank, a.metadata.name.as_deref()).cmp(&(b.spec.rank, b.metadata.name.as_deref()))
    });
    out
}

/// Orders genuine reports: newer pod, then newer sample, then name.
type Key = (Option<Timestamp>, Option<Timestamp>, String);

fn key(r: &MemoryReport, pod: Option<&PodFacts<'_>>) -> Key {
    (
        pod.and_then(|p| p.created),
        r.spec.sampled_at.parse().ok(),
        r.metadata.name.clone().unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests;
