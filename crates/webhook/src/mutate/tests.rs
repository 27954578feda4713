//! Unit tests of the injection on plain JSON values, the way the API server
//! sends them.

use super::*;
use crate::config::{GpuAccess, ServiceAccountTokenMode};
use crate::marks::Caller;
use crate::sidecar::{POD_RESOURCES_PATH, SOCKET_VOLUME, TOKEN_VOLUME};

fn cfg() -> InjectionConfig {
    InjectionConfig {
        image: "memprof:test".into(),
        ..Default::default()
    }
}

fn native() -> InjectionConfig {
    InjectionConfig {
        native_sidecar: true,
        ..cfg()
    }
}

/// A Job as the API server sends it to admission (defaults applied).
fn job() -> Value {
    json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "train",
            "namespace": "ml",
            "annotations": { "memprof.dev/enabled": "true" }
        },
        "spec": {
            "parallelism": 4,
            "completions": 4,
            "template": {
                "metadata": { "labels": { "app": "train" } },
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{
                        "name": "trainer",
                        "image": "pytorch:2",
                        "terminationMessagePolicy": "File"
                    }]
                }
            }
        }
    })
}

fn pod() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": "p", "labels": { "memprof.dev/inject": "true" } },
        "spec": { "containers": [{ "name": "trainer", "image": "pytorch:2" }] }
    })
}

/// Applies the injection and returns the mutated object.
fn mutated(target: Target, obj: &Value, cfg: &InjectionConfig) -> (Value, Vec<String>) {
    let inj = injection_patch(target, obj, cfg).expect("valid object");
    let mut out = obj.clone();
    json_patch::patch(&mut out, &inj.patch.expect("a patch")).expect("patch applies");
    (out, inj.warnings)
}

fn pod_spec(obj: &Value) -> &Value {
    obj.pointer("/spec/template/spec").unwrap_or(&obj["spec"])
}

fn sidecar(obj: &Value) -> &Value {
    let spec = pod_spec(obj);
    let all = spec["containers"]
        .as_array()
        .into_iter()
        .chain(spec["initContainers"].as_array())
        .flatten();
    let found: Vec<&Value> = all.filter(|c| c["name"] == SIDECAR_CONTAINER).collect();
    assert_eq!(found.len(), 1, "exactly one sidecar in {spec}");
    found[0]
}

fn env<'a>(c: &'a Value, name: &str) -> Option<&'a Value> {
    c["env"].as_array()?.iter().find(|e| e["name"] == name)
}

fn env_value(c: &Value, name: &str) -> Option<String> {
    env(c, name)?["value"].as_str().map(str::to_string)
}

fn names(list: &Value) -> Vec<&str> {
    let all = list.as_array().into_iter().flatten();
    all.map(|v| v["name"].as_str().unwrap_or("")).collect()
}

fn scraped() -> InjectionConfig {
    InjectionConfig {
        scrape: true,
        ..cfg()
    }
}

fn field_path(c: &Value, name: &str) -> Option<String> {
    env(c, name)?
        .pointer("/valueFrom/fieldRef/fieldPath")?
        .as_str()
        .map(str::to_string)
}

#[test]
fn legacy_sidecar_on_old_servers() {
    let (out, warnings) = mutated(Target::Job, &job(), &cfg());
    assert!(warnings.is_empty(), "{warnings:?}");
    let spec = pod_spec(&out);
    assert_eq!(spec["containers"].as_array().unwrap().len(), 2);
    assert!(spec.get("initContainers").is_none());
    let c = sidecar(&out);
    assert_eq!(c["image"], "memprof:test");
    assert!(c.get("restartPolicy").is_none());
    assert_eq!(
        env_value(c, "MEMPROF_EXIT_WHEN_ALONE").as_deref(),
        Some("true")
    );
    assert_eq!(env_value(c, "MEMPROF_JOB_NAME").as_deref(), Some("train"));
    assert_eq!(env_value(c, "MEMPROF_EXPECTED_RANKS").as_deref(), Some("4"));
    assert_eq!(env_value(c, "MEMPROF_INTERVAL").as_deref(), Some("1000ms"));
    assert_eq!(
        env_value(c, "MEMPROF_PORT"),
        None,
        "no scraping: loopback only"
    );
    assert_eq!(
        env_value(c, "MEMPROF_LISTEN").as_deref(),
        Some("127.0.0.1:9464")
    );
    assert!(c.get("ports").is_none());
    assert_eq!(field_path(c, "POD_NAME").as_deref(), Some("metadata.name"));
    assert_eq!(
        field_path(c, "POD_NAMESPACE").as_deref(),
        Some("metadata.namespace")
    );
    assert_eq!(field_path(c, "NODE_NAME").as_deref(), Some("spec.nodeName"));
    assert_eq!(field_path(c, "POD_UID").as_deref(), Some("metadata.uid"));
    assert!(env(c, "JOB_COMPLETION_INDEX").is_none());
    assert_eq!(
        out.pointer("/spec/template/metadata/annotations/memprof.dev~1injected"),
        Some(&json!("true"))
    );
    // The template's labels are untouched.
    assert_eq!(
        out["spec"]["template"]["metadata"]["labels"]["app"],
        "train"
    );
}

#[test]
fn native_sidecar_appended_after_user_init_containers() {
    let mut j = job();
    j["spec"]["template"]["spec"]["initContainers"] = json!([{ "name": "fetch", "image": "x" }]);
    let (out, _) = mutated(Target::Job, &j, &native());
    let spec = pod_spec(&out);
    assert_eq!(spec["containers"].as_array().unwrap().len(), 1);
    let init = spec["initContainers"].as_array().unwrap();
    assert_eq!(init.len(), 2);
    assert_eq!(init[0]["name"], "fetch");
    assert_eq!(init[1]["name"], SIDECAR_CONTAINER);
    assert_eq!(init[1]["restartPolicy"], "Always");
    assert!(env(&init[1], "MEMPROF_EXIT_WHEN_ALONE").is_none());

    // Without init containers the list is created.
    let (out, _) = mutated(Target::Job, &job(), &native());
    assert_eq!(
        pod_spec(&out)["initContainers"][0]["name"],
        SIDECAR_CONTAINER
    );
}

#[test]
fn idempotent() {
    for cfg in [cfg(), native()] {
        let (once, _) = mutated(Target::Job, &job(), &cfg);
        let again = injection_patch(Target::Job, &once, &cfg).unwrap();
        assert_eq!(again, Injection::default());
    }
    // A sidecar the user added by hand (init or regular) also counts.
    let mut p = pod();
    p["spec"]["initContainers"] = json!([{ "name": SIDECAR_CONTAINER, "image": "mine" }]);
    assert_eq!(
        injection_patch(Target::Pod, &p, &cfg()).unwrap().patch,
        None
    );
}

#[test]
fn gpu_access_modes() {
    let with = |gpu_access| InjectionConfig {
        gpu_access,
        ..cfg()
    };

    let (out, _) = mutated(Target::Job, &job(), &with(GpuAccess::Envvar));
    let c = sidecar(&out);
    assert_eq!(
        env_value(c, "NVIDIA_VISIBLE_DEVICES").as_deref(),
        Some("all")
    );
    assert_eq!(
        env_value(c, "NVIDIA_DRIVER_CAPABILITIES").as_deref(),
        Some("utility")
    );
    assert!(env(c, "MEMPROF_GPU_DISCOVERY").is_none());
    assert_eq!(
        names(&pod_spec(&out)["volumes"]),
        [SOCKET_VOLUME, TOKEN_VOLUME]
    );
    assert_eq!(names(&c["volumeMounts"]), [SOCKET_VOLUME, TOKEN_VOLUME]);
    assert_eq!(c["securityContext"]["runAsNonRoot"], true);
    assert_eq!(c["securityContext"]["runAsUser"], 65532);

    let (out, _) = mutated(Target::Job, &job(), &with(GpuAccess::PodResources));
    let c = sidecar(&out);
    assert_eq!(
        env_value(c, "NVIDIA_VISIBLE_DEVICES").as_deref(),
        Some("all")
    );
    assert_eq!(
        env_value(c, "MEMPROF_GPU_DISCOVERY").as_deref(),
        Some("podResources")
    );
    let vols = pod_spec(&out)["volumes"].as_array().unwrap();
    assert_eq!(vols.len(), 3, "socket, kubelet, token");
    assert_eq!(vols[1]["hostPath"]["path"], POD_RESOURCES_PATH);
    assert_eq!(c["volumeMounts"][1]["mountPath"], POD_RESOURCES_PATH);
    assert_eq!(c["volumeMounts"][1]["readOnly"], true);

    let (out, _) = mutated(Target::Job, &job(), &with(GpuAccess::AgentOnly));
    let c = sidecar(&out);
    assert_eq!(
        env_value(c, "MEMPROF_GPU_DISCOVERY").as_deref(),
        Some("agentOnly")
    );
    assert_eq!(
        env_value(c, "NVIDIA_VISIBLE_DEVICES").as_deref(),
        Some("void")
    );
    assert!(env(c, "NVIDIA_DRIVER_CAPABILITIES").is_none());
    assert_eq!(
        names(&pod_spec(&out)["volumes"]),
        [SOCKET_VOLUME, TOKEN_VOLUME]
    );
}

#[test]
fn pod_resources_volume_appended_to_existing_volumes() {
    let mut j = job();
    j["spec"]["template"]["spec"]["volumes"] = json!([{ "name": "data", "emptyDir": {} }]);
    let cfg = InjectionConfig {
        gpu_access: GpuAccess::PodResources,
        ..cfg()
    };
    let (out, _) = mutated(Target::Job, &j, &cfg);
    assert_eq!(
        names(&pod_spec(&out)["volumes"]),
        ["data", SOCKET_VOLUME, "memprof-pod-resources", TOKEN_VOLUME]
    );
}

#[test]
fn security_context_is_restricted() {
    let (out, _) = mutated(Target::Job, &job(), &cfg());
    let sc = &sidecar(&out)["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
}

#[test]
fn annotation_overrides() {
    let mut j = job();
    let a = &mut j["metadata"]["annotations"];
    a["memprof.dev/sidecar-image"] = json!("registry.local/memprof:dev");
    a["memprof.dev/interval"] = json!("100ms");
    a["memprof.dev/port"] = json!("9500");
    let allowed = InjectionConfig {
        allow_image_override: true,
        allowed_images: vec!["registry.local/memprof:*".into()],
        ..scraped()
    };
    let (out, warnings) = mutated(Target::Job, &j, &allowed);
    assert!(warnings.is_empty(), "{warnings:?}");
    let c = sidecar(&out);
    assert_eq!(c["image"], "registry.local/memprof:dev");
    assert_eq!(env_value(c, "MEMPROF_INTERVAL").as_deref(), Some("100ms"));
    assert_eq!(env_value(c, "MEMPROF_PORT").as_deref(), Some("9500"));
    assert_eq!(c["ports"][0]["containerPort"], 9500);
    let (out, _) = mutated(Target::Job, &j, &cfg());
    assert_eq!(
        env_value(sidecar(&out), "MEMPROF_LISTEN").as_deref(),
        Some("127.0.0.1:9500")
    );
}

/// The sidecar sees every GPU of the node: whoever picks its image runs code
/// with that access, so only the operator's list may be picked.
#[test]
fn sidecar_image_overrides_are_ignored_with_a_warning_unless_allowed_and_listed() {
    let mut j = job();
    j["metadata"]["annotations"]["memprof.dev/sidecar-image"] = json!("docker.io/someone/miner:1");
    let listed = InjectionConfig {
        allow_image_override: true,
        allowed_images: vec!["registry.example.com/memprof/*".into()],
        ..cfg()
    };
    let off = cfg();
    for c in [&off, &listed] {
        let (out, warnings) = mutated(Target::Job, &j, c);
        assert_eq!(sidecar(&out)["image"], "memprof:test");
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0]
                .contains("ignoring memprof.dev/sidecar-image=\"docker.io/someone/miner:1\""),
            "{warnings:?}"
        );
    }
    // The override may sit on the pod template too.
    let mut j = job();
    j["spec"]["template"]["metadata"]["annotations"] =
        json!({ "memprof.dev/sidecar-image": "registry.example.com/memprof/sidecar:2" });
    let (out, warnings) = mutated(Target::Job, &j, &listed);
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(
        sidecar(&out)["image"],
        "registry.example.com/memprof/sidecar:2"
    );
    let (out, _) = mutated(Target::Job, &j, &off);
    assert_eq!(sidecar(&out)["image"], "memprof:test");
}

/// The sidecar gets `NVIDIA_VISIBLE_DEVICES=all`: it is told how many GPUs
/// the pod asked for, to know whether all it sees are the pod's.
#[test]
fn the_sidecar_is_told_how_many_gpus_the_trainers_requested() {
    let mut j = job();
    j["spec"]["template"]["spec"]["containers"][0]["resources"] =
        json!({ "limits": { "nvidia.com/gpu": "2" } });
    let (out, _) = mutated(Target::Job, &j, &cfg());
    assert_eq!(
        env_value(sidecar(&out), "MEMPROF_REQUESTED_GPUS").as_deref(),
        Some("2")
    );
    let (out, _) = mutated(Target::Pod, &pod(), &cfg());
    assert_eq!(
        env_value(sidecar(&out), "MEMPROF_REQUESTED_GPUS").as_deref(),
        Some("0")
    );
}

#[test]
fn bad_overrides_warn_and_fall_back() {
    let mut j = job();
    let a = &mut j["metadata"]["annotations"];
    a["memprof.dev/interval"] = json!("fast");
    a["memprof.dev/port"] = json!("99999");
    a["memprof.dev/sidecar-image"] = json!("");
    let (out, warnings) = mutated(Target::Job, &j, &cfg());
    assert_eq!(warnings.len(), 3, "{warnings:?}");
    let c = sidecar(&out);
    assert_eq!(c["image"], "memprof:test");
    assert_eq!(env_value(c, "MEMPROF_INTERVAL").as_deref(), Some("1000ms"));
    assert_eq!(
        env_value(c, "MEMPROF_LISTEN").as_deref(),
        Some("127.0.0.1:9464")
    );
}

#[test]
fn port_clash_warns() {
    let mut j = job();
    j["spec"]["template"]["spec"]["containers"][0]["ports"] = json!([{ "containerPort": 9464 }]);
    let (_, warnings) = mutated(Target::Job, &j, &cfg());
    assert_eq!(warnings.len(), 1);
    assert!(warnings[0].contains("9464"), "{warnings:?}");
}

#[test]
fn termination_message_policy() {
    let mut j = job();
    j["spec"]["template"]["spec"]["containers"] = json!([
        { "name": "defaulted", "image": "x", "terminationMessagePolicy": "File" },
        { "name": "unset", "image": "x" },
        { "name": "chosen", "image": "x", "terminationMessagePolicy": "FallbackToLogsOnError" },
    ]);
    let inj = injection_patch(Target::Job, &j, &cfg()).unwrap();
    let touched: Vec<String> = inj
        .patch
        .as_ref()
        .unwrap()
        .0
        .iter()
        .map(|op| op.path().to_string())
        .filter(|p| p.ends_with("terminationMessagePolicy"))
        .collect();
    // The user's explicit FallbackToLogsOnError needs no operation.
    assert_eq!(
        touched,
        [
            "/spec/template/spec/containers/0/terminationMessagePolicy",
            "/spec/template/spec/containers/1/terminationMessagePolicy"
        ]
    );
    let (out, _) = mutated(Target::Job, &j, &cfg());
    for c in pod_spec(&out)["containers"].as_array().unwrap() {
        assert_eq!(
            c["terminationMessagePolicy"], "FallbackToLogsOnError",
            "{c}"
        );
    }

    // Opt-out keeps whatever the user set.
    j["metadata"]["annotations"]["memprof.dev/termination-message-policy"] = json!("keep");
    let (out, _) = mutated(Target::Job, &j, &cfg());
    let cs = pod_spec(&out)["containers"].as_array().unwrap();
    assert_eq!(cs[0]["terminationMessagePolicy"], "File");
    assert!(cs[1].get("terminationMessagePolicy").is_none());
}

#[test]
fn indexed_job_gets_completion_index() {
    let mut j = job();
    j["spec"]["completionMode"] = json!("Indexed");
    let (out, _) = mutated(Target::Job, &j, &cfg());
    assert_eq!(
        field_path(sidecar(&out), "JOB_COMPLETION_INDEX").as_deref(),
        Some("metadata.annotations['batch.kubernetes.io/job-completion-index']")
    );
}

#[test]
fn generated_job_name_read_from_pod_label() {
    let mut j = job();
    j["metadata"].as_object_mut().unwrap().remove("name");
    j["metadata"]["generateName"] = json!("train-");
    let (out, _) = mutated(Target::Job, &j, &cfg());
    assert_eq!(
        field_path(sidecar(&out), "MEMPROF_JOB_NAME").as_deref(),
        Some("metadata.labels['job-name']")
    );
}

#[test]
fn template_without_metadata_or_annotations() {
    let mut j = job();
    j["spec"]["template"]
        .as_object_mut()
        .unwrap()
        .remove("metadata");
    let (out, _) = mutated(Target::Job, &j, &cfg());
    assert_eq!(
        out["spec"]["template"]["metadata"]["annotations"]["memprof.dev/injected"],
        "true"
    );

    let mut j = job();
    j["spec"]["template"]["metadata"]["annotations"] = json!({ "keep": "me" });
    let (out, _) = mutated(Target::Job, &j, &cfg());
    let a = &out["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(a["keep"], "me");
    assert_eq!(a["memprof.dev/injected"], "true");
}

#[test]
fn service_account_token_is_projected_into_the_sidecar_unless_respected() {
    // Whatever the pod says: only a pod-bound token makes the report count.
    for automount in [None, Some(false), Some(true)] {
        let mut j = job();
        if let Some(a) = automount {
            j["spec"]["template"]["spec"]["automountServiceAccountToken"] = json!(a);
        }
        let (out, _) = mutated(Target::Job, &j, &cfg());
        assert_eq!(
            pod_spec(&out)["volumes"][1]["name"],
            TOKEN_VOLUME,
            "{automount:?}"
        );
        assert_eq!(
            sidecar(&out)["volumeMounts"][1]["mountPath"],
            "/var/run/secrets/kubernetes.io/serviceaccount"
        );
        // Only the sidecar mounts it.
        assert_eq!(
            names(&pod_spec(&out)["containers"][0]["volumeMounts"]),
            [SOCKET_VOLUME]
        );
    }

    let respect = InjectionConfig {
        service_account_token: ServiceAccountTokenMode::Respect,
        ..cfg()
    };
    let mut j = job();
    j["spec"]["template"]["spec"]["automountServiceAccountToken"] = json!(false);
    let (out, _) = mutated(Target::Job, &j, &respect);
    assert_eq!(names(&pod_spec(&out)["volumes"]), [SOCKET_VOLUME]);
}

/// The sidecar mounts the socket's volume read-write (it creates the
/// socket) and is told where the socket is.
fn sidecar_creates_the_socket(side: &serde_json::Value) {
    assert_eq!(
        env_value(side, "MEMPROF_AGENT_SOCKET").as_deref(),
        Some("/var/run/memprof/agent.sock")
    );
    let m = &side["volumeMounts"][0];
    assert_eq!(
        (&m["name"], &m["mountPath"]),
        (&json!(SOCKET_VOLUME), &json!("/var/run/memprof"))
    );
    assert!(
        m.get("readOnly").is_none(),
        "the sidecar creates the socket"
    );
}

/// A trainer container mounts the socket read-only and is pointed at it,
/// never at a TCP port.
fn trainer_reads_the_socket(t: &serde_json::Value) {
    assert_eq!(
        env_value(t, "MEMPROF_AGENT_SOCKET").as_deref(),
        Some("/var/run/memprof/agent.sock"),
        "{t}"
    );
    assert!(env(t, "MEMPROF_AGENT_URL").is_none(), "{t}");
    let mounts = t["volumeMounts"].as_array().unwrap();
    let socket = mounts
        .iter()
        .find(|m| m["name"] == SOCKET_VOLUME)
        .expect("mounted");
    assert_eq!(
        (&socket["mountPath"], &socket["readOnly"]),
        (&json!("/var/run/memprof"), &json!(true))
    );
}

/// Contract A: the agent reaches the sidecar through a
/// Unix socket on an emptyDir that only the pod's containers mount (the
/// sidecar read-write, every trainer read-only), in both sidecar modes and
/// for bare pods; nothing points the agent at a TCP port.
#[test]
fn the_agent_socket_is_private_to_the_pod_in_both_sidecar_modes() {
    let mut j = job();
    j["spec"]["template"]["spec"]["containers"] = json!([
        { "name": "trainer", "image": "x" },
        { "name": "helper", "image": "x", "volumeMounts": [{ "name": "data", "mountPath": "/data" }],
          "env": [{ "name": "A", "value": "1" }] },
    ]);
    let cases = [
        (Target::Job, &j, cfg()),
        (Target::Job, &j, native()),
        (Target::Pod, &pod(), cfg()),
    ];
    for (target, obj, c) in cases {
        let (out, warnings) = mutated(target, obj, &c);
        assert!(warnings.is_empty(), "{warnings:?}");
        let spec = pod_spec(&out);
        let volume = &spec["volumes"][0];
        assert_eq!(volume["name"], SOCKET_VOLUME);
        assert!(volume["emptyDir"].is_object(), "{volume}");
        sidecar_creates_the_socket(sidecar(&out));
        for t in spec["containers"].as_array().unwrap() {
            if t["name"] != SIDECAR_CONTAINER {
                trainer_reads_the_socket(t);
            }
        }
        if obj == &j {
            let helper = &spec["containers"][1];
            assert_eq!(names(&helper["volumeMounts"]), ["data", SOCKET_VOLUME]);
            assert_eq!(
                env_value(helper, "A").as_deref(),
                Some("1"),
                "its own env kept"
            );
        }
    }
}

/// `/metrics` is on the pod IP (a declared port, `MEMPROF_PORT`) only when
/// Prometheus scrapes the sidecars; otherwise on loopback.
#[test]
fn metrics_are_on_the_pod_ip_only_when_scraped() {
    let (out, _) = mutated(Target::Job, &job(), &scraped());
    let c = sidecar(&out);
    assert_eq!(env_value(c, "MEMPROF_PORT").as_deref(), Some("9464"));
    assert!(env(c, "MEMPROF_LISTEN").is_none());
    assert_eq!(c["ports"][0]["containerPort"], 9464);
    let (out, _) = mutated(Target::Job, &job(), &cfg());
    let c = sidecar(&out);
    assert!(env(c, "MEMPROF_PORT").is_none());
    assert_eq!(
        env_value(c, "MEMPROF_LISTEN").as_deref(),
        Some("127.0.0.1:9464")
    );
    assert!(c.get("ports").is_none());
}

#[test]
fn labelled_pod_is_injected() {
    let (out, _) = mutated(Target::Pod, &pod(), &native());
    let c = sidecar(&out);
    assert_eq!(c["restartPolicy"], "Always");
    assert!(env(c, "MEMPROF_JOB_NAME").is_none());
    assert!(env(c, "MEMPROF_EXPECTED_RANKS").is_none());
    assert_eq!(
        out["metadata"]["annotations"]["memprof.dev/injected"],
        "true"
    );
}

#[test]
fn non_matching_objects_untouched() {
    let mut j = job();
    j["metadata"]["annotations"]["memprof.dev/enabled"] = json!("false");
    assert_eq!(
        injection_patch(Target::Job, &j, &cfg()).unwrap(),
        Injection::default()
    );
    j["metadata"].as_object_mut().unwrap().remove("annotations");
    assert_eq!(
        injection_patch(Target::Job, &j, &cfg()).unwrap(),
        Injection::default()
    );
    // Enabling on the template only is not enough: the Job is the switch.
    j["spec"]["template"]["metadata"]["annotations"] = json!({ "memprof.dev/enabled": "true" });
    assert_eq!(
        injection_patch(Target::Job, &j, &cfg()).unwrap(),
        Injection::default()
    );

    let mut p = pod();
    p["metadata"]["labels"]["memprof.dev/inject"] = json!("no");
    assert_eq!(
        injection_patch(Target::Pod, &p, &cfg()).unwrap(),
        Injection::default()
    );
}

fn review(kind: (&str, &str), operation: &str, object: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0c9a8d74-9cb7-44dd-b98e-09fd62def2f4",
            "kind": { "group": kind.0, "version": "v1", "kind": kind.1 },
            "resource": { "group": kind.0, "version": "v1", "resource": "x" },
            "name": "train",
            "namespace": "ml",
            "operation": operation,
            "userInfo": { "username": "me" },
            "object": object
        }
    }))
    .unwrap()
}

fn response(r: &Value) -> Value {
    // What goes over the wire.
    let wire: Value = serde_json::from_slice(&serde_json::to_vec(r).unwrap()).unwrap();
    assert_eq!(wire["kind"], "AdmissionReview");
    assert_eq!(wire["apiVersion"], "admission.k8s.io/v1");
    wire["response"].clone()
}

#[test]
fn admission_review_round_trip() {
    let out = response(&admit_review(
        &review(("batch", "Job"), "CREATE", job()),
        &cfg(),
        Caller::ApiServer,
    ));
    assert_eq!(out["uid"], "0c9a8d74-9cb7-44dd-b98e-09fd62def2f4");
    assert_eq!(out["allowed"], true);
    assert_eq!(out["patchType"], "JSONPatch");
    use base64::Engine as _;
    let patch = base64::engine::general_purpose::STANDARD
        .decode(out["patch"].as_str().unwrap())
        .unwrap();
    let patch: Patch = serde_json::from_slice(&patch).unwrap();
    let mut j = job();
    json_patch::patch(&mut j, &patch).unwrap();
    sidecar(&j);
}

#[test]
fn admission_ignores_other_operations_and_kinds() {
    for body in [
        review(("batch", "Job"), "UPDATE", job()),
        review(("apps", "Deployment"), "CREATE", job()),
    ] {
        let out = response(&admit_review(&body, &cfg(), Caller::ApiServer));
        assert_eq!(out["allowed"], true);
        assert!(out.get("patch").is_none(), "{out}");
    }
}

#[test]
fn malformed_requests_are_allowed_with_a_warning() {
    let mut j = job();
    j["spec"]["template"]["spec"]["containers"] = json!("not a list");
    let out = response(&admit_review(
        &review(("batch", "Job"), "CREATE", j),
        &cfg(),
        Caller::ApiServer,
    ));
    assert_eq!(out["allowed"], true);
    assert!(out.get("patch").is_none());
    assert!(
        out["warnings"][0]
            .as_str()
            .unwrap()
            .contains("not injected"),
        "{out}"
    );

    let body =
        br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u-1"}}"#;
    let out = response(&admit_review(body, &cfg(), Caller::ApiServer));
    assert_eq!(out["allowed"], true);
    assert_eq!(out["uid"], "u-1");
    assert!(
        out["warnings"][0].as_str().unwrap().contains("malformed"),
        "{out}"
    );

    let out = response(&admit_review(b"garbage", &cfg(), Caller::ApiServer));
    assert_eq!(out["allowed"], true);
}

#[test]
fn injected_pods_are_labelled_for_the_pod_monitor_whatever_metadata_they_had() {
    let (out, _) = mutated(Target::Job, &job(), &cfg());
    let labels = &out["spec"]["template"]["metadata"]["labels"];
    assert_eq!(
        (&labels["app"], &labels["memprof.dev/injected"]),
        (&json!("train"), &json!("true"))
    );
    let mut bare = job();
    bare["spec"]["template"]
        .as_object_mut()
        .unwrap()
        .remove("metadata");
    let (out, _) = mutated(Target::Job, &bare, &cfg());
    let meta = &out["spec"]["template"]["metadata"];
    assert_eq!(meta["labels"]["memprof.dev/injected"], "true");
    assert_eq!(meta["annotations"]["memprof.dev/injected"], "true");
    let (out, _) = mutated(Target::Pod, &pod(), &scraped());
    assert_eq!(out["metadata"]["labels"]["memprof.dev/injected"], "true");
    assert_eq!(sidecar(&out)["ports"][0]["name"], "memprof-metrics");
}

#[test]
fn thresholds_log_format_and_security_context_reach_the_sidecar() {
    let cluster = InjectionConfig {
        thresholds: memprof_api::thresholds::parse_cluster(r#"{"highTtoSeconds":900}"#).unwrap(),
        log_json: true,
        security_context: Some(serde_json::from_value(json!({"runAsUser": 1234})).unwrap()),
        ..cfg()
    };
    let (out, warnings) = mutated(Target::Job, &job(), &cluster);
    assert!(warnings.is_empty(), "{warnings:?}");
    let c = sidecar(&out);
    assert_eq!(
        env_value(c, "MEMPROF_THRESHOLDS").as_deref(),
        Some(r#"{"highTtoSeconds":900}"#)
    );
    assert_eq!(env_value(c, "MEMPROF_LOG_JSON").as_deref(), Some("true"));
    assert_eq!(c["securityContext"], json!({"runAsUser": 1234}));

    let mut j = job();
    j["metadata"]["annotations"]["memprof.dev/thresholds"] = json!(r#"{"criticalTtoSeconds":300}"#);
    let (out, _) = mutated(Target::Job, &j, &cluster);
    let t: memprof_api::thresholds::Thresholds =
        serde_json::from_str(&env_value(sidecar(&out), "MEMPROF_THRESHOLDS").unwrap()).unwrap();
    assert_eq!((t.critical_tto_seconds, t.high_tto_seconds), (300.0, 900.0));

    j["metadata"]["annotations"]["memprof.dev/thresholds"] = json!(r#"{"highTtoSeconds":5}"#);
    let (out, warnings) = mutated(Target::Job, &j, &cluster);
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("memprof.dev/thresholds") && w.contains("highTtoSeconds")),
        "{warnings:?}"
    );
    assert_eq!(
        env_value(sidecar(&out), "MEMPROF_THRESHOLDS").as_deref(),
        Some(r#"{"highTtoSeconds":900}"#),
        "the cluster-wide thresholds apply"
    );
    let (out, _) = mutated(Target::Job, &job(), &cfg());
    assert!(env(sidecar(&out), "MEMPROF_THRESHOLDS").is_none());
    assert!(env(sidecar(&out), "MEMPROF_LOG_JSON").is_none());
    assert_eq!(sidecar(&out)["securityContext"]["runAsUser"], 65532);
}

#[test]
fn only_a_profiled_job_created_with_a_family_asks_the_history() {
    let mut j = job();
    j["metadata"]["annotations"]["memprof.dev/family"] = json!("llama");
    let ask = read_review(&review(("batch", "Job"), "CREATE", j.clone())).history_ask();
    let ask = ask.unwrap().unwrap();
    assert_eq!(
        (ask.namespace.as_str(), ask.family.as_str()),
        ("ml", "llama")
    );
    for body in [
        review(("batch", "Job"), "UPDATE", j.clone()),
        review(("", "Pod"), "CREATE", j),
        review(("batch", "Job"), "CREATE", job()),
    ] {
        assert_eq!(read_review(&body).history_ask(), None);
    }
}

/// A review of `kind` (`group`, `version`, `kind`) creating `object`.
fn review_of(kind: (&str, &str, &str), object: Value) -> Vec<u8> {
    let mut r: Value = serde_json::from_slice(&review((kind.0, kind.2), "CREATE", object)).unwrap();
    r["request"]["kind"]["version"] = json!(kind.1);
    serde_json::to_vec(&r).unwrap()
}

#[test]
fn a_jobset_trainjob_or_pytorchjob_created_with_a_family_asks_the_history() {
    let family = json!({ "memprof.dev/enabled": "true", "memprof.dev/family": "llama" });
    let profiled = json!({ "metadata": { "annotations": family.clone() } });
    let jobset = json!({ "metadata": { "annotations": family },
        "spec": { "replicatedJobs": [{ "name": "w", "template": { "spec": {} } }] } });
    for (kind, object) in [
        (("jobset.x-k8s.io", "v1alpha2", "JobSet"), jobset),
        (
            ("trainer.kubeflow.org", "v1alpha1", "TrainJob"),
            profiled.clone(),
        ),
        (("kubeflow.org", "v1", "PyTorchJob"), profiled.clone()),
    ] {
        let ask = read_review(&review_of(kind, object)).history_ask();
        let ask = ask.unwrap_or_else(|| panic!("{kind:?} asks")).unwrap();
        assert_eq!((ask.kind, ask.family.as_str()), (kind.2, "llama"));
    }
    let elsewhere = ("example.com", "v1", "PyTorchJob");
    assert_eq!(
        read_review(&review_of(elsewhere, profiled)).history_ask(),
        None,
        "another group's kind"
    );
}

#[test]
fn the_historys_warnings_are_added_and_its_denial_drops_the_patch() {
    let body = review(("batch", "Job"), "CREATE", job());
    let warned = crate::history::Verdict {
        warnings: vec!["memprof: predicted".into()],
        denied: None,
    };
    let out = response(&answer_review(
        read_review(&body),
        &cfg(),
        Caller::ApiServer,
        warned,
    ));
    assert_eq!(out["allowed"], true);
    assert!(out.get("patch").is_some(), "still injected: {out}");
    assert_eq!(
        out["warnings"].as_array().unwrap().last().unwrap(),
        "memprof: predicted"
    );
    let denied = crate::history::Verdict {
        warnings: vec![],
        denied: Some("memprof: refused".into()),
    };
    let out = response(&answer_review(
        read_review(&body),
        &cfg(),
        Caller::ApiServer,
        denied,
    ));
    assert_eq!(out["allowed"], false);
    assert_eq!(out["status"]["message"], "memprof: refused");
    assert!(out.get("patch").is_none(), "{out}");
}

/// A PyTorchJob as the API server sends it: a master and workers.
fn pytorchjob(annotated: bool) -> Value {
    let template = json!({"spec": {"containers": [{"name": "pytorch", "image": "pytorch:2"}]}});
    let annotations = if annotated {
        json!({ "memprof.dev/enabled": "true" })
    } else {
        json!({})
    };
    json!({
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": { "name": "train", "namespace": "ml", "annotations": annotations },
        "spec": { "pytorchReplicaSpecs": {
            "Master": { "replicas": 1, "template": template.clone() },
            "Worker": { "replicas": 3, "template": template }
        }}
    })
}

#[test]
fn each_replica_of_an_annotated_pytorchjob_gets_the_sidecar_naming_the_pytorchjob() {
    let (out, _) = mutated(Target::PyTorchJob, &pytorchjob(true), &cfg());
    assert_eq!(out["metadata"]["labels"]["memprof.dev/managed"], "true");
    for rtype in ["Master", "Worker"] {
        let template = &out["spec"]["pytorchReplicaSpecs"][rtype]["template"];
        assert_eq!(
            template["metadata"]["labels"]["memprof.dev/managed"],
            "true"
        );
        let containers = template["spec"]["containers"].as_array().unwrap();
        let sidecar = containers
            .iter()
            .find(|c| c["name"] == crate::SIDECAR_CONTAINER)
            .unwrap_or_else(|| panic!("{rtype} has no sidecar"));
        let env = sidecar["env"].as_array().unwrap();
        let job = env
            .iter()
            .find(|e| e["name"] == memprof_api::env::JOB_NAME)
            .unwrap();
        assert_eq!(
            job["value"], "train",
            "{rtype}: reports claim the PyTorchJob"
        );
    }
    let plain = injection_patch(Target::PyTorchJob, &pytorchjob(false), &cfg()).unwrap();
    assert_eq!(plain.patch, None, "not annotated: left alone");
}

#[test]
fn each_replica_of_a_pytorchjob_asking_for_the_agent_gets_it() {
    let mut pt = pytorchjob(true);
    pt["metadata"]["annotations"][crate::agent::ANNOTATION_AGENT] = json!("python");
    let (out, warnings) = mutated(Target::PyTorchJob, &pt, &cfg());
    assert!(warnings.is_empty(), "{warnings:?}");
    for rtype in ["Master", "Worker"] {
        let spec = &out["spec"]["pytorchReplicaSpecs"][rtype]["template"]["spec"];
        let inits = spec["initContainers"].as_array().into_iter().flatten();
        let names: Vec<&str> = inits.filter_map(|c| c["name"].as_str()).collect();
        assert!(
            names.contains(&crate::agent::INSTALL_CONTAINER),
            "{rtype}: {names:?}"
        );
        let trainer = &spec["containers"][0];
        let mounts = trainer["volumeMounts"].as_array().into_iter().flatten();
        assert!(
            mounts
                .into_iter()
                .any(|m| m["name"] == crate::agent::VOLUME),
            "{rtype}: the trainer mounts the agent"
        );
    }
}
