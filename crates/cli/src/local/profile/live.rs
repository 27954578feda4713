//! `memprof profile` while it runs: polls the sidecar about once a second,
//! redraws a status line per GPU in place (risk transitions scroll above
//! them), and notices a run that sees nothing (no GPU and no agent data).

use super::sidecar::{Sidecar, Transition};
use super::summary::{self, Tracker};
use memprof_api::MemoryReportSpec;
use std::time::{Duration, Instant};

/// What the watch saw.
pub struct Watched {
    /// Utilization and recent memory per GPU.
    pub tracker: Tracker,
    /// Every risk transition, in order.
    pub transitions: Vec<Transition>,
    /// The command's exit status (0 without one, or when interrupted without one).
    pub code: i32,
    /// Why nothing could be seen, when the watch stopped for that (no command).
    pub blind: Option<String>,
    /// The command's process id (what its agent pushes as `pid`).
    pub pid: Option<u32>,
}

/// How the loop was left.
enum Ended {
    Command(i32),
    Interrupted,
    SidecarDone,
    Blind(String),
}

/// Polls until the command exits (or, without one, until the sidecar stops,
/// Ctrl-C or SIGTERM, or the first report shows that nothing is visible).
/// With a command, Ctrl-C reached it too and SIGTERM is passed on to it: the
/// watch waits for it either way, so `--output` holds the whole run.
pub async fn watch(side: &mut Sidecar, mut command: Option<&mut tokio::process::Child>) -> Watched {
    let mut tracker = Tracker::default();
    let mut transitions = vec![];
    let mut screen = Screen::new(crate::output::stdout_is_terminal());
    let mut signals = Signals::new();
    let mut warned_blind = false;
    let pid = command.as_deref().and_then(tokio::process::Child::id);
    let ended = loop {
        let mut ended = None;
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = signals.next() => match command.as_deref() {
                Some(child) => forward_term(child).await,
                None => ended = Some(Ended::Interrupted),
            },
            status = async { command.as_mut().unwrap().wait().await }, if command.is_some() => {
                ended = Some(Ended::Command(super::exit_code(status.ok())));
            }
        }
        let new: Vec<Transition> =
            std::iter::from_fn(|| side.transitions.try_recv().ok()).collect();
        let report = side.report().await;
        if let Some(r) = &report {
            tracker.observe(r);
        }
        screen.draw(&new, report.as_ref(), &tracker);
        transitions.extend(new);
        if let Some(why) = report.as_ref().and_then(nothing_seen) {
            ended = ended.or(blind(why, command.is_some(), &mut warned_blind));
        }
        if command.is_none() && ended.is_none() && side.exited().is_some() {
            ended = Some(Ended::SidecarDone);
        }
        if let Some(e) = ended {
            break e;
        }
    };
    // Transitions printed after the last poll.
    tokio::time::sleep(Duration::from_millis(100)).await;
    transitions.extend(std::iter::from_fn(|| side.transitions.try_recv().ok()));
    let (code, blind) = ended.outcome();
    Watched {
        tracker,
        transitions,
        code,
        blind,
        pid,
    }
}

impl Ended {
    /// The exit status, and why nothing could be seen when that ended it.
    fn outcome(self) -> (i32, Option<String>) {
        match self {
            Ended::Command(c) => (c, None),
            Ended::Interrupted | Ended::SidecarDone => (0, None),
            Ended::Blind(why) => (super::BLIND, Some(why)),
        }
    }
}

/// A report that shows nothing ends a watch without a command; with one,
/// the trainer's agent may still push, so it is said once and the watch
/// goes on.
fn blind(why: String, has_command: bool, warned: &mut bool) -> Option<Ended> {
    if !has_command {
        return Some(Ended::Blind(why));
    }
    if !*warned {
        *warned = true;
        eprintln!("memprof profile: no GPU visible ({why}); waiting for the trainer's agent");
    }
    None
}

/// Why a report shows nothing at all (no GPU from the sampler and none
/// from an agent), or None when it shows something.
pub fn nothing_seen(r: &MemoryReportSpec) -> Option<String> {
    r.gpus.is_empty().then(|| summary::blind_reason(r))
}

/// Ctrl-C and SIGTERM (what torchrun and schedulers send), as one stream.
struct Signals {
    term: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    fn new() -> Self {
        use tokio::signal::unix::{signal, SignalKind};
        Signals {
            term: signal(SignalKind::terminate()).ok(),
        }
    }

    async fn next(&mut self) {
        let term = async {
            match &mut self.term {
                Some(t) => {
                    t.recv().await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            () = term => {}
        }
    }
}

/// Passes a SIGTERM on to the command (by its PID); Ctrl-C reached it
/// already through the terminal, and a second SIGINT does no harm.
async fn forward_term(child: &tokio::process::Child) {
    if let Some(pid) = child.id() {
        let _ = tokio::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .await;
    }
}

/// The live display: on a terminal the status lines are redrawn in place
/// (crossterm's cursor movement, through [`crate::output::redraw_over`]);
/// otherwise plain lines, the status every 10 s.
struct Screen {
    terminal: bool,
    drawn: usize,
    last_plain: Option<Instant>,
}

impl Screen {
    fn new(terminal: bool) -> Self {
        Screen {
            terminal,
            drawn: 0,
            last_plain: None,
        }
    }

    fn draw(&mut self, new: &[Transition], report: Option<&MemoryReportSpec>, tracker: &Tracker) {
        let lines = report.map_or(vec![], |r| {
            let mut l = vec![format!(
                "source {}",
                summary::source_words(r.summary.source)
            )];
            l.extend(summary::status_lines(r, tracker));
            l
        });
        let due = self
            .last_plain
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(10));
        let status = self.terminal || (due && !lines.is_empty());
        let out = frame(self.terminal, self.drawn, new, status.then_some(&lines[..]));
        if status {
            self.drawn = lines.len();
            if !self.terminal {
                self.last_plain = Some(Instant::now());
            }
        }
        crate::output::print(&out);
    }
}

/// One redraw: on a terminal, up over the `drawn` status lines and clear
/// them; the new transitions (they stay); the status lines, when given.
fn frame(terminal: bool, drawn: usize, new: &[Transition], status: Option<&[String]>) -> String {
    let mut out = String::new();
    if terminal {
        out.push_str(&crate::output::redraw_over(drawn));
    }
    for t in new {
        out.push_str(&summary::transition_line(t));
        out.push('\n');
    }
    for l in status.unwrap_or_default() {
        out.push_str(l);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_api::RiskLevel;

    #[test]
    fn a_terminal_frame_goes_up_over_the_old_status_keeps_transitions_and_redraws() {
        let t = Transition {
            elapsed_seconds: 3.0,
            from: RiskLevel::Low,
            to: RiskLevel::High,
            gpu: Some(0),
            used_bytes: None,
            growth_bytes_per_second: None,
            time_to_oom_seconds: None,
        };
        let status = ["GPU 0  used 1GiB".to_string()];
        let f = frame(true, 2, std::slice::from_ref(&t), Some(&status));
        assert_eq!(
            f,
            format!(
                "{}    3.0s  risk low -> high (GPU 0)\nGPU 0  used 1GiB\n",
                crate::output::redraw_over(2)
            )
        );
        // Not a terminal: no cursor movement at all, ever.
        let plain = frame(false, 2, &[], Some(&status));
        assert_eq!(plain, "GPU 0  used 1GiB\n");
        assert!(!frame(false, 0, &[t], None).contains('\x1b'));
    }

    #[test]
    fn a_report_without_gpus_is_nothing_seen_with_its_reason() {
        let mut r = MemoryReportSpec {
            conditions: vec![memprof_api::Condition::new(
                "GpuVisible",
                false,
                "NvmlUnavailable",
                "cannot load libnvidia-ml.so.1",
            )],
            ..Default::default()
        };
        assert_eq!(
            nothing_seen(&r).as_deref(),
            Some("cannot load libnvidia-ml.so.1")
        );
        r.gpus.push(Default::default());
        assert_eq!(nothing_seen(&r), None);
    }
}
