//! The real `memprof-sidecar` as a training pod's sidecar, for tests on the
//! local control plane: started as the pod (its name, uid, namespace) and,
//! when asked, with the pod's own identity (its service account).

#![allow(dead_code)] // each test binary uses a subset
use crate::common::{self, eventually, socket_request, AgentSocket};
use std::process::{Child, Command, Stdio};

/// A sidecar process killed (by PID, through its handle) when dropped.
pub struct Sidecar {
    child: Child,
    pub socket: AgentSocket,
    _kubeconfig: Option<std::path::PathBuf>,
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(p) = &self._kubeconfig {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// The test's kubeconfig, acting as `ns`'s default service account (what
/// the pod's sidecar runs as).
pub fn kubeconfig_as_pod(ns: &str) -> std::path::PathBuf {
    let path = std::env::var("KUBECONFIG").expect("KUBECONFIG");
    let mut cfg: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    for u in cfg["users"].as_sequence_mut().unwrap() {
        let user = u["user"].as_mapping_mut().unwrap();
        let sa = format!("system:serviceaccount:{ns}:default");
        user.insert("as".into(), sa.into());
        let groups = vec![
            "system:serviceaccounts".to_string(),
            format!("system:serviceaccounts:{ns}"),
            "system:authenticated".into(),
        ];
        user.insert("as-groups".into(), serde_yaml::to_value(groups).unwrap());
    }
    let out = std::env::temp_dir().join(format!("memprof-kubeconfig-{}", common::random_suffix()));
    std::fs::write(&out, serde_yaml::to_string(&cfg).unwrap()).unwrap();
    out
}

pub async fn start(
    pod: &str,
    uid: &str,
    ns: &str,
    kubeconfig: Option<std::path::PathBuf>,
) -> Sidecar {
    let socket = AgentSocket::new();
    let mut cmd = Command::new(common::sidecar_binary());
    cmd.args(["--backend", "nvml", "--interval", "100ms"])
        .args(["--listen", "127.0.0.1:0"])
        .arg("--agent-socket")
        .arg(socket.path())
        .env("POD_NAME", pod)
        .env("POD_UID", uid)
        .env("POD_NAMESPACE", ns)
        .env("MEMPROF_JOB_NAME", "train")
        .env("RANK", "0")
        .env("MEMPROF_HEARTBEAT_SECONDS", "5")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    if let Some(k) = &kubeconfig {
        cmd.env("KUBECONFIG", k);
    }
    let sidecar = Sidecar {
        child: cmd.spawn().expect("memprof-sidecar starts"),
        socket,
        _kubeconfig: kubeconfig,
    };
    eventually("the sidecar serves its socket", || async {
        match socket_request(&sidecar.socket.path(), "GET", "/healthz", "")
            .await
            .0
        {
            200 => Ok(()),
            code => Err(format!("GET /healthz: {code}")),
        }
    })
    .await;
    sidecar
}
