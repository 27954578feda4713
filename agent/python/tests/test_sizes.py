"""The allocation-size pattern: a power-of-two histogram
of the live allocations' requested sizes and of the free blocks from the
allocator's snapshot, else pool counts from memory_stats(); requests per
pool since the previous reading; at most every 10 s, cost-bounded."""

import logging
import os
import sys

from conftest import closed_port, memprof_agent
from memprof_agent import _sizes

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def torch():
    return sys.modules["torch"]  # the fake, installed by the fixture


def block(size, requested=None, state="active_allocated"):
    return {"size": size, "requested_size": requested if requested is not None else size, "state": state, "frames": []}


def snapshot(fake):
    fake.snapshot = {"segments": [
        {"device": 0, "blocks": [block(512, 100)] * 300 + [block(2 * MiB, 1536 * KiB)] * 10
         + [block(20 * MiB, state="inactive"), block(3 * MiB, state="inactive")]},
        {"device": 0, "blocks": [block(1 * GiB, 1 * GiB), block(64 * MiB, 40 * MiB, state="active_pending_free")]},
        {"device": 1, "blocks": [block(4 * GiB)]},  # another device: not this histogram's
    ]}


def test_bucket_is_the_smallest_power_of_two_at_least_the_size():
    assert [_sizes.bucket(s) for s in (1, 512, 513, MiB, MiB + 1, 3 * GiB, 1 << 50)] == [
        512, 512, 1024, MiB, 2 * MiB, 4 * GiB, 1 << 40]


def test_the_snapshot_histogram_of_live_requests_and_free_blocks(fake):
    snapshot(fake)
    s = _sizes.Sizes()
    out = s.field(torch(), "sample", now=100.0)
    assert out["source"] == "snapshot" and out["device"] == 0 and out["blocks"] == 312
    assert out["buckets"] == [[512, 300], [2 * MiB, 10], [64 * MiB, 1], [GiB, 1]]
    assert out["freeBuckets"] == [[4 * MiB, 1], [32 * MiB, 1]]
    assert out["snapshotSeconds"] >= 0 and "requests" not in out  # no earlier reading to compare with


def test_requests_per_pool_since_the_previous_reading_at_most_every_10_s(fake):
    s = _sizes.Sizes("stats")
    fake.request(4 * KiB, 1000)
    first = s.field(torch(), "sample", now=100.0)
    assert first["source"] == "stats" and first["buckets"] == [[MiB, 1000], [1 << 40, 0]]
    fake.request(256, 500)
    fake.request(8 * MiB, 7)
    assert s.field(torch(), "sample", now=105.0) is first  # not due: the latest reading again
    fake.calls.clear()
    second = s.field(torch(), "sample", now=110.0)
    assert fake.calls.count("memory_stats") == 1 and "_snapshot" not in fake.calls
    assert second["requests"] == [[MiB, 500], [1 << 40, 7]] and second["seconds"] == 10.0
    assert second["buckets"] == [[MiB, 1500], [1 << 40, 7]]


def test_pool_counts_split_at_max_split_size_when_set(fake):
    fake.max_split_size = 200 * MiB
    fake.request(100 * MiB, 3)
    fake.request(300 * MiB, 2)
    fake.inactive_splits = 9
    out = _sizes.Sizes("stats").field(torch(), "sample", now=1.0)
    assert out["buckets"] == [[MiB, 0], [200 * MiB, 3], [1 << 40, 2]] and out["inactiveSplits"] == 9


def test_a_slow_snapshot_waits_longer_and_a_very_slow_one_ends_snapshots(fake, caplog, monkeypatch):
    caplog.set_level(logging.WARNING, logger="memprof_agent")
    snapshot(fake)
    clock = iter([0.0, 0.2, 10.0, 10.4])
    monkeypatch.setattr(_sizes.time, "perf_counter", lambda: next(clock))
    s = _sizes.Sizes()
    s.field(torch(), "sample", now=0.0)
    assert s.next_at == 100 * 0.2  # 200 ms: the next reading in 20 s, not 10
    out = s.field(torch(), "sample", now=20.0)
    assert out["source"] == "snapshot" and not s.snapshots  # 400 ms: over the limit, said once
    assert s.field(torch(), "sample", now=61.0)["source"] == "stats"
    assert len([r for r in caplog.records if "snapshot took 400 ms" in r.getMessage()]) == 1


def test_the_push_carries_sizes_and_an_oom_push_takes_no_snapshot_for_it(fake):
    snapshot(fake)
    memprof_agent.start(interval=60, url="http://127.0.0.1:%d/v1/agent" % closed_port())
    push = memprof_agent._agent.build("sample")
    assert push["sizes"]["source"] == "snapshot" and len(push["sizes"]["buckets"]) <= 32
    _sizes.SIZES[0].next_at = 0.0  # due again
    fake.calls.clear()
    assert memprof_agent._agent.build("oom")["sizes"] is not None
    assert "_snapshot" not in fake.calls


def test_off_and_before_cuda(fake, monkeypatch):
    assert _sizes.Sizes("off").field(torch(), "sample") is None
    fake.initialized = False
    assert _sizes.Sizes().field(torch(), "sample") is None
    assert "memory_stats" not in fake.calls and "_snapshot" not in fake.calls
    monkeypatch.setenv("MEMPROF_AGENT_SIZES", "stats")
    _sizes.configure(os.environ)
    assert _sizes.SIZES[0].mode == "stats" and not _sizes.SIZES[0].snapshots


def test_the_device_holding_the_most_memory_not_the_daemon_threads_current_one(fake):
    fake.snapshot = {"segments": [{"device": 0, "blocks": [block(MiB)]}, {"device": 1, "blocks": [block(4 * GiB)] * 3}]}
    pushed = [{"index": 0, "reservedBytes": GiB}, {"index": 1, "reservedBytes": 20 * GiB}]
    out = _sizes.Sizes().field(torch(), "sample", now=1.0, devices=pushed)
    assert out["device"] == 1 and out["buckets"] == [[4 * GiB, 3]]
