//! `memprof recommend JOB` (also `kubectl memprof recommend`): the GPU
//! memory the operator recommends per rank role (`status.recommendation`),
//! written as each GPU-sharing scheduler asks for it. Rendering is pure
//! ([`dialects`], [`render`]); `run` only fetches the profile.
//!
//! Units, from each project's documentation: HAMi's `nvidia.com/gpumem`
//! and Volcano's `volcano.sh/vgpu-memory` (HAMi-core underneath) are
//! resource limits in MiB; KAI-Scheduler's `gpu-memory` pod annotation is
//! MiB; Run:ai's documentation gives GPU memory in "MB"/"GB" without saying
//! whether 10^6 or 2^20, so its value is counted in 10^6-byte MB, the
//! larger number, which is at least the request whichever it means; the
//! NVIDIA DRA driver's MPS `defaultPinnedDeviceMemoryLimit` is a quantity,
//! written in `Mi`. Every value is rounded up: never a request below the
//! recommendation.

use crate::kube::client::{self as k, CliError, KubeArgs};
use crate::output::{self, Format, OutputArgs, Table};
use memprof_api::{format_bytes, GpuScheduler, MemoryProfile, RoleRecommendation};
use serde::Serialize;
use serde_json::{json, Value};

/// Flags of `memprof recommend`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Job or workload (JobSet, TrainJob, PyTorchJob) name, or NAMESPACE/NAME.
    pub job: String,
    #[command(flatten)]
    pub kube: KubeArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// Runs the subcommand; returns the process exit code: 0 when every role
/// has a request, 3 when some role has none yet (the reason says why).
pub async fn run(args: Args) -> Result<i32, CliError> {
    let (client, ns) = args.kube.connect().await?;
    let (ns, job) = k::split_ref(&args.job, &ns);
    let profile = k::get_profile(&client, ns, job).await?;
    let (text, complete) = render(&profile, args.output.format);
    output::print(&text);
    Ok(if complete { 0 } else { 3 })
}

/// One role's recommendation with every scheduler's way of asking for it.
#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RoleDialects {
    /// The role.
    pub role: String,
    /// The request, bytes (absent until the peak phases were seen).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_bytes: Option<u64>,
    /// Why, or what is missing.
    pub reason: String,
    /// What the value rests on, as the profile says it.
    pub basis: memprof_api::RecommendationBasis,
    /// Each scheduler's fragment (absent without a request).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schedulers: Option<Value>,
}

// The units are the ones a remediation writes (`GpuScheduler::amount`).
fn mib(bytes: u64) -> u64 {
    GpuScheduler::Hami.amount(bytes)
}

fn mb(bytes: u64) -> u64 {
    GpuScheduler::Runai.amount(bytes)
}

/// Each scheduler's fragment for a request of `bytes` per GPU.
pub fn dialects(bytes: u64) -> Value {
    let (mib, mb) = (mib(bytes).to_string(), mb(bytes).to_string());
    json!({
        "hami": {"resources": {"limits": {"nvidia.com/gpumem": mib}}},
        "volcano": {"resources": {"limits": {"volcano.sh/vgpu-memory": mib}}},
        "kaiScheduler": {"annotations": {"gpu-memory": mib}},
        "runai": {"annotations": {"gpu-memory": mb}},
        "nvidiaDraMps": {"sharing": {"strategy": "MPS", "mpsConfig": {
            "defaultPinnedDeviceMemoryLimit": format!("{mib}Mi")}}},
    })
}

/// A role's recommendation in every dialect.
pub fn role_dialects(r: &RoleRecommendation) -> RoleDialects {
    RoleDialects {
        role: r.role.clone(),
        request_bytes: r.request_bytes,
        reason: r.reason.clone(),
        basis: r.basis.clone(),
        schedulers: r.request_bytes.map(dialects),
    }
}

/// The text to print for `profile` and whether every role has a request.
pub fn render(profile: &MemoryProfile, format: Format) -> (String, bool) {
    let recs = profile
        .status
        .as_ref()
        .map(|s| s.recommendation.as_slice())
        .unwrap_or_default();
    let complete = !recs.is_empty() && recs.iter().all(|r| r.request_bytes.is_some());
    let roles: Vec<RoleDialects> = recs.iter().map(role_dialects).collect();
    let kind = kind(profile);
    if format.is_structured() {
        let doc = json!({
            "job": profile.spec.job_name,
            "kind": kind,
            "namespace": profile.metadata.namespace,
            "roles": roles,
        });
        return (output::structured(&doc, format), complete);
    }
    if recs.is_empty() {
        let text = format!(
            "no recommendation for {kind} {} yet: the operator writes one once its reports count\n",
            profile.spec.job_name
        );
        return (text, false);
    }
    (table(recs), complete)
}

/// What the profile is about: a `Job`, or the workload kind the operator
/// labelled it with (`JobSet`, `TrainJob`, `PyTorchJob`: one role per
/// replicated job or replica type).
fn kind(profile: &MemoryProfile) -> &str {
    let labels = profile.metadata.labels.as_ref();
    labels
        .and_then(|l| l.get(memprof_api::workload::LABEL_WORKLOAD_KIND))
        .map_or("Job", String::as_str)
}

fn table(recs: &[RoleRecommendation]) -> String {
    let mut t = Table::new([
        "ROLE",
        "REQUEST",
        "HAMI/VOLCANO/KAI MiB",
        "RUN:AI MB",
        "MPS LIMIT",
        "STEPS",
        "EVAL",
        "CKPT",
    ]);
    let yes = |b: bool| if b { "yes" } else { "no" };
    for r in recs {
        let cells = |b: u64| {
            [
                format_bytes(b),
                mib(b).to_string(),
                mb(b).to_string(),
                format!("{}Mi", mib(b)),
            ]
        };
        let [req, m, d, mps] = r
            .request_bytes
            .map(cells)
            .unwrap_or_else(|| ["-".into(), "-".into(), "-".into(), "-".into()]);
        let b = &r.basis;
        let steps = b.steps.to_string();
        t.row([
            r.role.clone(),
            req,
            m,
            d,
            mps,
            steps,
            yes(b.evaluation_seen).into(),
            yes(b.checkpoint_seen).into(),
        ]);
    }
    let mut out = t.render();
    for r in recs {
        out.push_str(&format!("{}: {}\n", r.role, r.reason));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dialect_rounds_up_in_its_own_unit() {
        let just_over = (1000 << 20) + 1;
        let d = dialects(just_over);
        assert_eq!(
            d["hami"]["resources"]["limits"]["nvidia.com/gpumem"],
            "1001"
        );
        assert_eq!(
            d["volcano"]["resources"]["limits"]["volcano.sh/vgpu-memory"],
            "1001"
        );
        assert_eq!(d["kaiScheduler"]["annotations"]["gpu-memory"], "1001");
        // 1,048,576,001 bytes: 1049 MB of 10^6, never 1048.
        assert_eq!(d["runai"]["annotations"]["gpu-memory"], "1049");
        let mps = &d["nvidiaDraMps"]["sharing"]["mpsConfig"]["defaultPinnedDeviceMemoryLimit"];
        assert_eq!(mps, "1001Mi");
        let exact = dialects(1000 << 20);
        assert_eq!(
            exact["hami"]["resources"]["limits"]["nvidia.com/gpumem"],
            "1000"
        );
    }

    #[test]
    fn a_role_without_a_request_prints_its_reason_and_no_dialects() {
        let profile = MemoryProfile {
            metadata: Default::default(),
            spec: memprof_api::MemoryProfileSpec {
                job_name: "train".into(),
                expected_ranks: None,
            },
            status: Some(memprof_api::MemoryProfileStatus {
                recommendation: vec![RoleRecommendation {
                    role: "worker".into(),
                    reason: "not yet: no checkpoint yet".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
        };
        let (text, complete) = render(&profile, Format::Table);
        assert!(!complete);
        assert!(
            text.contains("worker: not yet: no checkpoint yet"),
            "{text}"
        );
        let (yaml, _) = render(&profile, Format::Yaml);
        assert!(!yaml.contains("schedulers"), "{yaml}");
        assert!(yaml.contains("kind: Job"), "{yaml}");
    }

    /// A workload's profile says its kind, and each of its roles.
    #[test]
    fn a_workload_profile_names_its_kind_and_every_role() {
        let role = |name: &str, bytes: Option<u64>| RoleRecommendation {
            role: name.into(),
            request_bytes: bytes,
            reason: "r".into(),
            ..Default::default()
        };
        let mut profile = MemoryProfile::new(
            "train",
            memprof_api::MemoryProfileSpec {
                job_name: "train".into(),
                expected_ranks: Some(3),
            },
        );
        let kind_label = memprof_api::workload::LABEL_WORKLOAD_KIND.to_string();
        profile.metadata.labels = Some([(kind_label, "PyTorchJob".to_string())].into());
        profile.status = Some(memprof_api::MemoryProfileStatus {
            recommendation: vec![
                role("Master", Some(8 << 30)),
                role("Worker", Some(20 << 30)),
            ],
            ..Default::default()
        });
        let (yaml, complete) = render(&profile, Format::Yaml);
        assert!(complete);
        let doc: Value = serde_yaml::from_str(&yaml).unwrap();
        assert_eq!(doc["kind"], "PyTorchJob", "{yaml}");
        assert_eq!(doc["roles"][1]["role"], "Worker", "{yaml}");
        let (text, _) = render(&profile, Format::Table);
        assert!(text.contains("Master") && text.contains("Worker"), "{text}");
        profile.status = None;
        let (text, _) = render(&profile, Format::Table);
        assert!(
            text.starts_with("no recommendation for PyTorchJob train"),
            "{text}"
        );
    }
}
