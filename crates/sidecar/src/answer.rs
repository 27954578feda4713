//! What the sidecar answers a push with (contract B, docs/agent-wire.md "The
//! answer"): its verdict as of the last analysis, the directives for the
//! trainer, and whether to record allocation history.
//!
//! Directives come from a [`Directives`] source the run loop consults at
//! each analysis. Directives are the operator's (a `notifyTrainer`
//! remediation, written where only the operator writes: the pod's own
//! MemoryReport's status). In a cluster the source is a [`watch::Receiver`]
//! fed by the task that reads that status (`directives.rs`); standalone it
//! is [`NoDirectives`].

use memprof_api::agent::{Directive, PushReply, Verdict, MAX_DIRECTIVES};
use memprof_api::{MemoryReportSpec, RiskLevel};
use tokio::sync::watch;

/// Where the directives for this pod's trainer come from. Called once per
/// analysis on the sampling loop: it must not block.
pub trait Directives: Send {
    /// The directives in force now (the answer bounds and dedupes them).
    fn current(&mut self) -> Vec<Directive>;
}

/// No directives (no policy drives the trainer).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoDirectives;

impl Directives for NoDirectives {
    fn current(&mut self) -> Vec<Directive> {
        vec![]
    }
}

/// Directives published by another task (the newest list wins).
impl Directives for watch::Receiver<Vec<Directive>> {
    fn current(&mut self) -> Vec<Directive> {
        self.borrow_and_update().clone()
    }
}

/// The verdict a report says, analysed at `at` (seconds since the epoch):
/// the worst risk, the smallest time to OOM, any leak, and where the worst
/// GPU's assessment came from.
pub fn verdict(report: &MemoryReportSpec, at: f64) -> Verdict {
    let worst = report.gpus.iter().max_by_key(|g| g.risk);
    Verdict {
        risk: report.summary.risk,
        tto_seconds: report
            .gpus
            .iter()
            .filter_map(|g| g.time_to_oom_seconds)
            .filter(|t| t.is_finite() && *t >= 0.0)
            .min_by(f64::total_cmp),
        leak: report.gpus.iter().any(|g| g.leak_suspected),
        source: worst.map_or(report.summary.source, |g| {
            g.assessed_from.unwrap_or(g.source)
        }),
        at,
    }
}

/// Builds answers; remembers whether the risk ever reached `high`.
#[derive(Debug, Default)]
pub struct Answers {
    reached_high: bool,
}

impl Answers {
    /// The answer after an analysis. `history` stays on once the risk has
    /// reached `high`: a trainer whose risk falls back keeps recording, so
    /// that an OOM after a second rise still names its code.
    pub fn answer(
        &mut self,
        report: &MemoryReportSpec,
        at: f64,
        directives: Vec<Directive>,
    ) -> PushReply {
        let verdict = verdict(report, at);
        self.reached_high |= verdict.risk >= RiskLevel::High;
        PushReply {
            accepted: true,
            verdict: Some(verdict),
            directives: bounded(directives),
            history: self.reached_high,
        }
    }
}

/// At most [`MAX_DIRECTIVES`], ids and reasons cut to their bounds, each id
/// once: what the agent reads.
fn bounded(directives: Vec<Directive>) -> Vec<Directive> {
    let mut out: Vec<Directive> = Vec::new();
    for d in directives.into_iter().filter_map(Directive::bounded) {
        if out.len() == MAX_DIRECTIVES {
            break;
        }
        if !out.iter().any(|o| o.id == d.id) {
            out.push(d);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_api::agent::DirectiveKind;
    use memprof_api::{DataSource, GpuReport};

    fn gpu(risk: RiskLevel, tto: Option<f64>, leak: bool, from: Option<DataSource>) -> GpuReport {
        GpuReport {
            risk,
            time_to_oom_seconds: tto,
            leak_suspected: leak,
            source: DataSource::Nvml,
            assessed_from: from,
            ..Default::default()
        }
    }

    fn report(gpus: Vec<GpuReport>) -> MemoryReportSpec {
        let mut r = MemoryReportSpec {
            gpus,
            ..Default::default()
        };
        r.summary.risk = r.gpus.iter().map(|g| g.risk).max().unwrap_or_default();
        r
    }

    #[test]
    fn the_verdict_is_the_worst_gpus_with_the_soonest_oom_and_any_leak() {
        let r = report(vec![
            gpu(RiskLevel::Low, Some(9000.0), false, None),
            gpu(RiskLevel::High, Some(140.0), true, Some(DataSource::Agent)),
            gpu(RiskLevel::Medium, Some(f64::NAN), false, None),
        ]);
        let v = verdict(&r, 1_795_000_000.0);
        assert_eq!(v.risk, RiskLevel::High);
        assert_eq!(v.tto_seconds, Some(140.0));
        assert!(v.leak);
        assert_eq!(v.source, DataSource::Agent, "where the worst came from");
        let none = verdict(&report(vec![]), 1.0);
        assert_eq!(
            (none.risk, none.tto_seconds, none.leak),
            (RiskLevel::None, None, false)
        );
    }

    #[test]
    fn history_turns_on_at_high_and_stays_on() {
        let mut a = Answers::default();
        let at = |risk| report(vec![gpu(risk, None, false, None)]);
        assert!(!a.answer(&at(RiskLevel::Medium), 1.0, vec![]).history);
        assert!(a.answer(&at(RiskLevel::High), 2.0, vec![]).history);
        assert!(a.answer(&at(RiskLevel::Low), 3.0, vec![]).history);
    }

    #[test]
    fn directives_from_the_source_reach_the_answer_bounded_and_once_each() {
        let (tx, mut rx) = watch::channel(vec![]);
        assert!(NoDirectives.current().is_empty());
        let d = |id: String| Directive {
            id,
            kind: DirectiveKind::NotifyTrainer,
            level: RiskLevel::Critical,
            reason: "policy oom-guard".into(),
        };
        let mut list: Vec<Directive> = (0..20).map(|i| d(format!("job/critical-{i}"))).collect();
        list.insert(1, d("job/critical-0".into()));
        list.insert(2, d(String::new()));
        tx.send_replace(list);
        let mut a = Answers::default();
        let answer = a.answer(&report(vec![]), 1.0, rx.current());
        assert_eq!(answer.directives.len(), MAX_DIRECTIVES);
        let ids: Vec<&str> = answer.directives.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(
            ids[..3],
            ["job/critical-0", "job/critical-1", "job/critical-2"]
        );
    }
}
