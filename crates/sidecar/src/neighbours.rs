//! Who the neighbour is, on Kubernetes: when a GPU's verdict blames another
//! process (cause `neighbour`), the kubelet's PodResources API says which
//! other pods the GPU is allocated to (time-sliced or MPS replicas `::N` of
//! one GPU), and the evidence names them.
//!
//! Tenants stay apart: a pod of this pod's namespace is named (`ml/eval-0`);
//! pods of other namespaces are only counted, as GPU discovery keeps other
//! tenants' GPUs out of a report. The kubelet is asked at most once a
//! minute, and only while some GPU's verdict names a neighbour.

use crate::sampler::discovery::{
    device_ids, list_pod_resources, same_uuid, strip_replica_suffix, DiscoveryOptions,
    ListPodResourcesResponse,
};
use memprof_api::{Cause, MemoryReportSpec, NamedCause};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often the kubelet is asked again while a neighbour is named.
const REFRESH: Duration = Duration::from_secs(60);
/// Pods of this namespace named in one evidence string.
const MAX_NAMED: usize = 3;

/// The other pods one GPU is allocated to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sharing {
    /// `namespace/name` of this namespace's pods, sorted.
    pub same_namespace: Vec<String>,
    /// How many pods of other namespaces.
    pub other_namespaces: usize,
}

impl Sharing {
    /// "kubelet: GPU shared with pod ml/eval-0 and 2 pods of other
    /// namespaces"; None when no other pod has it.
    pub fn words(&self) -> Option<String> {
        let mut parts: Vec<String> = self
            .same_namespace
            .iter()
            .take(MAX_NAMED)
            .map(|p| format!("pod {p}"))
            .collect();
        let more = self.same_namespace.len().saturating_sub(MAX_NAMED);
        if more > 0 {
            parts.push(format!("{more} more of this namespace"));
        }
        match self.other_namespaces {
            0 => {}
            1 => parts.push("1 pod of another namespace".into()),
            n => parts.push(format!("{n} pods of other namespaces")),
        }
        (!parts.is_empty()).then(|| format!("kubelet: GPU shared with {}", parts.join(" and ")))
    }
}

/// The pods other than `namespace/name` that the kubelet allocated GPU
/// `uuid` to (any container, any of `resource_names`).
pub fn sharing(
    resp: &ListPodResourcesResponse,
    namespace: &str,
    name: &str,
    uuid: &str,
    resource_names: &[String],
) -> Sharing {
    let mut s = Sharing::default();
    for pod in &resp.pod_resources {
        if pod.namespace == namespace && pod.name == name {
            continue;
        }
        let has = device_ids(pod, None, resource_names)
            .any(|id| same_uuid(strip_replica_suffix(id), uuid));
        match (has, pod.namespace == namespace) {
            (true, true) => s
                .same_namespace
                .push(format!("{}/{}", pod.namespace, pod.name)),
            (true, false) => s.other_namespaces += 1,
            _ => {}
        }
    }
    s.same_namespace.sort();
    s
}

/// The kubelet's words per GPU UUID, refreshed while a neighbour is named.
/// The kubelet is asked in a task of its own: the sampling loop never waits
/// for it (a report names what the last answer said, one analysis late at
/// most after a refresh).
pub struct Neighbours {
    /// None outside Kubernetes (no pod name, no PodResources socket).
    opts: Option<Arc<DiscoveryOptions>>,
    asked: Option<Instant>,
    words: Arc<Mutex<BTreeMap<String, String>>>,
}

impl Neighbours {
    /// From the discovery environment; inactive where the kubelet cannot
    /// be asked.
    pub fn from_env() -> Self {
        let opts = DiscoveryOptions::from_env().ok().filter(|o| {
            o.pod_name.is_some() && o.pod_namespace.is_some() && o.pod_resources_socket.exists()
        });
        Neighbours {
            opts: opts.map(Arc::new),
            asked: None,
            words: Arc::default(),
        }
    }

    /// Appends the kubelet's words to the evidence of every GPU whose cause
    /// is `neighbour`, starting a refresh of them when due.
    pub fn name(&mut self, report: &mut MemoryReportSpec) {
        let blamed = report.gpus.iter().any(|g| {
            g.cause
                .as_ref()
                .is_some_and(|c| c.cause == Cause::Neighbour)
        });
        if !blamed {
            return;
        }
        if self.asked.is_none_or(|t| t.elapsed() >= REFRESH) {
            self.asked = Some(Instant::now());
            self.refresh(report);
        }
        name_in(
            report,
            &self.words.lock().unwrap_or_else(|e| e.into_inner()),
        );
    }

    /// Asks the kubelet, in a task, which pods share each of `report`'s GPUs.
    fn refresh(&self, report: &MemoryReportSpec) {
        let Some(o) = self.opts.clone() else { return };
        let uuids: Vec<String> = report.gpus.iter().map(|g| g.uuid.clone()).collect();
        let words = self.words.clone();
        tokio::spawn(async move {
            let (Some(ns), Some(pod)) = (&o.pod_namespace, &o.pod_name) else {
                return;
            };
            match list_pod_resources(&o.pod_resources_socket, o.timeout).await {
                Ok(resp) => {
                    let fresh = uuids
                        .iter()
                        .filter_map(|u| {
                            let s = sharing(&resp, ns, pod, u, &o.resource_names);
                            Some((u.clone(), s.words()?))
                        })
                        .collect();
                    *words.lock().unwrap_or_else(|e| e.into_inner()) = fresh;
                }
                Err(e) => tracing::debug!(error = %e, "PodResources: neighbours not named"),
            }
        });
    }
}

/// The words of `words` (by GPU UUID) added to each neighbour cause.
fn name_in(report: &mut MemoryReportSpec, words: &BTreeMap<String, String>) {
    for g in &mut report.gpus {
        let Some(w) = words.get(&g.uuid) else {
            continue;
        };
        if let Some(c) = g.cause.as_mut().filter(|c| c.cause == Cause::Neighbour) {
            *c = NamedCause::new(c.cause, format!("{}; {w}", c.evidence));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::discovery::{ContainerDevices, ContainerResources, PodResources};
    use memprof_api::GpuReport;

    fn pod(ns: &str, name: &str, ids: &[&str]) -> PodResources {
        PodResources {
            name: name.into(),
            namespace: ns.into(),
            containers: vec![ContainerResources {
                name: "train".into(),
                devices: vec![ContainerDevices {
                    resource_name: "nvidia.com/gpu".into(),
                    device_ids: ids.iter().map(|s| s.to_string()).collect(),
                }],
            }],
        }
    }

    fn node() -> ListPodResourcesResponse {
        ListPodResourcesResponse {
            pod_resources: vec![
                pod("ml", "train-0", &["GPU-aaaa::0"]),
                pod("ml", "eval-0", &["GPU-AAAA::1"]),
                pod("other", "notebook", &["gpu-aaaa::2"]),
                pod("other", "far", &["GPU-bbbb"]),
                pod("third", "job", &["GPU-aaaa::3"]),
            ],
        }
    }

    #[test]
    fn the_pods_sharing_a_gpu_are_named_in_this_namespace_and_counted_in_others() {
        let names = vec!["nvidia.com/gpu".to_string()];
        let s = sharing(&node(), "ml", "train-0", "GPU-aaaa", &names);
        assert_eq!(s.same_namespace, ["ml/eval-0"]);
        assert_eq!(s.other_namespaces, 2);
        assert_eq!(
            s.words().unwrap(),
            "kubelet: GPU shared with pod ml/eval-0 and 2 pods of other namespaces"
        );
        let alone = sharing(&node(), "other", "far", "GPU-bbbb", &names);
        assert_eq!(alone, Sharing::default());
        assert_eq!(alone.words(), None);
        let unlisted = sharing(
            &node(),
            "ml",
            "train-0",
            "GPU-aaaa",
            &["amd.com/gpu".into()],
        );
        assert_eq!(unlisted.words(), None);
    }

    #[test]
    fn only_a_neighbour_cause_gets_the_kubelets_words() {
        let gpu = |uuid: &str, cause| GpuReport {
            uuid: uuid.into(),
            cause: Some(NamedCause::new(cause, "pid 4242 holds 31GiB")),
            ..Default::default()
        };
        let mut r = MemoryReportSpec {
            gpus: vec![
                gpu("GPU-aaaa", Cause::Neighbour),
                gpu("GPU-bbbb", Cause::Leak),
            ],
            ..Default::default()
        };
        let words = BTreeMap::from([
            (
                "GPU-aaaa".to_string(),
                "kubelet: GPU shared with pod ml/eval-0".to_string(),
            ),
            (
                "GPU-bbbb".to_string(),
                "kubelet: GPU shared with pod ml/x".to_string(),
            ),
        ]);
        name_in(&mut r, &words);
        assert_eq!(
            r.gpus[0].cause.as_ref().unwrap().evidence,
            "pid 4242 holds 31GiB; kubelet: GPU shared with pod ml/eval-0"
        );
        assert_eq!(
            r.gpus[1].cause.as_ref().unwrap().evidence,
            "pid 4242 holds 31GiB"
        );
    }
}
