"""The recommendation through the real parts: a workload of
estimate_workloads.py trains with the in-process agent (started by the
startup hook, no code change) pushing to a real `memprof-sidecar
--standalone`; the sidecar's final report (what a MemoryReport carries) is
turned into a request by a copy of memprof_analysis::recommend's formula
(`request_of_report`, held to the Rust one by
`the_reports_requests_are_what_recommend_gives` on the recorded reports);
then fresh runs, without the agent, capped at the request and at 90 % of it
(less the context, as recommend_cap.py caps).

    CUDA_VISIBLE_DEVICES=N SIDECAR=BIN python3 bench/gpu/recommend_through.py OUTDIR WORKERS NAME...

Writes OUTDIR/NAME.report.json (the sidecar's final report),
OUTDIR/NAME.sidecar.log and OUTDIR/through.json (one row per NAME).
"""
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import recommend_cap as rc  # noqa: E402
import recommend_need as rn  # noqa: E402

# Pushes are once a second; the last one after the checkpoint must land.
SETTLE_S = 4


def child():
    """The trainer: recommend_cap's run (steps, evaluation, checkpoint), then
    a pause so the agent's next push carries the final peaks."""
    ev = rc.run_workload(None)
    time.sleep(SETTLE_S)
    print(json.dumps(ev))


def request_of_report(report):
    """memprof_analysis::recommend's request for one rank from its report
    (phases not required): need + context + margin, rounded up."""
    a = report["allocator"]
    trend = [p["reservedBytes"] for p in a.get("fragmentationTrend", [])]
    allocated = a.get("peakAllocatedBytes", a["allocatedBytes"])
    reserved = max([a["reservedBytes"], allocated] + trend)
    split = a.get("peakInactiveSplitBytes")
    need = reserved if split is None else min(reserved, allocated + split)
    need = min(need, max(g["totalBytes"] for g in report["gpus"]))
    half = len(trend) // 2
    late = max(trend) - max(trend[:half]) if half else 0
    margin = max(rc.MIN_MARGIN_BYTES, math.ceil(need * rc.MIN_MARGIN_FRACTION), late)
    total = need + rc.CONTEXT_BYTES + margin
    return -(-total // rc.STEP_BYTES) * rc.STEP_BYTES, need


def profiled(name, out, port, sockdir):
    env = dict(os.environ, **rn.CONFIGS[name])
    sock = os.path.join(sockdir, name + ".sock")
    report_path = os.path.join(out, name + ".report.json")
    with open(os.path.join(out, name + ".sidecar.log"), "w") as log:
        sc = subprocess.Popen([os.environ["SIDECAR"], "--standalone", "--backend", "nvml", "--interval", "1s",
                               "--listen", "127.0.0.1:%d" % port, "--agent-socket", sock,
                               "--output", report_path], stdout=subprocess.DEVNULL, stderr=log)
    try:
        time.sleep(2)
        agent_env = dict(env, PYTHONPATH=os.path.join(ROOT, "agent/python/bootstrap") + ":" +
                         os.path.join(ROOT, "agent/python"), MEMPROF_AGENT_SOCKET=sock)
        p = subprocess.run([sys.executable, __file__, "--child"], env=agent_env, capture_output=True,
                           text=True, timeout=180)
        measured = json.loads((p.stdout.strip().splitlines() or ["{}"])[-1]) if p.returncode == 0 else {
            "error": p.stderr[-500:]}
    finally:
        sc.send_signal(signal.SIGTERM)
        sc.wait(timeout=30)
    with open(report_path) as f:
        return env, measured, json.load(f)


def one(name, out, port, sockdir):
    env, measured, report = profiled(name, out, port, sockdir)
    request, need = request_of_report(report)
    total = max(g["totalBytes"] for g in report["gpus"])
    at = (request - rc.CONTEXT_BYTES) / total
    below = (0.9 * request - rc.CONTEXT_BYTES) / total
    return {"name": name, "env": rn.CONFIGS[name], "torchPeaks": measured, "requestBytes": request,
            "needBytes": need, "at": rc.spawn(env, "capped", at)["exit"],
            "below": rc.spawn(env, "capped", below)["exit"]}


def main():
    out, workers, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    os.makedirs(out, exist_ok=True)
    sockdir = tempfile.mkdtemp(prefix="memprof-through.")
    rows, lock = [], threading.Lock()

    def run(i_name):
        i, n = i_name
        try:
            r = one(n, out, 9600 + i, sockdir)
        except Exception as e:  # one configuration's failure is a row, not the end
            r = {"name": n, "error": repr(e)[:500]}
        with lock:
            rows.append(r)
            with open(os.path.join(out, "through.json"), "w") as f:
                json.dump({"contextBytes": rc.CONTEXT_BYTES, "rows": rows}, f, indent=1)
            v = lambda c: {0: "ok", 3: "OOM"}.get(c, "exit %s" % c)
            print(n, r.get("error") or "need %d MiB request %d MiB: %s / %s" % (
                r["needBytes"] >> 20, r["requestBytes"] >> 20, v(r["at"]), v(r["below"])), flush=True)

    try:
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(run, enumerate(names)))
    finally:
        for f in os.listdir(sockdir):
            os.unlink(os.path.join(sockdir, f))
        os.rmdir(sockdir)


if __name__ == "__main__":
    if sys.argv[1] == "--child":
        child()
    else:
        main()
