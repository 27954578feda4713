#!/usr/bin/env bash
# What NVML says about MIG on this machine, and what memprof does with it.
# Self-checking: exits non-zero if the sidecar would report a
# MIG-enabled GPU's memory as a pod's. On a GPU without MIG mode (the lab's
# H100) it records that NVML says so and that every GPU is sampled whole.
#
#   bench/gpu/mig_probe.sh OUTDIR
#
# Needs the release binaries: cargo build --release -p memprof-sidecar
# --example nvml_probe (target/release/{memprof-sidecar,examples/nvml_probe}).
set -euo pipefail
OUT=${1:?usage: mig_probe.sh OUTDIR}
PROBE=${PROBE:-target/release/examples/nvml_probe}
SIDECAR=${SIDECAR:-target/release/memprof-sidecar}
mkdir -p "$OUT"

# NVML's view (mode, instances and their memory) and discovery's verdict,
# for a pod requesting as many GPUs as NVML sees, then one (the single
# strategy's "one nvidia.com/gpu"). nvml_probe exits 1 if discovery would
# sample a MIG-enabled GPU.
"$PROBE" mig >"$OUT/mig.json"
"$PROBE" mig --requested 1 >"$OUT/mig-requested-1.json"

# The sidecar itself, over NVML for 3 s, as `memprof profile` runs it.
"$SIDECAR" --standalone --backend nvml --duration 3 --listen 127.0.0.1:0 \
  --output "$OUT/sidecar-report.json" >"$OUT/sidecar.events.jsonl" 2>"$OUT/sidecar.log"

python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
probe = json.load(open(f"{out}/mig.json"))
report = json.load(open(f"{out}/sidecar-report.json"))
mig = {g["uuid"] for g in probe["listed"] if g["mig"]}
reported = {g["uuid"] for g in report["gpus"]}
visible = next(c for c in report["conditions"] if c["type"] == "GpuVisible")
summary = {
    "gpus": len(probe["listed"]),
    "migEnabled": sorted(mig),
    "migModes": [g["migMode"] for g in probe["gpus"]],
    "sidecarReported": sorted(reported),
    "gpuVisible": {k: visible[k] for k in ("status", "reason", "message")},
}
print(json.dumps(summary, indent=1))
assert not (mig & reported), f"MIG-enabled GPU(s) reported as the pod's: {mig & reported}"
if mig and not reported - mig:
    assert visible["reason"] == "MigUnsupported", visible
if not mig:
    assert reported == {g["uuid"] for g in probe["listed"]}, "no MIG: every GPU is sampled whole"
print("mig_probe: ok")
PY
