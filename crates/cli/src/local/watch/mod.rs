//! `memprof watch [FLAGS] [-- COMMAND...]`: a live, full-screen view of this
//! box's GPUs (as nvitop draws one), without a cluster: each GPU's memory,
//! risk and time to OOM, a sparkline of the selected one, the trainer's
//! allocator numbers when a command runs with the agent; keys switch views
//! and give seed 000's interactive commands ([`commands`]: `r` starts and
//! stops a recording, `m` marks an event, `s` saves the report, `0`-`9`
//! switch GPU; files go to `--save-dir`). Same sampling flags and sidecar as `memprof profile` (its numbers, its
//! analysis); drawn with ratatui on crossterm, the terminal put back as it
//! was on exit (also on a panic). Quitting stops the sidecar and sends the
//! command SIGTERM.

pub mod commands;
#[cfg(test)]
pub(crate) mod fixtures;
pub mod recording;
pub mod view;

use crate::local::profile::sidecar::{self, Sidecar};
use crate::local::profile::{self, ProfileError, SampleArgs};
use commands::Effect;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use view::State;

/// Flags of `memprof watch`.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub sample: SampleArgs,
    /// The agent tree to start in a Python command with no code change.
    #[arg(long, value_name = "DIR")]
    pub agent_path: Option<PathBuf>,
    /// Where `s` (save the report) and `r` (record) write their files;
    /// made if missing.
    #[arg(long, value_name = "DIR", default_value = ".")]
    pub save_dir: PathBuf,
    /// A command to run and watch, after `--` (e.g. `-- python train.py`).
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "COMMAND"
    )]
    pub command: Vec<String>,
}

/// Runs the view until `q` (or Ctrl-C); returns the exit code.
pub async fn run(args: Args) -> Result<i32, ProfileError> {
    args.sample.check()?;
    crate::help::check_command::<Args>("watch", &args.command)
        .map_err(|e| ProfileError::Usage(e.to_string()))?;
    crate::outfile::prepare_dir("--save-dir", &args.save_dir)?;
    if !crate::output::stdout_is_terminal() {
        return Err(ProfileError::Usage(
            "memprof watch draws on a terminal; for logs or a pipe use `memprof profile`".into(),
        ));
    }
    let dir = std::env::temp_dir();
    let pid = std::process::id();
    let files = [
        dir.join(format!("memprof-watch-{pid}-trace.csv")),
        dir.join(format!("memprof-watch-{pid}-report.json")),
    ];
    let flags = args.sample.sidecar_flags(&files[0], &files[1]);
    let addr = sidecar::free_loopback()?;
    // Removed (socket and all) when the watch ends.
    let private = sidecar::PrivateDir::new("watch")?;
    let mut side =
        Sidecar::start(&sidecar::sidecar_exe()?, &flags, &addr, &private.socket()).await?;
    let mut command = match args.command.is_empty() {
        true => None,
        false => Some(profile::start_command(
            &args.command,
            &side.socket,
            args.agent_path.as_deref(),
        )?),
    };
    let shown = show(&mut side, command.as_mut(), &args.save_dir).await;
    if let Some(c) = command.as_mut() {
        if c.try_wait().ok().flatten().is_none() {
            if let Some(p) = c.id() {
                let _ = std::process::Command::new("kill")
                    .args(["-TERM", &p.to_string()])
                    .status();
            }
            let _ = c.wait().await;
        }
    }
    side.stop().await;
    for f in files {
        let _ = std::fs::remove_file(f);
    }
    shown.map_err(|e| ProfileError::Usage(format!("the terminal failed: {e}")))?;
    Ok(0)
}

/// The screen loop: redraws on every key and every half second, polls the
/// sidecar each second.
async fn show(
    side: &mut Sidecar,
    mut command: Option<&mut tokio::process::Child>,
    save_dir: &std::path::Path,
) -> std::io::Result<()> {
    let mut terminal = ratatui::try_init()?;
    let (keys, mut key_rx) = tokio::sync::mpsc::unbounded_channel();
    let reader = std::thread::spawn(move || read_keys(keys));
    let began = Instant::now();
    let mut state = State {
        pid: command.as_deref().and_then(tokio::process::Child::id),
        save_dir: save_dir.into(),
        ..Default::default()
    };
    let mut last_poll: Option<Instant> = None;
    let result = loop {
        if last_poll.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
            last_poll = Some(Instant::now());
            state
                .transitions
                .extend(std::iter::from_fn(|| side.transitions.try_recv().ok()));
            if let Some(r) = side.report().await {
                state.observe(r);
            }
        }
        state.elapsed = began.elapsed().as_secs_f64();
        if let Err(e) = terminal.draw(|f| view::draw(f, &state)) {
            break Err(e);
        }
        tokio::select! {
            k = key_rx.recv() => match k.map(|c| state.key(c)) {
                Some(Effect::Nothing) => {}
                Some(Effect::Write { path, contents }) => {
                    let written = std::fs::write(&path, contents);
                    state.wrote(&path, written);
                }
                Some(Effect::Quit) | None => break Ok(()),
            },
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            status = async { command.as_mut().unwrap().wait().await }, if command.is_some() && state.ended.is_none() => {
                state.ended = Some(format!("command exited {}", profile::exit_code(status.ok())));
            }
        }
    };
    drop(key_rx);
    ratatui::try_restore()?;
    let _ = reader.join();
    result
}

/// Reads keys on a thread of its own (crossterm's blocking reads) until the
/// receiver is gone: Esc and Ctrl-C as `q`, arrows as `j`/`k`, Tab, and
/// every character (what each does is [`commands::action`]'s).
fn read_keys(keys: tokio::sync::mpsc::UnboundedSender<char>) {
    use crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
    while !keys.is_closed() {
        match event::poll(Duration::from_millis(200)) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(_) => return,
        }
        let Ok(Event::Key(k)) = event::read() else {
            continue;
        };
        if k.kind != KeyEventKind::Press {
            continue;
        }
        let c = match k.code {
            KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => 'q',
            KeyCode::Esc => 'q',
            KeyCode::Down => '↓',
            KeyCode::Up => '↑',
            KeyCode::Tab => '\t',
            KeyCode::Char(c) => c,
            _ => continue,
        };
        if keys.send(c).is_err() {
            return;
        }
    }
}
