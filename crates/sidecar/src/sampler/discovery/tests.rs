//! Unit tests of GPU discovery: the pure choice on plain values, and the
//! PodResources call against a gRPC server on a temporary Unix socket.

use super::*;
use bytes::Bytes;
use memprof_api::env::split_list;
use memprof_api::Condition;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn gpu(index: u32, uuid: &str) -> NvmlGpu {
    NvmlGpu {
        index,
        uuid: uuid.into(),
        mig: false,
    }
}

fn mig_gpu(index: u32, uuid: &str) -> NvmlGpu {
    NvmlGpu {
        mig: true,
        ..gpu(index, uuid)
    }
}

fn node() -> Vec<NvmlGpu> {
    vec![
        gpu(0, "GPU-aaaa"),
        gpu(1, "GPU-bbbb"),
        gpu(2, "GPU-cccc"),
        gpu(3, "GPU-dddd"),
    ]
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn pod(name: &str, ns: &str, containers: Vec<(&str, &str, Vec<&str>)>) -> PodResources {
    PodResources {
        name: name.into(),
        namespace: ns.into(),
        containers: containers
            .into_iter()
            .map(|(c, res, ids)| ContainerResources {
                name: c.into(),
                devices: vec![ContainerDevices {
                    resource_name: res.into(),
                    device_ids: strings(&ids),
                }],
            })
            .collect(),
    }
}

fn listing() -> ListPodResourcesResponse {
    ListPodResourcesResponse {
        pod_resources: vec![
            pod(
                "other",
                "ml",
                vec![("train", "nvidia.com/gpu", vec!["GPU-aaaa"])],
            ),
            pod(
                "train-0",
                "ml",
                vec![
                    ("trainer", "nvidia.com/gpu", vec!["GPU-cccc::1", "GPU-dddd"]),
                    ("memprof", "nvidia.com/gpu", vec!["GPU-bbbb"]),
                    ("nic", "rdma/hca", vec!["mlx5_0"]),
                ],
            ),
        ],
    }
}

fn opts() -> DiscoveryOptions {
    DiscoveryOptions {
        pod_name: Some("train-0".into()),
        pod_namespace: Some("ml".into()),
        own_container: Some("memprof".into()),
        ..Default::default()
    }
}

fn indices(d: &Discovery) -> Vec<u32> {
    d.gpus.iter().map(|g| g.index).collect()
}

fn assert_condition(c: &Condition, ok: bool, reason: &str, needle: &str) {
    assert_eq!(c.type_, "GpuVisible");
    assert_eq!(c.is_true(), ok, "{c:?}");
    assert_eq!(c.reason, reason, "{c:?}");
    assert!(c.message.contains(needle), "{needle:?} not in {c:?}");
}

#[test]
fn replica_suffixes_of_shared_gpus_are_stripped() {
    assert_eq!(strip_replica_suffix("GPU-aaaa::3"), "GPU-aaaa");
    assert_eq!(strip_replica_suffix("GPU-aaaa::12"), "GPU-aaaa");
    assert_eq!(strip_replica_suffix("GPU-aaaa"), "GPU-aaaa");
    assert_eq!(strip_replica_suffix("GPU-aaaa::"), "GPU-aaaa::");
    assert_eq!(strip_replica_suffix("a::b"), "a::b");
}

#[test]
fn ids_match_uuids_in_any_case_or_indices_once_each() {
    let ids = strings(&["gpu-CCCC::0", "GPU-cccc::1", "1", "GPU-zzzz", "GPU-zzzz::2"]);
    let (found, missing) = match_ids(&ids, &node());
    assert_eq!(found, vec![gpu(1, "GPU-bbbb"), gpu(2, "GPU-cccc")]);
    assert_eq!(missing, strings(&["GPU-zzzz"]));
    // torch names a GPU without NVML's prefix.
    let (found, _) = match_ids(&strings(&["dddd", "GPU-"]), &node());
    assert_eq!(found, vec![gpu(3, "GPU-dddd")]);
}

#[test]
fn the_pods_gpus_come_from_its_other_containers() {
    let ids = pod_gpu_ids(
        &listing(),
        "ml",
        "train-0",
        Some("memprof"),
        &strings(&["nvidia.com/gpu"]),
    );
    assert_eq!(ids, Some(strings(&["GPU-cccc::1", "GPU-dddd"])));
    assert_eq!(
        pod_gpu_ids(&listing(), "other-ns", "train-0", None, &[]),
        None
    );
}

#[test]
fn modes_parse_and_name_the_choices_when_wrong() {
    assert_eq!("podResources".parse(), Ok(DiscoveryMode::PodResources));
    assert_eq!(" ALL ".parse(), Ok(DiscoveryMode::All));
    assert_eq!("".parse(), Ok(DiscoveryMode::Auto));
    assert!("gpu"
        .parse::<DiscoveryMode>()
        .unwrap_err()
        .to_string()
        .contains("auto|explicit|podResources|all|agent"));
    assert_eq!(split_list(" GPU-a, ,GPU-b,"), strings(&["GPU-a", "GPU-b"]));
}

#[test]
fn the_kubelet_is_asked_when_told_or_when_its_socket_is_mounted() {
    let mut o = opts();
    assert!(o.wants_pod_resources(true));
    assert!(!o.wants_pod_resources(false));
    o.gpus = strings(&["GPU-aaaa"]);
    assert!(!o.wants_pod_resources(true), "an explicit list comes first");
    o.mode = DiscoveryMode::PodResources;
    assert!(o.wants_pod_resources(false));
    o.mode = DiscoveryMode::All;
    assert!(!o.wants_pod_resources(true));
}

#[test]
fn an_explicit_list_picks_among_nvmls_gpus() {
    let mut o = opts();
    o.gpus = strings(&["GPU-dddd", "GPU-bbbb", "GPU-gone"]);
    let all = node();
    let d = decide(&o, Ok(&all), None, &[]);
    assert_eq!(d.method, DiscoveryMethod::ExplicitUuids);
    assert_eq!(indices(&d), vec![1, 3]);
    assert_condition(
        &d.condition,
        true,
        "ExplicitUuids",
        "not found by NVML: GPU-gone",
    );

    o.gpus = strings(&["GPU-gone"]);
    let d = decide(&o, Ok(&all), None, &[]);
    assert!(d.gpus.is_empty());
    assert_condition(&d.condition, false, "ExplicitUuids", "nvidia-smi -L");

    o.gpus.clear();
    o.mode = DiscoveryMode::Explicit;
    let d = decide(&o, Ok(&all), None, &[]);
    assert_condition(
        &d.condition,
        false,
        "ExplicitUuids",
        "MEMPROF_GPUS is empty",
    );
}

#[test]
fn the_kubelets_answer_decides_and_never_falls_back_to_the_whole_node() {
    let all = node();
    let o = opts();
    let found = |ids: &[&str]| Some(PodLookup::Found(strings(ids)));

    let d = decide(&o, Ok(&all), found(&["GPU-cccc::1", "GPU-dddd"]), &[]);
    assert_eq!(d.method, DiscoveryMethod::PodResources);
    assert_eq!(indices(&d), vec![2, 3]);
    assert_condition(&d.condition, true, "PodResources", "pod ml/train-0");

    let d = decide(&o, Ok(&all), found(&["GPU-elsewhere"]), &[]);
    assert!(d.gpus.is_empty());
    assert_condition(
        &d.condition,
        false,
        "PodResources",
        "NVIDIA_VISIBLE_DEVICES=all",
    );

    let d = decide(&o, Ok(&all), found(&[]), &[]);
    assert_condition(&d.condition, false, "AgentOnly", "no nvidia.com/gpu device");

    let d = decide(&o, Ok(&all), Some(PodLookup::PodNotFound), &[]);
    assert_condition(&d.condition, false, "AgentOnly", "POD_NAME");

    let d = decide(&o, Ok(&all), Some(PodLookup::Failed("refused".into())), &[]);
    assert!(d.gpus.is_empty());
    assert_condition(&d.condition, false, "AgentOnly", "refused");
}

/// A sidecar in a pod: how many GPUs the pod requested, nothing else said.
fn requested(m: Option<u32>) -> DiscoveryOptions {
    DiscoveryOptions {
        requested_gpus: m,
        ..opts()
    }
}

#[test]
fn every_gpu_nvml_sees_only_when_the_pod_requested_at_least_as_many() {
    let all = node();
    for m in [4, 8] {
        let d = decide(&requested(Some(m)), Ok(&all), None, &[]);
        assert_eq!(d.method, DiscoveryMethod::AllVisible);
        assert_eq!(indices(&d), vec![0, 1, 2, 3]);
        assert_condition(&d.condition, true, "AllVisible", "all 4 GPU(s)");
        assert!(d
            .condition
            .message
            .contains(&format!("the {m} nvidia.com/gpu the pod requested")));
    }
}

#[test]
fn more_gpus_than_the_pod_requested_and_nothing_naming_its_own_report_none() {
    let all = node();
    for (m, needle) in [
        (Some(1), "the pod requested 1 nvidia.com/gpu"),
        (Some(3), "the pod requested 3 nvidia.com/gpu"),
        (Some(0), "the pod requests no nvidia.com/gpu"),
        (None, "MEMPROF_REQUESTED_GPUS is not set"),
    ] {
        let d = decide(&requested(m), Ok(&all), None, &[]);
        assert_eq!(d.method, DiscoveryMethod::AmbiguousGpus, "{m:?}");
        assert!(d.gpus.is_empty(), "never another tenant's GPUs: {m:?}");
        assert_condition(&d.condition, false, "AmbiguousGpus", needle);
        assert_condition(
            &d.condition,
            false,
            "AmbiguousGpus",
            "gpuAccess=podResources",
        );
        assert!(
            !d.condition.message.contains("GPU-"),
            "other tenants' GPUs are not named in this pod's report: {}",
            d.condition.message
        );
    }
}

#[test]
fn what_names_the_pods_gpus_comes_before_the_count() {
    let all = node();
    let one = requested(Some(1));

    let mut o = one.clone();
    o.gpus = strings(&["GPU-cccc"]);
    let d = decide(&o, Ok(&all), None, &[]);
    assert_eq!(
        (d.method, indices(&d)),
        (DiscoveryMethod::ExplicitUuids, vec![2])
    );

    let kubelet = Some(PodLookup::Found(strings(&["GPU-dddd"])));
    let d = decide(&one, Ok(&all), kubelet, &strings(&["GPU-aaaa"]));
    assert_eq!(
        (d.method, indices(&d)),
        (DiscoveryMethod::PodResources, vec![3])
    );

    // torch's UUIDs have no `GPU-` prefix.
    let d = decide(&one, Ok(&all), None, &strings(&["BBBB"]));
    assert_eq!(
        (d.method, indices(&d)),
        (DiscoveryMethod::AgentUuids, vec![1])
    );
    assert_condition(
        &d.condition,
        true,
        "AgentUuids",
        "named by the in-process agent",
    );

    let d = decide(&one, Ok(&all), None, &strings(&["GPU-elsewhere"]));
    assert!(d.gpus.is_empty());
    assert_condition(&d.condition, false, "AgentUuids", "GPU-elsewhere");
    assert!(
        !d.condition.message.contains("GPU-aaaa"),
        "{:?}",
        d.condition
    );
}

#[test]
fn a_machine_or_an_explicit_all_samples_every_gpu() {
    let all = node();
    let mut o = requested(None);
    o.whole_machine = true;
    let d = decide(&o, Ok(&all), None, &[]);
    assert_eq!(indices(&d), vec![0, 1, 2, 3]);
    assert_condition(
        &d.condition,
        true,
        "AllVisible",
        "all 4 GPU(s) NVML sees: GPU-aaaa",
    );

    let mut o = requested(Some(1));
    o.mode = DiscoveryMode::All;
    let d = decide(&o, Ok(&all), None, &[]);
    assert_eq!(d.method, DiscoveryMethod::AllVisible);
    assert_eq!(indices(&d), vec![0, 1, 2, 3]);

    let mut o = opts();
    o.mode = DiscoveryMode::PodResources;
    let d = decide(&o, Ok(&all), None, &[]);
    assert_condition(&d.condition, false, "AgentOnly", "not asked");
}

/// Under the device plugin's `single` strategy a pod's one
/// `nvidia.com/gpu` is a MIG instance; NVML enumerates the parent GPU only,
/// so "no more GPUs than requested" would report the parent, whose memory is
/// every tenant's. A MIG-enabled GPU is never reported as the pod's.
#[test]
fn a_mig_enabled_gpu_is_never_reported_as_the_pods() {
    let all = vec![mig_gpu(0, "GPU-aaaa")];
    let d = decide(&requested(Some(1)), Ok(&all), None, &[]);
    assert!(d.gpus.is_empty(), "{d:?}");
    assert_eq!(d.method, DiscoveryMethod::MigUnsupported);
    assert_condition(&d.condition, false, "MigUnsupported", "other tenants'");
    assert_condition(&d.condition, false, "MigUnsupported", "gpuAccess=agentOnly");

    // A machine of one's own (standalone) is no different: the instances
    // may be anyone's.
    let mut o = requested(None);
    o.whole_machine = true;
    assert_eq!(
        decide(&o, Ok(&all), None, &[]).method,
        DiscoveryMethod::MigUnsupported
    );

    // The kubelet (PodResources) or the agent names MIG instances.
    let kubelet = Some(PodLookup::Found(strings(&[
        "MIG-1b2c3d4e-0000-5000-8000-000000000001",
    ])));
    let d = decide(&opts(), Ok(&all), kubelet, &[]);
    assert!(d.gpus.is_empty());
    assert_condition(&d.condition, false, "MigUnsupported", "MIG-1b2c3d4e");
    let d = decide(&requested(Some(1)), Ok(&all), None, &strings(&["MIG-1b2c"]));
    assert_condition(&d.condition, false, "MigUnsupported", "MIG-1b2c");

    // MEMPROF_GPUS naming the MIG-enabled parent.
    let mut o = opts();
    o.gpus = strings(&["GPU-aaaa"]);
    let d = decide(&o, Ok(&all), None, &[]);
    assert!(d.gpus.is_empty());
    assert_condition(
        &d.condition,
        false,
        "MigUnsupported",
        "GPU-aaaa (GPU 0, MIG mode on)",
    );
}

/// The `mixed` strategy: whole GPUs beside MIG-enabled ones. Only whole GPUs
/// count towards the pod's `nvidia.com/gpu` and only they are reported.
#[test]
fn whole_gpus_beside_mig_ones_count_and_report_alone() {
    let all = vec![gpu(0, "GPU-aaaa"), mig_gpu(1, "GPU-bbbb")];
    let d = decide(&requested(Some(1)), Ok(&all), None, &[]);
    assert_eq!(
        (d.method, indices(&d)),
        (DiscoveryMethod::AllVisible, vec![0])
    );
    assert_condition(&d.condition, true, "AllVisible", "not sampled: GPU-bbbb");
    let mut o = opts();
    o.gpus = strings(&["GPU-aaaa", "GPU-bbbb"]);
    let d = decide(&o, Ok(&all), None, &[]);
    assert_eq!(indices(&d), vec![0]);
    assert_condition(
        &d.condition,
        true,
        "ExplicitUuids",
        "MIG devices are not supported",
    );
}

#[test]
fn the_requested_count_and_the_scope_come_from_the_environment() {
    fn vars<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k: &str| {
            pairs
                .iter()
                .find(|(name, _)| *name == k)
                .map(|(_, v)| v.to_string())
        }
    }
    let in_pod = [
        ("MEMPROF_REQUESTED_GPUS", " 2 "),
        ("KUBERNETES_SERVICE_HOST", "127.0.0.1"),
    ];
    let o = DiscoveryOptions::from_vars(vars(&in_pod)).unwrap();
    assert_eq!((o.requested_gpus, o.whole_machine), (Some(2), false));

    let o = DiscoveryOptions::from_vars(vars(&[])).unwrap();
    assert_eq!(
        (o.requested_gpus, o.whole_machine),
        (None, true),
        "a machine"
    );

    let e = DiscoveryOptions::from_vars(vars(&[("MEMPROF_REQUESTED_GPUS", "two")])).unwrap_err();
    assert_eq!(e, OptionsError::RequestedGpus("two".into()));
    assert_eq!(
        e.to_string(),
        "MEMPROF_REQUESTED_GPUS=\"two\" is not a number of GPUs"
    );
    assert!(
        !DiscoveryOptions::default().whole_machine,
        "safe by default"
    );
}

#[test]
fn no_nvml_or_no_gpu_is_said_never_sampled_as_zeros() {
    let d = decide(&opts(), Err("cannot load libnvidia-ml.so.1"), None, &[]);
    assert_eq!(d.method, DiscoveryMethod::NvmlUnavailable);
    assert!(d.gpus.is_empty());
    assert_condition(&d.condition, false, "NvmlUnavailable", "libnvidia-ml.so.1");

    let d = decide(&opts(), Ok(&[]), None, &[]);
    assert_condition(&d.condition, false, "AgentOnly", "NVML sees no GPU");

    let mut o = opts();
    o.mode = DiscoveryMode::Agent;
    let all = node();
    let d = decide(&o, Ok(&all), None, &[]);
    assert_condition(&d.condition, false, "AgentOnly", "in-process agent");
}

#[tokio::test]
async fn agent_mode_opens_no_nvml() {
    let mut o = opts();
    o.mode = DiscoveryMode::Agent;
    let (sampler, d) = open_nvml_sampler(&o).await;
    assert!(sampler.is_none());
    assert_eq!(d.method, DiscoveryMethod::AgentOnly);
}

/// What the kubelet sends holds fields this client does not declare
/// (cpu_ids, topology): protobuf must skip them.
#[test]
fn unknown_fields_of_the_real_messages_are_skipped() {
    #[derive(Clone, PartialEq, prost::Message)]
    struct FullDevices {
        #[prost(string, tag = "1")]
        resource_name: String,
        #[prost(string, repeated, tag = "2")]
        device_ids: Vec<String>,
        #[prost(bytes = "vec", tag = "3")]
        topology: Vec<u8>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    struct FullContainer {
        #[prost(string, tag = "1")]
        name: String,
        #[prost(message, repeated, tag = "2")]
        devices: Vec<FullDevices>,
        #[prost(int64, repeated, tag = "3")]
        cpu_ids: Vec<i64>,
    }
    let full = FullContainer {
        name: "trainer".into(),
        devices: vec![FullDevices {
            resource_name: "nvidia.com/gpu".into(),
            device_ids: strings(&["GPU-aaaa"]),
            topology: vec![0x0a, 0x02, 0x08, 0x01],
        }],
        cpu_ids: vec![3, 4, 5],
    };
    let bytes = prost::Message::encode_to_vec(&full);
    let ours = <ContainerResources as prost::Message>::decode(bytes.as_slice()).unwrap();
    assert_eq!(ours.name, "trainer");
    assert_eq!(ours.devices[0].device_ids, strings(&["GPU-aaaa"]));
}

#[test]
fn grpc_frames_round_trip_and_bad_ones_are_named() {
    let msg = listing();
    let framed = grpc_frame(&msg);
    assert_eq!(framed[0], 0);
    let inner = grpc_unframe(framed).unwrap();
    assert_eq!(
        <ListPodResourcesResponse as prost::Message>::decode(inner).unwrap(),
        msg
    );
    assert!(grpc_unframe(Bytes::from_static(&[0, 0]))
        .unwrap_err()
        .to_string()
        .contains("shorter"));
    assert!(grpc_unframe(Bytes::from_static(&[0, 0, 0, 0, 9, 1]))
        .unwrap_err()
        .to_string()
        .contains("9 bytes"));
}

/// A gRPC server on a temporary Unix socket that answers `List` once with
/// `answer` (a message, or a gRPC error code).
mod kubelet {
    use super::*;
    use futures::stream;
    use http_body_util::StreamBody;
    use hyper::body::Frame;
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicU32, Ordering};

    pub fn socket_path() -> PathBuf {
        static N: AtomicU32 = AtomicU32::new(0);
        std::env::temp_dir().join(format!(
            "memprof-podres-{}-{}.sock",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ))
    }

    pub fn serve(path: &Path, answer: Result<ListPodResourcesResponse, u32>) {
        let _ = std::fs::remove_file(path);
        let listener = tokio::net::UnixListener::bind(path).unwrap();
        tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let svc =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let answer = answer.clone();
                    async move {
                        assert_eq!(req.uri().path(), "/v1.PodResourcesLister/List");
                        assert_eq!(req.headers()["content-type"], "application/grpc");
                        let mut trailers = hyper::HeaderMap::new();
                        let mut frames: Vec<Result<Frame<Bytes>, Infallible>> = vec![];
                        match answer {
                            Ok(msg) => {
                                frames.push(Ok(Frame::data(grpc_frame(&msg))));
                                trailers.insert("grpc-status", "0".parse().unwrap());
                            }
                            Err(code) => {
                                trailers.insert("grpc-status", code.to_string().parse().unwrap());
                                trailers.insert("grpc-message", "unimplemented".parse().unwrap());
                            }
                        }
                        frames.push(Ok(Frame::trailers(trailers)));
                        let body = StreamBody::new(stream::iter(frames));
                        Ok::<_, Infallible>(
                            hyper::Response::builder()
                                .header("content-type", "application/grpc")
                                .body(body)
                                .unwrap(),
                        )
                    }
                });
            let _ = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                .await;
        });
    }
}

#[tokio::test]
async fn list_speaks_grpc_over_the_kubelet_socket() {
    let path = kubelet::socket_path();
    kubelet::serve(&path, Ok(listing()));
    let resp = list_pod_resources(&path, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(resp, listing());
    let _ = std::fs::remove_file(&path);
}

#[tokio::test]
async fn a_grpc_error_status_is_reported() {
    let path = kubelet::socket_path();
    kubelet::serve(&path, Err(12));
    let e = list_pod_resources(&path, Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Status { code: 12, .. }), "{e}");
    let _ = std::fs::remove_file(&path);
}

#[tokio::test]
async fn a_missing_socket_says_to_mount_it() {
    let e = list_pod_resources(
        Path::new("/nonexistent/kubelet.sock"),
        Duration::from_secs(1),
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("mounted"), "{e}");
}

#[tokio::test]
async fn a_silent_kubelet_times_out() {
    let path = kubelet::socket_path();
    let _ = std::fs::remove_file(&path);
    // Accepts, never speaks HTTP/2.
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let hold = tokio::spawn(async move {
        let (s, _) = listener.accept().await.unwrap();
        tokio::time::sleep(Duration::from_secs(5)).await;
        drop(s);
    });
    let e = list_pod_resources(&path, Duration::from_millis(200))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Timeout(_)), "{e}");
    hold.abort();
    let _ = std::fs::remove_file(&path);
}

#[tokio::test]
async fn lookup_finds_this_pods_gpus_through_the_socket() {
    let path = kubelet::socket_path();
    kubelet::serve(&path, Ok(listing()));
    let o = DiscoveryOptions {
        pod_resources_socket: path.clone(),
        ..opts()
    };
    assert_eq!(
        lookup_pod(&o).await,
        PodLookup::Found(strings(&["GPU-cccc::1", "GPU-dddd"]))
    );
    let _ = std::fs::remove_file(&path);
}
