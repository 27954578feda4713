//! `memprof-cli`: the subcommands of the `memprof` CLI that are library code
//! (so they are tested). Each module owns its flags (`Args`) and its `run`;
//! `src/bin/memprof.rs` only dispatches.
//!
//! - [`kube`]: the kubectl plugin, commands that read the cluster (`top`,
//!   `report`, `plot`, `compare` of two Jobs, `policy`, shell completion);
//! - [`local`]: the local lab, commands on this machine's GPUs and files
//!   (`profile`, `oom`, `analyze`, `sweep`, `install-agent`, `compare` of
//!   two result files);
//! - [`duration`]: the one parser of every duration flag (`5`, `5s`, `500ms`, `2m`);
//! - [`output`]: `-o` formats and kubectl-style tables, shared by both;
//! - [`outfile`]: files and folders a command writes, checked before it works;
//! - [`memviz`]: the agent's OOM snapshot as the pickle PyTorch's memory_viz opens;
//! - [`plot`]: SVG and text charts, shared by both;
//! - [`render`]: verdicts in words (the agent's sections), shared by both.
//!
//! Depends on `memprof-api`, `memprof-analysis` and `memprof-controller`
//! (`policy explain` shows the controller's own trigger and plan arithmetic).
#![forbid(unsafe_code)]

pub mod duration;
pub mod help;
pub mod kube;
pub mod local;
pub mod memviz;
pub mod nodecheck;
pub mod outfile;
pub mod output;
pub mod plot;
pub mod render;
#[cfg(test)]
mod views_agree;

/// `memprof compare A B`: result files (sweep or profile summaries) are
/// compared locally, anything else names two Jobs in the cluster. Either
/// argument naming a file ([`local::compare_files::names_a_file`]) makes it
/// a comparison of files: a missing one is said to be missing.
pub async fn compare(args: crate::kube::compare::Args) -> anyhow::Result<i32> {
    use crate::local::compare_files::names_a_file;
    let (a, b) = (std::path::Path::new(&args.a), std::path::Path::new(&args.b));
    if names_a_file(&args.a) || names_a_file(&args.b) {
        let c = crate::local::compare_files::compare_paths(a, b)?;
        let format = crate::kube::compare::format_of(&args.output);
        let text = crate::local::compare_files::render(&c, format);
        output::print(&crate::kube::compare::apply_template(&args.output, text));
        return Ok(0);
    }
    Ok(crate::kube::compare::run(args).await?)
}

/// Every command parses durations the same way ([`duration`]): pinned on
/// two commands' flags here, above both, so that `duration` needs neither.
#[cfg(test)]
mod duration_flags {
    use crate::duration::parse;
    use std::time::Duration;

    /// The forms on two commands, as clap parses them.
    #[test]
    fn every_form_on_profile_and_top() {
        use clap::Parser;
        #[derive(Parser)]
        struct Profile {
            #[command(flatten)]
            a: crate::local::profile::Args,
        }
        #[derive(Parser)]
        struct Top {
            #[command(flatten)]
            a: crate::kube::top::Args,
        }
        for (form, want) in [
            ("5", Duration::from_secs(5)),
            ("5s", Duration::from_secs(5)),
            ("500ms", Duration::from_millis(500)),
            ("2m", Duration::from_secs(120)),
        ] {
            let p = Profile::try_parse_from(["p", "--duration", form])
                .unwrap()
                .a;
            assert_eq!(p.sample.duration, want, "profile --duration {form}");
            let t = Top::try_parse_from(["t", "--interval", form, "--stale-after", form])
                .unwrap()
                .a;
            assert_eq!(t.watch.interval, want, "top --interval {form}");
            assert_eq!(t.stale_after, Some(want), "top --stale-after {form}");
        }
        for form in ["5", "5s", "500ms"] {
            let p = Profile::try_parse_from(["p", "--interval", form])
                .unwrap()
                .a;
            assert_eq!(
                p.sample.interval,
                parse(form).unwrap(),
                "profile --interval {form}"
            );
        }
        assert!(Top::try_parse_from(["t", "--interval", "2x"]).is_err());
    }
}
