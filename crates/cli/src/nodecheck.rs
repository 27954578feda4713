//! `memprof node-check`: which GPU access mode (`gpuAccess`: `envvar`,
//! `podResources`, `agentOnly`, docs/install.md) works on this node, and why.
//! Run on the node, or in `kubectl debug node/NAME` with `--root /host`. It
//! reads files only (no driver, no runtime API): the GPU device nodes, the
//! container runtimes' configuration (is the NVIDIA runtime wired in, does it
//! accept `NVIDIA_VISIBLE_DEVICES` from unprivileged containers, is it in
//! CDI-only mode), CDI specs, and the kubelet's PodResources socket. Every
//! path is under `--root`, so tests build fake trees.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Component, Path, PathBuf};

/// Flags of `memprof node-check`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The node's root filesystem (`/host` in `kubectl debug node/NAME`).
    #[arg(long, default_value = "/", value_name = "DIR")]
    pub root: PathBuf,
}

/// What was found on the node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Node {
    /// `/dev/nvidia0`, `/dev/nvidia1`, …
    pub gpus: Vec<String>,
    /// Runtime configuration files that name the NVIDIA runtime.
    pub runtime_configs: Vec<String>,
    /// The NVIDIA container runtime's own config file, when present.
    pub toolkit_config: Option<String>,
    /// Its `mode` (`legacy`, `cdi`, `auto`), when set.
    pub toolkit_mode: Option<String>,
    /// `accept-nvidia-visible-devices-envvar-when-unprivileged` (default true).
    pub accepts_envvar: bool,
    /// CDI spec files that declare NVIDIA devices.
    pub cdi_specs: Vec<String>,
    /// The kubelet PodResources socket, when present.
    pub pod_resources: Option<String>,
}

/// Where the runtimes keep their configuration (relative to the root).
const RUNTIME_CONFIGS: &[&str] = &[
    "etc/containerd/config.toml",
    "etc/containerd/conf.d",
    "etc/docker/daemon.json",
    "etc/crio/crio.conf",
    "etc/crio/crio.conf.d",
    "etc/k0s/containerd.toml",
    "var/lib/rancher/rke2/agent/etc/containerd/config.toml",
    "var/lib/rancher/k3s/agent/etc/containerd/config.toml",
];
const TOOLKIT_CONFIG: &str = "etc/nvidia-container-runtime/config.toml";
const CDI_DIRS: &[&str] = &["etc/cdi", "run/cdi", "var/run/cdi"];
const POD_RESOURCES: &str = "var/lib/kubelet/pod-resources/kubelet.sock";

/// Reads what the node has under `root`.
pub fn inspect(root: &Path) -> Node {
    let mut node = Node {
        accepts_envvar: true,
        ..Node::default()
    };
    node.gpus = entries(root, "dev")
        .into_iter()
        .filter(|(shown, _)| shown.rsplit('/').next().is_some_and(is_gpu_node))
        .map(|(shown, _)| shown)
        .collect();
    node.gpus.sort();
    for rel in RUNTIME_CONFIGS {
        for (shown, f) in files_or_file(root, rel) {
            if read(&f).contains("nvidia") {
                node.runtime_configs.push(shown);
            }
        }
    }
    let toolkit = resolve(root, TOOLKIT_CONFIG);
    if toolkit.is_file() {
        let text = read(&toolkit);
        node.toolkit_config = Some(format!("/{TOOLKIT_CONFIG}"));
        node.toolkit_mode = toml_value(&text, "mode");
        node.accepts_envvar = toml_value(
            &text,
            "accept-nvidia-visible-devices-envvar-when-unprivileged",
        )
        .is_none_or(|v| v != "false");
    }
    // /var/run is often a link to /run: a spec seen through both is one spec.
    let mut seen = Vec::new();
    for dir in CDI_DIRS {
        for (shown, f) in entries(root, dir) {
            let real = f.canonicalize().unwrap_or_else(|_| f.clone());
            if !seen.contains(&real) && read(&f).contains("nvidia.com/gpu") {
                node.cdi_specs.push(shown);
                seen.push(real);
            }
        }
    }
    let sock = resolve(root, POD_RESOURCES);
    node.pod_resources = sock.exists().then(|| format!("/{POD_RESOURCES}"));
    node
}

/// `rel` under `root`, with symlinks followed as on the node: an absolute
/// target stays inside `root` (in `kubectl debug node`, `/host/var/run` →
/// `/run` means `/host/run`, not the debug container's own `/run`), and
/// `..` never leaves it.
pub fn resolve(root: &Path, rel: &str) -> PathBuf {
    let mut todo: VecDeque<OsString> = parts(Path::new(rel));
    let mut cur = root.to_path_buf();
    let mut hops = 0;
    while let Some(part) = todo.pop_front() {
        if part == ".." {
            if cur != root {
                cur.pop();
            }
            continue;
        }
        let next = cur.join(&part);
        match std::fs::read_link(&next) {
            // 40 links, as Linux's ELOOP: a loop is then read as a missing file.
            Ok(target) if hops < 40 => {
                hops += 1;
                if target.is_absolute() {
                    cur = root.to_path_buf();
                }
                for (i, p) in parts(&target).into_iter().enumerate() {
                    todo.insert(i, p);
                }
            }
            _ => cur = next,
        }
    }
    cur
}

/// The normal components of `p` and `..`, without `/` and `.`.
fn parts(p: &Path) -> VecDeque<OsString> {
    p.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some(OsString::from("..")),
            _ => None,
        })
        .collect()
}

/// `nvidia0`…: a GPU's device node (not `nvidiactl`, `nvidia-uvm`, …).
fn is_gpu_node(name: &str) -> bool {
    name.strip_prefix("nvidia")
        .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
}

/// The entries of directory `rel` under `root`: each as the node names it
/// (`/etc/cdi/nvidia.yaml`) and where it is read (resolved under `root`).
fn entries(root: &Path, rel: &str) -> Vec<(String, PathBuf)> {
    let Ok(rd) = std::fs::read_dir(resolve(root, rel)) else {
        return vec![];
    };
    let mut out: Vec<(String, PathBuf)> = rd
        .flatten()
        .map(|e| {
            let name = format!("{rel}/{}", e.file_name().to_string_lossy());
            (format!("/{name}"), resolve(root, &name))
        })
        .collect();
    out.sort();
    out
}

/// `rel` under `root` if it is a file, its entries if a directory.
fn files_or_file(root: &Path, rel: &str) -> Vec<(String, PathBuf)> {
    let p = resolve(root, rel);
    if p.is_dir() {
        entries(root, rel)
    } else if p.exists() {
        vec![(format!("/{rel}"), p)]
    } else {
        vec![]
    }
}

/// At most 1 MiB of a file as text (configs are small; a device is not).
fn read(p: &Path) -> String {
    use std::io::Read;
    let mut s = String::new();
    if let Ok(f) = std::fs::File::open(p) {
        let _ = f.take(1 << 20).read_to_string(&mut s);
    }
    s
}

/// `key = "value"` or `key = value` on a line of its own (comments skipped):
/// enough for the toolkit's flat settings, without a TOML parser.
fn toml_value(text: &str, key: &str) -> Option<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .find(|(k, _)| k.trim() == key)
        .map(|(_, v)| v.trim().trim_matches('"').to_string())
}

/// The mode to pick and the lines that say why.
pub fn advise(n: &Node) -> (Option<&'static str>, String) {
    let mut out = String::new();
    if n.gpus.is_empty() {
        line(&mut out, false, "no NVIDIA GPU device nodes (/dev/nvidia0, …): nothing to profile on this node (run this on a GPU node; in `kubectl debug node/NAME` pass --root /host)".into());
        return (None, out);
    }
    line(
        &mut out,
        true,
        format!("{} GPU device node(s): {}", n.gpus.len(), n.gpus.join(" ")),
    );
    let envvar = runtime_lines(&mut out, n);
    line(
        &mut out,
        n.pod_resources.is_some(),
        match &n.pod_resources {
            Some(s) => format!("kubelet PodResources socket {s}"),
            None => format!("no kubelet PodResources socket (/{POD_RESOURCES})"),
        },
    );
    let (mode, why) = pick(envvar, n.pod_resources.is_some());
    let _ = writeln!(out, "\npick: gpuAccess={mode}: {why}");
    (Some(mode), out)
}

/// One `OK`/`NO` line.
fn line(out: &mut String, ok: bool, what: String) {
    let _ = writeln!(out, "{}  {what}", if ok { "OK  " } else { "NO  " });
}

/// The runtime's lines (NVIDIA runtime wired in, toolkit mode, envvar
/// acceptance, CDI specs); whether `NVIDIA_VISIBLE_DEVICES` works.
fn runtime_lines(out: &mut String, n: &Node) -> bool {
    let wired = !n.runtime_configs.is_empty();
    line(
        out,
        wired,
        if wired {
            format!(
                "the NVIDIA container runtime is configured in {}",
                n.runtime_configs.join(", ")
            )
        } else {
            "no runtime configuration names the NVIDIA runtime (containerd, Docker, CRI-O): drivers reach only containers that request nvidia.com/gpu (e.g. GKE COS)".into()
        },
    );
    let cdi_only = n.toolkit_mode.as_deref() == Some("cdi");
    if let Some(cfg) = &n.toolkit_config {
        let mode = n.toolkit_mode.as_deref().unwrap_or("auto (default)");
        line(out, !cdi_only, format!("{cfg}: mode {mode}"));
        let said = match n.accepts_envvar {
            true => "accepted",
            false => "refused (as on Bottlerocket)",
        };
        line(
            out,
            n.accepts_envvar,
            format!("{cfg}: NVIDIA_VISIBLE_DEVICES from unprivileged containers {said}"),
        );
    }
    if !n.cdi_specs.is_empty() {
        let _ = writeln!(
            out,
            "INFO  CDI specs for nvidia.com/gpu: {}",
            n.cdi_specs.join(", ")
        );
    }
    wired && !cdi_only && n.accepts_envvar
}

/// The mode for a node where `envvar` works or not, with a kubelet socket or not.
fn pick(envvar: bool, socket: bool) -> (&'static str, &'static str) {
    match (envvar, socket) {
        (true, true) => ("envvar", "the runtime injects GPUs by NVIDIA_VISIBLE_DEVICES; pick podResources instead where several pods share this node's GPUs (time-slicing, MPS, several Jobs per node): it names each pod's own GPUs, but needs the `privileged` Pod Security level"),
        (true, false) => ("envvar", "the runtime injects GPUs by NVIDIA_VISIBLE_DEVICES; podResources is not possible (no kubelet socket)"),
        (false, _) => ("agentOnly", "the sidecar cannot get the GPUs through NVIDIA_VISIBLE_DEVICES here; the in-process agent reports what CUDA sees in the trainer (annotate Jobs memprof.dev/agent: python)"),
    }
}

/// Inspects the node under `--root` and prints the advice; 1 without GPUs.
pub fn run(args: &Args) -> i32 {
    let (mode, text) = advise(&inspect(&args.root));
    crate::output::print(&text);
    i32::from(mode.is_none())
}

#[cfg(test)]
mod tests;
