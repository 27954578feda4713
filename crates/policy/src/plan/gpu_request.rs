//! `scaleBatch`'s `gpuMemoryRequest`: the recreated Job's pod template
//! asks its GPU-sharing scheduler for the GPU memory the MemoryProfile
//! recommends, in that scheduler's terms. Pure: the manifest is a value.
//!
//! The recommendation was measured on the run being replaced, which a
//! `scaleBatch` replaces because it came close to its GPU's memory; so the
//! request is only ever raised here, never lowered (a template that already
//! asks for more keeps its value), and the largest request of any role is
//! used for every GPU container of the pod (a plain Job has one role).

use super::{Plan, Step};
use memprof_api::{GpuScheduler, RemediationPolicy, RequestPlace, RoleRecommendation};
use serde_json::Value;

/// Annotation on the recreated Job: what was requested, or why nothing was.
pub const ANNOTATION_GPU_MEMORY_REQUEST: &str = "memprof.dev/gpu-memory-request";

/// Container limits that mark a container as using a GPU.
const GPU_LIMITS: [&str; 3] = [
    "nvidia.com/gpu",
    "volcano.sh/vgpu-number",
    "nvidia.com/gpumem",
];

/// The scheduler the first `scaleBatch` action of `policy` asks a GPU
/// memory request for, if any: the one reading of the option, for a Job's
/// plan and a workload's alike.
pub fn asked_gpu_request(policy: &RemediationPolicy) -> Option<GpuScheduler> {
    policy
        .spec
        .actions
        .iter()
        .filter_map(|a| a.scale_batch.as_ref())
        .find_map(|s| s.gpu_memory_request)
}

/// Applies the first `scaleBatch` action's `gpuMemoryRequest` of `policy`
/// to `plan`'s recreated Job, from `recommendation`. No recreation, or no
/// action asking for it: nothing changes.
pub fn with_gpu_request(
    plan: &mut Plan,
    policy: &RemediationPolicy,
    recommendation: &[RoleRecommendation],
) {
    let Some(scheduler) = asked_gpu_request(policy) else {
        return;
    };
    let manifest = plan.steps.iter_mut().find_map(|s| match s {
        Step::Recreate { manifest, .. } => Some(manifest),
        _ => None,
    });
    let Some(manifest) = manifest else {
        return;
    };
    let request = recommendation.iter().filter_map(|r| r.request_bytes).max();
    let note = match request {
        Some(bytes) => apply(manifest, scheduler, bytes),
        None => "none: the MemoryProfile has no recommendation yet".to_string(),
    };
    manifest["metadata"]["annotations"][ANNOTATION_GPU_MEMORY_REQUEST] = note.into();
}

/// Sets the request of `bytes` in `scheduler`'s place on `manifest`'s pod
/// template, never lowering one already there; returns what was set.
pub fn apply(manifest: &mut Value, scheduler: GpuScheduler, bytes: u64) -> String {
    let amount = scheduler.amount(bytes);
    let template = &mut manifest["spec"]["template"];
    match scheduler.place() {
        RequestPlace::PodAnnotation(key) => {
            let slot = &mut template["metadata"]["annotations"][key];
            let kept = raise(slot, amount);
            format!("{scheduler:?} annotation {key}={kept}")
        }
        RequestPlace::ContainerLimit(name) => {
            let mut set = vec![];
            let containers = template["spec"]["containers"].as_array_mut();
            for c in containers.into_iter().flatten() {
                let limits = &c["resources"]["limits"];
                if !GPU_LIMITS.iter().any(|g| !limits[*g].is_null()) {
                    continue;
                }
                let kept = raise(&mut c["resources"]["limits"][name], amount);
                set.push(format!("{}={kept}", c["name"].as_str().unwrap_or_default()));
            }
            match set.is_empty() {
                true => format!("none: no container limits a GPU resource ({name} not set)"),
                false => format!("{scheduler:?} limit {name} {}", set.join(",")),
            }
        }
    }
}

/// Sets `slot` to `amount` unless it already holds a larger number; returns the value kept.
fn raise(slot: &mut Value, amount: u64) -> u64 {
    let current = match &*slot {
        Value::String(s) => s.trim().parse::<u64>().ok(),
        Value::Number(n) => n.as_u64(),
        _ => None,
    };
    let kept = current.map_or(amount, |c| c.max(amount));
    *slot = kept.to_string().into();
    kept
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn job() -> Value {
        json!({"metadata": {"name": "train"}, "spec": {"template": {"spec": {"containers": [
            {"name": "trainer", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
            {"name": "sidecar"},
        ]}}}})
    }

    #[test]
    fn hami_and_volcano_limits_go_on_gpu_containers_only_rounded_up() {
        let mut j = job();
        let note = apply(&mut j, GpuScheduler::Hami, (1000 << 20) + 1);
        let c = &j["spec"]["template"]["spec"]["containers"];
        assert_eq!(c[0]["resources"]["limits"]["nvidia.com/gpumem"], "1001");
        assert!(c[1]["resources"].is_null(), "{c}");
        assert_eq!(note, "Hami limit nvidia.com/gpumem trainer=1001");
        apply(&mut j, GpuScheduler::Volcano, 5 << 30);
        assert_eq!(c_limit(&j, "volcano.sh/vgpu-memory"), "5120");
    }

    fn c_limit(j: &Value, name: &str) -> String {
        j["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"][name]
            .as_str()
            .unwrap()
            .to_string()
    }

    #[test]
    fn annotations_for_kai_and_runai_in_their_units() {
        let mut j = job();
        apply(&mut j, GpuScheduler::KaiScheduler, 1 << 30);
        assert_eq!(
            j["spec"]["template"]["metadata"]["annotations"]["gpu-memory"],
            "1024"
        );
        let mut j = job();
        apply(&mut j, GpuScheduler::Runai, 1 << 30);
        assert_eq!(
            j["spec"]["template"]["metadata"]["annotations"]["gpu-memory"],
            "1074"
        );
    }

    #[test]
    fn a_larger_request_already_made_is_never_lowered() {
        let mut j = job();
        j["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
            ["nvidia.com/gpumem"] = json!("40000");
        let note = apply(&mut j, GpuScheduler::Hami, 10 << 30);
        assert_eq!(c_limit(&j, "nvidia.com/gpumem"), "40000");
        assert!(note.contains("trainer=40000"), "{note}");
        apply(&mut j, GpuScheduler::Hami, 50_000 << 20);
        assert_eq!(c_limit(&j, "nvidia.com/gpumem"), "50000");
    }

    #[test]
    fn without_a_gpu_container_nothing_is_set_and_the_note_says_so() {
        let mut j = json!({"spec": {"template": {"spec": {"containers": [{"name": "cpu"}]}}}});
        let note = apply(&mut j, GpuScheduler::Hami, 1 << 30);
        assert!(
            note.starts_with("none: no container limits a GPU resource"),
            "{note}"
        );
        assert!(j["spec"]["template"]["spec"]["containers"][0]["resources"].is_null());
    }
}
