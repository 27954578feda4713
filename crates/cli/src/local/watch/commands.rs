//! The keys of `memprof watch` as commands (seed 000's interactive mode:
//! start/stop a recording, mark an event, save a report, switch GPU), as
//! pure functions: a key is an [`Action`] ([`action`]), an action changes
//! the [`State`] and may ask for a file to be written ([`Effect`]); the
//! terminal loop writes it and tells the state how that went
//! ([`State::wrote`]). Nothing here touches a terminal or a file.
//!
//! Files go to `--save-dir` (default: the current folder), numbered in the
//! order they are written:
//! - `s`: `memprof-watch-report-N.json`, the newest report, the sidecar's
//!   MemoryReport spec (what `memprof profile --output` holds, less the
//!   table's per-GPU run numbers), so `memprof fragment` and `rollup` (and
//!   its `--oom-snapshot`) read it;
//! - `r` … `r`: `memprof-watch-recording-N.json`, every report polled
//!   while recording (one a second) and the marks made meanwhile.

use super::recording::{Mark, Recording};
use super::view::{State, View};
use std::path::PathBuf;

/// What a key asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// `q`, Esc, Ctrl-C.
    Quit,
    /// `g`, `a`, `l`.
    Show(View),
    /// Tab.
    NextView,
    /// `j`, ↓: the next GPU.
    Down,
    /// `k`, ↑: the previous GPU.
    Up,
    /// `0`-`9`: the GPU with that index.
    Gpu(u32),
    /// `r`: start the recording, or stop it and write it.
    Record,
    /// `m`: mark an event now.
    Mark,
    /// `s`: write the newest report.
    Save,
}

/// The action of a key, if it has one.
pub fn action(c: char) -> Option<Action> {
    Some(match c {
        'q' => Action::Quit,
        'g' => Action::Show(View::Gpus),
        'a' => Action::Show(View::Agent),
        'l' => Action::Show(View::Log),
        '\t' => Action::NextView,
        'j' | '↓' => Action::Down,
        'k' | '↑' => Action::Up,
        'r' => Action::Record,
        'm' => Action::Mark,
        's' => Action::Save,
        d => Action::Gpu(d.to_digit(10)?),
    })
}

/// What the loop must do after an action.
#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    /// Nothing beyond redrawing.
    Nothing,
    /// Leave the view.
    Quit,
    /// Write `contents` to `path`, then call [`State::wrote`].
    Write {
        /// The file.
        path: PathBuf,
        /// Its contents.
        contents: String,
    },
}

impl State {
    /// A key: its action applied (a key without one does nothing).
    pub fn key(&mut self, c: char) -> Effect {
        action(c).map_or(Effect::Nothing, |a| self.apply(a))
    }

    /// An action applied to the state; what the loop must do next.
    pub fn apply(&mut self, a: Action) -> Effect {
        match a {
            Action::Quit => return Effect::Quit,
            Action::Show(v) => self.view = v,
            Action::NextView => self.next_view(),
            Action::Down => self.selected = (self.selected + 1).min(self.gpus().saturating_sub(1)),
            Action::Up => self.selected = self.selected.saturating_sub(1),
            Action::Gpu(i) => self.select_gpu(i),
            Action::Mark => self.mark(),
            Action::Save => return self.save_report(),
            Action::Record => return self.toggle_recording(),
        }
        Effect::Nothing
    }

    /// How many GPUs the latest report shows (none before the first).
    fn gpus(&self) -> usize {
        self.report.as_ref().map_or(0, |r| r.gpus.len())
    }

    /// The views in turn: GPUs, agent, log, and round again.
    fn next_view(&mut self) {
        self.view = match self.view {
            View::Gpus => View::Agent,
            View::Agent => View::Log,
            View::Log => View::Gpus,
        }
    }

    /// GPU `i` (by its index, not its row) selected and shown, or a notice that it is not here.
    fn select_gpu(&mut self, i: u32) {
        let row = self
            .report
            .as_ref()
            .and_then(|r| r.gpus.iter().position(|g| g.index == i));
        match row {
            Some(row) => {
                self.selected = row;
                self.view = View::Gpus;
                self.notice = Some(format!("GPU {i} selected"));
            }
            None => self.notice = Some(format!("no GPU {i} here ({} GPU(s))", self.gpus())),
        }
    }

    /// A numbered mark at this moment, with the selected GPU's usage when there is one.
    fn mark(&mut self) {
        let g = self.report.as_ref().and_then(|r| r.gpus.get(self.selected));
        let m = Mark {
            number: self.marks.len() + 1,
            at: self.elapsed,
            gpu: g.map(|g| g.index),
            used_bytes: g.map(|g| g.used_bytes),
        };
        self.notice = Some(format!("{} ([l] lists the marks)", m.line().trim_start()));
        self.marks.push(m);
    }

    /// The latest report written to a file (nothing before the first report).
    fn save_report(&mut self) -> Effect {
        let Some(r) = &self.report else {
            self.notice = Some("no report yet, nothing saved".into());
            return Effect::Nothing;
        };
        let contents = serde_json::to_string_pretty(r).unwrap_or_default() + "\n";
        self.file("report", contents)
    }

    /// A recording started, or the one under way stopped and written.
    fn toggle_recording(&mut self) -> Effect {
        match self.recording.take() {
            None => {
                self.start_recording();
                Effect::Nothing
            }
            Some(rec) => self.write_recording(rec),
        }
    }

    /// A recording begun from the report on screen now.
    fn start_recording(&mut self) {
        let mut rec = Recording {
            started: self.elapsed,
            marks_before: self.marks.len(),
            ..Default::default()
        };
        if let Some(r) = &self.report {
            rec.add(r);
        }
        self.recording = Some(rec);
        self.notice = Some("recording: [r] again stops it and writes the file".into());
    }

    /// A stopped recording written with the marks made while it ran.
    fn write_recording(&mut self, rec: Recording) -> Effect {
        let marks = &self.marks[rec.marks_before.min(self.marks.len())..];
        let doc = serde_json::json!({
            "startedAtSeconds": rec.started,
            "stoppedAtSeconds": self.elapsed,
            "droppedReports": rec.dropped,
            "marks": marks,
            "reports": rec.reports,
        });
        let contents = serde_json::to_string_pretty(&doc).unwrap_or_default() + "\n";
        self.file("recording", contents)
    }

    fn file(&mut self, what: &str, contents: String) -> Effect {
        self.files_written += 1;
        let name = format!("memprof-watch-{what}-{}.json", self.files_written);
        Effect::Write {
            path: self.save_dir.join(name),
            contents,
        }
    }

    /// How writing a file the state asked for went.
    pub fn wrote(&mut self, path: &std::path::Path, result: std::io::Result<()>) {
        self.notice = Some(match result {
            Ok(()) => format!("wrote {}", path.display()),
            Err(e) => format!("cannot write {}: {e}", path.display()),
        });
    }
}

#[cfg(test)]
mod tests;
