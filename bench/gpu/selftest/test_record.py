"""Self-tests of the recording campaign (bench/gpu/record.sh) on a machine
without a GPU: the push proxy against a real memprof-sidecar (sim backend),
the two sets' plans against the time budget, scenarios.py's arithmetic, and
whole rehearsals of record.sh with a stand-in torch (selftest/torch) and the
sim backend, one of them against a short deadline.

    SIDECAR=path/to/memprof-sidecar [MEMPROF=path/to/memprof] python3 -m pytest -q bench/gpu/selftest

SIDECAR defaults to target/debug/memprof-sidecar (cargo build -p memprof-sidecar).
"""
import json
import os
import re
import subprocess
import sys
import tarfile
import time
import types
import urllib.error
import urllib.request
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
GPU = HERE.parent
ROOT = GPU.parents[1]
sys.path.insert(0, str(GPU))
import causes  # noqa: E402  (no torch needed but for the neighbour process)
import scenarios  # noqa: E402  (no torch needed until load_torch())
import uds_http  # noqa: E402

FILES = ("trace.csv", "events.jsonl", "sidecar.log", "report.json", "polls.jsonl", "pushes.jsonl", "processes.csv",
         "steps.csv", "summary.json", "trainer.log")
STEP_COLUMNS = "t,step,step_ms,allocated,reserved,max_reserved,dev_used,batch,kept,phase,seq"


def sidecar_bin():
    path = os.environ.get("SIDECAR") or str(ROOT / "target" / "debug" / "memprof-sidecar")
    if not os.access(path, os.X_OK):
        pytest.fail("no memprof-sidecar at %s: cargo build -p memprof-sidecar, or set SIDECAR" % path)
    return path


def sim_scenario(tmp):
    p = Path(tmp) / "sim.yaml"
    p.write_text("totalGiB: 80\ndefault: { baseGiB: 10, amplitudeGiB: 2, periodSeconds: 1, noiseGiB: 0.05 }\n")
    return p


def wait_for(pred, timeout=10.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError("timed out")


@pytest.fixture
def sidecar(tmp_path):
    log = tmp_path / "sidecar.log"
    sock = tmp_path / "agent.sock"
    proc = subprocess.Popen([sidecar_bin(), "--standalone", "--backend", "sim", "--scenario", str(sim_scenario(tmp_path)),
                             "--listen", "127.0.0.1:0", "--interval", "200ms", "--agent-socket", str(sock)],
                            stdout=subprocess.DEVNULL, stderr=open(log, "w"), env=dict(os.environ, RUST_LOG="info", NO_COLOR="1"))
    port = wait_for(lambda: (re.findall(r"addr=127\.0\.0\.1:(\d+)", log.read_text()) or [None])[0])
    wait_for(sock.exists)
    yield types.SimpleNamespace(proc=proc, port=int(port), socket=str(sock))
    proc.terminate()
    proc.wait(10)


@pytest.fixture
def proxy(tmp_path):
    files = types.SimpleNamespace(log=tmp_path / "p.pushes.jsonl", port=tmp_path / "p.port", upstream=tmp_path / "p.upstream")
    proc = subprocess.Popen([sys.executable, str(GPU / "push_log_proxy.py"), "--log", str(files.log),
                             "--port-file", str(files.port), "--upstream-file", str(files.upstream)])
    files.url = "http://127.0.0.1:%s/v1/agent" % wait_for(lambda: files.port.exists() and files.port.read_text().strip())
    files.proc = proc
    yield files
    proc.terminate()
    proc.wait(10)


def post(url, body):
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def push(allocated):
    return json.dumps({"version": 1, "kind": "sample", "time": time.time(), "pid": 7, "step": 1, "events": [],
                       "devices": [{"index": 0, "uuid": "GPU-sim-0000-00", "allocatedBytes": allocated,
                                    "reservedBytes": 9_000_000_000, "freeBytes": 60_000_000_000,
                                    "totalBytes": 85_899_345_920}]}).encode()


def lines(path):
    return [json.loads(x) for x in Path(path).read_text().splitlines()]


def test_proxy_holds_pushes_until_the_sidecar_is_known_then_forwards_them(sidecar, proxy):
    assert post(proxy.url, push(1_000_000_000)) == (204, "")
    proxy.upstream.write_text(sidecar.socket + "\n")
    assert post(proxy.url, push(5_432_100_000))[0] == 200
    held, sent = lines(proxy.log)
    assert held["forwarded"] is False and held["status"] == 204
    assert held["push"]["devices"][0]["allocatedBytes"] == 1_000_000_000
    assert sent["forwarded"] is True and sent["status"] == 200 and sent["t"] >= held["t"]
    # The real sidecar took it: its report (on its socket) carries the forwarded numbers.
    def allocator():
        status, body = uds_http.request(sidecar.socket, "GET", "/v1/report")
        return status == 200 and (json.loads(body).get("allocator") or {}).get("allocatedBytes")
    assert wait_for(lambda: allocator() == 5_432_100_000)


def test_proxy_relays_the_sidecars_refusal_and_its_absence(sidecar, proxy):
    proxy.upstream.write_text(sidecar.socket + "\n")
    status, text = post(proxy.url, b"{not json")
    assert status == 400 and "invalid agent payload" in text
    sidecar.proc.terminate()
    sidecar.proc.wait(10)
    assert post(proxy.url, push(1))[0] == 502
    # The proxy logs a push after it answers: on a loaded machine the
    # second line can come a moment after the 502.
    refused, absent = wait_for(lambda: len(lines(proxy.log)) == 2 and lines(proxy.log))
    assert refused["raw"] == "{not json" and refused["status"] == 400 and refused["forwarded"] is True
    assert absent["status"] == 502 and absent["forwarded"] is False and absent["error"]


def plan(set_name):
    res = subprocess.run(["bash", str(GPU / "record.sh"), "/nonexistent/x", set_name, "--plan"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    rows = {ln.split()[0]: ln.split() for ln in res.stdout.splitlines()[1:] if ln and not ln.startswith("expected")}
    expected = float(re.search(r"expected wall time: ([\d.]+) s", res.stdout).group(1))
    return rows, expected


def test_both_sets_fit_the_deadline_cover_every_scenario_and_differ():
    dev, t_dev = plan("dev")
    held, t_held = plan("heldout")
    want = {"leak2000", "leak500", "leak100", "emptycache", "fullgpu", "valloss", "growbatch", "slowleak", "steadyeval"}
    assert set(dev) == want
    assert len([n for n in held if re.fullmatch(r"leak\d+", n)]) == 3
    assert len(held) == 9 and {"emptycache", "fullgpu", "valloss", "growbatch", "slowleak", "steadyeval"} <= set(held)
    assert t_dev < 470 and t_held < 470  # DEADLINE_S: under 8 minutes with the archive
    opt = lambda row, flag: row[row.index(flag) + 1] if flag in row else None  # noqa: E731
    assert not {opt(r, "--seed") for r in dev.values()} & {opt(r, "--seed") for r in held.values()}
    for name in dev:
        if name in held:
            assert dev[name][4:] != held[name][4:], name
    rates = lambda rows: sorted(float(opt(r, "--leak-mbps")) for r in rows.values() if opt(r, "--leak-mbps"))  # noqa: E731
    assert not set(rates(dev)) & set(rates(held))
    for rows in (dev, held):
        ag = sorted(float(opt(r, "--leak-mbps")) for n, r in rows.items() if re.fullmatch(r"leak\d+", n))
        assert 80 <= ag[0] <= 150 and 350 <= ag[1] <= 700 and 1500 <= ag[2] <= 2500, ag
        assert all(float(opt(r, "--life")) >= 30 for n, r in rows.items() if re.fullmatch(r"leak\d+", n))
        assert float(opt(rows["slowleak"], "--duration")) >= 90 and 20 <= float(opt(rows["slowleak"], "--leak-mbps")) <= 40
        assert float(opt(rows["growbatch"], "--duration")) >= 80 and float(opt(rows["steadyeval"], "--duration")) >= 60
        sched = scenarios.parse_schedule(opt(rows["growbatch"], "--batch-schedule"))
        assert sched[-1][1] == 4 * sched[0][1]
        assert float(opt(rows["fullgpu"], "--fill-pct")) >= 90 and "--keep-eval-graph" in rows["valloss"]
        assert "--empty-cache-every" in rows["emptycache"]


def test_schedule_and_headroom_arithmetic():
    assert scenarios.parse_schedule("8") == [(0.0, 8)]
    assert scenarios.parse_schedule("20:8,0:4") == [(0.0, 4), (20.0, 8)]
    assert scenarios.batch_at([(0.0, 4), (20.0, 8)], 19.9) == 4 and scenarios.batch_at([(0.0, 4), (20.0, 8)], 20) == 8
    with pytest.raises(SystemExit):
        scenarios.parse_schedule("5:4")
    a = scenarios.parse(["--name", "x", "--leak-mbps", "500", "--life", "30", "--batch-schedule", "4",
                         "--seq", "1024", "--vocab", "32000", "--peak-every", "10"])
    room = scenarios.Trainer.headroom_for(types.SimpleNamespace(a=a), 70e9, 85e9, None)
    assert room == 500e6 * 30 + 0.5 * 4 * 2048 * 32000 * 4  # the leak's bytes + half the longest step's logits
    a = scenarios.parse(["--name", "x", "--fill-pct", "92"])
    assert scenarios.Trainer.headroom_for(types.SimpleNamespace(a=a), 70e9, 85e9, None) == pytest.approx(85e9 * 0.08)
    a = scenarios.parse(["--name", "x", "--keep-eval-graph", "--eval-every", "4", "--life", "20"])
    assert a.eval_at == a.leak_at
    assert scenarios.Trainer.headroom_for(types.SimpleNamespace(a=a), 70e9, 85e9, 2e9) == 4.5 * 2e9
    assert scenarios.Trainer.headroom_for(types.SimpleNamespace(a=scenarios.parse(["--name", "x"])), 1, 2, None) is None
    with pytest.raises(SystemExit):
        scenarios.parse(["--name", "x", "--life", "30"])  # no leak to time


def rehearse(tmp_path, **env):
    out = tmp_path / "set"
    e = dict(os.environ, SIDECAR=sidecar_bin(), EXTRA_PYTHONPATH=str(HERE), FAKE_TORCH_SYNC_S="0.03",
             SIDECAR_BACKEND="--backend sim --scenario %s" % sim_scenario(tmp_path), **env)
    e.setdefault("MEMPROF", os.environ.get("MEMPROF", str(ROOT / "target" / "debug" / "memprof")))
    t0 = time.time()
    res = subprocess.run(["bash", str(GPU / "record.sh"), str(out), "selftest"], capture_output=True, text=True,
                         timeout=400, env=e)
    wall = time.time() - t0
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert not out.exists(), "the folder goes once the archive is verified"
    with tarfile.open(str(out) + ".tar.gz") as tar:
        tar.extractall(tmp_path / "x")
    return tmp_path / "x" / "set", res.stdout, wall


def test_rehearsal_records_every_file_and_the_truth(tmp_path):
    d, stdout, wall = rehearse(tmp_path)
    plan = {ln.split()[1]: ln.split()[2] for ln in (d / "plan.txt").read_text().splitlines()}
    rows = (d / "schedule.csv").read_text().splitlines()
    assert rows[0] == "name,go,end,rc,exit,killed,cap_s,shortened_to_s" and len(rows) == 1 + len(plan)
    for n, truth in plan.items():
        for f in FILES:
            assert (d / ("%s.%s" % (n, f))).stat().st_size > 0, (n, f)
        s = json.loads((d / ("%s.summary.json" % n)).read_text())
        steps = (d / ("%s.steps.csv" % n)).read_text().splitlines()
        assert steps[0] == STEP_COLUMNS and len(steps) > 50
        pushes = lines(d / ("%s.pushes.jsonl" % n))
        sent = [p for p in pushes if p["forwarded"]]
        assert sent and all(p["status"] == 200 for p in sent), n
        assert any(p["push"].get("devices") for p in sent)
        assert not any(p["push"].get("devices") for p in pushes if not p["forwarded"]), "held pushes come before CUDA"
        polls = [p for p in lines(d / ("%s.polls.jsonl" % n)) if "report" in p]
        assert any((p["report"]["gpus"][0].get("assessedFrom") == "agent") for p in polls), n
        assert not any(k in json.dumps(polls) for k in ("\"timeline\"", "\"packedTimeline\"")), "timelines are dropped"
        if truth == "oom":
            assert s["exit"] == "oom" and s["oomAt"] > s["leakFrom"] > s["start"], n
            assert "OutOfMemoryError" in (d / ("%s.trainer.log" % n)).read_text()
            assert any(p["push"].get("kind") == "oom" for p in sent), "the agent's OOM push reached the sidecar"
        elif truth == "leak":
            assert s["exit"] == "duration" and s["oomAt"] is None and s["leakFrom"] and s["keptBytes"] > 0
        else:
            assert s["exit"] == "duration" and s["leakFrom"] is None and s["keptBytes"] == 0
    # Started ahead of their turn: the later trainers' first pushes were held.
    assert any(not p["forwarded"] for p in lines(d / "steadyeval.pushes.jsonl"))
    s = {n: json.loads((d / ("%s.summary.json" % n)).read_text()) for n in plan}
    assert s["leak2000"]["leakMeasuredMBps"] == pytest.approx(2000, rel=0.05)
    assert 6 < s["leak2000"]["oomAt"] - s["leak2000"]["leakFrom"] < 10  # --life 8, the stand-in's own limit
    assert s["emptycache"]["emptyCacheAt"] and s["growbatch"]["batchChanges"][-1][1] == 8
    assert s["fullgpu"]["headroomBytes"] == pytest.approx(0.06 * s["fullgpu"]["totalBytes"], rel=0.1)
    assert s["valloss"]["probePassBytes"] > 0 and all(p[2] > 0 for p in s["valloss"]["evalPasses"])
    assert all(p[2] < 1e6 for p in s["steadyeval"]["evalPasses"]), "no_grad eval keeps nothing"
    check = json.loads((d / "check.json").read_text())
    assert [r["name"] for r in check["scenarios"]] == list(plan)
    assert check["live"]["leaksFlagged"].endswith("/5") and "leakFlag" in check["scenarios"][0]["live"]
    nvml = [r["nvml"] for r in check["scenarios"] if r.get("nvml")]
    assert nvml and all("error" not in n for n in nvml), nvml
    assert "times in s" in stdout and "archive:" in stdout
    print(f"rehearsal wall time: {wall:.0f} s")  # a measure, not a verdict: the machine's load decides it


def test_a_set_never_runs_past_its_deadline(tmp_path):
    d, stdout, wall = rehearse(tmp_path, DEADLINE_S="40", MIN_S="12")
    rows = [r.split(",") for r in (d / "schedule.csv").read_text().splitlines()[1:]]
    assert any(r[4] == "skipped" for r in rows), rows
    ran = [r for r in rows if r[4] != "skipped"]
    assert float(ran[-1][2]) - float(ran[0][1]) < 40  # the set's own clock, not this test's
    shortened = [r for r in ran if r[7]]
    assert shortened, "the second scenario starts with less than its cap left"
    for r in shortened:
        name = r[0]
        s = json.loads((d / ("%s.summary.json" % name)).read_text())
        assert s["end"] - s["start"] <= float(r[7]) + 2


def test_the_go_file_shortens_a_run(tmp_path):
    go = tmp_path / "go"
    a = scenarios.parse(["--name", "x", "--duration", "60", "--go-file", str(go), "--go-timeout", "5"])
    go.write_text("duration=17\n")
    scenarios.wait_for_go(a)
    assert a.duration == 17
    go.write_text("\n")  # no deadline near: the table's duration stands
    a = scenarios.parse(["--name", "x", "--duration", "60", "--go-file", str(go)])
    scenarios.wait_for_go(a)
    assert a.duration == 60


def test_the_causes_sets_fit_one_call_each_and_name_their_causes():
    for name in ("causes-dev", "causes-heldout", "causes-fresh", "causes-fresh2"):
        rows, t = plan(name)
        assert t < 545, name  # one set per GPU in one call under 10 minutes with its archive
        named = {n: scenarios.parse(["--name", n] + r[4:]).cause for n, r in rows.items()}
        assert named == {"growdemand": "growingDemand", "neighbour": "neighbour",
                         "fragmentation": "fragmentation", "spike": "spike", "churn": "churn", "varlen": "varlen",
                         "steady": "steady"}, name
        assert rows["growdemand"][1] == "other" and rows["churn"][1] == "none"
        lives = [float(r[r.index("--life") + 1]) for r in rows.values() if "--life" in r]
        assert min(lives) >= 95, name  # the goals are stated for causes living >= 90 s


def test_the_causes_arithmetic():
    ramp = causes.DemandRamp(1024, 8192, round_to=128)
    assert ramp.seq_at(5.0) == 1024  # before the ramp starts
    ramp.start(10.0, bytes_per_token=4e6, mbps=400)  # 100 positions a second
    assert ramp.seq_at(10.0) == 1024 and ramp.seq_at(20.0) == 1920 and ramp.seq_at(1e4) == 8192
    v = causes.VarLen(1024, "0.25:2", seed=1)
    lens = [v.next() for _ in range(200)]
    assert min(lens) >= 256 and max(lens) <= 2048 and all(n % 64 == 0 for n in lens) and len(set(lens)) > 10
    sp = causes.Spikes("40:1.5,14:0.75")
    assert sp.first() == 14.0 and not sp.due(13.9) and sp.due(14.0)
    with pytest.raises(SystemExit):
        scenarios.parse(["--name", "x", "--fragment"])  # its pace comes from --life
    with pytest.raises(SystemExit):
        scenarios.parse(["--name", "x", "--split-helper"])  # nothing to split without the loop


def test_the_one_keeper_fragmenter_keeps_one_small_block_a_segment():
    """A stand-in torch records what the fragmenter asks for: with
    --fragment-one-keeper each tick is one segment of the pace's bytes and
    one 1 MiB + 512 B keeper, so at ticks of 10 s its own leak is under
    memprof's leakBytesPerSecond (10 MB a minute); the per-piece keepers
    leak 4 % of the pace."""
    asked = []

    class Stream:
        def __init__(self, device=None):
            pass

    class Ctx:
        def __init__(self, s):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

    def empty(n, dtype=None, device=None):
        asked.append(n)
        return bytearray(0)

    fake = types.SimpleNamespace(uint8="u8", empty=empty,
                                 cuda=types.SimpleNamespace(Stream=Stream, stream=Ctx, ExternalStream=None))
    f = causes.Fragmenter(fake, 0, t0=0.0, mbps=1000.0, tick=10.0, one_keeper=True)
    made = f.step(0.0)
    assert made == 10_000_000_000 // 512 * 512 and asked == [made, causes.MIB + 512]
    f.step(10.0)
    kept_per_s = f.kept / 20.0  # two ticks' keepers over the two ticks' 20 s
    assert kept_per_s < 10e6 / 60, kept_per_s
    asked.clear()
    lean = causes.Fragmenter(fake, 0, t0=0.0, mbps=1000.0, tick=0.5)
    lean.step(0.0)
    assert lean.kept / lean.made > 0.03  # the per-piece keepers: a leak beside the fragmentation


def test_the_nvml_replay_is_placed_on_the_sidecars_clock(tmp_path):
    """The trace counts seconds from the sidecar's start; the summary's times
    are Unix seconds: the replay's readings are moved by the stamp of the
    sidecar's first risk transition (as `memprof analyze --evaluate` does),
    or the check compared 17 s with 1.8e9 s and printed -1795965581 s."""
    import scenarios_check

    log = tmp_path / "x.sidecar.log"
    log.write_text("2026-11-29T15:18:38.043980Z  INFO memprof_sidecar::run: 1 GPU(s)\n"
                   "2026-11-29T15:18:38.500000Z  INFO memprof_sidecar::run: risk changed gpu=0 from=none to=low\n")
    origin = scenarios_check.sidecar_origin(str(log))
    assert origin == pytest.approx(1795965518.5)
    fake = tmp_path / "memprof"
    fake.write_text('#!/bin/sh\necho \'{"event":"estimate","t":17.0,"risk":"high"}\'\n')
    fake.chmod(0o755)
    series, err = scenarios_check.nvml_series(str(fake), str(tmp_path / "x.trace.csv"), origin)
    assert err is None and [e["t"] for e in series] == [pytest.approx(origin + 17.0)]
