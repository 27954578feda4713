"""The PromQL that users copy: the Grafana dashboard's queries and the
examples of docs/observability.md, for promtool to parse and evaluate."""

from __future__ import annotations

import json
import re
from pathlib import Path

from scenarios import group, series

# Grafana's built-in range variables, as a query would see them.
RANGES = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h"}


def dashboard_queries(path: Path) -> list[tuple[str, str]]:
    """(where, expr) of every panel target and query variable, with Grafana
    variables replaced by what they could hold (a regex matching all, a range)."""
    dash = json.loads(path.read_text())
    out = [(f"panel {p.get('title')!r}", t["expr"]) for p in dash.get("panels", []) for t in p.get("targets", [])]
    for v in dash.get("templating", {}).get("list", []):
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        m = re.fullmatch(r"label_values\((.*),\s*\w+\)", q or "")
        if v.get("type") == "query" and m:
            out.append((f"variable {v['name']}", m.group(1)))
    return [(where, substitute(expr)) for where, expr in out]


def substitute(expr: str) -> str:
    for k, v in RANGES.items():
        expr = expr.replace(k, v)
    return re.sub(r"\$\{?\w+\}?", ".*", expr)


def doc_examples(text: str) -> list[str]:
    """The expressions of every ```promql block (blank lines separate them)."""
    blocks = re.findall(r"```promql\n(.*?)```", text, re.S)
    return [e.strip() for b in blocks for e in re.split(r"\n\s*\n", b) if e.strip()]


def recording_rules(exprs: list[tuple[str, str]]) -> dict:
    """A rule file with one recording rule per expression: `promtool check
    rules` then parses each as Prometheus would."""
    rules = [{"record": f"memprof_check:q{i}", "expr": e} for i, (_, e) in enumerate(exprs)]
    return {"groups": [{"name": "queries", "rules": rules}]}


# One node, two GPUs: GPU-aaa whole, GPU-bbb split into MIG instances 1 and 2
# (other tenants' pods). dcgm-exporter writes a MIG instance's rows with the
# parent's UUID and adds GPU_I_PROFILE and GPU_I_ID
# (internal/pkg/rendermetrics/render_metrics.go); the memprof sidecar samples
# whole GPUs by NVML index, so with NVIDIA_VISIBLE_DEVICES=all on a node
# whose one GPU is split, it can report GPU-bbb as a whole.
MODEL = "NVIDIA H100 80GB HBM3"


def mig_series(interval: float) -> list[dict]:
    dcgm = {"Hostname": "gpu-node-1", "modelName": MODEL, "namespace": "team-a", "container": "trainer",
            "job": "dcgm-exporter", "instance": "10.2.0.5:9400"}
    whole = {**dcgm, "gpu": "0", "UUID": "GPU-aaa", "device": "nvidia0", "pci_bus_id": "00000000:18:00.0", "pod": "train-0"}

    def mig(i: str, pod: str) -> dict:
        return {**dcgm, "gpu": "1", "UUID": "GPU-bbb", "device": "nvidia1", "pci_bus_id": "00000000:2A:00.0",
                "GPU_I_PROFILE": "3g.40gb", "GPU_I_ID": i, "pod": pod, "namespace": "team-b"}

    side = {"namespace": "team-a", "job_name": "train", "container": "memprof-sidecar", "endpoint": "memprof-metrics",
            "job": "memprof-system/memprof-sidecars", "node": "gpu-node-1", "modelName": MODEL}
    mp_a = {**side, "gpu": "0", "UUID": "GPU-aaa", "pod": "train-0-abcde", "instance": "10.1.0.10:9464"}
    mp_b = {**side, "gpu": "0", "UUID": "GPU-bbb", "pod": "train-1-fghij", "instance": "10.1.0.11:9464"}
    n = 8
    out = []
    for labels, util, fb_mib in ((whole, 90.0, 40960.0), (mig("1", "infer-a"), 50.0, 10240.0), (mig("2", "infer-b"), 60.0, 20480.0)):
        out += [series("DCGM_FI_DEV_GPU_UTIL", labels, [util] * n, interval),
                series("DCGM_FI_DEV_FB_USED", labels, [fb_mib] * n, interval)]
    for labels, used in ((mp_a, 42949672960.0), (mp_b, 64424509440.0)):
        out += [series("memprof_gpu_used_bytes", labels, [used] * n, interval),
                series("memprof_gpu_total_bytes", labels, [85899345920.0] * n, interval)]
    return out


def mig_group(examples: list[str], interval: float) -> dict:
    """Each example that joins with dcgm-exporter gives exactly one row, for
    the whole GPU, and no error: a MIG instance's rows are never attributed
    to the Job (nor do several of them make the join many-to-many)."""
    tests = [{"expr": f"count by (UUID) ({e})", "eval_time": f"{int(3 * interval)}s",
              "exp_samples": [{"labels": '{UUID="GPU-aaa"}', "value": 1}]} for e in examples if "DCGM_" in e]
    return group(mig_series(interval), tests)
