//! What a report carries for the code and the operator beside the numbers:
//! the top allocation sites of the pod's trainer (the
//! snapshot the agent takes at critical, naming file and line), and the
//! directives only the operator writes (`status.directives`).

use crate::agent::{self, Directive, SitesSnapshot};
use crate::common::RiskLevel;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// At most this many allocation sites in a report and in a profile.
pub const MAX_REPORT_SITES: usize = 8;
/// At most this many ranks in a profile's `criticalAllocationSites`.
pub const MAX_CRITICAL_SITE_RANKS: usize = 16;
/// At most this many sites of each rank in `criticalAllocationSites`.
pub const MAX_CRITICAL_RANK_SITES: usize = 4;
/// Longest file name kept for a site, bytes (the tail is kept: it names the file).
pub const MAX_SITE_FILE: usize = 256;
/// Longest function name kept for a site, bytes.
pub const MAX_SITE_FUNCTION: usize = 128;
/// At most this many directives in a report's status.
pub const MAX_REPORT_DIRECTIVES: usize = agent::MAX_DIRECTIVES;

/// Where the live GPU memory of the pod's trainer was allocated, from the
/// agent's snapshot at critical (allocation history on since high).
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AllocationSites {
    /// When the agent took the snapshot (RFC 3339).
    #[schemars(length(max = 64))]
    pub time: String,
    /// The risk the agent saw when it took it.
    #[serde(default)]
    pub level: RiskLevel,
    /// `history` (blocks with frames) or `segments` (no frames: recording was off).
    #[schemars(length(max = 16))]
    pub source: String,
    /// The sites holding the most bytes, largest first (at most 8).
    #[schemars(length(max = 8))]
    #[serde(default)]
    pub sites: Vec<AllocationSite>,
    /// Live bytes in blocks without frames (allocated before recording began).
    #[serde(default)]
    pub unattributed_bytes: u64,
}

/// One allocating line and the live bytes it holds.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AllocationSite {
    /// Source file (its last 256 bytes).
    #[schemars(length(max = 256))]
    pub file: String,
    /// Line number.
    #[serde(default)]
    pub line: u32,
    /// Function.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 128))]
    pub function: String,
    /// Live bytes allocated there.
    pub bytes: u64,
    /// Live blocks allocated there.
    #[serde(default)]
    pub blocks: u64,
}

impl AllocationSites {
    /// The report's sites from an agent snapshot: blocks with frames, each by
    /// its innermost user frame, at most [`MAX_REPORT_SITES`], largest first.
    /// `time` is RFC 3339 (the caller converts the agent's epoch seconds).
    pub fn from_snapshot(s: &SitesSnapshot, time: String) -> Self {
        let mut sites: Vec<AllocationSite> = s
            .blocks
            .iter()
            .filter_map(|b| {
                let f = b.frames.first()?;
                let mut file = f.filename.clone();
                if file.len() > MAX_SITE_FILE {
                    let mut cut = file.len() - MAX_SITE_FILE;
                    while !file.is_char_boundary(cut) {
                        cut += 1;
                    }
                    file = file[cut..].to_string();
                }
                let mut function = f.name.clone();
                crate::truncate_utf8(&mut function, MAX_SITE_FUNCTION);
                Some(AllocationSite {
                    file,
                    line: f.line,
                    function,
                    bytes: b.size_bytes,
                    blocks: b.count.unwrap_or(1),
                })
            })
            .collect();
        sites.sort_by_key(|s| std::cmp::Reverse(s.bytes));
        sites.truncate(MAX_REPORT_SITES);
        // Frameless blocks (recording off when they were allocated) name no code.
        let frameless: u64 = s
            .blocks
            .iter()
            .filter(|b| b.frames.is_empty())
            .map(|b| b.size_bytes)
            .sum();
        AllocationSites {
            time,
            level: s.level,
            source: s.source.as_str().into(),
            sites,
            unattributed_bytes: s.unattributed_bytes.saturating_add(frameless),
        }
    }
}

/// What the operator tells the pod's sidecar (the status subresource: the
/// reporter Role grants `memoryreports`, not `memoryreports/status`, so a
/// pod cannot write its own, or another rank's, directives).
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MemoryReportStatus {
    /// Directives for the pod's trainer processes (at most 16), relayed by
    /// the sidecar in its answer to their pushes.
    #[schemars(length(max = 16))]
    #[serde(default)]
    pub directives: Vec<Directive>,
}
