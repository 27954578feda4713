//! A Kubeflow PyTorchJob profiled end to end, against the real local
//! control plane, the webhook (on its secret path) and the operator: one
//! MemoryProfile named after the PyTorchJob and owned by it, ranked master
//! then workers (torchrun's RANK); a tenant's pod claiming the PyTorchJob
//! does not count in it; a Job of the same name does not take its profile;
//! the webhook injects the sidecar into each replica's template. No
//! training operator runs here: the test plays it, creating the pods as
//! its identity (impersonated), with the stand-in CRD of
//! tests/fixtures/workloads (docs/security.md, "Workloads").

use crate::common;
use crate::tenant_support;
use crate::workload_support;

use common::*;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use memprof::api::workload::WorkloadKind;
use memprof::api::{MemoryProfile, RiskLevel};
use serde_json::{json, Value};
use tenant_support::*;
use workload_support::*;

/// A profiled PyTorchJob of one master and `workers` workers, as the
/// webhook leaves it (annotated, labelled managed).
async fn profiled(admin: &Client, ns: &str, name: &str, workers: u32) -> DynamicObject {
    let mut manifest = pytorchjob(name, workers, json!({"memprof.dev/managed": "true"}));
    manifest["metadata"]["annotations"] = json!({"memprof.dev/enabled": "true"});
    create(admin, ns, WorkloadKind::PyTorchJob, manifest).await
}

async fn create_pod(client: &Client, ns: &str, manifest: Value) -> Pod {
    let pod: Pod = serde_json::from_value(manifest).unwrap();
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await
        .expect("create the pod")
}

/// The profile `name` once `done` holds for it.
async fn profile_when(
    admin: &Client,
    ns: &str,
    name: &str,
    what: &str,
    done: impl Fn(&MemoryProfile) -> Result<(), String>,
) -> MemoryProfile {
    let profiles: Api<MemoryProfile> = Api::namespaced(admin.clone(), ns);
    eventually(what, || async {
        let p = profiles
            .get_opt(name)
            .await
            .map_err(|e| e.to_string())?
            .ok_or("no profile")?;
        done(&p).map(|()| p)
    })
    .await
}

/// One profile for a PyTorchJob of a master and two workers, ranked as
/// torchrun numbers them (master 0 → 0, worker i → i + 1), counting only
/// the pods the training operator's identity created: a tenant's pod with
/// the PyTorchJob's controller reference and labels has no mark, and its
/// critical report does not count.
#[tokio::test]
async fn a_pytorchjob_gets_one_profile_ranked_master_then_workers() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let hooks = pytorch_admission(&admin, &ns.name).await;
    let operator = user_with(&admin, &ns.name, TRAINING_OPERATOR, pod_creator_rules()).await;
    let tenant_name = format!("tenant-{}", ns.name);
    let tenant = user_with(&admin, &ns.name, &tenant_name, pod_creator_rules()).await;
    let op = start_operator(&admin, &ns.name);
    let pt = profiled(&admin, &ns.name, "train", 2).await;
    let pods = pytorch_pods(&operator, &ns.name, &pt).await;
    let mut claim = pytorch_pod(&pt, "worker", 1);
    claim["metadata"]["name"] = json!("train-worker-9");
    let forged = create_pod(&tenant, &ns.name, claim).await;
    assert!(
        workload_mark(&pods[2].metadata).is_some(),
        "the operator's pod is marked"
    );
    assert!(
        workload_mark(&forged.metadata).is_none(),
        "the tenant's is not"
    );
    // The sidecars' writes: signed here as the writers webhook would (the
    // hooks are taken down first so that they do not unmark them).
    hooks.stop().await;
    for (pod, (peak, risk, claimed)) in pods.iter().chain([&forged]).zip([
        (40, RiskLevel::Low, 0),
        (50, RiskLevel::Low, 0),
        (76, RiskLevel::High, 0),
        (79, RiskLevel::Critical, 0),
    ]) {
        let gpus = vec![gpu(0, peak, peak, risk, None)];
        apply_report(
            &admin,
            &ns.name,
            &pod_report(pod, "train", claimed, &at(0), gpus),
        )
        .await;
    }
    let profile = profile_when(
        &admin,
        &ns.name,
        "train",
        "the PyTorchJob's profile with 3 ranks",
        |p| {
            let st = p.status.clone().unwrap_or_default();
            (st.ranks == "3/3")
                .then_some(())
                .ok_or(format!("ranks {:?}", st.ranks))
        },
    )
    .await;
    let st = profile.status.clone().unwrap();
    let bottleneck = st.bottleneck.unwrap();
    assert_eq!(
        (bottleneck.rank, bottleneck.pod.as_str()),
        (Some(2), "train-worker-1"),
        "worker 1 is rank 2, after the master and worker 0"
    );
    assert_eq!(
        st.risk,
        RiskLevel::High,
        "the tenant's critical report does not count"
    );
    let owner = &profile.owner_references()[0];
    assert_eq!(
        (
            owner.kind.as_str(),
            owner.uid.as_str(),
            profile.owner_references().len()
        ),
        ("PyTorchJob", pt.metadata.uid.as_deref().unwrap(), 1)
    );
    assert_eq!(
        profile
            .labels()
            .get("memprof.dev/workload-kind")
            .map(String::as_str),
        Some("PyTorchJob")
    );
    assert_eq!(profile.spec.expected_ranks, Some(3));
    // `kubectl get memoryprofiles` names the kind and the workload.
    let out = std::process::Command::new("kubectl")
        .args(["get", "memoryprofiles", "-n", &ns.name])
        .output()
        .expect("kubectl");
    let text = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<Vec<&str>> = text
        .lines()
        .map(|l| l.split_whitespace().take(3).collect())
        .collect();
    assert!(
        rows.contains(&vec!["train", "PyTorchJob", "train"]),
        "{text}"
    );
    // Switched off: its profile goes.
    let off = json!({"metadata": {"annotations": {"memprof.dev/enabled": "false"}}});
    api(&admin, &ns.name, WorkloadKind::PyTorchJob)
        .patch("train", &PatchParams::default(), &Patch::Merge(&off))
        .await
        .unwrap();
    let profiles: Api<MemoryProfile> = Api::namespaced(admin.clone(), &ns.name);
    eventually("the profile deleted once profiling is off", || async {
        match profiles.get_opt("train").await {
            Ok(None) => Ok(()),
            other => Err(format!("{:?}", other.map(|p| p.map(|p| p.uid())))),
        }
    })
    .await;
    op.stop().await;
}

/// A tenant's Job named like the PyTorchJob neither takes over nor flaps
/// its profile: the profile stays the PyTorchJob's (its one owner), and
/// the Job gets a Warning saying whose the name's profile is.
#[tokio::test]
async fn a_job_named_like_a_pytorchjob_does_not_take_its_profile() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let op = start_operator(&admin, &ns.name);
    let pt = profiled(&admin, &ns.name, "train", 1).await;
    let pt_uid = pt.metadata.uid.clone().unwrap();
    let owned_by_pt = |p: &MemoryProfile| {
        let owners: Vec<_> = p.owner_references().iter().map(|o| o.uid.clone()).collect();
        (owners == [pt_uid.clone()])
            .then_some(())
            .ok_or(format!("owners {owners:?}"))
    };
    let first = profile_when(
        &admin,
        &ns.name,
        "train",
        "the PyTorchJob's profile",
        owned_by_pt,
    )
    .await;
    let job: Job = serde_json::from_value(json!({
        "metadata": {"name": "train", "labels": {"memprof.dev/managed": "true"},
                     "annotations": {"memprof.dev/enabled": "true"}},
        "spec": {"template": {"metadata": {"labels": {"memprof.dev/managed": "true"}},
                 "spec": {"restartPolicy": "Never",
                          "containers": [{"name": "trainer", "image": "busybox"}]}}}
    }))
    .unwrap();
    let job = Api::<Job>::namespaced(admin.clone(), &ns.name)
        .create(&PostParams::default(), &job)
        .await
        .unwrap();
    // The Job's reconciles (its creation, its pods, the profile's events)
    // come and go; the profile stays the same object, the PyTorchJob's alone.
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    let profiles: Api<MemoryProfile> = Api::namespaced(admin.clone(), &ns.name);
    let now = profiles.get("train").await.unwrap();
    assert_eq!(owned_by_pt(&now), Ok(()), "the Job took the profile");
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(admin.clone(), &ns.name);
    let job_uid = job.uid().unwrap();
    eventually(
        "a Warning on the Job that the name's profile is taken",
        || async {
            let list = events
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            list.items
                .iter()
                .any(|e| {
                    e.reason.as_deref() == Some("ProfileNameTaken")
                        && e.regarding.as_ref().and_then(|r| r.uid.as_deref())
                            == Some(job_uid.as_str())
                })
                .then_some(())
                .ok_or("none yet".to_string())
        },
    )
    .await;
    assert_eq!(now.uid(), first.uid());
    assert_eq!(
        now.labels()
            .get("memprof.dev/workload-kind")
            .map(String::as_str),
        Some("PyTorchJob")
    );
    op.stop().await;
}

/// The webhook injects the sidecar into each replica's pod template of an
/// annotated PyTorchJob, telling it the PyTorchJob's name (its reports then
/// claim the PyTorchJob), and labels the PyTorchJob for the operator's
/// watch; a PyTorchJob not annotated is left alone.
#[tokio::test]
async fn the_webhook_injects_each_replica_of_an_annotated_pytorchjob() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let hooks = pytorch_admission(&admin, &ns.name).await;
    let mut manifest = pytorchjob("train", 2, json!({}));
    manifest["metadata"]["annotations"] = json!({"memprof.dev/enabled": "true"});
    let pt = create(&admin, &ns.name, WorkloadKind::PyTorchJob, manifest).await;
    assert_eq!(
        pt.labels().get("memprof.dev/managed").map(String::as_str),
        Some("true")
    );
    for rtype in ["Master", "Worker"] {
        let template = &pt.data["spec"]["pytorchReplicaSpecs"][rtype]["template"];
        let sidecar = template["spec"]["containers"]
            .as_array()
            .into_iter()
            .chain(template["spec"]["initContainers"].as_array())
            .flatten()
            .find(|c| c["name"] == "memprof-sidecar")
            .unwrap_or_else(|| panic!("{rtype}: no sidecar in {template}"));
        let job_name = sidecar["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "MEMPROF_JOB_NAME")
            .map(|e| e["value"].clone());
        assert_eq!(job_name, Some(json!("train")), "{rtype}");
        assert_eq!(
            template["metadata"]["labels"]["memprof.dev/managed"],
            "true"
        );
    }
    let plain = create(
        &admin,
        &ns.name,
        WorkloadKind::PyTorchJob,
        pytorchjob("plain", 1, json!({})),
    )
    .await;
    let master = &plain.data["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"];
    assert_eq!(
        master["containers"].as_array().map(Vec::len),
        Some(1),
        "{master}"
    );
    hooks.server.stop().await;
}

/// The PyTorchJob twins of the Job's pod-trust attacks (tests/pod_trust.rs),
/// with the webhook down (it fails open, so nothing removes a copied mark):
/// a pod the training operator's identity creates meanwhile has no mark; a
/// tenant's pod carrying a genuine pod's mark under another name, and the
/// genuine pod deleted and created again by the tenant with its mark once
/// the mark's window has passed, do not verify. None of their critical
/// reports counts; each is named in the profile.
#[tokio::test]
async fn pytorchjob_pods_planted_or_replayed_never_count() {
    let Some((admin, ns)) = workload_cluster().await else {
        return;
    };
    let hooks = pytorch_admission(&admin, &ns.name).await;
    let rules = json!([{"apiGroups": [""], "resources": ["pods"],
                        "verbs": ["create", "get", "list", "watch", "delete"]},
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "watch"]}]);
    let operator = user_with(&admin, &ns.name, TRAINING_OPERATOR, rules.clone()).await;
    let tenant = user_with(&admin, &ns.name, &format!("tenant-{}", ns.name), rules).await;
    let op = start_operator(&admin, &ns.name);
    let pt = profiled(&admin, &ns.name, "victim", 2).await;
    let master = create_pod(&operator, &ns.name, pytorch_pod(&pt, "master", 0)).await;
    let worker = create_pod(&operator, &ns.name, pytorch_pod(&pt, "worker", 0)).await;
    let mark = workload_mark(&worker.metadata).expect("the operator's pod is marked");
    hooks.server.stop().await;

    let unmarked = create_pod(&operator, &ns.name, pytorch_pod(&pt, "worker", 1)).await;
    let mut planted = pytorch_pod(&pt, "worker", 0);
    planted["metadata"]["name"] = json!("victim-worker-7");
    planted["metadata"]["annotations"] =
        json!({memprof::api::workload_mark::ANNOTATION_WORKLOAD_MARK: mark});
    let planted = create_pod(&tenant, &ns.name, planted).await;
    // Past the mark's window, the genuine worker deleted and made again
    // with its name, labels, controller reference and mark.
    let created = worker.creation_timestamp().unwrap().0;
    let past = created + memprof::api::admission::MARK_LATE + jiff::SignedDuration::from_secs(2);
    if let Ok(wait) = std::time::Duration::try_from(past - jiff::Timestamp::now()) {
        tokio::time::sleep(wait).await;
    }
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), &ns.name);
    pods.delete(&worker.name_any(), &Default::default())
        .await
        .unwrap();
    eventually("the genuine worker gone", || async {
        match pods.get_opt(&worker.name_any()).await {
            Ok(None) => Ok(()),
            other => Err(format!("{:?}", other.map(|p| p.map(|p| p.uid())))),
        }
    })
    .await;
    let mut again = pytorch_pod(&pt, "worker", 0);
    again["metadata"]["annotations"] = json!({memprof::api::workload_mark::ANNOTATION_WORKLOAD_MARK: workload_mark(&worker.metadata)});
    let replayed = create_pod(&tenant, &ns.name, again).await;
    assert_eq!(
        workload_mark(&replayed.metadata),
        workload_mark(&worker.metadata)
    );

    let low = vec![gpu(0, 40, 40, RiskLevel::Low, None)];
    apply_report(
        &admin,
        &ns.name,
        &pod_report(&master, "victim", 0, &at(0), low),
    )
    .await;
    for pod in [&unmarked, &planted, &replayed] {
        let critical = vec![gpu(0, 79, 79, RiskLevel::Critical, None)];
        apply_report(
            &admin,
            &ns.name,
            &pod_report(pod, "victim", 0, &at(0), critical),
        )
        .await;
    }
    let names = ["victim-worker-1", "victim-worker-7", "victim-worker-0"];
    let profile = profile_when(
        &admin,
        &ns.name,
        "victim",
        "only the master counted, the others named",
        |p: &MemoryProfile| {
            let st = p.status.clone().unwrap_or_default();
            let valid = st.conditions.iter().find(|c| c.type_ == "ReportsValid");
            let message = valid.map(|c| c.message.clone()).unwrap_or_default();
            let named = names.iter().all(|n| message.contains(n));
            (st.ranks == "1/3" && named)
                .then_some(())
                .ok_or(format!("ranks {:?}, ReportsValid {message:?}", st.ranks))
        },
    )
    .await;
    assert_eq!(profile.status.unwrap().risk, RiskLevel::Low);
    op.stop().await;
}
