//! Push fields the report carries as the agent measured them, cut to the
//! report's bounds: the gradient check and the reference tracker's growth.

use memprof_api::agent::{Grads, Tracking};
use memprof_api::{truncate_utf8, GradientCheck, ObjectGrowth, TensorGrowth, TrackedGrowth};

/// Names per gradient list in the report (the counts say how many there were).
pub const MAX_GRAD_NAMES: usize = 4;
/// Tensor groups and object types in the report.
pub const MAX_GROWTHS: usize = 8;

fn names(list: &[String]) -> Vec<String> {
    list.iter()
        .take(MAX_GRAD_NAMES)
        .map(|n| {
            let mut n = n.clone();
            truncate_utf8(&mut n, 128);
            n
        })
        .collect()
}

/// The report's gradient check.
pub fn gradients(g: &Grads) -> GradientCheck {
    let count = |listed: usize, told: u64| told.max(listed as u64);
    GradientCheck {
        step: g.step,
        checked: g.checked,
        non_finite: names(&g.non_finite),
        non_finite_count: count(g.non_finite.len(), g.non_finite_count),
        large: names(&g.large),
        large_count: count(g.large.len(), g.large_count),
        vanishing: names(&g.vanishing),
        vanishing_count: count(g.vanishing.len(), g.vanishing_count),
        global_norm: g.global_norm.filter(|x| x.is_finite()),
        global_norm_median: g.global_norm_median.filter(|x| x.is_finite()),
        first_non_finite_step: g.first_non_finite_step,
    }
}

/// The report's view of what the tracker saw grow.
pub fn tracking(t: &Tracking) -> TrackedGrowth {
    TrackedGrowth {
        from_step: t.from_step,
        to_step: t.to_step,
        seconds: t.seconds.filter(|x| x.is_finite()),
        live_tensors: t.live_tensors,
        live_tensor_bytes: t.live_tensor_bytes,
        tensors: t
            .tensors
            .iter()
            .take(MAX_GROWTHS)
            .map(|g| {
                let shape = g
                    .shape
                    .as_ref()
                    .map_or("(merged)".to_string(), |s| format!("{s:?}"));
                let mut group = format!("{} {} {shape}", g.device, g.dtype);
                truncate_utf8(&mut group, 160);
                let mut site = g.site.clone();
                if let Some(s) = site.as_mut() {
                    truncate_utf8(s, 128);
                }
                TensorGrowth {
                    group,
                    site,
                    count: g.count,
                    bytes: g.bytes,
                }
            })
            .collect(),
        objects: t
            .objects
            .iter()
            .take(MAX_GROWTHS)
            .map(|o| {
                let mut type_ = o.type_.clone();
                truncate_utf8(&mut type_, 64);
                ObjectGrowth {
                    type_,
                    count: o.count,
                    live: o.live,
                }
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_api::agent::{TrackedTensors, TrackedType};

    #[test]
    fn the_report_carries_bounded_gradients_and_tracking() {
        let g = Grads {
            non_finite: (0..16).map(|i| format!("layer.{i}.weight")).collect(),
            non_finite_count: 40,
            global_norm: None,
            first_non_finite_step: Some(120),
            ..Default::default()
        };
        let r = gradients(&g);
        assert_eq!((r.non_finite.len(), r.non_finite_count), (4, 40));
        assert_eq!(r.first_non_finite_step, Some(120));
        let t = Tracking {
            tensors: vec![
                TrackedTensors {
                    device: "cuda:0".into(),
                    dtype: "torch.float32".into(),
                    shape: Some(vec![1024, 1024]),
                    site: Some("train.py:42".into()),
                    count: 100,
                    bytes: 419_430_400,
                    ..Default::default()
                };
                32
            ],
            objects: vec![
                TrackedType {
                    type_: "builtins.list".into(),
                    count: 3,
                    live: 9
                };
                32
            ],
            ..Default::default()
        };
        let r = tracking(&t);
        assert_eq!((r.tensors.len(), r.objects.len()), (8, 8));
        assert_eq!(r.tensors[0].group, "cuda:0 torch.float32 [1024, 1024]");
    }
}
