//! Which MemoryReports count for a Job: pure screening, shared by the
//! roll-up and remediation, so that no report a tenant could forge ever
//! steers the operator.
//!
//! Why: any pod of the service account the reporter Role is bound to (often
//! `default`, so often every pod of the namespace) can write a MemoryReport
//! with any `memprof.dev/job` label. Labels are claims; the pod's owner
//! references are facts the Job controller set. A report counts only if
//! 1. it is its pod's own: `metadata.name == spec.podName`;
//! 2. that pod exists and is controlled by the Job the report claims (uid);
//! 3. the report is owned by that pod (the sidecar sets the ownerReference);
//! 4. its `sampledAt` parses and is not in the future (more than `MAX_SKEW`).
//!
//! Then, among reports that pass:
//! 5. one per rank: a retried pod's leftover report (an earlier pod of the
//!    same rank) is superseded by the newest pod's;
//! 6. at most `report_limit(parallelism)` of them (the newest first), so a
//!    Job cannot be made to carry more ranks than it can have.
//!
//! Rejected reports (1–4) are named in the `ReportsValid` condition and never
//! acted on; superseded and excess ones (5–6) are counted in `ReportsCounted`.

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use memprof_api::MemoryReport;
use std::collections::{BTreeMap, HashMap};

/// How far in the future a `sampledAt` may be (clock skew between nodes).
pub const MAX_SKEW: SignedDuration = SignedDuration::from_secs(60);

/// Most reports counted for a Job of `parallelism` pods: retries and
/// restarts briefly leave more pods than `parallelism`, never many more.
pub fn report_limit(parallelism: u32) -> usize {
    (parallelism as usize).saturating_mul(2).saturating_add(4)
}

/// What screening needs of a pod: its metadata.
#[derive(Clone, Debug)]
pub struct PodFacts<'a> {
    /// uid of the pod.
    pub uid: &'a str,
    /// uid of the Job controlling it, if a Job does.
    pub job_uid: Option<&'a str>,
    /// When it was created.
    pub created: Option<Timestamp>,
}

impl<'a> PodFacts<'a> {
    /// The facts of a pod's metadata.
    pub fn of(meta: &'a ObjectMeta) -> Option<(&'a str, PodFacts<'a>)> {
        let name = meta.name.as_deref()?;
        let job_uid = meta
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true) && o.kind == "Job" && o.api_version == "batch/v1")
            .map(|o| o.uid.as_str());
        Some((
            name,
            PodFacts {
                uid: meta.uid.as_deref().unwrap_or_default(),
                job_uid,
                created: meta.creation_timestamp.as_ref().map(|t| t.0),
            },
        ))
    }
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
    /// Reports that are not what they claim (rules 1–4).
    pub refused: Vec<Refused>,
    /// Genuine reports of earlier pods of a rank that has a newer pod (rule 5).
    pub superseded: usize,
    /// Genuine reports beyond the Job's limit (rule 6).
    pub over_limit: usize,
}

/// Screens the reports claiming Job `job_uid` (see the module docs).
pub fn screen<'a>(
    reports: &[&'a MemoryReport],
    pods: &HashMap<&str, PodFacts<'_>>,
    job_uid: &str,
    parallelism: u32,
    now: Timestamp,
) -> Screened<'a> {
    let mut out = Screened::default();
    let mut genuine = Vec::new();
    for r in reports {
        match check(r, pods, job_uid, now) {
            Ok(facts) => genuine.push((*r, facts)),
            Err(why) => out.refused.push(Refused {
                name: r.metadata.name.clone().unwrap_or_default(),
                why,
            }),
        }
    }
    // Rule 5: newest pod per rank (then newest sample, then name, for determinism).
    let mut by_rank: BTreeMap<Option<u32>, Vec<(&MemoryReport, Key)>> = BTreeMap::new();
    for (r, key) in genuine {
        by_rank.entry(r.spec.rank).or_default().push((r, key));
    }
    let mut kept: Vec<(&MemoryReport, Key)> = Vec::new();
    for (rank, mut group) in by_rank {
        group.sort_by(|a, b| b.1.cmp(&a.1));
        if rank.is_none() {
            // Without a rank there is nothing to supersede: each pod is its own.
            kept.extend(group);
            continue;
        }
        out.superseded += group.len() - 1;
        kept.extend(group.into_iter().take(1));
    }
    // Rule 6: the newest within the limit.
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
type Key = (Option<Timestamp>, Timestamp, String);

fn check(
    r: &MemoryReport,
    pods: &HashMap<&str, PodFacts<'_>>,
    job_uid: &str,
    now: Timestamp,
) -> Result<Key, String> {
    let name = r.metadata.name.as_deref().unwrap_or_default();
    let pod = r.spec.pod_name.as_str();
    if name != pod {
        return Err(format!(
            "not its pod's own report: named {name:?} but describes pod {pod:?}"
        ));
    }
    let facts = pods
        .get(pod)
        .ok_or_else(|| format!("pod {pod} does not exist"))?;
    if facts.job_uid != Some(job_uid) {
        return Err(format!("pod {pod} is not controlled by this Job"));
    }
    let owned = r
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "Pod" && o.uid == facts.uid);
    if !owned {
        return Err(format!("not owned by pod {pod} (uid {})", facts.uid));
    }
    let sampled: Timestamp = r
        .spec
        .sampled_at
        .parse()
        .map_err(|_| "sampledAt is not an RFC 3339 time".to_string())?;
    if sampled > now + MAX_SKEW {
        return Err(format!("sampledAt {sampled} is in the future"));
    }
    Ok((facts.created, sampled, name.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
    use memprof_api::MemoryReportSpec;

    const JOB: &str = "job-uid";

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn pod(name: &str, job_uid: &str, created: i64) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
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
        r
    }

    fn run<'a>(
        reports: &[&'a MemoryReport],
        pods: &[ObjectMeta],
        parallelism: u32,
    ) -> Screened<'a> {
        let facts: HashMap<&str, PodFacts<'_>> = pods.iter().filter_map(PodFacts::of).collect();
        screen(reports, &facts, JOB, parallelism, ts(100))
    }

    fn names(s: &Screened<'_>) -> Vec<String> {
        s.counted
            .iter()
            .map(|r| r.metadata.name.clone().unwrap())
            .collect()
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
            let s = run(&[r], &pods, 4);
            assert!(s.counted.is_empty(), "{why}");
            assert_eq!(s.refused.len(), 1, "{why}");
            assert!(s.refused[0].why.contains(why), "{}", s.refused[0].why);
        }
        // Within the skew is fine.
        let near = report("train-0", Some(0), 100 + 59);
        let s = run(&[&near], &pods, 4);
        assert_eq!(s.counted.len(), 1);
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
}
