//! `memprof profile` under a launcher, one per rank: what torchrun (and most
//! launchers) tell each process through its environment (`RANK`,
//! `LOCAL_RANK`, `CUDA_VISIBLE_DEVICES`) becomes the report's identity
//! (rank, node, a name per rank), the file names (`--output
//! 'node-{host}-rank{rank}.json'`) and the GPU (`--devices local-rank`), so
//! `memprof rollup` can roll every rank's report up as the operator rolls up
//! a Job's pods.
//!
//! Why one profile per rank rather than one per node: a sidecar keeps one
//! trainer process's allocator history (its agent state follows one
//! process), so several ranks pushing into one sidecar would mix their
//! series; one sidecar per rank keeps each rank's verdict its own.

use super::ProfileError;
use std::path::{Path, PathBuf};

/// The `--devices` entry that means "this rank's GPU".
pub const LOCAL_RANK_DEVICE: &str = "local-rank";

/// What the environment says about this process's place in a launch.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Launch {
    /// `RANK` (global rank).
    pub rank: Option<u32>,
    /// `LOCAL_RANK` (rank on this node).
    pub local_rank: Option<u32>,
    /// This machine's host name.
    pub host: String,
    /// `CUDA_VISIBLE_DEVICES`, when set.
    pub cuda_visible: Option<String>,
}

impl Launch {
    /// From the process environment and the host name.
    pub fn from_env() -> Self {
        Self::from_vars(|k| std::env::var(k).ok(), &host_name())
    }

    /// From any lookup of variables (tests pass a map).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>, host: &str) -> Self {
        let num = |k: &str| var(k).and_then(|v| v.trim().parse().ok());
        Launch {
            rank: num("RANK"),
            local_rank: num("LOCAL_RANK"),
            host: host.to_string(),
            cuda_visible: var("CUDA_VISIBLE_DEVICES").filter(|v| !v.trim().is_empty()),
        }
    }

    /// The report's name: the host, and the rank when there is one.
    pub fn report_name(&self) -> String {
        match self.rank {
            Some(r) => format!("{}-rank{r}", self.host),
            None => self.host.clone(),
        }
    }

    /// `path` with `{rank}`, `{local_rank}` and `{host}` filled in; a
    /// placeholder whose variable is not set is an error (two ranks would
    /// otherwise write the same file).
    pub fn expand(&self, path: &Path) -> Result<PathBuf, ProfileError> {
        let mut text = path.display().to_string();
        for (key, value, var) in [
            ("{rank}", self.rank, "RANK"),
            ("{local_rank}", self.local_rank, "LOCAL_RANK"),
        ] {
            if text.contains(key) {
                let v = value.ok_or_else(|| {
                    ProfileError::Usage(format!(
                        "{}: {key} needs {var} in the environment (run under torchrun, or set it)",
                        path.display()
                    ))
                })?;
                text = text.replace(key, &v.to_string());
            }
        }
        Ok(PathBuf::from(text.replace("{host}", &self.host)))
    }

    /// `--devices` with [`LOCAL_RANK_DEVICE`] replaced by this rank's GPU:
    /// entry `LOCAL_RANK` of `CUDA_VISIBLE_DEVICES` when set (an index or a
    /// UUID), else the GPU whose index is `LOCAL_RANK` (torchrun's
    /// `cuda:LOCAL_RANK` convention).
    pub fn devices(&self, given: &[String]) -> Result<Vec<String>, ProfileError> {
        given
            .iter()
            .map(|d| match d.trim() {
                LOCAL_RANK_DEVICE => self.local_gpu(),
                other => Ok(other.to_string()),
            })
            .collect()
    }

    fn local_gpu(&self) -> Result<String, ProfileError> {
        let usage = |m: String| ProfileError::Usage(m);
        let lr = self.local_rank.ok_or_else(|| {
            usage(
                "--devices local-rank needs LOCAL_RANK in the environment (run under torchrun)"
                    .into(),
            )
        })?;
        match &self.cuda_visible {
            None => Ok(lr.to_string()),
            Some(list) => memprof_api::env::split_list(list)
                .get(lr as usize)
                .cloned()
                .ok_or_else(|| {
                    usage(format!(
                        "--devices local-rank: LOCAL_RANK={lr} but CUDA_VISIBLE_DEVICES={list} has no such entry"
                    ))
                }),
        }
    }
}

/// This machine's name (`HOSTNAME`, else the kernel's), `localhost` when
/// neither says.
pub fn host_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(vars: &[(&str, &str)]) -> Launch {
        let m: std::collections::HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Launch::from_vars(|k| m.get(k).cloned(), "node-a")
    }

    #[test]
    fn a_rank_gets_its_own_name_files_and_gpu() {
        let l = launch(&[("RANK", "3"), ("LOCAL_RANK", "1")]);
        assert_eq!(l.report_name(), "node-a-rank3");
        assert_eq!(
            l.expand(Path::new("out/{host}-rank{rank}-{local_rank}.json"))
                .unwrap(),
            PathBuf::from("out/node-a-rank3-1.json")
        );
        assert_eq!(l.devices(&["local-rank".into()]).unwrap(), ["1"]);
        let l = launch(&[("LOCAL_RANK", "1"), ("CUDA_VISIBLE_DEVICES", "4, GPU-x")]);
        assert_eq!(
            l.devices(&["local-rank".into(), "0".into()]).unwrap(),
            ["GPU-x", "0"]
        );
    }

    #[test]
    fn outside_a_launch_placeholders_are_refused_and_names_stay_plain() {
        let l = launch(&[]);
        assert_eq!(l.report_name(), "node-a");
        let e = l.expand(Path::new("r{rank}.json")).unwrap_err().to_string();
        assert!(e.contains("{rank} needs RANK"), "{e}");
        assert!(l.devices(&["local-rank".into()]).is_err());
        assert_eq!(
            l.expand(Path::new("r.json")).unwrap(),
            PathBuf::from("r.json")
        );
        let l = launch(&[("LOCAL_RANK", "2"), ("CUDA_VISIBLE_DEVICES", "0,1")]);
        assert!(l.devices(&["local-rank".into()]).is_err());
    }
}
