//! Unit tests of the agent injection, through the whole admission patch on
//! JSON objects as the API server sends them.

use super::*;
use crate::sidecar::SOCKET_VOLUME;
use crate::{injection_patch, InjectionConfig, Target, SIDECAR_CONTAINER};

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

/// A Job annotated for the sidecar and the agent, with two trainer containers.
fn job(agent: &str) -> Value {
    json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "train",
            "annotations": { "memprof.dev/enabled": "true", "memprof.dev/agent": agent }
        },
        "spec": { "template": { "spec": {
            "restartPolicy": "Never",
            "containers": [
                { "name": "trainer", "image": "pytorch:2",
                  "env": [{ "name": "PYTHONPATH", "value": "/app:/libs" }, { "name": "RANK", "value": "0" }] },
                { "name": "tokenizer", "image": "pytorch:2" }
            ]
        }}}
    })
}

fn mutated(obj: &Value, cfg: &InjectionConfig) -> (Value, Vec<String>) {
    let inj = injection_patch(Target::Job, obj, cfg).expect("valid object");
    let mut out = obj.clone();
    json_patch::patch(&mut out, &inj.patch.expect("a patch")).expect("patch applies");
    (out, inj.warnings)
}

fn spec(obj: &Value) -> &Value {
    obj.pointer("/spec/template/spec").unwrap_or(&obj["spec"])
}

fn named<'a>(list: &'a Value, name: &str) -> Option<&'a Value> {
    list.as_array()?.iter().find(|c| c["name"] == name)
}

fn env_of(c: &Value, name: &str) -> Vec<String> {
    let all = c["env"].as_array().into_iter().flatten();
    all.filter(|e| e["name"] == name)
        .map(|e| e["value"].as_str().unwrap_or("<valueFrom>").to_string())
        .collect()
}

fn has_agent_mount(c: &Value) -> bool {
    let mounts = c["volumeMounts"].as_array().into_iter().flatten();
    mounts
        .filter(|m| m["name"] == VOLUME)
        .any(|m| m["mountPath"] == MOUNT_PATH && m["readOnly"] == true)
}

fn has_socket_mount(c: &Value) -> bool {
    let mounts = c["volumeMounts"].as_array().into_iter().flatten();
    mounts
        .filter(|m| m["name"] == SOCKET_VOLUME)
        .any(|m| m["mountPath"] == "/var/run/memprof" && m["readOnly"] == true)
}

fn init_names(obj: &Value) -> Vec<&str> {
    let inits = spec(obj)["initContainers"].as_array().into_iter().flatten();
    inits.map(|c| c["name"].as_str().unwrap()).collect()
}

#[test]
fn every_trainer_gets_the_volume_the_hook_and_the_sidecar_address() {
    let (out, warnings) = mutated(&job("python"), &cfg());
    assert!(warnings.is_empty(), "{warnings:?}");
    let s = spec(&out);
    assert_eq!(
        named(&s["volumes"], VOLUME).unwrap()["emptyDir"]["sizeLimit"],
        "32Mi"
    );

    let installer = named(&s["initContainers"], INSTALL_CONTAINER).expect("installer");
    assert_eq!(installer["image"], "memprof:test", "the sidecar's image");
    assert_eq!(
        installer["command"],
        json!([
            "/usr/local/bin/memprof",
            "install-agent",
            "--best-effort",
            "--from",
            "/opt/memprof/agent",
            "/memprof-agent"
        ])
    );
    assert_eq!(installer["volumeMounts"][0]["mountPath"], MOUNT_PATH);
    assert!(installer["volumeMounts"][0].get("readOnly").is_none());
    assert_eq!(installer["securityContext"]["runAsNonRoot"], true);
    assert_eq!(installer["resources"]["limits"]["memory"], "128Mi");

    let trainer = named(&s["containers"], "trainer").unwrap();
    // The container's own PYTHONPATH stays, between the hook and the package.
    assert_eq!(
        env_of(trainer, PYTHONPATH),
        ["/memprof-agent/bootstrap:/app:/libs:/memprof-agent/lib"]
    );
    assert_eq!(env_of(trainer, "RANK"), ["0"]);
    let tokenizer = named(&s["containers"], "tokenizer").unwrap();
    assert_eq!(
        env_of(tokenizer, PYTHONPATH),
        ["/memprof-agent/bootstrap:/memprof-agent/lib"]
    );
    for c in [trainer, tokenizer] {
        assert_eq!(env_of(c, AGENT_SOCKET), ["/var/run/memprof/agent.sock"]);
        assert!(env_of(c, "MEMPROF_AGENT_URL").is_empty(), "no TCP: {c}");
        assert!(has_agent_mount(c) && has_socket_mount(c), "{c}");
    }
    // Not the sidecar (legacy: a regular container here).
    let sidecar = named(&s["containers"], SIDECAR_CONTAINER).unwrap();
    assert!(env_of(sidecar, PYTHONPATH).is_empty() && !has_agent_mount(sidecar));
}

#[test]
fn arrays_created_by_the_sidecar_are_appended_to() {
    // Native sidecar, no init containers or volumes of the user's: the
    // sidecar's operation creates initContainers, ours must not replace it.
    let (out, _) = mutated(&job("python"), &native());
    assert_eq!(init_names(&out), [SIDECAR_CONTAINER, INSTALL_CONTAINER]);

    // The user's arrays are kept too.
    let mut j = job("python");
    j["spec"]["template"]["spec"]["initContainers"] =
        json!([{ "name": "fetch", "image": "busybox" }]);
    j["spec"]["template"]["spec"]["volumes"] = json!([{ "name": "data", "emptyDir": {} }]);
    let (out, _) = mutated(&j, &native());
    assert_eq!(
        init_names(&out),
        ["fetch", SIDECAR_CONTAINER, INSTALL_CONTAINER]
    );
    let volumes: Vec<&str> = spec(&out)["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(volumes, ["data", SOCKET_VOLUME, "memprof-sa-token", VOLUME]);

    // A volume the sidecar itself needs (agentOnly + projected token) and ours.
    let mut j = job("python");
    j["spec"]["template"]["spec"]["automountServiceAccountToken"] = json!(false);
    let (out, _) = mutated(&j, &cfg());
    assert!(named(&spec(&out)["volumes"], VOLUME).is_some());
    assert!(named(&spec(&out)["volumes"], "memprof-sa-token").is_some());
}

#[test]
fn the_socket_ignores_the_port_and_the_users_own_setting_wins() {
    let mut j = job("python");
    j["metadata"]["annotations"]["memprof.dev/port"] = json!("9500");
    j["spec"]["template"]["spec"]["containers"][1]["env"] =
        json!([{ "name": AGENT_SOCKET, "value": "/elsewhere/agent.sock" }]);
    let (out, _) = mutated(&j, &cfg());
    let s = spec(&out);
    let socket = |name| env_of(named(&s["containers"], name).unwrap(), AGENT_SOCKET);
    assert_eq!(socket("trainer"), ["/var/run/memprof/agent.sock"]);
    assert_eq!(socket("tokenizer"), ["/elsewhere/agent.sock"]);
}

/// Contract A without the annotation: an agent the user installed in the
/// image finds the sidecar's socket too.
#[test]
fn every_trainer_gets_the_socket_without_the_agent_annotation() {
    let mut j = job("python");
    j["metadata"]["annotations"]
        .as_object_mut()
        .unwrap()
        .remove("memprof.dev/agent");
    for c in [cfg(), native()] {
        let (out, warnings) = mutated(&j, &c);
        assert!(warnings.is_empty(), "{warnings:?}");
        for name in ["trainer", "tokenizer"] {
            let t = named(&spec(&out)["containers"], name).unwrap();
            assert_eq!(env_of(t, AGENT_SOCKET), ["/var/run/memprof/agent.sock"]);
            assert!(has_socket_mount(t) && !has_agent_mount(t), "{t}");
        }
    }
}

/// A trainer that mounts something at /var/run/memprof itself keeps it: a
/// second mount at the same path would make the pod inadmissible.
#[test]
fn a_trainers_own_mount_at_the_socket_path_is_left_alone_with_a_warning() {
    let mut j = job("python");
    j["spec"]["template"]["spec"]["containers"][1]["volumeMounts"] =
        json!([{ "name": "mine", "mountPath": "/var/run/memprof/" }]);
    let (out, warnings) = mutated(&j, &cfg());
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("\"tokenizer\" already mounts /var/run/memprof"));
    let tokenizer = named(&spec(&out)["containers"], "tokenizer").unwrap();
    assert!(!has_socket_mount(tokenizer));
    assert_eq!(
        tokenizer["volumeMounts"].as_array().unwrap().len(),
        2,
        "its own + the agent's"
    );
    let trainer = named(&spec(&out)["containers"], "trainer").unwrap();
    assert!(has_socket_mount(trainer));

    let mut j = job("python");
    j["spec"]["template"]["spec"]["volumes"] =
        json!([{ "name": SOCKET_VOLUME, "hostPath": { "path": "/tmp" } }]);
    let (_, warnings) = mutated(&j, &cfg());
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("already has a volume named \"memprof-agent-socket\"")),
        "{warnings:?}"
    );
}

#[test]
fn the_agent_image_setting_and_the_template_annotation() {
    let mut j = job("python");
    j["metadata"]["annotations"]
        .as_object_mut()
        .unwrap()
        .remove("memprof.dev/agent");
    j["spec"]["template"]["metadata"] = json!({ "annotations": { "memprof.dev/agent": "python" } });
    let mut c = cfg();
    c.agent = AgentConfig {
        image: Some("mirror.example/memprof-agent:1".into()),
        source_dir: "/agent".into(),
    };
    let (out, _) = mutated(&j, &c);
    let installer = named(&spec(&out)["initContainers"], INSTALL_CONTAINER).unwrap();
    assert_eq!(installer["image"], "mirror.example/memprof-agent:1");
    assert_eq!(installer["command"][4], "/agent");
}

#[test]
fn an_unknown_value_is_ignored_with_a_warning_and_no_value_adds_nothing() {
    let (out, warnings) = mutated(&job("java"), &cfg());
    assert_eq!(
        warnings,
        ["memprof: ignoring memprof.dev/agent=\"java\": the only agent is \"python\""]
    );
    assert!(spec(&out).get("initContainers").is_none());
    assert!(named(&spec(&out)["containers"], SIDECAR_CONTAINER).is_some());

    let mut j = job("python");
    j["metadata"]["annotations"]
        .as_object_mut()
        .unwrap()
        .remove("memprof.dev/agent");
    let (out, warnings) = mutated(&j, &cfg());
    assert!(warnings.is_empty());
    assert!(spec(&out).get("initContainers").is_none());
    let trainer = named(&spec(&out)["containers"], "trainer").unwrap();
    assert_eq!(env_of(trainer, PYTHONPATH), ["/app:/libs"]);
    assert!(!has_agent_mount(trainer) && has_socket_mount(trainer));
}

#[test]
fn a_labelled_pod_gets_the_agent_too() {
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": "p", "labels": { "memprof.dev/inject": "true" },
                      "annotations": { "memprof.dev/agent": "python" } },
        "spec": { "containers": [{ "name": "trainer", "image": "pytorch:2" }] }
    });
    let inj = injection_patch(Target::Pod, &pod, &cfg()).unwrap();
    let mut out = pod.clone();
    json_patch::patch(&mut out, &inj.patch.unwrap()).unwrap();
    assert_eq!(init_names(&out), [INSTALL_CONTAINER]);
    assert!(has_agent_mount(&out["spec"]["containers"][0]));
}

#[test]
fn injected_once() {
    // A recreated Job carries the injected template: nothing is added twice.
    let (out, _) = mutated(&job("python"), &native());
    let again = injection_patch(Target::Job, &out, &native()).unwrap();
    assert!(again.patch.is_none());

    // On its own too: a template with the installer but no sidecar.
    let mut j = job("python");
    let installer = named(&spec(&out)["initContainers"], INSTALL_CONTAINER)
        .unwrap()
        .clone();
    j["spec"]["template"]["spec"]["initContainers"] = json!([installer]);
    let (out, warnings) = mutated(&j, &cfg());
    assert!(warnings.is_empty());
    assert_eq!(init_names(&out), [INSTALL_CONTAINER]);
    let trainer = named(&spec(&out)["containers"], "trainer").unwrap();
    assert_eq!(env_of(trainer, PYTHONPATH), ["/app:/libs"]);
}

#[test]
fn names_and_paths_of_the_users_are_left_alone_with_a_warning() {
    let mut j = job("python");
    j["spec"]["template"]["spec"]["volumes"] = json!([{ "name": VOLUME, "emptyDir": {} }]);
    let (out, warnings) = mutated(&j, &cfg());
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("a volume named \"memprof-agent\""),
        "{warnings:?}"
    );
    assert!(spec(&out).get("initContainers").is_none());

    let mut j = job("python");
    j["spec"]["template"]["spec"]["containers"][1]["volumeMounts"] =
        json!([{ "name": "x", "mountPath": "/memprof-agent/" }]);
    let (out, warnings) = mutated(&j, &cfg());
    assert!(warnings[0].contains("a mount at /memprof-agent in container \"tokenizer\""));
    assert!(spec(&out).get("initContainers").is_none());
}

fn container(env: Value) -> Container {
    serde_json::from_value(json!({ "name": "c", "env": env })).unwrap()
}

#[test]
fn python_path_keeps_what_the_container_sets() {
    let both = "/memprof-agent/bootstrap:/memprof-agent/lib";
    let later = "/memprof-agent/bootstrap:$(PYTHONPATH):/memprof-agent/lib";
    assert_eq!(
        python_path(&container(json!([]))),
        PythonPath::Append(both.into())
    );
    assert_eq!(
        python_path(&container(
            json!([{ "name": "A", "value": "1" }, { "name": "PYTHONPATH", "value": "/x" }])
        )),
        PythonPath::Set(1, "/memprof-agent/bootstrap:/x:/memprof-agent/lib".into())
    );
    assert_eq!(
        python_path(&container(json!([{ "name": "PYTHONPATH" }]))),
        PythonPath::Set(0, both.into())
    );
    // From a ConfigMap: not known here; the kubelet expands $(PYTHONPATH).
    let from_cm = json!([{ "name": "PYTHONPATH",
        "valueFrom": { "configMapKeyRef": { "name": "cm", "key": "path" } } }]);
    assert_eq!(
        python_path(&container(from_cm)),
        PythonPath::Append(later.into())
    );
    let mut c = container(json!([]));
    c.env_from = Some(vec![serde_json::from_value(
        json!({ "configMapRef": { "name": "cm" } }),
    )
    .unwrap()]);
    assert_eq!(python_path(&c), PythonPath::Append(later.into()));
    assert_eq!(
        python_path(&container(
            json!([{ "name": "PYTHONPATH", "value": later }])
        )),
        PythonPath::Keep
    );
}
