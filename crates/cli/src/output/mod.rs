//! `-o/--output` as kubectl spells it (contract C-5), `--watch`, and the
//! plain tables kubectl prints ([`Table`], in [`table`]).

pub mod jsonpath;
pub mod printer;
pub mod table;
pub mod term;

pub use printer::{Output, PrintArgs, Printed};
pub use table::{terminal_width, Table};
pub use term::{home_and_clear, redraw_over, Progress};

use serde::Serialize;
use std::future::Future;
use std::io::{IsTerminal, Write};
use std::time::Duration;

/// Output format of a command (`-o table|wide|json|yaml`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Columns for a person.
    #[default]
    Table,
    /// The table with more columns.
    Wide,
    /// The objects as JSON.
    Json,
    /// The objects as YAML.
    Yaml,
}

impl Format {
    /// Whether this format prints objects rather than a table.
    pub fn is_structured(self) -> bool {
        matches!(self, Format::Json | Format::Yaml)
    }
}

/// The `-o/--output` flag, to flatten into a command's `Args`.
#[derive(Clone, Copy, Debug, Default, clap::Args)]
pub struct OutputArgs {
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

/// Serializes `value` as JSON (pretty, trailing newline) or YAML.
/// Table formats are the caller's; they get JSON here.
pub fn structured<T: Serialize>(value: &T, format: Format) -> String {
    match format {
        Format::Yaml => serde_yaml::to_string(value).unwrap_or_else(|e| format!("# {e}\n")),
        _ => {
            let mut s = serde_json::to_string_pretty(value).unwrap_or_else(|e| format!("\"{e}\""));
            s.push('\n');
            s
        }
    }
}

/// Whether stdout is a terminal (live redraws and text charts only then).
pub fn stdout_is_terminal() -> bool {
    std::io::stdout().is_terminal()
}

/// `kubectl`-style age: `45s`, `12m`, `3h`, `5d`.
pub fn age(seconds: i64) -> String {
    let s = seconds.max(0);
    match s {
        0..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        7200..=172_799 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// `--watch`, as `kubectl get -w` and `watch(1)` users expect.
#[derive(Clone, Copy, Debug, clap::Args)]
pub struct WatchArgs {
    /// Redraw every --interval seconds until interrupted (on a terminal the screen is
    /// redrawn in place; otherwise each frame follows the previous one after a blank line).
    #[arg(short = 'w', long)]
    pub watch: bool,
    /// Time between redraws with --watch (`2`, `2s`, `500ms`; a bare number is seconds).
    #[arg(long, default_value = "2s", value_name = "DURATION", value_parser = crate::duration::parse)]
    pub interval: Duration,
    /// Stop after this many frames (0: until interrupted); for scripts and tests.
    #[arg(long, default_value_t = 0, hide = true)]
    pub watch_count: u64,
}

/// Prints `frame()` once, or with `--watch` again every interval until
/// Ctrl-C (or `--watch-count` frames); a frame's [`Printed::stderr`] goes to
/// stderr. A closed stdout (`| head`) ends it quietly.
pub async fn watch<F, Fut, P, E>(w: WatchArgs, mut frame: F) -> Result<(), E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<P, E>>,
    P: Into<Printed>,
{
    let redraw_in_place = w.watch && stdout_is_terminal();
    let interval = w
        .interval
        .clamp(Duration::from_millis(50), Duration::from_secs(3600));
    let mut frames = 0u64;
    loop {
        let Printed {
            stdout: text,
            stderr,
        } = frame().await?.into();
        frames += 1;
        if !stderr.is_empty() {
            eprint!("{stderr}");
        }
        let mut out = std::io::stdout().lock();
        let prefix = match (redraw_in_place, frames) {
            (true, _) => home_and_clear(),
            (false, 1) => String::new(),
            (false, _) => "\n".to_string(),
        };
        if write!(out, "{prefix}{text}")
            .and_then(|()| out.flush())
            .is_err()
        {
            return Ok(());
        }
        drop(out);
        if !w.watch || (w.watch_count > 0 && frames >= w.watch_count) {
            return Ok(());
        }
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}

/// Writes `text` to stdout; a closed pipe is not an error.
pub fn print(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_and_yaml_are_parseable() {
        let v = serde_json::json!({"a": [1, 2]});
        let j: serde_json::Value = serde_json::from_str(&structured(&v, Format::Json)).unwrap();
        assert_eq!(j, v);
        let y: serde_json::Value = serde_yaml::from_str(&structured(&v, Format::Yaml)).unwrap();
        assert_eq!(y, v);
    }
}
