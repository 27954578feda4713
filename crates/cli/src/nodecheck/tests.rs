use super::*;

/// A fake node root with these files (path, content).
struct Tree(PathBuf);

impl Tree {
    fn new(files: &[(&str, &str)]) -> Self {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let i = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let root = std::env::temp_dir().join(format!("memprof-node-{}-{i}", std::process::id()));
        for (p, text) in files {
            let f = root.join(p);
            std::fs::create_dir_all(f.parent().unwrap()).unwrap();
            std::fs::write(f, text).unwrap();
        }
        std::fs::create_dir_all(&root).unwrap();
        Tree(root)
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const GPUS: [(&str, &str); 3] = [
    ("dev/nvidia0", ""),
    ("dev/nvidia1", ""),
    ("dev/nvidiactl", ""),
];
const CONTAINERD: (&str, &str) = (
    "etc/containerd/config.toml",
    "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia]\n  BinaryName = \"/usr/bin/nvidia-container-runtime\"\n",
);
const SOCKET: (&str, &str) = ("var/lib/kubelet/pod-resources/kubelet.sock", "");

fn advice(files: &[(&str, &str)]) -> (Option<&'static str>, String, Node) {
    let t = Tree::new(files);
    let node = inspect(&t.0);
    let (mode, text) = advise(&node);
    (mode, text, node)
}

#[test]
fn the_nvidia_runtime_and_the_kubelet_socket_allow_envvar_and_pod_resources() {
    let mut files = GPUS.to_vec();
    files.extend([CONTAINERD, SOCKET]);
    let (mode, text, node) = advice(&files);
    assert_eq!(node.gpus, ["/dev/nvidia0", "/dev/nvidia1"]);
    assert_eq!(node.runtime_configs, ["/etc/containerd/config.toml"]);
    assert_eq!(mode, Some("envvar"));
    assert!(text.contains("pick: gpuAccess=envvar"), "{text}");
    assert!(
        text.contains("pick podResources instead where several pods share"),
        "{text}"
    );
    assert!(
        text.contains(
            "OK    kubelet PodResources socket /var/lib/kubelet/pod-resources/kubelet.sock"
        ),
        "{text}"
    );
    let (_, text, _) = advice(&[GPUS[0], CONTAINERD]);
    assert!(
        text.contains("podResources is not possible (no kubelet socket)"),
        "{text}"
    );
}

#[test]
fn cdi_only_mode_or_a_runtime_that_refuses_the_variable_means_agent_only() {
    let toolkit = |body: &'static str| ("etc/nvidia-container-runtime/config.toml", body);
    let cdi = toolkit("# comment\nmode = \"cdi\"\n");
    let spec = ("etc/cdi/nvidia.yaml", "kind: nvidia.com/gpu\n");
    let (mode, text, node) = advice(&[GPUS[0], CONTAINERD, cdi, spec]);
    assert_eq!(
        (mode, node.toolkit_mode.as_deref()),
        (Some("agentOnly"), Some("cdi"))
    );
    assert!(
        text.contains("NO    /etc/nvidia-container-runtime/config.toml: mode cdi"),
        "{text}"
    );
    assert!(
        text.contains("INFO  CDI specs for nvidia.com/gpu: /etc/cdi/nvidia.yaml"),
        "{text}"
    );
    let bottlerocket = toolkit("accept-nvidia-visible-devices-envvar-when-unprivileged = false\n");
    let (mode, text, _) = advice(&[GPUS[0], CONTAINERD, bottlerocket]);
    assert_eq!(mode, Some("agentOnly"));
    assert!(text.contains("refused (as on Bottlerocket)"), "{text}");
    // Legacy mode stated explicitly still allows envvar.
    let (mode, _, _) = advice(&[GPUS[0], CONTAINERD, toolkit("mode = \"legacy\"\n")]);
    assert_eq!(mode, Some("envvar"));
}

#[test]
fn no_nvidia_runtime_means_agent_only_and_no_gpu_means_nothing_to_profile() {
    let plain = ("etc/containerd/config.toml", "version = 2\n");
    let (mode, text, _) = advice(&[GPUS[0], plain]);
    assert_eq!(mode, Some("agentOnly"));
    assert!(
        text.contains("NO    no runtime configuration names the NVIDIA runtime"),
        "{text}"
    );
    let (mode, text, _) = advice(&[CONTAINERD]);
    assert_eq!(mode, None);
    assert!(text.contains("no NVIDIA GPU device nodes"), "{text}");
    assert!(!is_gpu_node("nvidia-uvm") && !is_gpu_node("nvidiactl") && is_gpu_node("nvidia12"));
}

#[test]
fn absolute_links_resolve_inside_the_root_as_on_the_node() {
    // As in `kubectl debug node`: /host/var/run -> /run must mean /host/run,
    // and a config linked to an absolute path is read from the node's tree.
    let t = Tree::new(&[
        GPUS[0],
        SOCKET,
        ("run/cdi/nvidia.yaml", "kind: nvidia.com/gpu\n"),
        ("opt/k8s/containerd.toml", CONTAINERD.1),
    ]);
    let link = |target: &str, at: &str| {
        let at = t.0.join(at);
        std::fs::create_dir_all(at.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(target, at).unwrap();
    };
    link("/run", "var/run");
    link("/opt/k8s/containerd.toml", "etc/containerd/config.toml");
    link("../../../../outside", "etc/cdi");
    assert_eq!(resolve(&t.0, "var/run/cdi"), t.0.join("run/cdi"));
    // `..` stops at the root: the link cannot read the test machine's files.
    assert_eq!(resolve(&t.0, "etc/cdi"), t.0.join("outside"));
    let node = inspect(&t.0);
    assert_eq!(node.runtime_configs, ["/etc/containerd/config.toml"]);
    // Seen through /run/cdi and /var/run/cdi: one spec.
    assert_eq!(node.cdi_specs, ["/run/cdi/nvidia.yaml"]);
    assert_eq!(advise(&node).0, Some("envvar"));
}
