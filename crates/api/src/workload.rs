//! The training workloads memprof profiles as one each, and what the
//! operator, the webhook and the CLI agree on about them: their API
//! coordinates, which of them may control which (the roll-up chain), who
//! creates each one's pods, how each is suspended, and the labels its
//! controller writes that say which rank a pod is.
//!
//! A workload is the top of a chain of *controller* owner references:
//! a batch/v1 Job alone; a JobSet over its child Jobs; a TrainJob over its
//! JobSet; a PyTorchJob over its pods (the training operator creates them
//! with no Job between). Nothing here is proof: every label and owner
//! reference is written by whoever creates the object. The operator reads
//! each link from the API server and trusts it only under a mark the
//! webhook issued to the identity that creates that link
//! (`workload_mark`, docs/security.md "Workloads").

/// A kind of workload memprof knows how to roll up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum WorkloadKind {
    /// `batch/v1` Job.
    Job,
    /// `jobset.x-k8s.io/v1alpha2` JobSet: child Jobs, one per replica of
    /// each replicated job.
    JobSet,
    /// `trainer.kubeflow.org/v1alpha1` TrainJob (Kubeflow Trainer 2.x),
    /// which runs as one JobSet it controls.
    TrainJob,
    /// `kubeflow.org/v1` PyTorchJob (Kubeflow training operator 1.x), whose
    /// pods the training operator creates itself.
    PyTorchJob,
}

/// Every kind, children before parents.
pub const WORKLOAD_KINDS: [WorkloadKind; 4] = [
    WorkloadKind::Job,
    WorkloadKind::JobSet,
    WorkloadKind::TrainJob,
    WorkloadKind::PyTorchJob,
];

/// Most controller links followed from a pod to its workload: the longest
/// chain memprof knows is pod → Job → JobSet → TrainJob (3 links); one more
/// is never followed, whatever owner references a tenant writes.
pub const MAX_CHAIN: usize = 3;

impl WorkloadKind {
    /// `apiVersion` as owner references and manifests write it.
    pub fn api_version(self) -> &'static str {
        match self {
            WorkloadKind::Job => "batch/v1",
            WorkloadKind::JobSet => "jobset.x-k8s.io/v1alpha2",
            WorkloadKind::TrainJob => "trainer.kubeflow.org/v1alpha1",
            WorkloadKind::PyTorchJob => "kubeflow.org/v1",
        }
    }

    /// `kind`.
    pub fn kind(self) -> &'static str {
        match self {
            WorkloadKind::Job => "Job",
            WorkloadKind::JobSet => "JobSet",
            WorkloadKind::TrainJob => "TrainJob",
            WorkloadKind::PyTorchJob => "PyTorchJob",
        }
    }

    /// The resource's plural (its URL path and RBAC name).
    pub fn plural(self) -> &'static str {
        match self {
            WorkloadKind::Job => "jobs",
            WorkloadKind::JobSet => "jobsets",
            WorkloadKind::TrainJob => "trainjobs",
            WorkloadKind::PyTorchJob => "pytorchjobs",
        }
    }

    /// The kind an owner reference names, when memprof knows it: both
    /// `apiVersion` and `kind` must match (a `kind: JobSet` of another
    /// group is another kind).
    pub fn of(api_version: &str, kind: &str) -> Option<WorkloadKind> {
        WORKLOAD_KINDS
            .into_iter()
            .find(|k| k.api_version() == api_version && k.kind() == kind)
    }

    /// The kind that may control this one in a roll-up chain: a Job's
    /// JobSet, a JobSet's TrainJob. Any other controller (a CronJob, an
    /// unknown operator) ends the chain here: this object is the workload.
    pub fn parent(self) -> Option<WorkloadKind> {
        match self {
            WorkloadKind::Job => Some(WorkloadKind::JobSet),
            WorkloadKind::JobSet => Some(WorkloadKind::TrainJob),
            WorkloadKind::TrainJob | WorkloadKind::PyTorchJob => None,
        }
    }

    /// Whether this kind's own controller creates the pods (no Job between).
    pub fn creates_pods(self) -> bool {
        matches!(self, WorkloadKind::Job | WorkloadKind::PyTorchJob)
    }

    /// Where the kind's suspend switch is (a JSON path into the object),
    /// for the kinds memprof suspends rather than recreates. A Job is left
    /// out on purpose: memprof's Job remediation predates `spec.suspend`
    /// (Kubernetes 1.21) and keeps recreating.
    pub fn suspend_path(self) -> Option<&'static [&'static str]> {
        match self {
            WorkloadKind::JobSet | WorkloadKind::TrainJob => Some(&["spec", "suspend"]),
            WorkloadKind::PyTorchJob => Some(&["spec", "runPolicy", "suspend"]),
            WorkloadKind::Job => None,
        }
    }
}

/// MemoryProfile label: the kind of workload it describes (absent: a Job).
pub const LABEL_WORKLOAD_KIND: &str = "memprof.dev/workload-kind";
/// Label the JobSet controller sets on its child Jobs: the JobSet's name.
pub const LABEL_JOBSET_NAME: &str = "jobset.sigs.k8s.io/jobset-name";
/// Label Kueue reads to admit a workload through a queue.
pub const LABEL_KUEUE_QUEUE: &str = "kueue.x-k8s.io/queue-name";
/// Label the JobSet controller sets on a child Job (and its pods): the replicated job.
pub const LABEL_JOBSET_REPLICATED_JOB: &str = "jobset.sigs.k8s.io/replicatedjob-name";
/// Label the JobSet controller sets on a child Job (and its pods): its replica index.
pub const LABEL_JOBSET_JOB_INDEX: &str = "jobset.sigs.k8s.io/job-index";
/// Label (1.28+; an annotation before) the Job controller sets on an Indexed Job's pods.
pub const COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";
/// Label the training operator sets on a PyTorchJob's pods: `master` or `worker`.
pub const LABEL_PYTORCH_REPLICA_TYPE: &str = "training.kubeflow.org/replica-type";
/// Label the training operator puts on a PyTorchJob's pods: the
/// PyTorchJob's name (a filter for the operator's watch, never proof).
pub const LABEL_TRAINING_JOB_NAME: &str = "training.kubeflow.org/job-name";
/// Label the training operator sets on a PyTorchJob's pods: the index within its type.
pub const LABEL_PYTORCH_REPLICA_INDEX: &str = "training.kubeflow.org/replica-index";

/// Identities the JobSet controller creates child Jobs as (its usual install).
pub const DEFAULT_JOBSET_IDENTITIES: [&str; 1] =
    ["system:serviceaccount:jobset-system:jobset-controller-manager"];
/// Identities Kubeflow Trainer creates a TrainJob's JobSet as (its usual install).
pub const DEFAULT_TRAINER_IDENTITIES: [&str; 1] =
    ["system:serviceaccount:kubeflow-system:kubeflow-trainer-controller-manager"];
/// Identities the training operator creates a PyTorchJob's pods as (its usual install).
pub const DEFAULT_TRAINING_OPERATOR_IDENTITIES: [&str; 1] =
    ["system:serviceaccount:kubeflow:training-operator"];

/// Longest rank identity read from labels (a replicated job's name is a
/// DNS label; two indexes of at most 10 digits each).
pub const MAX_RANK_IDENTITY: usize = 63 + 2 * 11 + 16;

/// The rank identity a JobSet's child Job carries, as the JobSet controller
/// labelled it: `<replicated job>/<job index>`. `None` when a label is
/// missing, too long, or the index is not a number.
pub fn jobset_identity(replicated_job: Option<&str>, job_index: Option<&str>) -> Option<String> {
    let rjob = replicated_job.filter(|r| !r.is_empty() && r.len() <= 63 && !r.contains('/'))?;
    let index = index(job_index?)?;
    Some(format!("{rjob}/{index}"))
}

/// The rank identity of a PyTorchJob's pod, as the training operator
/// labelled it: `<replica type, lower case>/<replica index>`.
pub fn pytorch_identity(replica_type: Option<&str>, replica_index: Option<&str>) -> Option<String> {
    let rtype = replica_type?.to_ascii_lowercase();
    if !matches!(rtype.as_str(), "master" | "worker") {
        return None;
    }
    let index = index(replica_index?)?;
    Some(format!("{rtype}/{index}"))
}

/// A replica or completion index: at most 10 decimal digits that fit a u32.
pub fn index(value: &str) -> Option<u32> {
    if value.is_empty() || value.len() > 10 || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse().ok()
}

/// The two halves of a rank identity (`jobset_identity`, `pytorch_identity`).
pub fn split_identity(identity: &str) -> Option<(&str, u32)> {
    let (name, i) = identity.rsplit_once('/')?;
    Some((name, index(i)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_known_only_by_both_api_version_and_kind() {
        for k in WORKLOAD_KINDS {
            assert_eq!(WorkloadKind::of(k.api_version(), k.kind()), Some(k));
        }
        assert_eq!(WorkloadKind::of("example.com/v1", "JobSet"), None);
        assert_eq!(WorkloadKind::of("jobset.x-k8s.io/v1alpha1", "JobSet"), None);
        assert_eq!(WorkloadKind::of("batch/v1", "CronJob"), None);
    }

    #[test]
    fn the_chain_goes_up_at_most_max_chain_links() {
        // pod → Job → JobSet → TrainJob: every chain of parents is bounded.
        for k in WORKLOAD_KINDS {
            let mut links = 1; // pod → its controller
            let mut at = k;
            while let Some(p) = at.parent() {
                links += 1;
                at = p;
            }
            assert!(links <= MAX_CHAIN, "{k:?}: {links}");
        }
        assert!(WorkloadKind::Job.creates_pods() && WorkloadKind::PyTorchJob.creates_pods());
        assert!(!WorkloadKind::JobSet.creates_pods() && !WorkloadKind::TrainJob.creates_pods());
    }

    #[test]
    fn rank_identities_are_strict_and_bounded() {
        assert_eq!(
            jobset_identity(Some("workers"), Some("3")).as_deref(),
            Some("workers/3")
        );
        assert_eq!(jobset_identity(Some("workers"), Some("-1")), None);
        assert_eq!(jobset_identity(Some("workers"), Some("4294967296")), None);
        assert_eq!(jobset_identity(Some("a/b"), Some("1")), None);
        assert_eq!(jobset_identity(Some(&"w".repeat(64)), Some("1")), None);
        assert_eq!(jobset_identity(None, Some("1")), None);
        assert_eq!(
            pytorch_identity(Some("Worker"), Some("0")).as_deref(),
            Some("worker/0")
        );
        assert_eq!(pytorch_identity(Some("chief"), Some("0")), None);
        assert_eq!(pytorch_identity(Some("master"), Some(" 1")), None);
        assert_eq!(split_identity("worker/7"), Some(("worker", 7)));
        let longest = jobset_identity(Some(&"w".repeat(63)), Some("4294967295")).unwrap();
        assert!(longest.len() <= MAX_RANK_IDENTITY);
    }
}
