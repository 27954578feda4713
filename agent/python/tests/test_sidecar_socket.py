"""Contracts A and B end to end: the agent and a real memprof-sidecar over
the sidecar's Unix socket (docs/agent-wire.md "Transport", "The answer"). The
sidecar's own verdict, from its own analysis, reaches the trainer's
callbacks; its TCP port takes no push."""

import json
import logging
import threading

from conftest import Sidecar, memprof_agent, wait_until

LEAK = "totalGiB: 80\ndefault: { baseGiB: 10, amplitudeGiB: 0, noiseGiB: 0, leakMiBPerSecond: 600 }\n"


def leaking_sidecar(workdir):
    """A sidecar over a simulated GPU leaking 600 MiB/s at 20x: the OOM is
    about 6 s of wall time away, so its analysis reaches high within seconds."""
    scenario = workdir / "leak.yaml"
    scenario.write_text(LEAK)
    return Sidecar(workdir, extra_args=["--backend", "sim", "--scenario", str(scenario), "--speed", "20"])


def test_the_real_sidecars_verdict_reaches_the_trainer_over_the_socket(fake, workdir):
    s = leaking_sidecar(workdir)
    try:
        seen = []
        memprof_agent.on_risk("high", lambda e: seen.append((e.level, threading.current_thread().name)))
        assert memprof_agent.start(interval=0.05, socket=s.socket)
        assert wait_until(lambda: memprof_agent.risk() is not None, timeout=10), s.log_path.read_text()[-2000:]
        v = memprof_agent.risk()
        assert v["source"] == "sim" and v["at"] > 1.7e9, v
        # The sidecar's analysis sees the leak; its answers carry it.
        assert wait_until(lambda: memprof_agent.risk()["risk"] in ("high", "critical"), timeout=20), (
            memprof_agent.risk(), s.report())
        v = memprof_agent.risk()
        assert v["ttoSeconds"] is not None and v["ttoSeconds"] >= 0, v
        # The callback runs at the trainer's safe point, on its thread.
        memprof_agent.step(1)
        assert seen and seen[0][1] == threading.current_thread().name, seen
        assert s.agent_pushes() > 0
    finally:
        memprof_agent.stop()
        s.stop()


def test_the_sidecars_tcp_port_takes_no_push(fake, sidecar, caplog):
    """An agent pointed at the sidecar's TCP port (an old MEMPROF_AGENT_URL,
    or anything relayed to it) is refused: nothing reaches the analysis."""
    caplog.set_level(logging.WARNING, logger="memprof_agent")
    url = "http://127.0.0.1:%d/v1/agent" % sidecar.port
    assert memprof_agent.start(interval=0.02, url=url)
    t = memprof_agent._agent.transport
    assert wait_until(lambda: t.attempts >= 3)
    assert t.sent == 0 and memprof_agent.risk() is None
    refused = [r.getMessage() for r in caplog.records if "refused a push" in r.getMessage()]
    assert refused and "HTTP 404" in refused[0] and "MEMPROF_AGENT_SOCKET" in refused[0], refused
    assert sidecar.agent_pushes() == 0
    report = json.loads(sidecar.socket_get("/v1/report") or "null") or {}
    assert report.get("allocator") is None, report


def test_the_report_is_served_only_on_the_socket(sidecar):
    import urllib.error
    import urllib.request

    assert json.loads(sidecar.socket_get("/v1/report"))["podName"]
    try:
        urllib.request.urlopen("http://127.0.0.1:%d/v1/report" % sidecar.port, timeout=5)
        raise AssertionError("GET /v1/report answered on TCP")
    except urllib.error.HTTPError as e:
        assert e.code == 404
