//! The model-and-configuration family of a workload: a name its creator
//! gives (annotation `memprof.dev/family`) so that the admission webhook can
//! predict a new workload's peak from the measured history of earlier ones of
//! the same family in the same namespace. The operator copies it onto the
//! workload's MemoryProfile as a label, where the webhook selects on it.
//!
//! Whatever the kind, the family is the annotation on the object its
//! creator writes, the top of the workload ([`named_family`]): a Job's own,
//! a JobSet's, a TrainJob's, a PyTorchJob's, never a child Job's or a pod
//! template's (a Job's pod template included: the operator keeps no
//! template metadata, so a family there would be predicted from and never
//! added to). The webhook reads it there when that object is created, the
//! operator when it reads that object, both through [`named_family`], so
//! the two agree on one place.
//!
//! A family is the creator's input: it is a label value (so it can be
//! selected on) and nothing more is trusted of it. Only profiles of the same
//! namespace are ever read, so a family can only mislead its own namespace.

use std::collections::BTreeMap;

/// Workload annotation (the user's, on a Job, JobSet, TrainJob or
/// PyTorchJob itself): the family, e.g. `llama-8b-lora`.
pub const ANNOTATION_FAMILY: &str = "memprof.dev/family";
/// MemoryProfile label (the operator's): its workload's family.
pub const LABEL_FAMILY: &str = "memprof.dev/family";
/// Longest family: a label value's limit.
pub const MAX_FAMILY: usize = 63;

/// A family annotation that cannot be a label value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{ANNOTATION_FAMILY} must be a label value (at most 63 letters, digits, '-', '_' or '.', \
     starting and ending with a letter or digit); rename the family"
)]
pub struct FamilyError;

/// The family named by an annotation value, checked as a label value.
pub fn parse_family(value: &str) -> Result<&str, FamilyError> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    let valid = value.len() <= MAX_FAMILY
        && value.chars().all(ok_char)
        && edge(value.chars().next())
        && edge(value.chars().last());
    valid.then_some(value).ok_or(FamilyError)
}

/// The family a workload's top-level object names in its `annotations`
/// (its own metadata's, whatever its kind; nothing else is read): `None`
/// when it names none, `Err` when the name cannot be a label value.
pub fn named_family(annotations: &BTreeMap<String, String>) -> Option<Result<&str, FamilyError>> {
    Some(parse_family(annotations.get(ANNOTATION_FAMILY)?))
}

/// The family of [`named_family`] when it is a valid label value: an
/// invalid one names none (the webhook says why when it is created).
pub fn family_of(annotations: &BTreeMap<String, String>) -> Option<&str> {
    named_family(annotations)?.ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotated(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_workloads_family_is_its_own_valid_annotation() {
        let ok = annotated(&[(ANNOTATION_FAMILY, "llama-8b"), ("team", "ml")]);
        assert_eq!(family_of(&ok), Some("llama-8b"));
        assert_eq!(family_of(&annotated(&[("team", "ml")])), None, "none named");
        let long = "x".repeat(MAX_FAMILY + 1);
        for bad in ["a b", "-x", long.as_str()] {
            let a = annotated(&[(ANNOTATION_FAMILY, bad)]);
            assert_eq!(family_of(&a), None, "{bad:?} is no label value");
            assert_eq!(
                named_family(&a),
                Some(Err(FamilyError)),
                "said by the webhook"
            );
        }
        assert_eq!(named_family(&ok), Some(Ok("llama-8b")));
        assert_eq!(named_family(&annotated(&[("team", "ml")])), None);
    }

    #[test]
    fn a_family_is_a_label_value() {
        assert_eq!(parse_family("llama-8b.lora_v2"), Ok("llama-8b.lora_v2"));
        for bad in ["", "-x", "x-", "a b", "a/b", "é", &"x".repeat(64)] {
            assert_eq!(parse_family(bad), Err(FamilyError), "{bad:?}");
        }
        assert!(parse_family(&"x".repeat(63)).is_ok());
    }
}
