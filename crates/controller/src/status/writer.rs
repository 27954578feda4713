//! The status task: per Job, the newest wanted status, remediation edits
//! waiting for a write and wanted Job annotations; workers serve Jobs from
//! a fair queue (`crate::queue`), one pass per Job at a time, spaced.

use super::compose::{compose, write_needed, Need};
use super::patch::WriteMode;
use super::Analysis;
use crate::key::JobKey;
use crate::operator::reconcile::EventPlan;
use crate::operator::reconcile::REPORT_REJECTED;
use crate::operator::Metrics;
use crate::queue::WorkQueue;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::Recorder;
use kube::{Client, ResourceExt};
use memprof_api::{MemoryProfile, MemoryProfileStatus};
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// At most this many Events wait for one Job's next write (the oldest go first).
const MAX_NOTICES: usize = 16;
/// Of them, at most this many about refused reports: anyone who may write a
/// report can have one refused, and those notices must never push out the
/// Job's own (a risk change); the refused reports stay named in the
/// profile's `ReportsValid` condition.
const MAX_REFUSAL_NOTICES: usize = 4;

/// Bounds what waits for a Job's next write: refusal notices beyond
/// [`MAX_REFUSAL_NOTICES`] go first (oldest first), then any beyond
/// [`MAX_NOTICES`], so a counted report's risk Event is displaced only by
/// the Job's own newer ones.
fn bound_notices(notices: &mut Vec<Notice>) {
    let refusals = notices
        .iter()
        .filter(|n| n.plan.reason == REPORT_REJECTED)
        .count();
    let mut drop_refusals = refusals.saturating_sub(MAX_REFUSAL_NOTICES);
    notices.retain(|n| {
        let dropped = drop_refusals > 0 && n.plan.reason == REPORT_REJECTED;
        drop_refusals -= usize::from(dropped);
        !dropped
    });
    let excess = notices.len().saturating_sub(MAX_NOTICES);
    notices.drain(..excess);
}

/// How the writer spaces and spreads its writes.
#[derive(Clone, Copy, Debug)]
pub struct WriterOptions {
    /// Least time between two writes for one Job (status or annotations).
    pub min_interval: Duration,
    /// Writes in flight at once (for different Jobs).
    pub workers: usize,
    /// How a status is written.
    pub mode: WriteMode,
}

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions {
            min_interval: Duration::from_secs(1),
            workers: 16,
            mode: WriteMode::default(),
        }
    }
}

/// An Event to publish once the status that motivated it is written.
#[derive(Clone, Debug)]
pub struct Notice {
    /// What to say.
    pub plan: EventPlan,
    /// The object it is about.
    pub regarding: ObjectReference,
    /// Another object it involves.
    pub related: Option<ObjectReference>,
}

/// Why an edit was not answered.
#[derive(Clone, Debug, thiserror::Error)]
pub enum WriteError {
    /// The writer stopped before the edit was written.
    #[error(
        "the status writer stopped before the change was written (shutdown or lost \
         leadership): nothing was recorded; the next leader decides again"
    )]
    Stopped,
}

type Change = Box<dyn FnMut(&mut MemoryProfileStatus) -> bool + Send>;

/// A remediation edit: applied to the newest status, answered with the
/// written status (`None`: the profile or its status is gone).
struct Edit {
    change: Change,
    done: oneshot::Sender<Option<Arc<MemoryProfileStatus>>>,
}

/// The profile as the API server holds it, as far as the writer knows.
#[derive(Clone, Debug)]
struct Server {
    uid: String,
    rv: String,
    status: Option<Arc<MemoryProfileStatus>>,
}

/// Job annotations to apply (an empty set removes ours); on a top-level
/// workload (JobSet, TrainJob, PyTorchJob) when its profile is one's.
#[derive(Clone, Debug, PartialEq)]
struct Annotations {
    kind: memprof_api::workload::WorkloadKind,
    job_uid: String,
    values: BTreeMap<String, String>,
}

#[derive(Default)]
struct Entry {
    server: Option<Server>,
    analysis: Option<MemoryProfileStatus>,
    /// The uid of the workload whose roll-up handed the newest analysis
    /// over: a Job and a workload of one name share the key, and neither
    /// decides on the other's.
    analysis_by: Option<String>,
    /// The analysis a pass is writing now: still what the next decision
    /// builds on until the write is answered.
    writing: Option<MemoryProfileStatus>,
    notices: Vec<Notice>,
    edits: Vec<Edit>,
    annotations: Option<Annotations>,
    /// The last annotations written: the Job's resourceVersion after, and the values.
    annotated: Option<(u64, BTreeMap<String, String>)>,
    last_write: Option<Instant>,
    last_status_write: Option<Instant>,
    failures: u32,
}

impl Entry {
    fn has_work(&self) -> bool {
        self.analysis.is_some() || !self.edits.is_empty() || self.annotations.is_some()
    }
}

/// What one pass writes, taken out of the entry.
struct Work {
    server: Option<Server>,
    analysis: Option<MemoryProfileStatus>,
    notices: Vec<Notice>,
    edits: Vec<Edit>,
    annotations: Option<Annotations>,
    since_status: Option<Duration>,
}

struct Shared {
    client: Client,
    recorder: Recorder,
    metrics: Arc<Metrics>,
    opts: WriterOptions,
    entries: Mutex<HashMap<JobKey, Entry>>,
    queue: WorkQueue<JobKey>,
}

/// Handle of the status task; cheap to clone.
#[derive(Clone)]
pub struct StatusWriter {
    shared: Arc<Shared>,
}

impl StatusWriter {
    /// A writer through `client`, publishing Events with `recorder`.
    pub fn new(
        client: Client,
        recorder: Recorder,
        metrics: Arc<Metrics>,
        opts: WriterOptions,
    ) -> Self {
        let shared = Shared {
            client,
            recorder,
            metrics,
            opts,
            entries: Mutex::default(),
            queue: JobKey::fair_queue(),
        };
        StatusWriter {
            shared: Arc::new(shared),
        }
    }

    fn entries(&self) -> MutexGuard<'_, HashMap<JobKey, Entry>> {
        self.shared
            .entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Takes note of the profile as the API server holds it (from the watch
    /// cache or a write's answer), unless the writer knows a newer one.
    pub fn observe(&self, key: &JobKey, profile: &MemoryProfile) {
        let seen = Server {
            uid: profile.uid().unwrap_or_default(),
            rv: profile.resource_version().unwrap_or_default(),
            status: profile.status.clone().map(Arc::new),
        };
        let mut entries = self.entries();
        let entry = entries.entry(key.clone()).or_default();
        let newer = match &entry.server {
            Some(known) if known.uid == seen.uid => rv_num(&seen.rv) > rv_num(&known.rv),
            _ => true,
        };
        if newer {
            entry.server = Some(seen);
        }
    }

    /// Forgets a Job whose profile is gone: edits still waiting are answered `None`.
    pub fn forget(&self, key: &JobKey) {
        let gone = self.entries().remove(key);
        if let Some(entry) = gone {
            for edit in entry.edits {
                let _ = edit.done.send(None);
            }
        }
        self.shared.queue.forget(key);
    }

    /// The roll-up's newest wanted status for `key` (replacing any not
    /// written yet), of the workload of uid `by`.
    pub fn submit(&self, key: &JobKey, by: &str, analysis: Analysis) {
        {
            let mut entries = self.entries();
            let entry = entries.entry(key.clone()).or_default();
            entry.analysis = Some(analysis.status);
            entry.analysis_by = Some(by.to_string());
            entry.notices.extend(analysis.notices);
            bound_notices(&mut entry.notices);
        }
        self.shared.queue.add(key.clone());
    }

    /// The annotations Job `key` (uid `job_uid`) should carry; an empty map removes ours.
    pub fn annotate(&self, key: &JobKey, job_uid: &str, values: BTreeMap<String, String>) {
        self.annotate_object(
            key,
            memprof_api::workload::WorkloadKind::Job,
            job_uid,
            values,
        );
    }

    /// The annotations the top-level object of `kind` under `key`'s name
    /// (uid `uid`) should carry: the same writes as a Job's, counted and
    /// spaced the same.
    pub fn annotate_object(
        &self,
        key: &JobKey,
        kind: memprof_api::workload::WorkloadKind,
        uid: &str,
        values: BTreeMap<String, String>,
    ) {
        let wanted = Annotations {
            kind,
            job_uid: uid.to_string(),
            values,
        };
        self.entries().entry(key.clone()).or_default().annotations = Some(wanted);
        self.shared.queue.add(key.clone());
    }

    /// The annotations memprof put or is about to put on the Job, when
    /// newer than the Job at `job_rv` (the cached copy): `None` means the
    /// cached Job's own annotations are current.
    pub fn annotations(&self, key: &JobKey, job_rv: u64) -> Option<BTreeMap<String, String>> {
        let entries = self.entries();
        let entry = entries.get(key)?;
        if let Some(pending) = &entry.annotations {
            return Some(pending.values.clone());
        }
        match &entry.annotated {
            Some((rv, values)) if *rv > job_rv => Some(values.clone()),
            _ => None,
        }
    }

    /// The status as it stands with the newest analysis (edits not yet
    /// written aside): what the next decision builds on.
    pub fn view(&self, key: &JobKey) -> Option<MemoryProfileStatus> {
        let entries = self.entries();
        let entry = entries.get(key)?;
        let server = entry.server.as_ref().and_then(|s| s.status.as_deref());
        compose(server, entry.analysis.as_ref().or(entry.writing.as_ref()))
    }

    /// Whether the newest analysis of `key` is the roll-up of workload
    /// `uid`: what its remediation may decide on. Not when a namesake of
    /// another kind or uid handed one over under the name last, nor when
    /// none was handed over since this process started.
    pub fn analysed_by(&self, key: &JobKey, uid: &str) -> bool {
        let entries = self.entries();
        let by = entries.get(key).and_then(|e| e.analysis_by.as_deref());
        by == Some(uid)
    }

    /// Whether the writer has heard of the profile of `key`.
    pub fn knows(&self, key: &JobKey) -> bool {
        self.entries()
            .get(key)
            .is_some_and(|e| e.server.is_some() || e.has_work())
    }

    /// Applies `change` to the newest status of `key` and writes it; waits
    /// until it is written. `change` may run more than once (again on a
    /// fresher status after a conflict); returning `None` writes nothing for
    /// it. Answers the written status and `change`'s last value, or `None`
    /// when the profile or its status is gone or `change` declined.
    pub async fn edit<T, F>(
        &self,
        key: &JobKey,
        mut change: F,
    ) -> Result<Option<(Arc<MemoryProfileStatus>, T)>, WriteError>
    where
        T: Send + 'static,
        F: FnMut(&mut MemoryProfileStatus) -> Option<T> + Send + 'static,
    {
        let slot = Arc::new(Mutex::new(None));
        let out = slot.clone();
        let change: Change = Box::new(move |st| {
            let value = change(st);
            let applies = value.is_some();
            *out.lock().unwrap_or_else(|e| e.into_inner()) = value;
            applies
        });
        let (done, answer) = oneshot::channel();
        self.entries()
            .entry(key.clone())
            .or_default()
            .edits
            .push(Edit { change, done });
        self.shared.queue.add(key.clone());
        let written = answer.await.map_err(|_| WriteError::Stopped)?;
        let value = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
        Ok(written.zip(value))
    }

    /// Jobs waiting for a write now, and waiting for their spacing.
    pub fn backlog(&self) -> (usize, usize) {
        (self.shared.queue.len(), self.shared.queue.delayed())
    }

    /// Serves writes with `opts.workers` workers until `shutdown`; edits
    /// still waiting are then answered [`WriteError::Stopped`].
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let workers: Vec<_> = (0..self.shared.opts.workers.max(1))
            .map(|_| tokio::spawn(worker(self.shared.clone())))
            .collect();
        shutdown.await;
        self.shared.queue.close();
        for w in workers {
            let _ = w.await;
        }
        self.entries().clear();
    }
}

fn rv_num(rv: &str) -> u64 {
    rv.parse().unwrap_or(0)
}

async fn worker(shared: Arc<Shared>) {
    while let Some(key) = shared.queue.next().await {
        serve(&shared, &key).await;
        shared.queue.done(&key);
    }
}

impl Shared {
    fn entries(&self) -> MutexGuard<'_, HashMap<JobKey, Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a pass's work out of the entry, or says how long its spacing lasts.
    fn take(&self, key: &JobKey, now: Instant) -> Result<Option<Work>, Duration> {
        let mut entries = self.entries();
        let Some(e) = entries.get_mut(key).filter(|e| e.has_work()) else {
            return Ok(None);
        };
        if let Some(wait) = e
            .last_write
            .and_then(|t| self.opts.min_interval.checked_sub(now - t))
        {
            return Err(wait);
        }
        e.writing = e.analysis.clone();
        Ok(Some(Work {
            server: e.server.clone(),
            analysis: e.analysis.take(),
            notices: std::mem::take(&mut e.notices),
            edits: std::mem::take(&mut e.edits),
            annotations: e.annotations.take(),
            since_status: e.last_status_write.map(|t| now - t),
        }))
    }

    /// Puts back what a pass could not write (newer wishes win), to retry
    /// after `delay` (`None`: at once).
    fn put_back(&self, key: &JobKey, work: Work, delay: Option<Duration>) {
        {
            let mut entries = self.entries();
            let e = entries.entry(key.clone()).or_default();
            e.writing = None;
            if e.analysis.is_none() {
                e.analysis = work.analysis;
            }
            let newer = std::mem::replace(&mut e.notices, work.notices);
            e.notices.extend(newer);
            bound_notices(&mut e.notices);
            let newer = std::mem::replace(&mut e.edits, work.edits);
            e.edits.extend(newer);
            if e.annotations.is_none() {
                e.annotations = work.annotations;
            }
        }
        match delay {
            Some(d) => self.queue.add_after(key.clone(), d),
            None => self.queue.add(key.clone()),
        }
    }

    /// Counts one more failure in a row for `key`: how many, and the delay before the next try.
    fn failed(&self, key: &JobKey) -> (u32, Duration) {
        let mut entries = self.entries();
        let e = entries.entry(key.clone()).or_default();
        e.failures = e.failures.saturating_add(1);
        let delay = memprof_runtime::backoff::STATUS_WRITE.after(e.failures);
        (e.failures, delay)
    }
}

/// One pass over Job `key`: its status, then its annotations.
async fn serve(shared: &Shared, key: &JobKey) {
    let now = Instant::now();
    let work = match shared.take(key, now) {
        Ok(Some(work)) => work,
        Ok(None) => return,
        Err(wait) => {
            shared.queue.add_after(key.clone(), wait);
            return;
        }
    };
    let annotations = work.annotations.clone();
    let mut work = work;
    work.annotations = None;
    let mut wrote = false;
    if work.analysis.is_some() || !work.edits.is_empty() {
        wrote |= write_status(shared, key, work).await;
    }
    if let Some(a) = annotations {
        wrote |= write_annotations(shared, key, a).await;
    }
    // Wishes that came in meanwhile queued the Job again (it was running):
    // its next pass finds the spacing and waits it out.
    if wrote {
        if let Some(e) = shared.entries().get_mut(key) {
            e.last_write = Some(now);
        }
    }
}

mod write;
use write::{write_annotations, write_status};

#[cfg(test)]
mod notice_tests {
    use super::*;
    use crate::operator::reconcile::EventPlan;

    fn notice(reason: &'static str, n: usize) -> Notice {
        Notice {
            plan: EventPlan {
                reason,
                warning: true,
                note: format!("{n}"),
            },
            regarding: Default::default(),
            related: None,
        }
    }

    /// Refused reports that name a victim Job fill the queue: the victim's
    /// own risk Event stays, and the refusals keep only their newest few.
    #[test]
    fn refused_reports_never_push_out_the_jobs_own_events() {
        let mut queue = vec![notice("RiskCritical", 0)];
        for i in 0..100 {
            queue.push(notice(REPORT_REJECTED, i));
            bound_notices(&mut queue);
        }
        assert_eq!(queue[0].plan.reason, "RiskCritical");
        let refusals: Vec<_> = queue.iter().skip(1).map(|n| n.plan.note.as_str()).collect();
        assert_eq!(refusals, ["96", "97", "98", "99"]);
        // The Job's own Events are still bounded, the oldest going first.
        for i in 0..40 {
            queue.push(notice("RiskHigh", i));
            bound_notices(&mut queue);
        }
        assert_eq!(queue.len(), MAX_NOTICES);
    }
}

#[cfg(test)]
mod analysed_by_tests {
    use super::*;
    use kube::runtime::events::Reporter;
    use memprof_api::MemoryProfileSpec;

    /// A writer whose workers never run: handing over and asking are
    /// bookkeeping, no request is made (the address is never dialled).
    fn writer() -> StatusWriter {
        let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
        let client = Client::try_from(config).unwrap();
        let recorder = Recorder::new(client.clone(), Reporter::from("test"));
        let metrics = Metrics::register(&mut Default::default());
        StatusWriter::new(client, recorder, metrics, WriterOptions::default())
    }

    fn analysis() -> Analysis {
        Analysis {
            status: MemoryProfileStatus::default(),
            notices: Vec::new(),
        }
    }

    /// Remediation decides only on a workload's own roll-up: the writer
    /// says whose was handed over last under a name, per name, and says
    /// no while none was (a profile seen on the server is no roll-up),
    /// once another uid handed one over, and once the name is forgotten.
    #[tokio::test]
    async fn analysed_by_names_whose_roll_up_was_handed_over_last() {
        let w = writer();
        let (key, other) = (JobKey::new("ml", "train"), JobKey::new("ml", "eval"));
        let mut seen = MemoryProfile::new("train", MemoryProfileSpec::default());
        seen.metadata.uid = Some("profile-uid".into());
        seen.status = Some(MemoryProfileStatus::default());
        w.observe(&key, &seen);
        assert!(!w.analysed_by(&key, "js-uid"), "none handed over yet");
        w.submit(&key, "js-uid", analysis());
        assert!(w.analysed_by(&key, "js-uid"));
        assert!(!w.analysed_by(&key, "pt-uid"));
        assert!(!w.analysed_by(&other, "js-uid"), "per name");
        // A namesake of another kind hands its roll-up over under the name.
        w.submit(&key, "pt-uid", analysis());
        assert!(!w.analysed_by(&key, "js-uid"));
        assert!(w.analysed_by(&key, "pt-uid"));
        // Annotations wanted for another uid are no roll-up.
        w.annotate(&key, "job-uid", BTreeMap::new());
        assert!(w.analysed_by(&key, "pt-uid"));
        assert!(!w.analysed_by(&key, "job-uid"));
        w.forget(&key);
        assert!(!w.analysed_by(&key, "pt-uid"), "forgotten");
    }
}
