//! One sweep's run loop: each configuration in turn through the runner,
//! with progress on stderr and Ctrl-C (the run in flight is killed and not
//! recorded). The grid and the verification both run through it.

use crate::local::sweep::grid::Config;
use crate::local::sweep::output;
use crate::local::sweep::record::{self, RunRecord};
use crate::local::sweep::runner::{self, Plan, RunError};
use std::io::Write as _;
use tokio::signal::unix::{signal, Signal, SignalKind};

/// The runner of one sweep.
pub struct Session<'a> {
    plan: &'a Plan,
    progress: Progress,
    sigint: Option<Signal>,
    /// Runs recorded so far (the next run's index).
    pub done: usize,
}

impl<'a> Session<'a> {
    /// A session expecting `total` runs (the grid; verification adds more).
    pub fn new(plan: &'a Plan, total: usize) -> Self {
        Session {
            plan,
            progress: Progress::new(total),
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
        self.progress.total = self.progress.total.max(i + 1);
        self.progress.starting(i, config, trial.is_some());
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
        self.progress.done(i, config, &r);
        self.done += 1;
        Ok(Some(r))
    }

    /// Clears the progress bar.
    pub fn finish(&mut self) {
        self.progress.finish();
    }
}

/// Progress on stderr: a bar redrawn in place on a terminal, one line per
/// finished run otherwise (logs, CI).
struct Progress {
    tty: bool,
    total: usize,
}

impl Progress {
    fn new(total: usize) -> Self {
        Progress {
            tty: std::io::IsTerminal::is_terminal(&std::io::stderr()),
            total,
        }
    }

    fn starting(&mut self, i: usize, config: &Config, trial: bool) {
        let mut err = std::io::stderr().lock();
        let what = if trial { "verifying" } else { "running" };
        if self.tty {
            let _ = write!(
                err,
                "\r\x1b[2K{}",
                output::bar(i, self.total, &format!("{} ({what})", config.label()), 30)
            );
        } else {
            let _ = writeln!(
                err,
                "memprof sweep: [{}/{}] {}: {what}",
                i + 1,
                self.total,
                config.label()
            );
        }
        let _ = err.flush();
    }

    fn done(&mut self, i: usize, config: &Config, r: &RunRecord) {
        let line = output::run_line(i + 1, self.total, config, r);
        let mut err = std::io::stderr().lock();
        if self.tty {
            let _ = writeln!(err, "\r\x1b[2K{line}");
        } else {
            let _ = writeln!(err, "memprof sweep: {line}");
        }
    }

    fn finish(&mut self) {
        if self.tty {
            let _ = write!(std::io::stderr(), "\r\x1b[2K");
        }
    }
}
