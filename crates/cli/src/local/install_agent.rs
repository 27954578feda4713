//! `memprof install-agent DIR`: what the init container that the webhook adds
//! for `memprof.dev/agent: "python"` runs. It copies the Python agent tree
//! that the memprof image carries ([`DEFAULT_AGENT_SOURCE`]: `bootstrap/` with the
//! startup hook, `lib/memprof_agent/`) into the pod's shared volume, from
//! which the trainer containers read it (see `crates/webhook/src/agent.rs`).
//!
//! A subcommand of this binary rather than `cp`: the image is distroless (no
//! shell, no coreutils), and the copy must set permissions any trainer uid
//! can read, whatever the umask.

use memprof_api::DEFAULT_AGENT_SOURCE;
use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

/// The file whose presence says a directory is an agent tree.
pub const HOOK: &str = "bootstrap/sitecustomize.py";

/// Why the agent could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// The source is not an agent tree.
    #[error("{0} holds no {HOOK}: not an agent tree; the memprof image carries it at {DEFAULT_AGENT_SOURCE} (set --from for another place)")]
    NotAnAgent(PathBuf),
    /// Reading the source failed.
    #[error("cannot read {path}: {error}")]
    Read {
        /// File or directory.
        path: PathBuf,
        /// The I/O error.
        error: io::Error,
    },
    /// Writing the target failed.
    #[error("cannot write {path}: {error}; the target must be a writable directory (the pod's emptyDir)")]
    Write {
        /// File or directory.
        path: PathBuf,
        /// The I/O error.
        error: io::Error,
    },
}

/// Copies the agent tree `from` into `to` (created if needed); returns how
/// many files it copied. Regular files and directories only: symbolic links
/// are skipped (they could point out of the tree), and so is bytecode (it
/// belongs to the Python that compiled it). Files are written 0644 and
/// directories 0755, readable by any uid the trainers run as.
pub fn install(from: &Path, to: &Path) -> Result<usize, InstallError> {
    if !from.join(HOOK).is_file() {
        return Err(InstallError::NotAnAgent(from.to_path_buf()));
    }
    copy_dir(from, to)
}

fn is_bytecode(name: &str) -> bool {
    name == "__pycache__" || name.ends_with(".pyc")
}

fn copy_dir(from: &Path, to: &Path) -> Result<usize, InstallError> {
    let read = |path: &Path| {
        let path = path.to_path_buf();
        move |error| InstallError::Read { path, error }
    };
    let write = |path: &Path| {
        let path = path.to_path_buf();
        move |error| InstallError::Write { path, error }
    };
    fs::create_dir_all(to).map_err(write(to))?;
    fs::set_permissions(to, fs::Permissions::from_mode(0o755)).map_err(write(to))?;
    let mut copied = 0;
    for entry in fs::read_dir(from).map_err(read(from))? {
        let entry = entry.map_err(read(from))?;
        let (src, name) = (entry.path(), entry.file_name());
        if is_bytecode(&name.to_string_lossy()) {
            continue;
        }
        let dst = to.join(&name);
        // file_type() does not follow symbolic links.
        let kind = entry.file_type().map_err(read(&src))?;
        if kind.is_dir() {
            copied += copy_dir(&src, &dst)?;
        } else if kind.is_file() {
            fs::copy(&src, &dst).map_err(write(&dst))?;
            fs::set_permissions(&dst, fs::Permissions::from_mode(0o644)).map_err(write(&dst))?;
            copied += 1;
        }
    }
    Ok(copied)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A temporary directory removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(tag: &str) -> Scratch {
            let dir = std::env::temp_dir().join(format!(
                "memprof-install-agent-{tag}-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).unwrap();
            Scratch(dir)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn mode(p: &Path) -> u32 {
        fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn copies_the_tree_readable_by_anyone_without_links_or_bytecode() {
        let s = Scratch::new("copy");
        let src = s.0.join("src");
        fs::create_dir_all(src.join("bootstrap/__pycache__")).unwrap();
        fs::create_dir_all(src.join("lib/memprof_agent")).unwrap();
        fs::write(src.join(HOOK), "import sys\n").unwrap();
        fs::write(src.join("bootstrap/__pycache__/x.cpython-311.pyc"), "").unwrap();
        fs::write(
            src.join("lib/memprof_agent/__init__.py"),
            "def start(): pass\n",
        )
        .unwrap();
        fs::write(src.join("lib/memprof_agent/old.pyc"), "").unwrap();
        fs::set_permissions(
            src.join("lib/memprof_agent/__init__.py"),
            fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        std::os::unix::fs::symlink("/etc/passwd", src.join("lib/passwd")).unwrap();

        let dst = s.0.join("volume/agent");
        assert_eq!(install(&src, &dst).unwrap(), 2);
        assert_eq!(fs::read_to_string(dst.join(HOOK)).unwrap(), "import sys\n");
        let init = dst.join("lib/memprof_agent/__init__.py");
        assert_eq!(fs::read_to_string(&init).unwrap(), "def start(): pass\n");
        assert_eq!(mode(&init), 0o644);
        assert_eq!(mode(&dst.join("lib/memprof_agent")), 0o755);
        assert!(!dst.join("lib/passwd").exists());
        assert!(!dst.join("bootstrap/__pycache__").exists());
        assert!(!dst.join("lib/memprof_agent/old.pyc").exists());
        // An init container that runs again (pod restart) overwrites.
        assert_eq!(install(&src, &dst).unwrap(), 2);
    }

    #[test]
    fn says_what_is_wrong() {
        let s = Scratch::new("errors");
        let e = install(&s.0.join("nothing"), &s.0.join("dst")).unwrap_err();
        assert!(matches!(e, InstallError::NotAnAgent(_)));
        assert!(e.to_string().contains("--from"), "{e}");

        let src = s.0.join("src");
        fs::create_dir_all(src.join("bootstrap")).unwrap();
        fs::write(src.join(HOOK), "").unwrap();
        fs::write(s.0.join("file"), "").unwrap();
        let e = install(&src, &s.0.join("file/under-a-file")).unwrap_err();
        assert!(matches!(e, InstallError::Write { .. }), "{e}");
        assert!(e.to_string().contains("writable directory"), "{e}");
    }
}
