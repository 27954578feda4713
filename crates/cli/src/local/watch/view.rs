//! What `memprof watch` draws, as pure functions of a [`State`]: a header
//! (source, worst risk, the recording, keys, the last command's outcome),
//! then one of three views: `g` the GPUs (a row each, the selected one's
//! used memory as a sparkline, the trainer process with its allocator
//! numbers), `a` the agent's verdicts (the same renderer as `memprof
//! report`), `l` the risk transitions and the marks. Tested on ratatui's
//! TestBackend; the keys' commands are in [`super::commands`], the terminal
//! loop in the parent module.

use crate::local::profile::sidecar::Transition;
use crate::local::profile::summary::{gpu_label, source_words, transition_line};
use memprof_api::{format_bytes, GpuReport, MemoryReportSpec, RiskLevel};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph, Row, Sparkline, Table, Wrap};
use ratatui::Frame;
use std::collections::{BTreeMap, VecDeque};

/// Used-memory values kept per GPU for the sparkline.
pub const HISTORY: usize = 240;

/// Which view is shown.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum View {
    /// GPUs, the selected GPU's history, the trainer process.
    #[default]
    Gpus,
    /// The agent's verdicts and numbers, in words.
    Agent,
    /// Risk transitions.
    Log,
}

/// Everything the view shows.
#[derive(Clone, Debug, Default)]
pub struct State {
    /// The newest report, once there is one.
    pub report: Option<MemoryReportSpec>,
    /// Used memory per GPU UUID, oldest first.
    pub history: BTreeMap<String, VecDeque<u64>>,
    /// Risk transitions so far.
    pub transitions: Vec<Transition>,
    /// The selected GPU (row).
    pub selected: usize,
    /// The view shown.
    pub view: View,
    /// The command's process id, when watching one.
    pub pid: Option<u32>,
    /// Seconds since the watch began.
    pub elapsed: f64,
    /// How the command ended, once it has.
    pub ended: Option<String>,
    /// Where `s` (save) and `r` (record) write their files.
    pub save_dir: std::path::PathBuf,
    /// The recording under way (`r` starts and stops it).
    pub recording: Option<super::recording::Recording>,
    /// Events marked with `m`, oldest first.
    pub marks: Vec<super::recording::Mark>,
    /// Files written so far (numbers the next one).
    pub files_written: u32,
    /// What the last command did, shown under the keys.
    pub notice: Option<String>,
}

impl State {
    /// Takes a polled report in.
    pub fn observe(&mut self, r: MemoryReportSpec) {
        for g in &r.gpus {
            let h = self.history.entry(g.uuid.clone()).or_default();
            h.push_back(g.used_bytes);
            if h.len() > HISTORY {
                h.pop_front();
            }
        }
        self.selected = self.selected.min(r.gpus.len().saturating_sub(1));
        if let Some(rec) = &mut self.recording {
            rec.add(&r);
        }
        self.report = Some(r);
    }
}

/// Draws the whole screen.
pub fn draw(f: &mut Frame, s: &State) {
    let [head, body] =
        Layout::vertical([Constraint::Length(3), Constraint::Min(0)]).areas(f.area());
    f.render_widget(header(s), head);
    match s.view {
        View::Gpus => gpus(f, body, s),
        View::Agent => text_view(f, body, "agent (as memprof report shows it)", agent_text(s)),
        View::Log => text_view(f, body, "risk transitions and marks", log_text(s)),
    }
}

fn risk_style(r: RiskLevel) -> Style {
    let c = match r {
        RiskLevel::None | RiskLevel::Low => Color::Green,
        RiskLevel::Medium => Color::Yellow,
        RiskLevel::High => Color::LightRed,
        RiskLevel::Critical => Color::Red,
    };
    Style::new().fg(c).add_modifier(Modifier::BOLD)
}

fn header(s: &State) -> Paragraph<'static> {
    let mut first = vec![Span::styled(
        "memprof watch",
        Style::new().add_modifier(Modifier::BOLD),
    )];
    match &s.report {
        None => first.push(Span::raw("  waiting for the first report…")),
        Some(r) => {
            first.push(Span::raw(format!(
                "  source {}  {} GPU(s)  {:.0} s  risk ",
                source_words(r.summary.source),
                r.gpus.len(),
                s.elapsed
            )));
            first.push(Span::styled(
                r.summary.risk.to_string(),
                risk_style(r.summary.risk),
            ));
            if let Some(tto) = &r.summary.time_to_oom {
                first.push(Span::raw(format!("  OOM in {tto}")));
            }
            // The summary's risk and TTO are the worst GPU's: so is its cause.
            if let Some(c) = memprof_analysis::worst_gpu(&r.gpus).and_then(|g| g.cause.as_ref()) {
                first.push(Span::raw(format!("  cause {}", c.cause)));
            }
        }
    }
    if let Some(e) = &s.ended {
        first.push(Span::raw(format!("  ({e})")));
    }
    if let Some(rec) = &s.recording {
        first.push(Span::styled(
            format!(
                "  ● REC {:.0} s, {} report(s)",
                (s.elapsed - rec.started).max(0.0),
                rec.reports.len()
            ),
            Style::new().fg(Color::Red).add_modifier(Modifier::BOLD),
        ));
    }
    let tab = |key: &str, name: &str, on: bool| {
        let st = match on {
            true => Style::new().add_modifier(Modifier::REVERSED),
            false => Style::new(),
        };
        Span::styled(format!(" [{key}] {name} "), st)
    };
    let keys = Line::from(vec![
        tab("g", "GPUs", s.view == View::Gpus),
        tab("a", "agent", s.view == View::Agent),
        tab("l", "log", s.view == View::Log),
        Span::raw(" [tab] next  [j/k/0-9] GPU  [r] record  [m] mark  [s] save  [q] quit"),
    ]);
    let notice = Line::from(s.notice.clone().unwrap_or_default());
    Paragraph::new(vec![Line::from(first), keys, notice])
}

fn gpus(f: &mut Frame, area: Rect, s: &State) {
    let Some(r) = &s.report else {
        return;
    };
    if r.gpus.is_empty() {
        let why = crate::local::profile::summary::blind_reason(r);
        f.render_widget(
            Paragraph::new(format!("no GPU visible: {why}")).wrap(Wrap { trim: true }),
            area,
        );
        return;
    }
    let rows = r.gpus.len() as u16 + 3;
    let [table_area, spark_area, proc_area] = Layout::vertical([
        Constraint::Length(rows),
        Constraint::Min(5),
        Constraint::Length(4),
    ])
    .areas(area);
    f.render_widget(gpu_table(r, s.selected), table_area);
    if let Some(g) = r.gpus.get(s.selected) {
        let data: Vec<u64> = s
            .history
            .get(&g.uuid)
            .map_or(vec![], |h| h.iter().copied().collect());
        // Newest samples at the right, as many as fit.
        let width = spark_area.width.saturating_sub(2) as usize;
        let shown = &data[data.len().saturating_sub(width)..];
        let cause = g
            .cause
            .as_ref()
            .map_or(String::new(), |c| format!(", {}", c.line()));
        let title = format!(
            " GPU {} used memory, last {} samples (0 to {}){cause} ",
            gpu_label(r, g),
            shown.len(),
            format_bytes(g.total_bytes)
        );
        let spark = Sparkline::default()
            .block(Block::bordered().title(title))
            .data(shown.to_vec())
            .max(g.total_bytes.max(1))
            .style(risk_style(g.risk));
        f.render_widget(spark, spark_area);
    }
    f.render_widget(process(r, s.pid), proc_area);
}

fn bar(used: u64, total: u64, width: usize) -> String {
    let filled = ((used as f64 / total.max(1) as f64) * width as f64).round() as usize;
    let filled = filled.min(width);
    format!("{}{}", "█".repeat(filled), "░".repeat(width - filled))
}

fn gpu_row(r: &MemoryReportSpec, g: &GpuReport) -> Row<'static> {
    let pct = 100.0 * g.used_bytes as f64 / g.total_bytes.max(1) as f64;
    Row::new(vec![
        Span::raw(gpu_label(r, g)),
        Span::raw(g.model.clone()),
        Span::raw(format!(
            "{} {}/{} ({pct:.0}%)",
            bar(g.used_bytes, g.total_bytes, 10),
            format_bytes(g.used_bytes),
            format_bytes(g.total_bytes)
        )),
        Span::raw(format_bytes(g.peak_bytes)),
        Span::raw(
            g.utilization_percent
                .map_or("-".into(), |u| format!("{u}%")),
        ),
        Span::styled(g.risk_text(), risk_style(g.risk)),
        Span::raw(g.tto_text()),
        Span::raw(g.growth_text()),
        Span::raw(if g.leak_suspected { "leak" } else { "" }.to_string()),
    ])
}

fn gpu_table(r: &MemoryReportSpec, selected: usize) -> Table<'static> {
    let rows: Vec<Row> = r
        .gpus
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let row = gpu_row(r, g);
            match i == selected {
                true => row.style(Style::new().add_modifier(Modifier::REVERSED)),
                false => row,
            }
        })
        .collect();
    // The model name takes what the fixed columns leave.
    let widths = [
        Constraint::Length(14),
        Constraint::Fill(1),
        Constraint::Length(32),
        Constraint::Length(8),
        Constraint::Length(4),
        Constraint::Length(8),
        Constraint::Length(7),
        Constraint::Length(10),
        Constraint::Length(4),
    ];
    let header = Row::new([
        "GPU", "MODEL", "USED", "PEAK", "UTIL", "RISK", "TTO", "GROWTH", "",
    ])
    .style(Style::new().add_modifier(Modifier::BOLD));
    Table::new(rows, widths)
        .header(header)
        .block(Block::bordered().title(" GPUs "))
}

/// The trainer process (the command): its pid and its allocator numbers.
fn process(r: &MemoryReportSpec, pid: Option<u32>) -> Paragraph<'static> {
    let who = pid.map_or("the trainer".into(), |p| format!("pid {p}"));
    let rank = r.rank.map_or(String::new(), |k| format!(", rank {k}"));
    let line = match &r.allocator {
        None => format!("{who}{rank}: no agent data (run a command after -- with the agent)"),
        Some(a) => format!("{who}{rank}{}", allocator_words(a)),
    };
    Paragraph::new(line)
        .wrap(Wrap { trim: true })
        .block(Block::bordered().title(" processes "))
}

/// ` on cuda:0: growth: leak  allocated 12.0GiB  reserved …  host RSS 3.0GiB`.
fn allocator_words(a: &memprof_api::AllocatorStats) -> String {
    let on = a.device.map_or(String::new(), |d| format!(" on cuda:{d}"));
    // The verdict first: it must not be the part a narrow terminal wraps.
    let growth = serde_json::to_value(a.growth).ok();
    let mut parts = vec![
        format!(
            "growth: {}",
            growth.as_ref().and_then(|v| v.as_str()).unwrap_or("-")
        ),
        format!("allocated {}", format_bytes(a.allocated_bytes)),
        format!("reserved {}", format_bytes(a.reserved_bytes)),
    ];
    if let Some(p) = a.peak_allocated_bytes {
        parts.push(format!("peak allocated {}", format_bytes(p)));
    }
    if let Some(f) = a.fragmentation {
        parts.push(format!("fragmentation {:.0}%", f * 100.0));
    }
    if let Some(step) = a.step {
        parts.push(format!("step {step}"));
    }
    if let Some(sps) = a.steps_per_second {
        parts.push(format!("{sps:.1} steps/s"));
    }
    if let Some(h) = &a.host {
        let rss = h.rss_bytes.map_or("-".into(), format_bytes);
        let leak = if h.leak_suspected { " (LEAK)" } else { "" };
        parts.push(format!("host RSS {rss}{leak}"));
    }
    if a.gradients.as_ref().is_some_and(|g| g.non_finite_count > 0) {
        parts.push("NaN/Inf gradients".into());
    }
    format!("{on}: {}", parts.join("  "))
}

fn agent_text(s: &State) -> String {
    let Some(r) = &s.report else {
        return String::new();
    };
    if r.allocator.is_none() {
        return "no agent data: run the trainer after `--` (memprof watch -- python train.py)"
            .into();
    }
    let mut out = String::new();
    crate::local::rollup::agent_words(&mut out, r);
    out
}

fn log_text(s: &State) -> String {
    let mut lines: Vec<(f64, String)> = s
        .transitions
        .iter()
        .map(|t| (t.elapsed_seconds, transition_line(t)))
        .collect();
    lines.extend(s.marks.iter().map(|m| (m.at, m.line())));
    if lines.is_empty() {
        return "no risk transition or mark yet ([m] marks an event)".into();
    }
    // In time order, a mark between the transitions it fell between.
    lines.sort_by(|a, b| a.0.total_cmp(&b.0));
    lines
        .into_iter()
        .map(|(_, l)| l)
        .collect::<Vec<_>>()
        .join("\n")
}

fn text_view(f: &mut Frame, area: Rect, title: &str, text: String) {
    let p = Paragraph::new(text)
        .wrap(Wrap { trim: false })
        .block(Block::bordered().title(format!(" {title} ")));
    f.render_widget(p, area);
}

#[cfg(test)]
mod tests;
