//! The batch fit's part of the roll-up: which env var holds a Job's batch
//! size, its value in the slim cached Job, and the `batchRecommendation`
//! (the peak per batch size remembered across memprof's recreations).

use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;
use memprof_analysis::batchfit;
use memprof_api::MemoryProfileStatus;

/// The first container whose env `env` holds a literal batch size (what
/// [`batch_of`] reads), reduced to its name and that var; the others are
/// dropped, so a Job of many containers costs the cache one (bounded: a
/// value longer than 32 bytes is no batch size).
pub(super) fn slim_containers(
    containers: Vec<k8s_openapi::api::core::v1::Container>,
    env: &str,
) -> Vec<k8s_openapi::api::core::v1::Container> {
    let literal = |v: &k8s_openapi::api::core::v1::EnvVar| {
        v.name == env
            && v.value
                .as_ref()
                .is_some_and(|x| x.len() <= 32 && x.trim().parse::<u64>().is_ok())
    };
    containers
        .into_iter()
        .filter_map(|c| {
            let var = c.env?.into_iter().find(literal)?;
            Some(k8s_openapi::api::core::v1::Container {
                name: c.name,
                env: Some(vec![k8s_openapi::api::core::v1::EnvVar {
                    name: var.name,
                    value: var.value,
                    value_from: None,
                }]),
                ..Default::default()
            })
        })
        .take(1)
        .collect()
}

/// The env var holding a Job's batch size: annotation `memprof.dev/batch-env`, else `BATCH_SIZE`.
pub fn batch_env(job: &Job) -> String {
    job.annotations()
        .get(batchfit::ANNOTATION_BATCH_ENV)
        .filter(|v| !v.is_empty() && v.len() <= 128)
        .cloned()
        .unwrap_or_else(|| batchfit::DEFAULT_BATCH_ENV.to_string())
}

/// The Job's batch size: the literal integer its first container setting [`batch_env`] has.
pub fn batch_of(job: &Job) -> Option<u64> {
    let env = batch_env(job);
    job.spec
        .as_ref()?
        .template
        .spec
        .as_ref()?
        .containers
        .iter()
        .filter_map(|c| c.env.as_ref()?.iter().find(|v| v.name == env))
        .find_map(|v| v.value.as_deref()?.trim().parse().ok())
}

/// The peak and total of the Job's fullest GPU. `topRanks` lines carry each
/// listed rank's *riskiest* GPU, which need not be its fullest (a slow
/// trend at 60 % beside a flat 85 %): when every listed GPU has the same
/// total (one model), the Job's highest peak (`peakUsedBytes`, over every
/// GPU) is the fullest one's. Otherwise the fullest listed line. Returns
/// (0, 0) without GPUs.
fn fullest_peak(status: &MemoryProfileStatus) -> (u64, u64) {
    let listed = || status.top_ranks.iter().filter(|r| r.total_bytes > 0);
    let mut totals = listed().map(|r| r.total_bytes);
    let one_model = totals.next().filter(|first| totals.all(|t| t == *first));
    if let Some(total) = one_model.filter(|t| status.peak_used_bytes <= *t) {
        return (status.peak_used_bytes, total);
    }
    listed()
        .max_by(|a, b| {
            (a.peak_bytes as f64 / a.total_bytes as f64)
                .total_cmp(&(b.peak_bytes as f64 / b.total_bytes as f64))
        })
        .map_or((0, 0), |r| (r.peak_bytes, r.total_bytes))
}

/// Adds the batch recommendation to a rolled-up `status`: the peak of the
/// fullest GPU is remembered for the Job's current batch (next to those of
/// earlier batches, carried over from `previous` across memprof's
/// recreations of the Job), then the fit of `analysis::batchfit` runs.
pub fn with_batch_fit(
    status: &mut MemoryProfileStatus,
    job: &Job,
    previous: Option<&MemoryProfileStatus>,
) {
    let env = batch_env(job);
    let current = batch_of(job);
    let (peak, total) = fullest_peak(status);
    let before = previous
        .and_then(|p| p.batch_recommendation.as_ref())
        .map(|r| r.observations.as_slice())
        .unwrap_or_default();
    let observations = batchfit::observe(before, current, peak, total);
    let breakdown = status.breakdown.as_ref().map(batchfit::AgentBreakdown::of);
    status.batch_recommendation = Some(batchfit::recommend(&batchfit::Evidence {
        env_var: &env,
        current,
        limit_bytes: (total > 0).then_some(total),
        headroom_fraction: memprof_api::DEFAULT_HEADROOM_FRACTION,
        breakdown,
        observations: &observations,
    }));
}

#[cfg(test)]
mod tests {
    use super::super::slim_job;
    use super::*;

    #[test]
    fn the_slim_job_keeps_one_container_however_many_set_the_batch_env() {
        // 2,000 containers, each with the batch var: the first literal number wins.
        let mut containers = vec![serde_json::json!({"name": "bad", "env": [
            {"name": "BATCH_SIZE", "value": "-3"}]})];
        containers.extend((0..2000).map(|i| {
            serde_json::json!({"name": format!("c{i}"), "env": [
                {"name": "BATCH_SIZE", "value": format!("{}", 16 + i)}]})
        }));
        let mut job: Job = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "j", "namespace": "ns"},
            "spec": {"template": {"spec": {"containers": containers}}},
        }))
        .unwrap();
        assert_eq!(batch_of(&job), Some(16));
        slim_job(&mut job);
        assert_eq!(batch_of(&job), Some(16));
        let size = serde_json::to_string(&job).unwrap().len();
        assert!(size < 512, "{size} bytes");
    }
}
