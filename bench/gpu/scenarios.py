#!/usr/bin/env python3
"""Trainer scenarios for bench/gpu/record.sh: real PyTorch training
of train.py's GPT, shaped by options into the memory patterns memprof must
judge. One process per scenario (the caching allocator's pools of one never
pollute another's). Options combine:

  --leak-mbps R --leak-at S       a paced leak: from S s after the start, R MB/s
                                  of GPU tensors kept alive (train.py's way);
  --empty-cache-every S           torch.cuda.empty_cache() between two steps every S s;
  --batch-schedule 0:4,20:8       the batch size grows at these seconds (no leak);
  --eval-every S --eval-at S0     an evaluation pass (--eval-batches of --eval-batch)
                                  every S s from S0, under torch.no_grad();
  --keep-eval-graph               the validation-loss leak: the eval pass runs
                                  without torch.no_grad() and its mean loss is kept
                                  as a tensor, so each pass keeps its forwards'
                                  activations (the pass is the leak; it starts at --leak-at);
  --headroom-gb H | --fill-pct P | --life S
                                  after the warm-up, a ballast leaves H GB free,
                                  or fills the GPU to P %, or leaves what the leak
                                  needs to reach the OOM about S s after it starts.

Pre-warm: with --go-file, the process imports torch (the agent's startup hook
starts the agent then), writes --ready-file, and waits for the go file before
it touches CUDA; record.sh starts the next scenario's process this way while
the current one runs, so no scenario pays for the import.

Writes the per-step log `t,step,step_ms,allocated,reserved,max_reserved,
dev_used` (train.py's columns; Unix seconds, bytes) plus `batch,kept,phase`
(the batch size, the leaked bytes held, `train` or `eval` for a row per eval
batch), and a JSON summary (train.py's keys plus the leak's exact start, its
target and measured rate, the ballast, eval passes, empty_cache calls, batch
changes), written at the leak's start too, so a process killed at its budget
still leaves the truth. A CUDA OOM is recorded, then propagates (exit 1 with
the traceback), as in a real trainer. The agent resets the allocator's peak
statistics at every push, so `max_reserved` covers about one push interval.
"""
import time

T_PROCESS = time.time()

import argparse  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402

# Imported by load_torch() once the arguments are checked, so that
# `--parse-only` (record.sh --plan) needs no torch.
torch = F = GPT = causes = None
T_IMPORTED = None
MB = 1_000_000
GB = 1_000_000_000
MAX_EVENTS = 1000  # per list in the summary


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--name", required=True, help="scenario name (goes into the summary)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--duration", type=float, default=60, help="seconds of training at most (from the go)")
    p.add_argument("--d-model", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--peak-every", type=int, default=10, help="every N steps a 2x longer sequence (0: never)")
    p.add_argument("--batch-schedule", default="8", help="BATCH or T:BATCH,T:BATCH,... (seconds from the start)")
    p.add_argument("--warmup-steps", type=int, default=0, help="steps before the ballast (default 2 peak cycles, at least 10)")
    p.add_argument("--leak-mbps", type=float, default=0.0, help="paced leak, MB/s (1e6 B)")
    p.add_argument("--leak-at", type=float, default=6.0, help="seconds from the start to the leak (paced or eval graph)")
    p.add_argument("--empty-cache-every", type=float, default=0.0)
    p.add_argument("--eval-every", type=float, default=0.0)
    p.add_argument("--eval-at", type=float, default=None, help="first eval pass (default --eval-every; --keep-eval-graph: --leak-at)")
    p.add_argument("--eval-batches", type=int, default=4)
    p.add_argument("--eval-batch", type=int, default=8)
    p.add_argument("--eval-seq", type=int, default=0, help="default --seq")
    p.add_argument("--keep-eval-graph", action="store_true", help="the validation-loss leak")
    p.add_argument("--cause", default="", help="the summary's cause (default: leak with a leak, else steady)")
    p.add_argument("--demand-mbps", type=float, default=0.0,
                   help="growing demand: from --leak-at the sequence length ramps so the peak demand rises R MB/s")
    p.add_argument("--max-seq", type=int, default=0, help="longest sequence of the ramp (the model's positions)")
    p.add_argument("--accumulation", type=int, default=0,
                   help="micro-batches per optimizer step through memprof_agent.MicroBatchLoop (0: no loop)")
    p.add_argument("--split-helper", action="store_true",
                   help="the loop acts on the sidecar's verdict (checkpoint on high, split on critical)")
    p.add_argument("--neighbour-mbps", type=float, default=0.0,
                   help="a second process grows R MB/s from --leak-at until the card is full")
    p.add_argument("--fragment", action="store_true",
                   help="from --leak-at, reserved-but-unallocated memory grows (pace from --life) to the OOM")
    p.add_argument("--fragment-tick", type=float, default=0.5,
                   help="seconds between the fragmenter's segments (its pace times this, each)")
    p.add_argument("--fragment-one-keeper", action="store_true",
                   help="pin each segment with one 1 MiB block, not a block per 48 MiB: no leak beside it")
    p.add_argument("--spikes", default="", help="T:FRAC,...: at T s take FRAC of the free memory at once")
    p.add_argument("--varlen", default="", help="LO:HI: each step's sequence uniform in [LO, HI] x --seq")
    room = p.add_mutually_exclusive_group()
    room.add_argument("--headroom-gb", type=float, default=0.0, help="leave this much free after a ballast")
    room.add_argument("--fill-pct", type=float, default=0.0, help="ballast up to this %% of the GPU")
    room.add_argument("--life", type=float, default=0.0, help="ballast so the leak reaches the OOM about S s after it starts")
    p.add_argument("--ballast-mbps", type=float, default=0.0,
                   help="place the ballast at R MB/s in 256 MB pieces, no step meanwhile (weights loading)")
    p.add_argument("--ballast-from-host", action="store_true",
                   help="with --ballast-mbps, each piece is copied from host memory (a weights load: copies, no kernel)")
    p.add_argument("--step-sleep", type=float, default=0.0,
                   help="seconds idle after each step (an input-bound trainer: a low utilization)")
    p.add_argument("--go-file", default="", help="after the imports, wait for this file before touching CUDA")
    p.add_argument("--ready-file", default="", help="written once the imports are done")
    p.add_argument("--go-timeout", type=float, default=900.0)
    p.add_argument("--parse-only", action="store_true", help="check the arguments, print them as JSON, exit")
    p.add_argument("--step-log", default="")
    p.add_argument("--summary-json", default="")
    a = p.parse_args(argv)
    a.schedule = parse_schedule(a.batch_schedule)
    a.eval_seq = a.eval_seq or a.seq
    if a.eval_at is None:
        a.eval_at = a.leak_at if a.keep_eval_graph else a.eval_every
    if a.keep_eval_graph and a.eval_every <= 0:
        p.error("--keep-eval-graph needs --eval-every")
    grows = a.leak_mbps or a.keep_eval_graph or a.demand_mbps or a.neighbour_mbps or a.fragment
    if a.life and not grows:
        p.error("--life needs something that grows (a leak, --demand-mbps, --neighbour-mbps or --fragment)")
    if a.fragment and not a.life:
        p.error("--fragment needs --life (its pace is the free memory over the life)")
    if a.split_helper and not a.accumulation:
        p.error("--split-helper needs --accumulation")
    a.cause = a.cause or default_cause(a)
    if a.demand_mbps:
        a.max_seq = max(a.max_seq or 16 * a.seq, 2 * a.seq)
    a.max_seq = max(a.max_seq, 2 * a.seq if a.peak_every else a.seq, a.eval_seq, varlen_max(a))
    if not a.warmup_steps:
        a.warmup_steps = max(2 * a.peak_every, 10)
    return a


def default_cause(a):
    if a.leak_mbps or a.keep_eval_graph:
        return "leak"
    for flag, cause in ((a.demand_mbps, "growingDemand"), (a.neighbour_mbps, "neighbour"),
                        (a.fragment, "fragmentation"), (a.spikes, "spike"), (a.varlen, "varlen"),
                        (a.empty_cache_every, "churn")):
        if flag:
            return cause
    return "steady"


def varlen_max(a):
    return int(float(a.varlen.partition(":")[2]) * a.seq) if a.varlen else 0


def parse_schedule(text):
    """`8` or `0:4,20:8` -> [(0.0, 4), (20.0, 8)], sorted, starting at 0."""
    out = []
    for part in text.split(","):
        t, _, b = part.strip().rpartition(":")
        out.append((float(t) if t else 0.0, int(b)))
    out.sort()
    if not out or out[0][0] != 0.0 or any(b <= 0 for _, b in out):
        raise SystemExit("--batch-schedule must start at 0 with positive batch sizes: %r" % text)
    return out


def batch_at(schedule, elapsed):
    return [b for t, b in schedule if t <= elapsed][-1]


class Record:
    """What the summary says; holds no tensors (a process that dies of an
    OOM frees its tensors as a real trainer does, not because of us)."""

    def __init__(self, a):
        self.a = a
        self.s = {
            "rank": 0, "scenario": a.name, "seed": a.seed,
            "model": {"dModel": a.d_model, "layers": a.layers, "heads": a.heads, "seq": a.seq, "vocab": a.vocab,
                      "peakEvery": a.peak_every},
            "batchSchedule": a.schedule, "processStart": T_PROCESS, "importedAt": T_IMPORTED,
            "torchVersion": torch.__version__, "cudaVersion": getattr(getattr(torch, "version", None), "cuda", None),
            "start": None, "device": None, "cudaReadyAt": None, "warmupDoneAt": None, "ballastAt": None,
            "ballastBytes": 0, "headroomBytes": None, "freeAfterWarmupBytes": None,
            "leakKind": "eval-graph" if a.keep_eval_graph else ("paced" if a.leak_mbps else None),
            "leakFrom": None, "leakMBps": a.leak_mbps, "leakMeasuredMBps": None, "keptBytes": 0,
            "probePassBytes": None, "lifeTarget": a.life or None,
            "emptyCacheEvery": a.empty_cache_every or None, "emptyCacheAt": [],
            "evalPasses": [], "batchChanges": [], "oomAt": None, "oomMessage": "",
            "steps": 0, "stepMsMedian": None, "exit": None, "end": None,
            "cause": a.cause, "causeFrom": None, "allocConf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
            "demandMBps": a.demand_mbps or None, "bytesPerToken": None, "seqAt": [],
            "accumulation": a.accumulation or None, "splitHelper": a.split_helper, "splitAt": [],
            "samplesPerStep": [], "neighbour": None, "fragmentMBps": None, "fragmentSegments": 0, "fragmentKeptMBps": None,
            "spikesAt": [],
        }
        self.step_ms = []
        self.log = None
        if a.step_log:
            self.log = open(a.step_log, "w")
            self.log.write("t,step,step_ms,allocated,reserved,max_reserved,dev_used,batch,kept,phase,seq\n")
        self._flushed = time.time()

    def row(self, step, ms, batch, kept, phase, seq=0):
        """One log line; the allocator's numbers from one memory_stats() call."""
        if not self.log:
            return
        st = torch.cuda.memory_stats()
        free, total = torch.cuda.mem_get_info()
        now = time.time()
        self.log.write(
            f"{now:.3f},{step},{ms:.3f},{st.get('allocated_bytes.all.current', 0)},"
            f"{st.get('reserved_bytes.all.current', 0)},{st.get('reserved_bytes.all.peak', 0)},"
            f"{total - free},{batch},{kept},{phase},{seq}\n"
        )
        if now - self._flushed >= 1.0:  # a hard kill loses at most a second
            self.log.flush()
            self._flushed = now

    def note(self, key, value):
        lst = self.s[key]
        if len(lst) < MAX_EVENTS:
            lst.append(value)

    def write(self):
        if self.a.summary_json:
            tmp = self.a.summary_json + ".tmp"
            with open(tmp, "w") as f:
                json.dump(self.s, f, indent=1)
            os.replace(tmp, self.a.summary_json)

    def finish(self, exit_kind):
        s = self.s
        s["exit"] = s["exit"] or exit_kind
        s["end"] = time.time()
        if self.step_ms:
            s["stepMsMedian"] = sorted(self.step_ms)[len(self.step_ms) // 2]
        if s["leakFrom"] and s["keptBytes"]:
            until = s["oomAt"] or s["end"]
            s["leakMeasuredMBps"] = round(s["keptBytes"] / MB / max(until - s["leakFrom"], 1e-3), 3)
        if torch.cuda.is_initialized():
            s["maxMemoryReserved"] = torch.cuda.max_memory_reserved()
            s["maxMemoryAllocated"] = torch.cuda.max_memory_allocated()
            s["totalBytes"] = torch.cuda.mem_get_info()[1]
        if self.log:
            self.log.close()
            self.log = None
        self.write()


class Trainer:
    """The training loop; every tensor of the run lives here."""

    def __init__(self, a, rec):
        self.a, self.rec = a, rec
        torch.manual_seed(a.seed)
        self.dev = torch.device("cuda", 0)
        torch.cuda.set_device(self.dev)
        rec.s["cudaReadyAt"] = time.time()
        rec.s["device"] = torch.cuda.get_device_properties(0).name
        self.model = GPT(a.vocab, a.d_model, a.layers, a.heads, a.max_seq).to(self.dev)
        rec.s["model"]["params"] = sum(p.numel() for p in self.model.parameters())
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=3e-4, fused=True)
        self.gen = torch.Generator(device=self.dev).manual_seed(a.seed + 1)
        self.leak = []          # the paced leak's tensors
        self.val_history = []   # eval losses: floats, or (the bug) tensors with graphs
        self.ballast = None
        self.kept = 0
        self.step = 0
        self.batch = a.schedule[0][1]
        self.leak_t0 = None     # the paced leak's origin: kept = rate x (t - leak_t0)
        self.next_eval = a.eval_at if a.eval_every > 0 else math.inf
        self.next_empty = a.empty_cache_every if a.empty_cache_every > 0 else math.inf
        self.causes_init(a)

    def causes_init(self, a):
        """The causes other than a leak (causes.py); all but the neighbour
        wait for the warm-up and --leak-at."""
        self.ramp = causes.DemandRamp(a.seq, a.max_seq) if a.demand_mbps else None
        self.varlen = causes.VarLen(a.seq, a.varlen, a.seed) if a.varlen else None
        self.spikes = causes.Spikes(a.spikes) if a.spikes else None
        path = (a.summary_json or a.name) + ".neighbour.json"
        self.neighbour = causes.Neighbour(path) if a.neighbour_mbps else None
        self.fragmenter = None
        self.cause_started = False
        self.demand_rise = 0
        self.mb_loop = None
        if a.accumulation:
            import memprof_agent
            self.mb_loop = memprof_agent.MicroBatchLoop(accumulation=a.accumulation, register=a.split_helper)

    def tokens(self, batch, seq):
        return torch.randint(0, self.a.vocab, (batch, seq + 1), device=self.dev, generator=self.gen)

    def loss_of(self, x):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = self.model(x[:, :-1])
            return F.cross_entropy(logits.float().view(-1, self.a.vocab), x[:, 1:].reshape(-1))

    def seq_for_step(self):
        a = self.a
        if self.ramp:
            return self.ramp.seq_at(time.time())
        if self.varlen:
            return self.varlen.next()
        return 2 * a.seq if a.peak_every and self.step % a.peak_every == a.peak_every - 1 else a.seq

    def train_step(self, seq=None):
        seq = seq or self.seq_for_step()
        t0 = time.perf_counter()
        samples = self.backward(seq)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
        self.rec.step_ms.append(ms)
        self.rec.row(self.step, ms, self.batch, self.kept, "train", seq)
        self.step += 1
        self.rec.s["steps"] = self.step
        if self.mb_loop:
            self.note_loop(samples, seq)

    def backward(self, seq):
        """One optimizer step's gradients; returns the samples it saw. With
        --accumulation, through MicroBatchLoop (which splits each micro-batch
        once the sidecar says critical, with --split-helper)."""
        if not self.mb_loop:
            self.loss_of(self.tokens(self.batch, seq)).backward()
            return self.batch
        samples = 0
        for _ in range(self.a.accumulation):
            for part in self.mb_loop.parts(self.tokens(self.batch, seq)):
                part.backward(self.loss_of(part.data))
                samples += part.data.shape[0]
        assert self.mb_loop.step_due()
        return samples

    def note_loop(self, samples, seq):
        s = self.rec.s
        if samples not in s["samplesPerStep"]:
            s["samplesPerStep"].append(samples)
        factor = self.mb_loop.factor
        if factor != (s["splitAt"][-1][1] if s["splitAt"] else 1):
            self.rec.note("splitAt", [round(time.time(), 3), factor, self.step, seq])
            self.rec.write()

    def eval_pass(self, keep_graph, probe=False):
        """One evaluation pass; returns the bytes it left allocated. With
        keep_graph (the bug) the mean loss is kept as a tensor whose graph
        holds every eval forward's activations. A probe pass (warm-up) only
        measures that: its loss is dropped, the memory goes back to the cache."""
        a = self.a
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        t0 = time.time()
        self.model.eval()
        losses = []
        phase = "probe" if probe else "eval"
        with contextlib.nullcontext() if keep_graph else torch.no_grad():
            for _ in range(a.eval_batches):
                b0 = time.perf_counter()
                losses.append(self.loss_of(self.tokens(a.eval_batch, a.eval_seq)))
                torch.cuda.synchronize()
                held = torch.cuda.memory_allocated() - before if keep_graph and not probe else 0
                self.rec.row(self.step, (time.perf_counter() - b0) * 1e3, a.eval_batch, self.kept + held, phase)
        val = torch.stack(losses).mean()
        del losses
        self.model.train()
        torch.cuda.synchronize()
        delta = torch.cuda.memory_allocated() - before
        if probe:
            return delta
        self.val_history.append(val if keep_graph else val.item())
        if keep_graph:
            self.kept += delta
            self.rec.s["keptBytes"] = self.kept
        self.rec.note("evalPasses", [round(t0, 3), round(time.time(), 3), delta])
        return delta

    def headroom_for(self, free, total, probe):
        """Bytes to leave free after the ballast, or None for no ballast."""
        a = self.a
        if a.headroom_gb:
            return a.headroom_gb * GB
        if a.fill_pct:
            return total * (1 - a.fill_pct / 100.0)
        if not a.life or a.neighbour_mbps or a.fragment:
            return None  # the neighbour and the fragmenter size themselves at the cause's start
        if a.demand_mbps:
            return max(a.demand_mbps * MB * a.life - self.demand_rise, 0)
        if a.keep_eval_graph:
            # The probe pass's memory is back in the cache: about one pass of
            # slack, so the pass at `life` is the first one that cannot fit.
            return max(a.life / a.eval_every - 0.5, 1.0) * probe
        # The OOM comes when the leak has taken what was free, less part of
        # the largest request (the fp32 logits of the longest step), which a
        # split cache may no longer serve.
        seq = 2 * a.seq if a.peak_every else a.seq
        largest = max(b for _, b in a.schedule) * seq * a.vocab * 4
        return a.leak_mbps * MB * a.life + 0.5 * largest

    def place_ballast(self):
        """After the warm-up (the cache holds the peak working set): what is
        still free is what a leak can take; a ballast takes all but the
        headroom."""
        a, s = self.a, self.rec.s
        torch.cuda.synchronize()
        s["warmupDoneAt"] = time.time()
        probe = None
        if a.keep_eval_graph:
            probe = self.eval_pass(True, probe=True)
            s["probePassBytes"] = probe
            torch.cuda.synchronize()
        if self.ramp:
            self.measure_demand()
        free, total = torch.cuda.mem_get_info()
        s["freeAfterWarmupBytes"] = free
        want = self.headroom_for(free, total, probe)
        if want is not None:
            size = int(free - want)
            if size > 0 and a.ballast_mbps:
                self.ballast = self.load_ballast(size, a.ballast_mbps)
                s["ballastBytes"] = size
            elif size > 0:
                self.ballast = torch.empty(size, dtype=torch.uint8, device=self.dev)
                self.ballast.fill_(1)
                s["ballastBytes"] = size
            torch.cuda.synchronize()
            s["ballastAt"] = time.time()
            s["headroomBytes"] = torch.cuda.mem_get_info()[0]
        self.rec.write()

    def load_ballast(self, size, mbps):
        """The ballast as weights arrive from a disk: 256 MB pieces at
        `mbps`, nothing else running meanwhile (a legitimate climb from
        idle that ends below the card)."""
        piece, pieces, t0 = 256 * MB, [], time.time()
        self.rec.s["ballastFrom"] = t0
        host = torch.ones(piece, dtype=torch.uint8) if self.a.ballast_from_host else None
        while size > 0:
            n = min(piece, size)
            if host is None:
                pieces.append(torch.ones(n, dtype=torch.uint8, device=self.dev))
            else:
                pieces.append(torch.empty(n, dtype=torch.uint8, device=self.dev).copy_(host[:n]))
            size -= n
            torch.cuda.synchronize()
            due = t0 + (sum(x.numel() for x in pieces) / (mbps * MB))
            time.sleep(max(0.0, due - time.time()))
        return pieces

    def measure_demand(self):
        """What one more position of the micro-batch costs at the peak: a
        step at --seq and one at twice that. The cache then holds the longer
        step's blocks: the rise the ballast need not leave room for."""
        a, s = self.a, self.rec.s
        peaks = [self.peak_of(a.seq), self.peak_of(2 * a.seq)]
        if peaks[1] <= peaks[0]:
            raise SystemExit("growing demand: a step at 2x --seq peaked no higher (%s): no pace to set" % peaks)
        s["bytesPerToken"] = (peaks[1] - peaks[0]) / a.seq
        self.demand_rise = peaks[1] - peaks[0]

    def peak_of(self, seq, tries=3):
        """A step's allocated peak: the largest of `tries` (the agent resets
        the peak statistics at each push, which can only lower one reading)."""
        peak = 0
        for _ in range(tries):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.train_step(seq)
            peak = max(peak, torch.cuda.max_memory_allocated())
        return peak

    def start_cause(self, now, el):
        """Once, after the warm-up and --leak-at: the ramp, the neighbour or
        the fragmenter begins."""
        a, s = self.a, self.rec.s
        if self.cause_started or not self.leak_may_start(el):
            return
        self.cause_started = True
        if self.ramp:
            self.ramp.start(now, s["bytesPerToken"], a.demand_mbps)
            s["causeFrom"] = now
        if self.neighbour:
            self.begin_neighbour()
        if a.fragment:
            torch.cuda.synchronize()
            mbps = torch.cuda.mem_get_info()[0] / MB / a.life
            self.fragmenter = causes.Fragmenter(torch, self.dev, time.time(), mbps,
                                                tick=a.fragment_tick, one_keeper=a.fragment_one_keeper)
            s["fragmentMBps"], s["causeFrom"] = round(mbps, 1), self.fragmenter.t0
        self.rec.write()

    def begin_neighbour(self):
        """The second process takes all but what its growth needs for --life."""
        a, s = self.a, self.rec.s
        if not self.neighbour.ready():
            s["neighbour"] = {"error": "the neighbour process did not start"}
            return
        torch.cuda.synchronize()
        free = torch.cuda.mem_get_info()[0]
        self.neighbour.begin(max(int(free - a.neighbour_mbps * MB * a.life), 0), a.neighbour_mbps)
        s["causeFrom"] = time.time()

    def other_causes(self, now, el):
        """The fragmenter's pace and the spikes, between two steps."""
        s = self.rec.s
        self.start_cause(now, el)
        if self.fragmenter and self.fragmenter.due(now):
            self.fragmenter.step(now)
            s["fragmentSegments"] = len(self.fragmenter.streams)
            # The keepers' own leak, so a judge can tell whether the run leaked.
            s["fragmentKeptMBps"] = round(self.fragmenter.kept / MB / max(now - self.fragmenter.t0, 1.0), 3)
        if self.spikes and self.spikes.due(el):
            n = self.spikes.take(torch, self.dev)
            self.rec.note("spikesAt", [round(time.time(), 3), n])
            s["causeFrom"] = s["causeFrom"] or now

    def close(self):
        """The neighbour stopped; its record into the summary. The card full
        is an OOM on the device even when the trainer got through it."""
        s = self.rec.s
        if not (self.neighbour and self.neighbour.started):
            if self.neighbour:
                self.neighbour.stop()
            return
        n = self.neighbour.stop()
        s["neighbour"] = n
        s["causeFrom"] = n.get("from") or s["causeFrom"]
        full = n.get("fullAt")
        if full and (s["oomAt"] is None or full < s["oomAt"]):
            s["oomAt"], s["oomBy"] = full, "neighbour"

    def leak_may_start(self, el):
        s = self.rec.s
        return el >= self.a.leak_at and s["warmupDoneAt"] is not None

    def pace_leak(self, now, el):
        """Keeps `rate x (now - leak start)` bytes alive, in tensors of at
        least 1 MiB: what a list of losses with graphs, a growing cache or a
        metrics buffer on the GPU does."""
        a, s = self.a, self.rec.s
        if not a.leak_mbps:
            return
        if self.leak_t0 is None:
            if not self.leak_may_start(el):
                return
            self.leak_t0 = now
            s["leakFrom"] = now
            self.rec.write()
        want = int(a.leak_mbps * MB * (now - self.leak_t0))
        if want - self.kept >= 1 << 20:
            n = want - self.kept
            self.leak.append(torch.ones(n, dtype=torch.uint8, device=self.dev))
            self.kept += n
            s["keptBytes"] = self.kept

    def maybe_eval(self, now, el):
        a, s = self.a, self.rec.s
        if el < self.next_eval:
            return
        if a.keep_eval_graph:
            if not self.leak_may_start(el):
                return
            if s["leakFrom"] is None:
                s["leakFrom"] = now
                self.rec.write()
        self.eval_pass(a.keep_eval_graph)
        while self.next_eval <= time.time() - s["start"]:
            self.next_eval += a.eval_every

    def loop(self):
        a, s = self.a, self.rec.s
        while True:
            now = time.time()
            el = now - s["start"]
            if el >= a.duration:
                return "duration"
            if self.step == a.warmup_steps and s["warmupDoneAt"] is None:
                self.place_ballast()
            b = batch_at(a.schedule, el)
            if b != self.batch:
                self.batch = b
                self.rec.note("batchChanges", [round(now, 3), b])
            self.pace_leak(now, el)
            self.other_causes(now, el)
            if el >= self.next_empty:
                torch.cuda.empty_cache()
                self.rec.note("emptyCacheAt", round(time.time(), 3))
                while self.next_empty <= el:
                    self.next_empty += a.empty_cache_every
            self.maybe_eval(now, el)
            self.train_step()
            if a.step_sleep:
                torch.cuda.synchronize()
                time.sleep(a.step_sleep)


def load_torch():
    global torch, F, GPT, T_IMPORTED
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from train import GPT
    global causes
    import causes
    T_IMPORTED = time.time()


def wait_for_go(a):
    """Waits for the go file; a line `duration=S` in it shortens the run
    (record.sh does that when the set's deadline is near)."""
    deadline = time.time() + a.go_timeout
    while not os.path.exists(a.go_file):
        if time.time() > deadline:
            raise SystemExit("no go file %s after %.0f s" % (a.go_file, a.go_timeout))
        time.sleep(0.02)
    for line in open(a.go_file):
        key, _, value = line.strip().partition("=")
        if key == "duration" and value:
            a.duration = min(a.duration, float(value))


def _terminated(signum, frame):
    raise SystemExit(128 + signum)


def main():
    a = parse()
    if a.parse_only:
        print(json.dumps({k: v for k, v in vars(a).items() if k != "parse_only"}))
        return
    load_torch()
    if a.ready_file:
        with open(a.ready_file, "w") as f:
            f.write("%.3f\n" % time.time())
    if a.go_file:
        wait_for_go(a)
    rec = Record(a)
    rec.s["start"] = time.time()
    signal.signal(signal.SIGTERM, _terminated)  # record.sh's budget: the summary still gets written
    kind = "error"
    tr = None
    try:
        tr = Trainer(a, rec)
        kind = tr.loop()
    except torch.OutOfMemoryError as e:
        rec.s["oomAt"], rec.s["oomBy"] = time.time(), "trainer"
        rec.s["oomMessage"] = str(e).splitlines()[0][:300]
        kind = "oom"
        raise  # as a real trainer dies: traceback, exit 1
    except SystemExit:
        kind = "terminated"
        raise
    finally:
        if tr is not None:
            tr.close()
        if a.cause == "leak":
            rec.s["causeFrom"] = rec.s["leakFrom"]
        rec.finish(kind)
        print(json.dumps({k: v for k, v in rec.s.items() if not isinstance(v, list)}), flush=True)


if __name__ == "__main__":
    main()
