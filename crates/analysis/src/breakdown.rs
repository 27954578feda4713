//! The in-process agent's memory breakdown (`memprof_agent.breakdown`) on its
//! way from a push to the MemoryReport and on to the MemoryProfile:
//! - [`Latest`] keeps the newest breakdown of each trainer process of a pod
//!   and gives the report the largest (a pod may run several ranks);
//! - [`moved`] tells the sidecar's write budget whether a breakdown changed
//!   enough to be worth a write (a re-measured, equal one is not);
//! - [`rollup`] picks the job's breakdown for the profile: the rank with the
//!   largest static + activation bytes, the one that runs out first when the
//!   ranks' GPUs are alike, and the one a batch size must fit.
//!
//! Pure: time comes with the pushes.

use memprof_api::agent::{Breakdown, Push};
use memprof_api::{
    FlagKind, MemoryBreakdown, MemoryReportSpec, ModulePhase, ModuleType, ModuleTypeBytes,
    ParameterFlag,
};

/// Trainer processes per pod whose breakdown is kept (a node has at most 16 GPUs).
pub const MAX_PROCESSES: usize = 16;
/// Module types kept (one per [`ModuleType`]): the push's bound.
pub const MAX_MODULE_TYPES: usize = memprof_api::agent::MAX_MODULE_TYPES;
/// Flags kept: the push's bound.
pub const MAX_FLAGS: usize = memprof_api::agent::MAX_FLAGS;
/// Module phases kept: the push's bound.
pub const MAX_PHASES: usize = memprof_api::agent::MAX_MODULE_PHASES;

/// What a breakdown weighs: static plus activation bytes (what must fit).
pub fn weight(b: &MemoryBreakdown) -> u64 {
    b.static_bytes
        .saturating_add(b.activations_peak_bytes.unwrap_or(0))
}

/// The report's form of a (validated) push's breakdown.
pub fn from_push(p: &Push, b: &Breakdown) -> MemoryBreakdown {
    MemoryBreakdown {
        pod: None,
        rank: p.rank,
        // 0 is what a push without a pid deserializes to.
        pid: (p.pid != 0).then_some(p.pid),
        time: Some(rfc3339(p.time)),
        step: b.step,
        total_parameters: b.total_parameters,
        trainable_parameters: b.trainable_parameters,
        parameters_bytes: b.parameters_bytes,
        gradients_bytes: b.gradients_bytes,
        optimizer_bytes: b.optimizer_bytes,
        per_sample_gradients_bytes: b.per_sample_gradients_bytes,
        static_bytes: b.static_bytes,
        activations_peak_bytes: b.activations_peak_bytes,
        batch_size: b.batch_size,
        by_module_type: b
            .by_module_type
            .iter()
            .take(MAX_MODULE_TYPES)
            .map(|m| ModuleTypeBytes {
                type_: ModuleType::parse(&m.type_).unwrap_or_default(),
                parameters: m.parameters,
                parameters_bytes: m.parameters_bytes,
                gradients_bytes: m.gradients_bytes,
                optimizer_bytes: m.optimizer_bytes,
            })
            .collect(),
        flags: b
            .flags
            .iter()
            .take(MAX_FLAGS)
            .map(|f| ParameterFlag {
                kind: FlagKind::parse(&f.kind).unwrap_or_default(),
                parameter: f.parameter.clone(),
                note: f.note.clone(),
            })
            .collect(),
        phases: b
            .phases
            .iter()
            .flatten()
            .take(MAX_PHASES)
            .map(|p| ModulePhase {
                module: p.module.clone(),
                forward_bytes: p.forward_bytes,
                backward_bytes: p.backward_bytes,
            })
            .collect(),
        optimizer_step_peak_bytes: b.optimizer_step_peak_bytes,
        // Validated with the push (at most MAX_ROWS each): carried as they came.
        parameter_rows: b.parameter_rows.clone(),
        parameters_left_out: b.parameters_left_out.clone(),
        layer_rows: b.layer_rows.clone(),
        layers_left_out: b.layers_left_out.clone(),
        dp_sgd: b.dp_sgd.clone(),
    }
}

use memprof_api::rfc3339;

/// The newest breakdown of each trainer process of a pod, bounded.
#[derive(Clone, Debug, Default)]
pub struct Latest {
    /// (pid, rank, agent time of the push, breakdown), in the order first seen.
    by_process: Vec<(u32, Option<u32>, f64, MemoryBreakdown)>,
}

impl Latest {
    /// Takes one (validated) push; a push without a breakdown changes nothing.
    pub fn observe(&mut self, p: &Push) {
        let Some(b) = &p.breakdown else {
            return;
        };
        let entry = (p.pid, p.rank, p.time, from_push(p, b));
        match self
            .by_process
            .iter()
            .position(|(pid, rank, ..)| (*pid, *rank) == (p.pid, p.rank))
        {
            // Pushes may arrive out of order (the inbox drains in batches): the newest wins.
            Some(i) if self.by_process[i].2 <= p.time => self.by_process[i] = entry,
            Some(_) => {}
            None => {
                if self.by_process.len() >= MAX_PROCESSES {
                    // The process that pushed a breakdown longest ago has most likely exited.
                    let oldest = self
                        .by_process
                        .iter()
                        .enumerate()
                        .min_by(|a, b| a.1 .2.total_cmp(&b.1 .2))
                        .map(|(i, _)| i);
                    if let Some(i) = oldest {
                        self.by_process.remove(i);
                    }
                }
                self.by_process.push(entry);
            }
        }
    }

    /// The breakdown the report carries: the process with the largest weight
    /// (the first seen among equals).
    pub fn report(&self) -> Option<MemoryBreakdown> {
        let mut best: Option<&MemoryBreakdown> = None;
        for (.., b) in &self.by_process {
            if best.is_none_or(|x| weight(b) > weight(x)) {
                best = Some(b);
            }
        }
        best.cloned()
    }
}

/// Whether `now` differs from the last written breakdown enough to warrant
/// a report write: it appeared or went, another process is the largest, the
/// model, batch size, flags or traced modules changed, or static or
/// activation bytes moved by more than `fraction` of the last weight. A
/// re-measured breakdown with the same numbers (a later step, a later time)
/// is not a change: the agent may push one with every push.
pub fn moved(last: Option<&MemoryBreakdown>, now: Option<&MemoryBreakdown>, fraction: f64) -> bool {
    let (last, now) = match (last, now) {
        (None, None) => return false,
        (Some(l), Some(n)) => (l, n),
        _ => return true,
    };
    fn shape(b: &MemoryBreakdown) -> impl PartialEq + '_ {
        (
            b.pid,
            b.rank,
            b.total_parameters,
            b.trainable_parameters,
            b.batch_size,
            // Borrowed: this runs at every analysis (each second), not only on pushes.
            &b.flags,
            b.phases.len(),
            b.per_sample_gradients_bytes.is_some(),
        )
    }
    if shape(last) != shape(now) {
        return true;
    }
    let limit = fraction * weight(last).max(1) as f64;
    let far = |a: u64, b: u64| a.abs_diff(b) as f64 > limit;
    far(last.static_bytes, now.static_bytes)
        || far(
            last.activations_peak_bytes.unwrap_or(0),
            now.activations_peak_bytes.unwrap_or(0),
        )
}

/// Whether a report's breakdown can be true (a MemoryReport may be written by
/// something other than the sidecar, which validated what it took).
pub fn consistent(b: &MemoryBreakdown) -> bool {
    let parts = u128::from(b.parameters_bytes)
        + u128::from(b.gradients_bytes)
        + u128::from(b.optimizer_bytes)
        + u128::from(b.per_sample_gradients_bytes.unwrap_or(0));
    b.trainable_parameters <= b.total_parameters && u128::from(b.static_bytes) >= parts
}

/// The profile's breakdown: of the report whose breakdown weighs most (the
/// first among equals, in the caller's order), with its pod and rank;
/// `None` when no report carries a consistent one. Bounded whatever the
/// number of reports.
pub fn rollup<'a>(
    reports: impl IntoIterator<Item = &'a MemoryReportSpec>,
) -> Option<MemoryBreakdown> {
    let mut best: Option<(&MemoryReportSpec, &MemoryBreakdown)> = None;
    for spec in reports {
        let Some(b) = spec.breakdown.as_ref().filter(|b| consistent(b)) else {
            continue;
        };
        if best.is_none_or(|(_, x)| weight(b) > weight(x)) {
            best = Some((spec, b));
        }
    }
    let (spec, b) = best?;
    let mut out = b.clone();
    out.pod = Some(spec.pod_name.clone());
    out.rank = spec.rank.or(b.rank);
    out.by_module_type.truncate(MAX_MODULE_TYPES);
    out.flags.truncate(MAX_FLAGS);
    out.phases.truncate(MAX_PHASES);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: u64 = 1 << 20;

    fn breakdown(static_mib: u64, act_mib: Option<u64>) -> Breakdown {
        Breakdown {
            step: Some(3),
            total_parameters: 1000,
            trainable_parameters: 10,
            parameters_bytes: static_mib * M / 2,
            static_bytes: static_mib * M,
            activations_peak_bytes: act_mib.map(|a| a * M),
            batch_size: Some(8),
            by_module_type: vec![memprof_api::agent::ModuleTypeBytes {
                type_: "lora".into(),
                parameters: 10,
                ..Default::default()
            }],
            flags: vec![memprof_api::agent::Flag {
                kind: "inf".into(),
                parameter: "w".into(),
                note: String::new(),
            }],
            ..Default::default()
        }
    }

    fn push(pid: u32, rank: Option<u32>, t: f64, b: Option<Breakdown>) -> Push {
        Push {
            version: 1,
            time: 1.8e9 + t,
            pid,
            rank,
            breakdown: b,
            ..Default::default()
        }
    }

    #[test]
    fn a_push_becomes_the_reports_form_with_enums_pid_rank_and_time() {
        let b = from_push(&push(42, Some(3), 0.5, None), &breakdown(100, Some(50)));
        assert_eq!((b.pid, b.rank, b.pod.as_deref()), (Some(42), Some(3), None));
        assert_eq!(b.time.as_deref(), Some("2027-01-15T08:00:00.5Z"));
        assert_eq!(b.by_module_type[0].type_, ModuleType::Lora);
        assert_eq!(b.flags[0].kind, FlagKind::Inf);
        assert_eq!(weight(&b), 150 * M);
        assert!(b.phases.is_empty());
        let b = from_push(&push(0, None, 0.5, None), &breakdown(1, None));
        assert_eq!((b.pid, b.rank), (None, None));
    }

    #[test]
    fn the_report_carries_the_newest_of_each_process_and_the_heaviest_process() {
        let mut l = Latest::default();
        assert_eq!(l.report(), None);
        l.observe(&push(1, Some(0), 1.0, Some(breakdown(100, Some(10)))));
        l.observe(&push(2, Some(1), 1.0, Some(breakdown(100, Some(50)))));
        // A push without a breakdown keeps the last one.
        l.observe(&push(2, Some(1), 2.0, None));
        assert_eq!(l.report().unwrap().pid, Some(2));
        // Process 1 re-measured with a larger batch: now it is the heaviest.
        l.observe(&push(1, Some(0), 3.0, Some(breakdown(100, Some(80)))));
        let r = l.report().unwrap();
        assert_eq!((r.pid, weight(&r)), (Some(1), 180 * M));
        // An older push that arrives late does not replace a newer one.
        l.observe(&push(1, Some(0), 2.5, Some(breakdown(100, Some(1)))));
        assert_eq!(weight(&l.report().unwrap()), 180 * M);
    }

    #[test]
    fn processes_are_bounded_and_the_longest_silent_goes_first() {
        let mut l = Latest::default();
        for pid in 0..(MAX_PROCESSES as u32 + 4) {
            let b = breakdown(if pid == 0 { 999 } else { 10 }, None);
            l.observe(&push(pid, None, pid as f64, Some(b)));
        }
        assert_eq!(l.by_process.len(), MAX_PROCESSES);
        // Process 0 (the heaviest, but silent longest) was dropped.
        assert_eq!(weight(&l.report().unwrap()), 10 * M);
    }

    fn api(static_mib: u64, act_mib: Option<u64>) -> MemoryBreakdown {
        from_push(
            &push(7, Some(0), 0.0, None),
            &breakdown(static_mib, act_mib),
        )
    }

    #[test]
    fn only_a_real_change_moves_a_breakdown() {
        let last = api(1000, Some(1000));
        assert!(!moved(None, None, 0.03));
        assert!(moved(None, Some(&last), 0.03));
        assert!(moved(Some(&last), None, 0.03));
        // A later step or time with the same numbers, or jitter under 3 %: no.
        let mut same = last.clone();
        same.step = Some(99);
        same.time = Some("2027-01-15T09:00:00Z".into());
        same.activations_peak_bytes = Some(1050 * M);
        assert!(!moved(Some(&last), Some(&same), 0.03));
        // Activations moved by more than 3 % of 2000 MiB: yes.
        let mut more = last.clone();
        more.activations_peak_bytes = Some(1100 * M);
        assert!(moved(Some(&last), Some(&more), 0.03));
        for change in [
            (|b: &mut MemoryBreakdown| b.batch_size = Some(16)) as fn(&mut MemoryBreakdown),
            |b| b.pid = Some(8),
            |b| b.flags.clear(),
            |b| b.trainable_parameters = 20,
            |b| b.phases.push(ModulePhase::default()),
        ] {
            let mut b = last.clone();
            change(&mut b);
            assert!(moved(Some(&last), Some(&b), 0.03), "{b:?}");
        }
    }

    fn report(rank: u32, b: Option<MemoryBreakdown>) -> MemoryReportSpec {
        MemoryReportSpec {
            pod_name: format!("train-{rank}"),
            rank: Some(rank),
            breakdown: b,
            ..Default::default()
        }
    }

    #[test]
    fn the_profile_takes_the_heaviest_consistent_rank_with_pod_and_rank() {
        assert_eq!(rollup(&[report(0, None)]), None);
        let mut lying = api(10, Some(10_000));
        lying.static_bytes = 0; // less than its parameters: not counted
        let specs = [
            report(0, Some(api(1000, Some(100)))),
            report(1, None),
            report(2, Some(api(900, Some(300)))),
            report(3, Some(lying)),
            report(4, Some(api(1200, None))),
        ];
        let b = rollup(&specs).unwrap();
        assert_eq!((b.pod.as_deref(), b.rank), (Some("train-2"), Some(2)));
        assert_eq!(b.static_bytes, 900 * M);
        // The pod's rank wins over the process's; without one, the process's stays.
        let mut alone = report(5, Some(api(1, None)));
        alone.rank = None;
        assert_eq!(rollup(&[alone]).unwrap().rank, Some(0));
    }

    #[test]
    fn ties_go_to_the_first_report_and_the_size_is_bounded() {
        // Every list and string at the CRD's bounds.
        let mut big = api(100, Some(100));
        let flag = ParameterFlag {
            kind: FlagKind::Large,
            parameter: "p".repeat(128),
            note: "n".repeat(256),
        };
        big.flags = vec![flag; MAX_FLAGS];
        let phase = ModulePhase {
            module: "m".repeat(128),
            forward_bytes: u64::MAX,
            backward_bytes: u64::MAX,
        };
        big.phases = vec![phase; MAX_PHASES];
        let specs: Vec<_> = (0..2048).map(|r| report(r, Some(big.clone()))).collect();
        let b = rollup(&specs).unwrap();
        assert_eq!(b.rank, Some(0));
        assert!(serde_json::to_vec(&b).unwrap().len() < 16 * 1024);
    }

    #[test]
    fn the_crd_bounds_are_the_push_bounds() {
        // The schema's literals (crates/api/src/report/breakdown.rs) must say what is kept.
        let schema = serde_json::to_value(schemars::schema_for!(MemoryBreakdown)).unwrap();
        let max = |field: &str| schema["properties"][field]["maxItems"].as_u64();
        assert_eq!(max("byModuleType"), Some(MAX_MODULE_TYPES as u64));
        assert_eq!(max("flags"), Some(MAX_FLAGS as u64));
        assert_eq!(max("phases"), Some(MAX_PHASES as u64));
        assert_eq!(ModuleType::ALL.len(), MAX_MODULE_TYPES);
    }
}
