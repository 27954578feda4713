//! As attacks against the real local control plane:
//! whoever may create pods in a namespace tries to steer another user's Job
//! through memprof (recreate it with a smaller batch) without any right on
//! that Job. Each test is named after the attack it proves closed
//! (docs/security.md, "Pod trust").

use crate::common;
use crate::remediation_support;
use crate::tenant_support;
use crate::webhook_support;

use common::*;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use memprof::api::admission::{Keys, MARK_LATE};
use memprof::api::{MemoryProfile, MemoryReport, RiskLevel};
use memprof::webhook::MarkConfig;
use remediation_support::job as job_of;
use remediation_support::*;
use serde_json::json;
use std::time::Duration;
use tenant_support::*;
use webhook_support::{
    label_namespace, register, start_server_with, test_config, wait_for_default_token,
    wait_until_active, Registration,
};

/// The identity the local control plane's kube-controller-manager (and so
/// its Job controller) acts as: it runs with the admin's kubeconfig and
/// `--use-service-account-credentials=false`. A real cluster's is
/// `system:serviceaccount:kube-system:job-controller`.
const LOCAL_JOB_CONTROLLER: &str = "memprof-admin";

/// How long "nothing happens" is watched: the operator reacts to a counted
/// critical report within about a second (the positive controls below).
pub(crate) const QUIET: Duration = Duration::from_secs(8);

/// A pod of `creator` that claims Job `job` as its controller, carries the
/// Job's selector labels and a finalizer of its own (so the Job controller's
/// deletion of the "excess" pod leaves it in place).
async fn planted_pod(creator: &Client, ns: &str, name: &str, job: &Job) -> Pod {
    let uid = job.uid().unwrap();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {
            "name": name,
            // A tenant can set the managed label too: it is a filter, not proof.
            "labels": {"controller-uid": uid, "job-name": job.name_any(), "memprof.dev/managed": "true"},
            "finalizers": ["example.com/keep"],
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                                 "name": job.name_any(), "uid": uid, "controller": true}],
        },
        "spec": {"restartPolicy": "Never",
                 "containers": [{"name": "trainer", "image": "busybox"}]},
    }))
    .unwrap();
    Api::<Pod>::namespaced(creator.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await
        .expect("a pod creator may create this pod")
}

/// Waits until a pod created now is newer than `pod` by the second
/// `creationTimestamp` counts in: the Job controller deletes the newest of
/// the pods beyond its parallelism, and among pods of the same second any
/// one (the attack of the issue plants a pod after the genuine one).
pub(crate) async fn newer_than(pod: &Pod) {
    let created = pod.creation_timestamp().unwrap().0;
    let later = created + jiff::SignedDuration::from_millis(1100);
    if let Ok(wait) = Duration::try_from(later - jiff::Timestamp::now()) {
        tokio::time::sleep(wait).await;
    }
}

/// Removes the test's finalizers so the namespace can go.
pub(crate) async fn release(admin: &Client, ns: &str, name: &str) {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
    let patch = json!({"metadata": {"finalizers": null}});
    let _ = pods
        .patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await;
}

/// The critical report `pod`'s sidecar would write for rank 0 of `job`.
pub(crate) fn critical_of(pod: &Pod, job: &str, offset: u64) -> memprof::api::MemoryReport {
    let gpus = vec![gpu(0, 79, 79, RiskLevel::Critical, Some(5.0))];
    pod_report(pod, job, 0, &at(offset), gpus)
}

/// The Job stays the one it was, with `BATCH_SIZE=32`, and no remediation
/// or OOM is recorded, for [`QUIET`].
async fn untouched(admin: &Client, ns: &str, job: &Job) {
    let profiles: Api<MemoryProfile> = Api::namespaced(admin.clone(), ns);
    stays(
        "the victim's Job untouched, no OOM or remediation recorded",
        QUIET,
        || async {
            let j = job_of(admin, ns, &job.name_any()).await.ok_or("no Job")?;
            let st = profiles
                .get(&job.name_any())
                .await
                .map_err(|e| e.to_string())?
                .status
                .unwrap_or_default();
            let same = j.uid() == job.uid() && env_of(&j, "BATCH_SIZE").as_deref() == Some("32");
            (same && st.ooms.is_empty() && st.remediations.is_empty())
                .then_some(())
                .ok_or(format!(
                    "Job {:?} BATCH_SIZE {:?}; ooms {:?}; remediations {:?}",
                    j.uid(),
                    env_of(&j, "BATCH_SIZE"),
                    st.ooms,
                    st.remediations
                ))
        },
    )
    .await;
}

/// A client writing as `pod` itself (its sidecar's bound token): the
/// webhook marks such a write as the pod's own, so what these tests judge
/// is the pod's admission alone.
pub(crate) async fn as_pod(admin: &Client, ns: &str, pod: &Pod) -> Client {
    client_as_pod(admin, ns, &pod.name_any(), &pod.uid().unwrap()).await
}

/// The positive control: the Job's own pod reporting critical gets it
/// recreated with `BATCH_SIZE=24` (so "untouched" above was not a dead pipeline).
async fn genuine_report_still_remediates(admin: &Client, ns: &str, job: &Job, pod: &Pod) {
    let reporter = as_pod(admin, ns, pod).await;
    apply_report(&reporter, ns, &critical_of(pod, &job.name_any(), 300)).await;
    eventually("the Job recreated with BATCH_SIZE 24", || async {
        match job_of(admin, ns, &job.name_any()).await {
            Some(j)
                if j.uid() != job.uid() && env_of(&j, "BATCH_SIZE").as_deref() == Some("24") =>
            {
                Ok(())
            }
            other => Err(format!("{:?}", other.map(|j| j.uid()))),
        }
    })
    .await;
}

/// The pods of Job `job` (by controller uid) as they are, oldest first.
pub(crate) async fn pods_of(client: &Client, ns: &str, job: &Job, n: usize) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let uid = job.uid().unwrap();
    eventually("the Job controller's pods", || async {
        let lp = ListParams::default().labels(&format!("controller-uid={uid}"));
        let mut list = pods.list(&lp).await.map_err(|e| e.to_string())?.items;
        list.retain(|p| p.metadata.deletion_timestamp.is_none());
        list.sort_by_key(|p| p.creation_timestamp());
        match list.len() {
            len if len >= n => Ok(list),
            len => Err(format!("{len} pod(s)")),
        }
    })
    .await
}

/// How the webhook stands while the victim's Job creates its pods.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Webhook {
    /// Serving, marking the Job controller's pods.
    Serving,
    /// Registered (`failurePolicy: Ignore`) but not answering.
    FailedOpen,
}

pub(crate) struct Setup {
    pub(crate) admin: Client,
    pub(crate) ns: TestNamespace,
    _registration: Registration,
    webhook: Option<webhook_support::Server>,
    /// The one controller: roll-up and remediation.
    operator: RunningOperator,
}

impl Setup {
    /// The webhook (as the chart registers it, marking the local Job
    /// controller's pods with the namespace's admission key), the operator
    /// (roll-up and remediation) on a fresh namespace, and the shrink policy.
    pub(crate) async fn start(webhook: Webhook) -> Option<Setup> {
        let admin = cluster().await?;
        let ns = TestNamespace::create(&admin).await;
        label_namespace(&admin, &ns.name).await;
        let keys = Keys::of(admission_keys(&ns.name).await);
        let config = memprof::webhook::InjectionConfig {
            marks: MarkConfig {
                controllers: vec![LOCAL_JOB_CONTROLLER.into()],
                keys,
            },
            ..test_config(&admin).await
        };
        let server = start_server_with(config).await;
        register(&admin, &ns.name, &server.url, &server.ca_pem).await;
        let registration = Registration(ns.name.clone());
        wait_until_active(&admin, &ns.name).await;
        wait_for_default_token(&admin, &ns.name).await;
        let server = match webhook {
            Webhook::Serving => Some(server),
            Webhook::FailedOpen => {
                server.stop().await;
                None
            }
        };
        let operator = start_operator(&admin, &ns.name);
        apply_policy(&admin, &ns.name, "shrink", shrink_policy(false))
            .await
            .unwrap();
        Some(Setup {
            admin,
            ns,
            _registration: registration,
            webhook: server,
            operator,
        })
    }

    /// A profiled Job `train` (BATCH_SIZE 32) of the admin, its pod's first
    /// (healthy) report written and rolled up.
    async fn victim(&self) -> (Job, Pod) {
        let ns = self.ns.name.as_str();
        let job = training_job(&self.admin, ns, "train", Some("32")).await;
        let pod = pods_of(&self.admin, ns, &job, 1).await.remove(0);
        let reporter = as_pod(&self.admin, ns, &pod).await;
        let healthy = vec![gpu(0, 30, 31, RiskLevel::Low, None)];
        apply_report(
            &reporter,
            ns,
            &pod_report(&pod, "train", 0, &at(0), healthy),
        )
        .await;
        profile_with_status(&self.admin, ns, "train").await;
        (job, pod)
    }

    /// Waits until the profile's `ReportsValid` condition refuses `report`
    /// because `why` (the caches may first see the report, then its pod).
    pub(crate) async fn refuses(&self, report: &str, why: &str) {
        let profiles: Api<MemoryProfile> = Api::namespaced(self.admin.clone(), &self.ns.name);
        eventually("the report named in ReportsValid", || async {
            let st = profiles
                .get("train")
                .await
                .map_err(|e| e.to_string())?
                .status
                .unwrap_or_default();
            let valid = st.conditions.iter().find(|c| c.type_ == "ReportsValid");
            match valid {
                Some(c)
                    if c.message.split("; ").any(|r| {
                        r.trim_start_matches(|ch| ch != ':')
                            .contains(&format!("{report} ("))
                            && r.contains(why)
                    }) =>
                {
                    Ok(())
                }
                other => Err(format!("{other:?}")),
            }
        })
        .await
    }

    pub(crate) async fn stop(self) {
        self.operator.stop().await;
        if let Some(server) = self.webhook {
            server.stop().await;
        }
    }
}

#[tokio::test]
async fn pod_planted_with_a_victims_controller_reference_never_steers_its_job() {
    let Some(s) = Setup::start(Webhook::Serving).await else {
        return;
    };
    let ns = s.ns.name.clone();
    let (job, genuine) = s.victim().await;
    assert!(
        genuine.annotations().contains_key("memprof.dev/admission"),
        "the Job controller's pod is marked"
    );
    // The attacker may create pods, not Jobs; it reads the Job's uid.
    let attacker = pod_creator(&s.admin, &ns).await;
    let seen = Api::<Job>::namespaced(attacker.clone(), &ns)
        .get("train")
        .await
        .unwrap();
    newer_than(&genuine).await;
    let planted = planted_pod(&attacker, &ns, "train-planted", &seen).await;
    let reporter = as_pod(&s.admin, &ns, &planted).await;
    apply_report(&reporter, &ns, &critical_of(&planted, "train", 200)).await;

    s.refuses("train-planted", "has no memprof.dev/admission mark")
        .await;
    untouched(&s.admin, &ns, &job).await;
    genuine_report_still_remediates(&s.admin, &ns, &job, &genuine).await;
    release(&s.admin, &ns, "train-planted").await;
    s.stop().await;
}

#[tokio::test]
async fn pod_with_only_the_jobs_label_and_a_cuda_oom_exit_never_fires_a_policy() {
    let Some(s) = Setup::start(Webhook::Serving).await else {
        return;
    };
    let ns = s.ns.name.clone();
    let (job, genuine) = s.victim().await;
    // Only the label the OOM detection selected pods by: no owner, no report.
    let attacker = pod_creator(&s.admin, &ns).await;
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "train-oom", "labels": {"job-name": "train", "memprof.dev/managed": "true"}},
        "spec": {"restartPolicy": "Never",
                 "containers": [{"name": "trainer", "image": "busybox"}]},
    }))
    .unwrap();
    Api::<Pod>::namespaced(attacker.clone(), &ns)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    // Its container prints a CUDA OOM and exits 1 (the kubelet's report;
    // there is no kubelet here, so the admin writes it).
    let msg = "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB";
    terminate_container(&s.admin, &ns, "train-oom", "trainer", 1, msg).await;
    untouched(&s.admin, &ns, &job).await;

    // The same exit of the Job's own pod is an OOM of the Job's, and fires.
    terminate_container(&s.admin, &ns, &genuine.name_any(), "trainer", 1, msg).await;
    let profiles: Api<MemoryProfile> = Api::namespaced(s.admin.clone(), &ns);
    let oom = eventually("the genuine pod's OOM recorded", || async {
        let st = profiles
            .get("train")
            .await
            .map_err(|e| e.to_string())?
            .status;
        let ooms = st.map(|s| s.ooms).unwrap_or_default();
        ooms.into_iter().next().ok_or("none".to_string())
    })
    .await;
    assert_eq!(oom.pod, genuine.name_any());
    assert_eq!(oom.job_uid, job.uid());
    eventually("the Job recreated with BATCH_SIZE 24", || async {
        match job_of(&s.admin, &ns, "train").await {
            Some(j) if j.uid() != job.uid() => Ok(()),
            other => Err(format!("{:?}", other.map(|j| j.uid()))),
        }
    })
    .await;
    s.stop().await;
}

#[tokio::test]
async fn pods_created_while_the_webhook_fails_open_never_steer_their_job() {
    let Some(s) = Setup::start(Webhook::FailedOpen).await else {
        return;
    };
    let ns = s.ns.name.clone();
    // The webhook is registered but does not answer: `failurePolicy: Ignore`
    // admits the Job and its pods, unmarked.
    let (job, genuine) = s.victim().await;
    assert!(!genuine.annotations().contains_key("memprof.dev/admission"));
    let reporter = as_pod(&s.admin, &ns, &genuine).await;
    apply_report(&reporter, &ns, &critical_of(&genuine, "train", 200)).await;
    s.refuses(&genuine.name_any(), "has no memprof.dev/admission mark")
        .await;
    untouched(&s.admin, &ns, &job).await;
    s.stop().await;
}

/// `pod` as a new object a tenant could create: its metadata (mark and
/// owner reference included) without what the API server sets.
/// Why a report of a pod without `memprof.dev/managed` is refused: the
/// operator's pod watch selects on that label (contract D), so the pod is
/// not in its cache at all.
pub(crate) const UNSEEN: &str = "does not exist";

/// Deletes pod `name` (as `pods`' client) and waits until it is gone and so
/// is the report it owned. The garbage collector removes a deleted pod's
/// report, deciding on the owner references it last read: a same-named
/// pod's report written onto it before then can be deleted with it, and a
/// test of that report would find nothing to judge.
pub(crate) async fn delete_pod_and_its_report(
    admin: &Client,
    ns: &str,
    pods: &Api<Pod>,
    name: &str,
) {
    pods.delete(name, &Default::default()).await.unwrap();
    let reports: Api<MemoryReport> = Api::namespaced(admin.clone(), ns);
    eventually("the pod and its report gone", || async {
        let pod = pods.get_opt(name).await.map_err(|e| e.to_string())?;
        let report = reports.get_opt(name).await.map_err(|e| e.to_string())?;
        match (pod, report) {
            (None, None) => Ok(()),
            (p, r) => Err(format!(
                "pod {:?}, report {:?}",
                p.map(|p| p.uid()),
                r.map(|r| r.uid())
            )),
        }
    })
    .await;
}

pub(crate) fn copy_of(pod: &Pod, name: &str) -> Pod {
    let mut copy = Pod {
        metadata: pod.metadata.clone(),
        spec: pod.spec.clone(),
        status: None,
    };
    let m = &mut copy.metadata;
    m.name = Some(name.into());
    m.generate_name = None;
    (m.uid, m.resource_version, m.creation_timestamp) = (None, None, None);
    m.managed_fields = None;
    m.finalizers = Some(vec!["example.com/keep".into()]);
    // Without `memprof.dev/managed` the webhook does not see it (and so
    // cannot strip the mark): the strongest copy. Nor does the operator,
    // which watches only managed pods: its report names a pod that, as far
    // as memprof knows, does not exist ([`UNSEEN`]).
    m.labels
        .get_or_insert_default()
        .remove("memprof.dev/managed");
    copy
}

#[tokio::test]
async fn genuine_admission_mark_copied_onto_a_planted_pod_never_steers_its_job() {
    let Some(s) = Setup::start(Webhook::Serving).await else {
        return;
    };
    let ns = s.ns.name.clone();
    let (job, genuine) = s.victim().await;
    // A tenant with `edit` copies the genuine pod, mark and owner reference
    // included, under another name.
    let tenant = tenant(&s.admin, &ns).await;
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), &ns);
    let original = pods.get(&genuine.name_any()).await.unwrap();
    newer_than(&genuine).await;
    let copied = pods
        .create(
            &PostParams::default(),
            &copy_of(&original, "train-replayed"),
        )
        .await
        .unwrap();
    assert_eq!(
        copied.annotations().get("memprof.dev/admission"),
        original.annotations().get("memprof.dev/admission"),
        "the copy carries the genuine mark"
    );
    let reporter = as_pod(&s.admin, &ns, &copied).await;
    apply_report(&reporter, &ns, &critical_of(&copied, "train", 200)).await;
    s.refuses("train-replayed", UNSEEN).await;
    untouched(&s.admin, &ns, &job).await;
    genuine_report_still_remediates(&s.admin, &ns, &job, &genuine).await;
    release(&s.admin, &ns, "train-replayed").await;
    s.stop().await;
}

#[tokio::test]
async fn genuine_pod_deleted_and_recreated_with_its_mark_never_steers_its_job() {
    let Some(s) = Setup::start(Webhook::Serving).await else {
        return;
    };
    let ns = s.ns.name.clone();
    let (job, genuine) = s.victim().await;
    let tenant = tenant(&s.admin, &ns).await;
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), &ns);
    let original = pods.get(&genuine.name_any()).await.unwrap();
    // Past the mark's window, the tenant deletes the genuine pod and creates
    // one of the same name, with its mark, owner reference and labels.
    let created = original.creation_timestamp().unwrap().0;
    let past = created + MARK_LATE + jiff::SignedDuration::from_secs(2);
    if let Ok(wait) = Duration::try_from(past - jiff::Timestamp::now()) {
        tokio::time::sleep(wait).await;
    }
    delete_pod_and_its_report(&s.admin, &ns, &pods, &genuine.name_any()).await;
    let replayed = pods
        .create(
            &PostParams::default(),
            &copy_of(&original, &genuine.name_any()),
        )
        .await
        .unwrap();
    let reporter = as_pod(&s.admin, &ns, &replayed).await;
    apply_report(&reporter, &ns, &critical_of(&replayed, "train", 200)).await;
    s.refuses(&genuine.name_any(), UNSEEN).await;
    untouched(&s.admin, &ns, &job).await;
    release(&s.admin, &ns, &genuine.name_any()).await;
    s.stop().await;
}
