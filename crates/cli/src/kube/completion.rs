//! Shell completion: `memprof completion bash|zsh|fish` prints clap's
//! scripts, and the hidden `memprof __complete WORDS… PARTIAL` answers in the
//! protocol of Cobra (what kubectl ≥ 1.26 asks a plugin's
//! `kubectl_complete-<plugin>` helper): one candidate per line
//! (`value<TAB>description`), then `:<directive>`. Subcommands and flags come
//! from the clap definition; Job names from the MemoryProfiles in scope.

use crate::kube::client::{self as k, KubeArgs};
use clap::Command;
use kube::ResourceExt;
use std::path::PathBuf;

/// Shells `memprof completion` writes scripts for.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Shell {
    /// bash (`source <(memprof completion bash)`).
    Bash,
    /// zsh (`source <(memprof completion zsh)`).
    Zsh,
    /// fish (`memprof completion fish | source`).
    Fish,
}

/// The completion script of `shell` for `cmd`, named `bin`.
pub fn script(shell: Shell, cmd: &mut Command, bin: &str) -> String {
    let shell = match shell {
        Shell::Bash => clap_complete::Shell::Bash,
        Shell::Zsh => clap_complete::Shell::Zsh,
        Shell::Fish => clap_complete::Shell::Fish,
    };
    let mut out = Vec::new();
    clap_complete::generate(shell, cmd, bin, &mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// Cobra's "do not fall back to file names".
const NO_FILE_COMP: u8 = 4;
/// Cobra's default: the shell may complete file names.
const DEFAULT: u8 = 0;

/// Subcommands whose positional arguments are Job names.
const TAKES_JOBS: [&str; 5] = ["report", "plot", "compare", "explain", "top"];

/// What the words typed so far call for (pure: no cluster).
#[derive(Debug, Default, PartialEq)]
pub struct Need {
    /// Candidates known without a cluster, `(value, description)`.
    pub candidates: Vec<(String, String)>,
    /// Job names of the cluster are wanted too.
    pub jobs: bool,
    /// File names are fine (a flag that takes a path).
    pub files: bool,
    /// The cluster flags typed so far.
    pub kube: KubeArgs,
}

/// Works out what completes `partial` after `words`.
pub fn need(root: &Command, words: &[String], partial: &str) -> Need {
    // Built, clap has filled in defaults such as how many values a flag takes.
    let mut built = root.clone();
    built.build();
    let mut cur = &built;
    let mut need = Need::default();
    let mut i = 0;
    while i < words.len() {
        let w = &words[i];
        if let Some(arg) = flag(cur, w) {
            if let Some((_, v)) = w.split_once('=') {
                note_kube_flag(&mut need.kube, arg.get_id().as_str(), v);
            } else if takes_value(arg) {
                if let Some(v) = words.get(i + 1) {
                    note_kube_flag(&mut need.kube, arg.get_id().as_str(), v);
                }
                i += 1;
            }
        } else if let Some(sub) = cur.find_subcommand(w) {
            cur = sub;
        }
        i += 1;
    }
    if let Some(prev) = words.last().and_then(|w| flag(cur, w)) {
        if takes_value(prev) && !words.last().is_some_and(|w| w.contains('=')) {
            need.candidates = prev
                .get_possible_values()
                .iter()
                .map(|v| (v.get_name().to_string(), help(v.get_help())))
                .collect();
            need.files = need.candidates.is_empty() && prev.get_id() != "namespace";
            return need;
        }
    }
    if partial.starts_with('-') {
        need.candidates = cur
            .get_arguments()
            .filter(|a| !a.is_hide_set())
            .filter_map(|a| Some((format!("--{}", a.get_long()?), help(a.get_help()))))
            .collect();
    } else if cur.has_subcommands() {
        need.candidates = cur
            .get_subcommands()
            .filter(|s| !s.is_hide_set())
            .map(|s| (s.get_name().to_string(), help(s.get_about())))
            .collect();
    } else {
        need.jobs = TAKES_JOBS.contains(&cur.get_name());
    }
    need.candidates.retain(|(v, _)| v.starts_with(partial));
    need
}

fn help(s: Option<&clap::builder::StyledStr>) -> String {
    s.map(|s| s.to_string().lines().next().unwrap_or_default().to_string())
        .unwrap_or_default()
}

fn flag<'a>(cmd: &'a Command, word: &str) -> Option<&'a clap::Arg> {
    let name = word.split('=').next().unwrap_or(word);
    if let Some(long) = name.strip_prefix("--") {
        cmd.get_arguments().find(|a| a.get_long() == Some(long))
    } else if let Some(short) = name.strip_prefix('-').filter(|s| s.chars().count() == 1) {
        let c = short.chars().next()?;
        cmd.get_arguments().find(|a| a.get_short() == Some(c))
    } else {
        None
    }
}

fn takes_value(arg: &clap::Arg) -> bool {
    arg.get_num_args().is_some_and(|n| n.takes_values())
}

fn note_kube_flag(kube: &mut KubeArgs, id: &str, value: &str) {
    match id {
        "kubeconfig" => kube.kubeconfig = Some(PathBuf::from(value)),
        "context" => kube.context = Some(value.to_string()),
        "namespace" => kube.namespace = Some(value.to_string()),
        _ => {}
    }
}

/// The answer to `__complete`: candidates, then the directive line.
/// A cluster that cannot be reached only means no Job names.
pub async fn complete(root: &Command, args: &[String]) -> String {
    let (partial, words) = match args.split_last() {
        Some((p, w)) => (p.as_str(), w),
        None => ("", args),
    };
    let mut need = need(root, words, partial);
    if need.jobs {
        need.candidates.extend(
            job_names(&need.kube)
                .await
                .into_iter()
                .filter(|n| n.starts_with(partial))
                .map(|n| (n, "MemoryProfile".to_string())),
        );
    }
    let mut out = String::new();
    for (v, d) in &need.candidates {
        if d.is_empty() {
            out.push_str(&format!("{v}\n"));
        } else {
            out.push_str(&format!("{v}\t{d}\n"));
        }
    }
    let directive = if need.files { DEFAULT } else { NO_FILE_COMP };
    out.push_str(&format!(":{directive}\n"));
    out
}

async fn job_names(kube: &KubeArgs) -> Vec<String> {
    let Ok((client, ns)) = kube.connect().await else {
        return Vec::new();
    };
    let scope = k::Scope::Namespace(ns);
    let lookup = k::list_profiles(&client, &scope, None);
    match tokio::time::timeout(std::time::Duration::from_secs(5), lookup).await {
        Ok(Ok(profiles)) => profiles.iter().map(|p| p.name_any()).collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, ArgAction};

    fn cli() -> Command {
        let kube = |c: Command| {
            c.arg(Arg::new("job"))
                .arg(Arg::new("namespace").short('n').long("namespace"))
                .arg(
                    Arg::new("format")
                        .short('o')
                        .long("output")
                        .value_parser(["table", "json"]),
                )
                .arg(
                    Arg::new("watch")
                        .short('w')
                        .long("watch")
                        .action(ArgAction::SetTrue),
                )
        };
        Command::new("memprof")
            .subcommand(kube(Command::new("report").about("Show a job")))
            .subcommand(kube(Command::new("top").about("Jobs by risk")))
            .subcommand(Command::new("crd").about("Print CRDs"))
    }

    fn words(w: &[&str]) -> Vec<String> {
        w.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn subcommands_then_job_names_then_flags_then_flag_values() {
        let root = cli();
        let n = need(&root, &[], "r");
        assert_eq!(n.candidates, vec![("report".into(), "Show a job".into())]);
        let n = need(&root, &words(&["report", "-n", "ml"]), "");
        assert!(n.jobs && n.candidates.is_empty(), "{n:?}");
        assert_eq!(n.kube.namespace.as_deref(), Some("ml"));
        let n = need(&root, &words(&["report", "--namespace=team"]), "");
        assert_eq!(n.kube.namespace.as_deref(), Some("team"));
        let n = need(&root, &words(&["report"]), "--w");
        assert_eq!(n.candidates[0].0, "--watch");
        let n = need(&root, &words(&["top", "-o"]), "");
        let values: Vec<_> = n.candidates.iter().map(|c| c.0.as_str()).collect();
        assert_eq!(values, ["table", "json"]);
        assert!(!need(&root, &words(&["crd"]), "").jobs);
    }
}
