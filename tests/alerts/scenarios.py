"""promtool test groups for the chart's alerts, and the guarantees they pin.

Every group is evaluated once a second (the test file's
evaluation_interval: 1s; promtool evaluates every group at that step,
whatever its own `interval`), so an alert is seen at the first second its
expression holds. A real Prometheus evaluates the group every
`prometheusRule.interval` (E), at an arbitrary phase: it fires at most E
later. So "fires at least L before the OOM" is asserted as "fires by
T_oom - L - E at one-second evaluation", at every phase of the scrapes.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim import CRITICAL, CRITICAL_TTO, HEARTBEAT, MIN_WRITE_INTERVAL, SLOT, STATUS_DELAY, Rank, promtool_values, scrapes

# Sidecar analysis (1 s) plus report -> status (STATUS_DELAY).
PIPELINE = 1.0 + STATUS_DELAY
OPERATOR = {
    "namespace": "team-a",  # the Job's (honorLabels)
    "job": "memprof-metrics",  # the scrape's: the Service
    "service": "memprof-metrics",
    "endpoint": "metrics",
    "instance": "10.0.0.5:8080",
    "pod": "memprof-7c9f5d8b6-x2x9k",
    "container": "operator",
}
OOM_ALERTS = "MemprofOOMPredicted|MemprofOOMRiskCritical"


@dataclass
class Intervals:
    """What the rendered chart sets, in seconds."""

    scrape: float  # monitoring.serviceMonitor.interval
    pod_scrape: float  # monitoring.podMonitor.interval
    evaluation: float  # monitoring.prometheusRule.interval
    horizon: float  # monitoring.prometheusRule.oomPredictedMinutes * 60


# The guarantees, as docs/observability.md states them.
def critical_lead(iv: Intervals) -> float:
    """MemprofOOMRiskCritical fires at least this long before an OOM predicted on time."""
    return CRITICAL_TTO - PIPELINE - 2 * iv.scrape - iv.evaluation


def predicted_lead(iv: Intervals, first_prediction: float, heartbeat: bool = False) -> float:
    """MemprofOOMPredicted's lead when the trend is first trusted `first_prediction`
    before the OOM; `heartbeat`: the crossing did not raise the risk, so the
    report carrying it may wait for the heartbeat."""
    stale = HEARTBEAT if heartbeat else 0.0
    return min(iv.horizon, first_prediction) - stale - PIPELINE - 2 * iv.scrape - iv.evaluation


def resolve_within(iv: Intervals) -> float:
    """Both OOM alerts resolve within this of a recovery: the report saying so
    (the risk falls: at most MIN_WRITE_INTERVAL), one scrape, one evaluation."""
    return MIN_WRITE_INTERVAL + PIPELINE + iv.scrape + iv.evaluation


def observed_within(iv: Intervals) -> float:
    """MemprofGPUOOMObserved fires within this of the OOM's record in the status."""
    return PIPELINE + 2 * iv.scrape + iv.evaluation


# Expressions over the ALERTS series promtool's evaluation writes.
def alerts(alert: str, **labels: str) -> str:
    """The firing alerts whose name matches the regex `alert` (and `labels`)."""
    extra = "".join(f',{k}="{v}"' for k, v in labels.items())
    return f'ALERTS{{alertname=~"{alert}",alertstate="firing"{extra}}}'


def first_fire(alert: str, end: float, **labels: str) -> str:
    """When `alert` first fired, from 0 to `end` (no result: never)."""
    return f"min_over_time(timestamp({alerts(alert, **labels)})[{int(end)}s:1s])"


def last_fire(alert: str, end: float, **labels: str) -> str:
    return f"max_over_time(timestamp({alerts(alert, **labels)})[{int(end)}s:1s])"


def holds(condition: str, at: float) -> dict:
    """A promql test that `condition` (a filtering comparison) has a result at `at`."""
    return {"expr": f"vector(1) and on () ({condition})", "eval_time": f"{int(at)}s",
            "exp_samples": [{"labels": "{}", "value": 1}]}


def never(alert: str, until: float, **labels: str) -> dict:
    """No alert matching `alert` (and `labels`) fired from 0 to `until`."""
    return {"expr": f"count_over_time({alerts(alert, **labels)}[{int(until)}s])", "eval_time": f"{int(until)}s",
            "exp_samples": []}


def series(name: str, labels: dict, samples: list, interval: float) -> dict:
    """One input series: `samples` scraped every `interval` (sim.SLOT after each tick)."""
    body = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{body}}}", "values": promtool_values(samples, interval)}


def job_series(rank: Rank, end: float, iv: Intervals, job: str = "train") -> list[dict]:
    risk, tto = scrapes(rank, end, iv.scrape)
    labels = {**OPERATOR, "job_name": job}
    return [series("memprof_job_risk_level", labels, risk, iv.scrape),
            series("memprof_job_time_to_oom_seconds", labels, tto, iv.scrape)]


def group(input_series: list[dict], tests: list[dict], alert_tests: list | None = None) -> dict:
    g = {"interval": f"{int(SLOT * 1000)}ms", "input_series": input_series, "promql_expr_test": tests}
    if alert_tests:
        g["alert_rule_test"] = alert_tests
    return g


@dataclass
class Leak:
    """A leak whose OOM comes on time at `t_oom`; the trend is trusted from
    `first_prediction` before it; memory starts at `used` of total."""

    name: str
    used: float
    t_oom: float
    first_prediction: float
    heartbeat: bool  # the time-to-OOM crossing the horizon raises no risk level
    phases: int | None = None  # scrape phases to try (None: every whole second of one interval)

    def rank(self, phase: float) -> Rank:
        t_oom = self.t_oom + phase
        return Rank(used=self.used, leak_from=0.0, t_oom=t_oom, trusted_from=t_oom - self.first_prediction)


LEAKS = [
    # The run: a fast leak whose trend is first trusted 158 s before the OOM.
    Leak("fast leak, first prediction 158 s before the OOM", 0.6, 600.0, 158.0, heartbeat=False),
    # A slow leak seen long before: the 30-minute horizon is crossed, raising the risk to medium.
    Leak("slow leak, predicted 50 minutes ahead", 0.5, 3000.0, 2940.0, heartbeat=False, phases=3),
    # Already at 91 % (medium by level): crossing the horizon changes no
    # level, so the report carrying it may wait for the 60 s heartbeat.
    Leak("slow leak near the ceiling", 0.91, 3000.0, 3000.0, heartbeat=True, phases=3),
]


def leak_group(leak: Leak, phase: float, iv: Intervals) -> dict:
    """Both OOM alerts fire with their stated lead, and not before there is
    anything to warn about."""
    rank = leak.rank(phase)
    t_oom = rank.t_oom
    end = t_oom + 30
    predicted = predicted_lead(iv, leak.first_prediction, leak.heartbeat)
    # Before the sidecar itself says critical (by trend or by level), or
    # predicts an OOM within the horizon, nothing may fire.
    says_critical = next(t for t in range(int(end)) if rank.at(t)[0] == CRITICAL)
    predicts = next(t for t in range(int(end)) if (rank.at(t)[1] or float("inf")) < iv.horizon)
    tests = [
        holds(f'{first_fire("MemprofOOMRiskCritical", end)} <= {t_oom - critical_lead(iv) - iv.evaluation}', end),
        holds(f'{first_fire("MemprofOOMPredicted", end)} <= {t_oom - predicted - iv.evaluation}', end),
        never("MemprofOOMRiskCritical", says_critical),
        never("MemprofOOMPredicted", predicts),
        never("MemprofOperatorScrapedTooRarely", end),
    ]
    return group(job_series(rank, end, iv), tests)


def recovery_group(phase: float, iv: Intervals) -> dict:
    """A fast leak stopped (a restart with a smaller batch) after both alerts
    fired: both resolve within resolve_within()."""
    leak = LEAKS[0]
    rank = leak.rank(phase)
    rank.stop = rank.t_oom - critical_lead(iv) + 5
    end = rank.stop + 300
    bound = rank.stop + resolve_within(iv) - iv.evaluation
    tests = [
        {"expr": f"count({alerts(OOM_ALERTS)})", "eval_time": f"{int(rank.stop - 1)}s",
         "exp_samples": [{"labels": "{}", "value": 2}]},
        holds(f'{last_fire("MemprofOOMRiskCritical", end)} <= {bound}', end),
        holds(f'{last_fire("MemprofOOMPredicted", end)} <= {bound}', end),
    ]
    return group(job_series(rank, end, iv), tests)


def scraped_too_rarely_group(iv: Intervals) -> dict:
    """Prometheus scraping the operator every 2 x the configured interval:
    no window holds two scrapes, the OOM alerts cannot fire (what the guard
    is for), and MemprofOperatorScrapedTooRarely says so once the Job's
    series is 10 minutes old."""
    slow = Intervals(2 * iv.scrape, iv.pod_scrape, iv.evaluation, iv.horizon)
    leak = LEAKS[1]
    rank = leak.rank(0)
    end = rank.t_oom + 30
    tests = [never(OOM_ALERTS, end),
             holds(f'{first_fire("MemprofOperatorScrapedTooRarely", end)} <= {600 + slow.scrape + 1}', end)]
    return group(job_series(rank, end, slow), tests)


def blip_groups(iv: Intervals) -> list[dict]:
    """A condition on one scrape pages nothing; the same on two scrapes does
    (so the first test is not passing for want of data)."""
    n, at, end = 40, 20, 40 * iv.scrape
    labels = {**OPERATOR, "job_name": "train"}

    def quiet(risk_hits: dict, tto_hits: dict, steady_tto=None) -> list[dict]:
        risk = [risk_hits.get(k, 1) for k in range(n)]
        tto = [tto_hits.get(k, steady_tto) for k in range(n)]
        oom = [tto_hits.get(k) and 100.0 for k in range(n)]
        return [series("memprof_job_risk_level", labels, risk, iv.scrape),
                series("memprof_job_time_to_oom_seconds", labels, tto, iv.scrape),
                series("memprof_job_last_gpu_oom_timestamp_seconds", labels, oom, iv.scrape)]

    one = ({at: 4}, {at: 30.0})
    two = ({at: 4, at + 1: 4}, {at: 30.0, at + 1: 30.0})
    everything = "Memprof.*"
    return [
        # A quiet Job (no prediction): one scrape says critical, 30 s to OOM, and an OOM.
        group(quiet(*one), [never(everything, end)]),
        # A Job predicted 40 minutes from an OOM: one scrape says 30 s.
        group(quiet(*one, steady_tto=2400.0), [never(everything, end)]),
        # The same conditions on two scrapes in a row fire each alert.
        group(quiet(*two), [
            holds(f'{first_fire(a, end)} <= {(at + 1) * iv.scrape + 1}', end)
            for a in ("MemprofOOMRiskCritical", "MemprofOOMPredicted", "MemprofGPUOOMObserved")
        ]),
    ]


def oom_observed_group(phase: float, iv: Intervals) -> dict:
    """An OOM recorded at t_o pages within observed_within() and for 15 minutes."""
    t_o = 300 + phase
    end = t_o + 1200
    n = int(end // iv.scrape) + 1
    ts = [t_o if k * iv.scrape + SLOT >= t_o + STATUS_DELAY else None for k in range(n)]
    labels = {**OPERATOR, "job_name": "train"}
    tests = [
        holds(f'{first_fire("MemprofGPUOOMObserved", end)} <= {t_o + observed_within(iv) - iv.evaluation}', end),
        holds(f'{last_fire("MemprofGPUOOMObserved", end)} >= {t_o + 900 - iv.scrape}', end),
        holds(f'{last_fire("MemprofGPUOOMObserved", end)} < {t_o + 900}', end),
    ]
    return group([series("memprof_job_last_gpu_oom_timestamp_seconds", labels, ts, iv.scrape)], tests)


def counter(increments, end: float, interval: float) -> list[float | None]:
    """A labelled counter as scraped: absent until its first increment
    (prometheus-client creates the child then), then the running count."""
    out = []
    for k in range(int(end // interval) + 1):
        n = sum(1 for t in increments if t <= k * interval + SLOT)
        out.append(float(n) if n else None)
    return out


def remediation_group(iv: Intervals) -> dict:
    """MemprofRemediationFailed: a failure fires it for 15 minutes; a new
    operator leader (new series, same count) does not."""
    end = 3600
    n = int(end // iv.scrape) + 1
    t = [k * iv.scrape + SLOT for k in range(n)]
    failing = [1.0 if x >= 1200 else 0.0 for x in t]
    other = {**OPERATOR, "job_name": "steady", "instance": "10.0.0.6:8080", "pod": "memprof-7c9f5d8b6-b7k2m"}
    old_leader = [2.0 if x < 1800 else None for x in t]
    new_leader = [2.0 if x >= 1800 else None for x in t]
    name = "memprof_job_remediations_failed"
    s = [series(name, {**OPERATOR, "job_name": "train"}, failing, iv.scrape),
         series(name, {**OPERATOR, "job_name": "steady"}, old_leader, iv.scrape),
         series(name, other, new_leader, iv.scrape)]
    tests = [
        holds(f'{first_fire("MemprofRemediationFailed", end)} <= {1200 + iv.scrape + 1}', end),
        holds(f'{last_fire("MemprofRemediationFailed", end)} <= {1200 + 900 + iv.scrape}', end),
        never("MemprofRemediationFailed", end, job_name="steady"),
    ]
    return group(s, tests)


def task_group(iv: Intervals) -> dict:
    """MemprofOperatorTaskFailing: one end of a task is not "keeps failing",
    two in 15 minutes are, the first one counted though it created the series."""
    end = 2400
    name = "memprof_operator_task_failures_total"
    s = [series(name, {**OPERATOR, "task": "webhook"}, counter([300], end, iv.scrape), iv.scrape),
         series(name, {**OPERATOR, "task": "remediation"}, counter([300, 600], end, iv.scrape), iv.scrape)]
    tests = [
        holds(f'{first_fire("MemprofOperatorTaskFailing", end)} <= {600 + iv.scrape + 1}', end),
        holds(f'{last_fire("MemprofOperatorTaskFailing", end)} <= {300 + 900 + iv.scrape}', end),
        never("MemprofOperatorTaskFailing", end, task="webhook"),
    ]
    return group(s, tests)


def writes_group(iv: Intervals) -> dict:
    """MemprofReportWritesFailing, per sidecar pod: failing from its start;
    one transient failure; writing for 10 minutes, then only failing;
    failing from its start until a write succeeds at 300 s."""
    end, p = 1800, iv.pod_scrape
    base = {"namespace": "team-a", "job_name": "train", "container": "memprof-sidecar", "endpoint": "memprof-metrics",
            "job": "memprof-system/memprof-sidecars", "node": "gpu-node-1"}

    def pod(name: str, ip: str) -> dict:
        return {**base, "pod": name, "instance": f"{ip}:9464"}

    backoff = [30 + sum(min(60, 2 ** i) for i in range(k)) for k in range(40)]  # 1, 2, 4 ... 60 s
    heartbeats = [float(t) for t in range(0, 600 + 1, 60)]
    errs, writes = "memprof_sidecar_report_write_errors_total", "memprof_sidecar_report_writes_total"
    s = [series(errs, {**pod("train-0", "10.1.0.10"), "reason": "forbidden"}, counter(backoff, end, p), p),
         series(errs, {**pod("train-1", "10.1.0.11"), "reason": "api"}, counter([300], end, p), p),
         series(writes, {**pod("train-1", "10.1.0.11"), "reason": "heartbeat"}, counter(range(0, end, 60), end, p), p),
         series(writes, {**pod("train-2", "10.1.0.12"), "reason": "heartbeat"}, counter(heartbeats, end, p), p),
         series(errs, {**pod("train-2", "10.1.0.12"), "reason": "api"}, counter(range(610, end, 60), end, p), p),
         series(errs, {**pod("train-3", "10.1.0.13"), "reason": "forbidden"}, counter([b for b in backoff if b < 300], end, p), p),
         series(writes, {**pod("train-3", "10.1.0.13"), "reason": "first"}, counter([300], end, p), p)]

    def fired(name: str, op: str, t: float) -> dict:
        return holds(f'{first_fire("MemprofReportWritesFailing", end, pod=name)} {op} {t}', end)

    tests = [
        # Failing from the start: the first failure is at 30 s; `for: 1m`.
        fired("train-0", "<=", 30 + 2 * p + 60 + 1),
        # Failing since 610 s, the last success at 600 s: 10 minutes later, plus `for: 1m`.
        fired("train-2", ">=", 600 + 600),
        fired("train-2", "<=", 600 + 600 + 2 * p + 60 + 1),
        never("MemprofReportWritesFailing", end, pod="train-1"),
        # Resolved at the first scrape after its first successful write.
        fired("train-3", "<=", 30 + 2 * p + 60 + 1),
        holds(f'{last_fire("MemprofReportWritesFailing", end, pod="train-3")} <= {300 + p}', end),
    ]
    return group(s, tests)
