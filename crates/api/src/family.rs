//! The model-and-configuration family of a Job: a name its creator gives
//! (annotation `memprof.dev/family`) so that the admission webhook can
//! predict a new Job's peak from the measured history of earlier Jobs of the
//! same family in the same namespace. The operator copies it onto the Job's
//! MemoryProfile as a label, where the webhook selects on it.
//!
//! A family is the creator's input: it is a label value (so it can be
//! selected on) and nothing more is trusted of it. Only profiles of the same
//! namespace are ever read, so a family can only mislead its own namespace.

/// Job annotation (the user's): the family, e.g. `llama-8b-lora`.
pub const ANNOTATION_FAMILY: &str = "memprof.dev/family";
/// MemoryProfile label (the operator's): its Job's family.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_family_is_a_label_value() {
        assert_eq!(parse_family("llama-8b.lora_v2"), Ok("llama-8b.lora_v2"));
        for bad in ["", "-x", "x-", "a b", "a/b", "é", &"x".repeat(64)] {
            assert_eq!(parse_family(bad), Err(FamilyError), "{bad:?}");
        }
        assert!(parse_family(&"x".repeat(63)).is_ok());
    }
}
