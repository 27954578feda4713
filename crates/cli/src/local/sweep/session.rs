//! One sweep's run loop: each configuration in turn through the runner,
//! with progress on stderr and Ctrl-C (the run in flight is killed and not
//! recorded). The grid and the verification both run through it.

use crate::local::sweep::grid::Config;
use crate::local::sweep::output;
use crate::local::sweep::record::{self, RunRecord};
use crate::local::sweep::runner::{self, Plan, RunError};
use crate::output::term::Progress;
use tokio::signal::unix::{signal, Signal, SignalKind};

/// The runner of one sweep.
pub struct Session<'a> {
    plan: &'a Plan,
    progress: Progress,
    total: usize,
    sigint: Option<Signal>,
    /// Runs recorded so far (the next run's index).
    pub done: usize,
}

impl<'a> Session<'a> {
    /// A session expecting `total` runs (the grid; verification adds more).
    pub fn new(plan: &'a Plan, total: usize) -> Self {
        Session {
            plan,
            progress: Progress::new(total as u64, "memprof sweep"),
            total,
            sigint: signal(SignalKind::interrupt()).ok(),
            done: 0,
        }
    }

    /// Runs `config`; `trial` says why it runs after the grid. None when
    /// Ctrl-C interrupted it.
    pub async fn run(
        &mut self,
        config: &Config,
        trial: Option<String>,
    ) -> Result<Option<RunRecord>, RunError> {
        let i = self.done;
        if i >= self.total {
            self.total = i + 1;
            self.progress.set_total(self.total as u64);
        }
        let label = match trial {
            Some(_) => format!("{} (verifying)", config.label()),
            None => config.label(),
        };
        self.progress.start(i as u64, &label);
        let sigint = &mut self.sigint;
        let cancel = async {
            match sigint.as_mut() {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending().await,
            }
        };
        let (outcome, cancelled) = runner::run_one(self.plan, i, config, cancel).await?;
        if cancelled {
            self.progress.finish();
            eprintln!("memprof sweep: interrupted; {i} run(s) done");
            return Ok(None);
        }
        let mut r = record::record(
            i,
            config,
            &outcome.exit,
            outcome.duration_seconds,
            outcome.summary,
            &outcome.stderr_tail,
        );
        if outcome.nvml_peak_bytes.is_some() {
            r.nvml_peak_bytes = outcome.nvml_peak_bytes;
        }
        r.nvml_note = r
            .nvml_peak_bytes
            .is_none()
            .then_some(outcome.nvml_note)
            .flatten();
        r.trial = trial;
        self.progress
            .println(&output::run_line(i + 1, self.total, config, &r));
        self.done += 1;
        Ok(Some(r))
    }

    /// Clears the progress bar.
    pub fn finish(&mut self) {
        self.progress.finish();
    }
}
