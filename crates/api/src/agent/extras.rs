//! The seed tools' push fields (host, gradients, sizes, tracking) and the OOM's state before the unwinding
//! (contract C): `host`, `grads`, `sizes`, `tracking` and `preOom`, with
//! their checks. The rest of the push is in [`crate::agent`].
//!
//! Why checked: `host` and `sizes` feed the analysis (a host-memory leak, the
//! allocation-size pattern), `preOom` replaces the numbers of an OOM push, and
//! the others are copied into the report. A push is input from a process the
//! sidecar does not control, so every list and string is bounded (the push
//! stays under [`super::MAX_BODY_BYTES`]) and numbers that cannot all be true
//! are refused with the field named.

use super::{bound_len, bound_opt, bound_str, validate_device, DeviceStats, Error};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// At most this many parameter names per `grads` list.
pub const MAX_GRAD_NAMES: usize = 16;
/// Longest parameter name in `grads`, bytes.
pub const MAX_GRAD_NAME: usize = 128;
/// At most this many buckets per `sizes` histogram (512 B … 1 TiB in powers of two).
pub const MAX_SIZE_BUCKETS: usize = 32;
/// The largest bucket bound of `sizes`: 1 TiB.
pub const MAX_SIZE_BOUND: u64 = 1 << 40;
/// At most this many tensor groups and object types in `tracking`.
pub const MAX_TRACKED: usize = 32;
/// At most this many dimensions of a tracked tensor group's shape.
pub const MAX_SHAPE_DIMS: usize = 8;
/// Longest allocating site of a tracked tensor group, bytes.
pub const MAX_SITE: usize = 128;
/// Longest short tag (`cgroup`, `source`, a device, a dtype, a type name), bytes.
pub const MAX_TAG: usize = 64;

// Not the report's HostMemory, which is what the sidecar concluded from these
// readings (growth, leak, time to the limit, advice).
/// The container's memory as the agent read it (`host`, every push).
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Host {
    /// Resident set size of the trainer process, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
    /// The smallest memory limit of the process's cgroup and its ancestors,
    /// bytes; absent when there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_bytes: Option<u64>,
    /// The cgroup's usage (page cache included), bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup_usage_bytes: Option<u64>,
    /// Usage minus inactive file pages, as the kubelet computes the working
    /// set: what must fit under the limit, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_set_bytes: Option<u64>,
    /// `v2` or `v1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_TAG))]
    pub cgroup: Option<String>,
}

// Not the report's GradientCheck, which names at most 4 parameters per list
// (the push 16) and leaves out every, checks and at.
/// The latest gradient check of `watch_gradients()` (`grads`).
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Grads {
    /// The step of the check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    /// Steps between two checks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every: Option<u64>,
    /// Checks so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checks: Option<u64>,
    /// Gradients checked by this check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checked: Option<u64>,
    /// When it was checked, seconds since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<f64>,
    /// Parameters whose gradient holds NaN or Inf (at most 16).
    #[serde(default)]
    #[schemars(length(max = MAX_GRAD_NAMES), inner(length(max = MAX_GRAD_NAME)))]
    pub non_finite: Vec<String>,
    /// Parameters whose gradient norm jumped above its history, largest ratio first (at most 16).
    #[serde(default)]
    #[schemars(length(max = MAX_GRAD_NAMES), inner(length(max = MAX_GRAD_NAME)))]
    pub large: Vec<String>,
    /// Parameters whose gradient norm is all but zero (at most 16).
    #[serde(default)]
    #[schemars(length(max = MAX_GRAD_NAMES), inner(length(max = MAX_GRAD_NAME)))]
    pub vanishing: Vec<String>,
    /// How many were non-finite (the list may be cut).
    #[serde(default)]
    pub non_finite_count: u64,
    /// How many were large.
    #[serde(default)]
    pub large_count: u64,
    /// How many were vanishing.
    #[serde(default)]
    pub vanishing_count: u64,
    /// √Σ norm² over the checked gradients; absent when one is non-finite.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_norm: Option<f64>,
    /// Median of the previous checks' global norms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_norm_median: Option<f64>,
    /// The first step with a non-finite gradient.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_non_finite_step: Option<u64>,
}

/// Where a `sizes` reading came from.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SizesSource {
    /// The allocator's block table: live blocks by requested size.
    Snapshot,
    /// Pool counters only: small (≤ 1 MiB) and large allocations.
    #[default]
    Stats,
}

// Not the report's AllocationSizes, which adds the pattern in words and the
// dominant size, with an RFC 3339 time.
/// The allocation-size pattern (`sizes`): histograms of `[upper_bytes,
/// count]`, ascending, the upper bound inclusive.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Sizes {
    /// CUDA ordinal read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<u32>,
    /// When it was read, seconds since the Unix epoch (readings repeat
    /// between two reads: the same `at` is the same reading).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<f64>,
    /// `snapshot` or `stats`.
    #[serde(default)]
    pub source: SizesSource,
    /// Live allocations by size.
    #[serde(default)]
    #[schemars(length(max = MAX_SIZE_BUCKETS))]
    pub buckets: Vec<(u64, u64)>,
    /// `snapshot` only: free cached blocks by size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_SIZE_BUCKETS))]
    pub free_buckets: Option<Vec<(u64, u64)>>,
    /// Allocations each pool served since the previous reading.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_SIZE_BUCKETS))]
    pub requests: Option<Vec<(u64, u64)>>,
    /// Seconds `requests` covers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds: Option<f64>,
    /// Free split blocks (`inactive_split.all.current`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inactive_splits: Option<u64>,
    /// `snapshot` only: live blocks counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocks: Option<u64>,
    /// `snapshot` only: what the snapshot took, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_seconds: Option<f64>,
}

// Not the report's TrackedGrowth, which keeps 8 groups and 8 types (the push 32).
/// What grew between the tracker's last two samples (`tracking`).
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Tracking {
    /// Step of the older sample.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_step: Option<u64>,
    /// Step of the newer sample.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to_step: Option<u64>,
    /// Seconds between the two samples.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds: Option<f64>,
    /// When the newer sample was taken, seconds since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<f64>,
    /// `history` (sites from the allocator's history) or `none`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_TAG))]
    pub site_source: Option<String>,
    /// Objects the newer sample walked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scanned_objects: Option<u64>,
    /// Live tensors at the newer sample.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live_tensors: Option<u64>,
    /// Their bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live_tensor_bytes: Option<u64>,
    /// What a sample took, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample_seconds: Option<f64>,
    /// Tensor groups that grew, largest byte growth first (at most 32).
    #[serde(default)]
    #[schemars(length(max = MAX_TRACKED))]
    pub tensors: Vec<TrackedTensors>,
    /// Python object types that grew (at most 32).
    #[serde(default)]
    #[schemars(length(max = MAX_TRACKED))]
    pub objects: Vec<TrackedType>,
}

// Not the report's TensorGrowth, which is this group as one `device dtype shape` text.
/// One group of live tensors (device, dtype, shape, allocating site).
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TrackedTensors {
    /// `cuda:0`, `cpu`, …
    #[serde(default)]
    #[schemars(length(max = MAX_TAG))]
    pub device: String,
    /// `torch.float32`, …
    #[serde(default)]
    #[schemars(length(max = MAX_TAG))]
    pub dtype: String,
    /// Shape (at most 8 dimensions); absent when groups were merged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_SHAPE_DIMS))]
    pub shape: Option<Vec<u64>>,
    /// First frame outside torch and the agent that allocated them, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_SITE))]
    pub site: Option<String>,
    /// Growth of the count between the two samples.
    #[serde(default)]
    pub count: i64,
    /// Growth of the bytes between the two samples.
    #[serde(default)]
    pub bytes: i64,
    /// Count at the newer sample.
    #[serde(default)]
    pub live_count: u64,
    /// Bytes at the newer sample.
    #[serde(default)]
    pub live_bytes: u64,
}

// The fields of the report's ObjectGrowth, but each optional on the wire (an
// agent may leave any out) and required in the CRD: one type would change a schema.
/// One Python object type that grew.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TrackedType {
    /// `module.QualName`.
    #[serde(rename = "type", default)]
    #[schemars(length(max = MAX_TAG))]
    pub type_: String,
    /// Growth of the count.
    #[serde(default)]
    pub count: i64,
    /// Count at the newer sample.
    #[serde(default)]
    pub live: u64,
}

/// How the state before an OOM was read.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum PreOomSource {
    /// In the allocator's OOM observer, before the exception existed: exact.
    #[default]
    Observer,
    /// After the unwinding, from the peaks since the previous push: upper bounds.
    Peaks,
}

/// The allocator's state before an OOM exception unwound (`preOom`, only
/// in `kind: oom` pushes).
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PreOom {
    /// `observer` or `peaks`.
    #[serde(default)]
    pub source: PreOomSource,
    /// When it was read, seconds since the Unix epoch.
    pub time: f64,
    /// Device entries as in `devices` (with `peaks`, only the fields that
    /// stay true after the unwinding, plus allocated and reserved bytes).
    #[serde(default)]
    #[schemars(length(max = super::MAX_DEVICES))]
    pub devices: Vec<DeviceStats>,
}

/// Checks `host`.
pub(super) fn validate_host(h: &Host) -> Result<(), Error> {
    bound_opt(|| "host.cgroup".into(), &h.cgroup, MAX_TAG)?;
    if let (Some(w), Some(u)) = (h.working_set_bytes, h.cgroup_usage_bytes) {
        if w > u {
            return Err(Error::Extra {
                why: format!("host.workingSetBytes {w} exceeds host.cgroupUsageBytes {u}"),
            });
        }
    }
    Ok(())
}

fn finite_non_negative(what: &str, v: Option<f64>) -> Result<(), Error> {
    match v {
        Some(x) if !(x.is_finite() && x >= 0.0) => Err(Error::Extra {
            why: format!("{what} must be a finite number >= 0, got {x}"),
        }),
        _ => Ok(()),
    }
}

fn names(what: &str, list: &[String]) -> Result<(), Error> {
    bound_len(what, list.len(), MAX_GRAD_NAMES)?;
    for (i, n) in list.iter().enumerate() {
        bound_str(|| format!("{what}[{i}]"), n, MAX_GRAD_NAME)?;
    }
    Ok(())
}

/// Checks `grads`.
pub(super) fn validate_grads(g: &Grads) -> Result<(), Error> {
    names("grads.nonFinite", &g.non_finite)?;
    names("grads.large", &g.large)?;
    names("grads.vanishing", &g.vanishing)?;
    finite_non_negative("grads.at", g.at)?;
    finite_non_negative("grads.globalNorm", g.global_norm)?;
    finite_non_negative("grads.globalNormMedian", g.global_norm_median)?;
    for (what, listed, count) in [
        ("nonFinite", g.non_finite.len(), g.non_finite_count),
        ("large", g.large.len(), g.large_count),
        ("vanishing", g.vanishing.len(), g.vanishing_count),
    ] {
        if (listed as u64) > count && count > 0 {
            return Err(Error::Extra {
                why: format!("grads.{what} lists {listed} names but grads.{what}Count is {count}"),
            });
        }
    }
    Ok(())
}

fn histogram(what: &str, h: &[(u64, u64)]) -> Result<(), Error> {
    bound_len(what, h.len(), MAX_SIZE_BUCKETS)?;
    let mut previous = 0;
    for (i, (upper, _)) in h.iter().enumerate() {
        if *upper <= previous || *upper > MAX_SIZE_BOUND {
            return Err(Error::Extra {
                why: format!(
                    "{what}[{i}]: bucket bounds must be ascending within 1 .. 2^40, got {upper} after {previous}"
                ),
            });
        }
        previous = *upper;
    }
    Ok(())
}

/// Checks `sizes`.
pub(super) fn validate_sizes(s: &Sizes) -> Result<(), Error> {
    histogram("sizes.buckets", &s.buckets)?;
    if let Some(f) = &s.free_buckets {
        histogram("sizes.freeBuckets", f)?;
    }
    if let Some(r) = &s.requests {
        histogram("sizes.requests", r)?;
    }
    finite_non_negative("sizes.at", s.at)?;
    finite_non_negative("sizes.seconds", s.seconds)?;
    finite_non_negative("sizes.snapshotSeconds", s.snapshot_seconds)
}

/// Checks `tracking`.
pub(super) fn validate_tracking(t: &Tracking) -> Result<(), Error> {
    bound_opt(|| "tracking.siteSource".into(), &t.site_source, MAX_TAG)?;
    finite_non_negative("tracking.seconds", t.seconds)?;
    finite_non_negative("tracking.at", t.at)?;
    finite_non_negative("tracking.sampleSeconds", t.sample_seconds)?;
    bound_len("tracking.tensors", t.tensors.len(), MAX_TRACKED)?;
    for (i, g) in t.tensors.iter().enumerate() {
        bound_str(
            || format!("tracking.tensors[{i}].device"),
            &g.device,
            MAX_TAG,
        )?;
        bound_str(|| format!("tracking.tensors[{i}].dtype"), &g.dtype, MAX_TAG)?;
        bound_opt(|| format!("tracking.tensors[{i}].site"), &g.site, MAX_SITE)?;
        if let Some(shape) = &g.shape {
            bound_len(
                &format!("tracking.tensors[{i}].shape"),
                shape.len(),
                MAX_SHAPE_DIMS,
            )?;
        }
    }
    bound_len("tracking.objects", t.objects.len(), MAX_TRACKED)?;
    for (i, o) in t.objects.iter().enumerate() {
        bound_str(|| format!("tracking.objects[{i}].type"), &o.type_, MAX_TAG)?;
    }
    Ok(())
}

/// Checks `preOom`: a bounded list of device entries, each as `devices`.
pub(super) fn validate_pre_oom(p: &PreOom) -> Result<(), Error> {
    if !(p.time.is_finite() && p.time > 0.0) {
        return Err(Error::NotFinite {
            what: "preOom.time",
            value: p.time,
        });
    }
    bound_len("preOom.devices", p.devices.len(), super::MAX_DEVICES)?;
    let mut seen = Vec::with_capacity(p.devices.len());
    for d in &p.devices {
        if seen.contains(&d.index) {
            return Err(Error::DuplicateDevice { index: d.index });
        }
        seen.push(d.index);
        validate_device(d)?;
    }
    Ok(())
}

// Not the report's AllocationSites, which groups these blocks by file and line.
/// The agent's allocation-site snapshot at critical: live blocks grouped by
/// their innermost user frame, largest first.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SitesSnapshot {
    /// When it was taken, seconds since the Unix epoch.
    pub time: f64,
    /// The risk that made the agent take it.
    #[serde(default)]
    pub level: crate::RiskLevel,
    /// `history` when blocks carry frames, `segments` without, `none` on failure.
    #[serde(default)]
    pub source: super::SnapshotSource,
    /// The sites (one entry per allocating frame, `count` blocks), at most 16.
    #[serde(default)]
    #[schemars(length(max = super::MAX_BLOCKS))]
    pub blocks: Vec<super::Block>,
    /// Live bytes in blocks without frames (allocated before recording began).
    #[serde(default)]
    pub unattributed_bytes: u64,
    /// Whether allocation history was being recorded, and since when and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<SitesHistory>,
    /// Why no snapshot could be taken (`source: none`), at most 1024 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = super::MAX_MESSAGE))]
    pub error: Option<String>,
}

/// The allocation-history recording at the time of a sites snapshot (`sites.history`).
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SitesHistory {
    /// Whether recording was on.
    #[serde(default)]
    pub on: bool,
    /// Entries of the recording ring, when on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entries: Option<u64>,
    /// What turned it on (`risk high (sidecar)`, `the sidecar asked`, `asked`), at most 64 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = super::MAX_NAME))]
    pub why: Option<String>,
}

/// Checks the fields of `sites` beyond its blocks.
pub(super) fn validate_sites(s: &SitesSnapshot) -> Result<(), Error> {
    bound_opt(|| "sites.error".into(), &s.error, super::MAX_MESSAGE)?;
    let why = s.history.as_ref().and_then(|h| h.why.clone());
    bound_opt(|| "sites.history.why".into(), &why, super::MAX_NAME)
}

#[cfg(test)]
pub(super) mod tests;
