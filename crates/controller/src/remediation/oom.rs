//! Pure GPU-OOM detection from what the API server already holds: the pods'
//! container statuses and the MemoryReports.
//!
//! A CUDA OOM is not an `OOMKilled`: the kernel does not kill anything, the
//! trainer raises, and the container exits with code 1. So the evidence is,
//! in order of strength: a non-zero exit whose termination message (the
//! injection sets `FallbackToLogsOnError`, so it holds the log tail) matches
//! a CUDA OOM message; the in-process agent's `numOoms` counter going up; or
//! a non-zero exit right after the pod's last report showed a GPU at its
//! ceiling. Each OOM is recorded once per (pod, container, restart), or per
//! agent count, and the record itself is the memory of what was seen, so a
//! restarted controller does not record it again.
//!
//! Evidence is read only from the Job's own pods, screened as reports are
//! (`operator::trust`, an [`Admitted`] pod), and from its counted reports:
//! anyone may create a pod labelled `job-name=<Job>` that prints a CUDA OOM
//! and exits 1. Every record carries the Job's uid.

use crate::operator::trust::Admitted;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{ContainerStateTerminated, Pod};
use memprof_api::{truncate_utf8, MemoryReportSpec, OomRecord};

/// Evidence kind: the termination message matches a CUDA OOM.
pub const EVIDENCE_TERMINATION: &str = "terminationMessage";
/// Evidence kind: the agent's `numOoms` went up.
pub const EVIDENCE_AGENT: &str = "agentOomCount";
/// Evidence kind: non-zero exit after a report at the memory ceiling.
pub const EVIDENCE_CEILING: &str = "reportAtCeiling";
/// Fraction of a GPU's memory in use from which it is "at the ceiling".
pub const CEILING_FRACTION: f64 = 0.99;
/// Name of the injected sidecar container: its exits are not the trainer's OOMs.
pub(crate) const SIDECAR_CONTAINER: &str = "memprof-sidecar";
/// Pod annotation of indexed Jobs: the pod's completion index (its rank).
const COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";

/// Lowercase fragments that identify a CUDA (or cuDNN/cuBLAS/XLA) OOM, and
/// what to call them in the evidence.
const PATTERNS: [(&str, &str); 8] = [
    ("cuda out of memory", "CUDA out of memory"),
    ("cuda error: out of memory", "CUDA error: out of memory"),
    ("cuda_error_out_of_memory", "CUDA_ERROR_OUT_OF_MEMORY"),
    ("cudaerrormemoryallocation", "cudaErrorMemoryAllocation"),
    ("cublas_status_alloc_failed", "CUBLAS_STATUS_ALLOC_FAILED"),
    ("cudnn_status_alloc_failed", "CUDNN_STATUS_ALLOC_FAILED"),
    ("nccl", "NCCL out of memory"),
    ("resource_exhausted", "XLA RESOURCE_EXHAUSTED"),
];

/// The CUDA OOM pattern a termination message matches, if any.
pub fn cuda_oom_pattern(message: &str) -> Option<&'static str> {
    let m = message.to_lowercase();
    for (needle, name) in PATTERNS {
        let hit = match needle {
            // These name a subsystem, not an OOM: they count with "out of memory".
            "nccl" | "resource_exhausted" => m.contains(needle) && m.contains("out of memory"),
            _ => m.contains(needle),
        };
        if hit {
            return Some(name);
        }
    }
    // torch.cuda.OutOfMemoryError / torch.OutOfMemoryError, not the JVM's heap OOM.
    if m.contains("outofmemoryerror") && !m.contains("java.lang.outofmemoryerror") {
        return Some("OutOfMemoryError");
    }
    // "out of memory" near "CUDA" or "GPU" (e.g. "RuntimeError: CUDA error ... out of memory").
    for (i, _) in m.match_indices("out of memory") {
        let lo = floor_char_boundary(&m, i.saturating_sub(120));
        let hi = floor_char_boundary(&m, (i + 120).min(m.len()));
        let near = &m[lo..hi];
        if near.contains("cuda") || near.contains("gpu") {
            return Some("out of memory (CUDA)");
        }
    }
    None
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// The identity of an OOM: `pod/container#restart` or `pod/numOoms=N`.
pub fn record_key(r: &OomRecord) -> String {
    let slot = r
        .evidence
        .split_once(' ')
        .map(|(_, rest)| rest.split_once(':').map_or(rest, |(s, _)| s))
        .unwrap_or(&r.evidence);
    format!("{}/{slot}", r.pod)
}

/// Highest agent OOM count recorded for a pod.
fn recorded_agent_ooms(known: &[OomRecord], pod: &str) -> u64 {
    known
        .iter()
        .filter(|r| r.pod == pod && r.evidence.starts_with(EVIDENCE_AGENT))
        .filter_map(|r| {
            let slot = r.evidence.split_once(' ')?.1.split_once(':')?.0;
            slot.strip_prefix("numOoms=")?.parse().ok()
        })
        .max()
        .unwrap_or(0)
}

/// Where a pod's GPU was fullest in its report: (gpu index, used fraction).
fn fullest_gpu(report: &MemoryReportSpec) -> Option<(u32, f64)> {
    report
        .gpus
        .iter()
        .filter(|g| g.total_bytes > 0)
        .map(|g| (g.index, g.used_bytes as f64 / g.total_bytes as f64))
        .max_by(|a, b| a.1.total_cmp(&b.1))
}

/// Every termination of a pod's containers: (container, restart index, state).
fn terminations(pod: &Pod) -> Vec<(&str, i32, &ContainerStateTerminated)> {
    let mut out = Vec::new();
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref());
    for cs in statuses.into_iter().flatten() {
        if cs.name == SIDECAR_CONTAINER {
            continue;
        }
        if let Some(t) = cs.state.as_ref().and_then(|s| s.terminated.as_ref()) {
            out.push((cs.name.as_str(), cs.restart_count, t));
        }
        if let Some(t) = cs.last_state.as_ref().and_then(|s| s.terminated.as_ref()) {
            out.push((cs.name.as_str(), (cs.restart_count - 1).max(0), t));
        }
    }
    out
}

/// Whether a container of `pod` other than the sidecar ended with a
/// non-zero exit (now or before a restart): what every OOM read from a
/// pod starts from. O(containers), no HMAC: a filter before proving the pod.
pub fn failed_container(pod: &Pod) -> bool {
    terminations(pod).iter().any(|(_, _, t)| t.exit_code != 0)
}

/// New OOMs among the Job's own `pods` and its counted `reports` that
/// `known` does not hold yet, oldest first. `now` is the time of records
/// whose evidence carries none.
pub fn detect(
    pods: &[Admitted<'_>],
    reports: &[&MemoryReportSpec],
    known: &[OomRecord],
    now: Timestamp,
) -> Vec<OomRecord> {
    let mut found: Vec<OomRecord> = pods
        .iter()
        .flat_map(|admitted| pod_ooms(admitted, reports, now))
        .collect();
    found.extend(agent_ooms(pods, reports, known, now));
    only_new(found, known)
}

/// The OOMs a pod's terminated containers show: a CUDA OOM in the
/// termination message, or a failure right after its last report saw a GPU
/// at its ceiling.
fn pod_ooms(
    admitted: &Admitted<'_>,
    reports: &[&MemoryReportSpec],
    now: Timestamp,
) -> Vec<OomRecord> {
    let pod = admitted.pod();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let report = reports.iter().find(|r| r.pod_name == name).copied();
    let rank = report
        .and_then(|r| r.rank)
        .or_else(|| completion_index(pod));
    let fullest = report.and_then(fullest_gpu);
    let mut out = Vec::new();
    for (container, restart, t) in terminations(pod) {
        // 137 + OOMKilled is the kernel's host-memory OOM, not the GPU's.
        if t.exit_code == 0 || t.reason.as_deref() == Some("OOMKilled") {
            continue;
        }
        let Some(mut evidence) = termination_evidence(container, restart, t, report, fullest)
        else {
            continue;
        };
        truncate_utf8(&mut evidence, 512);
        let finished = t.finished_at.as_ref().map(|f| f.0);
        out.push(OomRecord {
            time: finished.unwrap_or(now).min(now).to_string(),
            pod: name.clone(),
            rank,
            gpu_index: fullest.map(|(g, _)| g),
            evidence,
            job_uid: Some(admitted.job_uid().to_string()),
        });
    }
    out
}

/// The Job controller's completion index of an indexed Job's pod (display only).
fn completion_index(pod: &Pod) -> Option<u32> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(COMPLETION_INDEX)?
        .parse()
        .ok()
}

/// Why a failed container's termination is a GPU OOM, or `None` if it is not one.
fn termination_evidence(
    container: &str,
    restart: i32,
    t: &ContainerStateTerminated,
    report: Option<&MemoryReportSpec>,
    fullest: Option<(u32, f64)>,
) -> Option<String> {
    let message = t.message.as_deref().unwrap_or_default();
    if let Some(pattern) = cuda_oom_pattern(message) {
        let mut excerpt = message.trim().replace('\n', " ");
        truncate_utf8(&mut excerpt, 300);
        return Some(format!(
            "{EVIDENCE_TERMINATION} {container}#{restart}: exit {}, {pattern:?} in the termination message: {excerpt}",
            t.exit_code
        ));
    }
    // Only a report sampled before the exit says where the GPU was when it failed.
    let sampled = report.and_then(|r| r.sampled_at.parse::<Timestamp>().ok());
    let finished = t.finished_at.as_ref().map(|f| f.0);
    let before_exit = match (sampled, finished) {
        (Some(s), Some(f)) => s <= f,
        _ => true,
    };
    match fullest {
        Some((gpu, frac)) if frac >= CEILING_FRACTION && before_exit => Some(format!(
            "{EVIDENCE_CEILING} {container}#{restart}: exit {} after GPU {gpu} was at {:.1}% of its memory in the last report",
            t.exit_code,
            frac * 100.0
        )),
        _ => None,
    }
}

/// The OOMs the in-process agents counted (`allocator.numOoms`) beyond
/// those already recorded for their pod.
fn agent_ooms(
    pods: &[Admitted<'_>],
    reports: &[&MemoryReportSpec],
    known: &[OomRecord],
    now: Timestamp,
) -> Vec<OomRecord> {
    let job_of = |pod: &str| {
        pods.iter()
            .find(|p| p.pod().metadata.name.as_deref() == Some(pod))
            .map(|p| p.job_uid().to_string())
    };
    let mut out = Vec::new();
    for r in reports {
        let Some(count) = r.allocator.as_ref().map(|a| a.num_ooms) else {
            continue;
        };
        // A counted report's pod is admitted; without it there is no Job uid to record.
        let Some(job_uid) = job_of(&r.pod_name) else {
            continue;
        };
        let before = recorded_agent_ooms(known, &r.pod_name);
        if count <= before {
            continue;
        }
        // A report's time is the sidecar's word: parsed and never later
        // than now, so nothing a pod writes is copied into the status.
        let time = r
            .sampled_at
            .parse::<Timestamp>()
            .map_or(now, |t| t.min(now));
        out.push(OomRecord {
            time: time.to_string(),
            job_uid: Some(job_uid),
            pod: r.pod_name.clone(),
            rank: r.rank,
            gpu_index: fullest_gpu(r).map(|(g, _)| g),
            evidence: format!(
                "{EVIDENCE_AGENT} numOoms={count}: the in-process agent counted {count} CUDA OOM(s), {before} recorded before"
            ),
        });
    }
    out
}

/// `found` without what `known` holds, oldest first, each OOM once.
fn only_new(mut found: Vec<OomRecord>, known: &[OomRecord]) -> Vec<OomRecord> {
    let keys: Vec<String> = known.iter().map(record_key).collect();
    // Once the bounded list is full, an OOM older than its oldest entry may
    // be one that was dropped: recording it again would loop forever.
    let oldest = (known.len() >= memprof_api::MAX_HISTORY)
        .then(|| {
            known
                .iter()
                .filter_map(|r| r.time.parse::<Timestamp>().ok())
                .min()
        })
        .flatten();
    found.retain(|r| !keys.contains(&record_key(r)));
    found.retain(|r| match (oldest, r.time.parse::<Timestamp>()) {
        (Some(o), Ok(t)) => t > o,
        _ => true,
    });
    found.sort_by(|a, b| a.time.cmp(&b.time).then(a.pod.cmp(&b.pod)));
    found.dedup_by(|a, b| record_key(a) == record_key(b));
    found
}

/// `known` with `new` appended, the oldest dropped beyond `max`.
pub fn merge(known: &[OomRecord], new: &[OomRecord], max: usize) -> Vec<OomRecord> {
    let mut all: Vec<OomRecord> = known.iter().chain(new).cloned().collect();
    let excess = all.len().saturating_sub(max);
    all.drain(..excess);
    all
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ContainerState, ContainerStatus, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use memprof_api::{AllocatorStats, GpuReport};

    const JOB: &str = "job-uid";

    /// Pods taken as the Job's own (screening is `operator::trust`'s, tested there).
    fn adm<'p>(pods: &[&'p Pod]) -> Vec<Admitted<'p>> {
        pods.iter().map(|p| Admitted::assume(p, JOB)).collect()
    }

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + s).unwrap()
    }

    fn pod(name: &str, container: &str, exit: i32, message: &str, restarts: i32) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.status = Some(PodStatus {
            container_statuses: Some(vec![ContainerStatus {
                name: container.into(),
                restart_count: restarts,
                state: Some(ContainerState {
                    terminated: Some(ContainerStateTerminated {
                        exit_code: exit,
                        message: Some(message.into()),
                        finished_at: Some(Time(ts(100))),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            ..Default::default()
        });
        p
    }

    #[test]
    fn only_a_trainers_failed_container_may_show_an_oom() {
        assert!(failed_container(&pod("a", "trainer", 1, "boom", 0)));
        assert!(!failed_container(&pod("a", "trainer", 0, "done", 0)));
        assert!(!failed_container(&pod(
            "a",
            SIDECAR_CONTAINER,
            1,
            "boom",
            0
        )));
        assert!(!failed_container(&Pod::default()), "no status yet");
    }

    fn report(pod: &str, used_gib: u64, at: i64) -> MemoryReportSpec {
        MemoryReportSpec {
            pod_name: pod.into(),
            rank: Some(3),
            sampled_at: ts(at).to_string(),
            gpus: vec![GpuReport {
                index: 1,
                total_bytes: 100 << 30,
                used_bytes: used_gib << 30,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn recognizes_cuda_oom_messages_and_not_others() {
        for m in [
            "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
            "RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported",
            "RuntimeError: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
            "cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
            "cudaErrorMemoryAllocation: out of memory",
            "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate",
            "torch.OutOfMemoryError: allocation on device failed",
            "the GPU ran out of memory during backward",
        ] {
            assert!(cuda_oom_pattern(m).is_some(), "{m}");
        }
        for m in [
            "",
            "Exception in thread main java.lang.OutOfMemoryError: Java heap space",
            "MemoryError: host out of memory while reading the dataset",
            "ValueError: bad learning rate",
        ] {
            assert_eq!(cuda_oom_pattern(m), None, "{m}");
        }
    }

    #[test]
    fn records_a_cuda_oom_exit_once_per_container_restart() {
        let p = pod(
            "train-0",
            "trainer",
            1,
            "CUDA out of memory. Tried to allocate",
            0,
        );
        let r = report("train-0", 50, 90);
        let found = detect(&adm(&[&p]), &[&r], &[], ts(200));
        assert_eq!(found.len(), 1);
        let o = &found[0];
        assert_eq!(
            (o.pod.as_str(), o.rank, o.gpu_index),
            ("train-0", Some(3), Some(1))
        );
        assert_eq!(o.time, ts(100).to_string());
        assert_eq!(
            o.job_uid.as_deref(),
            Some(JOB),
            "every record names the Job"
        );
        assert!(
            o.evidence
                .starts_with("terminationMessage trainer#0: exit 1"),
            "{}",
            o.evidence
        );
        assert_eq!(record_key(o), "train-0/trainer#0");
        assert!(detect(&adm(&[&p]), &[&r], &found, ts(200)).is_empty());
        // The next restart's OOM is a new one.
        let again = pod("train-0", "trainer", 1, "CUDA out of memory", 1);
        assert_eq!(detect(&adm(&[&again]), &[], &found, ts(200)).len(), 1);
    }

    #[test]
    fn ignores_clean_exits_host_ooms_and_the_sidecar() {
        let clean = pod("a", "trainer", 0, "CUDA out of memory", 0);
        let sidecar = pod("b", "memprof-sidecar", 1, "CUDA out of memory", 0);
        let mut host = pod("c", "trainer", 137, "", 0);
        host.status
            .as_mut()
            .unwrap()
            .container_statuses
            .as_mut()
            .unwrap()[0]
            .state
            .as_mut()
            .unwrap()
            .terminated
            .as_mut()
            .unwrap()
            .reason = Some("OOMKilled".into());
        let other = pod("d", "trainer", 2, "ValueError", 0);
        let found = detect(&adm(&[&clean, &sidecar, &host, &other]), &[], &[], ts(0));
        assert!(found.is_empty(), "{found:?}");
    }

    #[test]
    fn an_exit_after_a_report_at_the_ceiling_is_an_oom() {
        let p = pod(
            "train-0",
            "trainer",
            1,
            "Traceback ... (log tail without the error)",
            0,
        );
        let full = report("train-0", 99, 95);
        let found = detect(&adm(&[&p]), &[&full], &[], ts(200));
        assert_eq!(found.len(), 1);
        assert!(found[0]
            .evidence
            .starts_with("reportAtCeiling trainer#0: exit 1 after GPU 1 was at 99.0%"));
        // A report taken after the exit says nothing about it; nor does a half-full GPU.
        assert!(detect(&adm(&[&p]), &[&report("train-0", 99, 150)], &[], ts(200)).is_empty());
        assert!(detect(&adm(&[&p]), &[&report("train-0", 60, 95)], &[], ts(200)).is_empty());
    }

    #[test]
    fn agent_counts_are_recorded_when_they_increase() {
        let mut r = report("train-1", 50, 10);
        r.allocator = Some(AllocatorStats {
            num_ooms: 2,
            ..Default::default()
        });
        let mut p = Pod::default();
        p.metadata.name = Some("train-1".into());
        let found = detect(&adm(&[&p]), &[&r], &[], ts(20));
        assert_eq!(found.len(), 1);
        assert!(found[0].evidence.starts_with("agentOomCount numOoms=2:"));
        assert_eq!(found[0].job_uid.as_deref(), Some(JOB));
        assert!(detect(&adm(&[&p]), &[&r], &found, ts(20)).is_empty());
        r.allocator.as_mut().unwrap().num_ooms = 3;
        let more = detect(&adm(&[&p]), &[&r], &found, ts(20));
        assert!(more[0]
            .evidence
            .contains("3 CUDA OOM(s), 2 recorded before"));
        // A report whose pod is not among the Job's own is no evidence.
        assert!(detect(&adm(&[]), &[&r], &[], ts(20)).is_empty());
    }

    #[test]
    fn a_full_history_does_not_readmit_dropped_ooms() {
        let known: Vec<OomRecord> = (0..16)
            .map(|i| OomRecord {
                time: ts(200 + i).to_string(),
                pod: format!("p{i}"),
                evidence: format!("terminationMessage trainer#0: {i}"),
                ..Default::default()
            })
            .collect();
        // Finished at ts(100), before the oldest kept record: treated as dropped.
        let old = pod("p99", "trainer", 1, "CUDA out of memory", 0);
        assert!(detect(&adm(&[&old]), &[], &known, ts(300)).is_empty());
        let merged = merge(&known, &[known[0].clone()], 16);
        assert_eq!(merged.len(), 16);
        assert_eq!(merged[0].pod, "p1");
    }
}
