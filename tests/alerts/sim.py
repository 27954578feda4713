"""Synthetic series for the alert tests, shaped as memprof really exports them.

A rank's sidecar analyses its GPU once a second and writes its MemoryReport
under the write budget (sidecar/src/budget.rs: at once when the risk rises,
otherwise at most every 5 s when the risk falls or memory moves by 3 % of
total, and a heartbeat every 60 s). The operator rolls the newest report up
into the MemoryProfile's status within about a second (its writes are
spaced by --min-write-interval-ms, 250 ms) and exports memprof_job_* from
that status at each scrape. So the operator's time to OOM is the one of the
last report, not of the scrape: it can lag by up to a heartbeat. This module
plays that chain second by second and samples it at the chart's scrape
interval, which is what Prometheus stores.
"""

from __future__ import annotations

from dataclasses import dataclass

# The analysis thresholds' defaults (docs/observability.md, "Thresholds").
CRITICAL_TTO, HIGH_TTO, MEDIUM_TTO = 120.0, 600.0, 1800.0
CRITICAL_FRACTION, HIGH_FRACTION, MEDIUM_FRACTION = 0.98, 0.95, 0.90
# The sidecar's write budget (sidecar/src/budget.rs, Budget::default).
MIN_WRITE_INTERVAL, HEARTBEAT, CHANGE_FRACTION = 5.0, 60.0, 0.03
# Sidecar analysis (1 s) and report -> status (about 1 s): together the
# 2 s the guarantees in docs/observability.md subtract.
STATUS_DELAY = 1.0

LOW, MEDIUM, HIGH, CRITICAL = 1, 2, 3, 4


@dataclass
class Rank:
    """One rank's memory over time; fractions of total, times in seconds.

    From `leak_from` used memory grows linearly from `used` and reaches
    total at `t_oom`; the trend is trusted (a time to OOM is predicted, on
    time) from `trusted_from`. From `stop` on (a restart with a smaller
    batch) memory is back at `used`, flat. Without a leak it stays at `used`.
    """

    used: float
    leak_from: float | None = None
    t_oom: float | None = None
    trusted_from: float | None = None
    stop: float | None = None

    def at(self, t: float) -> tuple[int, float | None, float]:
        """(risk, time to OOM or None, used fraction) the sidecar concludes at t."""
        leaking = self.leak_from is not None and t >= self.leak_from and (self.stop is None or t < self.stop)
        used, tto = self.used, None
        if leaking:
            used = min(1.0, self.used + (1.0 - self.used) * (t - self.leak_from) / (self.t_oom - self.leak_from))
            if self.trusted_from is not None and t >= self.trusted_from:
                tto = max(0.0, self.t_oom - t)
        return max(level_risk(used), trend_risk(tto)), tto, used


def level_risk(used: float) -> int:
    if used >= CRITICAL_FRACTION:
        return CRITICAL
    if used >= HIGH_FRACTION:
        return HIGH
    return MEDIUM if used >= MEDIUM_FRACTION else LOW


def trend_risk(tto: float | None) -> int:
    if tto is None or tto > MEDIUM_TTO:
        return LOW
    if tto <= CRITICAL_TTO:
        return CRITICAL
    return HIGH if tto <= HIGH_TTO else MEDIUM


@dataclass
class Report:
    t: float
    risk: int
    tto: float | None
    used: float
    peak: float


def reports(rank: Rank, end: float) -> list[Report]:
    """The MemoryReport writes of one rank until `end` (budget.rs's decide)."""
    out: list[Report] = []
    peak = 0.0
    for t in range(int(end) + 1):
        risk, tto, used = rank.at(float(t))
        peak = max(peak, used)
        now = Report(float(t), risk, tto, used, peak)
        last = out[-1] if out else None
        if last is None or risk > last.risk:
            out.append(now)
            continue
        since = t - last.t
        if since < MIN_WRITE_INTERVAL:
            continue
        moved = abs(used - last.used) > CHANGE_FRACTION or abs(peak - last.peak) > CHANGE_FRACTION
        if risk < last.risk or moved or since >= HEARTBEAT:
            out.append(now)
    return out


def status_at(writes: list[Report], t: float) -> Report | None:
    """The operator's status at t: the newest report written by t - STATUS_DELAY."""
    seen = [w for w in writes if w.t <= t - STATUS_DELAY]
    return seen[-1] if seen else None


def scrapes(rank: Rank, end: float, interval: float) -> tuple[list[int | None], list[float | None]]:
    """memprof_job_risk_level and memprof_job_time_to_oom_seconds as scraped
    every `interval` (at k * interval + SLOT) until `end` (None: no sample)."""
    writes = reports(rank, end)
    risk, tto = [], []
    n = int(end // interval) + 1
    for k in range(n):
        st = status_at(writes, k * interval + SLOT)
        risk.append(st.risk if st else None)
        tto.append(round(st.tto, 1) if st and st.tto is not None else None)
    return risk, tto


# promtool's input series step. Samples are written half a step after each
# scrape tick, so that no evaluation (every whole second) falls on a sample:
# a range [t - 2S, t] that ends exactly on one holds three scrapes, which
# Prometheus almost never sees and which would hide a window one scrape
# short (it would fire only at those instants).
SLOT = 0.5


def promtool_values(samples: list, interval: float) -> str:
    """A promtool `values` string for samples scraped every `interval` s
    (whole seconds), at k * interval + SLOT: `_` where a series has no
    sample, and the stale marker Prometheus writes when a series leaves a
    scrape."""
    gap = int(round(interval / SLOT)) - 1
    assert gap >= 1 and (gap + 1) * SLOT == interval, f"scrape interval {interval} s is not a multiple of {SLOT} s"
    out, present = ["_"], False
    for v in samples:
        if v is None:
            out.append("stale" if present else "_")
            present = False
        else:
            # Never an exponent: promtool would read 1e+06 as the expansion a+b.
            out.append(("%.3f" % v).rstrip("0").rstrip(".") if isinstance(v, float) else str(v))
            present = True
        out.append(f"_x{gap}")
    return " ".join(out[:-1])
