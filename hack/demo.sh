#!/usr/bin/env bash
# hack/demo.sh -- what `make demo` runs. On the local control plane: the
# operator, a 4-rank annotated Job, and one simulated sidecar per rank
# (rank 2 leaks, rank 3 is heavier). Within about two minutes the job's
# MemoryProfile shows RISK high or critical, a time to OOM and an imbalance
# above 1. Every process started here is stopped here, by PID.
#
# The operator serves its admission webhook on 127.0.0.1, registered by URL
# for the demo namespace as the chart registers it by Service: it injects the
# sidecar into the Job and marks the pods the Job controller creates, and
# only marked pods' reports count (docs/security.md, "Pod trust"). The local
# control plane's kube-controller-manager runs as `memprof-admin`, so that is
# the Job controller's identity here (in a cluster: the chart's
# webhook.controllerIdentities, kube-system's job-controller by default).
#
# The GPUs are simulated (scenario hack/scenarios/demo.yaml, source `sim`):
# there is no kubelet here, so the sidecars run as local processes standing
# in for the pods' containers. Nothing shown is a hardware measurement.
set -euo pipefail
cd "$(dirname "$0")/.."

NS=memprof-demo
JOB=train
RANKS=4
SCENARIO=hack/scenarios/demo.yaml
TIMEOUT=${MEMPROF_DEMO_TIMEOUT:-150}

log() { printf '\n== %s\n' "$*" >&2; }
pids=()
started_cluster=0
workdir=$(mktemp -d "${TMPDIR:-/tmp}/memprof-demo.XXXXXX")
cleanup() {
    local rc=$?
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    if [ -n "${KUBECONFIG:-}" ]; then
        kubectl delete mutatingwebhookconfiguration "$NS" >/dev/null 2>&1 || true
        kubectl delete namespace "$NS" --wait=false >/dev/null 2>&1 || true
    fi
    if [ "$started_cluster" = 1 ]; then bash hack/local-cluster.sh down >/dev/null 2>&1 || true; fi
    rm -rf "$workdir"
    exit $rc
}
trap cleanup EXIT INT TERM

# The first run on a fresh machine is long, and is said to be up front:
# a debug build of every binary (1,146 s measured on a fresh
# machine), the build `make test` reuses, and kube-apiserver built once.
if [ -x target/debug/memprof ] && [ -x target/debug/memprof-operator ]; then
    first="about 2 minutes (memprof built before: only what changed is rebuilt)"
else
    first="the first run takes 20-30 minutes: memprof's debug build (~20 min, cargo's progress shown; \`make test\` reuses it), kube-apiserver once (~10 min); later runs about 2 minutes"
fi
log "memprof demo: $first"
log "local control plane (the first run builds kube-apiserver from Debian's source: ~10 min)"
if ! bash hack/local-cluster.sh status >/dev/null 2>&1; then
    bash hack/local-cluster.sh up >/dev/null
    started_cluster=1
fi
eval "$(bash hack/local-cluster.sh env)"
export KUBECONFIG

log "building memprof (cargo's progress below)"
# The binaries as `make test` builds them: naming one test target turns on
# the dev-dependencies' features (tokio's test-util...), so the crates under
# the binaries are the ones the tests link and neither build redoes the
# other's (tests/cli_seed_gaps.rs compares the two build plans).
cargo build --workspace --bins --test integration
BIN=target/debug

log "installing the CRDs"
kubectl apply --server-side -f crds/ >/dev/null
kubectl wait --for condition=established --timeout=60s crd/memoryprofiles.memprof.dev crd/memoryreports.memprof.dev >/dev/null

log "creating namespace $NS and registering the webhook for it"
kubectl create namespace "$NS" >/dev/null
kubectl label namespace "$NS" memprof.dev/demo=true >/dev/null
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
hook() { # name, API group, resource, objectSelector (JSON)
    printf '{"name":"%s","clientConfig":{"url":"https://127.0.0.1:%s/mutate"},"rules":[{"apiGroups":["%s"],"apiVersions":["v1"],"operations":["CREATE"],"resources":["%s"],"scope":"Namespaced"}],"failurePolicy":"Ignore","sideEffects":"None","admissionReviewVersions":["v1"],"timeoutSeconds":5,"namespaceSelector":{"matchLabels":{"memprof.dev/demo":"true"}},"objectSelector":%s}' \
        "$1" "$port" "$2" "$3" "$4"
}
kubectl apply -f - >/dev/null <<JSON
{"apiVersion":"admissionregistration.k8s.io/v1","kind":"MutatingWebhookConfiguration",
 "metadata":{"name":"$NS"},
 "webhooks":[$(hook jobs.memprof.dev batch jobs '{}'),
             $(hook pods.memprof.dev "" pods '{"matchLabels":{"memprof.dev/inject":"true"}}'),
             $(hook marks.memprof.dev "" pods '{"matchLabels":{"memprof.dev/managed":"true"}}'),
             {"name":"writers.memprof.dev","clientConfig":{"url":"https://127.0.0.1:$port/mutate"},
              "rules":[{"apiGroups":["memprof.dev"],"apiVersions":["v1alpha1"],"operations":["CREATE","UPDATE"],"resources":["memoryreports"],"scope":"Namespaced"}],
              "failurePolicy":"Ignore","sideEffects":"None","admissionReviewVersions":["v1"],"timeoutSeconds":5,
              "namespaceSelector":{"matchLabels":{"memprof.dev/demo":"true"}}}]}
JSON

log "starting memprof-operator (its webhook on 127.0.0.1:$port)"
"$BIN/memprof-operator" --metrics-addr 127.0.0.1:0 \
    --webhook-port "$port" --webhook-bind-address 127.0.0.1 --webhook-extra-names 127.0.0.1 \
    --webhook-namespace "$NS" --webhook-config-name "$NS" --sidecar-image memprof:demo \
    --admission-controller-identities memprof-admin \
    >"$workdir/operator.log" 2>&1 &
pids+=($!)
log "waiting for the webhook's certificate and secret path (the operator fills in both)"
for _ in $(seq 60); do
    ca=$(kubectl get mutatingwebhookconfiguration "$NS" -o jsonpath='{.webhooks[2].clientConfig.caBundle}' 2>/dev/null || true)
    url=$(kubectl get mutatingwebhookconfiguration "$NS" -o jsonpath='{.webhooks[2].clientConfig.url}' 2>/dev/null || true)
    [ -n "$ca" ] && [[ "$url" == */mutate/* ]] && break
    sleep 1
done
[ -n "$ca" ] && [[ "$url" == */mutate/* ]] || { echo "the operator never served its webhook; its log:" >&2; tail -20 "$workdir/operator.log" >&2; exit 1; }
sleep 2

log "creating the annotated $RANKS-rank Job $JOB"
kubectl -n "$NS" apply -f - >/dev/null <<YAML
apiVersion: batch/v1
kind: Job
metadata:
  name: $JOB
  annotations:
    memprof.dev/enabled: "true"
spec:
  parallelism: $RANKS
  completions: $RANKS
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: trainer
        image: example.invalid/trainer:latest
        env:
        - { name: BATCH_SIZE, value: "32" }
YAML

log "waiting for the Job controller to create $RANKS pods (they stay Pending: no kubelet here)"
for _ in $(seq 60); do
    n=$(kubectl -n "$NS" get pods -l job-name=$JOB --no-headers 2>/dev/null | wc -l)
    [ "$n" -ge "$RANKS" ] && break
    sleep 1
done
mapfile -t pods < <(kubectl -n "$NS" get pods -l job-name=$JOB -o jsonpath='{range .items[*]}{.metadata.name} {.metadata.uid}{"\n"}{end}' | sort)
[ "${#pods[@]}" -ge "$RANKS" ] || { echo "the Job controller created ${#pods[@]} pods, expected $RANKS" >&2; exit 1; }

# As a kubelet would: a service-account token bound to each pod, so that
# the API server names the pod in every write its sidecar makes (only then
# does the webhook mark the report as that pod's own, and the operator count it).
pod_kubeconfig() { # pod, uid -> path of a kubeconfig acting as that pod
    local token out="$workdir/kubeconfig-$1"
    token=$(kubectl -n "$NS" create token default --duration 1h \
        --bound-object-kind Pod --bound-object-name "$1" --bound-object-uid "$2")
    # JSON is YAML: no YAML library needed to write a kubeconfig.
    kubectl config view --raw -o json | python3 -c '
import json, sys
cfg = json.load(sys.stdin)
for u in cfg["users"]:
    u["user"] = {"token": sys.argv[1]}
json.dump(cfg, open(sys.argv[2], "w"))' "$token" "$out"
    chmod 600 "$out"
    echo "$out"
}

log "starting $RANKS simulated sidecars (rank 2 leaks, rank 3 is heavier), each with its pod's bound token"
for rank in $(seq 0 $((RANKS - 1))); do
    read -r pod uid <<<"${pods[$rank]}"
    kc=$(pod_kubeconfig "$pod" "$uid")
    KUBECONFIG=$kc POD_NAME=$pod POD_UID=$uid POD_NAMESPACE=$NS NODE_NAME="sim-node-$((rank / 2))" MEMPROF_JOB_NAME=$JOB \
        "$BIN/memprof-sidecar" --backend sim --scenario "$SCENARIO" --rank "$rank" \
        --listen 127.0.0.1:0 >"$workdir/sidecar-$rank.log" 2>&1 &
    pids+=($!)
done

log "watching the MemoryProfile until the leak is called (up to ${TIMEOUT}s)"
start=$(date +%s)
while :; do
    line=$(kubectl -n "$NS" get memoryprofiles "$JOB" --no-headers 2>/dev/null || true)
    [ -n "$line" ] && printf '  %3ss  %s\n' "$(( $(date +%s) - start ))" "$line"
    risk=$(kubectl -n "$NS" get memoryprofiles "$JOB" -o jsonpath='{.status.risk}' 2>/dev/null || true)
    imb=$(kubectl -n "$NS" get memoryprofiles "$JOB" -o jsonpath='{.status.imbalance}' 2>/dev/null || true)
    tto=$(kubectl -n "$NS" get memoryprofiles "$JOB" -o jsonpath='{.status.timeToOom}' 2>/dev/null || true)
    if { [ "$risk" = high ] || [ "$risk" = critical ]; } && [ -n "$tto" ] && python3 -c "import sys; sys.exit(0 if float('${imb:-0}') > 1 else 1)"; then
        break
    fi
    if [ $(( $(date +%s) - start )) -ge "$TIMEOUT" ]; then
        echo "no high risk after ${TIMEOUT}s; operator log:" >&2; tail -20 "$workdir/operator.log" >&2
        exit 1
    fi
    sleep 5
done

log "kubectl get memoryprofiles -n $NS"
kubectl -n "$NS" get memoryprofiles
log "kubectl get memoryreports -n $NS"
kubectl -n "$NS" get memoryreports
log "annotations of job/$JOB"
kubectl -n "$NS" get job "$JOB" -o jsonpath='{range .metadata.annotations}{end}' >/dev/null
kubectl -n "$NS" get job "$JOB" -o json | python3 -c 'import json,sys; a=json.load(sys.stdin)["metadata"]["annotations"]; [print(f"  {k}: {v}") for k,v in sorted(a.items()) if k.startswith("memprof.dev/")]'
log "events of job/$JOB"
kubectl -n "$NS" get events --field-selector involvedObject.name="$JOB" -o custom-columns=TYPE:.type,REASON:.reason,MESSAGE:.message 2>/dev/null || kubectl -n "$NS" get events
log "what memprof concluded (memprof report)"
"$BIN/memprof" report "$JOB" -n "$NS"
log "demo done: stopping the sidecars and the operator"
