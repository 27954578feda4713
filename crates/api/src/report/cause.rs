//! What would run a GPU out of memory, as a verdict names it: the cause and
//! the evidence for it, in a few words. One vocabulary for the sidecar's
//! analysis, the report, the profile, the Events and every view.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What would run the GPU out of memory.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, Serialize, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum Cause {
    /// Memory kept from step to step (the floor between steps rises with
    /// the peaks; from NVML: a regular staircase after the start).
    Leak,
    /// The workload's own demand grows (longer sequences, a batch schedule):
    /// the peaks rise while memory between steps stays put, or NVML sees
    /// growth that is not (yet) a leak.
    GrowingDemand,
    /// Another process on the same GPU grows while the trainer's allocator
    /// does not.
    Neighbour,
    /// Memory reserved but not allocated blocks the next allocations.
    Fragmentation,
    /// A sudden rise of at least `spikeFraction` of the GPU.
    Spike,
}

impl Cause {
    /// The name in reports and logs (camelCase, as the API spells enums).
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::Leak => "leak",
            Cause::GrowingDemand => "growingDemand",
            Cause::Neighbour => "neighbour",
            Cause::Fragmentation => "fragmentation",
            Cause::Spike => "spike",
        }
    }
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Evidence strings are cut to this many bytes (a report is bounded, and a
/// person reads one sentence).
pub const MAX_EVIDENCE: usize = 200;

/// A cause with its evidence.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NamedCause {
    /// The cause.
    pub cause: Cause,
    /// What showed it, e.g. "device memory +400 MiB/s outside the trainer's
    /// allocator; pid 4242 holds 31 GiB".
    #[schemars(length(max = 200))]
    pub evidence: String,
}

impl NamedCause {
    /// A cause with its evidence, cut to [`MAX_EVIDENCE`] bytes at a
    /// character boundary.
    pub fn new(cause: Cause, evidence: impl Into<String>) -> Self {
        let mut evidence = evidence.into();
        if evidence.len() > MAX_EVIDENCE {
            let mut end = MAX_EVIDENCE;
            while !evidence.is_char_boundary(end) {
                end -= 1;
            }
            evidence.truncate(end);
        }
        NamedCause { cause, evidence }
    }

    /// "leak: <evidence>", as Events and tables print it.
    pub fn line(&self) -> String {
        if self.evidence.is_empty() {
            self.cause.to_string()
        } else {
            format!("{}: {}", self.cause, self.evidence)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evidence_is_cut_at_a_character_boundary() {
        let c = NamedCause::new(Cause::Neighbour, "é".repeat(150));
        assert!(c.evidence.len() <= MAX_EVIDENCE);
        assert_eq!(c.evidence.len() % 2, 0);
    }

    #[test]
    fn causes_are_spelled_as_the_api_spells_enums() {
        for c in [
            Cause::Leak,
            Cause::GrowingDemand,
            Cause::Neighbour,
            Cause::Fragmentation,
            Cause::Spike,
        ] {
            let json = serde_json::to_string(&c).unwrap();
            assert_eq!(json, format!("\"{}\"", c.as_str()));
        }
    }
}
