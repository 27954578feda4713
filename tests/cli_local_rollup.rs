//! A distributed run without Kubernetes, as a user runs it: one `memprof
//! profile` per rank (what `torchrun --no-python memprof profile --output
//! 'out/{host}-rank{rank}.json' -- python train.py` starts: each with
//! torchrun's RANK, LOCAL_RANK and WORLD_SIZE), each rank's trainer a
//! Python process with the fake torch whose agent pushes to its own
//! profile's sidecar (sim backend, rank 1 leaking), then `memprof rollup`
//! over the files. Needs `cargo build -p memprof-sidecar` and python3.

use memprof::api::{MemoryProfileStatus, MemoryReportSpec, RiskLevel};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const MEMPROF: &str = env!("CARGO_BIN_EXE_memprof");

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A temporary directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("memprof-rollup-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("temp dir");
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The trainer of every rank: the fake torch names the rank's simulated GPU
/// (`GPU-sim-RRRR-00`, what the sim backend calls rank R's GPU 0); rank 1
/// keeps 64 MiB more each 0.1 s (a leak), rank 0 stays flat.
const TRAIN: &str = r#"
import os, sys, time, types
sys.path.insert(0, sys.argv[1])
import fake_torch
fake = fake_torch.install()
rank = int(os.environ["RANK"])
uuid = "sim-%04d-00" % rank
sys.modules["torch"].cuda.get_device_properties = lambda d: types.SimpleNamespace(
    name="Fake H100", uuid=uuid, total_memory=fake.total)
import memprof_agent
assert memprof_agent.start(interval=0.2)
for n in range(60):
    memprof_agent.step(n)
    if rank == 1:
        fake.alloc(64 << 20)
    time.sleep(0.1)
"#;

#[test]
fn every_ranks_profile_rolls_up_to_the_bottleneck_rank_imbalance_and_worst_risk() {
    let sidecar = Path::new(MEMPROF).with_file_name("memprof-sidecar");
    assert!(
        sidecar.is_file(),
        "run `cargo build -p memprof-sidecar` first"
    );
    let dir = TempDir::new("torchrun");
    let scen = dir.0.join("scenario.yaml");
    std::fs::write(
        &scen,
        "seed: 5\ntotalGiB: 80\ngpusPerRank: 1\ndefault: { baseGiB: 30, amplitudeGiB: 4, periodSeconds: 2, noiseGiB: 0.1 }\nranks:\n  \"1\": { leakMiBPerSecond: 1500 }\n",
    )
    .unwrap();
    let train = dir.0.join("train.py");
    std::fs::write(&train, TRAIN).unwrap();
    let fake_dir = root().join("agent/python/tests");
    let out_pattern = dir.0.join("{host}-rank{rank}.json");
    let ranks: Vec<_> = (0..2)
        .map(|rank| {
            Command::new(MEMPROF)
                .args(["profile", "--backend", "sim", "--interval", "200ms"])
                .arg("--scenario")
                .arg(&scen)
                .arg("--agent-path")
                .arg(root().join("agent/python"))
                .arg("--devices")
                .arg("local-rank")
                .arg("--output")
                .arg(&out_pattern)
                .arg("--")
                .arg("python3")
                .arg(&train)
                .arg(&fake_dir)
                .env("RANK", rank.to_string())
                .env("LOCAL_RANK", "0")
                .env("WORLD_SIZE", "2")
                .env("HOSTNAME", "node-a")
                .env_remove("MEMPROF_AGENT_SOCKET")
                .env_remove("MEMPROF_AGENT_URL")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("memprof profile runs")
        })
        .collect();
    let outs: Vec<Output> = ranks
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    for (rank, o) in outs.iter().enumerate() {
        let stdout = text(&o.stdout);
        assert!(
            o.status.success(),
            "rank {rank}:\n{stdout}\n{}",
            text(&o.stderr)
        );
        assert!(
            stdout.contains(&format!(
                "memprof profile: node-a-rank{rank} (rank {rank}, pid "
            )),
            "the rank's process is named in its summary:\n{stdout}"
        );
        assert!(
            stdout.contains("allocator (agent in 1 rank(s))"),
            "{stdout}"
        );
    }
    let files: Vec<PathBuf> = (0..2)
        .map(|r| dir.0.join(format!("node-a-rank{r}.json")))
        .collect();
    let specs: Vec<MemoryReportSpec> = files
        .iter()
        .map(|f| serde_json::from_slice(&std::fs::read(f).expect("per-rank output")).unwrap())
        .collect();
    for (r, s) in specs.iter().enumerate() {
        assert_eq!(
            (s.rank, s.node_name.as_deref(), s.pod_name.as_str()),
            (
                Some(r as u32),
                Some("node-a"),
                format!("node-a-rank{r}").as_str()
            )
        );
        assert_eq!(
            s.gpus[0].uuid,
            format!("GPU-sim-{r:04}-00"),
            "the rank's own GPU"
        );
        assert!(
            s.allocator.is_some(),
            "rank {r}'s agent reached its profile"
        );
    }

    let out = Command::new(MEMPROF)
        .arg("rollup")
        .args(&files)
        .output()
        .unwrap();
    let words = text(&out.stdout);
    assert!(out.status.success(), "{words}\n{}", text(&out.stderr));
    for want in [
        "memprof rollup: 2 report(s) from 1 node(s)",
        "ranks reporting: 2",
        "bottleneck: rank 1, pod node-a-rank1, node node-a, GPU 0 (GPU-sim-0001-00)",
        "allocator (agent in 2 rank(s))",
    ] {
        assert!(words.contains(want), "{want:?} not in\n{words}");
    }
    let json = Command::new(MEMPROF)
        .args(["rollup", "-o", "json", "--expected-ranks", "2"])
        .args(&files)
        .output()
        .unwrap();
    let st: MemoryProfileStatus = serde_json::from_slice(&json.stdout).unwrap();
    let worst = specs.iter().map(|s| s.summary.risk).max().unwrap();
    assert_eq!(st.risk, worst);
    assert!(st.risk >= RiskLevel::Low);
    assert_eq!(st.ranks, "2/2");
    assert!(
        st.imbalance.unwrap() > 1.05,
        "rank 1's leak: {:?}",
        st.imbalance
    );
    assert_eq!(st.bottleneck.unwrap().rank, Some(1));

    // The same files, as `memprof fragment` reads them: each rank's
    // allocator cache from its agent.
    let frag = Command::new(MEMPROF)
        .arg("fragment")
        .args(&files)
        .output()
        .unwrap();
    let words = text(&frag.stdout);
    assert!(frag.status.success(), "{words}\n{}", text(&frag.stderr));
    for r in 0..2 {
        assert!(
            words.contains(&format!("node-a-rank{r}.json: rank {r} (node-a-rank{r})\n")),
            "{words}"
        );
    }
    assert_eq!(words.matches("    fragmentation: ").count(), 2, "{words}");
    assert_eq!(words.matches("    advice: ").count(), 2, "{words}");
}
