//! One MemoryProfile per JobSet, against the real local control plane and
//! the operator: the JobSet's child Jobs (created here as the JobSet
//! controller creates them, with their workload marks as the webhook gives
//! them; the real Job controller creates their pods) have no profile of
//! their own, and the JobSet's profile rolls every rank up by its rank in
//! the JobSet. A Job claiming the JobSet without the mark keeps its own
//! profile and never counts in the JobSet's. A workload's profile carries
//! its top-level object's labels, so `kubectl get mprof -l team=ml` and
//! `memprof top -l team=ml` select JobSets' and PyTorchJobs' profiles as
//! they do Jobs'. (Stand-in CRDs: no JobSet controller runs here.)

use crate::cli_support;
use crate::common;
use crate::workload_support;

use common::*;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use memprof::api::workload::WorkloadKind;
use memprof::api::{MemoryProfile, RiskLevel};
use serde_json::json;
use workload_support::*;

/// Creates child Job `index` of `js`, profiled (annotated, managed labels
/// as the webhook stamps them), with its workload mark as the webhook gives
/// it at creation when `marked` ([`create_child`]).
async fn child(
    admin: &Client,
    ns: &str,
    js: &kube::api::DynamicObject,
    index: u32,
    marked: bool,
) -> Job {
    let profiled = json!({"memprof.dev/enabled": "true"});
    create_child(admin, ns, js, index, profiled, marked).await
}

/// Writes the report of the one pod of child Job `job`, its sidecar
/// claiming rank 0 whatever its rank in the JobSet.
async fn report_of_child(
    admin: &Client,
    ns: &str,
    job: &str,
    peak_gib: u64,
    risk: RiskLevel,
) -> String {
    let pod = job_pods(admin, ns, job, 1).await.remove(0);
    let gpus = vec![gpu(0, peak_gib, peak_gib, risk, None)];
    apply_report(admin, ns, &pod_report(&pod, job, 0, &at(0), gpus)).await;
    pod.name_any()
}

#[tokio::test]
async fn a_jobset_gets_one_profile_rolled_up_over_its_child_jobs() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let op = start_operator(&admin, &ns.name);
    let js = create(
        &admin,
        &ns.name,
        WorkloadKind::JobSet,
        jobset("train", 2, json!({})),
    )
    .await;
    child(&admin, &ns.name, &js, 0, true).await;
    child(&admin, &ns.name, &js, 1, true).await;
    child(&admin, &ns.name, &js, 5, false).await; // claims the JobSet, unmarked
    report_of_child(&admin, &ns.name, "train-workers-0", 40, RiskLevel::Low).await;
    let hot = report_of_child(&admin, &ns.name, "train-workers-1", 76, RiskLevel::High).await;
    report_of_child(&admin, &ns.name, "train-workers-5", 79, RiskLevel::Critical).await;
    let profiles: Api<MemoryProfile> = Api::namespaced(admin.clone(), &ns.name);
    let profile = eventually("the JobSet's profile with both ranks", || async {
        let p = profiles
            .get_opt("train")
            .await
            .map_err(|e| e.to_string())?
            .ok_or("no profile")?;
        let st = p.status.clone().unwrap_or_default();
        (st.ranks == "2/2")
            .then_some(p)
            .ok_or(format!("ranks {:?}", st.ranks))
    })
    .await;
    let st = profile.status.clone().unwrap();
    let bottleneck = st.bottleneck.unwrap();
    assert_eq!(
        (bottleneck.rank, bottleneck.pod.as_str()),
        (Some(1), hot.as_str()),
        "ranked in the JobSet"
    );
    assert!(
        (st.imbalance.unwrap() - 76.0 / 58.0).abs() < 0.01,
        "{:?}",
        st.imbalance
    );
    assert_eq!(
        st.risk,
        RiskLevel::High,
        "the unmarked Job's critical report does not count"
    );
    let owner = &profile.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("JobSet", js.metadata.uid.as_deref().unwrap())
    );
    assert_eq!(
        profile
            .labels()
            .get("memprof.dev/workload-kind")
            .map(String::as_str),
        Some("JobSet")
    );
    // The children have no profile of their own; the unmarked claimant does.
    for child in ["train-workers-0", "train-workers-1"] {
        assert!(
            profiles.get_opt(child).await.unwrap().is_none(),
            "{child} has a profile"
        );
    }
    eventually("the unmarked Job's own profile", || async {
        profiles
            .get_opt("train-workers-5")
            .await
            .map_err(|e| e.to_string())?
            .map(|_| ())
            .ok_or("none".to_string())
    })
    .await;
    // `kubectl get memoryprofiles` names each profile's kind and workload.
    let out = std::process::Command::new("kubectl")
        .args(["get", "memoryprofiles", "-n", &ns.name])
        .output()
        .expect("kubectl");
    let text = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<Vec<&str>> = text
        .lines()
        .map(|l| l.split_whitespace().take(3).collect())
        .collect();
    assert_eq!(
        rows.first().map(Vec::as_slice),
        Some(&["NAME", "KIND", "JOB"][..]),
        "{text}"
    );
    assert!(rows.contains(&vec!["train", "JobSet", "train"]), "{text}");
    assert!(
        rows.contains(&vec!["train-workers-5", "Job", "train-workers-5"]),
        "{text}"
    );
    op.stop().await;
}

/// A child Job that got a profile of its own while its link did not prove
/// yet (the JobSet or the admission key not read at its first reconcile:
/// seen once in the 2,048-rank benchmark) loses it once it proves its
/// JobSet's child: one profile per workload.
#[tokio::test]
async fn a_child_s_own_profile_from_before_its_link_proved_is_deleted() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let js = create(
        &admin,
        &ns.name,
        WorkloadKind::JobSet,
        jobset("early", 1, json!({})),
    )
    .await;
    let job = child(&admin, &ns.name, &js, 0, true).await;
    let profiles: Api<MemoryProfile> = Api::namespaced(admin.clone(), &ns.name);
    let mut own = MemoryProfile::new(
        "early-workers-0",
        memprof::api::MemoryProfileSpec {
            job_name: "early-workers-0".into(),
            expected_ranks: Some(1),
        },
    );
    own.metadata.labels = Some([("memprof.dev/job".into(), "early-workers-0".into())].into());
    own.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "batch/v1".into(),
            kind: "Job".into(),
            name: job.name_any(),
            uid: job.uid().unwrap(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        },
    ]);
    profiles.create(&PostParams::default(), &own).await.unwrap();
    let _op = start_operator(&admin, &ns.name);
    eventually(
        "the child's own profile deleted, the JobSet's made",
        || async {
            let child = profiles
                .get_opt("early-workers-0")
                .await
                .map_err(|e| e.to_string())?;
            let top = profiles.get_opt("early").await.map_err(|e| e.to_string())?;
            (child.is_none() && top.is_some())
                .then_some(())
                .ok_or(format!("child {} top {}", child.is_some(), top.is_some()))
        },
    )
    .await;
}

/// Names of the MemoryProfiles `kubectl get ARGS -o name` lists, sorted.
pub(crate) async fn kubectl_names(args: &[&str]) -> Result<Vec<String>, String> {
    let mut cmd = tokio::process::Command::new("kubectl");
    cmd.args(["get", "memoryprofiles", "-o", "name"])
        .args(args)
        .kill_on_drop(true);
    let out = tokio::time::timeout(TIMEOUT, cmd.output())
        .await
        .map_err(|_| format!("kubectl {args:?} did not finish within {TIMEOUT:?}"))?
        .map_err(|e| format!("running kubectl: {e}"))?;
    let (stdout, stderr) = cli_support::texts(&out);
    if !out.status.success() {
        return Err(format!("kubectl {args:?}: {stderr}"));
    }
    let mut names: Vec<String> = stdout.lines().map(str::to_string).collect();
    names.sort();
    Ok(names)
}

/// Creates profiled JobSet `name` labelled `team` with one marked child
/// Job, which is labelled `child_team` (the JobSet's profile must not take it).
async fn labelled_jobset(admin: &Client, ns: &str, name: &str, team: &str, child_team: &str) {
    let mut manifest = jobset(
        name,
        1,
        json!({"team": team, "memprof.dev/managed": "true"}),
    );
    manifest["metadata"]["annotations"] = json!({"memprof.dev/enabled": "true"});
    let js = create(admin, ns, WorkloadKind::JobSet, manifest).await;
    let job = child(admin, ns, &js, 0, true).await;
    let label = json!({"metadata": {"labels": {"team": child_team}}});
    Api::<Job>::namespaced(admin.clone(), ns)
        .patch(
            &job.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&label),
        )
        .await
        .expect("label the child Job");
}

/// A JobSet's and a PyTorchJob's profiles carry their own labels (never a
/// child Job's), so `-l team=ml` lists them, in kubectl and in `memprof
/// top`, and not another team's JobSet whose child claims `team=ml`.
#[tokio::test]
async fn a_workloads_labels_select_its_profile_in_kubectl_and_memprof_top() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let n = ns.name.as_str();
    let op = start_operator(&admin, n);
    labelled_jobset(&admin, n, "js", "ml", "child-says").await;
    labelled_jobset(&admin, n, "other", "infra", "ml").await;
    let mut pt = pytorchjob(
        "pt",
        1,
        json!({"team": "ml", "memprof.dev/managed": "true"}),
    );
    pt["metadata"]["annotations"] = json!({"memprof.dev/enabled": "true"});
    create(&admin, n, WorkloadKind::PyTorchJob, pt).await;
    let ml = [
        "memoryprofile.memprof.dev/js",
        "memoryprofile.memprof.dev/pt",
    ];
    eventually(
        "the JobSet's and the PyTorchJob's profiles selected",
        || async {
            let all = kubectl_names(&["-n", n]).await?;
            let selected = kubectl_names(&["-n", n, "-l", "team=ml"]).await?;
            // Every profile made (the other team's too), and only team ml's selected.
            (all.len() == 3 && selected == ml)
                .then_some(())
                .ok_or(format!("all {all:?}, team=ml {selected:?}"))
        },
    )
    .await;
    let top = cli_support::ok(&["top", "-n", n, "-l", "team=ml", "-o", "name"]).await;
    let mut listed: Vec<&str> = top.lines().collect();
    listed.sort();
    assert_eq!(listed, ml, "memprof top -l team=ml:\n{top}");
    let infra = kubectl_names(&["-n", n, "-l", "team=infra"]).await.unwrap();
    assert_eq!(infra, ["memoryprofile.memprof.dev/other"]);
    op.stop().await;
}
