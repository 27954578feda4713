//! How a training command line splits: the interpreter, the script and its
//! arguments, and the ranks torchrun starts. `memprof estimate` runs the
//! script under fake tensors with that interpreter; a calibration point's
//! key (`local::points`) is the script and the ranks, so `memprof profile`
//! of `python3 train.py` and an estimate of `train.py` meet.

use std::path::Path;

/// What the command after `--` asks to run.
#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    /// The interpreter (`python` in `-- python train.py`, else `--python`).
    pub python: String,
    /// The script and its arguments.
    pub script: Vec<String>,
    /// Ranks: `--nproc_per_node` of a torchrun command, else `--world-size`.
    pub world_size: Option<u32>,
}

/// torchrun flags that take no value.
const TORCHRUN_SWITCHES: &[&str] = &[
    "--standalone",
    "--no-python",
    "--no_python",
    "--module",
    "-m",
    "--run-path",
    "--run_path",
];

/// Splits `python train.py ARGS`, `train.py ARGS` or `torchrun [FLAGS] train.py ARGS`.
pub fn launch(command: &[String], default_python: &str) -> Launch {
    let first = command.first().map(String::as_str).unwrap_or("");
    let base = Path::new(first)
        .file_name()
        .and_then(|s| s.to_str())
        .unwrap_or("");
    if base.starts_with("python") {
        return Launch {
            python: first.into(),
            script: command[1..].to_vec(),
            world_size: None,
        };
    }
    if base == "torchrun" {
        return torchrun(&command[1..], default_python);
    }
    Launch {
        python: default_python.into(),
        script: command.to_vec(),
        world_size: None,
    }
}

fn torchrun(rest: &[String], python: &str) -> Launch {
    let (mut i, mut world) = (0, None);
    while i < rest.len() && rest[i].starts_with('-') {
        let (flag, inline) = match rest[i].split_once('=') {
            Some((f, v)) => (f, Some(v.to_string())),
            None => (rest[i].as_str(), None),
        };
        let takes_value = inline.is_none() && !TORCHRUN_SWITCHES.contains(&flag);
        let value = inline.or_else(|| takes_value.then(|| rest.get(i + 1).cloned()).flatten());
        if matches!(flag, "--nproc_per_node" | "--nproc-per-node") {
            world = value.and_then(|v| v.parse().ok());
        }
        i += if takes_value { 2 } else { 1 };
    }
    Launch {
        python: python.into(),
        script: rest[i.min(rest.len())..].to_vec(),
        world_size: world,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn python_first_is_the_interpreter() {
        let l = launch(&words("python3.12 train.py --lr 1"), "python3");
        assert_eq!(l.python, "python3.12");
        assert_eq!(l.script, words("train.py --lr 1"));
    }

    #[test]
    fn a_bare_script_runs_with_the_default_python() {
        let l = launch(&words("train.py"), "py");
        assert_eq!((l.python.as_str(), l.script.len()), ("py", 1));
    }

    #[test]
    fn torchrun_gives_the_world_size_and_the_script() {
        let l = launch(
            &words("torchrun --standalone --nproc_per_node 8 train.py --bs 4"),
            "python3",
        );
        assert_eq!(l.world_size, Some(8));
        assert_eq!(l.script, words("train.py --bs 4"));
        let l = launch(
            &words("torchrun --nproc-per-node=2 --max-restarts 0 t.py"),
            "python3",
        );
        assert_eq!((l.world_size, l.script), (Some(2), words("t.py")));
    }
}
