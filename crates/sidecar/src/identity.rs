//! Who this sidecar reports for: pod, namespace, node, job and rank, from the
//! environment the injection sets (downward API) or from flags.

use crate::monitor::Identity;

/// The rank: `JOB_COMPLETION_INDEX` (Indexed Jobs), then `RANK` (torchrun and
/// most launchers), then a trailing ordinal of the pod name (`train-3`), when
/// that is all digits and the name is not a Job's random suffix.
pub fn rank_from(
    completion_index: Option<&str>,
    rank: Option<&str>,
    pod_name: &str,
) -> Option<u32> {
    if let Some(r) = completion_index.and_then(|v| v.trim().parse().ok()) {
        return Some(r);
    }
    if let Some(r) = rank.and_then(|v| v.trim().parse().ok()) {
        return Some(r);
    }
    let (_, suffix) = pod_name.rsplit_once('-')?;
    if !suffix.is_empty() && suffix.len() <= 6 && suffix.bytes().all(|b| b.is_ascii_digit()) {
        suffix.parse().ok()
    } else {
        None
    }
}

/// Builds the identity from explicit values.
pub fn identity(
    pod_name: &str,
    node: Option<String>,
    job: Option<String>,
    rank: Option<u32>,
) -> Identity {
    Identity {
        pod_name: pod_name.to_string(),
        node_name: node.filter(|s| !s.is_empty()),
        job_name: job.filter(|s| !s.is_empty()),
        rank,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_prefers_completion_index_then_rank_then_ordinal() {
        assert_eq!(rank_from(Some("3"), Some("7"), "train-x"), Some(3));
        assert_eq!(rank_from(None, Some("7"), "train-x"), Some(7));
        assert_eq!(rank_from(None, None, "train-12"), Some(12));
        assert_eq!(rank_from(Some("bad"), None, "train-2"), Some(2));
        // A Job's pods end in a random suffix: no rank from that.
        assert_eq!(rank_from(None, None, "train-x7k2p"), None);
        assert_eq!(rank_from(None, None, "train"), None);
    }
}
