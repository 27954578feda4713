#!/usr/bin/env python3
"""The chart's monitoring objects against what memprof really exports.

    pip install -r tests/requirements.txt
    python3 tests/observability.py

- the dashboard JSON and the rendered PrometheusRule parse;
- EVERY metric name in every dashboard query and alert expression exists
  in the registries of the real binaries (`memprof-operator --print-metrics`,
  `memprof-sidecar --print-metrics`: the families they register, so
  counters' `_total` and histograms' `_bucket`/`_sum`/`_count` are derived
  from each family's type, never from a hand list); a bogus name is caught;
- the operator's memprof_job_* gauges are labelled `namespace` and
  `job_name` (the `# LABELS` lines of its `--print-metrics`), and no
  dashboard query, legend, variable, alert (expression or annotation) or
  example in docs/observability.md that names memprof_job_* groups,
  filters or prints a bare `job` label: that is Prometheus's scrape job,
  which a `job` label from the operator would replace under honorLabels;
- each alert has a summary, a description and a runbook_url whose anchor
  is a heading of docs/observability.md;
- the metrics list of docs/observability.md is the registries' list;
- the PodMonitor, PrometheusRule and dashboard ConfigMap render only when
  enabled; the PodMonitor selects the label the webhook puts on injected
  pods and scrapes the port the webhook names;
- `additionalProperties: false` rejects an unknown key, through Helm's own
  schema validation (helm-python-sdk);
- logFormat, thresholds and securityContext values reach the operator's
  flags, and the sidecar logs JSON lines with `MEMPROF_LOG_JSON=true`.

Prints one line per check and `N passed, N failed`; exits non-zero on any failure.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

try:
    import helm_python
except ImportError:  # pragma: no cover - the message is the point
    print("helm-python-sdk is missing: pip install -r tests/requirements.txt")
    print("0 passed, 1 failed")
    sys.exit(1)

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "memprof"
DASHBOARD = CHART / "dashboards" / "memprof.json"
DOC = ROOT / "docs" / "observability.md"
# The chart has no default image (none is published): every render names one.
BASE = {"image": {"repository": "registry.example.com/memprof/memprof"}}
ALL_ON = {
    "monitoring": {
        "serviceMonitor": {"enabled": True},
        "podMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True},
        "dashboard": {"enabled": True},
    },
}

passed = failed = 0


def check(name: str, ok: bool, detail: str = "") -> bool:
    global passed, failed
    if ok:
        passed += 1
        print(f"PASS {name}")
    else:
        failed += 1
        print(f"FAIL {name}{': ' + detail if detail else ''}")
    return ok


def render(values: dict) -> list[dict]:
    out = helm_python.Chart.load(str(CHART)).render({**BASE, **values}, name="memprof", namespace="memprof-system")
    docs = []
    for path, text in sorted(out.items()):
        if not path.endswith("NOTES.txt"):
            docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def kinds(docs: list[dict]) -> set[str]:
    return {d["kind"] for d in docs}


def binary(name: str) -> str:
    """The debug build of `name` (built here if missing; MEMPROF_<NAME>_BIN overrides)."""
    env = "MEMPROF_" + name.replace("memprof-", "").upper() + "_BIN"
    path = os.environ.get(env, str(ROOT / "target" / "debug" / name))
    if not Path(path).exists():
        subprocess.run(["cargo", "build", "--quiet", "--workspace", "--bin", name], cwd=ROOT, check=True)
    return path


def families(text: str) -> dict[str, str]:
    """`# TYPE name type` lines of an exposition: family -> type."""
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))


def labels_of(text: str) -> dict[str, list[str]]:
    """`# LABELS name a,b` lines of `memprof-operator --print-metrics`: family -> label names."""
    return {m.group(1): m.group(2).split(",") for m in re.finditer(r"^# LABELS (\S+) (\S+)$", text, re.M)}


def bare_job_uses(text: str) -> list[str]:
    """Where a PromQL expression, Grafana query/legend or alert template uses
    a label called exactly `job` (not `job_name`, not the variable `$job`)."""
    uses = []
    for m in re.finditer(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", text):
        if "job" in [l.strip() for l in m.group(2).split(",")]:
            uses.append(m.group(0))
    uses += [m.group(0) for m in re.finditer(r"(?<![\w$.])job\s*(?:=~|!~|!=|=)", text)]
    uses += [m.group(0) for m in re.finditer(r"label_values\([^)]*,\s*job\s*\)", text)]
    uses += [m.group(0) for m in re.finditer(r"\{\{\s*job\s*\}\}|\$labels\.job\b", text)]
    return uses


def series_names(fams: dict[str, str]) -> set[str]:
    """Sample names a scrape of these families can show."""
    out = set()
    for name, kind in fams.items():
        if kind == "counter":
            out.add(name + "_total")
        elif kind == "histogram":
            out |= {name + "_bucket", name + "_sum", name + "_count"}
        elif kind == "summary":
            out |= {name, name + "_sum", name + "_count"}
        else:
            out.add(name)
    return out


PROMQL_WORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool",
    "and", "or", "unless", "offset", "inf", "nan", "le",
}


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression (or a Grafana label_values() query):
    identifiers that are not functions, keywords, label names in matchers or
    grouping clauses, strings, or durations."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    e = re.sub(r"\{[^}]*\}", "", e)  # label matchers
    e = re.sub(r"\[[^\]]*\]", "", e)  # ranges and subqueries
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    e = re.sub(r"\$\w+", " ", e)  # Grafana variables
    names = set()
    for m in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", e):
        word, call = m.group(1), m.group(2)
        if call or word in PROMQL_WORDS:
            continue
        names.add(word)
    # label_values(metric, label): the second argument is a label.
    for m in re.finditer(r"label_values\(\s*([a-zA-Z_:][\w:]*)?[^,)]*,\s*(\w+)\s*\)", expr):
        names.discard(m.group(2))
    return names


# Labels Prometheus puts on the sidecars' series from the PodMonitor's
# target (namespace, pod, container) and its relabelings (job_name, node).
SIDECAR_TARGET_LABELS = {"namespace", "pod", "container", "job_name", "node", "instance"}


def foreign_labels(expr: str, op: dict[str, str], op_labels: dict[str, list[str]], sc: dict[str, str]) -> list[str]:
    """Labels of by/on clauses that no series of `expr` carries: an operator
    family's are its `# LABELS`, a sidecar family's the target's (the
    sidecar's own labels are not listed by its --print-metrics)."""
    names = metric_names(expr)
    base = {n: re.sub(r"_(total|bucket|sum|count)$", "", n) for n in names}
    carried: set[str] = set()
    for n, fam in base.items():
        if fam in op:
            carried |= set(op_labels.get(fam, []))
        elif fam in sc:
            carried |= SIDECAR_TARGET_LABELS
    used = {l.strip() for m in re.finditer(r"\b(?:by|on)\s*\(([^)]*)\)", expr) for l in m.group(1).split(",") if l.strip()}
    return [f"{l} not on {', '.join(sorted(names))}" for l in sorted(used - carried)]


def dashboard_queries(dash: dict) -> list[tuple[str, str]]:
    out = []
    for p in dash.get("panels", []):
        for t in p.get("targets", []):
            out.append((f"panel {p.get('title')!r}", t["expr"]))
    for v in dash.get("templating", {}).get("list", []):
        q = v.get("query")
        if isinstance(q, dict):
            q = q.get("query")
        if v.get("type") == "query" and q:
            out.append((f"variable {v['name']}", q))
    return out


def unknown_names(queries: list[tuple[str, str]], exported: set[str]) -> list[str]:
    bad = []
    for where, expr in queries:
        names = metric_names(expr)
        if not names:
            bad.append(f"{where}: no metric in {expr!r}")
        bad += [f"{where}: {n}" for n in sorted(names - exported)]
    return bad


def doc_anchors(text: str) -> set[str]:
    """GitHub-style anchors of the markdown headings."""
    out = set()
    for h in re.findall(r"^#+\s+(.+)$", text, re.M):
        a = re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
        out.add(a)
    return out


def main() -> int:
    # 1. The registries of the real binaries.
    op = families(subprocess.run([binary("memprof-operator"), "--print-metrics"], capture_output=True, text=True, check=True).stdout)
    op_labels = labels_of(subprocess.run([binary("memprof-operator"), "--print-metrics"], capture_output=True, text=True, check=True).stdout)
    sc = families(subprocess.run([binary("memprof-sidecar"), "--print-metrics"], capture_output=True, text=True, check=True).stdout)
    check("operator registry lists memprof_job_* gauges", {"memprof_job_risk_level", "memprof_job_time_to_oom_seconds"} <= set(op), str(sorted(op)))
    job_fams = sorted(f for f in op if f.startswith("memprof_job_"))
    wrong = {f: op_labels.get(f) for f in job_fams if op_labels.get(f) != ["namespace", "job_name"]}
    check("every memprof_job_* gauge is labelled namespace,job_name (never job)", bool(job_fams) and not wrong, str(wrong))
    check("sidecar registry lists per-GPU gauges", {"memprof_gpu_used_bytes", "memprof_gpu_total_bytes"} <= set(sc), str(sorted(sc)))
    exported = series_names(op) | series_names(sc)
    check("counters are exported with _total, histograms with _bucket",
          "memprof_reconciles_total" in exported and "memprof_reconcile_duration_seconds_bucket" in exported
          and "memprof_reconciles" not in exported)

    # 2. The dashboard.
    try:
        dash = json.loads(DASHBOARD.read_text())
        check("dashboard JSON parses", True)
    except ValueError as e:
        check("dashboard JSON parses", False, str(e))
        dash = {}
    queries = dashboard_queries(dash)
    check("dashboard has queries", len(queries) >= 10, str(len(queries)))
    bad = unknown_names(queries, exported)
    check("every dashboard metric exists in the registries", not bad, "; ".join(bad))
    bogus = unknown_names([("bogus", 'sum(rate(memprof_gpu_used_bytez{job=~"$job"}[5m])) by (job)')], exported)
    check("a dashboard naming a metric that does not exist is caught", bogus == ["bogus: memprof_gpu_used_bytez"], str(bogus))
    job_queries = [(where, expr) for where, expr in queries if "memprof_job_" in expr]
    legends = [(f"panel {p.get('title')!r} legend", t.get("legendFormat", "")) for p in dash.get("panels", [])
               for t in p.get("targets", []) if "memprof_job_" in t.get("expr", "")]
    bad = [f"{where}: {u}" for where, text in job_queries + legends for u in bare_job_uses(text)]
    check("no dashboard query, variable or legend of memprof_job_* uses a bare job label",
          len(job_queries) >= 5 and not bad, "; ".join(bad))
    old = bare_job_uses('max by (namespace, job) (memprof_job_risk_level{namespace=~"$namespace", job=~"$job"}) '
                        'label_values(memprof_job_risk_level, job) {{namespace}}/{{job}} {{ $labels.job }}')
    check("a bare job label is caught (by, matcher, label_values, legend, alert template)", len(old) == 5, str(old))
    check("job_name and $job are not taken for a bare job label",
          not bare_job_uses('max by (namespace, job_name) (x{job_name=~"$job"}) {{job_name}} {{ $labels.job_name }}'))
    dcgm = unknown_names([("dcgm", "memprof_gpu_used_bytes * on(UUID) group_left(modelName) DCGM_FI_DEV_FB_USED")], exported)
    check("a metric of another exporter is caught too", dcgm == ["dcgm: DCGM_FI_DEV_FB_USED"], str(dcgm))

    # 3. Rendering: only when enabled.
    off = render({})
    check("off by default: no PodMonitor, PrometheusRule, dashboard ConfigMap",
          not ({"PodMonitor", "PrometheusRule"} & kinds(off))
          and not any(d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard") for d in off))
    on = render(ALL_ON)
    for kind in ("PodMonitor", "PrometheusRule", "ServiceMonitor"):
        check(f"{kind} renders when enabled", kind in kinds(on))
    for key, kind in (("podMonitor", "PodMonitor"), ("prometheusRule", "PrometheusRule")):
        only = render({"monitoring": {key: {"enabled": True}}})
        check(f"monitoring.{key}.enabled alone renders {kind} only", kind in kinds(only)
              and not ({"PodMonitor", "PrometheusRule"} - {kind}) & kinds(only))
    cms = [d for d in on if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")]
    if check("dashboard ConfigMap renders when enabled", len(cms) == 1):
        cm = cms[0]
        check("dashboard ConfigMap labelled for the Grafana sidecar", cm["metadata"]["labels"].get("grafana_dashboard") == "1")
        check("dashboard ConfigMap carries the dashboard", json.loads(cm["data"]["memprof.json"]) == dash)
        # Helm merges maps with the defaults: null drops the default label.
        relabelled = render({"monitoring": {"dashboard": {"enabled": True, "labels": {"team": "ml", "grafana_dashboard": None}}}})
        cm = next(d for d in relabelled if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard"))
        check("dashboard label configurable", cm["metadata"]["labels"].get("team") == "ml" and "grafana_dashboard" not in cm["metadata"]["labels"], str(cm["metadata"]["labels"]))

    # 4. The PodMonitor matches what the webhook does.
    pm = next((d for d in on if d["kind"] == "PodMonitor"), None)
    webhook = (ROOT / "crates/webhook/src/lib.rs").read_text() + (ROOT / "crates/webhook/src/sidecar.rs").read_text()
    label = re.search(r'pub const LABEL_INJECTED: &str = "([^"]+)"', webhook)
    port = re.search(r'pub const PORT_NAME: &str = "([^"]+)"', webhook)
    if pm and label and port:
        check("PodMonitor selects the label the webhook puts on injected pods",
              pm["spec"]["selector"]["matchLabels"] == {label.group(1): "true"}, str(pm["spec"]["selector"]))
        check("PodMonitor scrapes the sidecar's named port",
              [e["port"] for e in pm["spec"]["podMetricsEndpoints"]] == [port.group(1)])
        # Any pod can carry the label: keep only what a sidecar exports, so a
        # pod cannot publish memprof_job_* (the paging alerts') for another Job.
        keep = [r for e in pm["spec"]["podMetricsEndpoints"] for r in e.get("metricRelabelings", [])
                if r.get("action") == "keep" and r.get("sourceLabels") == ["__name__"]]
        if check("PodMonitor keeps only the sidecar's metric names", len(keep) == 1, str(keep)):
            kept = re.compile(keep[0]["regex"])
            check("  every family the sidecar registers is kept", all(kept.fullmatch(f) for f in sc), str(sorted(sc)))
            check("  no family the operator registers is kept", not any(kept.fullmatch(f) for f in op),
                  str(sorted(f for f in op if kept.fullmatch(f))))
    else:
        check("PodMonitor, webhook label and port found", False, f"{bool(pm)} {label} {port}")
    sm = next((d for d in on if d["kind"] == "ServiceMonitor"), None)
    check("ServiceMonitor keeps the per-Job namespace label (honorLabels)",
          sm is not None and all(e.get("honorLabels") for e in sm["spec"]["endpoints"]))

    # 5. The alerts.
    rule = next((d for d in on if d["kind"] == "PrometheusRule"), None)
    rules = [r for g in (rule or {}).get("spec", {}).get("groups", []) for r in g["rules"]]
    check("PrometheusRule parses with alerts", len(rules) >= 4, str(len(rules)))
    names = {r["alert"] for r in rules}
    check("alerts: OOM predicted, GPU OOM observed, remediation failed, operator task failing",
          {"MemprofOOMPredicted", "MemprofGPUOOMObserved", "MemprofRemediationFailed", "MemprofOperatorTaskFailing"} <= names, str(names))
    bad = unknown_names([(f"alert {r['alert']}", r["expr"]) for r in rules], exported)
    check("every alert metric exists in the registries", not bad, "; ".join(bad))
    bad = [f"{r['alert']}: {b}" for r in rules for b in foreign_labels(r["expr"], op, op_labels, sc)]
    check("every label an alert groups or joins on is the series' own (--print-metrics' LABELS) or, "
          "for the sidecars', one the PodMonitor's target adds", not bad, "; ".join(bad))
    check("a grouping label the operator does not export is caught",
          foreign_labels("max by (namespace, job) (memprof_job_risk_level)", op, op_labels, sc)
          == ["job not on memprof_job_risk_level"])
    job_rules = [r for r in rules if "memprof_job_" in r["expr"]]
    bad = [f"{r['alert']}: {u}" for r in job_rules
           for u in bare_job_uses(r["expr"] + "\n" + "\n".join(r.get("annotations", {}).values()))]
    check("no alert on memprof_job_* groups by or prints a bare job label",
          len(job_rules) >= 4 and not bad, "; ".join(bad))
    doc = DOC.read_text() if DOC.exists() else ""
    anchors = doc_anchors(doc)
    examples = re.findall(r"```promql\n(.*?)```", doc, re.S) + re.findall(r"^\| Memprof\w+ \| `([^`]*)`", doc, re.M)
    bad = [u for e in examples if "memprof_job_" in e for u in bare_job_uses(e)]
    check("no example or alert in docs/observability.md uses a bare job label with memprof_job_*",
          any("memprof_job_" in e for e in examples) and not bad, "; ".join(bad))
    table = dict(re.findall(r"^\| (Memprof\w+) \| `([^`]*)`", doc, re.M))
    rendered = {r["alert"]: " ".join(r["expr"].split()).replace("( ", "(").replace(" )", ")") for r in rules}
    differ = {a: (e, table.get(a)) for a, e in rendered.items() if table.get(a) != e}
    check("the alert table of docs/observability.md shows every rendered expression, as rendered",
          not differ and set(table) == set(rendered), str(differ or set(table) ^ set(rendered)))
    for r in rules:
        a = r.get("annotations", {})
        url = a.get("runbook_url", "")
        ok = a.get("summary") and a.get("description") and url.startswith("https://github.com/memprof/memprof/blob/main/docs/observability.md#")
        check(f"{r['alert']}: summary, description, runbook_url", bool(ok), str(a))
        check(f"{r['alert']}: runbook anchor is a heading of docs/observability.md",
              url.split("#", 1)[-1] in anchors, url)
    fast = render({"monitoring": {"prometheusRule": {"enabled": True, "oomPredictedMinutes": 5}, "docsUrl": "https://docs.example.com/memprof/"}})
    rule = next(d for d in fast if d["kind"] == "PrometheusRule")
    predicted = next(r for g in rule["spec"]["groups"] for r in g["rules"] if r["alert"] == "MemprofOOMPredicted")
    check("OOM-predicted horizon configurable (minutes -> seconds)", "<= 300\n" in predicted["expr"], predicted["expr"])
    check("runbook_url follows monitoring.docsUrl",
          predicted["annotations"]["runbook_url"] == "https://docs.example.com/memprof/observability.md#memprofoompredicted",
          predicted["annotations"]["runbook_url"])

    # 6. docs/observability.md lists exactly the exported families.
    listed = set(re.findall(r"^\| `(memprof_[a-z0-9_]+)`", doc, re.M))
    every = set(op) | set(sc)
    check("docs/observability.md lists every exported metric family, and no other",
          listed == every, f"missing {sorted(every - listed)}, extra {sorted(listed - every)}")

    # 7. additionalProperties: false, through Helm's own schema validation.
    for bad_values in ({"monitoring": {"podMonitr": {"enabled": True}}}, {"operator": {"logFormt": "json"}},
                       {"unknownTopLevel": 1}, {"sidecar": {"image": {"registry": "x"}}},
                       {"thresholds": {"highTTOSeconds": 900}}, {"operator": {"logFormat": "yaml"}}):
        try:
            render(bad_values)
            check(f"schema rejects {bad_values}", False, "rendered")
        except helm_python.HelmValuesError:
            check(f"schema rejects {bad_values}", True)

    # 8. Log format, thresholds, security contexts reach the operator's flags.
    dep = next(d for d in render({"operator": {"logFormat": "json", "securityContext": {"runAsUser": 7, "readOnlyRootFilesystem": None}},
                                  "sidecar": {"logFormat": "json", "securityContext": {"runAsUser": 8}},
                                  "thresholds": {"highTtoSeconds": 900}}) if d["kind"] == "Deployment")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    args = c["args"]
    check("operator.logFormat json -> --log-json", "--log-json" in args, str(args))
    check("sidecar.logFormat json -> --sidecar-log-json=true", "--sidecar-log-json=true" in args)
    check("thresholds -> --default-thresholds JSON", '--default-thresholds={"highTtoSeconds":900}' in args, str(args))
    check("sidecar.securityContext -> --sidecar-security-context JSON", '--sidecar-security-context={"runAsUser":8}' in args)
    sc = c["securityContext"]
    check("operator.securityContext overridable (merged; null drops a key)",
          sc.get("runAsUser") == 7 and "readOnlyRootFilesystem" not in sc and sc.get("allowPrivilegeEscalation") is False, str(sc))
    help_text = subprocess.run([binary("memprof-operator"), "--help"], capture_output=True, text=True, check=True).stdout
    for flag in ("log-json", "sidecar-log-json", "default-thresholds", "sidecar-security-context"):
        check(f"memprof-operator accepts --{flag}", f"--{flag}" in help_text)
    plain = next(d for d in render({}) if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    check("defaults: text logs, built-in sidecar securityContext, no thresholds",
          "--log-json" not in plain and "--sidecar-security-context=" in plain and "--default-thresholds={}" in plain, str(plain))

    # 9. JSON logs: the sidecar honours MEMPROF_LOG_JSON, as the injection sets it.
    def sidecar_log(extra_env: dict) -> list[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MEMPROF_")}
        env.update(extra_env)
        run = subprocess.run([binary("memprof-sidecar"), "--standalone", "--backend", "sim", "--duration", "0.5",
                              "--listen", "127.0.0.1:0"], capture_output=True, text=True, timeout=60, env=env)
        return [l for l in run.stderr.splitlines() if l.strip()]

    def all_json(lines: list[str]) -> bool:
        try:
            return bool(lines) and all(isinstance(json.loads(l), dict) and "level" in json.loads(l) for l in lines)
        except ValueError:
            return False

    lines = sidecar_log({"MEMPROF_LOG_JSON": "true"})
    check("sidecar with MEMPROF_LOG_JSON=true logs JSON lines", all_json(lines), "\n".join(lines[:3]))
    lines = sidecar_log({})
    check("sidecar logs text by default", bool(lines) and not all_json(lines), "\n".join(lines[:3]))

    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
