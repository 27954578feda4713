"""Allocation sites end to end: the agent's snapshot at critical, pushed to
a real memprof-sidecar, lands in the pod's report (`allocationSites`:
innermost user frame, live bytes and blocks, largest first, at most 8)."""

from conftest import memprof_agent, wait_until
from test_checkpoint_history import GiB, sites_snapshot
from test_sidecar_socket import leaking_sidecar


def test_the_sites_snapshot_at_critical_reaches_the_real_sidecars_report(fake, workdir):
    sites_snapshot(fake)
    s = leaking_sidecar(workdir)
    try:
        assert memprof_agent.start(interval=0.05, socket=s.socket)
        # The sidecar's own analysis of the simulated leak reaches critical;
        # the agent turns recording on at high and snapshots at critical.
        got = wait_until(lambda: (s.report() or {}).get("allocationSites"), timeout=40)
        assert got, (memprof_agent.risk(), s.log_path.read_text()[-2000:])
        sites = s.report()["allocationSites"]
        assert sites["level"] == "critical" and sites["source"] == "history", sites
        top = sites["sites"][0]
        assert (top["file"], top["line"], top["function"]) == ("train.py", 88, "keep_val_loss"), sites
        assert (top["bytes"], top["blocks"]) == (40 * (64 << 20), 40), top
        assert sites["sites"][1]["line"] == 51 and sites["sites"][1]["bytes"] == 256 << 20
        assert len(sites["sites"]) == 8, "the report keeps the top 8 of the agent's 16"
        assert sites["unattributedBytes"] == 3 * GiB
    finally:
        memprof_agent.stop()
        s.stop()
