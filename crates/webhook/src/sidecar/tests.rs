//! Unit tests of the sidecar container the webhook builds.

use super::*;

fn container(name: &str, gpus: Option<&str>, visible: Option<&str>) -> Container {
    Container {
        name: name.into(),
        resources: gpus.map(|n| ResourceRequirements {
            limits: Some([(DEFAULT_GPU_RESOURCE.to_string(), Quantity(n.into()))].into()),
            ..Default::default()
        }),
        env: visible.map(|v| vec![plain(env::NVIDIA_VISIBLE_DEVICES, v)]),
        ..Default::default()
    }
}

fn spec(containers: Vec<Container>, init: Vec<Container>) -> PodSpec {
    PodSpec {
        containers,
        init_containers: (!init.is_empty()).then_some(init),
        ..Default::default()
    }
}

fn env_of(parts: &SidecarParts, name: &str) -> Option<String> {
    parts
        .container
        .env
        .iter()
        .flatten()
        .find(|e| e.name == name)?
        .value
        .clone()
}

#[test]
fn the_pods_gpu_request_counts_trainers_and_native_sidecars_not_reused_init_gpus() {
    let s = spec(
        vec![
            container("a", Some("2"), None),
            container("b", Some("1"), None),
            container("cpu", None, None),
        ],
        vec![
            container("download", Some("1"), None),
            Container {
                restart_policy: Some("Always".into()),
                ..container("side", Some("1"), None)
            },
        ],
    );
    assert_eq!(PodGpus::of(&s).requested, 4);
    let s = spec(
        vec![container("a", Some("1"), None)],
        vec![container("warmup", Some("8"), None)],
    );
    assert_eq!(
        PodGpus::of(&s).requested,
        8,
        "held by the pod from its start"
    );
    let s = spec(vec![container("a", Some("lots"), None)], vec![]);
    assert_eq!(PodGpus::of(&s).requested, 0, "unreadable counts as none");
    let mig = Container {
        resources: Some(ResourceRequirements {
            limits: Some([("nvidia.com/mig-1g.10gb".to_string(), Quantity("1".into()))].into()),
            ..Default::default()
        }),
        ..container("mig", None, None)
    };
    assert_eq!(PodGpus::of(&spec(vec![mig], vec![])).requested, 0);
}

#[test]
fn gpus_the_trainers_name_themselves_are_copied_only_when_all_of_them_do() {
    let s = spec(
        vec![
            container("a", None, Some("GPU-aaaa,GPU-bbbb")),
            container("b", Some("1"), Some("GPU-bbbb, 3")),
            container("cpu", None, None),
        ],
        vec![],
    );
    assert_eq!(PodGpus::of(&s).named, ["GPU-aaaa", "GPU-bbbb", "3"]);
    for other in [None, Some("all"), Some("void"), Some("")] {
        let s = spec(
            vec![
                container("a", None, Some("GPU-aaaa")),
                container("b", Some("1"), other),
            ],
            vec![],
        );
        assert!(PodGpus::of(&s).named.is_empty(), "{other:?}");
    }
}

#[test]
fn the_sidecar_is_told_the_pods_gpus_in_the_modes_that_read_nvml() {
    let ctx = SidecarContext::default();
    let gpus = PodGpus {
        requested: 2,
        named: vec!["GPU-aaaa".into()],
    };
    let cfg = InjectionConfig::default();
    let p = build(&cfg, &Overrides::default(), &ctx, &gpus);
    assert_eq!(env_of(&p, env::REQUESTED_GPUS).as_deref(), Some("2"));
    assert_eq!(env_of(&p, env::GPUS).as_deref(), Some("GPU-aaaa"));

    let cfg = InjectionConfig {
        gpu_access: GpuAccess::PodResources,
        ..Default::default()
    };
    let p = build(&cfg, &Overrides::default(), &ctx, &gpus);
    assert_eq!(env_of(&p, env::REQUESTED_GPUS).as_deref(), Some("2"));
    assert_eq!(env_of(&p, env::GPUS), None, "the kubelet's answer decides");

    let cfg = InjectionConfig {
        gpu_access: GpuAccess::AgentOnly,
        ..Default::default()
    };
    let p = build(&cfg, &Overrides::default(), &ctx, &gpus);
    assert_eq!(env_of(&p, env::REQUESTED_GPUS), None);
    assert_eq!(env_of(&p, env::GPUS), None);
}

#[test]
fn an_image_override_needs_the_operators_leave_and_its_list() {
    let other = "registry.example.com/memprof/sidecar:dev";
    let wanted = Some(other);
    let mut cfg = InjectionConfig::default();
    let (image, warning) = choose_image(&cfg, wanted);
    assert_eq!(image, cfg.image);
    assert!(warning.unwrap().contains("--allow-sidecar-image-override"));

    cfg.allow_image_override = true;
    let (image, warning) = choose_image(&cfg, wanted);
    assert_eq!(image, cfg.image, "allowed, but nothing is on the list");
    assert!(warning.unwrap().contains("injection.allowedSidecarImages"));

    cfg.allowed_images = vec!["registry.example.com/memprof/*".into()];
    assert_eq!(choose_image(&cfg, wanted), (other.into(), None));
    assert_eq!(choose_image(&cfg, None), (cfg.image.clone(), None));
    let same = cfg.image.clone();
    cfg.allow_image_override = false;
    assert_eq!(
        choose_image(&cfg, Some(&same)),
        (same.clone(), None),
        "naming the configured image is no override"
    );
}
