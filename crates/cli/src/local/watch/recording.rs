//! What `memprof watch` keeps of a recording and of a marked event: the
//! state the view shows and the commands change (commands.rs, view.rs).

use memprof_api::{format_bytes, MemoryReportSpec};

/// Reports a recording keeps (an hour at one a second); older ones are
/// dropped and counted, so a forgotten recording cannot grow without end.
pub const RECORDING_LIMIT: usize = 3600;

/// A recording under way.
#[derive(Clone, Debug, Default)]
pub struct Recording {
    /// When it started, seconds since the watch began.
    pub started: f64,
    /// The reports polled since, oldest first.
    pub reports: Vec<MemoryReportSpec>,
    /// Reports dropped past [`RECORDING_LIMIT`].
    pub dropped: usize,
    /// Marks made before it started (those after are its own).
    pub marks_before: usize,
}

impl Recording {
    /// Keeps a polled report.
    pub fn add(&mut self, r: &MemoryReportSpec) {
        if self.reports.len() == RECORDING_LIMIT {
            self.reports.remove(0);
            self.dropped += 1;
        }
        self.reports.push(r.clone());
    }
}

/// An event marked with `m`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Mark {
    /// 1 for the first mark.
    pub number: usize,
    /// Seconds since the watch began.
    #[serde(rename = "elapsedSeconds")]
    pub at: f64,
    /// The GPU selected when it was made.
    pub gpu: Option<u32>,
    /// Its used memory then.
    pub used_bytes: Option<u64>,
}

impl Mark {
    /// The mark as the log view shows it (aligned with the transitions).
    pub fn line(&self) -> String {
        let on = match (self.gpu, self.used_bytes) {
            (Some(g), Some(b)) => format!(" (GPU {g}: {} used)", format_bytes(b)),
            _ => String::new(),
        };
        format!("{:>7.1}s  mark {}{on}", self.at, self.number)
    }
}
