//! Unit tests of `plan.rs`, `plan/values.rs` and `plan/error.rs`: plans
//! from plain JSON Jobs and policies.

use super::*;
use memprof_api::{
    AnnotateAction, RemediationAction, RemediationPolicySpec, ScaleBatchAction, ScaleValue,
    SetConfigMapKeyAction,
};
use serde_json::json;

fn job(batch: Value) -> Value {
    json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {
            "name": "train", "namespace": "ml", "uid": "old-uid", "resourceVersion": "42",
            "creationTimestamp": "2026-01-01T00:00:00Z", "generation": 1,
            "managedFields": [{"manager": "kubectl"}],
            "labels": {"team": "ml", "controller-uid": "old-uid"},
            "annotations": {"memprof.dev/enabled": "true", "memprof.dev/oom-risk": "critical"},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "CronJob", "name": "nightly", "uid": "cj"}],
        },
        "spec": {
            "parallelism": 2, "backoffLimit": 0,
            "selector": {"matchLabels": {"controller-uid": "old-uid"}},
            "template": {
                "metadata": {"labels": {"app": "train", "controller-uid": "old-uid", "job-name": "train"}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "trainer", "image": "t", "env": [{"name": "LR", "value": "0.1"}, {"name": "BATCH_SIZE", "value": batch}]},
                        {"name": "memprof-sidecar", "image": "s"},
                    ],
                },
            },
        },
        "status": {"active": 2},
    })
}

fn policy(actions: Vec<RemediationAction>) -> RemediationPolicy {
    RemediationPolicy::new(
        "shrink",
        RemediationPolicySpec {
            actions,
            ..Default::default()
        },
    )
}

fn scale_batch(factor: f64, minimum: u32, round_to: Option<u32>) -> RemediationAction {
    RemediationAction {
        scale_batch: Some(ScaleBatchAction {
            env: "BATCH_SIZE".into(),
            factor,
            minimum,
            round_to,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn build_for(p: &RemediationPolicy, j: &Value) -> Result<Plan, PlanError> {
    let cms = BTreeMap::from([(
        "train-config".to_string(),
        BTreeMap::from([("batch".to_string(), "64".to_string())]),
    )]);
    build(&PlanInput {
        policy: p,
        job: j,
        config_maps: &cms,
        not_opted_in: &BTreeSet::new(),
        id: "abc123",
        why: "risk critical >= critical for 0s",
        batch_fit: None,
        nonce: "n0nce",
    })
}

#[test]
fn scaling_rounds_down_and_respects_the_minimum() {
    assert_eq!(scale(32, 0.75, 1, None), 24);
    assert_eq!(scale(30, 0.75, 1, Some(8)), 16);
    assert_eq!(scale(3, 0.5, 2, None), 2);
    assert_eq!(scale(1, 0.5, 1, Some(8)), 1);
}

#[test]
fn scale_batch_recreates_the_job_with_server_fields_stripped() {
    let p = policy(vec![
        RemediationAction {
            annotate: Some(AnnotateAction {
                key: "example.com/shrunk".into(),
                value: "yes".into(),
            }),
            ..Default::default()
        },
        scale_batch(0.75, 1, None),
    ]);
    let plan = build_for(&p, &job(json!("32"))).unwrap();
    assert_eq!(plan.summary(), "scaleBatch BATCH_SIZE 32->24");
    assert_eq!(
        (plan.job.as_str(), plan.job_uid.as_str()),
        ("train", "old-uid")
    );
    let (changes, m) = plan.recreate().unwrap();
    assert_eq!(changes.len(), 1);
    let meta = &m["metadata"];
    for f in [
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "generation",
        "managedFields",
    ] {
        assert!(meta.get(f).is_none(), "{f} kept");
    }
    assert!(m.get("status").is_none());
    assert!(m["spec"].get("selector").is_none());
    assert_eq!(meta["labels"], json!({"team": "ml"}));
    assert_eq!(
        m["spec"]["template"]["metadata"]["labels"],
        json!({"app": "train"})
    );
    assert_eq!(meta["ownerReferences"][0]["name"], "nightly");
    let a = &meta["annotations"];
    assert_eq!(a["memprof.dev/remediation"], "abc123");
    // The caller's nonce, so that planning is a pure function of its input.
    assert_eq!(a["memprof.dev/remediation-nonce"], "n0nce");
    assert_eq!(a["memprof.dev/original-batch_size"], "32");
    assert_eq!(a["example.com/shrunk"], "yes");
    assert_eq!(a["memprof.dev/enabled"], "true");
    assert!(a.get("memprof.dev/oom-risk").is_none());
    let env = &m["spec"]["template"]["spec"]["containers"][0]["env"];
    assert_eq!(
        env,
        &json!([{"name": "LR", "value": "0.1"}, {"name": "BATCH_SIZE", "value": "24"}])
    );
    assert_eq!(m["spec"]["parallelism"], 2);

    // A second remediation keeps the first original.
    let mut again = m.clone();
    again["metadata"]["uid"] = "new-uid".into();
    let plan = build_for(&p, &again).unwrap();
    let (_, m2) = plan.recreate().unwrap();
    assert_eq!(
        m2["metadata"]["annotations"]["memprof.dev/original-batch_size"],
        "32"
    );
    assert_eq!(
        m2["spec"]["template"]["spec"]["containers"][0]["env"][1]["value"],
        "18"
    );
}

#[test]
fn impossible_scaling_says_exactly_why() {
    let p = policy(vec![scale_batch(0.75, 16, None)]);
    let e = build_for(&p, &job(json!("sixteen"))).unwrap_err();
    assert_eq!(e.reason(), "EnvNotANumber");
    assert!(e.to_string().contains("\"sixteen\", not an integer"), "{e}");
    let e = build_for(&p, &job(json!("16"))).unwrap_err();
    assert_eq!(e.reason(), "AtMinimum");
    assert!(e
        .to_string()
        .contains("env BATCH_SIZE is 16, already at the minimum 16"));
    let mut no_env = job(json!("32"));
    no_env["spec"]["template"]["spec"]["containers"][0]["env"] = json!([]);
    let e = build_for(&p, &no_env).unwrap_err();
    assert_eq!(
        e.to_string(),
        "no container of the Job sets env BATCH_SIZE: nothing to scale"
    );
    let mut from = job(json!("32"));
    from["spec"]["template"]["spec"]["containers"][0]["env"][1] =
        json!({"name": "BATCH_SIZE", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}});
    assert_eq!(build_for(&p, &from).unwrap_err().reason(), "EnvNotLiteral");
}

#[test]
fn manual_selectors_are_kept() {
    let mut j = job(json!("32"));
    j["spec"]["manualSelector"] = true.into();
    let plan = build_for(&policy(vec![scale_batch(0.5, 1, None)]), &j).unwrap();
    let (_, m) = plan.recreate().unwrap();
    assert_eq!(m["spec"]["selector"], j["spec"]["selector"]);
    assert_eq!(
        m["spec"]["template"]["metadata"]["labels"]["controller-uid"],
        "old-uid"
    );
}

#[test]
fn config_map_keys_get_absolute_values() {
    let set = |value: Option<&str>, factor: Option<f64>, cm: &str| RemediationAction {
        set_config_map_key: Some(SetConfigMapKeyAction {
            config_map: cm.into(),
            key: "batch".into(),
            value: value.map(str::to_string),
            scale: factor.map(|factor| ScaleValue {
                factor,
                minimum: 1,
                round_to: Some(8),
            }),
        }),
        ..Default::default()
    };
    let j = job(json!("32"));
    let plan = build_for(&policy(vec![set(None, Some(0.7), "train-config")]), &j).unwrap();
    assert_eq!(plan.summary(), "setConfigMapKey train-config/batch 64->40");
    assert!(plan.recreate().is_none());
    let plan = build_for(&policy(vec![set(Some("8"), None, "train-config")]), &j).unwrap();
    assert_eq!(plan.summary(), "setConfigMapKey train-config/batch 64->8");
    let e = build_for(&policy(vec![set(Some("8"), None, "nope")]), &j).unwrap_err();
    assert_eq!(e.reason(), "ConfigMapMissing");
}

#[test]
fn original_annotation_names_are_valid_keys() {
    assert_eq!(
        original_annotation("BATCH_SIZE"),
        "memprof.dev/original-batch_size"
    );
    let long = original_annotation(&format!("{}_", "X".repeat(100)));
    let name = long.split('/').nth(1).unwrap();
    assert!(name.len() <= 63 && name.ends_with('x'), "{name}");
}

#[test]
fn config_maps_not_opted_in_are_never_written() {
    let set = RemediationAction {
        set_config_map_key: Some(SetConfigMapKeyAction {
            config_map: "kube-proxy".into(),
            key: "batch".into(),
            value: Some("8".into()),
            scale: None,
        }),
        ..Default::default()
    };
    let j = job(json!("32"));
    let not_opted_in = BTreeSet::from(["kube-proxy".to_string()]);
    let e = build(&PlanInput {
        policy: &policy(vec![set]),
        job: &j,
        config_maps: &BTreeMap::new(),
        not_opted_in: &not_opted_in,
        id: "abc123",
        why: "test",
        batch_fit: None,
        nonce: "n0nce",
    })
    .unwrap_err();
    assert_eq!(e.reason(), "ConfigMapNotOptedIn");
}

#[test]
fn jobs_controlled_by_another_controller_are_left_alone_unless_the_policy_allows() {
    let mut j = job(json!("32"));
    j["metadata"]["ownerReferences"] = json!([{
        "apiVersion": "batch/v1", "kind": "CronJob", "name": "nightly",
        "uid": "c1", "controller": true
    }]);
    let mut p = policy(vec![scale_batch(0.5, 1, None)]);
    let e = build_for(&p, &j).unwrap_err();
    assert_eq!(e.reason(), "ControlledByOwner");
    assert!(e.to_string().contains("CronJob/nightly"), "{e}");
    p.spec.allow_controlled_jobs = true;
    assert!(build_for(&p, &j).is_ok());
}

fn fit_policy(minimum: u32, round_to: Option<u32>) -> RemediationPolicy {
    let mut a = scale_batch(0.75, minimum, round_to);
    a.scale_batch.as_mut().unwrap().mode = Some(memprof_api::ScaleMode::Fit);
    policy(vec![a])
}

/// 66.5 GiB + 0.2 GiB/sample seen at `batches` on an 80 GiB GPU, the Job
/// now at the last of them.
fn batches(batches: &[u64]) -> memprof_api::BatchRecommendation {
    use memprof_analysis::batchfit::{observe, recommend, Evidence};
    const G: f64 = (1u64 << 30) as f64;
    let mut seen = vec![];
    for &b in batches {
        seen = observe(
            &seen,
            Some(b),
            ((66.5 + 0.2 * b as f64) * G) as u64,
            80 << 30,
        );
    }
    recommend(&Evidence {
        env_var: "BATCH_SIZE",
        current: batches.last().copied(),
        limit_bytes: Some(80 << 30),
        headroom_fraction: 0.1,
        breakdown: None,
        observations: &seen,
    })
}

/// Seen at 64 and 48: a line with nothing held out.
fn two_batches() -> memprof_api::BatchRecommendation {
    batches(&[64, 48])
}

/// Seen at 64, 48 and 36: each predicted from the others; the line is
/// backed one step (12) below 36.
fn three_batches() -> memprof_api::BatchRecommendation {
    batches(&[64, 48, 36])
}

fn build_fit(
    p: &RemediationPolicy,
    j: &Value,
    fit: Option<&memprof_api::BatchRecommendation>,
) -> Plan {
    build(&PlanInput {
        policy: p,
        job: j,
        config_maps: &BTreeMap::new(),
        not_opted_in: &BTreeSet::new(),
        id: "abc123",
        why: "test",
        batch_fit: fit,
        nonce: "n0nce",
    })
    .unwrap()
}

#[test]
fn mode_fit_sets_the_computed_batch_with_minimum_and_round_to() {
    let rec = three_batches();
    let j = job(json!("36"));
    // (72 - 66.5) / 0.2 = 27.5 on the line; with the margin 25, 11 below
    // 36, within the held-out step; the factor would give 27.
    let plan = build_fit(&fit_policy(4, None), &j, Some(&rec));
    let (changes, manifest) = plan.recreate().unwrap();
    assert_eq!((changes[0].from, changes[0].to), (36, 25));
    assert_eq!(
        manifest["spec"]["template"]["spec"]["containers"][0]["env"][1]["value"],
        "25"
    );
    assert!(
        plan.summary().starts_with("scaleBatch BATCH_SIZE 36->25 (fit twoBatchSizes: 66.5GiB + 205MiB × B, ≤72.0GiB → 25 (extrapolated 11 below the smallest measured value 36 (-31%)))"),
        "{}",
        plan.summary()
    );
    assert!(
        matches!(plan.steps.last(), Some(Step::Event { reason, .. }) if reason == REASON_BATCH_FIT)
    );
    let plan = build_fit(&fit_policy(4, Some(8)), &j, Some(&rec));
    assert_eq!(plan.recreate().unwrap().0[0].to, 24, "rounded down to 8");
    let plan = build_fit(&fit_policy(32, Some(8)), &j, Some(&rec));
    assert_eq!(plan.recreate().unwrap().0[0].to, 32, "never below minimum");
}

#[test]
fn mode_fit_never_acts_on_an_extrapolation_it_cannot_back() {
    // Two batches: the line says 25, 23 below 48 with nothing held out.
    let plan = build_fit(
        &fit_policy(4, None),
        &job(json!("48")),
        Some(&two_batches()),
    );
    assert_eq!(plan.recreate().unwrap().0[0].to, 36, "48 × 0.75");
    assert!(
        plan.summary().starts_with(
            "scaleBatch BATCH_SIZE 48->36 (fit: not backed by the measured batches, factor 0.75)"
        ),
        "{}",
        plan.summary()
    );
    let Some(Step::Event { reason, message }) = plan.steps.last() else {
        panic!("no Event: {:?}", plan.steps);
    };
    assert_eq!(reason, REASON_BATCH_FIT_FALLBACK);
    assert!(
        message.contains("the curve would allow 25, but that is unsupported: 23 below the smallest measured value 48 (-48%)"),
        "{message}"
    );
}

#[test]
fn mode_fit_without_evidence_falls_back_to_the_factor_and_says_so() {
    let mut thin = two_batches();
    thin.observations.truncate(1);
    let thin = memprof_analysis::batchfit::recommend(&memprof_analysis::batchfit::Evidence {
        env_var: "BATCH_SIZE",
        current: Some(64),
        limit_bytes: Some(80 << 30),
        headroom_fraction: 0.1,
        breakdown: None,
        observations: &thin.observations,
    });
    let j = job(json!("64"));
    for fit in [None, Some(&thin)] {
        let plan = build_fit(&fit_policy(4, None), &j, fit);
        assert_eq!(plan.recreate().unwrap().0[0].to, 48, "64 × 0.75");
        let summary = plan.summary();
        assert!(
            summary.starts_with("scaleBatch BATCH_SIZE 64->48 (fit: "),
            "{summary}"
        );
        assert!(summary.contains(", factor 0.75)"), "{summary}");
        let Some(Step::Event { reason, message }) = plan.steps.last() else {
            panic!("no Event: {:?}", plan.steps);
        };
        assert_eq!(reason, REASON_BATCH_FIT_FALLBACK);
        assert!(message.contains("factor 0.75"), "{message}");
    }
    let plan = build_fit(&fit_policy(4, None), &j, Some(&thin));
    assert!(plan
        .summary()
        .starts_with("scaleBatch BATCH_SIZE 64->48 (fit: too little evidence, factor 0.75)"));
    let Some(Step::Event { message, .. }) = plan.steps.last() else {
        unreachable!()
    };
    assert!(
        message.contains("1 batch size(s) observed, at least 2 needed"),
        "{message}"
    );
    // A fit at the current value contradicts the trigger: factor.
    let plan = build_fit(
        &fit_policy(4, None),
        &job(json!("25")),
        Some(&three_batches()),
    );
    assert_eq!(plan.recreate().unwrap().0[0].to, 18);
    assert!(
        plan.summary().contains("(fit says 25 fits, factor 0.75)"),
        "{}",
        plan.summary()
    );
}

#[test]
fn the_factor_mode_plan_is_unchanged_by_a_recommendation() {
    let rec = two_batches();
    let p = policy(vec![scale_batch(0.75, 4, None)]);
    let plan = build_fit(&p, &job(json!("64")), Some(&rec));
    assert_eq!(plan.summary(), "scaleBatch BATCH_SIZE 64->48");
    assert_eq!(plan.steps.len(), 1);
}

fn keep_global_batch(a: RemediationAction) -> RemediationAction {
    let mut a = a;
    a.scale_batch.as_mut().unwrap().accumulation = Some(memprof_api::AccumulationEnv {
        env: "GRAD_ACCUM_STEPS".into(),
    });
    a
}

fn with_accumulation(batch: &str, accum: Value) -> Value {
    let mut j = job(json!(batch));
    let env = &mut j["spec"]["template"]["spec"]["containers"][0]["env"];
    env.as_array_mut().unwrap().push(accum);
    j
}

#[test]
fn keeping_the_global_batch_prefers_an_exact_split_then_the_nearest_above() {
    use accum::keep_global;
    let k = |m, a, cap, min, r| {
        let k = keep_global(m, a, cap, min, r).unwrap();
        (k.micro, k.accumulation, k.exact())
    };
    assert_eq!(k(32, 1, 16, 1, None), (16, 2, true));
    // The factor allows 24; 24 does not divide 32, 16 does: 16×2 keeps it.
    assert_eq!(k(32, 1, 24, 1, None), (16, 2, true));
    // The fit allows 27 of 64: 16×4, not 22×3 = 66.
    assert_eq!(k(64, 1, 27, 1, None), (16, 4, true));
    assert_eq!(k(48, 2, 30, 1, None), (24, 4, true));
    // 7 is prime: no split; 2 steps of 4 = 8, the nearest not below 7.
    assert_eq!(k(7, 1, 5, 1, None), (4, 2, false));
    // roundTo 4 excludes 15: 2 steps of 16.
    assert_eq!(k(30, 1, 22, 1, Some(4)), (16, 2, false));
    // minimum 20 excludes 16: 2 steps of 20 = 40.
    assert_eq!(k(32, 1, 24, 20, None), (20, 2, false));
    assert_eq!(keep_global(u64::MAX, 2, 4, 1, None), None);
}

#[test]
fn keeping_the_global_batch_holds_its_bounds_for_every_small_case() {
    for micro in 2..40u64 {
        for acc in 1..4u64 {
            for cap in 1..micro {
                for min in 1..=cap {
                    for r in [None, Some(2), Some(4)] {
                        let k = accum::keep_global(micro, acc, cap, min, r).unwrap();
                        let p = micro * acc;
                        let case = (micro, acc, cap, min, r, k);
                        assert!(k.micro <= cap && k.micro >= 1, "{case:?}");
                        assert!(k.micro >= min.min(cap), "{case:?}");
                        assert!(k.micro == cap || k.micro % r.unwrap_or(1) == 0, "{case:?}");
                        assert_eq!(k.after, k.micro * k.accumulation, "{case:?}");
                        assert!(k.after >= p && k.after < p + k.micro, "{case:?}");
                        // Exact whenever an allowed divisor lies in [⌈cap/2⌉, cap].
                        let allowed = |m: u64| m == cap || (m % r.unwrap_or(1) == 0 && m >= min);
                        let divides = (cap.div_ceil(2)..=cap).any(|m| allowed(m) && p % m == 0);
                        assert_eq!(k.exact(), divides, "{case:?}");
                    }
                }
            }
        }
    }
}

#[test]
fn scale_batch_with_accumulation_keeps_micro_times_accumulation() {
    // The container does not set the var: it counts as 1 and is added.
    let p = policy(vec![keep_global_batch(scale_batch(0.75, 1, None))]);
    let plan = build_for(&p, &job(json!("32"))).unwrap();
    assert_eq!(
        plan.summary(),
        "scaleBatch BATCH_SIZE×GRAD_ACCUM_STEPS 32×1 → 16×2"
    );
    let (changes, manifest) = plan.recreate().unwrap();
    let acc = changes[0].accumulation.as_ref().unwrap();
    assert_eq!((acc.from, acc.to, acc.added), (1, 2, true));
    let env = &manifest["spec"]["template"]["spec"]["containers"][0]["env"];
    assert_eq!(env[1], json!({"name": "BATCH_SIZE", "value": "16"}));
    assert_eq!(env[2], json!({"name": "GRAD_ACCUM_STEPS", "value": "2"}));
    let ann = &manifest["metadata"]["annotations"];
    assert_eq!(ann["memprof.dev/original-grad_accum_steps"], "1");
    assert_eq!(ann["memprof.dev/original-batch_size"], "32");

    // 7 × 2 = 14 per rank; the factor allows 5; nothing in [3, 5] divides 14.
    let j = with_accumulation("7", json!({"name": "GRAD_ACCUM_STEPS", "value": "2"}));
    let plan = build_for(&p, &j).unwrap();
    assert_eq!(
        plan.summary(),
        "scaleBatch BATCH_SIZE×GRAD_ACCUM_STEPS 7×2 → 5×3 (batch per rank 14 → 15, nearest not below)"
    );
    let env = &plan.recreate().unwrap().1["spec"]["template"]["spec"]["containers"][0]["env"];
    assert_eq!(env[2], json!({"name": "GRAD_ACCUM_STEPS", "value": "3"}));
    let lines = accum::explain_lines(plan.recreate().unwrap().0, Some(4));
    assert_eq!(
        lines,
        ["keep global batch (trainer BATCH_SIZE×GRAD_ACCUM_STEPS×ranks): 7×2×4 = 56 → 5×3×4 = 60 (15 is the nearest not below 14 per rank)"]
    );
}

#[test]
fn mode_fit_with_accumulation_takes_the_largest_fitting_exact_split() {
    let mut p = fit_policy(4, None);
    p.spec.actions[0] = keep_global_batch(p.spec.actions[0].clone());
    // The fit allows 25 of 36 (backed by three measured batches, see
    // mode_fit_sets_the_computed_batch_with_minimum_and_round_to): 18×2
    // keeps 36 exactly.
    let plan = build_fit(&p, &job(json!("36")), Some(&three_batches()));
    assert!(
        plan.summary()
            .starts_with("scaleBatch BATCH_SIZE×GRAD_ACCUM_STEPS 36×1 → 18×2 (fit twoBatchSizes"),
        "{}",
        plan.summary()
    );
}

#[test]
fn an_accumulation_var_memprof_cannot_read_is_said_not_guessed() {
    let p = policy(vec![keep_global_batch(scale_batch(0.5, 1, None))]);
    let from = json!({"name": "GRAD_ACCUM_STEPS", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}});
    let err = build_for(&p, &with_accumulation("32", from)).unwrap_err();
    assert_eq!(err.reason(), "EnvNotLiteral");
    for bad in ["two", "0", ""] {
        let j = with_accumulation("32", json!({"name": "GRAD_ACCUM_STEPS", "value": bad}));
        assert_eq!(
            build_for(&p, &j).unwrap_err().reason(),
            "EnvNotANumber",
            "{bad}"
        );
    }
}

/// `scaleBatch` with `gpuMemoryRequest`: the recreated Job's GPU container
/// asks its scheduler for the recommendation (the largest role's), and
/// without a recommendation the recreated Job says why it asks for nothing.
#[test]
fn scale_batch_gives_the_recreated_job_the_recommended_gpu_memory() {
    let mut action = scale_batch(0.75, 1, None);
    action.scale_batch.as_mut().unwrap().gpu_memory_request = Some(memprof_api::GpuScheduler::Hami);
    let p = policy(vec![action]);
    let mut j = job(json!("32"));
    j["spec"]["template"]["spec"]["containers"][0]["resources"] =
        json!({"limits": {"nvidia.com/gpu": "1"}});
    let rec = |role: &str, bytes: Option<u64>| memprof_api::RoleRecommendation {
        role: role.into(),
        request_bytes: bytes,
        ..Default::default()
    };
    let mut plan = build_for(&p, &j).unwrap();
    let recs = [
        rec("a", Some(10 << 30)),
        rec("b", Some(12 << 30)),
        rec("c", None),
    ];
    with_gpu_request(&mut plan, &p, &recs);
    let (_, m) = plan.recreate().unwrap();
    let limits = &m["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"];
    assert_eq!(limits["nvidia.com/gpumem"], "12288", "{m}");
    let note = &m["metadata"]["annotations"][ANNOTATION_GPU_MEMORY_REQUEST];
    assert_eq!(note, "Hami limit nvidia.com/gpumem trainer=12288");
    let mut plan = build_for(&p, &j).unwrap();
    with_gpu_request(&mut plan, &p, &[]);
    let (_, m) = plan.recreate().unwrap();
    let limits = &m["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"];
    assert!(limits["nvidia.com/gpumem"].is_null(), "{m}");
    let note = m["metadata"]["annotations"][ANNOTATION_GPU_MEMORY_REQUEST].as_str();
    assert!(note.unwrap().contains("no recommendation yet"), "{m}");
    // A policy that does not ask leaves the recreated Job as it was.
    let plain = policy(vec![scale_batch(0.75, 1, None)]);
    let mut plan = build_for(&plain, &j).unwrap();
    let before = plan.clone();
    with_gpu_request(&mut plan, &plain, &recs);
    assert_eq!(plan, before);
}
