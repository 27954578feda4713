//! The operator against a real kube-apiserver + kube-controller-manager
//! (`hack/local-cluster.sh up`). Without a cluster every test says it skipped
//! and passes; `MEMPROF_REQUIRE_CLUSTER=1` makes a missing cluster a failure.
//!
//! Each test runs in its own namespace with its own in-process operator
//! watching only that namespace, so tests run in parallel without seeing each
//! other's Jobs. No scheduler or kubelet: the Job controller's pods stay
//! Pending, and reports are written the way the sidecar writes them.

use crate::common;

use common::*;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use memprof::api::{
    Cause, MemoryProfile, MemoryProfileStatus, MemoryReport, NamedCause, RiskLevel,
    ANNOTATION_BOTTLENECK, ANNOTATION_IMBALANCE, ANNOTATION_OOM_RISK, ANNOTATION_TIME_TO_OOM,
};

async fn profile_status(
    profiles: &Api<MemoryProfile>,
    name: &str,
) -> Result<MemoryProfileStatus, String> {
    match profiles.get_opt(name).await {
        Ok(Some(p)) => p
            .status
            .ok_or_else(|| "profile has no status yet".to_string()),
        Ok(None) => Err("no profile yet".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// Waits until the profile's status satisfies `ok`, and returns it.
async fn wait_status(
    profiles: &Api<MemoryProfile>,
    name: &str,
    what: &str,
    ok: impl Fn(&MemoryProfileStatus) -> bool,
) -> MemoryProfileStatus {
    eventually(what, || async {
        let st = profile_status(profiles, name).await?;
        if ok(&st) {
            Ok(st)
        } else {
            Err(format!("{st:?}"))
        }
    })
    .await
}

/// Waits until `reason` Events about `regarding` number exactly `n`.
async fn wait_events(client: &Client, ns: &str, reason: &str, regarding: &str, n: i32) {
    eventually(&format!("{n} {reason} event(s) on {regarding}"), || async {
        let seen = count_events(client, ns, reason, regarding).await;
        if seen == n {
            Ok(())
        } else {
            Err(format!("{seen} event(s)"))
        }
    })
    .await
}

/// Rewrites rank 0's report with a newer `sampledAt` and a peak above every
/// other rank's (79 GiB + (`t` mod 8) × 100 MiB, under the GPU's 80 GiB:
/// the `peak` text a user reads changes with `t`), and waits until the
/// status shows that peak:
/// proof that the operator reconciled everything before. (Not
/// `lastReportTime`, nor a peak that moves less than its text shows: a
/// change of those alone is written at most every 30 s.)
async fn nudge(client: &Client, ns: &str, profiles: &Api<MemoryProfile>, job: &str, t: u64) {
    let mut g = gpu(0, 79, 79, RiskLevel::Low, None);
    let peak = 79 * GIB + (t % 8) * (100 << 20);
    (g.used_bytes, g.peak_bytes) = (peak, peak);
    let r = rank_report(client, ns, job, 0, &at(t), vec![g]).await;
    apply_report(client, ns, &r).await;
    wait_status(profiles, job, "the nudge's peak to show", |st| {
        st.peak_used_bytes == peak
    })
    .await;
}

#[tokio::test]
async fn annotated_job_gets_a_profile_owned_by_the_job() {
    let Some(client) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&client).await;
    let _op = start_operator(&client, &ns.name);
    let job = create_job(&client, &ns.name, "train", 3, true).await;
    let profiles: Api<MemoryProfile> = Api::namespaced(client.clone(), &ns.name);

    let st = wait_status(&profiles, "train", "a status saying no report yet", |st| {
        st.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && !c.is_true())
    })
    .await;
    assert_eq!(st.ranks, "0/3");
    let profile = profiles.get("train").await.unwrap();
    assert_eq!(profile.spec.job_name, "train");
    assert_eq!(profile.spec.expected_ranks, Some(3));
    let owner = &profile.owner_references()[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("Job", "train"));
    assert_eq!(Some(owner.uid.clone()), job.uid());
    assert_eq!(owner.block_owner_deletion, Some(true));
    assert_eq!(owner.controller, Some(false));

    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns.name);
    eventually("the Job to carry memprof annotations", || async {
        let job = jobs.get("train").await.map_err(|e| e.to_string())?;
        match job.annotations().get(ANNOTATION_OOM_RISK) {
            Some(risk) if risk == "none" => Ok(()),
            other => Err(format!("oom-risk annotation {other:?}")),
        }
    })
    .await;

    // The Job's sidecars (service account `default`) may write their reports, and only that.
    let roles: Api<k8s_openapi::api::rbac::v1::Role> = Api::namespaced(client.clone(), &ns.name);
    let role = roles
        .get(memprof::operator::REPORTER_ROLE)
        .await
        .expect("the reporter Role exists");
    let rules = role.rules.unwrap_or_default();
    assert_eq!(rules.len(), 1);
    assert_eq!(
        rules[0].resources.as_deref(),
        Some(&["memoryreports".to_string()][..])
    );
    assert_eq!(rules[0].verbs, vec!["create", "get", "patch"]);
    let bindings: Api<k8s_openapi::api::rbac::v1::RoleBinding> =
        Api::namespaced(client.clone(), &ns.name);
    let binding = bindings
        .get(&memprof::operator::binding_name("default"))
        .await
        .expect("the reporter RoleBinding exists");
    let subject = &binding.subjects.unwrap_or_default()[0];
    assert_eq!(
        (subject.kind.as_str(), subject.name.as_str()),
        ("ServiceAccount", "default")
    );
}

#[tokio::test]
async fn reports_roll_up_into_status_annotations_and_one_event_per_transition() {
    let Some(client) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&client).await;
    let _op = start_operator(&client, &ns.name);
    create_job(&client, &ns.name, "llm", 4, true).await;
    let profiles: Api<MemoryProfile> = Api::namespaced(client.clone(), &ns.name);

    // The leaking rank first, so the job's risk goes none → high in one step.
    // A time to OOM of an hour as the sidecar saw it; the profile shows it
    // aged by the report's age (`at()` is in the past).
    let mut leaking = gpu(3, 50, 50, RiskLevel::High, Some(3600.0));
    let named = NamedCause::new(
        Cause::Leak,
        "device memory rises 95.4MiB/s in 9 regular steps",
    );
    leaking.cause = Some(named.clone());
    let r = rank_report(&client, &ns.name, "llm", 3, &at(3), vec![leaking]).await;
    apply_report(&client, &ns.name, &r).await;
    wait_status(&profiles, "llm", "risk high", |st| {
        st.risk == RiskLevel::High
    })
    .await;
    for (rank, peak) in [(0, 40), (1, 40), (2, 60)] {
        let g = gpu(rank, peak, peak, RiskLevel::Low, None);
        apply_report(
            &client,
            &ns.name,
            &rank_report(&client, &ns.name, "llm", rank, &at(rank as u64), vec![g]).await,
        )
        .await;
    }
    let st = wait_status(&profiles, "llm", "4 ranks rolled up", |st| {
        st.ranks_reporting == 4
    })
    .await;
    assert_eq!((st.ranks.as_str(), st.gpu_count), ("4/4", 4));
    assert_eq!(st.risk, RiskLevel::High);
    let tto = st.time_to_oom_seconds.expect("a time to OOM");
    let reported: jiff::Timestamp = at(3).parse().unwrap();
    let aged = 3600.0
        - jiff::Timestamp::now()
            .duration_since(reported)
            .as_secs_f64();
    assert!((tto - aged).abs() < 60.0, "{tto} s, aged {aged} s");
    assert!(st.time_to_oom.is_some());
    assert_eq!(st.imbalance_display.as_deref(), Some("1.26")); // 60 / mean(40, 40, 60, 50)
    assert!(st.imbalance.unwrap() > 1.0);
    assert_eq!(st.bottleneck.as_ref().and_then(|b| b.rank), Some(3));
    assert_eq!(st.peak_used_bytes, 60 * GIB);
    assert!(st.leak_suspected);
    assert_eq!(st.top_ranks[0].location.rank, Some(3));
    // The bottleneck's cause, with its evidence, in the profile and the Event.
    assert_eq!(st.cause.as_ref(), Some(&named));
    assert_eq!(st.top_ranks[0].cause, Some(Cause::Leak));

    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns.name);
    let annotations = eventually("the Job annotations to match the status", || async {
        let job = jobs.get("llm").await.map_err(|e| e.to_string())?;
        let a = job.annotations().clone();
        // One decimal on the Job (hysteresis: `reconcile/annotations.rs`).
        if a.get(ANNOTATION_IMBALANCE).map(String::as_str) == Some("1.3") {
            Ok(a)
        } else {
            Err(format!("{a:?}"))
        }
    })
    .await;
    assert_eq!(annotations[ANNOTATION_OOM_RISK], "high");
    assert!(
        annotations[ANNOTATION_TIME_TO_OOM].ends_with('m'),
        "{annotations:?}"
    );
    assert_eq!(
        annotations[ANNOTATION_BOTTLENECK],
        format!("rank=3 pod={} node=node-3 gpu=0", r.spec.pod_name)
    );
    wait_events(&client, &ns.name, "RiskHigh", "llm", 1).await;
    let notes = event_notes(&client, &ns.name, "RiskHigh", "llm").await;
    assert!(
        notes[0].contains(&format!("; cause {};", named.line())),
        "{notes:?}"
    );

    // The leak is fixed: high → low once low held for the dwell (60 s), one RiskLoweredToLow.
    let fixed = gpu(3, 50, 50, RiskLevel::Low, None);
    let r = rank_report(&client, &ns.name, "llm", 3, &at(10), vec![fixed]).await;
    apply_report(&client, &ns.name, &r).await;
    wait_status(&profiles, "llm", "risk held high", |st| {
        st.risk == RiskLevel::High && st.risk_held_until.is_some()
    })
    .await;
    eventually_within(
        std::time::Duration::from_secs(100),
        "risk low after the dwell",
        || async {
            let st = profile_status(&profiles, "llm").await?;
            (st.risk == RiskLevel::Low)
                .then_some(())
                .ok_or(format!("{:?}", st.risk))
        },
    )
    .await;
    wait_events(&client, &ns.name, "RiskLoweredToLow", "llm", 1).await;

    // More reconciles, no more events.
    nudge(&client, &ns.name, &profiles, "llm", 20).await;
    nudge(&client, &ns.name, &profiles, "llm", 21).await;
    assert_eq!(count_events(&client, &ns.name, "RiskHigh", "llm").await, 1);
    assert_eq!(
        count_events(&client, &ns.name, "RiskLoweredToLow", "llm").await,
        1
    );
}

#[tokio::test]
async fn namespaced_install_leaves_jobs_outside_its_namespaces_alone() {
    let Some(client) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&client).await;
    // Watching this namespace, but allowed to act only elsewhere (what the
    // chart's rbac.namespaces renders as --allowed-namespaces).
    let opts = memprof::operator::Options {
        allowed_namespaces: vec!["team-elsewhere".into()],
        ..memprof::operator::Options::for_namespace(&ns.name)
    };
    let op = start_operator_with(&client, opts);
    create_job(&client, &ns.name, "outside", 1, true).await;
    let profiles: Api<MemoryProfile> = Api::namespaced(client.clone(), &ns.name);
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns.name);
    memprof_stays_away(&profiles, &jobs, "outside").await;
    op.stop().await;

    // The same Job in an allowed namespace is profiled.
    let opts = memprof::operator::Options {
        allowed_namespaces: vec![ns.name.clone()],
        ..memprof::operator::Options::for_namespace(&ns.name)
    };
    let op = start_operator_with(&client, opts);
    eventually("the Job profiled once its namespace is allowed", || async {
        profiles
            .get_opt("outside")
            .await
            .map_err(|e| e.to_string())?
            .map(|_| ())
            .ok_or_else(|| "no profile".to_string())
    })
    .await;
    op.stop().await;
}

/// No profile and no memprof annotation on Job `name` for a few seconds.
async fn memprof_stays_away(profiles: &Api<MemoryProfile>, jobs: &Api<Job>, name: &str) {
    for _ in 0..12 {
        assert!(
            profiles.get_opt(name).await.unwrap().is_none(),
            "no profile"
        );
        let job = jobs.get(name).await.unwrap();
        assert!(
            !job.annotations().contains_key(ANNOTATION_OOM_RISK),
            "no annotation"
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

#[tokio::test]
async fn job_without_the_annotation_is_ignored() {
    let Some(client) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&client).await;
    let _op = start_operator(&client, &ns.name);
    // The plain Job first: by the time the profiled one is done, it was seen.
    create_job(&client, &ns.name, "plain", 2, false).await;
    create_job(&client, &ns.name, "profiled", 2, true).await;
    let profiles: Api<MemoryProfile> = Api::namespaced(client.clone(), &ns.name);
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns.name);
    eventually("the profiled Job to be annotated", || async {
        let job = jobs.get("profiled").await.map_err(|e| e.to_string())?;
        job.annotations()
            .get(ANNOTATION_OOM_RISK)
            .map(|_| ())
            .ok_or_else(|| "no annotation yet".to_string())
    })
    .await;
    assert!(profiles.get_opt("plain").await.unwrap().is_none());
    let plain = jobs.get("plain").await.unwrap();
    assert!(plain
        .annotations()
        .keys()
        .all(|k| !k.starts_with("memprof.dev/")));
}

#[tokio::test]
async fn a_restarted_operator_emits_no_duplicate_events() {
    let Some(client) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&client).await;
    let first = start_operator(&client, &ns.name);
    create_job(&client, &ns.name, "restart", 2, true).await;
    let profiles: Api<MemoryProfile> = Api::namespaced(client.clone(), &ns.name);
    let hot = gpu(1, 70, 78, RiskLevel::Critical, Some(30.0));
    let r = rank_report(&client, &ns.name, "restart", 1, &at(1), vec![hot]).await;
    apply_report(&client, &ns.name, &r).await;
    wait_status(&profiles, "restart", "risk critical", |st| {
        st.risk == RiskLevel::Critical
    })
    .await;
    wait_events(&client, &ns.name, "RiskCritical", "restart", 1).await;
    first.stop().await;

    let second = start_operator(&client, &ns.name);
    nudge(&client, &ns.name, &profiles, "restart", 5).await;
    // The writer counts a write once its answer is back, which can be just
    // after the status shows (a loaded API server): wait for the count.
    eventually("the nudge's write, and only it, counted", || async {
        match second.metrics.status_writes.get() {
            1 => Ok(()),
            n => Err(format!("{n} status writes")),
        }
    })
    .await;
    assert_eq!(
        count_events(&client, &ns.name, "RiskCritical", "restart").await,
        1
    );
    for lowered in ["RiskLoweredToHigh", "RiskLoweredToLow", "RiskLoweredToNone"] {
        assert_eq!(count_events(&client, &ns.name, lowered, "restart").await, 0);
    }
    second.stop().await;
}

#[tokio::test]
async fn deleting_the_job_garbage_collects_its_profile() {
    let Some(client) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&client).await;
    let _op = start_operator(&client, &ns.name);
    let profiles: Api<MemoryProfile> = Api::namespaced(client.clone(), &ns.name);
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns.name);
    for name in ["background", "foreground"] {
        create_job(&client, &ns.name, name, 1, true).await;
    }
    for name in ["background", "foreground"] {
        eventually(&format!("profile {name}"), || async {
            match profiles.get_opt(name).await {
                Ok(Some(_)) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    }
    jobs.delete("background", &DeleteParams::background())
        .await
        .unwrap();
    jobs.delete("foreground", &DeleteParams::foreground())
        .await
        .unwrap();
    for name in ["background", "foreground"] {
        eventually_within(
            GC_TIMEOUT,
            &format!("profile {name} to be garbage-collected"),
            || async {
                match profiles.get_opt(name).await {
                    Ok(None) => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await;
    }
}

#[tokio::test]
async fn impossible_report_is_ignored_with_a_condition_and_one_event() {
    let Some(client) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&client).await;
    let _op = start_operator(&client, &ns.name);
    // Five pods, four valid reports; the fifth pod's sidecar writes nonsense.
    create_job(&client, &ns.name, "val", 5, true).await;
    let profiles: Api<MemoryProfile> = Api::namespaced(client.clone(), &ns.name);
    for rank in 0..4 {
        let g = gpu(
            rank,
            40 + rank as u64,
            40 + rank as u64,
            RiskLevel::Low,
            None,
        );
        apply_report(
            &client,
            &ns.name,
            &rank_report(&client, &ns.name, "val", rank, &at(rank as u64), vec![g]).await,
        )
        .await;
    }
    let before = wait_status(&profiles, "val", "4 ranks", |st| st.ranks_reporting == 4).await;

    // usedBytes > totalBytes: the schema cannot say it, the operator must.
    let mut bad = gpu(4, 90, 90, RiskLevel::Critical, Some(1.0));
    bad.total_bytes = 80 * GIB;
    let bad = rank_report(&client, &ns.name, "val", 4, &at(100), vec![bad]).await;
    let bad_name = bad.name_any();
    apply_report(&client, &ns.name, &bad).await;
    let after = wait_status(&profiles, "val", "ReportsValid=False", |st| {
        st.conditions
            .iter()
            .any(|c| c.type_ == "ReportsValid" && !c.is_true())
    })
    .await;
    let cond = after
        .conditions
        .iter()
        .find(|c| c.type_ == "ReportsValid")
        .unwrap();
    assert!(
        cond.message
            .contains(&format!("{bad_name} (gpu 0: usedBytes")),
        "{}",
        cond.message
    );
    let without_conditions = |st: &MemoryProfileStatus| MemoryProfileStatus {
        conditions: vec![],
        ..st.clone()
    };
    assert_eq!(without_conditions(&after), without_conditions(&before));
    wait_events(&client, &ns.name, "ReportRejected", "val", 1).await;

    nudge(&client, &ns.name, &profiles, "val", 200).await;
    nudge(&client, &ns.name, &profiles, "val", 201).await;
    assert_eq!(
        count_events(&client, &ns.name, "ReportRejected", "val").await,
        1
    );
}

#[tokio::test]
async fn api_server_rejects_negative_bytes_unknown_risk_and_bad_timelines_naming_the_field() {
    let Some(client) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&client).await;
    let reports: Api<MemoryReport> = Api::namespaced(client.clone(), &ns.name);
    let valid = report(
        "schema",
        0,
        &at(0),
        vec![gpu(0, 1, 1, RiskLevel::Low, None)],
    );
    let params = PatchParams::apply(memprof::api::SIDECAR_MANAGER).force();

    for (field, value, expect) in [
        ("usedBytes", serde_json::json!(-1), "usedBytes"),
        ("risk", serde_json::json!("severe"), "risk"),
        // The packed timeline: its shape and its length are the CRD's, so
        // every stored report decodes (crates/api/src/report/timeline.rs).
        (
            "packedTimeline",
            serde_json::json!("1790000000:1:1 10:x:1"),
            "packedTimeline",
        ),
        (
            "packedTimeline",
            serde_json::json!("1790000000:1:1,10:1:1"),
            "packedTimeline",
        ),
        (
            "packedTimeline",
            serde_json::json!("1:1:1 ".repeat(400).trim_end()),
            "packedTimeline",
        ),
    ] {
        let mut body = serde_json::to_value(&valid).unwrap();
        body["spec"]["gpus"][0][field] = value.clone();
        let err = reports
            .patch("schema-0", &params, &Patch::Apply(&body))
            .await
            .expect_err(&format!("the API server must reject {field}: {value}"));
        let kube::Error::Api(status) = err else {
            panic!("not an API error: {err}")
        };
        assert_eq!(status.code, 422, "{status:?}");
        assert!(
            status.message.contains(expect),
            "message should name {expect}: {}",
            status.message
        );
    }
}

#[tokio::test]
async fn one_leader_at_a_time_and_a_standby_takes_over() {
    use k8s_openapi::api::coordination::v1::Lease;
    use memprof::operator::Elector;
    use std::time::Duration;

    let Some(client) = cluster().await else {
        return;
    };
    let ns = TestNamespace::create(&client).await;
    let lease = "memprof-operator";
    let holder = || async {
        let l = Api::<Lease>::namespaced(client.clone(), &ns.name)
            .get(lease)
            .await
            .unwrap();
        l.spec.and_then(|s| s.holder_identity)
    };
    let ttl = Duration::from_secs(2);
    let mut a = Elector::new(client.clone(), &ns.name, lease, "replica-a", ttl);
    let mut b = Elector::new(client.clone(), &ns.name, lease, "replica-b", ttl);

    assert!(a.try_acquire_or_renew().await.unwrap());
    assert!(
        !b.try_acquire_or_renew().await.unwrap(),
        "a holds a fresh lease"
    );
    assert!(a.try_acquire_or_renew().await.unwrap(), "the holder renews");

    // A graceful shutdown releases the lease: the standby takes it at once.
    a.release().await.unwrap();
    tokio::time::timeout(TIMEOUT, b.acquire())
        .await
        .expect("b takes a released lease")
        .unwrap();
    assert_eq!(holder().await.as_deref(), Some("replica-b"));

    // b "crashes" (stops renewing, never releases): a takes over once the
    // record has not changed for the lease duration on a's own clock.
    tokio::time::timeout(TIMEOUT, a.acquire())
        .await
        .expect("a takes over an expired lease")
        .unwrap();
    assert_eq!(holder().await.as_deref(), Some("replica-a"));
    assert!(!b.try_acquire_or_renew().await.unwrap(), "b lost it");
}
