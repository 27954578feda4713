//! Where plans are kept between deciding and finishing a remediation: one
//! ConfigMap per plan, `memprof-remediation-<id>`, in the operator's own
//! namespace (`--remediation-plan-namespace`, by default the operator pod's).
//!
//! Why not the tenant's namespace: a user with `edit` there could pre-create
//! or overwrite the ConfigMap, and the operator would carry out their plan
//! with its own rights (a Job in another namespace under another service
//! account). Why not the profile's status: the plan holds the whole Job
//! manifest, far over the status's 16 KiB budget. The plan is still checked
//! against its record on every load (`verify.rs`), so even a plan written by
//! whoever can write the operator's namespace is refused unless it is the
//! one recorded.
//!
//! Nothing owns the ConfigMap (no garbage collection may take it); a plan is
//! deleted when its record finishes, except when the Job was deleted and
//! could not be created again: then its `job.json` is the way back (see
//! docs/remediation.md, "Restoring a Job").

use super::verify::plan_digest;
use super::{Error, Result};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::Client;
use memprof_api::{LABEL_JOB, LABEL_REMEDIATION, REMEDIATION_MANAGER};
use memprof_policy::plan::Plan;
use std::collections::BTreeMap;

/// Key of the plan's JSON (what the digest covers).
pub const KEY_PLAN: &str = "plan.json";
/// Key of the Job manifest alone, for a one-line restore with kubectl.
pub const KEY_JOB: &str = "job.json";
/// Label naming the namespace of the Job a plan is for (plans of every namespace share one).
pub const LABEL_NAMESPACE: &str = "memprof.dev/namespace";

/// Largest Job manifest a plan holds (its JSON): the ConfigMap keeps it
/// twice (in the plan and alone) under the API server's 1 MiB object limit,
/// and what a tenant's Job weighs must not weigh on the operator's namespace.
pub const MAX_PLAN_JOB_BYTES: usize = 384 * 1024;
/// Plans kept at once for one tenant namespace: remediations in flight, and
/// Jobs that could not be created again, kept as their way back. A tenant
/// churning Jobs cannot fill the operator's namespace.
pub const MAX_PLANS_PER_NAMESPACE: usize = 4;

/// Name of the ConfigMap holding plan `id`.
pub fn config_map_name(id: &str) -> String {
    format!("memprof-remediation-{id}")
}

/// A plan as saved: the value and the exact JSON its digest was taken of.
#[derive(Clone, Debug)]
pub struct Saved {
    /// The plan.
    pub plan: Plan,
    /// Its JSON as stored.
    pub json: String,
}

impl Saved {
    /// Serializes a plan for saving.
    pub fn new(plan: Plan) -> Result<Saved> {
        let json = serde_json::to_string(&plan).map_err(|e| Error::Serialize("plan", e))?;
        Ok(Saved { plan, json })
    }

    /// SHA-256 of the JSON, as recorded in the `Pending` record.
    pub fn digest(&self) -> String {
        plan_digest(&self.json)
    }
}

/// The ConfigMaps of plans, in the operator's namespace.
pub struct PlanStore {
    api: Api<ConfigMap>,
    namespace: String,
}

impl PlanStore {
    /// Plans kept in `namespace`.
    pub fn new(client: Client, namespace: &str) -> Self {
        PlanStore {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
        }
    }

    /// Namespace the plans are kept in.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Saves `saved` unless a plan of that id is there already; returns what
    /// is stored now (the earlier one wins: it was made before any change).
    pub async fn save(&self, saved: &Saved) -> Result<Saved> {
        let id = &saved.plan.id;
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(config_map_name(id));
        cm.metadata.labels = Some(BTreeMap::from([
            (LABEL_REMEDIATION.to_string(), id.clone()),
            (LABEL_JOB.to_string(), saved.plan.job.clone()),
            (LABEL_NAMESPACE.to_string(), saved.plan.namespace.clone()),
        ]));
        let mut data = BTreeMap::from([(KEY_PLAN.to_string(), saved.json.clone())]);
        if let Some((_, manifest)) = saved.plan.recreate() {
            let job = serde_json::to_string(manifest).map_err(|e| Error::Serialize("Job", e))?;
            data.insert(KEY_JOB.to_string(), job);
        }
        cm.data = Some(data);
        let pp = PostParams {
            field_manager: Some(REMEDIATION_MANAGER.into()),
            ..Default::default()
        };
        match self.api.create(&pp, &cm).await {
            Ok(_) => Ok(saved.clone()),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                Ok(self.load(id).await?.unwrap_or_else(|| saved.clone()))
            }
            Err(e) => Err(Error::SavePlan(id.clone(), e)),
        }
    }

    /// Why `saved` may not be kept (`None`: it may): its Job is over
    /// [`MAX_PLAN_JOB_BYTES`], or its namespace has
    /// [`MAX_PLANS_PER_NAMESPACE`] other plans kept already.
    pub async fn refuses(&self, saved: &Saved) -> Result<Option<String>> {
        let plan = &saved.plan;
        if let Some((_, manifest)) = plan.recreate() {
            let bytes = serde_json::to_vec(manifest).map_or(usize::MAX, |v| v.len());
            if bytes > MAX_PLAN_JOB_BYTES {
                return Ok(Some(format!(
                    "Job {} is {bytes} bytes as a manifest, over the {MAX_PLAN_JOB_BYTES} a \
                     remediation plan keeps: it was left running, untouched (trim its \
                     annotations, or remediate it in place with notifyTrainer or setConfigMapKey)",
                    plan.job
                )));
            }
        }
        let lp = ListParams::default().labels(&format!("{LABEL_NAMESPACE}={}", plan.namespace));
        let own = config_map_name(&plan.id);
        let others = self
            .api
            .list_metadata(&lp)
            .await
            .map_err(|e| Error::SavePlan(plan.id.clone(), e))?
            .items
            .iter()
            .filter(|cm| cm.metadata.name.as_deref() != Some(own.as_str()))
            .count();
        Ok((others >= MAX_PLANS_PER_NAMESPACE).then(|| {
            format!(
                "{others} remediation plans of namespace {} are kept in {} already (the most \
                 one namespace may have): nothing was done; plans that stay hold Jobs that \
                 could not be created again (docs/remediation.md, \"Restoring a Job\")",
                plan.namespace, self.namespace
            )
        }))
    }

    /// The plan saved for `id`, if any.
    pub async fn load(&self, id: &str) -> Result<Option<Saved>> {
        let Some(cm) = self
            .api
            .get_opt(&config_map_name(id))
            .await
            .map_err(|e| Error::SavePlan(id.into(), e))?
        else {
            return Ok(None);
        };
        let json = cm
            .data
            .as_ref()
            .and_then(|d| d.get(KEY_PLAN))
            .ok_or_else(|| Error::BadPlan(id.into(), format!("no key {KEY_PLAN}")))?
            .clone();
        let plan =
            serde_json::from_str(&json).map_err(|e| Error::BadPlan(id.into(), e.to_string()))?;
        Ok(Some(Saved { plan, json }))
    }

    /// Deletes the plan of `id` (gone already is fine).
    pub async fn delete(&self, id: &str) -> Result<()> {
        match self
            .api
            .delete(&config_map_name(id), &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(Error::SavePlan(id.into(), e)),
        }
    }

    /// The kubectl command that creates the Job of plan `id` again.
    pub fn restore_command(&self, id: &str) -> String {
        format!(
            "kubectl get configmap -n {} {} -o jsonpath='{{.data.job\\.json}}' | kubectl create -f -",
            self.namespace,
            config_map_name(id)
        )
    }
}
