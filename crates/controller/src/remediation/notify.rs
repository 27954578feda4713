//! `notifyTrainer`: tell every counted rank's trainer to act at a level,
//! in-process and without a restart.
//!
//! The channel is each counted rank's MemoryReport `status.directives`:
//! the status subresource, which the reporter Role does not grant, so only
//! the operator writes it and no pod can order another rank's trainer (or
//! its own). The rank's sidecar relays the directive in its answer to the
//! agent's pushes, and writes the agent's acknowledgements into its
//! report's `spec.agentAcks`; the remediation stage tallies them into the
//! record ([`tally`]). Every rank gets the one directive, whose id is the
//! record's, so the whole Job acts in step and a rerun of the step (after
//! a crash or an error) finds it written and writes nothing.
//!
//! Bounds: one status patch per rank per directive (a conflict with another
//! writer of the status is read again, at most [`MAX_TRIES`] patches in
//! all; each counted in `memprof_remediation_directive_writes_total`); at
//! most 16 directives per report, the newest kept.

use super::executor::Executor;
use super::{Error, Result};
use crate::key::JobKey;
use kube::api::{Api, Patch, PatchParams};
use kube::ResourceExt;
use memprof_api::agent::{Directive, DirectiveKind};
use memprof_api::{
    truncate_utf8, Acknowledgements, MemoryReport, NotifyLevel, RemediationRecord, MAX_ACK_RANKS,
    MAX_REPORT_DIRECTIVES, OPERATOR_MANAGER,
};
use memprof_policy::plan::Plan;
use std::collections::BTreeMap;
use std::sync::Arc;
use tracing::info;

/// Patches of one report's status for one directive, at most (conflicts included).
pub const MAX_TRIES: u32 = 3;

/// The reports the pipeline counts for a Job now (its admitted pods' own):
/// the only ones a directive is written to and an acknowledgement read from.
pub trait CountedReports: Send + Sync {
    /// The counted reports of Job `key`.
    fn counted(&self, key: &JobKey) -> Vec<Arc<MemoryReport>>;
}

/// The directive of plan `id` (the record's id, so every rank gets the same).
pub fn directive(id: &str, level: NotifyLevel, reason: &str) -> Directive {
    let mut reason = reason.to_string();
    truncate_utf8(&mut reason, memprof_api::agent::MAX_DIRECTIVE_REASON);
    Directive {
        id: id.into(),
        kind: DirectiveKind::NotifyTrainer,
        level: level.risk(),
        reason,
    }
}

/// The directives with `d` added, the newest 16 kept; `None` when `d`'s id
/// is there already (nothing to write).
pub fn with_directive(existing: &[Directive], d: &Directive) -> Option<Vec<Directive>> {
    if existing.iter().any(|e| e.id == d.id) {
        return None;
    }
    let mut out = existing.to_vec();
    out.push(d.clone());
    let excess = out.len().saturating_sub(MAX_REPORT_DIRECTIVES);
    out.drain(..excess);
    Some(out)
}

/// How writing one rank's directive ended.
#[derive(Debug, PartialEq)]
enum Delivery {
    /// Written now, or found written by an earlier attempt.
    Delivered,
    /// The report is gone: not a rank any more.
    Gone,
    /// Refused for good, with why.
    Refused(String),
}

/// Writes directive `d` into report `name`'s status (read, then a merge
/// patch on the read resourceVersion, so a concurrent write is never undone).
async fn write_one(
    exec: &Executor,
    api: &Api<MemoryReport>,
    name: &str,
    d: &Directive,
) -> kube::Result<Delivery> {
    let pp = PatchParams {
        field_manager: Some(OPERATOR_MANAGER.into()),
        ..Default::default()
    };
    for _ in 0..MAX_TRIES {
        let Some(report) = api.get_opt(name).await? else {
            return Ok(Delivery::Gone);
        };
        let existing = report.status.map(|s| s.directives).unwrap_or_default();
        let Some(directives) = with_directive(&existing, d) else {
            return Ok(Delivery::Delivered);
        };
        let body = serde_json::json!({
            "metadata": {"resourceVersion": report.metadata.resource_version},
            "status": {"directives": directives},
        });
        exec.metrics.directive_writes.inc();
        match api.patch_status(name, &pp, &Patch::Merge(&body)).await {
            Ok(_) => return Ok(Delivery::Delivered),
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(Delivery::Gone),
            Err(kube::Error::Api(s)) if matches!(s.code, 400 | 403 | 422) => {
                return Ok(Delivery::Refused(format!("{} ({})", s.message, s.code)))
            }
            Err(e) => return Err(e),
        }
    }
    Ok(Delivery::Refused(format!(
        "its status changed under every one of {MAX_TRIES} writes"
    )))
}

/// Step `notifyTrainer`: the directive on every counted rank's report, then
/// the record's first tally (every rank pending); returns what was done,
/// for the record. A transient error fails the step (retried: what is
/// written stays written); a report that cannot be written is named in the
/// record.
pub(super) async fn deliver(
    exec: &Executor,
    key: &JobKey,
    plan: &Plan,
    d: &Directive,
) -> Result<Vec<String>> {
    let api: Api<MemoryReport> = Api::namespaced(exec.client.clone(), &key.namespace);
    let mut delivered = Vec::new();
    let mut refused = Vec::new();
    for report in exec.counted_reports(key) {
        let name = report.name_any();
        let ended = write_one(exec, &api, &name, d)
            .await
            .map_err(|source| Error::Step {
                id: plan.id.clone(),
                step: format!(
                    "writing the directive into MemoryReport {}/{name} of",
                    key.namespace
                ),
                source,
            })?;
        match ended {
            Delivery::Delivered => delivered.push(report),
            Delivery::Gone => {}
            Delivery::Refused(why) => {
                refused.push(format!("{} ({name}): {why}", rank_name(&report)))
            }
        }
    }
    let level = d.level.as_str();
    info!(id = %plan.id, level, ranks = delivered.len(), refused = refused.len(), "notified the trainers");
    // Just written: the cached reports may not show the directive yet.
    let answers = delivered.iter().map(|r| {
        let a = answer(r, &d.id).unwrap_or(Answer::Pending);
        (r.spec.rank, r.name_any(), a)
    });
    let first = tally_answers(answers, refused.len() as u32);
    let mut done = vec![format!(
        "notifyTrainer {level}: directive on {} rank(s)",
        delivered.len()
    )];
    if !refused.is_empty() {
        let mut why = format!(
            "directive not written to {} rank(s): {}",
            refused.len(),
            refused.join("; ")
        );
        truncate_utf8(&mut why, 256);
        done.push(why);
    }
    let id = plan.id.clone();
    exec.edit(key, move |st| {
        let r = st.remediations.iter_mut().find(|r| r.id == id)?;
        (r.acknowledged.as_ref() != Some(&first)).then(|| r.acknowledged = Some(first.clone()))
    })
    .await?;
    Ok(done)
}

/// `rank 3`, or the report's name when it names no rank.
fn rank_name(r: &MemoryReport) -> String {
    match r.spec.rank {
        Some(n) => format!("rank {n}"),
        None => r.name_any(),
    }
}

/// What one rank answered a directive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Every acknowledging process did it.
    Ok,
    /// One process could not.
    Failed,
    /// None answered yet.
    Pending,
}

/// Rank `r`'s answer to directive `id`: `None` when the directive is not
/// its (not in its status, no acknowledgement of it either).
pub fn answer(r: &MemoryReport, id: &str) -> Option<Answer> {
    let acks: Vec<bool> = r
        .spec
        .agent_acks
        .iter()
        .filter(|a| a.id == id)
        .map(|a| a.ok)
        .collect();
    let carried = r
        .status
        .as_ref()
        .is_some_and(|s| s.directives.iter().any(|d| d.id == id));
    match (acks.is_empty(), acks.iter().all(|ok| *ok)) {
        (true, _) if carried => Some(Answer::Pending),
        (true, _) => None,
        (false, true) => Some(Answer::Ok),
        (false, false) => Some(Answer::Failed),
    }
}

/// The tally of directive `id` over `reports` (counted ones only: a report
/// of a pod that was not admitted is no rank and its acknowledgement no
/// answer).
pub fn tally<'a>(
    reports: impl Iterator<Item = &'a MemoryReport>,
    id: &str,
    not_delivered: u32,
) -> Acknowledgements {
    let answers = reports.filter_map(|r| Some((r.spec.rank, r.name_any(), answer(r, id)?)));
    tally_answers(answers, not_delivered)
}

/// The tally of ranks' answers `(rank, report name, answer)`. Lists are of
/// the lowest ranks, at most [`MAX_ACK_RANKS`] each.
pub fn tally_answers(
    answers: impl Iterator<Item = (Option<u32>, String, Answer)>,
    not_delivered: u32,
) -> Acknowledgements {
    let mut t = Acknowledgements {
        not_delivered,
        ..Default::default()
    };
    let (mut failed, mut pending) = (BTreeMap::new(), BTreeMap::new());
    for (rank, name, a) in answers {
        t.delivered += 1;
        let order = (rank.unwrap_or(u32::MAX), name);
        match a {
            Answer::Ok => t.ok += 1,
            Answer::Failed => {
                t.failed += 1;
                failed.insert(order, rank);
            }
            Answer::Pending => {
                t.pending += 1;
                pending.insert(order, rank);
            }
        }
    }
    let lowest = |m: BTreeMap<(u32, String), Option<u32>>| -> Vec<u32> {
        m.into_values().flatten().take(MAX_ACK_RANKS).collect()
    };
    t.failed_ranks = lowest(failed);
    t.pending_ranks = lowest(pending);
    t.summary = summary(&t);
    t
}

/// `2/3 acknowledged (1 failed: rank 1; 1 pending: rank 2)`.
fn summary(t: &Acknowledgements) -> String {
    let list = |n: u32, what: &str, ranks: &[u32]| {
        let names: Vec<String> = ranks.iter().map(|r| r.to_string()).collect();
        let more = if (n as usize) > ranks.len() {
            ", ..."
        } else {
            ""
        };
        match names.len() {
            0 => format!("{n} {what}"),
            1 => format!("{n} {what}: rank {}{more}", names[0]),
            _ => format!("{n} {what}: ranks {}{more}", names.join(", ")),
        }
    };
    let mut parts = Vec::new();
    if t.failed > 0 {
        parts.push(list(t.failed, "failed", &t.failed_ranks));
    }
    if t.pending > 0 {
        parts.push(list(t.pending, "pending", &t.pending_ranks));
    }
    if t.not_delivered > 0 {
        parts.push(format!("{} not delivered", t.not_delivered));
    }
    let mut s = format!(
        "{}/{} acknowledged",
        t.ok + t.failed,
        t.delivered + t.not_delivered
    );
    if !parts.is_empty() {
        s.push_str(&format!(" ({})", parts.join("; ")));
    }
    truncate_utf8(&mut s, 256);
    s
}

/// How long after its decision a record's tally is kept up to date: an
/// agent answers at its next push (seconds); a rank silent this long has no
/// agent, and the tally stays as it is.
pub const ACK_WINDOW: jiff::SignedDuration = jiff::SignedDuration::from_secs(1800);

/// The records of `records` whose tally is still open at `now` (a rank
/// pending, within [`ACK_WINDOW`] of the decision): (id, the tally recorded).
pub fn open_tallies(
    records: &[RemediationRecord],
    now: jiff::Timestamp,
) -> Vec<(String, Acknowledgements)> {
    records
        .iter()
        .filter_map(|r| Some((r, r.acknowledged.as_ref()?)))
        .filter(|(_, a)| a.pending > 0)
        .filter(|(r, _)| {
            r.time
                .parse::<jiff::Timestamp>()
                .is_ok_and(|t| now.duration_since(t) <= ACK_WINDOW)
        })
        .map(|(r, a)| (r.id.clone(), a.clone()))
        .collect()
}

impl Executor {
    /// Where the counted reports come from (the pipeline, set once it runs).
    pub fn set_counted(&self, source: std::sync::Weak<dyn CountedReports>) {
        let _ = self.counted.set(source);
    }

    /// The counted reports of Job `key` (none before the pipeline runs).
    pub(super) fn counted_reports(&self, key: &JobKey) -> Vec<Arc<MemoryReport>> {
        self.counted
            .get()
            .and_then(std::sync::Weak::upgrade)
            .map(|c| c.counted(key))
            .unwrap_or_default()
    }

    /// Writes the tallies that changed (`(id, tally)`, from the remediation
    /// stage) into their records: one status write for all of them, none
    /// when the newest status already says the same.
    pub async fn record_tallies(
        self: Arc<Self>,
        key: JobKey,
        tallies: Vec<(String, Acknowledgements)>,
    ) -> Option<std::time::Duration> {
        let written = self
            .edit(&key, move |st| {
                let mut changed = false;
                for (id, t) in &tallies {
                    let Some(r) = st.remediations.iter_mut().find(|r| &r.id == id) else {
                        continue;
                    };
                    let mut t = t.clone();
                    t.not_delivered = r.acknowledged.as_ref().map_or(0, |a| a.not_delivered);
                    t.summary = summary(&t);
                    if r.acknowledged.as_ref() != Some(&t) {
                        r.acknowledged = Some(t);
                        changed = true;
                    }
                }
                changed.then_some(())
            })
            .await;
        if let Err(e) = written {
            tracing::warn!(job = %key, error = %e, "cannot record the acknowledgements; retrying");
        }
        // At most one tally write a second per Job, whatever the acks' rate.
        Some(std::time::Duration::from_secs(1))
    }
}

#[cfg(test)]
mod tests;
