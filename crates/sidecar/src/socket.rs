//! The Unix socket the agent pushes to (contract A, docs/agent-wire.md
//! "Transport"). What authenticates a push is where the socket lives: in a
//! directory only the pod's own containers mount (the injection's private
//! `emptyDir`) or, for `memprof profile`, a temporary directory only its user
//! can enter (mode 0700). Nothing about it travels over the pod network, so
//! no relay (a service mesh's proxy, `kubectl port-forward`) can reach it.
//!
//! The socket itself is mode 0666: trainers may run as another uid than the
//! sidecar (65532), and the directory, not the socket, is the boundary.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Mode of the socket file (see the module doc).
pub const SOCKET_MODE: u32 = 0o666;

/// Why the agent socket could not be served. Never fatal: the sidecar
/// samples and reports without it, and says so in the report.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// Something that is not a socket is in the way.
    #[error(
        "{path} exists and is not a socket: remove it, or point MEMPROF_AGENT_SOCKET elsewhere"
    )]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// Binding, or setting the socket's mode, failed.
    #[error(
        "cannot serve the agent socket {path}: {source}; check that its directory exists and is \
         writable by the sidecar (the injection mounts an emptyDir at /var/run/memprof), and \
         that the path is shorter than 108 bytes"
    )]
    Bind {
        /// The path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Removes the socket file when dropped (the sidecar stops; the next one in
/// the same `emptyDir` binds afresh).
#[derive(Debug)]
pub struct SocketFile(PathBuf);

impl SocketFile {
    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        if is_socket(&self.0) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

fn is_socket(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket())
}

/// Binds the agent socket at `path`. A socket already there is a previous
/// sidecar's (a restarted container keeps its `emptyDir`) and is replaced;
/// anything else there is left alone and refused. Needs a Tokio runtime.
pub fn bind(path: &Path) -> Result<(tokio::net::UnixListener, SocketFile), SocketError> {
    let bind_err = |source| SocketError::Bind {
        path: path.to_path_buf(),
        source,
    };
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path).map_err(bind_err)?,
        Ok(_) => {
            return Err(SocketError::NotASocket {
                path: path.to_path_buf(),
            })
        }
        Err(_) => {}
    }
    let listener = tokio::net::UnixListener::bind(path).map_err(bind_err)?;
    let file = SocketFile(path.to_path_buf());
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(SOCKET_MODE))
        .map_err(bind_err)?;
    Ok((listener, file))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> PathBuf {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let d = std::env::temp_dir().join(format!(
            "memprof-sock-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[tokio::test]
    async fn a_stale_socket_is_replaced_the_mode_is_0666_and_the_file_goes_at_drop() {
        let d = dir();
        let path = d.join("agent.sock");
        let (first, file) = bind(&path).unwrap();
        // A sidecar killed without its drop leaves the file behind.
        std::mem::forget(file);
        drop(first);
        let (_l, file) = bind(&path).expect("a stale socket is replaced");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, SOCKET_MODE);
        drop(file);
        assert!(!path.exists(), "removed when the sidecar stops");
        std::fs::remove_dir(&d).unwrap();
    }

    #[tokio::test]
    async fn a_file_that_is_not_a_socket_is_never_removed() {
        let d = dir();
        let path = d.join("agent.sock");
        std::fs::write(&path, "the user's").unwrap();
        let err = bind(&path).unwrap_err();
        assert!(matches!(err, SocketError::NotASocket { .. }), "{err}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "the user's");
        let err = bind(&d.join("missing/agent.sock")).unwrap_err();
        assert!(err.to_string().contains("emptyDir"), "{err}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
