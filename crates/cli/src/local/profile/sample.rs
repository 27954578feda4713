//! The sampling flags `memprof profile` and `memprof oom` share, and the
//! `memprof-sidecar --standalone` flags they become.

use super::{Backend, ProfileError};
use std::path::{Path, PathBuf};

/// Where samples come from and how they are taken: the flags `memprof
/// profile` and `memprof oom` share (both run a standalone sidecar with them).
#[derive(Clone, Debug, Default, clap::Args)]
pub struct SampleArgs {
    /// GPUs to watch, comma-separated NVML indices or UUIDs (default: all this
    /// machine's GPUs); `local-rank` is this rank's GPU under torchrun
    /// (`LOCAL_RANK`, through `CUDA_VISIBLE_DEVICES` when set).
    #[arg(long, value_delimiter = ',', value_name = "GPU,...")]
    pub devices: Vec<String>,
    /// Stop after this many seconds (0: until interrupted; `profile` also stops
    /// when its command exits).
    #[arg(long, default_value_t = 0.0, value_name = "SECONDS")]
    pub duration: f64,
    /// Sampling interval, 10ms to 60s (e.g. `100ms`, `1s`).
    #[arg(long, default_value = "1s")]
    pub interval: String,
    /// Where samples come from.
    #[arg(long, value_enum, default_value_t = Backend::Nvml)]
    pub backend: Backend,
    /// Scenario file for `--backend sim` (see the README).
    #[arg(long, value_name = "FILE")]
    pub scenario: Option<PathBuf>,
    /// CSV trace for `--backend trace`.
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
            self.backend.flag().into(),
            "--interval".into(),
            self.interval.clone(),
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
            (self.duration > 0.0).then(|| self.duration.to_string()),
        );
        add(
            "--gpus",
            (!self.devices.is_empty()).then(|| self.devices.join(",")),
        );
        f.extend(self.identity.iter().cloned());
        f
    }

    /// Refuses flags the sidecar would refuse later, with what to write instead.
    pub fn check(&self) -> Result<(), ProfileError> {
        let usage = |m: String| Err(ProfileError::Usage(m));
        if let Err(e) = memprof_api::interval::parse_interval(&self.interval) {
            return usage(format!("--interval: {e}"));
        }
        if !(self.duration >= 0.0 && self.duration.is_finite()) {
            return usage("--duration must be 0 or more seconds".into());
        }
        match self.backend {
            Backend::Sim if self.scenario.is_none() => {
                usage("--backend sim needs --scenario FILE (e.g. hack/scenarios/demo.yaml)".into())
            }
            Backend::Trace if self.trace.is_none() => {
                usage("--backend trace needs --trace FILE".into())
            }
            _ => Ok(()),
        }
    }
}
