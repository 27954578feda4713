//! [`JobRollup`]: a Job's roll-up kept up to date report by report, so that
//! a report event costs O(GPUs × log ranks) instead of a pass over every
//! rank (7.6 ms of CPU per event at 2,048 ranks before; see
//! `bench/rollup.rs`), and a status costs O(top-K + stale ranks).

use super::aggregate::{seconds_until, Aggregates};
use super::entry::Entry;
use super::hold::RiskHold;
use super::keys::ReportOrder;
use super::members::{Change, Members};
use jiff::{SignedDuration, Timestamp};
use memprof_api::{
    format_duration, MemoryProfileStatus, MemoryReportSpec, RiskLevel, StaleRank, MAX_TOP_RANKS,
};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

/// Stale ranks listed in the status.
pub const MAX_STALE_LISTED: usize = 8;

/// How the roll-up judges time.
#[derive(Clone, Debug, PartialEq)]
pub struct RollupLimits {
    /// A report is stale once older than this many of its sidecar's heartbeats…
    pub stale_heartbeats: i32,
    /// …plus this grace (write latency, clock skew between nodes).
    pub stale_grace: SignedDuration,
    /// The heartbeat assumed when a report does not give its own (the sidecar's default).
    pub default_heartbeat: SignedDuration,
    /// The longest heartbeat believed: a report may claim any.
    pub max_heartbeat: SignedDuration,
    /// How long the profile's risk level is held after the evidence for it ended.
    pub risk_dwell: SignedDuration,
}

impl Default for RollupLimits {
    fn default() -> Self {
        RollupLimits {
            stale_heartbeats: 2,
            stale_grace: SignedDuration::from_secs(30),
            default_heartbeat: SignedDuration::from_secs(60),
            max_heartbeat: SignedDuration::from_secs(600),
            risk_dwell: SignedDuration::from_secs(60),
        }
    }
}

impl RollupLimits {
    /// How long a report with heartbeat `heartbeat_seconds` stays fresh.
    pub fn stale_after(&self, heartbeat_seconds: Option<u64>) -> SignedDuration {
        let beat = heartbeat_seconds
            .map(|s| SignedDuration::from_secs(i64::try_from(s).unwrap_or(i64::MAX)))
            .unwrap_or(self.default_heartbeat)
            .clamp(SignedDuration::from_secs(1), self.max_heartbeat);
        beat * self.stale_heartbeats + self.stale_grace
    }
}

/// What the operator knows of a report besides its spec.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ReportMeta {
    /// When its pod was created: the newest pod of a rank is the one that counts.
    pub pod_created: Option<Timestamp>,
    /// When the operator saw this version of it (its own clock): what the
    /// risk level's dwell time is measured in. The report's `sampledAt`
    /// (the node's clock) when absent.
    pub received: Option<Timestamp>,
}

/// Per-Job incremental roll-up state: what the operator keeps per Job.
#[derive(Debug)]
pub struct JobRollup {
    limits: RollupLimits,
    expected: Option<u32>,
    entries: HashMap<Arc<str>, Entry>,
    members: Members,
    agg: Aggregates,
    /// Counted, valid reports by the instant they go stale.
    stale_at: BTreeSet<(Timestamp, ReportOrder)>,
    /// Counted reports that failed validation.
    rejected: BTreeSet<ReportOrder>,
    hold: RiskHold,
    /// The newest moment seen (for removals, which come with no time).
    clock: Timestamp,
    bytes: usize,
    changes: Vec<Change>,
}

impl JobRollup {
    /// An empty roll-up for a Job of `expected_ranks` ranks (its parallelism).
    pub fn new(expected_ranks: Option<u32>, limits: RollupLimits) -> Self {
        JobRollup {
            limits,
            expected: expected_ranks,
            entries: HashMap::new(),
            members: Members::for_parallelism(expected_ranks),
            agg: Aggregates::default(),
            stale_at: BTreeSet::new(),
            rejected: BTreeSet::new(),
            hold: RiskHold::default(),
            clock: Timestamp::MIN,
            bytes: 0,
            changes: Vec::new(),
        }
    }

    /// The limits it judges time by.
    pub fn limits(&self) -> &RollupLimits {
        &self.limits
    }

    /// A screened (trusted) report was added or changed: O(log n) in the
    /// number of ranks (times its GPUs).
    pub fn upsert(&mut self, report_name: &str, spec: &MemoryReportSpec) {
        self.upsert_with(report_name, spec, ReportMeta::default());
    }

    /// [`Self::upsert`], with what the operator knows besides the spec.
    pub fn upsert_with(&mut self, report_name: &str, spec: &MemoryReportSpec, meta: ReportMeta) {
        let before = self.raw_risk();
        self.take_out(report_name);
        let name: Arc<str> = Arc::from(report_name);
        let stale_after = self.limits.stale_after(spec.heartbeat_seconds);
        let entry = Entry::of(name.clone(), spec, meta.pod_created, stale_after);
        let at = meta.received.unwrap_or(entry.at);
        let (key, rank) = (entry.key.clone(), entry.rank());
        self.bytes += entry.bytes;
        self.entries.insert(name, entry);
        self.members.insert(key, rank, &mut self.changes);
        self.apply_changes();
        self.clock = self.clock.max(at);
        self.hold.observe(before, self.raw_risk(), at);
    }

    /// A report was deleted or stopped being trusted: O(log n).
    pub fn remove(&mut self, report_name: &str) {
        let before = self.raw_risk();
        self.take_out(report_name);
        self.hold.observe(before, self.raw_risk(), self.clock);
    }

    /// The Job's parallelism changed.
    pub fn set_expected_ranks(&mut self, expected: Option<u32>) {
        let before = self.raw_risk();
        self.expected = expected;
        self.members.set_parallelism(expected, &mut self.changes);
        self.apply_changes();
        self.hold.observe(before, self.raw_risk(), self.clock);
    }

    /// Carries the risk level an earlier status held over into this
    /// roll-up (after an operator restart): see `RiskHold::resume`.
    pub fn resume_from(&mut self, previous: &MemoryProfileStatus, now: Timestamp) {
        self.hold.resume(previous, self.limits.risk_dwell, now);
    }

    /// Memory held, for the operator's bound (bytes, approx.).
    pub fn approx_bytes(&self) -> usize {
        std::mem::size_of::<Self>() + self.bytes
    }

    /// Reports known (counted or not).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no report is known.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Genuine reports of a rank that has a newer pod's report: not counted.
    pub fn superseded(&self) -> usize {
        self.members.superseded()
    }

    /// Genuine reports beyond what the Job can have (`report_limit`): not counted.
    pub fn over_limit(&self) -> usize {
        self.members.over_limit()
    }

    /// Whether report `name` is in the roll-up and valid: what counts for
    /// anything built beside the roll-up (the recommendation's evidence),
    /// so that both count the same reports. O(1).
    pub fn is_valid(&self, name: &str) -> bool {
        self.entries.get(name).is_some_and(Entry::valid)
    }

    /// Counted reports that failed validation, in (rank, name) order, with
    /// why: O(rejected).
    pub fn rejected(&self) -> impl Iterator<Item = (&str, &str)> + '_ {
        self.rejected.iter().map(|(_, name)| {
            let why = self.entries[name].invalid.as_deref().unwrap_or_default();
            (&**name, why)
        })
    }

    fn take_out(&mut self, name: &str) {
        let Some((key, rank)) = self.entries.get(name).map(|e| (e.key.clone(), e.rank())) else {
            return;
        };
        self.members.remove(&key, rank, &mut self.changes);
        self.apply_changes();
        if let Some(e) = self.entries.remove(name) {
            self.bytes -= e.bytes;
        }
    }

    fn apply_changes(&mut self) {
        for (name, counted) in std::mem::take(&mut self.changes) {
            let e = &self.entries[&name];
            if !e.valid() {
                toggle(&mut self.rejected, e.order.clone(), counted);
                continue;
            }
            self.agg.apply(e, counted);
            toggle(&mut self.stale_at, (e.stale_at, e.order.clone()), counted);
        }
    }

    fn raw_risk(&self) -> RiskLevel {
        self.agg.worst_risk()
    }
}

fn toggle<K: Ord>(set: &mut BTreeSet<K>, k: K, add: bool) {
    if add {
        set.insert(k);
    } else {
        set.remove(&k);
    }
}

impl JobRollup {
    /// The analysis part of the status at `now`: O(K + stale) where K is the
    /// top-K size, never O(ranks). Stale ranks (see [`RollupLimits`]) are
    /// not counted as reporting, are listed, and keep their last verdict in
    /// every figure, marked stale; the time to OOM is aged to `now`; the
    /// risk level is held (see `hold.rs`).
    pub fn status(&self, now: Timestamp) -> MemoryProfileStatus {
        let mut st = MemoryProfileStatus {
            ranks_expected: self.expected,
            ..Default::default()
        };
        self.agg.fill(&self.entries, &mut st);
        if st.peak.is_empty() {
            // A 1.20 API server rejects "" in a required string field.
            st.peak = "-".into();
        }
        let stale = self.stale_entries(now);
        st.ranks_stale = stale.len() as u32;
        st.ranks_reporting = (self.agg.reports() - stale.len()) as u32;
        st.ranks = ranks_text(st.ranks_reporting, self.expected, st.ranks_stale);
        st.stale_ranks = stale_list(stale);
        st.top_ranks = self
            .agg
            .worst_entries(&self.entries)
            .take(MAX_TOP_RANKS)
            .filter_map(|e| {
                let mut r = e.summary()?;
                r.stale = e.stale_at < now;
                r.time_to_oom_seconds = e.oom_instant().map(|i| seconds_until(i, now));
                Some(r)
            })
            .collect();
        st.time_to_oom_seconds = self.agg.first_oom_instant().map(|i| seconds_until(i, now));
        let (risk, until) = self.hold.shown(st.risk, self.limits.risk_dwell, now);
        st.risk = risk;
        st.risk_held_until = until.map(|u| u.to_string());
        if st.risk >= RiskLevel::Medium {
            st.time_to_oom = st.time_to_oom_seconds.map(format_duration);
        }
        st
    }

    /// When the status next changes with no report event: a rank goes
    /// stale or a held risk level ends (the controller requeues the Job
    /// then). The time to OOM, which ages continuously, is not counted.
    pub fn next_change(&self, now: Timestamp) -> Option<Timestamp> {
        // Stale once `stale_at < now`: the first report not stale at `now`
        // turns stale just after its `stale_at`.
        let first_fresh = (now, (None, Arc::from("")));
        let stale = self
            .stale_at
            .range(first_fresh..)
            .next()
            .and_then(|(t, _)| t.checked_add(SignedDuration::from_nanos(1)).ok());
        let held = self
            .hold
            .next_change(self.raw_risk(), self.limits.risk_dwell, now);
        stale.into_iter().chain(held).min()
    }

    fn stale_entries(&self, now: Timestamp) -> Vec<&Entry> {
        self.stale_at
            .iter()
            .take_while(|(t, _)| *t < now)
            .map(|(_, o)| &self.entries[&o.1])
            .collect()
    }
}

/// `reporting/expected`, and how many are stale.
fn ranks_text(reporting: u32, expected: Option<u32>, stale: u32) -> String {
    let mut s = match expected {
        Some(e) => format!("{reporting}/{e}"),
        None => reporting.to_string(),
    };
    if stale > 0 {
        s.push_str(&format!(" ({stale} stale)"));
    }
    s
}

/// The stale ranks worth naming: worst last verdict first, then the longest
/// silent, then (rank, name); at most [`MAX_STALE_LISTED`].
fn stale_list(mut stale: Vec<&Entry>) -> Vec<StaleRank> {
    stale.sort_by(|a, b| {
        b.risk()
            .cmp(&a.risk())
            .then(a.at.cmp(&b.at))
            .then(a.order.cmp(&b.order))
    });
    stale
        .into_iter()
        .take(MAX_STALE_LISTED)
        .map(|e| StaleRank {
            rank: e.rank(),
            pod: e.pod.clone(),
            node: e.node.clone(),
            last_report_time: e.sampled_at.clone(),
            risk: e.risk(),
        })
        .collect()
}
