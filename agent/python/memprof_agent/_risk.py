"""on_risk(): the trainer's callbacks, run once per escalation of the
sidecar's verdict (or an operator's notifyTrainer directive) to their level
or above, in the training thread at a safe point.

Why a safe point and not the agent's thread: a callback changes what the
training loop does (batch split, checkpoint), which is only consistent
between two steps, and the agent's thread must never touch the model while
the trainer runs a step (no lock is shared with training, so nothing here
can deadlock it). The agent's thread only queues; step() (one deque length
check when nothing is queued) or safe_point() runs what is queued.

Hysteresis: a handler fires when the level reaches its own from below,
then not again until the verdict has stayed below its level for
`rearm_after` seconds (a one-push dip, which the sidecar's level may show,
re-arms nothing). A directive escalates like a verdict but never
de-escalates (only verdicts say the risk went down).

Directives are acknowledged in a later push with what the callbacks did
(docs/agent-wire.md "Directives and acks")."""

import collections
import threading
import time
import weakref

from ._config import Once
from ._reply import LEVELS, RANK


DEFAULT_REARM_SECONDS = 60.0
MAX_ACKS = 16
MAX_ACTION = 128
MAX_SEEN_DIRECTIVES = 64
MAX_ACTIONS_KEPT = 32


class RiskEvent:
    """What a callback gets. level: the level reached; threshold: the
    callback's own level; previous: the verdict's level before; source:
    'sidecar' (a verdict) or 'operator' (a notifyTrainer directive);
    reason; tto (seconds to the predicted OOM or None); leak; directive
    (its id, or None); step (the trainer's step() number when it runs)."""

    __slots__ = ("level", "threshold", "previous", "source", "reason", "tto", "leak", "directive", "step")

    def __init__(self, **kw):
        for k in self.__slots__:
            setattr(self, k, kw.get(k))

    def __repr__(self):
        return "RiskEvent(%s)" % ", ".join("%s=%r" % (k, getattr(self, k)) for k in self.__slots__)


class Handle:
    """One on_risk registration; remove() unregisters it. A helper's bound
    method is held weakly: a helper nobody holds any more stops answering."""

    def __init__(self, state, level, fn, rearm_after, on_agent_thread, internal, weak=False):
        self.state, self.level, self.rank = state, level, RANK[level]
        self._fn = weakref.WeakMethod(fn) if weak else (lambda: fn)
        self.rearm_after = float(rearm_after)
        self.on_agent_thread, self.internal = on_agent_thread, internal
        self.armed = True
        self.below_since = None
        self.last = None  # (action, ok) of the latest run
        self.runs = 0

    @property
    def fn(self):
        return self._fn()

    def alive(self):
        return self.fn is not None

    def name(self):
        return getattr(self.fn, "__qualname__", None) or repr(self.fn)

    def remove(self):
        self.state.remove(self)


class _Cause:
    """One escalation: what it was, and (for a directive) the callbacks
    whose results its ack waits for."""

    def __init__(self, level, previous, source, reason, tto=None, leak=False, directive=None):
        self.level, self.previous, self.source, self.reason = level, previous, source, reason
        self.tto, self.leak, self.directive = tto, leak, directive
        self.waiting = 0
        self.results = []


class Risk:
    """The verdict as the agent last heard it, the handlers, what waits
    for a safe point, and the acks to send. The agent's thread calls
    observe()/directive(); the trainer's thread calls run_pending()."""

    def __init__(self, markers=None):
        self.markers = markers
        self.level = "none"
        self.verdict = None
        self.handlers = []
        self.pending = collections.deque()
        self.acks = collections.deque()
        self.seen = collections.OrderedDict()  # directive id -> its ack, None while running
        self.actions = collections.deque(maxlen=MAX_ACTIONS_KEPT)
        self._lock = threading.Lock()
        self._running = False
        self._say = Once()

    # --- registration -------------------------------------------------

    def add(self, level, fn, rearm_after=DEFAULT_REARM_SECONDS, on_agent_thread=False, internal=False, weak=False):
        if level not in RANK or level == "none":
            raise ValueError("on_risk level must be one of %s, not %r" % (", ".join(LEVELS[1:]), level))
        if not callable(fn):
            raise ValueError("on_risk callback must be callable, not %r" % (fn,))
        h = Handle(self, level, fn, rearm_after, on_agent_thread, internal, weak)
        with self._lock:
            self.handlers[:] = [x for x in self.handlers if x.alive()] + [h]
        return h

    def remove(self, handle):
        with self._lock:
            if handle in self.handlers:
                self.handlers.remove(handle)

    # --- the agent's thread -------------------------------------------

    def observe(self, verdict, now=None):
        """A verdict from the sidecar: escalate (and re-arm) handlers."""
        now = time.monotonic() if now is None else now
        with self._lock:
            previous, self.level, self.verdict = self.level, verdict.risk, verdict
            rank = RANK[verdict.risk]
            self._rearm(rank, now)
            reason = "sidecar verdict %s" % verdict.risk + (" (leak)" if verdict.leak else "")
            if verdict.tto is not None:
                reason += ", OOM predicted in %.0f s" % verdict.tto
            cause = _Cause(verdict.risk, previous, "sidecar", reason, verdict.tto, verdict.leak)
            due = self._escalate(rank, cause)
        self._dispatch(due, cause)

    def directive(self, d):
        """A directive from the sidecar (the operator's policy)."""
        with self._lock:
            if d.id in self.seen:
                done = self.seen[d.id]
                if done is not None and not any(a["id"] == d.id for a in self.acks):
                    self._queue_ack(done)  # the sidecar asks again: it did not get the ack
                return
            self.seen[d.id] = None
            while len(self.seen) > MAX_SEEN_DIRECTIVES:
                self.seen.popitem(last=False)
            if d.kind != "notifyTrainer" or d.level is None:
                why = "unsupported directive kind %r" % d.kind if d.kind != "notifyTrainer" else "directive without a valid level"
                self._finish_directive(d.id, why, False)
                return
            cause = _Cause(d.level, self.level, "operator", d.reason or "operator policy", directive=d.id)
            due = self._escalate(RANK[d.level], cause)
            if not any(not h.internal for h in due):
                self._finish_directive(d.id, *self._nothing_to_do(RANK[d.level]))
        self._dispatch(due, cause)

    def _nothing_to_do(self, rank):
        """The ack of a directive no armed callback answers: what was done
        already in this escalation, or that nothing can be."""
        done = [h for h in self.handlers if not h.internal and h.rank <= rank]
        if not done:
            return "no on_risk callback at %s or below" % LEVELS[rank], False
        ran = [h for h in done if h.last is not None]
        if not ran:
            return "callbacks already pending", True
        return "already done: " + "; ".join(h.last[0] for h in ran), all(h.last[1] for h in ran)

    def _escalate(self, rank, cause):
        due = []
        self.handlers[:] = [h for h in self.handlers if h.alive()]
        for h in self.handlers:
            if rank >= h.rank:
                h.below_since = None
                if h.armed:
                    h.armed = False
                    due.append(h)
        due.sort(key=lambda h: h.rank)  # checkpoint (high) before split (critical)
        cause.waiting = sum(1 for h in due if not h.internal)
        return due

    def _rearm(self, rank, now):
        for h in self.handlers:
            if rank >= h.rank or h.armed:
                continue
            if h.below_since is None:
                h.below_since = now
            elif now - h.below_since >= h.rearm_after:
                h.armed, h.below_since = True, None

    def _dispatch(self, due, cause):
        for h in due:
            if h.on_agent_thread:
                self._run(h, cause)
            else:
                self.pending.append((h, cause))

    # --- the trainer's thread -----------------------------------------

    def run_pending(self):
        """Runs the queued callbacks (a safe point). Not re-entrant: a
        callback that calls step() does not run callbacks inside itself."""
        if self._running or not self.pending:
            return 0
        self._running = True
        n = 0
        try:
            while self.pending:
                h, cause = self.pending.popleft()
                if h in self.handlers and h.alive():
                    self._run(h, cause)
                elif not h.internal:
                    self._result(cause, "callback removed before it could run", False, h.rank)
                n += 1
        finally:
            self._running = False
        return n

    def _run(self, h, cause):
        step = getattr(self.markers, "step", None) if self.markers is not None else None
        event = RiskEvent(level=cause.level, threshold=h.level, previous=cause.previous, source=cause.source,
                          reason=cause.reason, tto=cause.tto, leak=cause.leak, directive=cause.directive, step=step)
        try:
            result = h.fn(event)
            if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], bool):
                action, ok = str(result[0]), result[1]  # (what it did, whether it could)
            else:
                action, ok = ("ran " + h.name()) if result is None else str(result), True
        except Exception as exc:
            self._say(("raised", id(h)), "memprof-agent: on_risk callback %s raised %r; training goes on without it",
                      h.name(), exc)
            action, ok = "%s raised %s" % (h.name(), type(exc).__name__), False
        h.last, h.runs = (_cut(action), ok), h.runs + 1
        if not h.internal:
            self.actions.append({"time": time.time(), "level": h.level, "source": cause.source,
                                 "step": step if isinstance(step, int) else None, "action": _cut(action), "ok": ok})
            self._result(cause, action, ok, h.rank)

    def _result(self, cause, action, ok, rank=0):
        """A callback's result; the directive's ack once all are in. Its
        `ok`: every callback at the highest level that ran succeeded (a
        critical directive is answered by the split, not the checkpoint)."""
        with self._lock:
            cause.results.append((action, ok, rank))
            if cause.directive is None or len(cause.results) < cause.waiting:
                return
            top = max(r for _, _, r in cause.results)
            text = "; ".join(a for a, _, _ in cause.results)
            self._finish_directive(cause.directive, text, all(o for _, o, r in cause.results if r == top))

    # --- acks -----------------------------------------------------------

    def _finish_directive(self, ident, action, ok):
        ack = {"id": ident, "action": _cut(action), "ok": bool(ok)}
        self.seen[ident] = ack
        self._queue_ack(ack)

    def _queue_ack(self, ack):
        if len(self.acks) >= MAX_ACKS:
            self.acks.popleft()
            self._say("acks-full", "memprof-agent: more than %d directive acks waiting for a push; the oldest is dropped",
                      MAX_ACKS)
        self.acks.append(ack)

    def take_acks(self):
        """The acks for the next push (removed: give_back() if it fails)."""
        with self._lock:
            out = list(self.acks)
            self.acks.clear()
        return out

    def give_back(self, acks):
        with self._lock:
            for ack in reversed(acks):
                if len(self.acks) < MAX_ACKS:
                    self.acks.appendleft(ack)

    def snapshot(self):
        """The verdict and the callbacks' actions, for the report."""
        return {"verdict": self.verdict.as_dict() if self.verdict is not None else None, "actions": list(self.actions)}


def _cut(text, max_bytes=MAX_ACTION):
    raw = str(text).encode("utf-8", "ignore")
    return str(text) if len(raw) <= max_bytes else raw[:max_bytes].decode("utf-8", "ignore")
