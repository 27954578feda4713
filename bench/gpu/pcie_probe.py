#!/usr/bin/env python3
"""Probe: NVML's PCIe receive throughput and utilization while a GPU idles,
loads from host memory (pageable and pinned, at full speed and paced),
trains (with and without input copies), leaks on the GPU (busy and idle
300 ms a step) and keeps its inputs. One JSON line per phase: the mean
receive rate, the mean utilization and the rate memory was kept at. The
copy rule's share and utilization bound (crates/analysis/src/busy.rs) were
set on its output (docs/gpu/pcie-probe-h200.txt).

    python3 bench/gpu/pcie_probe.py      # on a GPU machine, ~2 minutes
"""
import ctypes, threading, time, json, sys
import torch

nv = ctypes.CDLL("libnvidia-ml.so.1")
nv.nvmlInit_v2()
h = ctypes.c_void_p()
nv.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h))

class Util(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]

def rx():
    v = ctypes.c_uint()
    r = nv.nvmlDeviceGetPcieThroughput(h, 1, ctypes.byref(v))  # NVML_PCIE_UTIL_RX_BYTES = 1
    return v.value * 1000 if r == 0 else None

def util():
    u = Util()
    r = nv.nvmlDeviceGetUtilizationRates(h, ctypes.byref(u))
    return u.gpu if r == 0 else None

t0 = time.perf_counter(); [rx() for _ in range(10)]; lat = (time.perf_counter() - t0) / 10
print(json.dumps({"rx_call_ms": round(lat * 1000, 2)}), flush=True)

readings = []
stop = False
def poll():
    while not stop:
        readings.append((time.time(), rx(), util(), torch.cuda.memory_reserved()))
        time.sleep(0.5)

def phase(name, fn, secs=12):
    torch.cuda.synchronize()
    a = len(readings); t = time.time(); kept = []
    while time.time() - t < secs and sum(x.numel() * x.element_size() for x in kept[-1:]) * len(kept) < 50e9:
        fn(kept)
    secs = time.time() - t
    torch.cuda.synchronize()
    b = len(readings)
    rs = [r for r in readings[a:b] if r[1] is not None]
    mrx = sum(r[1] for r in rs) / max(1, len(rs))
    mu = sum(r[2] for r in rs) / max(1, len(rs))
    grown = sum(k.numel() * k.element_size() for k in kept)
    print(json.dumps({"phase": name, "s": round(secs, 1), "rx_GBps": round(mrx / 1e9, 3), "util": round(mu, 1),
                      "kept_GBps": round(grown / secs / 1e9, 3), "rx_samples": [round(r[1] / 1e9, 2) for r in rs][:30],
                      "util_samples": [r[2] for r in rs][:30]}), flush=True)
    del kept; torch.cuda.empty_cache()

th = threading.Thread(target=poll, daemon=True); th.start()
piece = 64 * 2**20
host = torch.empty(piece // 4, dtype=torch.float32).uniform_()
pinned = torch.empty(piece // 4, dtype=torch.float32).pin_memory(); pinned.copy_(host)

def load_pageable(k):
    k.append(host.to("cuda")); torch.cuda.synchronize()
def load_pinned(k):
    k.append(pinned.to("cuda", non_blocking=True)); torch.cuda.synchronize()
def paced(rate):
    def f(k):
        t = time.time(); k.append(host.to("cuda")); torch.cuda.synchronize()
        time.sleep(max(0, piece / rate - (time.time() - t)))
    return f
W = torch.randn(8192, 8192, device="cuda")
def train(k):
    x = torch.randn(8192, 8192, device="cuda")
    for _ in range(10): x = torch.tanh(x @ W)
    torch.cuda.synchronize()
def train_inputs(k):
    x = host.to("cuda").view(-1, 8192)[:2048]
    for _ in range(10): x = torch.tanh(x @ W)
    torch.cuda.synchronize()
def train_leak(k):
    train(k); k.append(torch.empty(50 * 2**20, dtype=torch.uint8, device="cuda").fill_(1))
def idle_leak(k):
    train(k); k.append(torch.empty(50 * 2**20, dtype=torch.uint8, device="cuda").fill_(1)); time.sleep(0.3)
def keeps_inputs(k):
    x = host.to("cuda"); k.append(x)
    y = x.view(-1, 8192)[:2048]
    for _ in range(10): y = torch.tanh(y @ W)
    torch.cuda.synchronize()
def idle(k):
    time.sleep(0.2)

for name, fn in [("idle", idle), ("load_pageable_full", load_pageable), ("load_pinned_full", load_pinned),
                 ("load_paced_1GBps", paced(1e9)), ("load_paced_2.6GBps", paced(2.6e9)),
                 ("train", train), ("train_with_input_copies", train_inputs), ("train_leak", train_leak),
                 ("idle_leak_300ms", idle_leak), ("keeps_its_inputs", keeps_inputs)]:
    phase(name, fn)
stop = True
