#!/usr/bin/env python3
"""What `helm install` and `helm upgrade` tell the user, and that it works.

    pip install -r tests/requirements.txt
    python3 tests/chart_install.py                # offline
    eval "$(bash hack/local-cluster.sh env)"; python3 tests/chart_install.py

- without image.repository rendering fails with a message saying what to
  set (no registry publishes the image; a default naming an unpublished one
  left the operator in ImagePullBackOff and Jobs silently unprofiled), and
  values that moved (top-level serviceMonitor) or went away
  (monitoring.prometheusRule.for) fail with a message saying where to;
- NOTES.txt names the deployed image, says that Jobs run unprofiled until
  the operator runs and how to check it (rollout status, kubectl memprof
  doctor), and prints one CRD upgrade command;
- with KUBECONFIG, on the real control plane: CRDs as an older release had
  them are created with `kubectl create`; the command NOTES.txt printed
  before (no --force-conflicts) conflicts on them, and the one it prints
  now, extracted from the rendered NOTES and run exactly as printed from
  where it says, succeeds and serves the chart's CRDs. The CRDs are renamed
  into a throw-away API group, so the real ones and their short names are
  never touched.

Prints one line per check and `N passed, N failed`; exits non-zero on any failure.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

import chart_render as cr  # exits with a message when helm-python-sdk is missing
import helm_python
from chart_render import BASE, CHART, IMAGE, NAMESPACE, RELEASE, check, kubectl, notes, one, render

def render_error(values: dict, base: dict = BASE) -> str:
    """The message rendering `values` fails with ("" when it renders)."""
    try:
        render(values, base=base)
        return ""
    except helm_python.HelmError as e:
        return str(e)


def check_refusals() -> None:
    """Values the chart refuses say what to do: no image (none is
    published, and a missing one leaves Jobs silently unprofiled), and the
    keys that moved or went away."""
    err = render_error({}, base={})
    check("no image.repository: rendering fails and says what to set and how to build it",
          all(w in err for w in ("image.repository is not set", "make image", "--set image.repository=", "image.tag")), err)
    err = render_error({"serviceMonitor": {"enabled": True}})
    check("the old top-level serviceMonitor fails, naming monitoring.serviceMonitor",
          "serviceMonitor moved to monitoring.serviceMonitor" in err and "--set serviceMonitor=null" in err, err)
    check("serviceMonitor: null (--reuse-values from an old release) renders", render_error({"serviceMonitor": None}) == "")
    err = render_error({"monitoring": {"prometheusRule": {"for": "2m"}}})
    check("monitoring.prometheusRule.for fails with a message saying why it went", "prometheusRule.for was removed" in err, err)
    sm = one(render({"monitoring": {"serviceMonitor": {"enabled": True, "interval": "10s", "labels": {"team": "ml"}}}}),
             "ServiceMonitor")
    check("monitoring.serviceMonitor.interval and .labels reach the ServiceMonitor",
          sm is not None and sm["spec"]["endpoints"][0]["interval"] == "10s" and sm["metadata"]["labels"].get("team") == "ml")


def upgrade_command(text: str) -> list[str]:
    """The CRD upgrade commands NOTES.txt prints, one a line."""
    return re.findall(r"^\s*(kubectl apply --server-side\b.*)$", text, re.M)


def check_install_notes() -> None:
    """NOTES.txt says which image was deployed, how to check the operator
    came up, and an upgrade command that works on CRDs Helm created."""
    text = notes({"image": {"tag": "1.2.3"}})
    check("NOTES name the deployed image", f"IMAGE: {IMAGE}:1.2.3" in text, text[:300])
    check("NOTES say Jobs run unprofiled while the operator is down, and how to check it",
          "WITHOUT profiling" in text and f"kubectl -n {NAMESPACE} rollout status deploy/{RELEASE}" in text
          and "kubectl memprof doctor" in text, text[:1200])
    text = notes({"sidecar": {"image": {"repository": "mirror.example.com/memprof"}}})
    check("NOTES name a sidecar image that differs", "SIDECAR IMAGE: mirror.example.com/memprof:" in text)
    cmds = upgrade_command(notes({}))
    check("NOTES print one CRD upgrade command, with --force-conflicts",
          len(cmds) == 1 and "--force-conflicts" in cmds[0], str(cmds))


def test_crds(ns_group: str, older: bool) -> list[dict]:
    """The chart's CRDs in API group `ns_group` (so that the test never
    touches the real ones, nor their short names); `older`: as a previous
    release would have them (one printer column fewer per version)."""
    crds = [d for d in yaml.safe_load_all((CHART / "crds" / "memprof.yaml").read_text()) if d]
    for crd in crds:
        crd["spec"]["group"] = ns_group
        crd["metadata"]["name"] = f"{crd['spec']['names']['plural']}.{ns_group}"
        crd["spec"]["names"].pop("shortNames", None)
        crd["spec"]["names"].pop("categories", None)
        if older:
            for v in crd["spec"]["versions"]:
                v["additionalPrinterColumns"] = v.get("additionalPrinterColumns", [])[:-1]
    return crds


def check_crd_upgrade() -> None:
    """NOTES.txt's upgrade command, exactly as printed and run from where it
    says, on CRDs an older release created with `kubectl create`: the
    command NOTES printed before (no --force-conflicts) conflicts there."""
    cmds = upgrade_command(notes({}))
    if not check("NOTES print a CRD upgrade command", len(cmds) == 1, str(cmds)):
        return
    group = f"upgrade-{secrets.token_hex(3)}.memprof.dev"
    old, new = test_crds(group, older=True), test_crds(group, older=False)
    with tempfile.TemporaryDirectory() as tmp:
        crd_dir = Path(tmp) / "charts" / "memprof" / "crds"
        crd_dir.mkdir(parents=True)
        (crd_dir / "memprof.yaml").write_text(yaml.safe_dump_all(new))
        try:
            made = kubectl("create", "-f", "-", stdin=yaml.safe_dump_all(old))
            if not check("older CRDs created with kubectl create", made.returncode == 0, made.stderr):
                return
            before = subprocess.run(["bash", "-c", "kubectl apply --server-side -f charts/memprof/crds/"], cwd=tmp,
                                    capture_output=True, text=True, timeout=120)
            check("the former NOTES command (no --force-conflicts) conflicts on them",
                  before.returncode != 0 and "conflict" in before.stderr.lower(), before.stderr[-400:])
            res = subprocess.run(["bash", "-c", cmds[0]], cwd=tmp, capture_output=True, text=True, timeout=120)
            check(f"NOTES' upgrade command succeeds on them: {cmds[0]}", res.returncode == 0, res.stderr[-600:])
            name = new[0]["metadata"]["name"]
            got = json.loads(kubectl("get", "crd", name, "-o", "json").stdout or "{}")
            want = [c["name"] for c in new[0]["spec"]["versions"][0]["additionalPrinterColumns"]]
            have = [c["name"] for c in got.get("spec", {}).get("versions", [{}])[0].get("additionalPrinterColumns", [])]
            check("... and the served CRDs are the chart's", have == want, f"{have} != {want}")
        finally:
            kubectl("delete", "-f", "-", "--wait=false", stdin=yaml.safe_dump_all(new))

def check_documented_install() -> None:
    """docs/install.md's one install block: its `--set` values render, and
    the Deployment runs the image it pushed."""
    text = (cr.ROOT / "docs" / "install.md").read_text()
    section = text.split("\n## Install\n", 1)[-1].split("\n## ", 1)[0]
    block = next((b for b in re.findall(r"```sh\n(.*?)```", section, re.S) if "helm install" in b), "")
    env = {"REGISTRY": "registry.example.com/memprof", "TAG": "v0.1.0-3-gabcdef"}
    sets = [a.replace('"', "") for a in re.findall(r"--set ([^\s]+)", block)]
    sets = [re.sub(r"\$(\w+)", lambda m: env[m.group(1)], a) for a in sets]
    values: dict = {}
    for a in sets:
        values = cr.merged(values, helm_python.parse_set_string(a))
    try:
        dep = one(render(values, base={}), "Deployment")
    except helm_python.HelmError as e:
        dep, err = None, str(e)
    else:
        err = ""
    image = dep["spec"]["template"]["spec"]["containers"][0]["image"] if dep else err
    pushed = re.search(r'docker://"?\$REGISTRY/memprof:\$TAG', block)
    check("docs/install.md's install block installs the image it pushes",
          bool(pushed) and "make image" in block and image == "registry.example.com/memprof/memprof:v0.1.0-3-gabcdef",
          f"{sets} -> {image}")


def main() -> int:
    check_refusals()
    check_install_notes()
    check_documented_install()
    if os.environ.get("KUBECONFIG"):
        if kubectl("version").returncode != 0:
            check("cluster reachable (KUBECONFIG is set)", False, kubectl("version").stderr.strip()[-300:])
        else:
            check_crd_upgrade()
    else:
        print("note: KUBECONFIG not set; skipping the CRD upgrade on a real control plane")
    print(f"{cr.passed} passed, {cr.failed} failed")
    return 1 if cr.failed else 0


if __name__ == "__main__":
    sys.exit(main())
