//! What the controller is keyed on: a Job's name within its namespace.
//!
//! Not the Job's uid: remediation deletes a Job and creates it again under
//! the same name, and the profile (named after the Job), its history and
//! the pending remediation must be found again across that recreation.

use kube::ResourceExt;
use std::fmt;

/// A Job, and so its MemoryProfile, by namespace and name.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub struct JobKey {
    /// Namespace of the Job.
    pub namespace: String,
    /// Name of the Job (and of its MemoryProfile).
    pub name: String,
}

impl JobKey {
    /// A queue of Job keys whose namespaces (tenants) take turns: one
    /// tenant's load delays another's Jobs by a turn, not by its length.
    pub fn fair_queue() -> crate::queue::WorkQueue<JobKey> {
        crate::queue::WorkQueue::grouped(|k: &JobKey| k.namespace.clone())
    }

    /// The key of Job `name` in `namespace`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        JobKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The key of the Job an object names in its label `label` (a report's
    /// `memprof.dev/job`, a pod's `job-name`), in the object's namespace.
    pub fn from_label<K: ResourceExt>(obj: &K, label: &str) -> Option<Self> {
        let namespace = obj.meta().namespace.clone()?;
        let name = obj.labels().get(label)?;
        Some(JobKey::new(namespace, name.clone()))
    }

    /// The key of an object named after its Job (a Job, a MemoryProfile).
    pub fn of<K: ResourceExt>(obj: &K) -> Option<Self> {
        Some(JobKey::new(
            obj.meta().namespace.clone()?,
            obj.meta().name.clone()?,
        ))
    }
}

impl fmt::Display for JobKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}
