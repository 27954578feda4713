//! Zero-code-change activation of the in-process Python agent: for a Job
//! (or labelled Pod) annotated `memprof.dev/agent: "python"`, the operations
//! that add it to the trainer containers without a new image, the way the
//! OpenTelemetry operator's Python auto-instrumentation does:
//!
//! - an `emptyDir` volume, [`VOLUME`];
//! - an init container, [`INSTALL_CONTAINER`], running the memprof image's
//!   `memprof install-agent --best-effort` to copy the agent tree the image
//!   carries (`bootstrap/sitecustomize.py`, `lib/memprof_agent/`) into it;
//! - in every trainer container: the volume read-only at [`MOUNT_PATH`],
//!   `PYTHONPATH` = `<bootstrap>:<the container's own PYTHONPATH>:<lib>`
//!   (the startup hook first, so that it runs; the agent package last, so a
//!   copy the user installed wins, as OpenTelemetry orders it).
//!
//! The startup hook starts the agent once a process imports torch, and says
//! why once when it cannot (agent/python/bootstrap/sitecustomize.py).
//!
//! Whatever the annotation, every trainer container (`spec.containers`) gets
//! the way to the sidecar (contract A): the pod's private socket volume
//! ([`crate::sidecar::SOCKET_VOLUME`]) read-only at `/var/run/memprof`, and
//! `MEMPROF_AGENT_SOCKET` (a value the container sets itself is kept), so an
//! agent the user installed finds it too. Nothing points at a TCP port.
//!
//! Pure: operations appended after the sidecar's own (which may have created
//! the pod's `volumes` and `initContainers` arrays, so the arrays' existence
//! is read from the operations too). Nothing here can make an admissible
//! object inadmissible: names or paths already taken leave the pod alone
//! with a warning, and an init container that cannot copy still exits 0.

use super::config::AgentConfig;
use super::sidecar::{socket_mount, SOCKET_VOLUME};
use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, PatchOperation};
use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, EnvVar, PodSpec, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use memprof_api::env::{AGENT_SOCKET_DIR, AGENT_SOCKET_PATH};
use serde_json::{json, Value};

/// Job/Pod annotation that asks for the agent; [`PYTHON`] is the one value.
pub const ANNOTATION_AGENT: &str = "memprof.dev/agent";
/// The value of [`ANNOTATION_AGENT`] that injects the Python agent.
pub const PYTHON: &str = "python";
/// The init container that copies the agent; its presence makes the
/// injection a no-op (a recreated Job is not injected twice).
pub const INSTALL_CONTAINER: &str = "memprof-agent-install";
/// The shared volume holding the agent.
pub const VOLUME: &str = "memprof-agent";
/// Where the volume is mounted, in the init container and the trainers.
pub const MOUNT_PATH: &str = "/memprof-agent";
/// The startup hook's directory (first on `PYTHONPATH`).
pub const BOOTSTRAP_DIR: &str = "/memprof-agent/bootstrap";
/// The agent package's directory (last on `PYTHONPATH`).
pub const LIB_DIR: &str = "/memprof-agent/lib";
/// The memprof CLI in the memprof image.
pub const CLI: &str = "/usr/local/bin/memprof";
/// Environment of the trainers.
pub const PYTHONPATH: &str = "PYTHONPATH";
/// Where the agent pushes (read by `memprof_agent`): the sidecar's socket.
pub const AGENT_SOCKET: &str = memprof_api::env::AGENT_SOCKET;
/// The volume's size limit: the agent is a few hundred KiB of Python.
const VOLUME_SIZE_LIMIT: &str = "32Mi";

/// What the webhook knows when it adds the agent.
pub struct Request<'a> {
    /// The object's [`ANNOTATION_AGENT`] (the Job's or its template's).
    pub value: Option<&'a str>,
    /// JSON-pointer tokens from the object root to the pod template (or pod).
    pub prefix: &'a [&'a str],
    /// The pod spec as admitted (before this webhook's operations).
    pub spec: &'a PodSpec,
    /// The sidecar being injected: its image, pull policy and resources are
    /// the init container's.
    pub sidecar: &'a Container,
    /// The sidecar's port (after the `memprof.dev/port` override); nothing
    /// of the agent's uses it any more (the socket does).
    pub port: u16,
}

/// Appends to `ops` what connects every trainer to the sidecar's socket
/// and, when `req` asks for it, what adds the agent; a warning for an
/// unknown annotation value or a pod whose names clash.
pub fn inject(
    req: &Request<'_>,
    cfg: &AgentConfig,
    ops: &mut Vec<PatchOperation>,
    warnings: &mut Vec<String>,
) {
    let agent = wants_agent(req, warnings);
    if agent {
        let volume = volume();
        let installer = install_container(req.sidecar, cfg);
        let (volumes, inits) = (
            ptr(req.prefix, &["spec", "volumes"]),
            ptr(req.prefix, &["spec", "initContainers"]),
        );
        let add_volume = append(req.spec.volumes.is_some(), ops, volumes, to_json(&volume));
        let add_installer = append(
            req.spec.init_containers.is_some(),
            ops,
            inits,
            to_json(&installer),
        );
        ops.extend([add_volume, add_installer]);
    }
    if req
        .spec
        .volumes
        .iter()
        .flatten()
        .any(|v| v.name == SOCKET_VOLUME)
    {
        warnings.push(format!(
            "memprof: the pod already has a volume named {SOCKET_VOLUME:?}, which the sidecar and \
             the trainers now share for the agent socket; rename it (an emptyDir of memprof's own \
             keeps the socket private to the pod)"
        ));
    }
    for (i, c) in req.spec.containers.iter().enumerate() {
        let at = ptr(req.prefix, &["spec", "containers", &i.to_string()]);
        ops.extend(trainer_ops(&at, c, agent, warnings));
    }
}

/// Whether to add the Python agent: the annotation asks for it and nothing
/// of the pod's is in the way.
fn wants_agent(req: &Request<'_>, warnings: &mut Vec<String>) -> bool {
    match req.value.map(str::trim) {
        None => return false,
        Some(PYTHON) => {}
        Some(other) => {
            warnings.push(format!(
                "memprof: ignoring {ANNOTATION_AGENT}={other:?}: the only agent is {PYTHON:?}"
            ));
            return false;
        }
    }
    match clash(req.spec) {
        Some(Clash::AlreadyInjected) => false,
        Some(Clash::Taken(what)) => {
            warnings.push(format!(
                "memprof: agent not injected: {what} already exists; rename it to use {ANNOTATION_AGENT}"
            ));
            false
        }
        None => true,
    }
}

/// Why the pod cannot take the agent as it is.
#[derive(Debug, PartialEq)]
enum Clash {
    /// The installer is there: injected before (a recreated Job's template).
    AlreadyInjected,
    /// A name or path of ours is the user's.
    Taken(String),
}

fn clash(spec: &PodSpec) -> Option<Clash> {
    let inits = spec.init_containers.iter().flatten();
    if inits.clone().any(|c| c.name == INSTALL_CONTAINER) {
        return Some(Clash::AlreadyInjected);
    }
    if spec.volumes.iter().flatten().any(|v| v.name == VOLUME) {
        return Some(Clash::Taken(format!("a volume named {VOLUME:?}")));
    }
    // A second mount at one path would make the API server reject the pod.
    let mounts = spec.containers.iter().chain(inits).flat_map(|c| {
        c.volume_mounts
            .iter()
            .flatten()
            .map(move |m| (c.name.as_str(), m))
    });
    for (container, m) in mounts {
        if m.mount_path.trim_end_matches('/') == MOUNT_PATH {
            return Some(Clash::Taken(format!(
                "a mount at {MOUNT_PATH} in container {container:?}"
            )));
        }
    }
    None
}

fn volume() -> Volume {
    Volume {
        name: VOLUME.into(),
        empty_dir: Some(EmptyDirVolumeSource {
            size_limit: Some(Quantity(VOLUME_SIZE_LIMIT.into())),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Copies the agent into the volume. `--best-effort`: a failed copy says why
/// in this container's log and exits 0, so the pod still starts (without the
/// hook on disk the trainers run as they would have).
fn install_container(sidecar: &Container, cfg: &AgentConfig) -> Container {
    let command = [
        CLI,
        "install-agent",
        "--best-effort",
        "--from",
        &cfg.source_dir,
        MOUNT_PATH,
    ];
    Container {
        name: INSTALL_CONTAINER.into(),
        image: cfg.image.clone().or_else(|| sidecar.image.clone()),
        image_pull_policy: sidecar.image_pull_policy.clone(),
        command: Some(command.iter().map(|s| s.to_string()).collect()),
        // Init containers' requests count as a maximum, not a sum: the
        // sidecar's never raise what the pod asks for.
        resources: sidecar.resources.clone(),
        // Pod Security `restricted`, as the sidecar outside podResources mode.
        security_context: Some(super::sidecar::security_context(
            super::config::GpuAccess::Envvar,
        )),
        volume_mounts: Some(vec![VolumeMount {
            name: VOLUME.into(),
            mount_path: MOUNT_PATH.into(),
            ..Default::default()
        }]),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
    }
}

/// How a trainer's `PYTHONPATH` changes.
#[derive(Debug, PartialEq)]
pub enum PythonPath {
    /// Set the value of the container's own entry (at this index).
    Set(usize, String),
    /// Add an entry at the end of the container's env.
    Append(String),
    /// Already ours.
    Keep,
}

/// The hook first, the agent package last, the container's own value in
/// between. A value from a ConfigMap, a Secret or `envFrom` is not known
/// here: a later entry refers to it as `$(PYTHONPATH)`, which the kubelet
/// expands to the earlier definition (left as it is when there is none:
/// a path that does not exist, which Python skips).
pub fn python_path(c: &Container) -> PythonPath {
    let env = c.env.as_deref().unwrap_or_default();
    let own = env.iter().enumerate().rfind(|(_, e)| e.name == PYTHONPATH);
    match own {
        Some((_, e))
            if e.value
                .as_deref()
                .is_some_and(|v| v.contains(BOOTSTRAP_DIR)) =>
        {
            PythonPath::Keep
        }
        Some((i, e)) if e.value_from.is_none() => match e.value.as_deref().unwrap_or("") {
            "" => PythonPath::Set(i, format!("{BOOTSTRAP_DIR}:{LIB_DIR}")),
            v => PythonPath::Set(i, format!("{BOOTSTRAP_DIR}:{v}:{LIB_DIR}")),
        },
        Some(_) => PythonPath::Append(format!("{BOOTSTRAP_DIR}:$({PYTHONPATH}):{LIB_DIR}")),
        None if c.env_from.as_ref().is_some_and(|f| !f.is_empty()) => {
            PythonPath::Append(format!("{BOOTSTRAP_DIR}:$({PYTHONPATH}):{LIB_DIR}"))
        }
        None => PythonPath::Append(format!("{BOOTSTRAP_DIR}:{LIB_DIR}")),
    }
}

/// Whether a container already mounts something at `path`: a second mount
/// there would make the API server reject the pod.
fn mounts_at(c: &Container, path: &str) -> bool {
    c.volume_mounts
        .iter()
        .flatten()
        .any(|m| m.mount_path.trim_end_matches('/') == path)
}

/// The env and mounts one trainer container gets: the socket's always (what
/// the container has itself wins), the agent's when it is injected.
fn trainer_additions(
    c: &Container,
    agent: bool,
    warnings: &mut Vec<String>,
) -> (Vec<(Option<usize>, EnvVar)>, Vec<VolumeMount>) {
    let env = c.env.as_deref().unwrap_or_default();
    let (mut new_env, mut mounts) = (vec![], vec![]);
    if mounts_at(c, AGENT_SOCKET_DIR) {
        warnings.push(format!(
            "memprof: container {:?} already mounts {AGENT_SOCKET_DIR}: the agent socket is not \
             mounted there, so its agent cannot reach the sidecar",
            c.name
        ));
    } else {
        mounts.push(socket_mount(true));
    }
    // The user's own setting wins (an agent elsewhere).
    if !env.iter().any(|e| e.name == AGENT_SOCKET) {
        new_env.push((None, plain(AGENT_SOCKET, AGENT_SOCKET_PATH.into())));
    }
    if agent {
        match python_path(c) {
            PythonPath::Set(i, v) => new_env.push((Some(i), plain(PYTHONPATH, v))),
            PythonPath::Append(v) => new_env.push((None, plain(PYTHONPATH, v))),
            PythonPath::Keep => {}
        }
        mounts.push(VolumeMount {
            name: VOLUME.into(),
            mount_path: MOUNT_PATH.into(),
            read_only: Some(true),
            ..Default::default()
        });
    }
    (new_env, mounts)
}

fn trainer_ops(
    at: &PointerBuf,
    c: &Container,
    agent: bool,
    warnings: &mut Vec<String>,
) -> Vec<PatchOperation> {
    let (new_env, mounts) = trainer_additions(c, agent, warnings);
    let mut ops = vec![];
    let mut appended = vec![];
    for (index, var) in new_env {
        match index {
            Some(i) => ops.push(add(
                child(at, &["env", &i.to_string(), "value"]),
                json!(var.value),
            )),
            None => appended.push(to_json(&var)),
        }
    }
    ops.extend(append_all(c.env.is_some(), child(at, &["env"]), appended));
    ops.extend(append_all(
        c.volume_mounts.is_some(),
        child(at, &["volumeMounts"]),
        mounts.iter().map(to_json).collect(),
    ));
    ops
}

fn plain(name: &str, value: String) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value),
        ..Default::default()
    }
}

fn ptr(prefix: &[&str], rest: &[&str]) -> PointerBuf {
    PointerBuf::from_tokens(prefix.iter().chain(rest).copied())
}

fn child(at: &PointerBuf, rest: &[&str]) -> PointerBuf {
    let mut p = at.clone();
    for t in rest {
        p.push_back(*t);
    }
    p
}

fn add(path: PointerBuf, value: Value) -> PatchOperation {
    PatchOperation::Add(AddOperation { path, value })
}

fn to_json<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).expect("k8s-openapi types always serialise")
}

/// Adds `value` at the end of the array at `path`, creating the array when
/// neither the object nor an earlier operation has it.
fn append(
    in_object: bool,
    ops: &[PatchOperation],
    path: PointerBuf,
    value: Value,
) -> PatchOperation {
    let created = ops
        .iter()
        .any(|op| matches!(op, PatchOperation::Add(a) if a.path == path));
    if in_object || created {
        add(child(&path, &["-"]), value)
    } else {
        add(path, Value::Array(vec![value]))
    }
}

fn append_all(exists: bool, path: PointerBuf, values: Vec<Value>) -> Vec<PatchOperation> {
    match (exists, values.is_empty()) {
        (_, true) => vec![],
        (true, false) => values
            .into_iter()
            .map(|v| add(child(&path, &["-"]), v))
            .collect(),
        (false, false) => vec![add(path, Value::Array(values))],
    }
}

#[cfg(test)]
mod tests;
