//! A Job's `memprof.dev/remediation` annotation is input, not proof that
//! memprof recreated it: anyone who may create Jobs can write it, and copy
//! a genuine value from any Job memprof made. A profile's history passes to
//! a new Job of its name only when memprof's own record names that Job's
//! uid as the one it created (`replacementUid`;
//! `memprof_policy::triggers::succession`), whether the profile still
//! names the earlier Job or the garbage collector left it with no owner;
//! docs/security.md.
//!
//!     eval "$(bash hack/local-cluster.sh env)"
//!     MEMPROF_REQUIRE_CLUSTER=1 cargo test --test integration remediation_trust::

use crate::common;
use crate::remediation_support;

use common::*;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use memprof::api::{MemoryProfile, RemediationRecord};
use remediation_support::*;
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;

const REMEDIATION: &str = "memprof.dev/remediation";
/// The test's finalizer on a profile whose Job was deleted: the garbage
/// collector's deletion of the profile then waits, so the tenant's Job is
/// seen while the profile still names the deleted Job (what a slower
/// collector leaves to chance) and whether memprof adopts it shows.
const HOLD: &str = "memprof.dev/test-hold";

/// A Job memprof recreated (scaleBatch on a critical rank), with the
/// record of that recreation.
struct Remediated {
    job: Job,
    record: RemediationRecord,
    profile_uid: String,
}

/// Creates Job `name` and has memprof recreate it; checks the genuine path:
/// the recreated Job keeps the profile and its history.
async fn remediated(client: &Client, ns: &str, name: &str) -> Remediated {
    let old = training_job(client, ns, name, Some("32")).await;
    let old_uid = old.uid().unwrap();
    first_pod(client, ns, name).await;
    low_report(client, ns, name).await;
    let profile = profile_with_status(client, ns, name).await;
    critical_report(client, ns, name, 100).await;
    let record = eventually("the recreation recorded Done", || async {
        let recs = records(client, ns, name).await;
        match recs.as_slice() {
            [r] if r.phase == "Done" && r.job_deleted => Ok(r.clone()),
            _ => Err(format!("{recs:?}")),
        }
    })
    .await;
    let job = job(client, ns, name).await.expect("the recreated Job");
    assert_ne!(job.uid(), Some(old_uid.clone()));
    assert_eq!(job.annotations()[REMEDIATION], record.id);
    assert_eq!(record.job_uid.as_deref(), Some(old_uid.as_str()));
    let new_uid = job.uid().unwrap();
    let profiles = Api::<MemoryProfile>::namespaced(client.clone(), ns);
    eventually(
        "the profile, with its history, owned by the new Job",
        || async {
            let p = profiles.get(name).await.map_err(|e| e.to_string())?;
            let owners: Vec<_> = p.owner_references().iter().map(|o| o.uid.clone()).collect();
            let history = p.status.as_ref().map_or(0, |s| s.remediations.len());
            (owners == [new_uid.clone()] && p.uid() == profile.uid() && history == 1)
                .then_some(())
                .ok_or(format!("{owners:?}, {history} records"))
        },
    )
    .await;
    Remediated {
        job,
        record,
        profile_uid: profile.uid().unwrap(),
    }
}

/// Keeps profile `name` from being deleted while held; released when dropped.
struct Held {
    ns: String,
    name: String,
}

impl Held {
    async fn hold(client: &Client, ns: &str, name: &str) -> Held {
        let hold = json!({"metadata": {"finalizers": [HOLD]}});
        Api::<MemoryProfile>::namespaced(client.clone(), ns)
            .patch(name, &PatchParams::default(), &Patch::Merge(&hold))
            .await
            .unwrap_or_else(|e| panic!("holding MemoryProfile {name}: {e}"));
        Held {
            ns: ns.into(),
            name: name.into(),
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let (ns, name) = (self.ns.clone(), self.name.clone());
        // Whatever happened, so that the namespace can go.
        let released = from_drop(move |client| async move {
            let release = json!({"metadata": {"finalizers": null}});
            let api = Api::<MemoryProfile>::namespaced(client, &ns);
            match api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&release))
                .await
            {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                Err(e) => Err(e.to_string()),
            }
        });
        if let Err(e) = released {
            eprintln!(
                "warning: could not release MemoryProfile {}: {e}",
                self.name
            );
        }
    }
}

/// The team deletes its Job `name` (not memprof: background propagation,
/// as `kubectl delete` does); a tenant creates a Job of that name annotated
/// `annotations`. The earlier profile must not pass to it: never adopted,
/// and once gone, the tenant's Job gets a fresh profile without history.
async fn tenant_takes_the_name(
    client: &Client,
    ns: &str,
    operator: &RunningOperator,
    earlier: &Remediated,
    annotations: BTreeMap<String, String>,
) {
    let name = earlier.job.name_any();
    let held = Held::hold(client, ns, &name).await;
    let jobs = Api::<Job>::namespaced(client.clone(), ns);
    jobs.delete(&name, &DeleteParams::background())
        .await
        .unwrap_or_else(|e| panic!("deleting Job {name}: {e}"));
    let profiles = Api::<MemoryProfile>::namespaced(client.clone(), ns);
    eventually_within(GC_TIMEOUT, "the Job gone, its profile held", || async {
        let gone = job(client, ns, &name).await.is_none();
        let p = profiles.get(&name).await.map_err(|e| e.to_string())?;
        (gone && p.metadata.deletion_timestamp.is_some())
            .then_some(())
            .ok_or(format!("Job gone: {gone}"))
    })
    .await;

    let mut tenant = training_job_manifest(&name, "32");
    tenant.annotations_mut().extend(annotations.clone());
    let tenant = jobs
        .create(&PostParams::default(), &tenant)
        .await
        .unwrap_or_else(|e| panic!("creating the tenant's Job {name}: {e}"));
    let tenant_uid = tenant.uid().unwrap();
    let not_adopted = || async {
        let p = profiles.get(&name).await.map_err(|e| e.to_string())?;
        let owners: Vec<_> = p.owner_references().iter().map(|o| o.uid.clone()).collect();
        if owners.contains(&tenant_uid) {
            return Err(format!(
                "the earlier profile (history: {:?}) adopted by the tenant's Job {annotations:?}",
                p.status.map(|s| s.remediations)
            ));
        }
        Ok(())
    };
    // Until the operator has looked at the tenant's Job several times (a
    // stale profile is deleted and looked at again every second).
    let seen = operator.metrics.reconciles.get() + 5;
    eventually("the operator looking at the tenant's Job", || async {
        if let Err(adopted) = not_adopted().await {
            panic!("{adopted}");
        }
        let n = operator.metrics.reconciles.get();
        (n >= seen).then_some(()).ok_or(format!("{n} reconciles"))
    })
    .await;
    stays(
        "the earlier profile not adopted",
        Duration::from_secs(3),
        not_adopted,
    )
    .await;

    drop(held);
    eventually(
        "a fresh profile of the tenant's Job, without history",
        || async {
            let p = profiles.get_opt(&name).await.map_err(|e| e.to_string())?;
            let p = p.ok_or("no profile yet")?;
            let owners: Vec<_> = p.owner_references().iter().map(|o| o.uid.clone()).collect();
            let history = p.status.as_ref().map(|s| s.remediations.len());
            let fresh = p.uid().as_deref() != Some(earlier.profile_uid.as_str());
            (fresh && owners == [tenant_uid.clone()] && history.unwrap_or(0) == 0)
                .then_some(())
                .ok_or(format!(
                    "fresh: {fresh}, owners {owners:?}, history {history:?}"
                ))
        },
    )
    .await;
}

#[tokio::test]
async fn a_tenant_s_remediation_annotation_never_inherits_an_earlier_job_s_profile() {
    let Some(client) = cluster().await else {
        return;
    };
    init_logs();
    let ns = TestNamespace::create(&client).await;
    let ns = ns.name.as_str();
    let operator = operator_shrinking(&client, ns, false).await;
    // Three teams' Jobs, each recreated by memprof once (the genuine path
    // keeps the profile and its history): real records to copy from.
    let alpha = remediated(&client, ns, "alpha").await;
    let beta = remediated(&client, ns, "beta").await;
    let gamma = remediated(&client, ns, "gamma").await;

    // (a) A made-up value.
    let made_up = BTreeMap::from([(REMEDIATION.to_string(), "anything".to_string())]);
    tenant_takes_the_name(&client, ns, &operator, &alpha, made_up).await;
    // (b) A real record's id and nonce, of another profile (alpha's Job as
    // memprof made it).
    assert_ne!(alpha.record.id, beta.record.id);
    tenant_takes_the_name(&client, ns, &operator, &beta, stamped(&alpha.job)).await;
    // (c) The profile's own real record, of the recreation that made the
    // Job now deleted: memprof made that Job, not the tenant's.
    tenant_takes_the_name(&client, ns, &operator, &gamma, stamped(&gamma.job)).await;
    operator.stop().await;
}

/// The team deletes its Job `name` with `--cascade=orphan`: the garbage
/// collector leaves its profile (uid `profile_uid`) with no owner. Then a
/// Job of that name that memprof did not create, annotated `annotations`,
/// appears: the ownerless profile must not pass to it (never adopted); it
/// goes, and the newcomer gets a fresh profile without history.
async fn orphaned_then_taken(
    client: &Client,
    ns: &str,
    name: &str,
    profile_uid: &str,
    annotations: BTreeMap<String, String>,
) {
    let jobs = Api::<Job>::namespaced(client.clone(), ns);
    let orphan = DeleteParams {
        propagation_policy: Some(kube::api::PropagationPolicy::Orphan),
        ..Default::default()
    };
    jobs.delete(name, &orphan)
        .await
        .unwrap_or_else(|e| panic!("deleting Job {name} with --cascade=orphan: {e}"));
    let profiles = Api::<MemoryProfile>::namespaced(client.clone(), ns);
    eventually_within(
        GC_TIMEOUT,
        "the Job gone, its profile ownerless",
        || async {
            let gone = job(client, ns, name).await.is_none();
            let p = profiles.get(name).await.map_err(|e| e.to_string())?;
            (gone && p.owner_references().is_empty())
                .then_some(())
                .ok_or(format!(
                    "Job gone: {gone}, owners {:?}",
                    p.owner_references()
                ))
        },
    )
    .await;

    let mut newcomer = training_job_manifest(name, "32");
    newcomer.annotations_mut().extend(annotations.clone());
    let newcomer = jobs
        .create(&PostParams::default(), &newcomer)
        .await
        .unwrap_or_else(|e| panic!("creating the newcomer's Job {name}: {e}"));
    let uid = newcomer.uid().unwrap();
    let newcomer = format!("a Job memprof did not create ({annotations:?})");
    fresh_profile(client, ns, name, profile_uid, &uid, &newcomer).await;
}

/// A profile left with no owner passes only to the Job memprof's record
/// names as the one it created (`replacementUid`): not to a Job made after
/// `kubectl delete --cascade=orphan`, even one carrying the id and nonce
/// memprof stamped on the Job it made, nor after a Job memprof never touched.
#[tokio::test]
async fn an_ownerless_profile_passes_only_to_the_job_memprof_created() {
    let Some(client) = cluster().await else {
        return;
    };
    init_logs();
    let ns = TestNamespace::create(&client).await;
    let ns = ns.name.as_str();
    let operator = operator_shrinking(&client, ns, false).await;
    let alpha = remediated(&client, ns, "alpha").await;
    assert_eq!(
        alpha.record.replacement_uid,
        alpha.job.uid(),
        "memprof's record names the Job it created"
    );
    let copied = stamped(&alpha.job);
    orphaned_then_taken(&client, ns, "alpha", &alpha.profile_uid, copied).await;

    let _plain = training_job(&client, ns, "plain", Some("32")).await;
    let plain = profile_with_status(&client, ns, "plain").await;
    let plain_uid = plain.uid().unwrap();
    orphaned_then_taken(&client, ns, "plain", &plain_uid, BTreeMap::new()).await;
    operator.stop().await;
}
