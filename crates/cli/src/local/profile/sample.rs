//! The sampling flags `memprof profile` and `memprof oom` share, and the
//! `memprof-sidecar --standalone` flags they become.

use super::{Backend, ProfileError};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where samples come from and how they are taken: the flags `memprof
/// profile` and `memprof oom` share (both run a standalone sidecar with them).
#[derive(Clone, Debug, Default, clap::Args)]
pub struct SampleArgs {
    /// GPUs to watch, comma-separated NVML indices or UUIDs (default: all this
    /// machine's GPUs); `local-rank` is this rank's GPU under torchrun
    /// (`LOCAL_RANK`, through `CUDA_VISIBLE_DEVICES` when set).
    #[arg(long, value_delimiter = ',', value_name = "GPU,...")]
    pub devices: Vec<String>,
    /// Stop after this long (`90`, `90s`, `1m30s`; 0: until interrupted;
    /// `profile` also stops when its command exits).
    #[arg(long, default_value = "0", value_name = "DURATION", value_parser = crate::duration::parse)]
    pub duration: Duration,
    /// Sampling interval, 10ms to 60s (`1`, `1s`, `100ms`; a bare number is seconds).
    #[arg(long, default_value = "1s", value_name = "DURATION", value_parser = crate::duration::parse_interval)]
    pub interval: Duration,
    /// Where samples come from (default: `sim` with `--scenario`, `trace`
    /// with `--trace`, else `nvml`).
    #[arg(long, value_enum)]
    pub backend: Option<Backend>,
    /// Scenario file of simulated GPUs (`--backend sim`; see the README).
    #[arg(long, value_name = "FILE")]
    pub scenario: Option<PathBuf>,
    /// CSV trace to replay (`--backend trace`).
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Speed of simulated or replayed time relative to the wall clock.
    #[arg(long, default_value_t = 1.0)]
    pub speed: f64,
    /// Analysis thresholds as JSON (camelCase fields), e.g. `{"highTtoSeconds":900}`.
    #[arg(long)]
    pub thresholds: Option<String>,
    /// Who the report is about (`--pod-name`, `--node-name`), set by
    /// `profile` from the launch ([`super::launch::Launch`]); not a flag.
    #[arg(skip)]
    pub identity: Vec<String>,
}

impl SampleArgs {
    /// The flags of `memprof-sidecar --standalone` these ask for (without
    /// `--listen`).
    pub fn sidecar_flags(&self, trace_out: &Path, output: &Path) -> Vec<String> {
        let mut f: Vec<String> = vec![
            "--backend".into(),
            self.backend().flag().into(),
            "--interval".into(),
            crate::duration::millis(self.interval),
            "--speed".into(),
            self.speed.to_string(),
            "--trace-out".into(),
            trace_out.display().to_string(),
            "--output".into(),
            output.display().to_string(),
        ];
        let mut add = |k: &str, v: Option<String>| {
            if let Some(v) = v {
                f.extend([k.to_string(), v]);
            }
        };
        add(
            "--scenario",
            self.scenario.as_ref().map(|p| p.display().to_string()),
        );
        add(
            "--trace",
            self.trace.as_ref().map(|p| p.display().to_string()),
        );
        add("--thresholds", self.thresholds.clone());
        add(
            "--duration",
            (!self.duration.is_zero()).then(|| self.duration.as_secs_f64().to_string()),
        );
        add(
            "--gpus",
            (!self.devices.is_empty()).then(|| self.devices.join(",")),
        );
        f.extend(self.identity.iter().cloned());
        f
    }

    /// The backend asked for, else the one `--scenario` or `--trace` implies.
    pub fn backend(&self) -> Backend {
        match (self.backend, &self.scenario, &self.trace) {
            (Some(b), _, _) => b,
            (None, Some(_), None) => Backend::Sim,
            (None, None, Some(_)) => Backend::Trace,
            _ => Backend::Nvml,
        }
    }

    /// Refuses flags the sidecar would refuse later, and a scenario or trace
    /// it could not read, with what to write instead: before anything starts.
    pub fn check(&self) -> Result<(), ProfileError> {
        self.check_source()?;
        self.check_speed()?;
        self.check_thresholds()?;
        self.check_source_file()
    }

    /// One source of samples, and the flag its backend needs.
    fn check_source(&self) -> Result<(), ProfileError> {
        let usage = |m: &str| Err(ProfileError::Usage(m.into()));
        if self.backend.is_none() && self.scenario.is_some() && self.trace.is_some() {
            return usage("--scenario and --trace are two sources: pass one, or say which with --backend sim|trace");
        }
        match (self.backend(), &self.scenario, &self.trace) {
            (Backend::Sim, None, _) => {
                usage("--backend sim needs --scenario FILE (e.g. hack/scenarios/demo.yaml)")
            }
            (Backend::Trace, _, None) => usage("--backend trace needs --trace FILE"),
            (Backend::Nvml, Some(_), _) => usage(
                "--scenario is for simulated GPUs: drop --backend nvml (or pass --backend sim)",
            ),
            (Backend::Nvml, _, Some(_)) => usage(
                "--trace replays a recorded trace: drop --backend nvml (or pass --backend trace)",
            ),
            _ => Ok(()),
        }
    }

    /// A positive, finite speed factor.
    fn check_speed(&self) -> Result<(), ProfileError> {
        if self.speed > 0.0 && self.speed.is_finite() {
            return Ok(());
        }
        Err(ProfileError::Usage(format!(
            "--speed {}: give a positive factor, e.g. --speed 10",
            self.speed
        )))
    }

    /// As the sidecar reads them: refused here, before it starts, not
    /// after a wait for a socket it never serves.
    fn check_thresholds(&self) -> Result<(), ProfileError> {
        let Some(json) = &self.thresholds else {
            return Ok(());
        };
        serde_json::from_str::<memprof_api::thresholds::Thresholds>(json)
            .map_err(|e| e.to_string())
            .and_then(|t| t.validate().map_err(|e| e.to_string()))
            .map_err(|e| {
                ProfileError::Usage(format!(
                    "--thresholds {json}: {e}; write camelCase fields, e.g. '{{\"highTtoSeconds\":900}}'"
                ))
            })
    }

    /// Only the file the backend reads.
    fn check_source_file(&self) -> Result<(), ProfileError> {
        match self.backend() {
            Backend::Sim => readable("--scenario", &self.scenario, "hack/scenarios/demo.yaml"),
            Backend::Trace => readable(
                "--trace",
                &self.trace,
                "a CSV that `memprof profile --trace-out` wrote",
            ),
            Backend::Nvml => Ok(()),
        }
    }
}

/// The file `flag` names opens and is a file (a directory opens, but is no
/// file); else what to name instead, e.g. `example`.
fn readable(flag: &str, path: &Option<PathBuf>, example: &str) -> Result<(), ProfileError> {
    let Some(p) = path else {
        return Ok(());
    };
    std::fs::File::open(p)
        .and_then(|f| f.metadata())
        .and_then(|m| match m.is_file() {
            true => Ok(()),
            false => Err(std::io::Error::other("a folder, not a file")),
        })
        .map_err(|e| {
            ProfileError::Usage(format!(
                "{flag} {}: cannot read it ({e}); name an existing file, e.g. {example}",
                p.display()
            ))
        })
}

/// A message of the sidecar in the words of these flags: it names its own
/// (`--gpus`), the user typed ours (`--devices`).
pub fn in_users_words(sidecar_message: &str) -> String {
    sidecar_message.replace("--gpus ", "--devices ")
}
