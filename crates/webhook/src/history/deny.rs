//! The policy opt-in to deny: a RemediationPolicy of the workload's
//! namespace whose selector matches the workload's labels and that sets
//! `denyPredictedOom` refuses a workload (a Job, JobSet, TrainJob or
//! PyTorchJob) whose predicted peak itself (not only its margin) exceeds
//! its GPU.
//! Pure.

use super::ask::Ask;
use super::predict::{advice, basis_words, clean, Prediction};
use kube::core::{Selector, SelectorExt};
use memprof_api::{format_bytes, RemediationPolicy};

/// The denial for a workload predicted to exceed its GPU, when one of `policies`
/// (those of its namespace that opt in) selects it; a policy whose selector
/// cannot be read selects nothing. The first by name decides.
pub fn denial(policies: &[RemediationPolicy], ask: &Ask, p: &Prediction) -> Option<String> {
    let selects = |pol: &&RemediationPolicy| {
        pol.spec.deny_predicted_oom
            && Selector::try_from(pol.spec.selector.clone()).is_ok_and(|s| s.matches(&ask.labels))
    };
    let policy = policies
        .iter()
        .filter(selects)
        .min_by_key(|pol| pol.metadata.name.clone())?;
    let name = clean(policy.metadata.name.as_deref().unwrap_or_default(), 253);
    Some(format!(
        "memprof: RemediationPolicy {name} (denyPredictedOom) refuses this {}: its predicted peak \
         {} per rank at {}={} exceeds the GPU's {} ({}). To create it: {}; or remove the \
         memprof.dev/family annotation to skip the prediction; or change the policy's selector",
        ask.kind,
        format_bytes(p.peak),
        clean(&p.basis.env_var, 128),
        p.batch,
        format_bytes(p.gpu),
        basis_words(p, &ask.family),
        advice(p),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::predict::{predict, Fitted, Outcome};
    use memprof_api::{BatchFitModel, RemediationPolicySpec};

    fn exceeding() -> Prediction {
        let f = Fitted {
            profile: "old".into(),
            env_var: "BATCH_SIZE".into(),
            model: BatchFitModel {
                static_bytes: 10 << 30,
                per_sample_bytes: (1u64 << 30) as f64,
                points: 2,
                ..Default::default()
            },
            gpu_bytes: Some(40 << 30),
            recommended: Some(29),
        };
        let env = [("BATCH_SIZE".to_string(), "64".to_string())].into();
        match predict(&[f], &env, None) {
            Outcome::Exceeds(p) => p,
            other => panic!("{other:?}"),
        }
    }

    fn policy(name: &str, deny: bool, team: Option<&str>) -> RemediationPolicy {
        let mut p = RemediationPolicy::new(
            name,
            RemediationPolicySpec {
                deny_predicted_oom: deny,
                ..Default::default()
            },
        );
        if let Some(t) = team {
            let labels = p
                .spec
                .selector
                .match_labels
                .get_or_insert_with(Default::default);
            labels.insert("team".into(), t.into());
        }
        p
    }

    fn ask(team: &str) -> Ask {
        Ask {
            kind: "Job",
            family: "llama".into(),
            labels: [("team".to_string(), team.to_string())].into(),
            ..Default::default()
        }
    }

    #[test]
    fn only_a_selecting_policy_that_opts_in_denies() {
        let p = exceeding();
        assert_eq!(denial(&[], &ask("ml"), &p), None, "never by default");
        let off = policy("off", false, None);
        assert_eq!(denial(&[off], &ask("ml"), &p), None);
        let other = policy("other", true, Some("cv"));
        assert_eq!(denial(std::slice::from_ref(&other), &ask("ml"), &p), None);
        let on = policy("on", true, Some("ml"));
        let jobset = Ask {
            kind: "JobSet",
            ..ask("ml")
        };
        let said = denial(std::slice::from_ref(&on), &jobset, &p).unwrap();
        assert!(
            said.contains("refuses this JobSet: its predicted"),
            "{said}"
        );
        let why = denial(&[other, on], &ask("ml"), &p).unwrap();
        assert!(
            why.starts_with("memprof: RemediationPolicy on (denyPredictedOom) refuses"),
            "{why}"
        );
        for part in [
            "74.0GiB per rank at BATCH_SIZE=64",
            "recommends at most 29",
            "remove the",
        ] {
            assert!(why.contains(part), "{part:?} in {why}");
        }
    }
}
