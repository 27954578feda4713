//! The policies' status: what each policy matches and did, derived from the
//! Jobs and from the records in the profiles (the records are the truth; a
//! policy's status is a view of them, so it needs no memory of its own and
//! is right again after a restart). Written only when it changes.

use super::executor::Executor;
use crate::key::JobKey;
use crate::operator::reconcile::profiling_enabled;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::Store;
use kube::{Resource, ResourceExt};
use memprof_api::{
    set_condition, truncate_utf8, Condition, MemoryProfileStatus, PolicyAction, RemediationPolicy,
    RemediationPolicyStatus, MAX_POLICY_STATUS_ITEMS, REMEDIATION_MANAGER,
};
use memprof_policy::triggers::{
    selector_display, selector_matches, trigger_name, SelectorError, PHASE_DONE, PHASE_FAILED,
    PHASE_PENDING, PHASE_SKIPPED,
};
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tracing::warn;

/// Condition type: the policy is valid and evaluated.
pub const CONDITION_READY: &str = "Ready";
/// Condition type: the actions could apply to every matched Job.
pub const CONDITION_APPLICABLE: &str = "ActionsApplicable";
/// Condition type: an action needs something this API server lacks.
pub const CONDITION_UNSUPPORTED: &str = "Unsupported";
/// How often the status is recomputed without a nudge.
const PERIOD: Duration = Duration::from_secs(10);

/// The actions for humans, before any value is known: `scaleBatch BATCH_SIZE ×0.75`.
pub fn describe_actions(policy: &RemediationPolicy) -> String {
    let parts: Vec<String> = policy
        .spec
        .actions
        .iter()
        .map(|a| {
            if let Some(x) = &a.annotate {
                format!("annotate {}={}", x.key, x.value)
            } else if let Some(e) = &a.event {
                format!(
                    "event {}",
                    e.reason
                        .as_deref()
                        .unwrap_or(memprof_policy::plan::DEFAULT_EVENT_REASON)
                )
            } else if let Some(s) = &a.scale_batch {
                format!("scaleBatch {} x{}", s.env, s.factor)
            } else if let Some(c) = &a.set_config_map_key {
                format!("setConfigMapKey {}/{}", c.config_map, c.key)
            } else if a.suspend == Some(true) {
                "suspend".into()
            } else if let Some(n) = &a.notify_trainer {
                format!("notifyTrainer {}", n.level.risk().as_str())
            } else {
                "none".into()
            }
        })
        .collect();
    let mut s = parts.join("; ");
    truncate_utf8(&mut s, 256);
    s
}

/// The triggers for humans: `risk>=critical/60s,oom`.
pub fn triggers_display(policy: &RemediationPolicy) -> String {
    let mut s = policy
        .spec
        .triggers
        .iter()
        .map(trigger_name)
        .collect::<Vec<_>>()
        .join(",");
    truncate_utf8(&mut s, 256);
    s
}

/// A profiled Job as the policy status sees it.
#[derive(Clone, Copy, Debug)]
pub struct JobView<'a> {
    /// Job name.
    pub name: &'a str,
    /// Its labels.
    pub labels: &'a BTreeMap<String, String>,
    /// Its profile's status, if any.
    pub profile: Option<&'a MemoryProfileStatus>,
}

/// The status a policy should have, given the profiled Jobs of its
/// namespace and the previous status (for condition transition times).
pub fn policy_status(
    policy: &RemediationPolicy,
    jobs: &[JobView<'_>],
    previous: Option<&RemediationPolicyStatus>,
    now: &str,
) -> RemediationPolicyStatus {
    let mut st = RemediationPolicyStatus {
        observed_generation: policy.meta().generation,
        selector: Some(selector_display(policy)),
        triggers: Some(triggers_display(policy)),
        conditions: previous.map(|p| p.conditions.clone()).unwrap_or_default(),
        ..Default::default()
    };
    let selector_error = matched(policy, jobs, &mut st);
    let seen = actions(&policy.name_any(), jobs, &mut st);
    let ready = match selector_error {
        Some(e) => Condition::new(
            CONDITION_READY,
            false,
            "InvalidSelector",
            format!("{e}: fix spec.selector"),
        ),
        None => Condition::new(
            CONDITION_READY,
            true,
            "Evaluated",
            format!("evaluated against {} profiled Job(s)", st.matched_count),
        ),
    };
    set_condition(&mut st.conditions, ready, now);
    set_condition(&mut st.conditions, applicable(&seen.cannot_apply), now);
    let unsupported = match seen.unsupported {
        Some(m) => Condition::new(CONDITION_UNSUPPORTED, true, "ActionUnsupported", m),
        None => Condition::new(
            CONDITION_UNSUPPORTED,
            false,
            "AllSupported",
            "every action used so far is supported by this API server",
        ),
    };
    set_condition(&mut st.conditions, unsupported, now);
    st
}

/// Fills the matched Jobs in; returns the selector's error, if any.
fn matched(
    policy: &RemediationPolicy,
    jobs: &[JobView<'_>],
    st: &mut RemediationPolicyStatus,
) -> Option<SelectorError> {
    let mut selector_error = None;
    let mut matched: Vec<&JobView<'_>> = Vec::new();
    for j in jobs {
        match selector_matches(policy, j.labels) {
            Ok(true) => matched.push(j),
            Ok(false) => {}
            Err(e) => selector_error = Some(e),
        }
    }
    matched.sort_by_key(|j| j.name);
    st.matched_count = matched.len() as u32;
    st.matched_jobs = matched
        .iter()
        .take(MAX_POLICY_STATUS_ITEMS)
        .map(|j| j.name.to_string())
        .collect();
    selector_error
}

/// What the newest records of each Job say about the policy.
#[derive(Default)]
struct Seen {
    /// `job: message` of each Job whose newest record was skipped.
    cannot_apply: Vec<String>,
    /// A Job whose newest record failed for want of an API feature.
    unsupported: Option<String>,
}

/// Fills the policy's actions in (the newest, bounded) from the Jobs' records.
fn actions(name: &str, jobs: &[JobView<'_>], st: &mut RemediationPolicyStatus) -> Seen {
    let mut actions = Vec::new();
    let mut seen = Seen::default();
    for j in jobs {
        let Some(p) = j.profile else { continue };
        let ours: Vec<_> = p.remediations.iter().filter(|r| r.policy == name).collect();
        for r in &ours {
            if r.phase == PHASE_PENDING || r.phase == PHASE_DONE {
                st.action_count += 1;
            }
            actions.push(PolicyAction {
                job: j.name.to_string(),
                id: r.id.clone(),
                action: r.action.clone(),
                phase: r.phase.clone(),
                time: r.time.clone(),
                message: r.message.clone(),
            });
        }
        // Only the newest record of a Job says whether the policy applies to it now.
        if let Some(last) = ours.last() {
            let message = last.message.clone().unwrap_or_default();
            if last.phase == PHASE_SKIPPED {
                seen.cannot_apply.push(format!("{}: {message}", j.name));
            }
            if last.phase == PHASE_FAILED && message.starts_with("Unsupported:") {
                seen.unsupported = Some(format!("{}: {message}", j.name));
            }
        }
    }
    actions.sort_by(|a, b| a.time.cmp(&b.time).then(a.job.cmp(&b.job)));
    let excess = actions.len().saturating_sub(MAX_POLICY_STATUS_ITEMS);
    st.actions = actions.split_off(excess);
    seen
}

/// `ActionsApplicable`: false, with the reason of the first, while some Job was skipped.
fn applicable(cannot_apply: &[String]) -> Condition {
    if cannot_apply.is_empty() {
        return Condition::new(
            CONDITION_APPLICABLE,
            true,
            "Applicable",
            "no matched Job was skipped",
        );
    }
    let reason = cannot_apply[0]
        .split(": ")
        .nth(1)
        .filter(|r| r.chars().all(|c| c.is_ascii_alphanumeric()))
        .unwrap_or("CannotApply")
        .to_string();
    let msg = format!(
        "{} Job(s) skipped; fix the Job or the policy: {}",
        cannot_apply.len(),
        cannot_apply.join("; ")
    );
    Condition::new(CONDITION_APPLICABLE, false, &reason, msg)
}

/// Recomputes every policy's status after records change and every 10 s,
/// writing those that differ (server-side apply, field manager
/// `memprof-remediation`), once `ready` (the caches are full) and until `stop`.
pub async fn policy_status_task(
    exec: Arc<Executor>,
    jobs: Store<Job>,
    ready: impl Future<Output = bool>,
    stop: impl Future<Output = ()> + Clone,
) {
    tokio::select! {
        _ = stop.clone() => return,
        ok = ready => if !ok { return },
    }
    loop {
        write_all(&exec, &jobs).await;
        tokio::select! {
            _ = stop.clone() => return,
            _ = exec.policy_status.notified() => {
                // Let a burst of records settle into one write.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            _ = tokio::time::sleep(PERIOD) => {}
        }
    }
}

async fn write_all(exec: &Executor, jobs: &Store<Job>) {
    let now = jiff::Timestamp::now();
    let now = now.round(jiff::Unit::Second).unwrap_or(now).to_string();
    let jobs = jobs.state();
    for policy in exec.policies.state() {
        let ns = policy.namespace().unwrap_or_default();
        let profiled: Vec<_> = jobs
            .iter()
            .filter(|j| j.namespace().as_deref() == Some(ns.as_str()) && profiling_enabled(j))
            .map(|j| {
                let key = JobKey::new(ns.clone(), j.name_any());
                (j, exec.writer.view(&key))
            })
            .collect();
        let views: Vec<JobView<'_>> = profiled
            .iter()
            .map(|(j, status)| JobView {
                name: j.metadata.name.as_deref().unwrap_or_default(),
                labels: j.labels(),
                profile: status.as_ref(),
            })
            .collect();
        let desired = policy_status(&policy, &views, policy.status.as_ref(), &now);
        if policy.status.as_ref() == Some(&desired) {
            continue;
        }
        write(exec, &policy, &ns, &desired).await;
    }
}

async fn write(
    exec: &Executor,
    policy: &RemediationPolicy,
    ns: &str,
    desired: &RemediationPolicyStatus,
) {
    let api: Api<RemediationPolicy> = Api::namespaced(exec.client.clone(), ns);
    let body = serde_json::json!({
        "apiVersion": RemediationPolicy::api_version(&()),
        "kind": RemediationPolicy::kind(&()),
        "metadata": { "name": policy.name_any() },
        "status": desired,
    });
    let params = PatchParams::apply(REMEDIATION_MANAGER).force();
    if let Err(error) = api
        .patch_status(&policy.name_any(), &params, &Patch::Apply(&body))
        .await
    {
        let advice = crate::status::advice(&error, "remediationpolicies/status: patch");
        warn!(policy = %policy.name_any(), %error, "cannot write RemediationPolicy status: {advice}; written again on the next pass");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_api::RemediationRecord;

    fn policy() -> RemediationPolicy {
        let mut p = RemediationPolicy::test("shrink", "ml", 60, 1);
        p.metadata.generation = Some(2);
        p
    }

    fn rec(phase: &str, time: &str, message: &str) -> RemediationRecord {
        RemediationRecord {
            id: format!("id-{time}"),
            policy: "shrink".into(),
            action: "scaleBatch BATCH_SIZE 32->24".into(),
            phase: phase.into(),
            time: time.into(),
            message: Some(message.into()),
            ..Default::default()
        }
    }

    #[test]
    fn status_lists_matches_actions_and_what_cannot_apply() {
        let ml = BTreeMap::from([("team".to_string(), "ml".to_string())]);
        let web = BTreeMap::from([("team".to_string(), "web".to_string())]);
        let a = MemoryProfileStatus {
            remediations: vec![rec(PHASE_DONE, "2026-01-01T00:00:02Z", "ok")],
            ..Default::default()
        };
        let b = MemoryProfileStatus {
            remediations: vec![rec(
                PHASE_SKIPPED,
                "2026-01-01T00:00:01Z",
                "NoSuchEnv: no container of the Job sets env BATCH_SIZE: nothing to scale",
            )],
            ..Default::default()
        };
        let jobs = [
            JobView {
                name: "a",
                labels: &ml,
                profile: Some(&a),
            },
            JobView {
                name: "b",
                labels: &ml,
                profile: Some(&b),
            },
            JobView {
                name: "c",
                labels: &web,
                profile: None,
            },
        ];
        let p = policy();
        let st = policy_status(&p, &jobs, None, "t1");
        assert_eq!(st.selector.as_deref(), Some("team=ml"));
        assert_eq!(st.triggers.as_deref(), Some("risk>=critical/60s,oom"));
        assert_eq!(
            (st.matched_count, st.matched_jobs.clone()),
            (2, vec!["a".into(), "b".into()])
        );
        assert_eq!(st.action_count, 1);
        assert_eq!(st.actions.len(), 2);
        assert_eq!(st.actions[0].job, "b");
        assert_eq!(st.observed_generation, Some(2));
        let applicable = st
            .conditions
            .iter()
            .find(|c| c.type_ == CONDITION_APPLICABLE)
            .unwrap();
        assert!(!applicable.is_true());
        assert_eq!(applicable.reason, "NoSuchEnv");
        assert!(applicable.message.contains("b: NoSuchEnv: no container"));
        // Unchanged inputs, unchanged status: nothing to write.
        assert_eq!(policy_status(&p, &jobs, Some(&st), "t2"), st);
        assert_eq!(describe_actions(&p), "scaleBatch BATCH_SIZE x0.75");
    }

    #[test]
    fn unsupported_actions_raise_a_condition() {
        let labels = BTreeMap::from([("team".to_string(), "ml".to_string())]);
        let a = MemoryProfileStatus {
            remediations: vec![rec(
                PHASE_FAILED,
                "t",
                "Unsupported: the API server ignored Job spec.suspend",
            )],
            ..Default::default()
        };
        let jobs = [JobView {
            name: "a",
            labels: &labels,
            profile: Some(&a),
        }];
        let st = policy_status(&policy(), &jobs, None, "t1");
        let c = st
            .conditions
            .iter()
            .find(|c| c.type_ == CONDITION_UNSUPPORTED)
            .unwrap();
        assert!(c.is_true() && c.message.contains("spec.suspend"), "{c:?}");
    }
}
