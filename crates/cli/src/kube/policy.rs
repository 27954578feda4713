//! `memprof policy explain JOB` (also `kubectl memprof policy explain`):
//! which RemediationPolicies match a Job, how each trigger evaluates against
//! its MemoryProfile right now, and what the actions would do now
//! (`scaleBatch BATCH_SIZE 32 -> 24`). Rendering is pure ([`render_explain`]);
//! [`run`] only fetches.

use anyhow::Context as _;
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::ResourceExt;
use memprof_api::{
    format_duration, MemoryProfile, MemoryProfileStatus, RemediationPolicy, LABEL_REMEDIABLE,
};
use memprof_policy::plan::{self, PlanInput};
use memprof_policy::triggers::{self, Blocked, RiskClock};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

/// `memprof policy` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Which policies match a Job, each trigger's evaluation now, and what the actions would do.
    Explain {
        /// Job name, or NAMESPACE/JOB.
        job: String,
        #[command(flatten)]
        kube: crate::kube::client::KubeArgs,
    },
}

/// What `explain` renders.
#[derive(Clone, Debug)]
pub struct ExplainInput<'a> {
    /// Namespace of the Job.
    pub namespace: &'a str,
    /// Job name.
    pub job_name: &'a str,
    /// The Job as JSON, if it exists.
    pub job: Option<&'a Value>,
    /// Its profile's status, if any.
    pub profile: Option<&'a MemoryProfileStatus>,
    /// The namespace's policies.
    pub policies: &'a [RemediationPolicy],
    /// Data of the opted-in ConfigMaps the policies name (missing ones absent).
    pub config_maps: &'a BTreeMap<String, BTreeMap<String, String>>,
    /// ConfigMaps the policies name that exist but are not opted in.
    pub not_opted_in: &'a BTreeSet<String>,
    /// Now.
    pub now: Timestamp,
}

fn labels_of(job: &Value) -> BTreeMap<String, String> {
    job["metadata"]["labels"]
        .as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

/// Renders the explanation for a terminal.
pub fn render_explain(input: &ExplainInput<'_>) -> String {
    let mut out = String::new();
    let (ns, name) = (input.namespace, input.job_name);
    let Some(job) = input.job else {
        let _ = writeln!(out, "Job {ns}/{name} not found");
        return out;
    };
    let _ = writeln!(out, "Job {ns}/{name}");
    profile_line(&mut out, input.profile);
    let empty = MemoryProfileStatus::default();
    let status = input.profile.unwrap_or(&empty);
    if input.policies.is_empty() {
        let _ = writeln!(out, "  no RemediationPolicy in namespace {ns}");
        return out;
    }
    let labels = labels_of(job);
    let mut policies: Vec<&RemediationPolicy> = input.policies.iter().collect();
    policies.sort_by_key(|p| p.metadata.name.clone());
    for p in policies {
        let pname = p.metadata.name.as_deref().unwrap_or_default();
        let dry = if p.spec.dry_run { " (dry run)" } else { "" };
        let _ = writeln!(out, "\nRemediationPolicy {pname}{dry}");
        if !selector_line(&mut out, p, &labels) {
            continue;
        }
        let clock = preview_clock(p, status, input.now);
        let uid = job["metadata"]["uid"].as_str();
        let v = triggers::verdict(p, &labels, uid, status, &clock, input.now);
        trigger_lines(&mut out, p, &v);
        action_lines(&mut out, input, (p, job, status), &v);
        explain_batch_fit(&mut out, p, status);
    }
    out
}

/// The profile in one line, or why there is none.
fn profile_line(out: &mut String, profile: Option<&MemoryProfileStatus>) {
    match profile {
        Some(st) => {
            let _ = writeln!(
                out,
                "  profile: risk {}, time to OOM {}, imbalance {}, {} OOM(s) recorded, last action: {}",
                st.risk,
                st.time_to_oom.as_deref().unwrap_or("-"),
                st.imbalance_display.as_deref().unwrap_or("-"),
                st.ooms.len(),
                st.last_action.as_deref().unwrap_or("-")
            );
        }
        None => {
            let _ = writeln!(out, "  no MemoryProfile (is the Job annotated memprof.dev/enabled=true and the operator running?): policies never act on it");
        }
    }
}

/// Whether the policy's selector matches the Job's labels, said; false
/// when it does not (or cannot be read): the policy is not explained further.
fn selector_line(
    out: &mut String,
    p: &RemediationPolicy,
    labels: &BTreeMap<String, String>,
) -> bool {
    let selector = triggers::selector_display(p);
    match triggers::selector_matches(p, labels) {
        Ok(true) => {
            let _ = writeln!(out, "  selector {selector}: matches");
            true
        }
        Ok(false) => {
            let _ = writeln!(
                out,
                "  selector {selector}: does not match the Job's labels"
            );
            false
        }
        Err(e) => {
            let _ = writeln!(out, "  selector: {e}");
            false
        }
    }
}

/// How long a risk has held is measured by the controller; here each
/// level is assumed to have held long enough (the longest `forSeconds` of
/// the policy's triggers), and the trigger lines say so.
fn preview_clock(p: &RemediationPolicy, status: &MemoryProfileStatus, now: Timestamp) -> RiskClock {
    let mut clock = RiskClock::default();
    let longest = p
        .spec
        .triggers
        .iter()
        .filter_map(|t| t.risk_at_least.as_ref());
    let hold = longest.map(|r| r.for_seconds).max().unwrap_or(0);
    clock.observe(
        status.risk,
        now - jiff::SignedDuration::from_secs(i64::from(hold)),
    );
    clock
}

/// Each trigger's evaluation, the remediations counted against the
/// policy's bounds, and what blocks it.
fn trigger_lines(out: &mut String, p: &RemediationPolicy, v: &triggers::Verdict) {
    let _ = writeln!(out, "  triggers (any one fires):");
    for (t, e) in p.spec.triggers.iter().zip(&v.evaluations) {
        let held = t
            .risk_at_least
            .as_ref()
            .filter(|r| r.for_seconds > 0 && e.fired)
            .map(|r| {
                format!(
                    " (if held {}s: the controller measures that)",
                    r.for_seconds
                )
            })
            .unwrap_or_default();
        let _ = writeln!(out, "    {:<22} {:<5} {}{held}", e.name, e.fired, e.why);
    }
    let _ = writeln!(
        out,
        "  remediations of this Job: {} of {}; cooldown {}s",
        v.history.count, p.spec.max_remediations, p.spec.cooldown_seconds
    );
    match &v.blocked {
        Some(Blocked::Cooldown { remaining }) => {
            let _ = writeln!(
                out,
                "  blocked: cooldown, {} remaining",
                format_duration(*remaining)
            );
        }
        Some(Blocked::MaxReached { count }) => {
            let _ = writeln!(out, "  blocked: maxRemediations reached ({count})");
        }
        None => {}
    }
}

/// What the actions would do to the Job now (the plan the controller
/// would build), or why they cannot.
fn action_lines(
    out: &mut String,
    input: &ExplainInput<'_>,
    (p, job, status): (&RemediationPolicy, &Value, &MemoryProfileStatus),
    v: &triggers::Verdict,
) {
    let why = v
        .fired()
        .map_or_else(|| "preview".to_string(), |e| e.why.clone());
    let planned = plan::build(&PlanInput {
        policy: p,
        job,
        config_maps: input.config_maps,
        not_opted_in: input.not_opted_in,
        id: "preview",
        why: &why,
        batch_fit: status.batch_recommendation.as_ref(),
        // Never shown: the summary names no annotation.
        nonce: "preview",
    });
    let verb = match (v.acts(), p.spec.dry_run) {
        (true, false) => "acts now",
        (true, true) => "would record a dry run now",
        (false, _) => "would do, if it fired",
    };
    match planned {
        Ok(plan) => {
            let _ = writeln!(out, "  {verb}: {}", plan.summary());
            // Ranks are not changed by a recreation: kept symbolic, not guessed from pods.
            let changes = plan.recreate().map_or(&[][..], |(c, _)| c);
            for l in plan::accum::explain_lines(changes, None) {
                let _ = writeln!(out, "  {l}");
            }
            if let Some(line) = plan.recreate().and(checkpoint_line(p, status)) {
                let _ = writeln!(out, "  {line}");
            }
        }
        Err(e) => {
            let _ = writeln!(out, "  cannot apply to this Job ({}): {e}", e.reason());
        }
    }
}

/// What a restart would wait for (`waitForCheckpoint`), with the bound the
/// profile's time to OOM gives it now.
fn checkpoint_line(p: &RemediationPolicy, status: &MemoryProfileStatus) -> Option<String> {
    let w = p.spec.wait_for_checkpoint.as_ref()?;
    let now = match status.time_to_oom_seconds {
        Some(tto) => format!(
            "; now {:.0} s (time to OOM {tto:.0} s - margin {} s)",
            (tto - f64::from(w.margin_seconds)).clamp(0.0, f64::from(w.max_seconds)),
            w.margin_seconds
        ),
        None => String::new(),
    };
    Some(format!(
        "before the restart: waits for every rank's next checkpoint, at most {} s and never past the predicted OOM minus {} s{now}; no wait if the trainer never announced a checkpoint or an OOM was seen",
        w.max_seconds, w.margin_seconds
    ))
}

/// The arithmetic behind each `scaleBatch` `mode: fit` of the policy.
fn explain_batch_fit(out: &mut String, p: &RemediationPolicy, status: &MemoryProfileStatus) {
    let fits = p
        .spec
        .actions
        .iter()
        .filter_map(|a| a.scale_batch.as_ref())
        .filter(|s| s.mode == Some(memprof_api::ScaleMode::Fit));
    for s in fits {
        let lines = match &status.batch_recommendation {
            Some(rec) => memprof_analysis::batchfit::explain_lines(rec, s.headroom_fraction()),
            None => vec![
                "batch fit: no batchRecommendation in the profile yet (no report rolled up): the factor applies".into(),
            ],
        };
        for l in lines {
            let _ = writeln!(out, "  {l}");
        }
    }
}

/// The Job, or the error kubectl gives a missing object (exit 1): a
/// script must not read "not found" as a Job with nothing to explain.
pub fn job_found(
    namespace: &str,
    name: &str,
    job: Option<Value>,
) -> Result<Value, crate::kube::client::CliError> {
    job.ok_or_else(|| crate::kube::client::CliError::JobNotFound {
        namespace: namespace.into(),
        name: name.into(),
    })
}

/// Fetches what `explain` needs and prints it.
pub async fn run(command: Command) -> anyhow::Result<()> {
    let Command::Explain { job, kube } = command;
    let (client, ns) = kube.connect().await?;
    let scope = crate::kube::client::Scope::Namespace(ns.clone());
    let (namespace, job) = crate::kube::client::split_ref(&job, &ns);
    let (namespace, job) = (namespace.to_string(), job.to_string());
    let jobs: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &namespace, &ApiResource::erase::<Job>(&()));
    let job_json = jobs
        .get_opt(&job)
        .await
        .with_context(|| format!("cannot read Job {namespace}/{job}"))?
        .map(|j| serde_json::to_value(j).unwrap_or_default());
    let job_json = job_found(&namespace, &job, job_json)?;
    let profiles: Api<MemoryProfile> = Api::namespaced(client.clone(), &namespace);
    let map_err = |e, verb, resource| crate::kube::client::map_error(e, verb, resource, &scope);
    let profile = profiles
        .get_opt(&job)
        .await
        .map_err(|e| map_err(e, "get", "memoryprofiles"))?;
    let policies: Api<RemediationPolicy> = Api::namespaced(client.clone(), &namespace);
    let policies = policies
        .list(&Default::default())
        .await
        .map_err(|e| map_err(e, "list", "remediationpolicies"))?
        .items;
    let cms: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let (config_maps, not_opted_in) = named_config_maps(&cms, &policies).await?;
    print!(
        "{}",
        render_explain(&ExplainInput {
            namespace: &namespace,
            job_name: &job,
            job: Some(&job_json),
            profile: profile.as_ref().and_then(|p| p.status.as_ref()),
            policies: &policies,
            config_maps: &config_maps,
            not_opted_in: &not_opted_in,
            now: Timestamp::now(),
        })
    );
    Ok(())
}

/// The ConfigMaps the policies' `setConfigMapKey` actions name: the data
/// of those opted in (`memprof.dev/remediable=true`), and the names of
/// those that exist but are not (missing ones are in neither).
async fn named_config_maps(
    cms: &Api<ConfigMap>,
    policies: &[RemediationPolicy],
) -> anyhow::Result<(BTreeMap<String, BTreeMap<String, String>>, BTreeSet<String>)> {
    let mut config_maps = BTreeMap::new();
    let mut not_opted_in = BTreeSet::new();
    let named = policies
        .iter()
        .flat_map(|p| &p.spec.actions)
        .filter_map(|a| a.set_config_map_key.as_ref());
    for a in named {
        match cms.get_opt(&a.config_map).await? {
            Some(cm) if cm.labels().get(LABEL_REMEDIABLE).map(String::as_str) == Some("true") => {
                config_maps.insert(a.config_map.clone(), cm.data.unwrap_or_default());
            }
            Some(_) => {
                not_opted_in.insert(a.config_map.clone());
            }
            None => {}
        }
    }
    Ok((config_maps, not_opted_in))
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_api::{RemediationRecord, RiskLevel};
    use serde_json::json;

    #[test]
    fn a_missing_job_is_an_error_that_says_where_to_look() {
        let e = job_found("ml", "nope", None).unwrap_err().to_string();
        assert_eq!(
            e,
            "no Job ml/nope: `kubectl get jobs -n ml` lists them (or pass NAMESPACE/JOB, -n)"
        );
        assert_eq!(
            job_found("ml", "j", Some(json!({"a": 1}))).unwrap(),
            json!({"a": 1})
        );
    }

    fn policy(name: &str, team: &str, for_seconds: u32) -> RemediationPolicy {
        RemediationPolicy::test(name, team, for_seconds, 8)
    }

    fn job() -> Value {
        json!({
            "metadata": {"name": "train", "namespace": "ml", "uid": "u1", "labels": {"team": "ml"}},
            "spec": {"template": {"spec": {"containers": [
                {"name": "trainer", "env": [{"name": "BATCH_SIZE", "value": "32"}]}
            ]}}}
        })
    }

    fn render(status: &MemoryProfileStatus, policies: &[RemediationPolicy]) -> String {
        let j = job();
        render_explain(&ExplainInput {
            namespace: "ml",
            job_name: "train",
            job: Some(&j),
            profile: Some(status),
            policies,
            config_maps: &BTreeMap::new(),
            not_opted_in: &BTreeSet::new(),
            now: Timestamp::from_second(1_800_000_000).unwrap(),
        })
    }

    #[test]
    fn explains_matching_triggers_and_the_concrete_action() {
        let status = MemoryProfileStatus {
            // A counted rank: the triggers act on nothing else.
            ranks_reporting: 1,
            risk: RiskLevel::Critical,
            last_report_time: Some("2027-01-15T08:00:00Z".into()),
            ..Default::default()
        };
        let out = render(
            &status,
            &[policy("shrink", "ml", 60), policy("other", "web", 0)],
        );
        assert!(
            out.contains("RemediationPolicy shrink\n  selector team=ml: matches"),
            "{out}"
        );
        assert!(out.contains("risk>=critical/60s"), "{out}");
        assert!(
            out.contains("true  risk critical >= critical for 60s (if held 60s"),
            "{out}"
        );
        assert!(
            out.contains("oom                    false no GPU OOM observed"),
            "{out}"
        );
        assert!(
            out.contains("acts now: scaleBatch BATCH_SIZE 32->24"),
            "{out}"
        );
        assert!(
            out.contains("RemediationPolicy other\n  selector team=web: does not match"),
            "{out}"
        );
    }

    #[test]
    fn explains_the_batch_fit_arithmetic() {
        use memprof_analysis::batchfit::{observe, recommend, Evidence};
        let g = |x: f64| (x * (1u64 << 30) as f64) as u64;
        // 66.5 GiB + 0.2 GiB/sample seen at 64, 48 and 36 (the Job now at 32).
        let seen = observe(&[], Some(64), g(79.3), g(80.0));
        let seen = observe(&seen, Some(48), g(76.1), g(80.0));
        let seen = observe(&seen, Some(36), g(73.7), g(80.0));
        let rec = recommend(&Evidence {
            env_var: "BATCH_SIZE",
            current: Some(32),
            limit_bytes: Some(g(80.0)),
            headroom_fraction: 0.1,
            breakdown: None,
            observations: &seen,
        });
        let status = MemoryProfileStatus {
            // A counted rank: the triggers act on nothing else.
            ranks_reporting: 1,
            risk: RiskLevel::Critical,
            batch_recommendation: Some(rec),
            ..Default::default()
        };
        let mut p = policy("shrink", "ml", 0);
        let sb = p.spec.actions[0].scale_batch.as_mut().unwrap();
        sb.mode = Some(memprof_api::ScaleMode::Fit);
        sb.minimum = 4;
        let out = render(&status, &[p]);
        assert!(
            out.contains("acts now: scaleBatch BATCH_SIZE 32->25 (fit twoBatchSizes: "),
            "{out}"
        );
        for line in [
            "  batch fit (twoBatchSizes, linear): peak = 66.5GiB + 205MiB × B\n",
            "    3 point(s) at batches 36..64; held-out error ",
            "    backed for batches 24..80 (between measured batches, or one held-out step beyond)\n",
            "    limit 80.0GiB, headroom 10% → target 72.0GiB\n",
            "    → BATCH_SIZE = 25 (predicted 71.5GiB + margin ",
            "extrapolated 11 below the smallest measured value 36 (-31%)); next up 26 predicted 71.7GiB",
        ] {
            assert!(out.contains(line), "{line:?} in {out}");
        }
        // Too little evidence: said, and the factor is what would happen.
        let thin = MemoryProfileStatus {
            // A counted rank: the triggers act on nothing else.
            ranks_reporting: 1,
            risk: RiskLevel::Critical,
            ..Default::default()
        };
        let mut p = policy("shrink", "ml", 0);
        p.spec.actions[0].scale_batch.as_mut().unwrap().mode = Some(memprof_api::ScaleMode::Fit);
        let out = render(&thin, &[p]);
        assert!(
            out.contains(
                "scaleBatch BATCH_SIZE 32->24 (fit: no usable recommendation, factor 0.75)"
            ),
            "{out}"
        );
        assert!(
            out.contains("batch fit: no batchRecommendation in the profile yet"),
            "{out}"
        );
    }

    #[test]
    fn explains_the_accumulation_arithmetic() {
        let status = MemoryProfileStatus {
            // A counted rank: the triggers act on nothing else.
            ranks_reporting: 1,
            risk: RiskLevel::Critical,
            ..Default::default()
        };
        let mut p = policy("shrink", "ml", 0);
        p.spec.actions[0].scale_batch.as_mut().unwrap().accumulation =
            Some(memprof_api::AccumulationEnv {
                env: "GRAD_ACCUM_STEPS".into(),
            });
        let out = render(&status, &[p]);
        assert!(
            out.contains("acts now: scaleBatch BATCH_SIZE×GRAD_ACCUM_STEPS 32×1 → 16×2\n  keep global batch (trainer BATCH_SIZE×GRAD_ACCUM_STEPS×ranks): 32×1×ranks → 16×2×ranks (exact)"),
            "{out}"
        );
    }

    #[test]
    fn explains_the_checkpoint_wait_and_its_bound_now() {
        let status = MemoryProfileStatus {
            // A counted rank: the triggers act on nothing else.
            ranks_reporting: 1,
            risk: RiskLevel::Critical,
            time_to_oom_seconds: Some(150.0),
            ..Default::default()
        };
        let mut p = policy("shrink", "ml", 0);
        p.spec.wait_for_checkpoint = Some(memprof_api::CheckpointWait {
            max_seconds: 600,
            margin_seconds: 30,
        });
        let out = render(&status, &[p.clone()]);
        assert!(
            out.contains("  before the restart: waits for every rank's next checkpoint, at most 600 s and never past the predicted OOM minus 30 s; now 120 s (time to OOM 150 s - margin 30 s);"),
            "{out}"
        );
        // Without the field, nothing is said of a wait.
        p.spec.wait_for_checkpoint = None;
        assert!(!render(&status, &[p]).contains("before the restart"));
    }

    #[test]
    fn explains_cooldown_and_what_cannot_apply() {
        let status = MemoryProfileStatus {
            // A counted rank: the triggers act on nothing else.
            ranks_reporting: 1,
            risk: RiskLevel::Low,
            remediations: vec![RemediationRecord {
                id: "x".into(),
                policy: "shrink".into(),
                action: "scaleBatch BATCH_SIZE 32->24".into(),
                phase: "Done".into(),
                time: "2027-01-15T07:55:00Z".into(),
                message: None,
                ..Default::default()
            }],
            remediation_totals: vec![memprof_api::RemediationTotal {
                policy: "shrink".into(),
                count: 1,
                last: "2027-01-15T07:55:00Z".into(),
            }],
            ..Default::default()
        };
        let mut p = policy("shrink", "ml", 0);
        p.spec.actions[0].scale_batch.as_mut().unwrap().minimum = 32;
        let out = render(&status, &[p]);
        assert!(
            out.contains("remediations of this Job: 1 of 3; cooldown 600s"),
            "{out}"
        );
        assert!(out.contains("risk low is below critical"), "{out}");
        assert!(
            out.contains("cannot apply to this Job (AtMinimum): env BATCH_SIZE is 32"),
            "{out}"
        );
    }
}
