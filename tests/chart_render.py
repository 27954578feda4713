#!/usr/bin/env python3
"""Lints and renders charts/memprof, checks its invariants, and (with
KUBECONFIG set) validates the manifests with a server-side dry run.

    pip install helm-python-sdk==0.2.2 pyyaml
    python3 tests/chart_render.py                 # offline
    eval "$(bash hack/local-cluster.sh env)"; python3 tests/chart_render.py

Prints one line per check and `N passed, N failed`; exits non-zero on any
failure. The dry run installs the CRDs for real (server-side apply, the
documented upgrade path) and uses a temporary namespace it deletes again.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import yaml

try:
    import helm_python
except ImportError:  # pragma: no cover - the message is the point
    print("helm-python-sdk is missing: pip install helm-python-sdk==0.2.2")
    print("0 passed, 1 failed")
    sys.exit(1)

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "memprof"
RELEASE, NAMESPACE = "memprof", "memprof-system"
# The chart has no default image (none is published): every render names one.
IMAGE = "registry.example.com/memprof/memprof"
BASE = {"image": {"repository": IMAGE}}
LABELS = [
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
]

passed = failed = 0


def bench_glibc_tunables() -> str:
    """The GLIBC_TUNABLES the benchmarks start the operator with: the chart must match."""
    src = (ROOT / "examples" / "scale_support" / "setup.rs").read_text()
    m = re.search(r'pub const GLIBC_TUNABLES: &str = "([^"]+)";', src)
    assert m, "examples/scale_support/setup.rs: GLIBC_TUNABLES not found"
    return m.group(1)


BENCH_GLIBC_TUNABLES = bench_glibc_tunables()


def check(name: str, ok: bool, detail: str = "") -> bool:
    global passed, failed
    if ok:
        passed += 1
        print(f"PASS {name}")
    else:
        failed += 1
        print(f"FAIL {name}{': ' + detail if detail else ''}")
    return ok


def merged(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def render(values: dict, namespace: str = NAMESPACE, base: dict = BASE) -> list[dict]:
    chart = helm_python.Chart.load(str(CHART))
    out = chart.render(merged(base, values), name=RELEASE, namespace=namespace)
    docs = []
    for path, text in sorted(out.items()):
        if path.endswith("NOTES.txt"):
            continue
        docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def notes(values: dict) -> str:
    out = helm_python.Chart.load(str(CHART)).render(merged(BASE, values), name=RELEASE, namespace=NAMESPACE)
    return next(v for k, v in out.items() if k.endswith("NOTES.txt"))


def one(docs: list[dict], kind: str, name: str | None = None) -> dict | None:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    return found[0] if len(found) == 1 else None


def clap_flags() -> set[str]:
    """Long flags `memprof-operator` accepts, from its own `--help` (the binary
    is built by the Rust tests that run before this script; set
    MEMPROF_OPERATOR_BIN to use another build)."""
    import subprocess
    binary = os.environ.get("MEMPROF_OPERATOR_BIN", str(ROOT / "target/debug/memprof-operator"))
    if not Path(binary).exists():
        subprocess.run(["cargo", "build", "--quiet", "--bin", "memprof-operator"], cwd=ROOT, check=True)
    out = subprocess.run([binary, "--help"], capture_output=True, text=True, check=True).stdout
    return set(re.findall(r"^\s+(?:-\w, )?--([a-z0-9-]+)", out, re.M))


def operator_args(docs: list[dict]) -> dict[str, str]:
    dep = one(docs, "Deployment")
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    return dict((a[2:].split("=", 1) + [""])[:2] for a in args)


def check_common(case: str, docs: list[dict], values: dict) -> None:
    dep = one(docs, "Deployment")
    if not check(f"{case}: one Deployment", dep is not None):
        return
    check(f"{case}: 2 replicas", dep["spec"]["replicas"] == 2, str(dep["spec"]["replicas"]))
    args = operator_args(docs)
    unknown = set(args) - clap_flags()
    check(f"{case}: every operator flag exists in clap", not unknown, str(sorted(unknown)))
    check(f"{case}: --leader-elect", "leader-elect" in args)
    check(
        f"{case}: --gpu-access matches values",
        args.get("gpu-access") == values.get("gpuAccess", "envvar"),
        str(args.get("gpu-access")),
    )
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    check(
        f"{case}: glibc gives large buffers back (the benchmarks run the operator so)",
        env.get("GLIBC_TUNABLES") == BENCH_GLIBC_TUNABLES,
        str(env.get("GLIBC_TUNABLES")),
    )
    sc, psc = c["securityContext"], pod["securityContext"]
    check(
        f"{case}: locked-down securityContext",
        psc.get("runAsNonRoot") is True
        and sc.get("readOnlyRootFilesystem") is True
        and sc.get("allowPrivilegeEscalation") is False
        and sc.get("capabilities", {}).get("drop") == ["ALL"],
    )
    no_host_path = [d["kind"] for d in docs if "hostPath" in json.dumps(d)]
    check(f"{case}: the chart itself mounts no hostPath", not no_host_path, str(no_host_path))
    unlabelled = [
        f"{d['kind']}/{d['metadata']['name']}"
        for d in docs
        if not all(k in d["metadata"].get("labels", {}) for k in LABELS)
    ]
    check(f"{case}: app.kubernetes.io labels everywhere", not unlabelled, str(unlabelled))
    tmpl_labels = dep["spec"]["template"]["metadata"]["labels"]
    check(
        f"{case}: selector matches pod labels",
        all(tmpl_labels.get(k) == v for k, v in dep["spec"]["selector"]["matchLabels"].items()),
    )

    role = one(docs, "ClusterRole", f"{RELEASE}-operator")
    rules = role["rules"] if role else []

    def grants(group: str, resource: str, verbs: set[str]) -> bool:
        return verbs <= granted(rules, group, resource)

    check(f"{case}: operator may grant memoryreports create/get/patch", grants("memprof.dev", "memoryreports", {"create", "get", "patch"}))
    check(f"{case}: operator manages roles/rolebindings", grants("rbac.authorization.k8s.io", "roles", {"create", "get", "patch"}) and grants("rbac.authorization.k8s.io", "rolebindings", {"create", "get", "patch"}))
    check(f"{case}: operator writes directives (memoryreports/status get/patch)", grants("memprof.dev", "memoryreports/status", {"get", "patch"}))
    check(f"{case}: jobs verbs", grants("batch", "jobs", {"get", "list", "watch", "create", "delete", "patch"}))
    check(f"{case}: events.k8s.io", grants("events.k8s.io", "events", {"create", "patch"}))
    # Every replica's webhook lists a Job's namespace's profiles (its
    # family's measured history) and policies (denyPredictedOom) at admission.
    check(
        f"{case}: the webhook may list memoryprofiles and remediationpolicies in every namespace",
        grants("memprof.dev", "memoryprofiles", {"list"}) and grants("memprof.dev", "remediationpolicies", {"list"}),
    )
    ns_role = one(docs, "Role")
    ns_rules = ns_role["rules"] if ns_role else []
    self_signed = values.get("webhook", {}).get("certMode", "self") == "self"
    secret_names = {n for r in ns_rules if "secrets" in r["resources"] for n in r.get("resourceNames", [])}
    check(
        f"{case}: leases and secrets (the admission key; in self mode the certificate) only in the release namespace",
        any("leases" in r["resources"] for r in ns_rules)
        and f"{RELEASE}-admission-key" in secret_names
        and (f"{RELEASE}-webhook-tls" in secret_names) == self_signed
        and not any("secrets" in r.get("resources", []) for r in rules),
        str(secret_names),
    )


def granted(rules: list[dict], group: str, resource: str) -> set[str]:
    """Every verb `rules` grant on group/resource (resourceNames-limited rules excluded)."""
    verbs: set[str] = set()
    for r in rules:
        if group in r.get("apiGroups", []) and resource in r.get("resources", []) and not r.get("resourceNames"):
            verbs |= set(r["verbs"])
    return verbs


WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection", "escalate", "bind", "impersonate", "*"}
GUARDED = [("batch", "jobs"), ("", "pods"), ("", "configmaps"), ("rbac.authorization.k8s.io", "roles"),
           ("rbac.authorization.k8s.io", "rolebindings"), ("", "secrets")]


def check_least_privilege() -> None:
    """The namespaced install has no cluster-wide write verbs on Jobs, Pods,
    ConfigMaps, Roles or Secrets; Secrets are only ever read by name; users
    get memprof-view/memprof-edit through aggregation."""
    docs = render({"rbac": {"namespaces": ["team-a", "team-b"]}})
    cluster_rules = [r for d in docs if d["kind"] == "ClusterRole" for r in d["rules"]]
    writes = {f"{g or 'core'}/{res}": sorted(granted(cluster_rules, g, res) & WRITE_VERBS) for g, res in GUARDED}
    check(
        "namespaced install: no cluster-wide write verbs on jobs, pods, configmaps, roles, rolebindings, secrets",
        not any(writes.values()),
        str(writes),
    )
    roles = {d["metadata"]["namespace"]: d for d in docs if d["kind"] == "Role" and d["metadata"]["name"].endswith("-writes")}
    check(
        "namespaced install: write Roles in exactly the listed namespaces",
        sorted(roles) == ["team-a", "team-b"]
        and all({"create", "delete", "patch"} <= granted(r["rules"], "batch", "jobs") for r in roles.values()),
        str(sorted(roles)),
    )
    bindings = {d["metadata"]["namespace"] for d in docs if d["kind"] == "RoleBinding" and d["metadata"]["name"].endswith("-writes")}
    check("namespaced install: each write Role bound", bindings == {"team-a", "team-b"}, str(bindings))
    check(
        "namespaced install: the operator is told the namespaces",
        operator_args(docs).get("allowed-namespaces") == "team-a,team-b",
        str(operator_args(docs).get("allowed-namespaces")),
    )
    mwc = one(docs, "MutatingWebhookConfiguration")
    narrowed = all(
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]}
        in w["namespaceSelector"].get("matchExpressions", [])
        for w in mwc["webhooks"]
    )
    check("namespaced install: the webhook only sees the listed namespaces", narrowed)

    default = render({})
    cr = one(default, "ClusterRole", f"{RELEASE}-operator")
    check(
        "cluster install: plan ConfigMaps are not created or deleted cluster-wide",
        not ({"create", "delete"} & granted(cr["rules"], "", "configmaps")),
        str(granted(cr["rules"], "", "configmaps")),
    )
    check("cluster install: --allowed-namespaces empty", operator_args(default).get("allowed-namespaces") == "")
    check(
        "plans live in the release namespace",
        operator_args(default).get("remediation-plan-namespace") == NAMESPACE,
    )
    ns_role = one(default, "Role", f"{RELEASE}-operator")
    secret_rules = [r for r in ns_role["rules"] if "secrets" in r["resources"]]
    check(
        "secrets: get/update only by name, create only in the release namespace",
        all(
            sorted(r.get("resourceNames", [])) == [f"{RELEASE}-admission-key", f"{RELEASE}-webhook-tls"]
            for r in secret_rules
            if set(r["verbs"]) & {"get", "update"}
        )
        and all(set(r["verbs"]) == {"create"} for r in secret_rules if not r.get("resourceNames")),
        json.dumps(secret_rules),
    )
    view, edit = one(default, "ClusterRole", "memprof-view"), one(default, "ClusterRole", "memprof-edit")
    check(
        "memprof-view aggregates into view/edit/admin, read-only",
        view is not None
        and view["metadata"]["labels"].get("rbac.authorization.k8s.io/aggregate-to-view") == "true"
        and not (granted(view["rules"], "memprof.dev", "memoryreports") & WRITE_VERBS),
    )
    check(
        "memprof-edit writes RemediationPolicies only (never reports or profiles)",
        edit is not None
        and edit["metadata"]["labels"].get("rbac.authorization.k8s.io/aggregate-to-edit") == "true"
        and {"create", "patch", "delete"} <= granted(edit["rules"], "memprof.dev", "remediationpolicies")
        and not granted(edit["rules"], "memprof.dev", "memoryreports")
        and not granted(edit["rules"], "memprof.dev", "memoryreports/status")
        and not granted(edit["rules"], "memprof.dev", "memoryprofiles"),
    )
    check(
        "aggregateToDefaultRoles=false ships neither",
        one(render({"rbac": {"aggregateToDefaultRoles": False}}), "ClusterRole", "memprof-view") is None,
    )


def check_report_policy() -> None:
    """The ValidatingAdmissionPolicy, evaluated with a CEL interpreter on the
    requests a sidecar (and a forger) would make: the local server is 1.20
    and cannot run it."""
    try:
        import celpy
    except ImportError:
        check("cel-python installed (tests/requirements.txt)", False)
        return
    docs = render({"reportPolicy": {"enabled": True}})
    vap = one(docs, "ValidatingAdmissionPolicy")
    binding = one(docs, "ValidatingAdmissionPolicyBinding")
    if not check("reportPolicy: policy and binding rendered", vap is not None and binding is not None):
        return
    check("reportPolicy: binding denies", binding["spec"]["validationActions"] == ["Deny"]
          and binding["spec"]["policyName"] == vap["metadata"]["name"])
    check("reportPolicy: off renders nothing", one(render({"reportPolicy": {"enabled": False}}), "ValidatingAdmissionPolicy") is None)
    env = celpy.Environment()

    def run(expr: str, act: dict):
        return env.program(env.compile(expr)).evaluate({k: celpy.json_to_cel(v) for k, v in act.items()})

    def admitted(user: str, extra: dict, name: str, pod_name: str, owner_uid: str | None) -> bool:
        request = {"userInfo": {"username": user, "extra": extra}}
        obj = {"metadata": {"name": name}, "spec": {"podName": pod_name}}
        if owner_uid:
            obj["metadata"]["ownerReferences"] = [{"kind": "Pod", "uid": owner_uid, "name": pod_name}]
        act = {"request": request, "object": obj}
        if not all(bool(run(c["expression"], act)) for c in vap["spec"]["matchConditions"]):
            return True  # the policy does not apply
        act["variables"] = {v["name"]: str(run(v["expression"], act)) for v in vap["spec"]["variables"]}
        return all(bool(run(v["expression"], act)) for v in vap["spec"]["validations"])

    sa = "system:serviceaccount:ml:default"
    bound = {"authentication.kubernetes.io/pod-name": ["train-0"], "authentication.kubernetes.io/pod-uid": ["u0"]}
    check("reportPolicy: a sidecar writes its own pod's report", admitted(sa, bound, "train-0", "train-0", "u0"))
    check("reportPolicy: not another pod's report", not admitted(sa, bound, "train-1", "train-1", "u1"))
    check("reportPolicy: not its own name describing another pod", not admitted(sa, bound, "train-0", "train-1", "u0"))
    check("reportPolicy: not owned by another pod", not admitted(sa, bound, "train-0", "train-0", "u9"))
    check("reportPolicy: not without a pod-bound token", not admitted(sa, {}, "train-0", "train-0", "u0"))
    check("reportPolicy: people and controllers are not sidecars", admitted("alice", {}, "x", "y", None))


def check_webhook(case: str, docs: list[dict], cert_manager: bool) -> None:
    mwc = one(docs, "MutatingWebhookConfiguration")
    if not check(f"{case}: MutatingWebhookConfiguration", mwc is not None):
        return
    args = operator_args(docs)
    hooks = {w["name"]: w for w in mwc["webhooks"]}
    check(
        f"{case}: jobs, pods, marks, writers and workloads webhooks",
        set(hooks) == {"jobs.memprof.dev", "pods.memprof.dev", "marks.memprof.dev", "writers.memprof.dev",
                       "workloads.memprof.dev"},
        str(list(hooks)),
    )
    for name, w in hooks.items():
        check(f"{case}: {name} failurePolicy Ignore", w["failurePolicy"] == "Ignore")
        check(f"{case}: {name} sideEffects None", w["sideEffects"] == "None")
        ops = ["CREATE", "UPDATE"] if name == "writers.memprof.dev" else ["CREATE"]
        check(f"{case}: {name} operations {ops}", all(r["operations"] == ops for r in w["rules"]))
        check(f"{case}: {name} no caBundle in the chart", "caBundle" not in w["clientConfig"])
        svc = w["clientConfig"]["service"]
        check(
            f"{case}: {name} points at --webhook-service-name",
            svc["name"] == args["webhook-service-name"] and svc["namespace"] == NAMESPACE and svc["path"] == "/mutate",
        )
    # The marks webhook's URL carries the secret path: the API server returns
    # a Fail webhook's URL in its error, so it fails open whatever the value says.
    strict = render({"webhook": {"failurePolicy": "Fail"}})
    strict_hooks = {w["name"]: w for d in strict if d["kind"] == "MutatingWebhookConfiguration" for w in d["webhooks"]}
    check(f"{case}: webhook.failurePolicy=Fail leaves the marks webhook Ignore",
          strict_hooks["marks.memprof.dev"]["failurePolicy"] == "Ignore"
          and strict_hooks["writers.memprof.dev"]["failurePolicy"] == "Ignore"
          and strict_hooks["jobs.memprof.dev"]["failurePolicy"] == "Fail", str({n: w["failurePolicy"] for n, w in strict_hooks.items()}))
    check(
        f"{case}: pods webhook only for labelled pods",
        hooks["pods.memprof.dev"]["objectSelector"] == {"matchLabels": {"memprof.dev/inject": "true"}},
    )
    check(
        f"{case}: marks webhook only for the pods of profiled Jobs",
        hooks["marks.memprof.dev"]["objectSelector"] == {"matchLabels": {"memprof.dev/managed": "true"}},
    )
    check(
        f"{case}: writers webhook sees every MemoryReport write",
        hooks["writers.memprof.dev"]["rules"] == [{"apiGroups": ["memprof.dev"], "apiVersions": ["v1alpha1"],
            "operations": ["CREATE", "UPDATE"], "resources": ["memoryreports"], "scope": "Namespaced"}]
        and "objectSelector" not in hooks["writers.memprof.dev"],
    )
    check(
        f"{case}: workloads webhook sees Job, JobSet, PyTorchJob and TrainJob creations, on no label",
        [(r["apiGroups"], r["apiVersions"], r["resources"], r["operations"])
         for r in hooks["workloads.memprof.dev"]["rules"]]
        == [(["batch"], ["v1"], ["jobs"], ["CREATE"]),
            (["jobset.x-k8s.io"], ["v1alpha2"], ["jobsets"], ["CREATE"]),
            (["kubeflow.org"], ["v1"], ["pytorchjobs"], ["CREATE"]),
            (["trainer.kubeflow.org"], ["v1alpha1"], ["trainjobs"], ["CREATE"])]
        and "objectSelector" not in hooks["workloads.memprof.dev"],
    )
    check(
        f"{case}: the creators of each workload link are configured",
        args.get("jobset-identities") == "system:serviceaccount:jobset-system:jobset-controller-manager"
        and args.get("trainer-identities") == "system:serviceaccount:kubeflow-system:kubeflow-trainer-controller-manager"
        and args.get("training-operator-identities") == "system:serviceaccount:kubeflow:training-operator",
        str(args),
    )
    check(
        f"{case}: the Job controller's identities are configured",
        args.get("admission-controller-identities")
        == "system:serviceaccount:kube-system:job-controller,system:kube-controller-manager",
        str(args.get("admission-controller-identities")),
    )
    check(f"{case}: --webhook-config-name is the configuration", args["webhook-config-name"] == mwc["metadata"]["name"])
    svc = one(docs, "Service", args["webhook-service-name"])
    check(
        f"{case}: webhook Service 443 -> webhook port",
        svc is not None and svc["spec"]["ports"][0]["port"] == 443 and svc["spec"]["ports"][0]["targetPort"] == "webhook",
    )
    dep = one(docs, "Deployment")
    ports = {p["name"]: p["containerPort"] for p in dep["spec"]["template"]["spec"]["containers"][0]["ports"]}
    check(f"{case}: container port webhook=8443, metrics=8080", ports == {"webhook": 8443, "metrics": 8080}, str(ports))
    annotation = mwc["metadata"].get("annotations", {}).get("cert-manager.io/inject-ca-from")
    cert = one(docs, "Certificate")
    if cert_manager:
        check(f"{case}: --webhook-cert-mode=files", args["webhook-cert-mode"] == "files")
        check(
            f"{case}: CA injected from the Certificate",
            cert is not None and annotation == f"{NAMESPACE}/{cert['metadata']['name']}",
            str(annotation),
        )
        vols = dep["spec"]["template"]["spec"].get("volumes", [])
        check(
            f"{case}: the Certificate's Secret is mounted at --webhook-cert-dir",
            cert is not None
            and any(v.get("secret", {}).get("secretName") == cert["spec"]["secretName"] for v in vols)
            and any(
                m["mountPath"] == args["webhook-cert-dir"] and m.get("readOnly")
                for m in dep["spec"]["template"]["spec"]["containers"][0].get("volumeMounts", [])
            ),
        )
        check(
            f"{case}: certificate names the Service",
            cert is not None and f"{args['webhook-service-name']}.{NAMESPACE}.svc" in cert["spec"]["dnsNames"],
        )
    else:
        check(f"{case}: --webhook-cert-mode=self", args["webhook-cert-mode"] == "self")
        check(f"{case}: no cert-manager objects", cert is None and annotation is None)
    # Either mode: the operator keeps its webhooks on the secret path.
    rules = one(docs, "ClusterRole", f"{RELEASE}-operator")["rules"]
    patch = [r for r in rules if "mutatingwebhookconfigurations" in r.get("resources", [])]
    check(
        f"{case}: may patch only its own webhook configuration",
        len(patch) == 1 and patch[0].get("resourceNames") == [mwc["metadata"]["name"]] and set(patch[0]["verbs"]) == {"get", "patch"},
    )


def check_network_policy() -> None:
    """Ingress only on the webhook and metrics ports; any source unless narrowed."""

    def sources(docs: list[dict]) -> dict | None:
        np = one(docs, "NetworkPolicy")
        return {r["ports"][0]["port"]: r.get("from") for r in np["spec"]["ingress"]} if np else None

    docs = render({})
    np, dep = one(docs, "NetworkPolicy"), one(docs, "Deployment")
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    check(
        "networkPolicy: the operator pods, ingress on ports 8443 and 8080 only, from anywhere by default",
        np is not None
        and np["spec"]["policyTypes"] == ["Ingress"]
        and all(pod_labels.get(k) == v for k, v in np["spec"]["podSelector"]["matchLabels"].items())
        and sources(docs) == {8443: None, 8080: None},
        str(sources(docs)),
    )
    monitoring = {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
    docs = render({"networkPolicy": {"apiServerCIDRs": ["127.0.0.1/32"], "metricsNamespaceSelector": monitoring}})
    check(
        "networkPolicy: apiServerCIDRs and metricsNamespaceSelector narrow the sources",
        sources(docs) == {8443: [{"ipBlock": {"cidr": "127.0.0.1/32"}}], 8080: [{"namespaceSelector": monitoring}]},
        str(sources(docs)),
    )
    check(
        "networkPolicy: webhook disabled leaves only the metrics port",
        sources(render({"webhook": {"enabled": False}})) == {8080: None},
    )
    check("networkPolicy: disabled renders none", one(render({"networkPolicy": {"enabled": False}}), "NetworkPolicy") is None)
    try:
        render({"networkPolicy": {"apiServerCIDRs": ["apiserver"]}})
        check("schema rejects a non-CIDR in networkPolicy.apiServerCIDRs", False, "rendered")
    except helm_python.HelmValuesError:
        check("schema rejects a non-CIDR in networkPolicy.apiServerCIDRs", True)


def offline() -> list[tuple[str, list[dict]]]:
    report = helm_python.lint(str(CHART), values=BASE)
    check("helm lint", not report["errors"], "; ".join(report["errors"]))
    report = helm_python.lint(str(CHART), values=BASE, strict=True, kube_version="v1.30.0")
    check("helm lint --strict (1.30)", not report["errors"], "; ".join(report["errors"]))

    chart_crds = (CHART / "crds" / "memprof.yaml").read_text()
    check("chart crds/ is a copy of crds/memprof.yaml", chart_crds == (ROOT / "crds" / "memprof.yaml").read_text(), "run: cp crds/memprof.yaml charts/memprof/crds/")

    cases: list[tuple[str, dict]] = [("default", {})]
    cases += [(f"gpuAccess={m}", {"gpuAccess": m}) for m in ("envvar", "podResources", "agentOnly")]
    cases += [("certManager", {"webhook": {"certMode": "certManager"}})]
    rendered = []
    for case, values in cases:
        try:
            docs = render(values)
        except helm_python.HelmError as e:
            check(f"{case}: renders", False, str(e))
            continue
        check(f"{case}: renders", True)
        check_common(case, docs, values)
        check_webhook(case, docs, cert_manager=case == "certManager")
        rendered.append((case, docs))

    text = notes({"gpuAccess": "podResources"})
    check("podResources: NOTES warn about Pod Security privileged", "privileged" in text)

    docs = render({"webhook": {"enabled": False}})
    check(
        "webhook disabled: no configuration, --webhook-port=0",
        one(docs, "MutatingWebhookConfiguration") is None and operator_args(docs)["webhook-port"] == "0",
    )
    docs = render({"monitoring": {"serviceMonitor": {"enabled": True}}})
    sm = one(docs, "ServiceMonitor")
    metrics = one(docs, "Service", f"{RELEASE}-metrics")
    check(
        "serviceMonitor: selects the metrics Service",
        sm is not None and metrics is not None
        and all(metrics["metadata"]["labels"].get(k) == v for k, v in sm["spec"]["selector"]["matchLabels"].items()),
    )
    rendered.append(("serviceMonitor", docs))
    check_network_policy()
    check_least_privilege()
    check_report_policy()
    rendered.append(("namespaced", render({"rbac": {"namespaces": ["team-a"]}})))
    for bad in ({"gpuAccess": "all"}, {"webhook": {"certMode": "vault"}}, {"sidecar": {"interval": "fast"}}):
        try:
            render(bad)
            check(f"schema rejects {bad}", False, "rendered")
        except helm_python.HelmValuesError:
            check(f"schema rejects {bad}", True)
    return rendered


def kubectl(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["kubectl", *args], input=stdin, capture_output=True, text=True, timeout=120)


def served_kinds() -> set[tuple[str, str]]:
    """(apiVersion, kind) pairs the server knows, from discovery."""
    out = kubectl("get", "--raw", "/apis")
    groups = ["v1"] + [v["groupVersion"] for g in json.loads(out.stdout)["groups"] for v in g["versions"]]
    kinds = set()
    for gv in groups:
        path = "/api/v1" if gv == "v1" else f"/apis/{gv}"
        res = kubectl("get", "--raw", path)
        if res.returncode == 0:
            kinds |= {(gv, r["kind"]) for r in json.loads(res.stdout)["resources"]}
    return kinds


def dry_run(rendered: list[tuple[str, list[dict]]]) -> None:
    if kubectl("version").returncode != 0:
        check("cluster reachable (KUBECONFIG is set)", False, kubectl("version").stderr.strip()[-300:])
        return
    crds = kubectl("apply", "--server-side", "--field-manager=memprof-chart-test", "-f", str(CHART / "crds"))
    check("CRDs apply (server-side, as on upgrade)", crds.returncode == 0, crds.stderr.strip())
    known = served_kinds()
    ns = f"memprof-chart-{secrets.token_hex(4)}"
    kubectl("create", "namespace", ns)
    try:
        for case, _ in rendered:
            values = {
                "default": {},
                "certManager": {"webhook": {"certMode": "certManager"}},
                "serviceMonitor": {"monitoring": {"serviceMonitor": {"enabled": True}}},
                # The write Roles go into the listed namespaces: list one that exists.
                "namespaced": {"rbac": {"namespaces": [ns]}},
            }.get(case)
            if values is None:
                values = {"gpuAccess": case.split("=", 1)[1]}
            docs = render(values, namespace=ns)
            keep = []
            for d in docs:
                if (d["apiVersion"], d["kind"]) in known:
                    keep.append(d)
                else:
                    print(f"note: {case}: skipping {d['apiVersion']} {d['kind']}: not served by this API server")
            res = kubectl("apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump_all(keep))
            check(f"{case}: server-side dry run ({len(keep)} objects)", res.returncode == 0, res.stderr.strip()[-600:])
    finally:
        kubectl("delete", "namespace", ns, "--wait=false")


def main() -> int:
    rendered = offline()
    if os.environ.get("KUBECONFIG"):
        dry_run(rendered)
    else:
        print("note: KUBECONFIG not set; skipping the server-side dry run")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
