//! The terminal's moving parts, from libraries rather than escape codes
//! written by hand: in-place redraws (`crossterm`) for `--watch` and live
//! views, and a progress bar for long runs (`indicatif`) that turns into
//! plain log lines when stderr is not a terminal (CI logs, `2> file`).

use crossterm::{cursor, terminal, Command};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::Write;
use std::sync::Mutex;

/// The codes that put the cursor at the top left and clear the screen: a
/// `--watch` frame's prefix on a terminal (`watch(1)`'s look).
pub fn home_and_clear() -> String {
    let mut s = String::new();
    let _ = cursor::MoveTo(0, 0).write_ansi(&mut s);
    let _ = terminal::Clear(terminal::ClearType::All).write_ansi(&mut s);
    s
}

/// The codes that move the cursor up over the `lines` lines drawn last and
/// clear from there down, so that a status block is redrawn in place (live
/// views such as `memprof profile`): write this, then the new block. Empty
/// for 0 lines (nothing drawn yet).
pub fn redraw_over(lines: usize) -> String {
    let mut s = String::new();
    if lines > 0 {
        let n = u16::try_from(lines).unwrap_or(u16::MAX);
        let _ = cursor::MoveToPreviousLine(n).write_ansi(&mut s);
        let _ = terminal::Clear(terminal::ClearType::FromCursorDown).write_ansi(&mut s);
    }
    s
}

/// Progress of `total` steps on stderr: a bar on a terminal, with finished
/// steps' lines printed above it; one plain line per event otherwise, each
/// prefixed with the command's name (`memprof sweep: [2/6] B=16: running`).
pub struct Progress {
    bar: Option<ProgressBar>,
    prefix: String,
    total: u64,
    plain: Mutex<Box<dyn Write + Send>>,
}

impl Progress {
    /// A bar when stderr is a terminal, plain lines on stderr otherwise.
    pub fn new(total: u64, prefix: &str) -> Self {
        let bar = std::io::IsTerminal::is_terminal(&std::io::stderr())
            .then(|| ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr()));
        Self::build(bar, total, prefix, Box::new(std::io::stderr()))
    }

    /// Plain lines into `out` (tests, logs), never a bar.
    pub fn plain(total: u64, prefix: &str, out: Box<dyn Write + Send>) -> Self {
        Self::build(None, total, prefix, out)
    }

    /// A bar drawn on `target` (tests draw on indicatif's in-memory terminal).
    pub fn with_target(total: u64, prefix: &str, target: ProgressDrawTarget) -> Self {
        let bar = ProgressBar::with_draw_target(Some(total), target);
        Self::build(Some(bar), total, prefix, Box::new(std::io::sink()))
    }

    fn build(
        bar: Option<ProgressBar>,
        total: u64,
        prefix: &str,
        out: Box<dyn Write + Send>,
    ) -> Self {
        if let Some(b) = &bar {
            // `[#####·····] 3/6 BATCH_SIZE=32`, the look the sweep had.
            let style = ProgressStyle::with_template("[{bar:30}] {pos}/{len} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("## ·");
            b.set_style(style);
        }
        Progress {
            bar,
            prefix: prefix.to_string(),
            total,
            plain: Mutex::new(out),
        }
    }

    /// Step `done` (0-based count of finished steps) starts, named `label`.
    pub fn start(&self, done: u64, label: &str) {
        match &self.bar {
            Some(b) => {
                b.set_position(done);
                b.set_message(label.to_string());
            }
            None => self.line(&format!("[{}/{}] {label}: running", done + 1, self.total)),
        }
    }

    /// A line that stays (a finished step's result): above the bar, or plain.
    pub fn println(&self, line: &str) {
        match &self.bar {
            Some(b) => b.println(line),
            None => self.line(line),
        }
    }

    /// Removes the bar (plain output has nothing to remove).
    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }

    fn line(&self, text: &str) {
        if let Ok(mut out) = self.plain.lock() {
            let _ = writeln!(out, "{}: {text}", self.prefix);
            let _ = out.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use indicatif::InMemoryTerm;
    use std::sync::Arc;

    #[test]
    fn redraw_over_goes_up_that_many_lines_and_clears_below() {
        assert_eq!(redraw_over(0), "");
        assert_eq!(redraw_over(3), "\x1b[3F\x1b[J");
        assert_eq!(home_and_clear(), "\x1b[1;1H\x1b[2J");
    }

    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);
    impl Write for Shared {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn without_a_terminal_each_event_is_one_prefixed_line() {
        let out = Shared::default();
        let p = Progress::plain(4, "memprof sweep", Box::new(out.clone()));
        p.start(1, "B=16");
        p.println("[2/4] B=16: OOM in 2.0s");
        p.finish();
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        assert_eq!(
            text,
            "memprof sweep: [2/4] B=16: running\nmemprof sweep: [2/4] B=16: OOM in 2.0s\n"
        );
    }

    #[test]
    fn on_a_terminal_the_bar_shows_progress_and_finished_lines_stay_above_it() {
        let term = InMemoryTerm::new(4, 60);
        let p = Progress::with_target(
            4,
            "x",
            ProgressDrawTarget::term_like(Box::new(term.clone())),
        );
        p.start(1, "B=16");
        p.println("[1/4] B=8: ok");
        p.start(2, "B=32");
        let screen = term.contents();
        assert!(screen.starts_with("[1/4] B=8: ok\n"), "{screen}");
        assert!(screen.contains("] 2/4 B=32"), "{screen}");
        assert!(screen.contains("###############"), "{screen}");
        p.finish();
        assert_eq!(term.contents().trim(), "[1/4] B=8: ok");
    }
}
