//! Several trainer processes pushing into one pod's agent state: torchrun's
//! ranks, a stray context, a restart.

use super::*;

/// A push of process `pid` for its GPU `uuid` (CUDA ordinal `index`).
fn rank_push(pid: u32, index: u32, uuid: &str, t: f64, a: At) -> Push {
    let mut p = push(t, Some(2 * t as u64), None, a);
    p.pid = pid;
    p.devices[0].index = index;
    p.devices[0].uuid = Some(uuid.into());
    p
}

/// The same leak as `a_leak_is_called_a_leak_...`: 100 MB/s, 2 GB segments.
fn leaking(t: f64) -> At {
    let floor = 30.0 * GB + 100e6 * t;
    let reserved = ((floor + 15.0 * GB) / (2.0 * GB)).ceil() * 2.0 * GB;
    at(floor, floor + 15.0 * GB, reserved)
}

fn of<'a>(s: &'a AgentState, uuid: &str) -> (usize, &'a AgentDevice) {
    let devices = s.devices();
    let i = devices
        .iter()
        .position(|d| d.uuid.as_deref() == Some(uuid))
        .unwrap_or_else(|| panic!("{uuid} not among the devices"));
    (i, devices[i])
}

/// Two torchrun ranks in one pod, one GPU each, pushing in turn: each GPU
/// keeps its own history, so rank 1's leak is called and its OOM
/// predicted as if it were alone (before, every change of pid restarted
/// every history, and neither GPU ever held more than one push).
#[test]
fn torchrun_ranks_in_one_pod_each_keep_their_history() {
    let th = Thresholds::default();
    let mut s = AgentState::new(&th);
    for i in 0..=150usize {
        let t = i as f64;
        s.observe(&rank_push(100, 0, "GPU-a", t, training(t)));
        s.observe(&rank_push(101, 1, "GPU-b", t + 0.5, leaking(t)));
    }
    assert_eq!(s.devices().len(), 2);
    let all = s.assess();
    let (b, _) = of(&s, "GPU-b");
    let (a, _) = of(&s, "GPU-a");
    assert_eq!(all[b].growth, MemoryGrowth::Leak, "{:?}", all[b]);
    assert!(all[b].risk.time_to_oom_seconds.is_some(), "{:?}", all[b]);
    assert_ne!(all[a].growth, MemoryGrowth::Leak, "{:?}", all[a]);
    // The section is the process with the most allocated memory: the leaking one.
    let stats = s.stats().unwrap();
    assert_eq!(stats.device, Some(1));
    assert!(stats.steps_per_second.is_some());
}

/// Rank 0 also holds a small context on rank 1's GPU (a common torchrun
/// slip): that GPU is still spoken for by rank 1, which trains there.
#[test]
fn a_stray_context_does_not_speak_for_another_ranks_gpu() {
    let th = Thresholds::default();
    let mut s = AgentState::new(&th);
    for i in 0..=120usize {
        let t = i as f64;
        let mut p = rank_push(100, 0, "GPU-a", t, training(t));
        let mut stray = p.devices[0].clone();
        stray.index = 1;
        stray.uuid = Some("GPU-b".into());
        stray.allocated_bytes = 1_000_000;
        stray.reserved_bytes = 2_000_000;
        stray.peak_allocated_bytes = Some(1_000_000);
        p.devices.push(stray);
        s.observe(&p);
        s.observe(&rank_push(101, 1, "GPU-b", t + 0.5, leaking(t)));
    }
    assert_eq!(s.devices().len(), 2);
    let (b, d) = of(&s, "GPU-b");
    assert!(
        d.last.allocated_bytes > 1_000_000_000,
        "{}",
        d.last.allocated_bytes
    );
    assert_eq!(s.assess()[b].growth, MemoryGrowth::Leak);
}

/// A trainer restarted in the same container: the old process is over once
/// the new one pushes, speaks for nothing, and is forgotten later; its OOM
/// stays counted.
#[test]
fn a_restart_supersedes_the_old_process_and_keeps_its_oom_count() {
    let th = Thresholds::default();
    let mut s = AgentState::new(&th);
    for i in 0..=40usize {
        let t = i as f64;
        s.observe(&rank_push(100, 0, "GPU-a", t, leaking(t)));
    }
    let mut oom = rank_push(100, 0, "GPU-a", 41.0, leaking(41.0));
    oom.devices[0].num_ooms = 1;
    s.observe(&oom);
    // The new process starts 20 s later, on the same GPU, with little allocated.
    for i in 60..=200usize {
        let t = i as f64;
        s.observe(&rank_push(
            200,
            0,
            "GPU-a",
            t,
            at(5.0 * GB, 6.0 * GB, 8.0 * GB),
        ));
    }
    let (_, d) = of(&s, "GPU-a");
    assert_eq!(
        d.last.allocated_bytes, 5_000_000_000,
        "the new process speaks for GPU-a"
    );
    assert_eq!(s.devices().len(), 1);
    let stats = s.stats().unwrap();
    assert_eq!(stats.allocated_bytes, 5_000_000_000);
    assert_eq!(stats.num_ooms, 1, "the old process's OOM still counts");
    assert_eq!(s.processes_followed(), 1, "the old process is forgotten");
}

/// Processes beyond [`MAX_PROCESSES`] make room by dropping the one that
/// pushed least recently: what a pod's processes push cannot grow the
/// state without bound.
#[test]
fn processes_followed_are_bounded() {
    let th = Thresholds::default();
    let mut s = AgentState::new(&th);
    for pid in 1..=(3 * MAX_PROCESSES as u32) {
        let t = f64::from(pid) * 0.01;
        s.observe(&rank_push(pid, 0, "GPU-a", t, training(t)));
    }
    assert_eq!(s.processes_followed(), MAX_PROCESSES);
}

/// Pushes that name no process (pid 0: fixtures, an agent that does not
/// say) continue the most recent history, and the first process to name
/// itself takes it over: one history, as before pids were told apart.
#[test]
fn pushes_without_a_pid_continue_the_history_they_follow() {
    let th = Thresholds::default();
    let mut s = AgentState::new(&th);
    for i in 0..=150usize {
        let t = i as f64;
        s.observe(&rank_push(0, 0, "GPU-b", t, leaking(t)));
    }
    s.observe(&rank_push(4242, 0, "GPU-b", 151.0, leaking(151.0)));
    s.observe(&rank_push(0, 0, "GPU-b", 152.0, leaking(152.0)));
    assert_eq!(s.processes_followed(), 1);
    assert_eq!(s.assess()[0].growth, MemoryGrowth::Leak);
}

/// The agent's wall clock stepped back an hour (NTP): the process's history
/// starts again instead of folding every later push into its newest bucket,
/// so a leak that follows is still called.
#[test]
fn a_clock_stepped_back_starts_the_history_again() {
    let th = Thresholds::default();
    let mut s = AgentState::new(&th);
    for i in 0..=60usize {
        let t = i as f64;
        s.observe(&rank_push(100, 0, "GPU-b", t, training(t)));
    }
    for i in 0..=150usize {
        let t = i as f64 - 3600.0;
        s.observe(&rank_push(100, 0, "GPU-b", t, leaking(t + 3600.0)));
    }
    assert_eq!(s.processes_followed(), 1);
    assert_eq!(
        s.assess()[0].growth,
        MemoryGrowth::Leak,
        "{:?}",
        s.assess()[0]
    );
}
