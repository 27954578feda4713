#!/usr/bin/env python3
"""The chart's alerts against what they are for, with `promtool test rules`.

    pip install -r tests/requirements.txt; apt-get install prometheus (promtool)
    python3 tests/alert_rules.py

The property: every alert that pages fires well before the moment it warns
about (at least 60 s before a predicted OOM that arrives on time) and does
not page on a one-scrape blip; a recovery resolves it. The rules are the
chart's PrometheusRule as Helm renders it (helm-python-sdk), the scrape and
evaluation intervals the ones the chart's ServiceMonitor, PodMonitor and
rule group set. The series are played through the sidecar's write budget
and the operator's roll-up (tests/alerts/sim.py) and sampled at those
intervals, labelled as Prometheus stores them. The test groups
(tests/alerts/scenarios.py) are written to a temporary directory and run
by promtool:

- leaks whose OOM comes on time (the issue's fast leak, first predicted
  158 s ahead; a slow one; one already at 91 %), at every phase of the
  scrapes: both OOM alerts fire with the lead docs/observability.md states,
  and not before there is anything to warn about;
- blips: one scrape at critical risk, 30 s to OOM and an OOM record pages
  nothing, the same on two scrapes fires each alert;
- a recovery after both fired resolves them; an OOM record pages for 15
  minutes; the warnings (remediation failed, task failing, report writes
  failing) fire on what they name and not on a new leader or one failure;
- the leads are also measured (promtool's result of a probe), printed, and
  must equal the stated ones to within 5 s; the NOTES warning for intervals
  that break the 60 s lead is right;
- every query of the Grafana dashboard and every PromQL example of
  docs/observability.md parses (promtool check rules), and the examples
  that join with dcgm-exporter give the right rows with MIG rows present.

MEMPROF_ALERT_RULES=FILE tests that rule file instead of the chart's (to
see an older chart's rules fail); PROMTOOL=PATH picks promtool. Prints one
line per check and `N passed, N failed`; exits non-zero on any failure.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent / "alerts"))
import docs_queries  # noqa: E402
import scenarios as sc  # noqa: E402

try:
    import helm_python
except ImportError:  # pragma: no cover - the message is the point
    print("helm-python-sdk is missing: pip install -r tests/requirements.txt")
    print("0 passed, 1 failed")
    sys.exit(1)

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "memprof"
DOC = ROOT / "docs" / "observability.md"
VALUES = {
    "image": {"repository": "registry.example.com/memprof/memprof"},
    "monitoring": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True},
                   "prometheusRule": {"enabled": True}},
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


def render(values: dict) -> dict[str, str]:
    return helm_python.Chart.load(str(CHART)).render(values, name="memprof", namespace="memprof-system")


def objects(out: dict[str, str]) -> list[dict]:
    return [d for path, text in sorted(out.items()) if not path.endswith("NOTES.txt")
            for d in yaml.safe_load_all(text) if d]


def seconds(duration: str) -> float:
    n, unit = re.fullmatch(r"([0-9.]+)(ms|s|m|h)", duration).groups()
    return float(n) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]


def intervals(docs: list[dict]) -> sc.Intervals:
    by_kind = {d["kind"]: d for d in docs}
    rule = by_kind["PrometheusRule"]["spec"]["groups"][0]
    predicted = next(r for r in rule["rules"] if r["alert"] == "MemprofOOMPredicted")
    return sc.Intervals(
        scrape=seconds(by_kind["ServiceMonitor"]["spec"]["endpoints"][0]["interval"]),
        pod_scrape=seconds(by_kind["PodMonitor"]["spec"]["podMetricsEndpoints"][0]["interval"]),
        evaluation=seconds(rule["interval"]),
        horizon=float(re.search(r"\) <= (\d+)", predicted["expr"]).group(1)),
    )


def write_rules(docs: list[dict], tmp: Path, name: str = "rules.yaml") -> Path:
    """The PrometheusRule's groups as a Prometheus rule file (or MEMPROF_ALERT_RULES)."""
    path = tmp / name
    if os.environ.get("MEMPROF_ALERT_RULES"):
        shutil.copy(os.environ["MEMPROF_ALERT_RULES"], path)
        print(f"note: testing {os.environ['MEMPROF_ALERT_RULES']} instead of the chart's rules")
    else:
        rule = next(d for d in docs if d["kind"] == "PrometheusRule")
        path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))
    return path


def promtool() -> str | None:
    return os.environ.get("PROMTOOL") or shutil.which("promtool")


def run_tests(tool: str, tmp: Path, name: str, groups: list[dict], rules: str = "rules.yaml") -> tuple[bool, str]:
    """Runs the test groups against `rules` with promtool; (all passed, promtool's output).

    promtool evaluates a file's groups one after another on one core, and the
    leak groups simulate up to an hour at 1 s each: the groups are dealt into
    one file per core and the files run side by side (the groups are
    independent, so the verdict and the report's lines are the same)."""
    n = max(1, min(len(groups), os.cpu_count() or 1))
    chunks = [groups[i::n] for i in range(n)]

    def run(i: int, chunk: list[dict]) -> tuple[bool, str]:
        path = tmp / f"{name}-{i}.yaml"
        path.write_text(yaml.safe_dump({"rule_files": [rules], "evaluation_interval": "1s", "tests": chunk},
                                       sort_keys=False, width=100000))
        res = subprocess.run([tool, "test", "rules", path.name], cwd=tmp, capture_output=True, text=True, timeout=600)
        return res.returncode == 0, res.stdout + res.stderr

    with ThreadPoolExecutor(len(chunks)) as pool:
        results = list(pool.map(run, range(len(chunks)), chunks))
    return all(ok for ok, _ in results), "".join(out for _, out in results)


def measure(tool: str, tmp: Path, name: str, groups: list[dict], probes: list[list[tuple[str, str, float]]],
            rules: str = "rules.yaml") -> dict:
    """Values of PromQL expressions at the end of each group, read from
    promtool's report: each probe expects -1, so promtool prints what it got."""
    for g, group_probes in zip(groups, probes):
        g["promql_expr_test"] = [
            {"expr": f'label_replace(vector(scalar({expr})), "probe", "{pid}", "", "")', "eval_time": f"{int(at)}s",
             "exp_samples": [{"labels": "{}", "value": -1}]} for pid, expr, at in group_probes]
    _, out = run_tests(tool, tmp, name, groups, rules)
    got = {m.group(1): float(m.group(2)) for m in re.finditer(r'got: \{probe="([^"]+)"\} (\S+)', out)}
    want = {pid for gp in probes for pid, _, _ in gp}
    if set(got) != want:
        check(f"measured {name} from promtool's report", False, out[-2000:])
    return got


def phases(iv: sc.Intervals, leak: sc.Leak | None = None) -> list[int]:
    """Phases of the OOM against the operator's scrapes: every whole second
    of an interval, or `leak.phases` of them spread over it (the long leaks)."""
    n = int(iv.scrape)
    if leak is None or leak.phases is None:
        return list(range(n))
    return sorted({round(i * (n - 1) / max(1, leak.phases - 1)) for i in range(leak.phases)})


def check_leads(tool: str, tmp: Path, iv: sc.Intervals, case: str, leaks: list[sc.Leak],
                rules: str = "rules.yaml") -> dict[str, float]:
    """The OOM alerts' lead on leaks that come on time; returns the worst
    measured lead per (leak, alert), with a real evaluation every E."""
    groups = [sc.leak_group(leak, ph, iv) for leak in leaks for ph in phases(iv, leak)]
    ok, out = run_tests(tool, tmp, f"leaks-{case}", groups, rules)
    check(f"{case}: OOM alerts fire with the stated lead at every scrape phase, and not before (promtool)", ok, out[-3000:])
    probes, rows = [], []
    for i, leak in enumerate(leaks):
        for ph in phases(iv, leak):
            t_oom, end = leak.t_oom + ph, leak.t_oom + ph + 30
            gp = [(f"{i}/{ph}/{a}", sc.first_fire(a, end), end) for a in ("MemprofOOMRiskCritical", "MemprofOOMPredicted")]
            probes.append(gp)
            rows.append((leak, t_oom, gp))
    got = measure(tool, tmp, f"leads-{case}", [sc.leak_group(leak, ph, iv) for leak in leaks for ph in phases(iv, leak)],
                  probes, rules)
    worst: dict[str, float] = {}
    for leak, t_oom, gp in rows:
        for pid, _, _ in gp:
            key = f"{leak.name}: {pid.rsplit('/', 1)[1]}"
            lead = t_oom - got.get(pid, float("nan")) - iv.evaluation
            worst[key] = min(worst.get(key, lead), lead)
    for key, lead in worst.items():
        print(f"note: {case}: {key}: fires at worst {lead:.0f} s before the OOM (evaluation every {iv.evaluation:g} s)")
    return worst


def check_defaults(tool: str, tmp: Path, iv: sc.Intervals) -> dict[str, float]:
    check("the chart's intervals give MemprofOOMRiskCritical a lead of at least 60 s",
          sc.critical_lead(iv) >= 60, f"{sc.critical_lead(iv)} s with {iv}")
    worst = check_leads(tool, tmp, iv, "defaults", sc.LEAKS)
    fast = sc.LEAKS[0]
    for alert, claim in (("MemprofOOMRiskCritical", sc.critical_lead(iv)),
                         ("MemprofOOMPredicted", sc.predicted_lead(iv, fast.first_prediction))):
        measured = worst[f"{fast.name}: {alert}"]
        check(f"{alert}: the stated worst-case lead ({claim:.0f} s) is the measured one (within 5 s)",
              claim <= measured <= claim + 5, f"measured {measured:.0f} s")
        check(f"{alert}: at least 60 s before the issue's OOM", measured >= 60, f"{measured:.0f} s")
    return worst


def check_scenarios(tool: str, tmp: Path, iv: sc.Intervals) -> None:
    cases = [
        ("blips: one scrape of critical risk, 30 s to OOM and an OOM pages nothing; two scrapes fire each alert",
         sc.blip_groups(iv)),
        (f"recovery: both OOM alerts resolve within {sc.resolve_within(iv):.0f} s",
         [sc.recovery_group(ph, iv) for ph in phases(iv)]),
        (f"MemprofGPUOOMObserved fires within {sc.observed_within(iv):.0f} s of the record, for 15 minutes",
         [sc.oom_observed_group(ph, iv) for ph in (0, int(iv.scrape) // 2, int(iv.scrape) - 1)]),
        ("MemprofRemediationFailed: a failure fires it for 15 minutes, a new leader does not",
         [sc.remediation_group(iv)]),
        ("MemprofOperatorTaskFailing: two ends in 15 minutes fire it, the first counted; one does not",
         [sc.task_group(iv)]),
        ("MemprofReportWritesFailing: failing since start or for 10 minutes fires it, one failure does not",
         [sc.writes_group(iv)]),
        ("MemprofOOMRiskCritical's labels and annotations", [annotations_group(iv)]),
        ("scraped every 2 x monitoring.serviceMonitor.interval, the OOM alerts cannot fire: "
         "MemprofOperatorScrapedTooRarely says so", [sc.scraped_too_rarely_group(iv)]),
    ]
    for i, (name, groups) in enumerate(cases):
        ok, out = run_tests(tool, tmp, f"case{i}", groups)
        check(name, ok, out[-3000:])


def annotations_group(iv: sc.Intervals) -> dict:
    """The rendered annotations, exactly, on the issue's fast leak."""
    leak = sc.LEAKS[0]
    g = sc.leak_group(leak, 0, iv)
    g["promql_expr_test"] = []
    base = "https://github.com/memprof/memprof/blob/main/docs/observability.md"
    g["alert_rule_test"] = [{"eval_time": f"{int(leak.t_oom - 30)}s", "alertname": "MemprofOOMRiskCritical", "exp_alerts": [{
        "exp_labels": {"severity": "critical", "namespace": "team-a", "job_name": "train"},
        "exp_annotations": {
            "summary": "GPU OOM risk critical for Job team-a/train",
            "description": "A rank of Job team-a/train is at its GPU's memory ceiling or about criticalTtoSeconds "
                           "(2 minutes by default) from an OOM (risk critical).",
            "runbook_url": f"{base}#memprofoomriskcritical"}}]}]
    return g


def check_notes_warning(tool: str, tmp: Path) -> None:
    """With the operator scraped every 30 s the critical lead falls under
    60 s: the NOTES say so, with the number, and the number is right."""
    values = {**VALUES, "monitoring": {**VALUES["monitoring"], "serviceMonitor": {"enabled": True, "interval": "30s"}}}
    out = render(values)
    iv = intervals(objects(out))
    write_rules(objects(out), tmp, "rules-30s.yaml")
    notes = next(v for k, v in out.items() if k.endswith("NOTES.txt"))
    claim = sc.critical_lead(iv)
    check(f"NOTES warn when the intervals leave the critical page under 60 s ({claim:g} s)",
          "WARNING" in notes and f"only\n{claim:g} s before" in notes, notes[-600:])
    default_notes = next(v for k, v in render(VALUES).items() if k.endswith("NOTES.txt"))
    check("NOTES do not warn with the default intervals", "WARNING" not in default_notes)
    worst = check_leads(tool, tmp, iv, "scraped every 30s", sc.LEAKS[:1], "rules-30s.yaml")
    measured = worst[f"{sc.LEAKS[0].name}: MemprofOOMRiskCritical"]
    check("... and the warning's number is the measured worst case (within 5 s)", claim <= measured <= claim + 5 and measured < 60,
          f"measured {measured:.0f} s")


def check_docs(iv: sc.Intervals) -> None:
    """docs/observability.md states the numbers this test pins."""
    text = DOC.read_text()
    m = re.search(r"^### What the alerts guarantee\n(.*?)(?=^#)", text, re.S | re.M)
    section = m.group(1) if m else ""
    numbers = {
        "critical lead": sc.critical_lead(iv),
        "predicted lead on the issue's leak": sc.predicted_lead(iv, sc.LEAKS[0].first_prediction),
        "resolution": sc.resolve_within(iv),
        "OOM observed delay": sc.observed_within(iv),
    }
    missing = {k: f"{v:.0f} s" for k, v in numbers.items() if f"{v:.0f} s" not in section}
    check("docs/observability.md, \"What the alerts guarantee\", states the tested numbers", bool(section) and not missing,
          str(missing))


def check_queries(tool: str, tmp: Path, iv: sc.Intervals) -> None:
    dash = docs_queries.dashboard_queries(CHART / "dashboards" / "memprof.json")
    examples = docs_queries.doc_examples(DOC.read_text())
    exprs = dash + [(f"docs example {i}", e) for i, e in enumerate(examples)]
    path = tmp / "queries.yaml"
    path.write_text(yaml.safe_dump(docs_queries.recording_rules(exprs), sort_keys=False))
    res = subprocess.run([tool, "check", "rules", str(path)], capture_output=True, text=True, timeout=120)
    check(f"the dashboard's {len(dash)} queries and the docs' {len(examples)} PromQL examples parse (promtool check rules)",
          res.returncode == 0 and len(dash) >= 10 and len(examples) >= 3, (res.stdout + res.stderr)[-2000:])
    joins = [e for e in examples if "DCGM_" in e]
    ok, out = run_tests(tool, tmp, "mig", [docs_queries.mig_group(examples, iv.scrape)])
    check(f"the docs' {len(joins)} joins with dcgm-exporter give one row per whole GPU, none for MIG instances",
          ok and len(joins) >= 2, out[-2000:])


def main() -> int:
    tool = promtool()
    if not tool:
        check("promtool installed (Debian: apt-get install prometheus; hack/test.sh fetches it)", False)
        print(f"{passed} passed, {failed} failed")
        return 1
    version = subprocess.run([tool, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    print(f"note: {tool}: {' '.join(version)}")
    docs = objects(render(VALUES))
    iv = intervals(docs)
    print(f"note: chart defaults: operator scraped every {iv.scrape:g} s, sidecars every {iv.pod_scrape:g} s, "
          f"rules evaluated every {iv.evaluation:g} s, OOM horizon {iv.horizon:g} s")
    with tempfile.TemporaryDirectory(prefix="memprof-alerts-") as d:
        tmp = Path(d)
        write_rules(docs, tmp)
        res = subprocess.run([tool, "check", "rules", "rules.yaml"], cwd=tmp, capture_output=True, text=True)
        check("the rendered rules pass promtool check rules", res.returncode == 0, res.stdout + res.stderr)
        check_defaults(tool, tmp, iv)
        check_scenarios(tool, tmp, iv)
        check_notes_warning(tool, tmp)
        check_queries(tool, tmp, iv)
    check_docs(iv)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
