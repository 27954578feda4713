//! The remediation stage: on the data the roll-up fetched and screened,
//! detect new GPU OOMs and evaluate the policies (both pure, in
//! `remediation/`), and hand what must be recorded or resumed to a
//! remediation task. Never awaits an API call: the task does.

use super::reconcile::Fetched;
use super::rollups;
use super::state::Context;
use super::tracked::{all_reports, pod_of, screen_one};
use super::workload_ranks::{claiming, count_ranks};
use crate::key::JobKey;
use crate::operator::reconcile::profiling_enabled;
use crate::operator::trust;
use crate::remediation::oom::SIDECAR_CONTAINER;
use crate::remediation::ranks::Counted;
use crate::remediation::{
    decide, notify, oom, CountedReports, Decision, Executor, JobCheckpoints, Ranks, Target,
};
use crate::status::annotate_workload;
use crate::workload::rank::PyTorchShape;
use crate::workload::read::api_resource;
use crate::workload::resolve::Workload;
use crate::workload::rollup::Layout;
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use memprof_api::workload::{WorkloadKind, LABEL_WORKLOAD_KIND};
use memprof_api::{
    Acknowledgements, MemoryProfile, MemoryProfileStatus, MemoryReport, MemoryReportSpec,
    RemediationRecord, MAX_HISTORY,
};
use memprof_policy::triggers::PHASE_PENDING;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

/// Evaluation of every Job's policies without changes: cooldowns end and
/// `forSeconds` elapse without any watch event.
const RESYNC: Duration = Duration::from_secs(60);

/// Runs the remediation stage for the fetched Job; returns when to look again.
pub(super) fn run(ctx: &Arc<Context>, f: &Fetched) -> Option<Duration> {
    let exec = ctx.executor.clone()?;
    match workload_target(ctx, &exec, f) {
        Some(Some(target)) => return run_workload(ctx, &f.key, &target),
        // Its labels are being read (a task): it is reconciled again then.
        Some(None) => return None,
        None => {}
    }
    // The roll-up writes the first status; remediation builds on it.
    let view = ctx.writer.view(&f.key)?;
    if ctx.with_state(&f.key, |s| s.busy) {
        // The running task queues the Job again when it ends.
        return None;
    }
    if let Some(pending) = view.remediations.iter().find(|r| r.phase == PHASE_PENDING) {
        let (key, record) = (f.key.clone(), pending.clone());
        // A workload's profile whose pipeline has not handed its ranks over
        // yet (a restarted operator): its checkpoints are not known here,
        // and no ranks would end its wait as if none ever checkpointed.
        let ranks = (!of_a_workload(f.profile.as_deref()))
            .then(|| counted_checkpoints(ctx, &key, f.job.as_deref()));
        ctx.spawn_task(key.clone(), exec.resume(key, record, ranks));
        return None;
    }
    let now = Timestamp::now();
    if let Some(tallies) = changed_tallies(ctx, &f.key, &view.remediations, now) {
        let key = f.key.clone();
        ctx.spawn_task(key.clone(), exec.record_tallies(key, tallies));
        return None;
    }
    // Only the pods (and their counted reports) that changed since the last
    // scan: what is already recorded is not recorded again anyway.
    let scan = rollups::take_oom_scan(ctx, &f.key);
    // OOM evidence only from the Job's own pods, screened like reports
    // (`trust::admitted`).
    let job_uid = f.job.as_deref().and_then(|j| j.uid()).unwrap_or_default();
    let keys = ctx.setup.options.admission.ring();
    let pods = scan.pods.iter().map(|p| p.as_ref());
    let admitted = trust::admitted(pods, &job_uid, &keys, now);
    let specs: Vec<&MemoryReportSpec> = scan.reports.iter().map(|r| &r.spec).collect();
    let ooms = oom::detect(&admitted, &specs, &view.ooms, now);
    let mut with_ooms = view.clone();
    with_ooms.ooms = oom::merge(&view.ooms, &ooms, MAX_HISTORY);
    // A decision only on the Job's own roll-up, never a namesake's.
    let own = |j: &Job| ctx.writer.analysed_by(&f.key, &j.uid().unwrap_or_default());
    let live = f
        .job
        .as_deref()
        .filter(|j| j.metadata.deletion_timestamp.is_none() && profiling_enabled(j) && own(j));
    let (decision, again) = match live {
        Some(job) => decide_on(ctx, &exec, &f.key, job, &with_ooms, now),
        None => (None, RESYNC),
    };
    if decision.is_some() || !ooms.is_empty() {
        let job_uid = f.job.as_deref().and_then(|j| j.uid());
        let key = f.key.clone();
        ctx.spawn_task(key.clone(), exec.record(key, job_uid, ooms, decision));
    }
    Some(again)
}

/// The remediation stage of a top-level workload's profile `wkey`
/// (JobSet, TrainJob, PyTorchJob): its policies are evaluated on its status
/// and its labels as last read from the API server (`target`), and a
/// decision recorded and carried out by the executor, which changes the
/// workload the least disruptive way its kind allows
/// (`remediation::workload`). Kind-generic: each kind's pipeline calls it
/// after handing the workload's status to the writer, having said which
/// Jobs' reports are its ranks' (`Executor::set_target`). New GPU OOMs of
/// its ranks are recorded with the decision, as a Job's are (`workload_ooms.rs`).
pub(super) fn run_workload(ctx: &Arc<Context>, wkey: &JobKey, target: &Target) -> Option<Duration> {
    let exec = ctx.executor.clone()?;
    let view = ctx.writer.view(wkey)?;
    // Its own roll-up, never what a namesake handed over under its name.
    let own = ctx.writer.analysed_by(wkey, &target.uid);
    // An OOM recorded since the roll-up handed the status over is annotated now.
    let top = Workload {
        kind: target.kind,
        name: wkey.name.clone(),
        uid: target.uid.clone(),
    };
    if own {
        annotate_workload(&ctx.writer, wkey, &top, &view);
    }
    if ctx.with_state(wkey, |s| s.busy) {
        // Checked again, atomically, before spawning (`spawn_one`).
        return None;
    }
    if let Some(pending) = view.remediations.iter().find(|r| r.phase == PHASE_PENDING) {
        let (key, record) = (wkey.clone(), pending.clone());
        let ranks = checkpoints_of(&workload_counted(ctx, &wkey.namespace, &target.ranks));
        spawn_one(ctx, &key, exec.resume(key.clone(), record, Some(ranks)));
        return None;
    }
    if !own {
        return Some(RESYNC);
    }
    let now = Timestamp::now();
    let open = notify::open_tallies(&view.remediations, now);
    if !open.is_empty() {
        let reports = ctx.counted(wkey);
        if let Some(tallies) = tallies_changed(open, &reports) {
            let key = wkey.clone();
            spawn_one(ctx, &key, exec.record_tallies(key.clone(), tallies));
            return None;
        }
    }
    let ooms = super::workload_ooms::scan(ctx, wkey, target, &view.ooms, now);
    let mut with_ooms = view.clone();
    with_ooms.ooms = oom::merge(&view.ooms, &ooms, MAX_HISTORY);
    let job = stand_in(wkey, target);
    let (decision, again) = decide_on(ctx, &exec, wkey, &job, &with_ooms, now);
    if decision.is_some() || !ooms.is_empty() {
        let key = wkey.clone();
        let uid = Some(target.uid.clone());
        spawn_one(ctx, &key, exec.record(key.clone(), uid, ooms, decision));
    }
    Some(again)
}

/// What a policy's selector reads of workload `target`: its name, uid and labels.
fn stand_in(wkey: &JobKey, target: &Target) -> Job {
    let mut job = Job::default();
    job.metadata.name = Some(wkey.name.clone());
    job.metadata.namespace = Some(wkey.namespace.clone());
    job.metadata.uid = Some(target.uid.clone());
    job.metadata.labels = Some(target.labels.clone());
    job
}

/// The top-level workload `f`'s profile is about (`None`: a Job's);
/// `Some(None)` while its labels are read (a task spawned here).
fn workload_target(
    ctx: &Arc<Context>,
    exec: &Arc<Executor>,
    f: &Fetched,
) -> Option<Option<Target>> {
    if let Some((uid, ranks)) = pytorch_ranks(ctx, f) {
        // Its labels (the selector's, Kueue's queue) are not in the slim
        // cache: read by a task, again at most every 60 s.
        let known = exec.target(&f.key).filter(|t| t.uid == uid);
        match known.filter(|t| t.read.elapsed() <= Duration::from_secs(60)) {
            // Its layout as cached now (a resize is seen at once).
            Some(t) => exec.set_target(&f.key, Target { ranks, ..t }),
            None => {
                let (key, kind) = (f.key.clone(), WorkloadKind::PyTorchJob);
                let read = exec.clone().read_target(key.clone(), kind, uid, ranks);
                spawn_one(ctx, &key, read);
                return Some(None);
            }
        }
    }
    let job_uid = f.job.as_ref().and_then(|j| j.uid());
    if job_uid.is_some() && profile_owner(ctx, &f.key) == job_uid {
        // The name's profile is a Job's now (its workload gone and a Job
        // created under the name): no workload's remediation is due.
        exec.forget_target(&f.key);
    }
    // A top-level workload's profile (reconciled after a remediation task too).
    exec.target(&f.key).map(Some)
}

/// Whether `profile` is a top-level workload's (labelled with a kind other
/// than Job by the pipeline that made it), not a Job's.
fn of_a_workload(profile: Option<&MemoryProfile>) -> bool {
    let kind = profile.and_then(|p| p.labels().get(LABEL_WORKLOAD_KIND));
    kind.is_some_and(|k| k != WorkloadKind::Job.kind())
}

/// The uid of the owner of profile `key` as cached, if any.
fn profile_owner(ctx: &Context, key: &JobKey) -> Option<String> {
    let at = ObjectRef::new(&key.name).within(&key.namespace);
    let profile = ctx.caches.profiles.get(&at)?;
    profile.owner_references().first().map(|o| o.uid.clone())
}

/// The uid and ranks of the PyTorchJob under `f`'s key, when it is
/// profiled and the profile is its own (names its uid as owner): its ranks
/// are the reports claiming its name whose pods its layout proves its own,
/// as its roll-up counts them.
fn pytorch_ranks(ctx: &Context, f: &Fetched) -> Option<(String, Ranks)> {
    let kind = WorkloadKind::PyTorchJob;
    let at = ObjectRef::new_with(&f.key.name, api_resource(kind)).within(&f.key.namespace);
    let pt = ctx.pytorch.jobs.get(&at)?;
    let uid = pt.uid()?;
    // From the cache: the Job path's `Fetched` hides a workload's profile.
    let at = ObjectRef::new(&f.key.name).within(&f.key.namespace);
    let owns = |p: &Arc<MemoryProfile>| p.owner_references().iter().any(|o| o.uid == uid);
    ctx.caches.profiles.get(&at).filter(owns)?;
    // A malformed spec has no profile either (its pipeline says why).
    let shape = PyTorchShape::from_spec(&pt.data["spec"]).ok()?;
    let ranks = Ranks {
        claims: BTreeSet::from([f.key.name.clone()]),
        layout: Layout::PyTorchJob {
            uid: uid.clone(),
            shape,
        },
    };
    Some((uid, ranks))
}

/// Spawns `task` for workload profile `key` unless one runs: the check and
/// the claim are one step, since a workload's child Jobs are reconciled
/// concurrently (a Job's key by one worker at a time) and two tasks must
/// never carry out one plan side by side.
fn spawn_one(
    ctx: &Arc<Context>,
    key: &JobKey,
    task: impl std::future::Future<Output = Option<Duration>> + Send + 'static,
) {
    if ctx.with_state(key, |s| !std::mem::replace(&mut s.busy, true)) {
        ctx.spawn_task(key.clone(), task);
    }
}

/// The policies of `key`'s namespace evaluated on `job` (or the workload's
/// stand-in) with `status`, the risk clock of `key` advanced to `now`.
fn decide_on(
    ctx: &Context,
    exec: &Executor,
    key: &JobKey,
    job: &Job,
    status: &MemoryProfileStatus,
    now: Timestamp,
) -> (Option<Decision>, Duration) {
    let clock = ctx.with_state(key, |s| {
        s.clock.observe(status.risk, now);
        s.clock.clone()
    });
    let ns = Some(key.namespace.as_str());
    let policies = exec
        .policies()
        .state_filter(|p| p.metadata.namespace.as_deref() == ns);
    decide(&policies, job, status, &clock, now, RESYNC)
}

/// The tallies of `open` that `reports` change; `None` when none does.
fn tallies_changed(
    open: Vec<(String, Acknowledgements)>,
    reports: &[Arc<MemoryReport>],
) -> Option<Vec<(String, Acknowledgements)>> {
    let changed: Vec<_> = open
        .into_iter()
        .filter_map(|(id, was)| {
            let t = notify::tally(reports.iter().map(|r| r.as_ref()), &id, was.not_delivered);
            if t.ok + t.failed < was.ok + was.failed {
                return None;
            }
            (t != was).then_some((id, t))
        })
        .collect();
    (!changed.is_empty()).then_some(changed)
}

/// The `notifyTrainer` tallies of the Job's open records (`notify::open_tallies`)
/// that its counted reports' acknowledgements now change; `None` when none
/// changes (then nothing is written). O(counted reports), and only while a
/// record's tally is open.
fn changed_tallies(
    ctx: &Context,
    key: &JobKey,
    records: &[RemediationRecord],
    now: Timestamp,
) -> Option<Vec<(String, Acknowledgements)>> {
    let open = notify::open_tallies(records, now);
    if open.is_empty() {
        return None;
    }
    let reports = counted_reports(ctx, key);
    let changed: Vec<_> = open
        .into_iter()
        .filter_map(|(id, was)| {
            let t = notify::tally(reports.iter().map(|r| r.as_ref()), &id, was.not_delivered);
            // A rank that left (its pod gone) does not undo the answers counted.
            if t.ok + t.failed < was.ok + was.failed {
                return None;
            }
            (t != was).then_some((id, t))
        })
        .collect();
    (!changed.is_empty()).then_some(changed)
}

/// The reports the pipeline counts for Job `key`: screened by trust
/// (`operator/trust.rs`: its own pod's, an admitted pod of the Job), as the
/// roll-up holds them: tallies are recounted only while no remediation is
/// pending, when the roll-up is kept fresh.
fn counted_reports(ctx: &Context, key: &JobKey) -> Vec<Arc<MemoryReport>> {
    let names: Vec<String> = ctx.with_state(key, |s| {
        s.rollup.as_ref().map_or_else(Vec::new, |t| {
            t.known
                .iter()
                .filter(|n| !t.refused.contains_key(*n))
                .cloned()
                .collect()
        })
    });
    names
        .iter()
        .filter_map(|n| rollups::report_of(&ctx.caches, key, n))
        .collect()
}

/// The directives of `notifyTrainer` go to the reports that count now
/// ([`screened_reports`]): the roll-up is not refreshed while the record is
/// pending, and a restarted operator has none for the Job.
impl CountedReports for Context {
    fn counted(&self, key: &JobKey) -> Vec<Arc<MemoryReport>> {
        // A workload's ranks: exactly those its roll-up counts.
        if let Some(target) = self.executor.as_ref().and_then(|e| e.target(key)) {
            let counted = workload_counted(self, &key.namespace, &target.ranks);
            return counted.into_iter().map(|(r, _)| r).collect();
        }
        let job = self
            .caches
            .jobs
            .get(&ObjectRef::new(&key.name).within(&key.namespace));
        match job.and_then(|j| j.uid()) {
            Some(uid) => screened_reports(self, key, &uid),
            None => Vec::new(),
        }
    }
}

/// The reports of Job `key` (uid `uid`) that pass screening now (trust
/// rules 1–4, `tracked::screen_one`): the roll-up's known ones, or, when
/// this process has no roll-up of this Job (a restart while a remediation
/// is pending: the roll-up stage leaves such a Job alone), every report
/// claiming it. Screened here, not taken from the roll-up, which is not
/// refreshed while a remediation is pending. O(the Job's reports); called
/// only while a remediation is pending.
fn screened_reports(ctx: &Context, key: &JobKey, uid: &str) -> Vec<Arc<MemoryReport>> {
    let known = ctx.with_state(key, |s| {
        let tracked = s.rollup.as_ref().filter(|t| t.job_uid == uid);
        tracked.map(|t| t.known.clone())
    });
    let names = known.unwrap_or_else(|| all_reports(&ctx.caches, key));
    let keys = ctx.setup.options.admission.ring();
    let now = Timestamp::now();
    names
        .iter()
        .filter_map(|n| rollups::report_of(&ctx.caches, key, n))
        .filter(|r| screen_one(&ctx.caches, key, r, uid, &keys, now).is_ok())
        .collect()
}

/// The counted ranks' newest checkpoints (`lastCheckpoint` of the Job's
/// [`screened_reports`]): what a restart may wait for, and how many of
/// those ranks' trainers have exited.
fn counted_checkpoints(ctx: &Context, key: &JobKey, job: Option<&Job>) -> JobCheckpoints {
    let Some(uid) = job.and_then(|j| j.uid()) else {
        return JobCheckpoints::default();
    };
    let counted: Vec<Counted> = screened_reports(ctx, key, &uid)
        .into_iter()
        .map(|r| {
            let pod = pod_of(&ctx.caches, key, &r.spec.pod_name);
            (r, pod)
        })
        .collect();
    checkpoints_of(&counted)
}

/// The reports of workload ranks `ranks` in namespace `ns` that count now,
/// with their pods: one scan of the report cache (O(cached reports)),
/// called only while a remediation is pending or a tally open.
fn workload_counted(ctx: &Context, ns: &str, ranks: &Ranks) -> Vec<Counted> {
    count_ranks(ctx, ns, ranks, claiming(ctx, ns, ranks))
}

/// The newest checkpoints of `counted` ranks (one Job's, or all of a
/// workload's), and how many of their trainers have exited.
fn checkpoints_of(counted: &[Counted]) -> JobCheckpoints {
    let mut ranks =
        JobCheckpoints::new(counted.iter().map(|(r, _)| r.spec.last_checkpoint.clone()));
    let pods = counted.iter().filter_map(|(_, p)| p.as_deref());
    ranks.exited = pods.filter(|p| trainer_exited(p)).count() as u32;
    ranks
}

/// Whether a container of `pod` other than memprof's sidecar is terminated
/// now (not restarted): its trainer checkpoints no more.
fn trainer_exited(pod: &Pod) -> bool {
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref());
    statuses.into_iter().flatten().any(|c| {
        c.name != SIDECAR_CONTAINER && c.state.as_ref().is_some_and(|s| s.terminated.is_some())
    })
}
