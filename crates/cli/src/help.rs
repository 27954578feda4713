//! `memprof --help` as a kubectl user reads it: commands grouped by where
//! they work (the cluster, this machine), internal ones hidden, examples;
//! and a typo suggestion that prefers an edit away over a letter in common
//! (`tpo` is `top`, not `plot`).

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::Command;
use std::fmt::Write;

/// The groups of `--help`, in order; a visible command in none of them is
/// listed under "Other commands", so none is ever left out.
pub const GROUPS: &[(&str, &[&str])] = &[
    (
        "Cluster commands (also as `kubectl memprof …`)",
        &["top", "report", "plot", "compare", "policy", "doctor"],
    ),
    (
        "Local commands (this machine's GPUs and files)",
        &[
            "profile",
            "watch",
            "oom",
            "analyze",
            "sweep",
            "estimate",
            "rollup",
            "fragment",
            "timeline",
            "compare",
            "node-check",
        ],
    ),
    ("Setup", &["completion"]),
];

/// Examples under the top-level help.
pub const EXAMPLES: &str = "\
Examples:
  # Profiled Jobs in the current namespace, worst first; all namespaces, more columns
  kubectl memprof top
  kubectl memprof top -A -o wide
  # What memprof concluded about one Job, and its ranks
  kubectl memprof report train -n ml
  # Is the install healthy? Which GPU access mode does this node support?
  kubectl memprof doctor
  memprof node-check
  # Profile this machine's GPUs while a trainer runs
  memprof profile -- python train.py";

/// `cmd` with its subcommands listed by [`GROUPS`] (hidden ones left out).
pub fn grouped(cmd: Command) -> Command {
    let mut listed: Vec<&str> = Vec::new();
    let mut text = String::new();
    let visible: Vec<&Command> = cmd.get_subcommands().filter(|s| !s.is_hide_set()).collect();
    let width = visible
        .iter()
        .map(|s| s.get_name().len())
        .max()
        .unwrap_or(0);
    let line = |out: &mut String, s: &Command| {
        let about = s.get_about().map(|a| a.to_string()).unwrap_or_default();
        let first = about
            .split(". ")
            .next()
            .unwrap_or_default()
            .trim_end_matches('.');
        let _ = writeln!(out, "  {:width$}  {first}", s.get_name());
    };
    for (title, names) in GROUPS {
        let members: Vec<&&Command> = names
            .iter()
            .filter_map(|n| visible.iter().find(|s| s.get_name() == *n))
            .collect();
        if members.is_empty() {
            continue;
        }
        let _ = writeln!(text, "{title}:");
        for s in members {
            line(&mut text, s);
            listed.push(s.get_name());
        }
        text.push('\n');
    }
    let others: Vec<&&Command> = visible
        .iter()
        .filter(|s| !listed.contains(&s.get_name()) && s.get_name() != "help")
        .collect();
    if !others.is_empty() {
        let _ = writeln!(text, "Other commands:");
        for s in others {
            line(&mut text, s);
        }
        text.push('\n');
    }
    let template = format!(
        "{{about-with-newline}}\n{{usage-heading}} {{usage}}\n\n{text}Options:\n{{options}}{{after-help}}"
    );
    cmd.help_template(template).after_help(EXAMPLES)
}

/// The closest command name to a mistyped `word`: fewest edits (a swap of
/// two neighbours counts as one, as people type), within two edits and
/// less than the word's length; ties by Jaro–Winkler. clap's own
/// suggestion ranks by Jaro alone, which put `plot` before `top` for `tpo`.
pub fn suggest<'a>(word: &str, names: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let limit = 2.min(word.chars().count().saturating_sub(1));
    names
        .into_iter()
        .map(|n| (strsim::damerau_levenshtein(word, n), n))
        .filter(|(d, _)| *d <= limit)
        .min_by(|(da, a), (db, b)| {
            let (ja, jb) = (strsim::jaro_winkler(word, a), strsim::jaro_winkler(word, b));
            da.cmp(db).then(jb.total_cmp(&ja))
        })
        .map(|(_, n)| n)
}

/// clap's "unrecognized subcommand" error with [`suggest`]'s suggestion in
/// place of clap's (or none, when nothing is close). Other errors pass.
pub fn better_suggestion(err: clap::Error, cmd: &Command) -> clap::Error {
    if err.kind() != ErrorKind::InvalidSubcommand {
        return err;
    }
    let Some(ContextValue::String(word)) = err.get(ContextKind::InvalidSubcommand).cloned() else {
        return err;
    };
    let names = cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set())
        .flat_map(|s| std::iter::once(s.get_name()).chain(s.get_visible_aliases()));
    // A fresh error: clap's has its suggestion in it, and a context cannot be removed.
    let mut out = clap::Error::new(ErrorKind::InvalidSubcommand).with_cmd(cmd);
    out.insert(
        ContextKind::InvalidSubcommand,
        ContextValue::String(word.clone()),
    );
    if let Some(s) = suggest(&word, names) {
        out.insert(
            ContextKind::SuggestedSubcommand,
            ContextValue::Strings(vec![s.to_string()]),
        );
    }
    if let Some(usage) = err.get(ContextKind::Usage).cloned() {
        out.insert(ContextKind::Usage, usage);
    }
    out
}

/// Refuses a command that starts with a flag-looking word: the command's
/// trailing arguments take any word clap does not know, so a mistyped
/// `memprof profile --duraton 5` would otherwise run `--duraton 5`. The
/// error names the closest flag of `A` and says to put the command after `--`.
pub fn check_command<A: clap::Args>(name: &str, command: &[String]) -> Result<(), UnknownFlag> {
    let Some(word) = command
        .first()
        .filter(|w| w.starts_with('-') && w.len() > 1)
    else {
        return Ok(());
    };
    let flag = word.split_once('=').map_or(word.as_str(), |(f, _)| f);
    let cmd = A::augment_args(Command::new("memprof"));
    let longs: Vec<String> = cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set())
        .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
        .collect();
    let close = suggest(flag, longs.iter().map(String::as_str))
        .map(|s| format!("did you mean {s}? "))
        .unwrap_or_default();
    Err(UnknownFlag {
        flag: flag.to_string(),
        command: name.to_string(),
        close,
    })
}

/// A flag-looking first word of a command (see [`check_command`]): one
/// line naming the closest flag and where the command goes.
#[derive(Debug, PartialEq, thiserror::Error)]
#[error(
    "unknown flag {flag} for `memprof {command}`: {close}flags go before the command, \
     and the command after `--` (memprof {command} [FLAGS] -- COMMAND...)"
)]
pub struct UnknownFlag {
    /// The word, without its `=value`.
    pub flag: String,
    /// The memprof command (`profile`, `watch`, `sweep`).
    pub command: String,
    /// `did you mean --x? `, or empty.
    close: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAMES: [&str; 10] = [
        "top", "report", "plot", "compare", "policy", "profile", "oom", "analyze", "sweep",
        "doctor",
    ];

    #[test]
    fn a_swap_of_two_letters_is_the_closest_name() {
        assert_eq!(suggest("tpo", NAMES), Some("top"));
        assert_eq!(suggest("reprot", NAMES), Some("report"));
        assert_eq!(suggest("plto", NAMES), Some("plot"));
        assert_eq!(suggest("poilcy", NAMES), Some("policy"));
        assert_eq!(suggest("docter", NAMES), Some("doctor"));
    }

    /// A few flags, as a command's `Args`.
    #[derive(clap::Args)]
    struct Flags {
        #[arg(long)]
        duration: Option<f64>,
        #[arg(long)]
        devices: Option<String>,
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<String>,
    }

    #[test]
    fn a_flag_looking_word_before_the_command_is_a_mistyped_flag() {
        let words = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let e = check_command::<Flags>("profile", &words(&["--duraton", "5"])).unwrap_err();
        assert_eq!(e.flag, "--duraton");
        let e = e.to_string();
        assert!(e.contains("unknown flag --duraton"), "{e}");
        assert!(e.contains("did you mean --duration?"), "{e}");
        assert!(e.contains("after `--`"), "{e}");
        assert!(!e.contains('\n'), "{e}");
        let e = check_command::<Flags>("profile", &words(&["--devise=0"]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--devise for") && e.contains("--devices?"),
            "{e}"
        );
        let e = check_command::<Flags>("profile", &words(&["--zzzzzz"]))
            .unwrap_err()
            .to_string();
        assert!(!e.contains("did you mean"), "{e}");
        check_command::<Flags>("profile", &words(&["python", "--lr", "1"])).unwrap();
        check_command::<Flags>("profile", &[]).unwrap();
    }

    #[test]
    fn nothing_close_suggests_nothing() {
        assert_eq!(suggest("xyz", NAMES), None);
        assert_eq!(suggest("q", NAMES), None);
        assert_eq!(suggest("deploy", NAMES), None);
    }

    fn cli() -> Command {
        Command::new("memprof")
            .subcommand(Command::new("top").about("Jobs by risk"))
            .subcommand(Command::new("plot").about("Draw. More words"))
            .subcommand(Command::new("profile").about("This machine"))
            .subcommand(Command::new("crd").hide(true))
            .subcommand(Command::new("extra").about("Not grouped"))
    }

    #[test]
    fn help_groups_commands_hides_internal_ones_and_keeps_the_rest() {
        let mut cmd = grouped(cli());
        let help = cmd.render_help().to_string();
        let cluster = help.find("Cluster commands").unwrap();
        let local = help.find("Local commands").unwrap();
        let top = help.find("  top ").unwrap();
        let profile = help.find("  profile ").unwrap();
        assert!(cluster < top && top < local && local < profile, "{help}");
        assert!(help.contains("  plot     Draw\n"), "{help}");
        assert!(
            help.contains("Other commands:\n  extra    Not grouped"),
            "{help}"
        );
        assert!(!help.contains("crd"), "{help}");
        assert!(help.contains("Examples:\n  # Profiled Jobs"), "{help}");
    }

    #[test]
    fn the_typo_error_names_our_suggestion() {
        let cmd = grouped(cli());
        let err = cmd
            .clone()
            .try_get_matches_from(["memprof", "tpo"])
            .unwrap_err();
        let text = better_suggestion(err, &cmd).to_string();
        assert!(
            text.contains("a similar subcommand exists: 'top'"),
            "{text}"
        );
        assert!(!text.contains("'plot'"), "{text}");
        let err = cmd
            .clone()
            .try_get_matches_from(["memprof", "zzz"])
            .unwrap_err();
        let text = better_suggestion(err, &cmd).to_string();
        assert!(!text.contains("similar"), "{text}");
    }
}
