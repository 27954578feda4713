#!/bin/bash
# GPU tenancy of the real sidecar binary on a machine with an NVIDIA GPU
# (not part of `make test`: CI has no GPU). A "pod" sidecar (not
# --standalone) is shown every GPU NVML sees and must report them only when
# the pod requested as many (MEMPROF_REQUESTED_GPUS), else none
# (AmbiguousGpus) until the in-process agent names them (AgentUuids); a
# standalone run reports every GPU. Prints each case's GpuVisible condition
# and GPUs, and `N failed` (exit status 1 when N > 0).
#
#   SIDECAR=target/release/memprof-sidecar bash crates/sidecar/tests/gpu_tenancy.sh
#
# Uses loopback ports 19461-19464; stops every sidecar it starts (by PID) and
# removes its temporary directory.
set -u
S=${SIDECAR:-target/release/memprof-sidecar}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
unset KUBERNETES_SERVICE_HOST MEMPROF_GPUS MEMPROF_GPU_DISCOVERY
nvidia-smi -L
UUID=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1)
N=$(nvidia-smi -L | grep -c '^GPU ')
get() { python3 -c "import urllib.request,sys;print(urllib.request.urlopen('http://127.0.0.1:%s%s'%(sys.argv[1],sys.argv[2]),timeout=5).read().decode())" "$@" 2>&1; }
summ() { python3 -c "import json,sys;r=json.load(sys.stdin);c=[x for x in r['conditions'] if x['type']=='GpuVisible'][0];print('GpuVisible',c['status'],c['reason'],'|',c['message'][:160]);print('gpus',[(g['uuid'],g.get('source'),g['usedBytes']) for g in r['gpus']])"; }
push() { python3 - "$1" "$2" <<'PY'
import json,sys,time,urllib.request
body={"version":1,"kind":"sample","time":time.time(),"pid":1,"devices":[{"index":0,"uuid":sys.argv[2],"allocatedBytes":1000,"reservedBytes":2000}]}
r=urllib.request.Request('http://127.0.0.1:%s/v1/agent'%sys.argv[1],data=json.dumps(body).encode(),headers={'content-type':'application/json'})
print('push', urllib.request.urlopen(r,timeout=5).status)
PY
}
fails=0
expect() { # WANTED-TEXT < report: prints the summary, counts a miss
  local got; got=$(summ); echo "$got"
  grep -qF -- "$1" <<<"$got" || { echo "FAIL: wanted '$1'"; fails=$((fails + 1)); }
}
pod() { # NAME PORT [ENV=VAL...]
  local name=$1 port=$2; shift 2
  env POD_NAME=$name MEMPROF_PORT=$port MEMPROF_INTERVAL=200ms "$@" $S --backend nvml >$OUT/$name.log 2>&1 &
  echo $! >$OUT/$name.pid
  sleep 3
}
echo "== A: pod requested $((N - 1)) of the $N GPUs"; pod a 19461 MEMPROF_REQUESTED_GPUS=$((N - 1))
get 19461 /v1/report | expect "GpuVisible False AmbiguousGpus"
push 19461 "$UUID"; sleep 3
echo "   after the agent named $UUID:"; get 19461 /v1/report | expect "gpus [('$UUID', 'nvml'"
echo "== B: pod requested all $N GPUs"; pod b 19462 MEMPROF_REQUESTED_GPUS=$N
get 19462 /v1/report | expect "GpuVisible True AllVisible"
echo "== C: nothing said"; pod c 19463
get 19463 /v1/report | expect "GpuVisible False AmbiguousGpus"
echo "== D: standalone"; $S --standalone --backend nvml --duration 2 --listen 127.0.0.1:19464 --output $OUT/d.json 2>$OUT/d.log; echo "exit $?"; expect "GpuVisible True AllVisible" <$OUT/d.json
for p in a b c; do kill "$(cat "$OUT/$p.pid")"; done; wait
grep -h "agent\|AgentUuids\|AmbiguousGpus" $OUT/a.log | cut -c1-300 | head -5
echo "$fails failed"
[ "$fails" = 0 ]
