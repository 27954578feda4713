//! Pure checks that a saved plan may be carried out: the plan is the one the
//! operator recorded, for the Job it recorded, and no step leaves the
//! profile's namespace.
//!
//! Why this exists: the operator acts with more rights than any tenant, so a
//! plan it reads back must be one it wrote. Plans live in the operator's own
//! namespace (no tenant can write there), and on every load they are checked
//! against the `Pending` record in the profile's status (a subresource only
//! the operator writes): id, namespace, Job name and uid, and the SHA-256 of
//! the plan as saved. A plan that fails any check is refused, never executed.

use memprof_api::{RemediationRecord, ANNOTATION_REMEDIATION, ANNOTATION_REMEDIATION_NONCE};
use memprof_policy::plan::{Plan, Step};
use ring::digest::{digest, SHA256};
use std::fmt::Write;

/// Why a saved plan was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Tampered {
    /// A field of the plan differs from the record or the profile.
    #[error("plan {field} is {found:?}, the record says {expected:?}")]
    Mismatch {
        /// Which field.
        field: &'static str,
        /// What the record or profile says.
        expected: String,
        /// What the plan says.
        found: String,
    },
    /// The plan's hash differs from the one recorded before it was saved.
    #[error("plan digest {found} differs from the recorded {expected}")]
    Digest {
        /// Recorded digest.
        expected: String,
        /// Digest of the plan as loaded.
        found: String,
    },
    /// The record has no digest: a plan saved before digests existed, or never recorded.
    #[error("the record has no plan digest, so the plan cannot be authenticated")]
    NoDigest,
    /// A step targets another namespace or another Job.
    #[error("step {index} targets {target}, outside Job {namespace}/{job}")]
    OutOfScope {
        /// Step index.
        index: usize,
        /// What it targets.
        target: String,
        /// The profile's namespace.
        namespace: String,
        /// The profile's Job.
        job: String,
    },
}

/// Lowercase hex SHA-256 of a plan's saved JSON.
pub fn plan_digest(json: &str) -> String {
    let d = digest(&SHA256, json.as_bytes());
    let mut s = String::with_capacity(64);
    for b in d.as_ref() {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// Checks the plan loaded from `json` against its `Pending` record and the
/// profile `namespace/job` it belongs to.
pub fn verify(
    plan: &Plan,
    json: &str,
    record: &RemediationRecord,
    namespace: &str,
    job: &str,
) -> Result<(), Tampered> {
    let expected = record.plan_digest.as_deref().ok_or(Tampered::NoDigest)?;
    let found = plan_digest(json);
    if found != expected {
        return Err(Tampered::Digest {
            expected: expected.into(),
            found,
        });
    }
    same("id", &record.id, &plan.id)?;
    same("namespace", namespace, &plan.namespace)?;
    same("job", job, &plan.job)?;
    same(
        "jobUid",
        record.job_uid.as_deref().unwrap_or_default(),
        &plan.job_uid,
    )?;
    same("policy", &record.policy, &plan.policy)?;
    in_scope(plan, namespace, job)
}

fn same(field: &'static str, expected: &str, found: &str) -> Result<(), Tampered> {
    if expected == found {
        return Ok(());
    }
    Err(Tampered::Mismatch {
        field,
        expected: expected.into(),
        found: found.into(),
    })
}

/// No step may leave the profile's namespace or touch another Job. ConfigMap
/// steps are namespaced by construction (the client is scoped to `namespace`);
/// a Job manifest names its namespace and name itself, so both are checked.
pub fn in_scope(plan: &Plan, namespace: &str, job: &str) -> Result<(), Tampered> {
    for (index, step) in plan.steps.iter().enumerate() {
        let Step::Recreate { manifest, .. } = step else {
            continue;
        };
        let meta = &manifest["metadata"];
        let ns_ok = meta["namespace"].as_str().is_none_or(|n| n == namespace);
        let name_ok = meta["name"].as_str() == Some(job);
        // A workload's plan recreates its own kind, a Job's a Job.
        let kind = super::workload::kind_of(plan);
        let kind_ok =
            manifest["kind"] == kind.kind() && manifest["apiVersion"] == kind.api_version();
        if !(ns_ok && name_ok && kind_ok) {
            return Err(Tampered::OutOfScope {
                index,
                target: format!(
                    "{} {}/{}",
                    manifest["kind"].as_str().unwrap_or("?"),
                    meta["namespace"].as_str().unwrap_or(namespace),
                    meta["name"].as_str().unwrap_or("?")
                ),
                namespace: namespace.into(),
                job: job.into(),
            });
        }
    }
    Ok(())
}

/// Whether `found` (the Job now under the planned name) is the one this
/// plan's `manifest` created: its remediation id and nonce are the
/// manifest's. Anyone who may create Jobs can set the id (it is
/// deterministic); only the operator knows the nonce before the Job exists.
pub fn created_from(
    found: &std::collections::BTreeMap<String, String>,
    manifest: &serde_json::Value,
) -> bool {
    let planned = |k: &str| manifest["metadata"]["annotations"][k].as_str();
    [ANNOTATION_REMEDIATION, ANNOTATION_REMEDIATION_NONCE]
        .iter()
        .all(|k| {
            planned(k)
                .is_some_and(|v| !v.is_empty() && found.get(*k).map(String::as_str) == Some(v))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remediation::nonce::nonce;
    use serde_json::json;

    fn plan() -> Plan {
        Plan {
            id: "abc".into(),
            policy: "shrink".into(),
            namespace: "ml".into(),
            job: "train".into(),
            job_uid: "u1".into(),
            why: "risk>=critical".into(),
            steps: vec![Step::Recreate {
                changes: vec![],
                manifest: json!({"apiVersion": "batch/v1", "kind": "Job",
                    "metadata": {"name": "train", "namespace": "ml"}}),
            }],
            kind: None,
            checkpoint: None,
        }
    }

    fn record(json: &str) -> RemediationRecord {
        RemediationRecord {
            id: "abc".into(),
            policy: "shrink".into(),
            phase: "Pending".into(),
            job_uid: Some("u1".into()),
            plan_digest: Some(plan_digest(json)),
            ..Default::default()
        }
    }

    #[test]
    fn the_recorded_plan_passes() {
        let json = serde_json::to_string(&plan()).unwrap();
        assert_eq!(
            verify(&plan(), &json, &record(&json), "ml", "train"),
            Ok(())
        );
    }

    #[test]
    fn a_plan_edited_after_recording_fails_its_digest() {
        let json = serde_json::to_string(&plan()).unwrap();
        let rec = record(&json);
        let mut evil = plan();
        evil.steps = vec![];
        let evil_json = serde_json::to_string(&evil).unwrap();
        assert!(matches!(
            verify(&evil, &evil_json, &rec, "ml", "train"),
            Err(Tampered::Digest { .. })
        ));
    }

    #[test]
    fn a_plan_without_a_recorded_digest_is_refused() {
        let json = serde_json::to_string(&plan()).unwrap();
        let mut rec = record(&json);
        rec.plan_digest = None;
        assert_eq!(
            verify(&plan(), &json, &rec, "ml", "train"),
            Err(Tampered::NoDigest)
        );
    }

    #[test]
    fn identity_fields_must_match_the_record_and_profile() {
        // Even with a matching digest (a plan forged together with its record),
        // the plan must be for this profile's namespace, Job and uid.
        for (field, edit) in [
            (
                "namespace",
                Box::new(|p: &mut Plan| p.namespace = "kube-system".into())
                    as Box<dyn Fn(&mut Plan)>,
            ),
            ("job", Box::new(|p: &mut Plan| p.job = "other".into())),
            ("jobUid", Box::new(|p: &mut Plan| p.job_uid = "u2".into())),
            ("id", Box::new(|p: &mut Plan| p.id = "zzz".into())),
        ] {
            let mut p = plan();
            edit(&mut p);
            let json = serde_json::to_string(&p).unwrap();
            let err = verify(&p, &json, &record(&json), "ml", "train").unwrap_err();
            assert!(
                matches!(err, Tampered::Mismatch { field: f, .. } if f == field),
                "{field}: {err}"
            );
        }
    }

    #[test]
    fn a_manifest_for_another_namespace_or_job_is_out_of_scope() {
        for manifest in [
            json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train", "namespace": "kube-system"}}),
            json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "other"}}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "train"}}),
        ] {
            let mut p = plan();
            p.steps = vec![Step::Recreate {
                changes: vec![],
                manifest,
            }];
            assert!(matches!(
                in_scope(&p, "ml", "train"),
                Err(Tampered::OutOfScope { index: 0, .. })
            ));
        }
        assert_eq!(in_scope(&plan(), "ml", "train"), Ok(()));
    }

    #[test]
    fn only_the_job_with_the_plans_nonce_is_the_recreated_one() {
        let manifest = serde_json::json!({"metadata": {"annotations": {
            ANNOTATION_REMEDIATION: "id1", ANNOTATION_REMEDIATION_NONCE: nonce()}}});
        let planned = |k: &str| {
            manifest["metadata"]["annotations"][k]
                .as_str()
                .unwrap()
                .to_string()
        };
        let ours = std::collections::BTreeMap::from([
            (ANNOTATION_REMEDIATION.to_string(), "id1".to_string()),
            (
                ANNOTATION_REMEDIATION_NONCE.to_string(),
                planned(ANNOTATION_REMEDIATION_NONCE),
            ),
        ]);
        assert!(created_from(&ours, &manifest));
        // The id alone (anyone can compute it): someone else's Job.
        let mut theirs = ours.clone();
        theirs.remove(ANNOTATION_REMEDIATION_NONCE);
        assert!(!created_from(&theirs, &manifest));
        theirs.insert(ANNOTATION_REMEDIATION_NONCE.into(), nonce());
        assert!(!created_from(&theirs, &manifest));
        // A manifest without a nonce (an older plan) recognises no Job.
        let old = serde_json::json!({"metadata": {"annotations": {ANNOTATION_REMEDIATION: "id1"}}});
        assert!(!created_from(&ours, &old));
    }
}
