//! The tally of a `notifyTrainer` remediation's acknowledgements, in its
//! record: what `kubectl get memoryprofile -o yaml` shows of which ranks'
//! trainers did what the directive asked.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// At most this many ranks in each list of [`Acknowledgements`].
pub const MAX_ACK_RANKS: usize = 8;

/// Which counted ranks acknowledged a `notifyTrainer` directive. A rank is
/// one counted MemoryReport (one pod): `ok` when its trainer processes
/// acknowledged and none said it failed, `failed` when one said so,
/// pending otherwise. `delivered = ok + failed + pending`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Acknowledgements {
    /// Counted ranks whose report carries the directive.
    pub delivered: u32,
    /// Counted ranks the directive could not be written to (the record's message says why).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub not_delivered: u32,
    /// Ranks whose trainer did what was asked.
    pub ok: u32,
    /// Ranks whose trainer answered that it could not.
    pub failed: u32,
    /// Ranks with no answer yet (no agent, or not pushed since).
    pub pending: u32,
    /// The lowest ranks that answered they could not (at most 8).
    #[schemars(length(max = 8))]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed_ranks: Vec<u32>,
    /// The lowest ranks with no answer yet (at most 8).
    #[schemars(length(max = 8))]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending_ranks: Vec<u32>,
    /// For humans: `2/3 acknowledged (1 failed: rank 1; 1 pending: rank 2)`.
    #[schemars(length(max = 256))]
    pub summary: String,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}
