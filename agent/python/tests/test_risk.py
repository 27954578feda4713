"""on_risk(): once per escalation, in the training thread at a safe point,
never raising into training; notifyTrainer directives through the same
path, acknowledged in a later push (contract B)."""

import json
import logging
import threading

import pytest

from conftest import memprof_agent, wait_until

_reply = memprof_agent._reply
_risk = memprof_agent._risk


def verdict(level, tto=None, leak=False):
    return _reply.Verdict(level, tto=tto, leak=leak, source="agent", at=1.0)


def directive(ident, level="critical", kind="notifyTrainer", reason="policy"):
    return _reply.Directive(ident, kind, level, reason)


@pytest.fixture
def risk():
    return memprof_agent._core.RISK


def test_a_callback_runs_once_per_escalation_not_once_per_push(risk):
    calls = []
    risk.add("high", lambda e: calls.append((e.level, e.previous, e.threshold)))
    for t, level in enumerate(["low", "medium", "high", "critical", "high", "critical", "critical"]):
        risk.observe(verdict(level), now=float(t))
        risk.run_pending()
    assert calls == [("high", "medium", "high")]


def test_hysteresis_a_dip_re_arms_nothing_staying_below_re_arms(risk):
    calls = []
    risk.add("critical", lambda e: calls.append(e.level), rearm_after=60.0)
    timeline = [(0, "critical"), (10, "high"), (20, "critical"),   # a dip of 10 s: same escalation
                (30, "medium"), (80, "low"),                       # below for 50 s: not yet
                (95, "critical"),                                   # so still the same escalation
                (100, "low"), (161, "low"),                         # below for 61 s: re-armed
                (170, "critical")]                                  # a new escalation
    for t, level in timeline:
        risk.observe(verdict(level), now=float(t))
        risk.run_pending()
    assert calls == ["critical", "critical"]


def test_callbacks_run_in_the_training_thread_at_step_not_on_the_agents(fake, unix_sidecar):
    server = unix_sidecar()
    seen = []
    memprof_agent.on_risk("critical", lambda e: seen.append((threading.current_thread().name, e.step, e.tto)))
    server.verdict("critical", tto=95.0)
    memprof_agent.start(interval=0.02, socket=server.path)
    assert wait_until(lambda: memprof_agent.risk() is not None)
    assert seen == [], "nothing runs before the trainer reaches a safe point"
    memprof_agent.step(41)
    assert seen == [(threading.current_thread().name, 41, 95.0)]
    memprof_agent.step(42)
    assert len(seen) == 1


def test_safe_point_runs_them_for_loops_without_step(risk):
    seen = []
    memprof_agent.on_risk("medium", lambda e: seen.append(e.level))
    risk.observe(verdict("high"))
    assert memprof_agent.safe_point() == 1 and seen == ["high"]
    assert memprof_agent.safe_point() == 0


def test_a_raising_callback_never_reaches_training_and_is_logged_once(risk, caplog):
    caplog.set_level(logging.WARNING, logger="memprof_agent")
    after = []

    def bad(e):
        raise RuntimeError("user bug")

    memprof_agent.on_risk("high", bad, rearm_after=0.0)
    memprof_agent.on_risk("high", lambda e: after.append(e.level), rearm_after=0.0)
    for t in range(3):
        risk.observe(verdict("high"), now=3.0 * t)
        memprof_agent.step()  # must not raise
        risk.observe(verdict("low"), now=3.0 * t + 1)
        risk.observe(verdict("low"), now=3.0 * t + 2)
    assert after == ["high"] * 3, "the other callback still runs"
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 1 and "raised RuntimeError('user bug')" in logged[0]


def test_on_risk_refuses_a_level_it_does_not_know():
    with pytest.raises(ValueError):
        memprof_agent.on_risk("none", lambda e: None)
    with pytest.raises(ValueError):
        memprof_agent.on_risk("severe", lambda e: None)


def test_a_callback_on_the_agents_thread_runs_right_away(risk):
    seen = []
    memprof_agent.on_risk("high", lambda e: seen.append(threading.current_thread().name), on_agent_thread=True)
    t = threading.Thread(target=lambda: risk.observe(verdict("critical")), name="pusher")
    t.start()
    t.join()
    assert seen == ["pusher"] and not risk.pending


def test_removed_callbacks_do_not_run(risk):
    seen = []
    h = memprof_agent.on_risk("high", lambda e: seen.append(1))
    h.remove()
    risk.observe(verdict("critical"))
    memprof_agent.step()
    assert seen == []


# --- directives and acks --------------------------------------------------

def test_a_directive_runs_the_callbacks_and_is_acked_with_what_they_did(risk):
    memprof_agent.on_risk("high", lambda e: "checkpoint at step %s" % e.step)
    memprof_agent.on_risk("critical", lambda e: ("split refused: already single samples", False))
    risk.directive(directive("d-1", "critical"))
    assert risk.take_acks() == [], "no ack before the trainer acted"
    memprof_agent.step(9)
    assert risk.take_acks() == [{"id": "d-1", "action": "checkpoint at step 9; split refused: already single samples", "ok": False}]


def test_a_directive_escalates_once_like_a_verdict(risk):
    ran = []
    memprof_agent.on_risk("critical", lambda e: ran.append(e.source) or "split 16 x 1 -> 8 x 2")
    risk.observe(verdict("critical"))
    memprof_agent.step()
    risk.directive(directive("d-2", "critical"))  # the operator asks for what the rank already did
    assert ran == ["sidecar"] and not risk.pending
    assert risk.take_acks() == [{"id": "d-2", "action": "already done: split 16 x 1 -> 8 x 2", "ok": True}]


def test_directives_nobody_can_answer_are_acked_as_not_done(risk):
    risk.directive(directive("d-3", "high"))
    risk.directive(directive("d-4", "high", kind="restartRank"))
    risk.directive(directive("d-5", None))
    acks = risk.take_acks()
    assert acks == [
        {"id": "d-3", "action": "no on_risk callback at high or below", "ok": False},
        {"id": "d-4", "action": "unsupported directive kind 'restartRank'", "ok": False},
        {"id": "d-5", "action": "directive without a valid level", "ok": False},
    ]


def test_a_repeated_directive_runs_nothing_again_and_is_re_acked(risk):
    ran = []
    memprof_agent.on_risk("high", lambda e: ran.append(1) or "done")
    risk.directive(directive("d-6", "high"))
    memprof_agent.step()
    first = risk.take_acks()
    risk.directive(directive("d-6", "high"))  # the sidecar did not record the ack
    assert ran == [1] and risk.take_acks() == first


def test_acks_ride_the_next_push_and_survive_a_refused_one(fake, unix_sidecar):
    server = unix_sidecar()
    memprof_agent.on_risk("critical", lambda e: "split micro-batch 8 x 1 -> 4 x 2")
    sent = {"directive": False, "refuse": 0}

    def answer(push):
        if not sent["directive"]:
            sent["directive"] = True
            body = {"accepted": True, "verdict": {"risk": "low", "ttoSeconds": None, "leak": False, "source": "agent", "at": 1},
                    "directives": [{"id": "job-7/critical-1", "kind": "notifyTrainer", "level": "critical", "reason": "r"}]}
            return 200, json.dumps(body).encode()
        if push.get("acks") and sent["refuse"] < 1:
            sent["refuse"] += 1
            return 503, None  # the first push with the ack is refused: the ack must come again
        return 204, None

    server.answer = answer
    memprof_agent.start(interval=0.02, socket=server.path)
    assert wait_until(lambda: memprof_agent._core.RISK.pending)
    memprof_agent.step(3)
    assert wait_until(lambda: sum(1 for p in server.pushes if p.get("acks")) >= 2)
    with_acks = [p["acks"] for p in server.pushes if p.get("acks")]
    assert with_acks[0] == with_acks[1] == [{"id": "job-7/critical-1", "action": "split micro-batch 8 x 1 -> 4 x 2", "ok": True}]
    server.wait_pushes(len(server.pushes) + 3)
    assert sum(1 for p in server.pushes if p.get("acks")) == 2, "acked once accepted"


def test_acks_are_bounded(risk):
    for i in range(40):
        risk.directive(directive("x%d" % i, "high"))
    acks = risk.take_acks()
    assert len(acks) == _risk.MAX_ACKS and acks[-1]["id"] == "x39"
    assert all(len(a["action"].encode()) <= 128 for a in acks)


def test_the_ack_text_is_bounded(risk):
    memprof_agent.on_risk("high", lambda e: "é" * 500)
    risk.directive(directive("long", "high"))
    memprof_agent.step()
    (ack,) = risk.take_acks()
    assert len(ack["action"].encode("utf-8")) <= 128 and ack["ok"]
