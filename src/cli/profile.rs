//! `memprof profile [SIDECAR FLAGS] [-- COMMAND...]`: this box's GPUs without
//! Kubernetes. Runs `memprof-sidecar --standalone`; with a command, runs it
//! next to the sidecar with the in-process agent pointed at it (and, when an
//! agent tree is found, started with no code change, as the webhook does in
//! a pod), then stops the sidecar once the command exits, so `--output`
//! holds the whole run. Exits with the command's status.

use crate::cli::install_agent::{DEFAULT_SOURCE, HOOK};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::{Duration, Instant};

/// Why `memprof profile` could not run.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// The sidecar binary is missing or could not start.
    #[error("cannot run {path}: {source}; install memprof-sidecar next to memprof")]
    Sidecar {
        /// Binary path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The sidecar exited or did not listen in time.
    #[error("memprof-sidecar did not start listening on {addr} within 10 s ({why}); run it alone with the same flags to see its error")]
    NotListening {
        /// Its address.
        addr: String,
        /// What happened.
        why: String,
    },
    /// The command could not start.
    #[error("cannot run {command:?}: {source}")]
    Command {
        /// The command.
        command: String,
        /// Why.
        source: std::io::Error,
    },
    /// No free loopback port.
    #[error("cannot pick a loopback port for the sidecar: {0}")]
    Port(std::io::Error),
}

/// The sidecar's flags and the command, split at `--`. The sidecar takes
/// flags only, so arguments that start with a word are all the command:
/// clap drops a `--` that comes first (`memprof profile -- python x.py`).
pub fn split_args(args: &[String]) -> (Vec<String>, Vec<String>) {
    match args.iter().position(|a| a == "--") {
        Some(i) => (args[..i].to_vec(), args[i + 1..].to_vec()),
        None if args.first().is_some_and(|a| !a.starts_with('-')) => (vec![], args.to_vec()),
        None => (args.to_vec(), vec![]),
    }
}

/// The value of `--listen` among the sidecar's flags, if given.
pub fn listen_flag(args: &[String]) -> Option<String> {
    args.iter().enumerate().find_map(|(i, a)| {
        a.strip_prefix("--listen=").map(str::to_string).or_else(|| {
            (a == "--listen")
                .then(|| args.get(i + 1).cloned())
                .flatten()
        })
    })
}

/// Where an agent tree's startup hook and package are.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentTree {
    /// Directory with `sitecustomize.py` (first on `PYTHONPATH`).
    pub bootstrap: PathBuf,
    /// Directory with `memprof_agent/` (last on `PYTHONPATH`).
    pub lib: PathBuf,
}

/// The agent tree at `dir`: the image's layout (`bootstrap/`, `lib/`) or a
/// source checkout's `agent/python` (`bootstrap/`, `memprof_agent/`).
pub fn find_tree(dir: &Path) -> Option<AgentTree> {
    if !dir.join(HOOK).is_file() {
        return None;
    }
    let lib = [dir.join("lib"), dir.to_path_buf()]
        .into_iter()
        .find(|l| l.join("memprof_agent").join("__init__.py").is_file())?;
    Some(AgentTree {
        bootstrap: dir.join("bootstrap"),
        lib,
    })
}

/// `PYTHONPATH` for the command: the hook first, the user's own path kept,
/// the package last (the user's own memprof_agent, if any, wins).
pub fn python_path(tree: &AgentTree, own: Option<&str>) -> String {
    let mut parts = vec![tree.bootstrap.display().to_string()];
    parts.extend(own.filter(|o| !o.is_empty()).map(str::to_string));
    parts.push(tree.lib.display().to_string());
    parts.join(":")
}

/// Runs the sidecar alone (no command), or the sidecar and the command.
pub async fn run(args: &[String], agent_path: Option<&Path>) -> Result<i32, ProfileError> {
    let exe = std::env::current_exe()
        .map_err(|source| ProfileError::Sidecar {
            path: "memprof-sidecar".into(),
            source,
        })?
        .with_file_name("memprof-sidecar");
    let (mut sidecar_args, command) = split_args(args);
    if command.is_empty() {
        let status = start(&exe, &sidecar_args)?.wait().await;
        return Ok(exit_code(status.ok()));
    }
    let addr = match listen_flag(&sidecar_args) {
        Some(a) => a,
        None => {
            let a = free_loopback().map_err(ProfileError::Port)?;
            sidecar_args.extend(["--listen".to_string(), a.clone()]);
            a
        }
    };
    let mut sidecar = start(&exe, &sidecar_args)?;
    wait_listening(&addr, &mut sidecar).await?;
    let status = run_command(&command, &addr, agent_path).await;
    // One sampling interval for the sidecar to take the trainer's last push.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop(&mut sidecar).await;
    status
}

fn start(exe: &Path, args: &[String]) -> Result<tokio::process::Child, ProfileError> {
    tokio::process::Command::new(exe)
        .arg("--standalone")
        .args(args)
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| ProfileError::Sidecar {
            path: exe.to_path_buf(),
            source,
        })
}

fn free_loopback() -> std::io::Result<String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.to_string())
}

async fn wait_listening(
    addr: &str,
    sidecar: &mut tokio::process::Child,
) -> Result<(), ProfileError> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let not_listening = |why: String| ProfileError::NotListening {
        addr: addr.to_string(),
        why,
    };
    loop {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return Ok(());
        }
        if let Ok(Some(status)) = sidecar.try_wait() {
            return Err(not_listening(format!("it exited: {status}")));
        }
        if Instant::now() >= deadline {
            return Err(not_listening("timed out".into()));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn run_command(
    command: &[String],
    addr: &str,
    agent_path: Option<&Path>,
) -> Result<i32, ProfileError> {
    let mut cmd = tokio::process::Command::new(&command[0]);
    cmd.args(&command[1..])
        .env("MEMPROF_AGENT_URL", format!("http://{addr}/v1/agent"));
    let tree = find_tree(agent_path.unwrap_or(Path::new(DEFAULT_SOURCE)));
    match &tree {
        Some(tree) => {
            let own = std::env::var("PYTHONPATH").ok();
            cmd.env("PYTHONPATH", python_path(tree, own.as_deref()));
        }
        None => eprintln!(
            "memprof: no agent tree at {} (--agent-path): the command's own memprof_agent.start(), if any, pushes to the sidecar",
            agent_path.map_or(DEFAULT_SOURCE.into(), |p| p.display().to_string())
        ),
    }
    let mut child = cmd.spawn().map_err(|source| ProfileError::Command {
        command: command.join(" "),
        source,
    })?;
    // Ctrl-C reaches the command from the terminal; wait for it to end
    // rather than leave it and the sidecar behind.
    let status = loop {
        tokio::select! {
            status = child.wait() => break status.ok(),
            _ = tokio::signal::ctrl_c() => continue,
        }
    };
    Ok(exit_code(status))
}

fn exit_code(status: Option<ExitStatus>) -> i32 {
    use std::os::unix::process::ExitStatusExt as _;
    match status {
        Some(s) => s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0)),
        None => 1,
    }
}

/// Asks the sidecar to stop (SIGTERM, so it writes `--output`), by PID;
/// kills it after 10 s.
async fn stop(sidecar: &mut tokio::process::Child) {
    if let Some(pid) = sidecar.id() {
        let _ = tokio::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .await;
    }
    if tokio::time::timeout(Duration::from_secs(10), sidecar.wait())
        .await
        .is_err()
    {
        let _ = sidecar.kill().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn flags_and_command_split_at_the_double_dash() {
        let (flags, cmd) = split_args(&strings(&[
            "--output", "r.json", "--", "python", "train.py", "--", "x",
        ]));
        assert_eq!(flags, strings(&["--output", "r.json"]));
        assert_eq!(cmd, strings(&["python", "train.py", "--", "x"]));
        let (flags, cmd) = split_args(&strings(&["--duration", "60"]));
        assert_eq!((flags.len(), cmd.len()), (2, 0));
        let (flags, cmd) = split_args(&strings(&["python", "train.py"]));
        assert_eq!((flags.len(), cmd), (0, strings(&["python", "train.py"])));
        assert_eq!(
            listen_flag(&strings(&["--listen", "127.0.0.1:9"])).as_deref(),
            Some("127.0.0.1:9")
        );
        assert_eq!(
            listen_flag(&strings(&["--listen=127.0.0.1:8"])).as_deref(),
            Some("127.0.0.1:8")
        );
        assert_eq!(listen_flag(&strings(&["--output", "x"])), None);
    }

    #[test]
    fn the_hook_goes_first_the_users_path_stays_and_the_package_goes_last() {
        let tree = AgentTree {
            bootstrap: "/a/bootstrap".into(),
            lib: "/a/lib".into(),
        };
        assert_eq!(
            python_path(&tree, Some("/mine")),
            "/a/bootstrap:/mine:/a/lib"
        );
        assert_eq!(python_path(&tree, Some("")), "/a/bootstrap:/a/lib");
        assert_eq!(python_path(&tree, None), "/a/bootstrap:/a/lib");
    }

    #[test]
    fn a_source_checkout_is_an_agent_tree() {
        let checkout = Path::new(env!("CARGO_MANIFEST_DIR")).join("agent/python");
        let tree = find_tree(&checkout).expect("agent/python is a tree");
        assert_eq!(tree.lib, checkout);
        assert!(find_tree(Path::new(env!("CARGO_MANIFEST_DIR"))).is_none());
    }
}
