"""The inactive split peak: read with the other peaks, handed over when a
measurement resets the peaks, and kept by the real sidecar as the highest
any push told (the recommendation's bound of what a capped allocator
cannot give back, docs/recommend.md)."""

import sys

from conftest import closed_port, memprof_agent

GiB = 1 << 30


def device_entry():
    return memprof_agent._agent.build("sample")["devices"][0]


def test_a_push_reads_the_split_peak_and_resets_it(fake):
    memprof_agent.start(interval=60, url="http://127.0.0.1:%d/v1/agent" % closed_port())
    fake.peak_split = 2 * GiB
    assert device_entry()["peakInactiveSplitBytes"] == 2 * GiB
    # The push reset the peaks: the next one covers its own interval.
    assert device_entry()["peakInactiveSplitBytes"] == fake.split


def test_a_measurement_that_resets_the_peaks_hands_the_split_peak_to_the_next_push(fake):
    memprof_agent.start(interval=60, url="http://127.0.0.1:%d/v1/agent" % closed_port())
    fake.peak_split = 3 * GiB
    memprof_agent._torchread.peak_and_reset(sys.modules["torch"], 0)
    assert fake.peak_split == fake.split, "the measurement reset the allocator's peaks"
    assert device_entry()["peakInactiveSplitBytes"] == 3 * GiB


def test_the_split_peak_never_exceeds_the_reserved_peak_in_a_push(fake):
    memprof_agent.start(interval=60, url="http://127.0.0.1:%d/v1/agent" % closed_port())
    fake.peak_split = 64 * GiB  # read without the allocator's lock across keys
    d = device_entry()
    assert d["peakInactiveSplitBytes"] == d["peakReservedBytes"]


def test_the_sidecar_reports_the_highest_split_peak_any_push_told(sidecar, fake):
    assert memprof_agent.start(interval=0.05, socket=sidecar.socket)
    fake.peak_split = 2 * GiB
    memprof_agent._agent.tick()
    memprof_agent.step(7)
    report = sidecar.wait_report(lambda r: (r.get("allocator") or {}).get("step") == 7)
    assert report["allocator"]["peakInactiveSplitBytes"] == 2 * GiB
