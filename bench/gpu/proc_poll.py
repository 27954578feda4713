#!/usr/bin/env python3
"""NVML's per-process usage beside a recording (bench/gpu/record.sh): the
sidecar's verdict names a growing neighbour from it, but its trace CSV has
no per-process column, so the offline judge (`memprof analyze --evaluate`)
reads this file to see what the live sidecar saw.

    proc_poll.py OUT.csv STOPFILE [--index N] [--interval 1] [--utilization UTIL.csv]
                 [--received RX.csv]

Once a second until STOPFILE exists: `nvidia-smi --query-compute-apps`
(no pip package needed), one row per compute process, `t,index,pid,bytes`
(Unix seconds; the GPU's NVML index, as the sidecar's trace numbers it;
bytes from nvidia-smi's MiB). --index keeps one GPU's. A poll that finds no
process writes nothing; without nvidia-smi (the selftest) the file keeps its
header only.

--utilization also writes NVML's GPU utilization at each poll to UTIL.csv,
`t,index,percent` (`nvidia-smi --query-gpu=index,utilization.gpu`: the
share of the last sample period in which a kernel ran). The sidecar reads
the same counter; the judge replays it to tell memory that rises while the
GPU computes nothing (weights arriving) from a training pace.

--received also writes NVML's PCIe receive throughput at each poll to
RX.csv, `t,index,bytes_per_second` (nvmlDeviceGetPcieThroughput through
ctypes, as the sidecar reads it: NVML samples the link for 20 ms and says
KB/s). The judge replays it to tell a load from the host (bytes arriving at
the pace memory rises) from a leak made on the GPU. Without NVML the file
keeps its header only.
"""
import argparse
import ctypes
import os
import shutil
import subprocess
import time

MIB = 1 << 20


def smi(*args):
    out = subprocess.run(["nvidia-smi", *args, "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=10)
    return [[c.strip() for c in line.split(",")] for line in out.stdout.splitlines() if line.strip()]


def gpu_indices():
    return {uuid: int(index) for index, uuid in smi("--query-gpu=index,uuid")}


def poll(indices, only):
    rows = []
    for uuid, pid, used in smi("--query-compute-apps=gpu_uuid,pid,used_memory"):
        index = indices.get(uuid)
        if index is None or (only is not None and index != only) or not used.isdigit():
            continue
        rows.append((index, int(pid), int(used) * MIB))
    return rows


def poll_utilization(only):
    rows = []
    for index, pct in smi("--query-gpu=index,utilization.gpu"):
        if not (index.isdigit() and pct.isdigit()):
            continue
        if only is None or int(index) == only:
            rows.append((int(index), int(pct)))
    return rows


class Pcie:
    """NVML's PCIe receive throughput, through ctypes (no pip package)."""

    RX = 1  # NVML_PCIE_UTIL_RX_BYTES

    def __init__(self):
        self.nv = ctypes.CDLL("libnvidia-ml.so.1")
        if self.nv.nvmlInit_v2() != 0:
            raise OSError("nvmlInit failed")
        count = ctypes.c_uint()
        self.nv.nvmlDeviceGetCount_v2(ctypes.byref(count))
        self.handles = []
        for i in range(count.value):
            h = ctypes.c_void_p()
            if self.nv.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h)) == 0:
                self.handles.append((i, h))

    def poll(self, only):
        rows = []
        for index, h in self.handles:
            if only is not None and index != only:
                continue
            kb = ctypes.c_uint()
            if self.nv.nvmlDeviceGetPcieThroughput(h, self.RX, ctypes.byref(kb)) == 0:
                rows.append((index, kb.value * 1000))
        return rows


def open_pcie(path):
    """The RX.csv writer and NVML, or (writer, None) where NVML is missing."""
    if not path:
        return None, None
    f = open(path, "w")
    f.write("t,index,bytes_per_second\n")
    f.flush()
    try:
        return f, Pcie()
    except OSError:
        return f, None


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("stop")
    p.add_argument("--index", type=int, default=None)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--utilization", default=None)
    p.add_argument("--received", default=None)
    a = p.parse_args()
    rx, pcie = open_pcie(a.received)
    util = open(a.utilization, "w") if a.utilization else None
    if util:
        util.write("t,index,percent\n")
        util.flush()
    with open(a.out, "w") as f:
        f.write("t,index,pid,bytes\n")
        if not shutil.which("nvidia-smi"):
            return
        indices = gpu_indices()
        while not os.path.exists(a.stop):
            t0 = time.time()
            try:
                rows = poll(indices, a.index)
            except (subprocess.SubprocessError, OSError, ValueError):
                rows = []
            for index, pid, used in rows:
                f.write("%.3f,%d,%d,%d\n" % (t0, index, pid, used))
            f.flush()
            if util:
                try:
                    busy = poll_utilization(a.index)
                except (subprocess.SubprocessError, OSError, ValueError):
                    busy = []
                for index, pct in busy:
                    util.write("%.3f,%d,%d\n" % (t0, index, pct))
                util.flush()
            if pcie:
                for index, rate in pcie.poll(a.index):
                    rx.write("%.3f,%d,%d\n" % (t0, index, rate))
                rx.flush()
            time.sleep(max(0.0, a.interval - (time.time() - t0)))


if __name__ == "__main__":
    main()
