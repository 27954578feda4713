//! The trainer's processes as the host knows them, without the agent:
//! `memprof profile` starts the command itself and writes its pid to a
//! file in its private directory (`--trainer-pid-file`); the sidecar
//! follows that process and its children (a launcher's workers, a
//! DataLoader's) so that growth NVML sees in any *other* process is
//! blamed on that process, not on the trainer
//! (`memprof_analysis::tracker::Tracker::own_processes`).
//!
//! Read from `/proc` by hand (the parent pid, one field of
//! `/proc/PID/stat`): the `procfs` crate would bring a dozen crates for it.

use std::collections::BTreeSet;
use std::path::Path;

/// The pid in `file` and every process descended from it, sorted; empty
/// while the file is missing or unreadable (the command has not started)
/// or the process is gone.
pub fn processes(file: &Path) -> Vec<u32> {
    let Some(root) = std::fs::read_to_string(file)
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
    else {
        return Vec::new();
    };
    descendants(root, &parents())
}

/// `root` and its descendants in a (pid, parent pid) table; nothing when
/// `root` is not in it.
pub fn descendants(root: u32, table: &[(u32, u32)]) -> Vec<u32> {
    if !table.iter().any(|&(pid, _)| pid == root) {
        return Vec::new();
    }
    let mut tree = BTreeSet::from([root]);
    // Each pass adds the children of what is in: depth passes at most.
    loop {
        let before = tree.len();
        for &(pid, parent) in table {
            if tree.contains(&parent) {
                tree.insert(pid);
            }
        }
        if tree.len() == before {
            return tree.into_iter().collect();
        }
    }
}

/// Every process's (pid, parent pid), from `/proc`.
fn parents() -> Vec<(u32, u32)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| Some((pid, parent_of(pid)?)))
        .collect()
}

/// The parent pid in `/proc/PID/stat`: the field after the command, whose
/// name (in parentheses) may itself hold spaces and parentheses.
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_is_its_root_and_every_descendant_and_nothing_else() {
        let table = [(1, 0), (10, 1), (11, 10), (12, 11), (20, 1), (21, 20)];
        assert_eq!(descendants(10, &table), vec![10, 11, 12]);
        assert_eq!(descendants(99, &table), Vec::<u32>::new());
    }

    /// A real child and grandchild of this test process are found through
    /// `/proc`, and a missing file is no tree.
    #[test]
    fn the_file_s_process_and_its_children_are_the_trainer() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("trainer.pid");
        assert!(processes(&file).is_empty());
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & wait"])
            .spawn()
            .unwrap();
        std::fs::write(&file, child.id().to_string()).unwrap();
        let mut found = Vec::new();
        // Up to 10 s for the shell to start its child on a busy machine;
        // a passing run stops at once.
        for _ in 0..500 {
            found = processes(&file);
            if found.len() >= 2 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        let sleep = found.iter().copied().find(|p| *p != child.id());
        assert!(found.contains(&child.id()) && sleep.is_some(), "{found:?}");
        // The orphaned sleep is stopped by pid too.
        let _ = std::process::Command::new("kill")
            .arg(sleep.unwrap().to_string())
            .status();
        assert_eq!(parent_of(child.id()), None, "reaped");
    }
}
